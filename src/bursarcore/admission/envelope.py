"""Envelopes, pools and intents: the validated inputs of admission (SPEC §3, §4.4)."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field, fields
from typing import Any, Mapping, Sequence

import numpy as np

from .. import units
from ..errors import InvalidArgument
from ..units import (MAX_AMOUNT, MAX_CREDITS, MAX_DURATION, MAX_SECONDS, MAX_TTL, MAX_UNITS,
                     MIN_DURATION)

__all__ = ["Envelope", "Pool", "Intent", "UNLIMITED", "MAX_DURATION", "MAX_GRID", "quote_grid",
           "intent_inputs"]

MAX_GRID = 1_000_000                # cells of one quote

UNLIMITED = math.inf
"""Use for ``credits`` or ``burst`` that have no bound (e.g. a backfill campaign)."""


def _number(v: object, field: str, *, allow_inf: bool = False, hi: float = MAX_AMOUNT) -> float:
    return units.real(v, field, hi=hi, allow_inf=allow_inf)


def _whole(v: object, field: str, lo: int = 0) -> int:
    return units.whole(v, field, lo=lo)


def _plain(v: object) -> object:
    """A number as the plain int or float it stands for (numpy scalars and fractions are
    not JSON); anything else as it is, for the checks to name."""
    if v is None or type(v) is float or type(v) is int:
        return v
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real):
        return v
    if isinstance(v, numbers.Integral):
        return int(v)
    try:
        return float(v)
    except OverflowError:
        return v


def _per_dim(m: object, field: str) -> dict[str, Any]:
    if m is None:
        return {}
    if not isinstance(m, Mapping):
        raise InvalidArgument(field, "must be a mapping of dimension -> value", m)
    for k in m:
        if not isinstance(k, str) or not k:
            raise InvalidArgument(field, "dimension names must be non-empty strings", k)
    return {k: _plain(v) for k, v in m.items()}


@dataclass(frozen=True)
class Envelope:
    """A campaign's envelope: what it is guaranteed, may sustain, may peak at and spend (SPEC §3).

    Checked once, here, so a broker registering it only checks it against its pool; the
    per-dimension mappings are copied, so a caller changing its dict later changes nothing.
    A dimension missing from ``sustained`` sustains its guarantee, and one missing from
    ``ceiling`` peaks at its sustained rate.

    Parameters
    ----------
    credits : float
        The budget: 1 credit = 1 GPU-hour at multiplier 1; ``inf`` for none.
    service_class : str, optional
        The class of the campaign's intents unless an intent names its own
        (default ``"agent-burst"``).
    guaranteed : mapping of str to float, optional
        g, units per held dimension the campaign can always get.
    sustained : mapping of str to float, optional
        s, units per dimension it may hold indefinitely; g ≤ s.
    ceiling : mapping of str to float, optional
        b, units per dimension it may hold at a peak; s ≤ b.
    burst : mapping of str to float, optional
        B, the token-bucket size in unit-seconds above s (``inf`` for no bound).
    share : float, optional
        The fair-share weight (SPEC §6), > 0; default g on the primary held dimension,
        or 1.
    borrow_limit : mapping of str to float, optional
        Units per held dimension the campaign may hold on borrowed leases: free units its
        siblings leave idle of their guarantees, revocable after the broker's
        ``borrow_grace`` when the pool needs them (SPEC §14.8); default 0, no borrowing.
    lend_limit : mapping of str to float, optional
        Units per held dimension of its idle guarantee its siblings may borrow (``inf``,
        the default, for no limit; 0 lends nothing).

    Raises
    ------
    InvalidArgument
        A value breaks its rule, naming it (``"ceiling[gpu]"``: must be >= sustained).
    """

    credits: float
    service_class: str = "agent-burst"
    guaranteed: Mapping[str, float] = field(default_factory=dict)
    sustained: Mapping[str, float] = field(default_factory=dict)
    ceiling: Mapping[str, float] = field(default_factory=dict)
    burst: Mapping[str, float] = field(default_factory=dict)
    share: float | None = None
    borrow_limit: Mapping[str, float] = field(default_factory=dict)
    lend_limit: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "credits", _plain(self.credits))
        _number(self.credits, "credits", allow_inf=True, hi=MAX_CREDITS)
        if not isinstance(self.service_class, str):
            raise InvalidArgument("service_class", "must be a class name", self.service_class)
        g = _per_dim(self.guaranteed, "guaranteed")
        s = _per_dim(self.sustained, "sustained")
        b = _per_dim(self.ceiling, "ceiling")
        B = _per_dim(self.burst, "burst")
        for name, m in (("guaranteed", g), ("sustained", s), ("ceiling", b), ("burst", B)):
            object.__setattr__(self, name, m)    # None -> {}; a copy the caller cannot mutate
        for d in set(g) | set(s) | set(b) | set(B):
            gd = _number(g.get(d, 0), f"guaranteed[{d}]")
            sd = _number(s.get(d, gd), f"sustained[{d}]")
            bd = _number(b.get(d, sd), f"ceiling[{d}]")
            _number(B.get(d, 0), f"burst[{d}]", allow_inf=True)
            if gd > sd:
                raise InvalidArgument(f"sustained[{d}]", f"must be >= guaranteed ({gd})", sd)
            if sd > bd:
                raise InvalidArgument(f"ceiling[{d}]", f"must be >= sustained ({sd})", bd)
        bl = _per_dim(self.borrow_limit, "borrow_limit")
        ll = _per_dim(self.lend_limit, "lend_limit")
        object.__setattr__(self, "borrow_limit", bl)
        object.__setattr__(self, "lend_limit", ll)
        for d, v in bl.items():
            _number(v, f"borrow_limit[{d}]")
        for d, v in ll.items():
            _number(v, f"lend_limit[{d}]", allow_inf=True)
        if self.share is not None:
            object.__setattr__(self, "share", _plain(self.share))
            sh = _number(self.share, "share")
            if sh <= 0:
                raise InvalidArgument("share", "must be > 0", self.share)

    def dims(self) -> set[str]:
        return set(self.guaranteed) | set(self.sustained) | set(self.ceiling) | set(self.burst)

    def g(self, d: str) -> float:
        return float(self.guaranteed.get(d, 0))

    def s(self, d: str) -> float:
        return float(self.sustained.get(d, self.g(d)))

    def b(self, d: str) -> float:
        return float(self.ceiling.get(d, self.s(d)))

    def B(self, d: str) -> float:
        return float(self.burst.get(d, 0))

    def borrow(self, d: str) -> float:
        """SPEC §14.8: the most units of d its borrowed leases may hold (0: none)."""
        return float(self.borrow_limit.get(d, 0))

    def lend(self, d: str) -> float:
        """SPEC §14.8: the most of its idle guarantee on d its siblings may borrow."""
        return float(self.lend_limit.get(d, math.inf))

    def to_dict(self) -> dict[str, Any]:
        """The envelope as plain values (the borrowing limits only when set, so an
        envelope without them reads as before they existed)."""
        out = {"credits": self.credits, "service_class": self.service_class,
               "guaranteed": dict(self.guaranteed), "sustained": dict(self.sustained),
               "ceiling": dict(self.ceiling), "burst": dict(self.burst), "share": self.share}
        if self.borrow_limit:
            out["borrow_limit"] = dict(self.borrow_limit)
        if self.lend_limit:
            out["lend_limit"] = dict(self.lend_limit)
        return out

    def to_json(self) -> dict[str, Any]:
        """:meth:`to_dict` as JSON has it: an unlimited budget, bucket or lend limit is
        ``null`` (JSON has no infinity); :meth:`from_dict` reads it back."""
        out = self.to_dict()
        if math.isinf(out["credits"]):
            out["credits"] = None
        for f in ("burst", "lend_limit"):
            if f in out:
                out[f] = {k: (None if math.isinf(v) else v) for k, v in out[f].items()}
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Envelope":
        """The envelope of :meth:`to_dict` or :meth:`to_json` (``null``: unlimited)."""
        d = dict(d)
        if d.get("credits", 0) is None:
            d["credits"] = math.inf
        if isinstance(d.get("burst"), Mapping):
            d["burst"] = {k: math.inf if v is None else v for k, v in d["burst"].items()}
        if isinstance(d.get("lend_limit"), Mapping):
            d["lend_limit"] = {k: math.inf if v is None else v
                               for k, v in d["lend_limit"].items()}
        return cls(**{k: d[k] for k in ("credits", "service_class", "guaranteed", "sustained",
                                         "ceiling", "burst", "share", "borrow_limit",
                                         "lend_limit") if k in d})


class Pool:
    """The capacity the broker hands out, per dimension (SPEC §1, §4.1, §5).

    ``Pool(gpu=512, flow={"fs": 28.0, "inference": 5000.0})``. Every lease is placed on
    the slot map built here, so a lease's placement names real nodes; the first held
    dimension is the primary one (fair share, SPEC §6).

    Parameters
    ----------
    **dims : int
        The held dimensions and their capacities, in whole units; at least one.
    slots : mapping of str to list of (str, int), optional
        A dimension's slot map: ``(node, slots)`` pairs summing to its capacity (default:
        nodes of ``slots_per_node`` slots named ``<dim>-node0000``...).
    slots_per_node : int, optional
        Slots per node of a default slot map (default 8).
    warm_headroom : mapping of str to int, optional
        Units per dimension kept free even of opportunistic leases; at most the capacity,
        except on a dimension that starts at 0, to be filled by a facility binding's
        pilots, which may set it ahead.
    flow : mapping of str to float, optional
        The flow dimensions and the facility's rate of each, in units per second, > 0.

    Raises
    ------
    InvalidArgument
        No held dimension, or a value breaks its rule, naming it (``"slots[gpu]"``: must
        sum to the capacity).
    """

    def __init__(self, *, slots: Mapping[str, Sequence[tuple[str, int]]] | None = None,
                 slots_per_node: int = 8,
                 warm_headroom: Mapping[str, float] | None = None,
                 flow: Mapping[str, float] | None = None, **dims: float) -> None:
        if not dims:
            raise InvalidArgument("dims", "a pool needs at least one held dimension, "
                                  "e.g. Pool(gpu=512)")
        self.flow: dict[str, float] = {}
        for d, v in _per_dim(flow, "flow").items():
            if d in dims:
                raise InvalidArgument(f"flow[{d}]", "is already a held dimension", d)
            rate = _number(v, f"flow[{d}]")
            if rate <= 0:
                raise InvalidArgument(f"flow[{d}]", "must be > 0 units per second", v)
            self.flow[d] = rate
        if not isinstance(slots_per_node, numbers.Integral) or isinstance(slots_per_node, bool) \
                or not 1 <= slots_per_node <= MAX_UNITS:
            raise InvalidArgument("slots_per_node", f"must be an integer in [1, {MAX_UNITS:,}]",
                                  slots_per_node)
        slots_per_node = int(slots_per_node)
        self.capacity: dict[str, int] = {}
        for d, v in dims.items():
            self.capacity[d] = _whole(v, f"pool[{d}]")
        self.slot_map: dict[str, list[tuple[str, int]]] = {}
        slots = _per_dim(slots, "slots")
        for d in slots:
            if d not in self.capacity:
                raise InvalidArgument(f"slots[{d}]", "names a dimension the pool lacks", d)
        for d, cap in self.capacity.items():
            if d in slots:
                smap = [(str(n), _whole(k, f"slots[{d}][{n}]")) for n, k in slots[d]]
                if sum(k for _, k in smap) != cap:
                    raise InvalidArgument(f"slots[{d}]", f"must sum to the capacity {cap}",
                                          sum(k for _, k in smap))
            else:
                full, rest = divmod(cap, slots_per_node)
                smap = [(f"{d}-node{i:04d}", slots_per_node) for i in range(full)]
                if rest:
                    smap.append((f"{d}-node{full:04d}", rest))
            self.slot_map[d] = smap
        wh = _per_dim(warm_headroom, "warm_headroom")
        self.warm_headroom: dict[str, int] = {
            d: _whole(wh.get(d, 0), f"warm_headroom[{d}]") for d in self.capacity}
        for d in wh:
            if d not in self.capacity:
                raise InvalidArgument(f"warm_headroom[{d}]", "names a dimension the pool lacks", d)
            # a pool that starts empty is fed by pilot allocations (add_nodes, SPEC §12):
            # its headroom is set ahead of the capacity it will have
            if self.capacity[d] and self.warm_headroom[d] > self.capacity[d]:
                raise InvalidArgument(f"warm_headroom[{d}]", "must be <= the capacity", wh[d])

    @property
    def dims(self) -> list[str]:
        return list(self.capacity)

    def __repr__(self) -> str:
        flow = f", flow={self.flow}" if self.flow else ""
        return "Pool(" + ", ".join(f"{d}={c}" for d, c in self.capacity.items()) + flow + ")"

    def to_dict(self) -> dict[str, Any]:
        # "dims" keeps the order of the held dimensions (the first is the primary one, and
        # dimension indices follow it) through JSON writers that sort keys
        return {"capacity": dict(self.capacity), "dims": list(self.capacity),
                "warm_headroom": dict(self.warm_headroom),
                "slots": {d: [list(x) for x in m] for d, m in self.slot_map.items()},
                "flow": dict(self.flow)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Pool":
        cap = d["capacity"]
        order = d.get("dims") or list(cap)      # journals written before "dims": key order
        return cls(slots={k: [tuple(x) for x in v] for k, v in d["slots"].items()},
                   warm_headroom=d.get("warm_headroom"), flow=d.get("flow"),
                   **{k: cap[k] for k in order})


@dataclass(frozen=True, slots=True, weakref_slot=True)
class Intent:
    """A request: min..max units of one held dimension for this long, by this deadline,
    spending at most this much (SPEC §1, §4.4).

    Checked when made, so :meth:`Broker.acquire` only checks it against the broker (its
    campaign, dimension and class); the numbers are kept as plain ints and floats.

    Slotted: every acquire reads all seven fields, and the compiled fast path reads them
    at their slot offsets (``_acquire.FastAcquire``) instead of through an instance dict;
    a slotted intent is also one compact block, not an object plus a dict.

    Parameters
    ----------
    campaign : str
        The registered campaign asking; non-empty.
    units : mapping of str to int or (int, int)
        One held dimension, mapped to ``(min, max)`` or to one number (min = max);
        1 <= min <= max.
    duration : float
        Seconds the lease is asked for, one microsecond to ten years.
    deadline : float, optional
        An absolute broker time by which the lease must be active; None for none.
    max_spend : float, optional
        The most credits the grant may cost; None for no bound beyond the budget.
    service_class : str, optional
        Overrides the envelope's class.
    ttl : float, optional
        The longest wait in the pending queue, in seconds, > 0 (default: the broker's).

    Raises
    ------
    InvalidArgument
        A value breaks its rule, naming it (``"units[gpu].min"``: must be <= max).
    """

    campaign: str
    units: Mapping[str, object]
    duration: float
    deadline: float | None = None
    max_spend: float | None = None
    service_class: str | None = None
    ttl: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.campaign, str) or not self.campaign:
            raise InvalidArgument("campaign", "must be a non-empty string", self.campaign)
        u = _per_dim(self.units, "units")
        if len(u) != 1:
            raise InvalidArgument("units", "must name exactly one held dimension "
                                  "(one lease holds one dimension)", self.units)
        d, v = next(iter(u.items()))
        if isinstance(v, (tuple, list)):
            if len(v) != 2:
                raise InvalidArgument(f"units[{d}]", "must be n or (min, max)", v)
            lo = _whole(v[0], f"units[{d}].min", lo=1)
            hi = _whole(v[1], f"units[{d}].max", lo=1)
            if lo > hi:
                raise InvalidArgument(f"units[{d}].min", f"must be <= max ({hi})", v[0])
            plain: object = (lo, hi)
        else:
            plain = _whole(v, f"units[{d}]", lo=1)
        # the numbers as plain ints and floats from here on (a numpy scalar's arithmetic
        # is its dtype's: np.int8(100) * 10**6 overflows)
        object.__setattr__(self, "units", {d: plain})
        for name in ("duration", "deadline", "max_spend", "ttl"):
            object.__setattr__(self, name, _plain(getattr(self, name)))
        units.real(self.duration, "duration", lo=MIN_DURATION, hi=MAX_DURATION,
                   what="a number of seconds")
        if self.deadline is not None:
            units.real(self.deadline, "deadline", lo=-MAX_SECONDS, hi=MAX_SECONDS,
                       what="a time in seconds or None")
        if self.max_spend is not None:
            _number(self.max_spend, "max_spend", hi=MAX_CREDITS)
        if self.ttl is not None:
            t = units.real(self.ttl, "ttl", hi=MAX_TTL, what="a number of seconds")
            if t <= 0:
                raise InvalidArgument("ttl", "must be > 0", self.ttl)
        if self.service_class is not None and not isinstance(self.service_class, str):
            raise InvalidArgument("service_class", "must be a class name", self.service_class)

    def __setstate__(self, state: Mapping[str, object] | Sequence[object]) -> None:
        """Unpickle: the field values in order (what the dataclass pickles), or the
        ``__dict__`` of an intent pickled before ``Intent`` had slots."""
        if isinstance(state, Mapping):
            items = list(state.items())
        else:
            items = list(zip([f.name for f in fields(self)], state))
        for name, value in items:
            object.__setattr__(self, name, value)

    @property
    def dim(self) -> str:
        return next(iter(self.units))

    @property
    def bounds(self) -> tuple[int, int]:
        v = self.units[self.dim]
        if isinstance(v, (tuple, list)):
            return int(v[0]), int(v[1])
        return int(v), int(v)  # type: ignore[call-overload]

    def to_dict(self) -> dict[str, Any]:
        lo, hi = self.bounds
        return {"campaign": self.campaign, "units": {self.dim: [lo, hi]},
                "duration": self.duration, "deadline": self.deadline,
                "max_spend": self.max_spend, "service_class": self.service_class,
                "ttl": self.ttl}


def quote_grid(sizes: Any, durations: Any) -> tuple[np.ndarray, np.ndarray]:
    """A quote's axes (SPEC §8), checked at the edge: sizes as a non-empty 1-D integer
    column in [1, MAX_UNITS], durations as a non-empty column of ns within a lease's
    range, at most MAX_GRID cells in all. Returns the sizes column as given and the
    durations in ns; raises :class:`InvalidArgument` naming the axis and its rule."""
    sz = units.column(sizes, "sizes")
    if (sz.ndim != 1 or not sz.size or sz.dtype.kind not in "iu" or (sz < 1).any()
            or (sz > MAX_UNITS).any()):
        raise InvalidArgument("sizes", "must be a non-empty 1-D array of integers in "
                              f"[1, {MAX_UNITS:,}]", sizes)
    du = units.ns_array(durations, "durations")
    lo_ns, hi_ns = round(units.MIN_DURATION * units.NS), MAX_DURATION * units.NS
    if not du.size or (du < lo_ns).any() or (du > hi_ns).any():
        raise InvalidArgument("durations", "must be a non-empty 1-D array of seconds in "
                              f"[{units.MIN_DURATION:g}, {MAX_DURATION:,}]", durations)
    if sz.size * du.size > MAX_GRID:
        raise InvalidArgument("sizes", f"sizes x durations must be at most {MAX_GRID:,} "
                              "cells", (sz.size, du.size))
    return sz, du


_MICRO = 1_000_000                   # micro-credits per credit (admission.state.CREDIT)


def intent_inputs(b: Any, intent: Any) -> tuple[int, int, int, int, int, int, int | None,
                                                 int | None, int]:
    """An intent's inputs at broker ``b`` (either backend), checked at the edge: its
    campaign's row, dimension, class row, min and max units, duration (ns), max_spend
    (micro-credits, or None), deadline (ns, or None) and ttl (ns; ``b.ttl`` by default).
    Raises :class:`InvalidArgument` (or ``UnknownCampaign``) naming the field."""
    if not isinstance(intent, Intent):
        raise InvalidArgument("intent", "must be an Intent", intent)
    c = b.campaign_index(intent.campaign)
    d = b._dim_index.get(intent.dim)
    if d is None:
        raise InvalidArgument("units", f"dimension must be one of {b.dims}", intent.dim)
    k = b._class_of(intent.campaign, intent.service_class)
    nmin, nmax = intent.bounds
    dur = units.to_ns(intent.duration, "duration")
    spend = None if intent.max_spend is None else round(intent.max_spend * _MICRO)
    deadline = None if intent.deadline is None else units.to_ns(intent.deadline, "deadline")
    ttl = units.to_ns(intent.ttl if intent.ttl is not None else b.ttl, "ttl")
    return c, d, k, nmin, nmax, dur, spend, deadline, ttl
