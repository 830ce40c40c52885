"""The broker: admission policy over the C core (SPEC §3–§8, held dimensions).

:class:`Broker` owns the policy — validation, service classes, the pending queue and its
order, reclaim victims, events, supply and quotes — and asks the C core, through its
Cython or cffi binding (``broker.ENGINES["compiled"]``), to do the per-decision arithmetic
on an :class:`~bursarcore.admission.state.EngineState`. ``Broker(backend="reference")``
(and every ``Broker`` where the core is not built) is instead the reference broker,
:class:`bursarcore.reference.ReferenceBroker`, written from the specification: the same API
and, bit for bit, the same decisions.

With the Cython binding, ``acquire`` and the expiries first try ``_engine.FastAcquire``: the
common case — plain intent values, no policy event due — in one C call, building the same
:class:`Decision`, :class:`Lease` and :class:`Event` objects and, with a journal, the same
records (then ``end_op``, as ``@_op`` does); anything else takes the general path.

A denial is a :class:`Decision` with ``outcome="refused"`` and a reason code; only bad input
raises (:class:`~bursarcore.errors.InvalidArgument`, naming the field and rule, before any
state changes).
"""

from __future__ import annotations

import abc
import bisect
import dataclasses
import functools
import heapq
import json
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Concatenate, Iterable, Mapping, ParamSpec, Sequence, TypeVar

import numpy as np

from . import _backend, units
from .admission.batch import batch_units as _batch_units
from .admission.classes import DEFAULT_CLASSES, Congestion, ServiceClass
from .admission.envelope import MAX_DURATION, Envelope, Intent, Pool
from .admission.results import (GRANTED_OUT, PENDING_OUT, REFUSED_OUT, BatchResult,
                                Consumption, Decision, DimSupply, Quote, Supply)
from .admission.state import (ACTIVE, CAPACITY, CEILING, CREDIT, CREDITS, DEADLINE, GRANTED,
                              HOUR_NS,
                              LEASE_STATES, MAXV, OK, PPM, REASONS, RECLAIM, REFUSED, RELEASED,
                              REVOKED, REVOKING, STARTING, TOKENS, TTL, WARM, CANCELLED,
                              PENDING_LIMIT, REUSE_AFTER, ROW_MASK, EngineState, wrap)
from .batchprep import finish, minmax
from .clock import ManualClock
from .errors import InvalidArgument, TimeWentBackwards, UnknownCampaign, UnknownLease
from .journal import records as J
from .journal.base import Journal
from .journal.explain import explain as _explain
from .journal.replay import envelope_of, nodes_of
from .journal.replay import replay as _replay
from .admission.pending import PendingQueue, _Pending
from .leases.types import Event, Lease

__all__ = ["Broker", "Decision", "Lease", "Event", "Supply", "DimSupply", "Quote",
           "BatchResult", "Consumption", "BACKENDS", "ENGINES"]

NS = units.NS
_MAX_DURATION = MAX_DURATION * NS           # the longest lease (ns): Intent.duration's bound
_MIN_DURATION = round(units.MIN_DURATION * NS)
_MAX_GRID = 1_000_000                       # cells of one quote
_DUR_RULE = f"must be seconds in [{units.MIN_DURATION:g}, {MAX_DURATION:,}] (one microsecond to ten years)"
_PATHS = ("warm", "reclaim", "cold")           # indexed by WARM, RECLAIM, COLD
_OUTCOME_CODE = {GRANTED_OUT: 0, REFUSED_OUT: 1, PENDING_OUT: 2}
MAX_PENDING = 1024          # Broker(max_pending=): pending intents per campaign, by default

# the C core's engine through the chosen binding: Cython by default, cffi when asked for
_compiled = (_backend.cffi("_cffi_engine") if _backend.REQUESTED == "cffi"
             else _backend.compiled("_engine"))
#: the C core's binding by backend name (empty where the core is not built)
ENGINES: dict[str, Any] = {"compiled": _compiled} if _compiled is not None else {}
#: the broker backends ``Broker(backend=...)`` takes here: the C core (when built) and the
#: reference broker written from the specification
BACKENDS: tuple[str, ...] = (("compiled",) if _compiled is not None else ()) + ("reference",)




def _wants_reference(backend: str | None) -> bool:
    """Whether ``Broker(backend=...)`` is the reference broker: asked for by name, or the
    only backend there is (no compiled build, or ``BURSARCORE_NO_EXTENSIONS=1``)."""
    if backend is None:
        return "compiled" not in ENGINES
    return backend == "reference"


_B = TypeVar("_B", bound="Broker")
_P = ParamSpec("_P")
_R = TypeVar("_R")


def _op(method: Callable[Concatenate[_B, _P], _R]) -> Callable[Concatenate[_B, _P], _R]:
    """A public operation: when it returns, the journal may commit a group (group commit
    happens only between operations, so a durable journal always ends on an operation
    boundary and replays to a consistent state). The method keeps its signature."""
    @functools.wraps(method)
    def wrapper(self: _B, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return method(self, *args, **kwargs)
        finally:
            if self.journal is not None:
                self.journal.end_op(self.durable)
    return wrapper


# python-side event kinds, in the order they run at equal times
_EV_REVOKE, _EV_ACTIVATE, _EV_PENDING = 0, 1, 2


# release / renew of a stale lease id (an ended lease whose row now holds a later lease): as
# for any ended lease, refused with "invalid" -- but its campaign, intent and record are gone
_STALE = Decision(REFUSED_OUT, -1, "", reason="invalid")




class Broker(metaclass=abc.ABCMeta):
    """An agent resource broker over one pool.

    ``Broker(Pool(gpu=512), clock=ManualClock(0.0))``. Every decision is taken at the
    clock's time and is the same on every backend, bit for bit; bad input raises
    :class:`~bursarcore.errors.InvalidArgument` before any state changes, and a denial is
    a :class:`Decision` with a reason.

    Parameters
    ----------
    pool : Pool
        The capacity it hands out.
    clock : object, optional
        Anything with ``now() -> float`` seconds, never running backwards (default: a
        :class:`ManualClock` at 0.0).
    classes : iterable of ServiceClass, optional
        The service class table, names unique (default: SPEC §7's, ``DEFAULT_CLASSES``).
    congestion : Congestion, optional
        Congestion pricing (default: ``Congestion()``).
    price : mapping of str to float, optional
        Credits per unit-hour per held dimension (default 1), per unit per flow dimension
        (default 0).
    ttl : float, optional
        The longest wait of a pending intent, in seconds (default 900).
    half_life : float, optional
        The half-life of fair-share usage, in seconds (default 600; SPEC §6).
    enforcement : str, optional
        ``"prepaid"`` (the default) or, for experiments only, ``"instant"``.
    backend : str, optional
        ``"compiled"`` or ``"reference"`` (default: the first available, compiled first).
    cold_wait : callable, optional
        ``cold_wait(dim) -> seconds`` to a cold start, from a facility binding.
    journal : Journal, optional
        An empty journal to record every decision in (SPEC §9).
    durable : bool, optional
        Sync the journal at the end of every operation (default False).
    reuse_after : int or None, optional
        The rows of ended leases are reused once this many later leases have ended; None
        never reuses them (docs/policy.md, "Memory").
    max_pending : int or None, optional
        The most intents one campaign may have waiting in the pending queue (default
        1024); one more is refused with ``pending_limit``. None: no cap.

    Raises
    ------
    InvalidArgument
        An option breaks its rule, naming it (``"classes"``, ``"price[fs]"``,
        ``"journal"`` when it is not empty, ...).
    """

    def __new__(cls, pool: Any = None, clock: Any = None, *, backend: str | None = None,
                **options: Any) -> Any:
        # the reference backend is the specification's own broker, with the same API
        if cls is Broker and _wants_reference(backend):
            from .reference.broker import ReferenceBroker
            return ReferenceBroker(pool, clock, backend="reference", **options)
        return super().__new__(cls)

    def __init__(self, pool: Pool, clock: Any = None, *, classes: Iterable[ServiceClass] | None = None,
                 congestion: Congestion | None = None, price: Mapping[str, float] | None = None,
                 ttl: float = 900.0, half_life: float = 600.0, enforcement: str = "prepaid",
                 backend: str | None = None, cold_wait: Any = None,
                 journal: Journal | None = None, durable: bool = False,
                 reuse_after: int | None = REUSE_AFTER,
                 max_pending: int | None = MAX_PENDING) -> None:
        if not isinstance(pool, Pool):
            raise InvalidArgument("pool", "must be a Pool", pool)
        self.pool = pool
        self.clock = clock if clock is not None else ManualClock(0.0)
        self.classes = tuple(classes) if classes is not None else DEFAULT_CLASSES
        names = [c.name for c in self.classes]
        if not self.classes or len(set(names)) != len(names):
            raise InvalidArgument("classes", "must be a non-empty table with unique names", names)
        self._cls_index = {c.name: i for i, c in enumerate(self.classes)}
        self.congestion = congestion or Congestion()
        if enforcement not in ("prepaid", "instant"):
            raise InvalidArgument("enforcement", "must be 'prepaid' or 'instant'", enforcement)
        self.enforcement = enforcement
        for name, v, hi in (("ttl", ttl, units.MAX_TTL), ("half_life", half_life, MAX_DURATION)):
            if units.real(v, name, hi=hi, what="a number of seconds") <= 0:
                raise InvalidArgument(name, "must be > 0", v)
        self.ttl, self.half_life = float(ttl), float(half_life)
        if backend is None:
            backend = "compiled"                  # (no core: __new__ made a reference broker)
        if backend not in ENGINES:
            raise InvalidArgument("backend", f"must be one of {list(BACKENDS)}", backend)
        self.backend = backend
        self._k = ENGINES[backend]
        if reuse_after is not None and (not isinstance(reuse_after, int)
                                        or isinstance(reuse_after, bool) or reuse_after < 0):
            raise InvalidArgument("reuse_after", "must be None or an integer >= 0", reuse_after)
        self.reuse_after = reuse_after
        if max_pending is not None and (not isinstance(max_pending, int)
                                        or isinstance(max_pending, bool) or max_pending < 0):
            raise InvalidArgument("max_pending", "must be None or an integer >= 0", max_pending)
        self.max_pending = max_pending
        self.dims = pool.dims
        self._dim_index = {d: i for i, d in enumerate(self.dims)}
        price = dict(price or {})
        self.flow_dims = list(pool.flow)
        for d in price:
            if d not in self._dim_index and d not in pool.flow:
                raise InvalidArgument(f"price[{d}]", "names a dimension the pool lacks", d)
        # held: credits per unit-hour (default 1); flow: credits per unit (default 0)
        self.price = {d: units.real(price.get(d, 1.0), f"price[{d}]", hi=units.MAX_PRICE)
                      for d in self.dims}
        self.price.update({d: units.real(price.get(d, 0.0), f"price[{d}]", hi=units.MAX_PRICE)
                           for d in self.flow_dims})
        self.cold_wait = cold_wait  # callable(dim) -> seconds, from a facility binding
        self._t = units.to_ns(self.clock.now())
        self.st = EngineState(
            capacity=[pool.capacity[d] for d in self.dims],
            headroom=[pool.warm_headroom[d] for d in self.dims],
            slot_counts=[pool.capacity[d] for d in self.dims],
            classes=[(c.rank, round(c.multiplier * PPM), int(c.congestion_priced),
                      int(c.preemptible), units.to_ns(c.grace), int(c.free_when_broke))
                     for c in self.classes],
            price=[round(self.price[d] * CREDIT) for d in self.dims],
            cong_thresholds=[round(x * PPM) for x in self.congestion.thresholds],
            cong_mult=[round(x * PPM) for x in self.congestion.multipliers],
            window_ns=units.to_ns(self.congestion.window), bins=self.congestion.bins,
            instant=enforcement == "instant",
            half_life_ns=max(1, units.to_ns(self.half_life, "half_life")), epoch_ns=self._t,
            reuse_after=reuse_after)
        self.st.scal[0] = self._t // self.st.bin_ns
        self._flow_index = {d: i for i, d in enumerate(self.flow_dims)}
        self._flow_price = np.array([round(self.price[d] * CREDIT) for d in self.flow_dims],
                                    dtype=np.int64)
        self.flow = None
        if self.flow_dims:
            from .flow import FLOW_BACKENDS
            fcls = FLOW_BACKENDS.get(backend, FLOW_BACKENDS["reference"])
            self.flow = fcls(pool.flow, window=1.0, now=self._t / NS)
        self._node_of_slot = []
        self._node_names = []
        for d in self.dims:
            names, owner = [], []
            for j, (node, k) in enumerate(pool.slot_map[d]):
                names.append(node)
                owner.extend([j] * k)
            self._node_names.append(names)
            self._node_of_slot.append(np.array(owner, dtype=np.int64))
        self._slot_alive = [np.ones(pool.capacity[d], dtype=bool) for d in self.dims]
        self._draining = [0] * len(self.dims)  # retired slots still held by leases
        self._names: list[str] = []
        self._cindex: dict[str, int] = {}
        self.envelopes: dict[str, Envelope] = {}
        self._share = np.zeros(0)
        self._queue = PendingQueue(self, len(self.dims))
        self._pyev: list[tuple[int, int, int, int]] = []   # (time, kind, seq, id)
        self._seq = 0
        self._next_intent = 0
        self._events: list[Event] = []
        self._opp_active: list[set[int]] = [set() for _ in self.dims]
        self._revoking: list[set[int]] = [set() for _ in self.dims]
        self._activation: dict[int, int] = {}
        self._expired_buf = np.zeros(4096, dtype=np.int64)
        self._one_buf = np.zeros(1, dtype=np.int64)
        self._buf = np.zeros(4, dtype=np.int64)
        self._t_force: int | None = None      # replay drives exact integer times
        self._subscribers: list[Any] = []
        self._deficit_last = np.zeros(0)
        self._default_cls = np.zeros(0, dtype=np.int64)
        self._opp_default = False     # some campaign's own class is preemptible
        self._one_cls: int | None = None   # the class of every campaign's envelope, if one
        self._consts: dict[int, np.ndarray] = {}   # read-only constant columns (_constant)
        if journal is not None and not isinstance(journal, Journal):
            raise InvalidArgument("journal", "must be a bursarcore.journal.Journal", journal)
        if journal is not None and len(journal):
            raise InvalidArgument("journal", "is not empty: rebuild the broker from it with "
                                  "Broker.replay(journal)", len(journal))
        self.journal = journal
        self.durable = bool(durable)   # sync the journal at the end of every operation
        self._fast = None
        if backend == "compiled" and hasattr(self._k, "FastAcquire"):
            self._fast = self._k.FastAcquire(self, self._queue, Decision, Lease, Event, Intent)
        if journal is not None:
            # built only here: the slot map as JSON lists is one list object per node (125k
            # for a 1M-GPU pool), and long-lived container objects make every full
            # collection of the cycle GC traverse them (it was a third of admit_batch's time)
            config = {"pool": pool.to_dict(), "classes": [vars(c) for c in self.classes],
                      "congestion": {"window": self.congestion.window,
                                     "bins": self.congestion.bins,
                                     "thresholds": list(self.congestion.thresholds),
                                     "multipliers": list(self.congestion.multipliers)},
                      "price": self.price, "ttl": self.ttl, "half_life": self.half_life,
                      "enforcement": enforcement, "reuse_after": reuse_after,
                      "max_pending": max_pending}
            row = {}
            row["op"] = J.OP["config"]
            row["t"] = self._t
            journal.add(row, json.dumps(config, sort_keys=True))

    # ------------------------------------------------------------------ registration
    @_op
    def register(self, name: str, envelope: Envelope) -> int:
        """Add a campaign, at any time.

        The sum of guarantees never exceeds the pool (SPEC §3), so a registration that
        would break a promise already made is refused, naming the guarantee.

        Parameters
        ----------
        name : str
            A new, non-empty campaign name.
        envelope : Envelope
            Its envelope; every dimension it names must be one of the pool's.

        Returns
        -------
        int
            The campaign's index, for :meth:`admit_batch` and :meth:`consume_batch`.

        Raises
        ------
        InvalidArgument
            ``name`` is empty or already registered; ``envelope`` is not an Envelope, has
            an unknown ``service_class``, names a dimension the pool lacks
            (``"ceiling[cpu]"``), or its guarantee would exceed the pool's capacity or the
            room firm holdings leave now (``"guaranteed[gpu]"``); with a journal, it is
            not JSON-serialisable.
        """
        if not isinstance(name, str) or not name:
            raise InvalidArgument("name", "must be a non-empty string", name)
        if name in self._cindex:
            raise InvalidArgument("name", "is already registered", name)
        if not isinstance(envelope, Envelope):
            raise InvalidArgument("envelope", "must be an Envelope", envelope)
        if envelope.service_class not in self._cls_index:
            raise InvalidArgument("service_class", f"must be one of {list(self._cls_index)}",
                                  envelope.service_class)
        for label, m in (("guaranteed", envelope.guaranteed), ("sustained", envelope.sustained),
                         ("ceiling", envelope.ceiling), ("burst", envelope.burst)):
            for d in m:
                if d not in self._dim_index and d not in self._flow_index:
                    raise InvalidArgument(f"{label}[{d}]", "names a dimension the pool lacks", d)
        t = self._now()
        g = [units.whole(envelope.g(d), f"guaranteed[{d}]") for d in self.dims]
        s = [units.whole(envelope.s(d), f"sustained[{d}]") for d in self.dims]
        b = [units.whole(envelope.b(d), f"ceiling[{d}]") for d in self.dims]
        for i, d in enumerate(self.dims):
            total_g = int(self.st.g[: self.st.C, i].sum()) + g[i]
            if total_g > self.pool.capacity[d]:
                raise InvalidArgument(f"guaranteed[{d}]", f"sum of guarantees {total_g} would "
                                      f"exceed the pool capacity {self.pool.capacity[d]}", g[i])
            if int(self.st.F[i]) + int(self.st.U[i]) + g[i] > self.pool.capacity[d]:
                raise InvalidArgument(f"guaranteed[{d}]", "firm holdings above guarantees leave "
                                      "no room for it now; retry when they end", g[i])
        Bcap = []
        for d in self.dims:
            B = envelope.B(d)
            if math.isinf(B):
                Bcap.append(MAXV)
            else:
                units.real(B, f"burst[{d}]", hi=units.MAX_BURST, allow_inf=True,
                           what="a number of unit-seconds")
                Bcap.append(round(B * NS))
        credits = envelope.credits
        budget = MAXV if math.isinf(credits) else round(credits * CREDIT)
        payload = None
        if self.journal is not None:
            # built before anything changes: a payload that cannot be written refuses the
            # registration instead of leaving a campaign live but unjournaled
            env = envelope.to_dict()
            env["credits"] = None if math.isinf(env["credits"]) else env["credits"]
            env["burst"] = {k: (None if math.isinf(v) else v) for k, v in env["burst"].items()}
            try:
                payload = json.dumps({"name": name, "envelope": env}, sort_keys=True,
                                     allow_nan=False)
            except (TypeError, ValueError) as e:
                raise InvalidArgument("envelope", f"must be JSON-serialisable ({e})",
                                      envelope) from None
        self._advance(t)
        if self.flow is not None:  # may refuse (naming the field) before anything changes
            fd = [d for d in self.flow_dims if d in envelope.dims()]
            self.flow.add_campaign(
                guaranteed={d: envelope.g(d) for d in fd}, sustained={d: envelope.s(d) for d in fd},
                ceiling={d: envelope.b(d) for d in fd}, burst={d: envelope.B(d) for d in fd},
                now=t / NS)
        c = self.st.add_campaign(g, s, b, Bcap, budget, t)
        self._names.append(name)
        self._cindex[name] = c
        self.envelopes[name] = envelope
        share = envelope.share if envelope.share is not None else (g[0] if g[0] > 0 else 1)
        self._share = np.append(self._share, float(share))
        self._deficit_last = np.append(self._deficit_last, np.nan)
        self._default_cls = np.append(self._default_cls,
                                      self._cls_index[envelope.service_class]).astype(np.int64)
        kc = self._cls_index[envelope.service_class]
        if self.classes[kc].preemptible:
            self._opp_default = True
        self._one_cls = kc if c == 0 or self._one_cls == kc else None
        if self.journal is not None:
            row = {}
            row["op"], row["t"], row["campaign"], row["outcome"] = J.OP["register"], t, c, 4
            self.journal.add(row, payload)
        return c

    def campaign_index(self, name: str) -> int:
        try:
            return self._cindex[name]
        except (KeyError, TypeError):
            raise UnknownCampaign("campaign", "is not registered", name) from None

    @property
    def campaigns(self) -> list[str]:
        return list(self._names)

    # ------------------------------------------------------------------ time
    def _now(self) -> int:
        if self._t_force is not None:
            return self._t_force
        t = units.to_ns(self.clock.now(), "clock")
        if t < self._t:
            raise TimeWentBackwards("clock", f"must not run backwards (last {self._t / NS})",
                                    t / NS)
        return t

    def _advance(self, t: int) -> None:
        """Run every event up to t in time order, then serve the pending queue."""
        k, st = self._k, self.st
        moved = t > self._t
        while self._pyev and self._pyev[0][0] <= t:
            te = self._pyev[0][0]
            self._expire_until(te)
            while self._pyev and self._pyev[0][0] == te:
                _, kind, _, ident = heapq.heappop(self._pyev)
                self._run_pyevent(kind, ident, te)
            self._serve_pending(te)
        # Serving a non-empty queue at a new time moves fair share without a decision of
        # its own: journal the advance (after what it causes) so replay serves it too.
        # Whether the queue is empty is read here, after the events due before t, never
        # before them: those events may have run already (a poll at their instant, which
        # writes no record) or may run only now (replay, at the next input), and both must
        # write the same records.
        note = moved and bool(self._queue.intents) and self.journal is not None
        k.ring_advance(st, t)
        freed = self._expire_until(t)
        if moved or freed:
            self._serve_pending(t)
        self._t = max(self._t, t)
        if note:
            row: dict[str, Any] = {}
            row["op"], row["t"], row["outcome"] = J.OP["advance"], t, 4
            self.journal.add(row)  # type: ignore[union-attr]  # note is set only with a journal

    def _expire_until(self, t: int) -> int:
        """Expire leases due by t. With a journal, one at a time, so each record's "state
        after" is the state right after that expiry, however the calls were spaced."""
        fast = self._fast
        if fast is not None and not self._subscribers and not any(self._draining):
            n: int = fast.expire(t)        # the same, compiled (events and records built in C)
            if n >= 0:                     # -1: a journal it does not write to (nothing done)
                return n
        k, st = self._k, self.st
        # one at a time with a journal, and with subscribers: a callback may grant, and a
        # grant may take the row of a lease ended but not yet reported
        buf = (self._one_buf if self.journal is not None or self._subscribers
               else self._expired_buf)
        total = 0
        while True:
            m: int = k.advance(st, t, buf)
            for lid in buf[:m].tolist():
                r = lid & ROW_MASK
                d = int(st.dim[r])
                self._opp_active[d].discard(lid)
                self._revoking[d].discard(lid)
                self._emit("expired", int(st.t_end[r]), int(st.camp[r]), lid=lid)
            if m:
                self._purge_retired()
            total += m
            if m < buf.shape[0]:
                return total

    _EV_OP = {"expired": "expire", "revoked": "revoke", "activated": "activate",
              "preempt_notice": "preempt", "granted": "grant", "refused": "refuse"}

    def _emit(self, kind: str, t: int, c: int, lid: int | None = None, iid: int | None = None,
              deadline: int | None = None, reason: int = 0, pend: _Pending | None = None,
              path: int = 0) -> None:
        """Queue an event for :meth:`poll` and journal it (a derived record)."""
        st = self.st
        n = 0
        if lid is not None:   # read the lease's row now: a subscriber may grant (and reuse it)
            r = lid & ROW_MASK
            n, d, lk, lintent, lcost = (int(st.units[r]), int(st.dim[r]), int(st.lcls[r]),
                                        int(st.intent[r]), int(st.cost[r]))
        if kind == "expired" or kind == "revoked":
            self._queue.lease_ended(c)
        ev = Event(kind, t / NS, self._names[c], lease_id=lid, intent_id=iid,
                   deadline=None if deadline is None else deadline / NS,
                   reason=REASONS[reason] if reason else None, units=n)
        self._events.append(ev)
        for fn in self._subscribers:
            fn(ev)
        if self.journal is None:
            return
        row: dict[str, Any] = {}
        row["op"], row["t"], row["campaign"], row["reason"] = J.OP[self._EV_OP[kind]], t, c, reason
        if lid is not None:
            row["lease"], row["units"], row["dim"] = lid, n, d
            row["cls"], row["intent"] = lk, lintent
            row["cost"] = lcost
            self._after(row, c, d)
        if pend is not None:
            row["intent"], row["dim"], row["cls"] = pend.intent_id, pend.dim, pend.cls
            row["nmin"], row["nmax"], row["dur"] = pend.nmin, pend.nmax, pend.dur
            row["max_spend"] = pend.max_spend
            row["rank"] = int(st.cls[pend.cls, 0])
            row["outcome"] = 1 if kind == "granted" else 3
            row["path"] = (1 if path == WARM else 2) if kind == "granted" else 0
            self._after(row, c, pend.dim)
        if deadline is not None:
            row["deadline"] = deadline
        self.journal.add(row)

    def _after(self, row: dict[str, Any], c: int, d: int) -> None:
        """The record's "state after" for (c, d), with the bucket settled to the record's
        time: an operation that does not touch the bucket (a refused release, a cancel)
        would otherwise record whatever an earlier, unjournaled read (``state()``,
        ``supply()``) happened to settle it to, and replay would differ. Settling is
        path-independent (refill at the rate H fixes between changes of H), so it changes
        no later figure."""
        st = self.st
        self._k.settle(st, c, d, int(row["t"]))
        row["tokens_after"] = int(st.T[c, d])
        row["credits_after"] = int(st.left[c])
        row["held_after"] = int(st.H[c, d])

    def _push(self, t: int, kind: int, ident: int) -> None:
        self._seq += 1
        heapq.heappush(self._pyev, (t, kind, self._seq, ident))

    def _run_pyevent(self, kind: int, ident: int, t: int) -> None:
        st = self.st
        if kind == _EV_REVOKE:
            r = st.row_of(ident)
            if r < 0:         # ended (and left the revoking set) long ago: its row is reused
                return
            self._revoking[int(st.dim[r])].discard(ident)
            if int(st.state[r]) == REVOKING and int(st.revoke_at[r]) == t:
                self._k.end_lease(st, ident, t, REVOKED)
                self._purge_retired()
                self._emit("revoked", t, int(st.camp[r]), lid=ident)
        elif kind == _EV_ACTIVATE:
            self._activation.pop(ident, None)
            r = st.row_of(ident)
            if r < 0:
                return
            if int(st.state[r]) == STARTING and int(st.top[int(st.dim[r])]) < int(
                    st.units[r]):
                # the pool shrank under a reclaim grant: it cannot be placed any more
                self._k.end_lease(st, ident, t, REVOKED)
                self._emit("revoked", t, int(st.camp[r]), lid=ident, reason=CAPACITY)
            elif int(st.state[r]) == STARTING:
                self._reserve(1, int(st.units[r]))
                self._k.activate(st, ident, t)
                self._emit("activated", t, int(st.camp[r]), lid=ident)
        elif kind == _EV_PENDING:
            p = self._queue.intents.get(ident)
            if p is not None and p.expires == t:
                reason = DEADLINE if p.deadline is not None and p.deadline <= t else TTL
                self._queue.drop(ident)
                self._emit("refused", t, p.campaign, iid=ident, reason=reason, pend=p)

    def _constant(self, value: int, n: int) -> np.ndarray:
        """A read-only int64 array of n copies of value, for the batch kernel's per-item
        inputs that are one value for the whole batch (dimension, duration, class): a
        view of a cached array, so a batch writes no column it does not need. Read-only,
        so a batch started inside another's event callback cannot disturb it."""
        a = self._consts.get(value)
        if a is None or a.shape[0] < n:
            if len(self._consts) >= 8:
                self._consts.clear()
            a = np.full(max(n, 1024), value, dtype=np.int64)
            a.flags.writeable = False
            self._consts[value] = a
        return a[:n]

    def _reserve(self, leases: int, slots: int) -> None:
        st = self.st
        # an operation never places more slot ids than are free now (the rest is refused
        # or waits), so an intent's max of up to 2**40 units does not size the arena
        # (the sum only when the arena could be short: a smaller slots needs no more room)
        n = st.scal.item(2)
        rows_short = (n + leases > st.camp.shape[0]
                      and n + leases > st.camp.shape[0] + st.reusable())
        if rows_short or st.arena_top.item(0) + slots > st.arena.shape[0]:
            slots = min(slots, int(st.top.sum()))
            if rows_short or st.arena_top.item(0) + slots > st.arena.shape[0]:
                st.grow_leases(leases, slots)
        if st.scal.item(3) + leases + 1 > st.heap_t.shape[0]:
            st.grow_heap()

    # ------------------------------------------------------------------ fair share (§6)
    def _fair_share(self, t: int) -> np.ndarray:
        """Usage at t (SPEC §6): ∫ H(τ)·2^(−(t − τ)/half-life) dτ on the primary held
        dimension, in unit-seconds, vectorised over all campaigns. Exact at any t: the
        kernels fold each campaign's holding into ``fs_S`` at every change of it
        (``fs_S`` = ∫ H·2^((τ − E)/half-life) up to its last change, at weight ``fs_G``),
        and H has been constant since. Pure: reads only."""
        st = self.st
        C = st.C
        hl, E = int(st.fs_par[0]), int(st.fs_par[1])
        inv = math.pow(2.0, -(float(t - E) / float(hl)))     # 1 / w(t); 0 once far past E
        H = st.H[:C, 0].astype(np.float64)
        scale = hl / math.log(2) / NS                         # unit-ns of weight -> unit-s
        return (st.fs_S[:C] * inv + H * (1.0 - st.fs_G[:C] * inv)) * scale

    @_op
    def deficits(self) -> dict[str, float]:
        """deficit_c = share_c / Σ share − usage_c / Σ usage (SPEC §6), at the broker time.
        A query: it does not move the fair-share state."""
        t = self._now()
        self._advance(t)
        return dict(zip(self._names, self._deficit_array(t, commit=False).tolist()))

    def _deficit_array(self, t: int, commit: bool = True) -> np.ndarray:
        """Deficits at t. Decisions (queue order, victims) ``commit`` them as the deficits
        their journal records carry (``deficit`` of acquire records)."""
        usage = self._fair_share(t)
        tot_share = self._share.sum()
        share = self._share / tot_share if tot_share > 0 else self._share
        tot = usage.sum()
        deficit = share - (usage / tot if tot > 0 else 0.0)
        if commit:
            self._deficit_last = deficit
        return deficit

    # ------------------------------------------------------------------ acquire
    def _class_of(self, campaign: str, name: str | None) -> int:
        cname = name if name is not None else self.envelopes[campaign].service_class
        try:
            return self._cls_index[cname]
        except KeyError:
            raise InvalidArgument("service_class", f"must be one of {list(self._cls_index)}",
                                  cname) from None

    def acquire(self, intent: Intent) -> Decision:
        """Decide an intent now (SPEC §4).

        Granted, pending or refused with a reason: a denial is a decision, not an
        exception, so only bad input raises, before any state changes.

        Parameters
        ----------
        intent : Intent
            The request.

        Returns
        -------
        Decision
            ``granted`` (with the lease, its path, cost and wait), ``pending`` (queued
            until its TTL or deadline; the binding ``reason`` and ``retry_after``) or
            ``refused`` (``reason``: ``ceiling``, ``capacity``, ``tokens``, ``credits``,
            ``deadline`` or ``pending_limit``).

        Raises
        ------
        UnknownCampaign
            ``intent.campaign`` is not registered.
        InvalidArgument
            ``intent`` is not an Intent, names a dimension the pool does not hold
            (``"units"``) or an unknown ``service_class``.
        TimeWentBackwards
            The clock ran backwards.
        """
        fast = self._fast
        if fast is not None:
            # the compiled common case (nothing unusual to do; with a journal it writes the
            # same records and ends the operation as @_op does); None when it does not
            # apply, with nothing changed
            dec: Decision | None = fast.acquire(intent)
            if dec is not None:
                return dec
        return self._acquire(intent)

    @_op
    def _acquire(self, intent: Intent) -> Decision:
        if not isinstance(intent, Intent):
            raise InvalidArgument("intent", "must be an Intent", intent)
        c = self.campaign_index(intent.campaign)
        d = self._dim_index.get(intent.dim)
        if d is None:
            raise InvalidArgument("units", f"dimension must be one of {self.dims}", intent.dim)
        k = self._class_of(intent.campaign, intent.service_class)
        nmin, nmax = intent.bounds
        dur = units.to_ns(intent.duration, "duration")
        spend = -1 if intent.max_spend is None else round(intent.max_spend * CREDIT)
        deadline = None if intent.deadline is None else units.to_ns(intent.deadline, "deadline")
        ttl = units.to_ns(intent.ttl if intent.ttl is not None else self.ttl, "ttl")
        t = self._now()
        self._advance(t)
        return self._acquire_ns(c, d, k, nmin, nmax, dur, spend, deadline, ttl, t, intent)

    def _acquire_ns(self, c: int, d: int, k: int, nmin: int, nmax: int, dur: int, spend: int,
                    deadline: int | None, ttl: int, t: int, request: Intent | None = None,
                    batch: int = 0, iid: int | None = None) -> Decision:
        """One intent in engine integers, journaled (the entry point replay uses)."""
        if iid is None:
            iid = self._next_intent
            self._next_intent += 1
        if self.journal is None:
            return self._decide_one(iid, c, d, k, nmin, nmax, dur, spend, deadline, ttl, t,
                                    request)
        row = self._request_row(c, d, k, nmin, nmax, dur, spend, deadline, ttl, t, iid, batch)
        dec = self._decide_one(iid, c, d, k, nmin, nmax, dur, spend, deadline, ttl, t, request)
        self._record_decision(row, dec, c, d)
        return dataclasses.replace(dec, seq=self.journal.add(row))

    def _request_row(self, c: int, d: int, k: int, nmin: int, nmax: int, dur: int, spend: int,
                     deadline: int | None, ttl: int, t: int, iid: int,
                     batch: int) -> dict[str, Any]:
        """A journal row with the request and the rule inputs as they stand before the
        decision (SPEC §9): class rank, deficit, tokens, credits, free/unmet capacity and
        the limit each rule sets on the size."""
        st, kern = self.st, self._k
        row: dict[str, Any] = {}
        row["op"], row["t"], row["campaign"], row["dim"], row["cls"] = J.OP["acquire"], t, c, d, k
        row["batch"] = batch
        row["nmin"], row["nmax"], row["dur"], row["max_spend"] = nmin, nmax, dur, spend
        row["deadline"] = J.deadline_field(deadline)
        row["ttl"], row["intent"] = ttl, iid
        row["rank"] = int(st.cls[k, 0])
        row["deficit"] = self._deficit_last[c]
        _, _, _, _, lims = kern.decide(st, c, d, k, nmin, nmax, dur, spend, t)
        row["tokens_before"], row["credits_before"] = int(st.T[c, d]), int(st.left[c])
        row["free"], row["unmet"] = kern.free_now(st, d), int(st.U[d])
        row["lim_ceiling"], row["lim_capacity"], row["lim_tokens"], row["lim_credits"] = \
            (min(x, MAXV) for x in lims)
        return row

    def _record_decision(self, row: dict[str, Any], dec: "Decision", c: int, d: int) -> None:
        row["outcome"] = {GRANTED_OUT: 1, PENDING_OUT: 2, REFUSED_OUT: 3}.get(dec.outcome, 4)
        row["reason"] = REASONS.index(dec.reason) if dec.reason else 0
        row["path"] = {"warm": 1, "reclaim": 2}.get(dec.path or "", 0)
        row["units"] = dec.units
        if dec.lease is not None:
            row["lease"] = dec.lease.id
            row["cost"] = int(self.st.cost[dec.lease.id & ROW_MASK])
        self._after(row, c, d)

    def _decide_one(self, iid: int, c: int, d: int, k: int, nmin: int, nmax: int, dur: int,
                    spend: int, deadline: int | None, ttl: int, t: int,
                    request: Intent | None) -> Decision:
        name = self._names[c]
        if deadline is not None and deadline < t:
            return Decision(REFUSED_OUT, iid, name, reason="deadline")
        self._reserve(1, nmax)
        buf = self._buf
        r = self._k.admit(self.st, c, d, k, nmin, nmax, dur, spend, t, iid, buf)
        if r == GRANTED:
            lid = int(buf[2])
            if not self.st.firm[lid & ROW_MASK]:
                self._opp_active[d].add(lid)
            return Decision(GRANTED_OUT, iid, name, units=int(buf[0]), lease=self.lease(lid),
                            path="warm", cost=int(buf[3]) / CREDIT)
        if r == REFUSED:
            reason = int(buf[1])
            return Decision(REFUSED_OUT, iid, name, reason=REASONS[reason],
                            retry_after=self._retry_after(c, d, nmin, dur, reason))
        return self._slow(iid, c, d, k, nmin, nmax, dur, spend, deadline, ttl, t, request)

    def _slow(self, iid: int, c: int, d: int, k: int, nmin: int, nmax: int, dur: int, spend: int,
              deadline: int | None, ttl: int, t: int, request: Intent | None) -> Decision:
        """Reclaim or pend: the parts of §4 that need policy (victims, queue)."""
        name = self._names[c]
        n, reason, path, pm, lims = self._k.decide(self.st, c, d, k, nmin, nmax, dur, spend, t)
        if n >= nmin and path == RECLAIM:
            plan = self._plan_reclaim(d, n, t)
            if deadline is not None and plan[1] > deadline:
                return Decision(REFUSED_OUT, iid, name, reason="deadline",
                                wait=(plan[1] - t) / NS)
            lid = self._reclaim(c, d, k, n, dur, pm, t, iid, plan)
            return Decision(GRANTED_OUT, iid, name, units=n, lease=self.lease(lid),
                            path="reclaim", cost=int(self.st.cost[lid & ROW_MASK]) / CREDIT,
                            wait=(self._activation[lid] - t) / NS)
        oldest = self._queue.full(c, self.max_pending)
        if oldest is not None:
            # at its cap: a slot frees by the time its oldest waiting intent expires
            return Decision(REFUSED_OUT, iid, name, reason=REASONS[PENDING_LIMIT],
                            retry_after=max(0, oldest.expires - t) / NS)
        if self.max_pending == 0:
            return Decision(REFUSED_OUT, iid, name, reason=REASONS[PENDING_LIMIT])
        expires = t + ttl
        if deadline is not None:
            expires = min(expires, deadline)
        self._queue.add(iid, c, d, k, nmin, nmax, dur, spend, deadline, expires, reason,
                        request, lims, t)
        self._push(expires, _EV_PENDING, iid)
        return Decision(PENDING_OUT, iid, name, reason=REASONS[reason],
                        retry_after=self._retry_after(c, d, nmin, dur, reason))

    def _track_opportunistic(self, d: int, lids: np.ndarray) -> None:
        """Remember leases the compiled loop granted that are opportunistic (victims)."""
        lids = lids[lids >= 0]
        self._opp_active[d].update(lids[self.st.firm[lids & ROW_MASK] == 0].tolist())

    def _plan_reclaim(self, d: int, n: int, t: int) -> tuple[list[int], int]:
        """Victims and activation time for a reclaim grant of n units on d at t: units
        already revoking but not promised come first (at their deadlines), then active
        opportunistic leases in preemption order, each after its class grace."""
        st = self.st
        need = n - max(0, self._k.free_now(st, d))
        at = t
        surplus = max(0, int(st.rev[d]) - int(st.prom[d]))
        if need > 0 and surplus > 0:
            at = max([at] + [int(st.revoke_at[l & ROW_MASK]) for l in self._revoking[d]])
            need -= surplus
        victims = []
        for lid in self._victims(d, t) if need > 0 else ():
            if need <= 0:
                break
            victims.append(lid)
            need -= int(st.units[lid & ROW_MASK])
            at = max(at, t + int(st.cls[int(st.lcls[lid & ROW_MASK]), 4]))
        if need > 0:  # decide() counted reclaimable units that the victim set lacks
            raise RuntimeError(f"bursarcore internal error: reclaim plan short by {need} units")
        return victims, at

    def _victims(self, d: int, t: int) -> list[int]:
        """Active opportunistic leases on d in preemption order: smallest fair-share
        deficit first, then largest lease, then lease id (SPEC §6)."""
        st = self.st
        ids = self._opp_active[d]
        if not ids:
            return []
        deficit = self._deficit_array(t)
        return sorted(ids, key=lambda l: (deficit[int(st.camp[l & ROW_MASK])],
                                          -int(st.units[l & ROW_MASK]), l))

    def _reclaim(self, c: int, d: int, k: int, n: int, dur: int, pm: int, t: int, iid: int,
                 plan: tuple[list[int], int]) -> int:
        """Preempt the planned victims (notice now, revoked after their grace) and grant a
        starting lease that becomes active when they are gone (SPEC §4.1, §4.6)."""
        st = self.st
        victims, at = plan
        for lid in victims:
            grace = int(st.cls[int(st.lcls[lid & ROW_MASK]), 4])
            deadline = self._k.preempt(st, lid, t, grace)
            self._opp_active[d].discard(lid)
            self._revoking[d].add(lid)
            self._push(deadline, _EV_REVOKE, lid)
            self._emit("preempt_notice", t, int(st.camp[lid & ROW_MASK]), lid=lid,
                       deadline=deadline)
        self._reserve(1, n)
        lid = self._k.grant(st, c, d, k, n, dur, pm, t, True, iid)
        self._activation[lid] = at
        self._push(at, _EV_ACTIVATE, lid)
        return lid  # type: ignore[no-any-return]  # the kernel (picked at run time) is untyped

    def _retry_after(self, c: int, d: int, nmin: int, dur: int, reason: int) -> float | None:
        st = self.st
        if reason == TOKENS:
            wait = self._k.token_wait(st, c, d, nmin, dur)
            return wait / NS if wait >= 0 else None
        if reason == CAPACITY:
            nxt = self._k.next_expiry(st)
            return max(0, nxt - self._t) / NS if nxt >= 0 else None
        return None

    # ------------------------------------------------------------------ pending queue (§4.5)
    _queue_by_key = True       # False: every pass intent by intent (tests compare the two)

    def _serve_pending(self, t: int) -> None:
        """Grant what the queue can have at t, in the order of SPEC §4.5."""
        self._queue.serve(t)

    def _wake_due(self, t: int) -> bool:
        """Whether a pass at t has a key to decide (``PendingQueue.wake_due``)."""
        return self._queue.wake_due(t)

    def _grant_pending(self, p: _Pending, n: int, path: int, pm: int, plan: Any,
                       t: int) -> None:
        st = self.st
        self._queue.drop(p.intent_id)
        if path == WARM:
            lid = self._k.grant(st, p.campaign, p.dim, p.cls, n, p.dur, pm, t, False,
                                p.intent_id)
            if not st.firm[lid & ROW_MASK]:
                self._opp_active[p.dim].add(lid)
        else:
            lid = self._reclaim(p.campaign, p.dim, p.cls, n, p.dur, pm, t, p.intent_id, plan)
        self._emit("granted", t, p.campaign, lid=lid, iid=p.intent_id, pend=p, path=path)


    @_op
    def cancel(self, intent_id: int) -> bool:
        """Withdraw a pending intent.

        Parameters
        ----------
        intent_id : int
            The id of an intent this broker decided (``Decision.intent_id``).

        Returns
        -------
        bool
            True if it was pending and is withdrawn; False if it is no longer pending
            (granted, refused, expired or cancelled already).

        Raises
        ------
        UnknownLease
            ``intent_id`` is not an intent of this broker (``field`` is ``"intent_id"``).
        """
        if isinstance(intent_id, (bool, np.bool_)) or not isinstance(intent_id, (int, np.integer)):
            raise UnknownLease("intent_id", "is not an intent of this broker", intent_id)
        intent_id = int(intent_id)
        t = self._now()
        self._advance(t)
        if intent_id not in self._queue.intents:
            if isinstance(intent_id, int) and 0 <= intent_id < self._next_intent:
                return False
            raise UnknownLease("intent_id", "is not an intent of this broker", intent_id)
        p = self._queue.drop(intent_id)
        if self.journal is not None:
            row = {}
            row["op"], row["t"], row["campaign"], row["intent"] = J.OP["cancel"], t, p.campaign, intent_id
            row["dim"], row["cls"], row["outcome"], row["reason"] = p.dim, p.cls, 4, CANCELLED
            self._after(row, p.campaign, p.dim)
            self.journal.add(row)
        return True

    def pending(self, campaign: str | None = None) -> list[dict[str, Any]]:
        """The pending intents, in arrival order, each with the rule that binds it now.

        A read: the reason is worked out from the state as it stands, and nothing moves.

        Parameters
        ----------
        campaign : str, optional
            Only this campaign's (read from its own index); default all.

        Returns
        -------
        list of dict
            One per intent: ``intent_id``, ``campaign``, ``dim``, ``min``, ``max``,
            ``duration``, ``reason``, ``expires`` (broker time) and ``service_class``.

        Raises
        ------
        UnknownCampaign
            ``campaign`` is not registered.
        """
        c = None if campaign is None else self.campaign_index(campaign)
        return self._queue.listing(c)

    # ------------------------------------------------------------------ leases
    def _lease_id(self, lease_id: Any) -> int:
        """``lease_id`` as an int, if this broker issued it (it may have ended since, and
        its row may hold a later lease: see :meth:`_row`)."""
        if isinstance(lease_id, (bool, np.bool_)) or not isinstance(lease_id, (int, np.integer)):
            raise UnknownLease("lease_id", "is not a lease of this broker", lease_id)
        try:
            self.st.row_of(int(lease_id))
        except KeyError:
            raise UnknownLease("lease_id", "is not a lease of this broker", lease_id) from None
        return int(lease_id)

    def _row(self, lid: int) -> int:
        """The row of an issued lease id, or -1 when the lease has ended and its row holds
        a later lease (a stale id: see docs/policy.md, "Memory")."""
        return self.st.row_of(lid)

    def _lease_info(self, r: int) -> tuple[int, int, int, int, int] | None:
        """(campaign, dim, class, intent, units) of the lease in row r (None: stale), read
        before an operation that may end it and let its row be reused."""
        if r < 0:
            return None
        st = self.st
        return (int(st.camp[r]), int(st.dim[r]), int(st.lcls[r]), int(st.intent[r]),
                int(st.units[r]))

    @_op
    def release(self, lease_id: int) -> Decision:
        """End a lease early: its units free now, unused tokens and credits are refunded.

        Parameters
        ----------
        lease_id : int
            A lease this broker issued.

        Returns
        -------
        Decision
            ``released``, with the units, the ended lease and ``cost`` the refund
            (negative); or ``refused`` with reason ``invalid`` if the lease has ended
            already (for an ended lease whose record was reused: intent id -1 and no
            campaign).

        Raises
        ------
        UnknownLease
            ``lease_id`` is not a lease of this broker.
        """
        lid = self._lease_id(lease_id)
        t = self._now()
        self._advance(t)
        r = self._row(lid)          # after the advance: it may have ended (and been reused)
        info = self._lease_info(r)
        return self._journaled(J.OP["release"], lid, info, t, 0, -1, self._release(lid, r, t))

    def _release(self, lid: int, r: int, t: int) -> Decision:
        st = self.st
        if r < 0:
            return _STALE
        state = int(st.state[r])
        c = int(st.camp[r])
        name = self._names[c]
        if state not in (STARTING, ACTIVE, REVOKING):
            return Decision(REFUSED_OUT, int(st.intent[r]), name, reason="invalid",
                            lease=self.lease(lid))
        before = int(st.refunded[c])
        self._k.end_lease(st, lid, t, RELEASED)
        self._queue.lease_ended(c)
        self._purge_retired()
        d = int(st.dim[r])
        self._opp_active[d].discard(lid)
        self._revoking[d].discard(lid)
        self._activation.pop(lid, None)
        refund = int(st.refunded[c]) - before
        # the decision before serving the queue: a grant there may take this row
        dec = Decision("released", int(st.intent[r]), name, units=int(st.units[r]),
                       lease=self.lease(lid), cost=-refund / CREDIT)
        self._serve_pending(t)
        return dec

    def _journaled(self, op: int, lid: int, info: tuple[Any, ...] | None, t: int, ext: int,
                   spend: int,
                   dec: Decision) -> Decision:
        """Journal a release or renew decision on lease ``lid`` (``info``: its
        :meth:`_lease_info` from before the decision; None for a stale id, whose record
        names no campaign and carries no state after)."""
        if self.journal is None:
            return dec
        row = {}
        row["op"], row["t"], row["lease"] = op, t, lid
        if info is not None:
            c, d, k, intent, n = info
            row["campaign"], row["dim"] = c, d
            row["cls"], row["intent"], row["units"] = k, intent, n
        row["dur"], row["max_spend"] = ext, spend
        row["outcome"] = {GRANTED_OUT: 1, REFUSED_OUT: 3}.get(dec.outcome, 4)
        row["reason"] = REASONS.index(dec.reason) if dec.reason else 0
        row["cost"] = round(dec.cost * CREDIT)
        if op == J.OP["renew"] and info is not None:
            row["tokens_before"], row["credits_before"] = self._renew_before
        if info is not None:
            self._after(row, c, d)
        return dataclasses.replace(dec, seq=self.journal.add(row))

    @_op
    def renew(self, lease_id: int, duration: float, max_spend: float | None = None) -> Decision:
        """Extend an active lease by ``duration`` seconds.

        The extension passes SPEC §4.2 and §4.3 (tokens, credits) atomically: granted in
        full or refused with nothing changed.

        Parameters
        ----------
        lease_id : int
            A lease this broker issued.
        duration : float
            Seconds to add, one microsecond to ten years.
        max_spend : float, optional
            The most credits the extension may cost.

        Returns
        -------
        Decision
            ``granted`` (path ``warm``, ``cost`` the extension's price) or ``refused``
            with the rule (``tokens``, ``credits``; ``invalid`` for a lease that is not
            active), with the lease as it stands.

        Raises
        ------
        UnknownLease
            ``lease_id`` is not a lease of this broker.
        InvalidArgument
            ``duration`` or ``max_spend`` is out of range, or the lease would end past
            the engine's time range.
        """
        lid = self._lease_id(lease_id)
        ext = units.to_ns(units.real(duration, "duration", lo=units.MIN_DURATION,
                                     hi=MAX_DURATION, what="a number of seconds"), "duration")
        spend = -1 if max_spend is None else round(
            units.real(max_spend, "max_spend", hi=units.MAX_CREDITS) * CREDIT)
        t = self._now()
        self._advance(t)
        r = self._row(lid)
        if r >= 0 and int(self.st.t_end[r]) + ext > units.MAX_NS:
            raise InvalidArgument("duration", "would end the lease past the engine's time "
                                  f"range ({units.MAX_SECONDS:.6g} s)", duration)
        return self._journaled(J.OP["renew"], lid, self._lease_info(r), t, ext, spend,
                               self._renew(lid, r, ext, spend, t))

    def _renew(self, lid: int, r: int, ext: int, spend: int, t: int) -> Decision:
        st = self.st
        if r < 0:
            return _STALE
        c, d = int(st.camp[r]), int(st.dim[r])
        name = self._names[c]
        self._k.settle(st, c, d, t)
        self._renew_before = (int(st.T[c, d]), int(st.left[c]))
        if int(st.state[r]) != ACTIVE:
            return Decision(REFUSED_OUT, int(st.intent[r]), name, reason="invalid",
                            lease=self.lease(lid))
        self._reserve(1, 0)
        reason, price = self._k.renew(st, lid, ext, t, spend)
        if reason == OK:
            self._queue.lease_ended(c)          # (a renewal can refund tokens)
        if reason != OK:
            return Decision(REFUSED_OUT, int(st.intent[r]), name, reason=REASONS[reason],
                            lease=self.lease(lid), cost=price / CREDIT)
        return Decision(GRANTED_OUT, int(st.intent[r]), name, units=int(st.units[r]),
                        lease=self.lease(lid), path="warm", cost=price / CREDIT)

    def lease(self, lease_id: int) -> Lease:
        """The lease ``lease_id``, live or ended.

        An ended lease's record is kept until its row is reused (after ``reuse_after``
        later leases have ended), so memory stays bounded however many leases end.

        Parameters
        ----------
        lease_id : int
            A lease this broker issued.

        Returns
        -------
        Lease
            A snapshot of it now.

        Raises
        ------
        UnknownLease
            ``lease_id`` is not a lease of this broker, or it has ended and its record was
            reused (the message says so).
        """
        lid = self._lease_id(lease_id)
        r = self._row(lid)
        if r < 0:
            raise UnknownLease("lease_id", "has ended and its record was reused (it keeps no "
                               "record once reuse_after later leases have ended)", lease_id)
        st = self.st
        (camp, d, n, firm, state, k, t_grant, t_start, t_end, cost, off, revoke_at,
         intent) = (a.item(r) for a in (st.camp, st.dim, st.units, st.firm, st.state, st.lcls,
                                        st.t_grant, st.t_start, st.t_end, st.cost,
                                        st.slot_off, st.revoke_at, st.intent))
        slots: tuple[int, ...] = ()
        placement: tuple[tuple[str, int], ...] = ()
        if state == ACTIVE or state == REVOKING:
            slots = tuple(st.arena[off:off + n].tolist())
            owner = self._node_of_slot[d].take(slots).tolist()
            count: dict[int, int] = {}
            for j in owner:  # nodes in order of first appearance
                count[j] = count.get(j, 0) + 1
            names = self._node_names[d]
            placement = tuple([(names[j], c) for j, c in count.items()])
        started = off >= 0  # a reclaim grant released before its activation never started
        return Lease(
            id=lid, campaign=self._names[camp], dim=self.dims[d], units=n,
            state=LEASE_STATES[state], firm=bool(firm), service_class=self.classes[k].name,
            granted_at=t_grant / NS, start=t_start / NS if started else None,
            expiry=t_end / NS if started else None, cost=cost / CREDIT,
            revoke_at=revoke_at / NS if state in (REVOKING, REVOKED) else None,
            intent=intent, placement=placement, slots=slots)

    @_op
    def leases(self, campaign: str | None = None) -> list[Lease]:
        """The live leases: starting, active or revoking.

        Parameters
        ----------
        campaign : str, optional
            Only this campaign's; default all.

        Returns
        -------
        list of Lease
            Snapshots, after advancing to the clock (leases due to expire have ended).

        Raises
        ------
        UnknownCampaign
            ``campaign`` is not registered.
        """
        t = self._now()
        self._advance(t)
        st = self.st
        n = st.nleases
        live = (st.state[:n] == STARTING) | (st.state[:n] == ACTIVE) | (st.state[:n] == REVOKING)
        if campaign is not None:
            live &= st.camp[:n] == self.campaign_index(campaign)
        return [self.lease(st.lease_id(r)) for r in np.flatnonzero(live).tolist()]

    @_op
    def poll(self) -> list[Event]:
        """Advance to the clock and return the events since the last poll.

        Each event is returned once, in the order it happened, so a caller polling in a
        loop sees every expiry, revocation and pending grant exactly once.

        Returns
        -------
        list of Event
            The events, oldest first.
        """
        t = self._now()
        self._advance(t)
        ev, self._events = self._events, []
        if self._fast is not None:         # expiries the compiled path queued unbuilt
            ev = self._fast.events(ev, True)
        return ev

    def _queued_events(self) -> list[Event]:
        """The events the next :meth:`poll` returns so far, without taking them."""
        ev = self._events
        return list(ev if self._fast is None else self._fast.events(ev, False))

    # ------------------------------------------------------------------ supply (§8)
    @_op
    def supply(self, campaign: str) -> Supply:
        """Supply signals for one campaign now (SPEC §8).

        Parameters
        ----------
        campaign : str
            A registered campaign.

        Returns
        -------
        Supply
            Credits left and, per held dimension, free and reclaimable units,
            congestion, tokens, prices and waits.

        Raises
        ------
        UnknownCampaign
            ``campaign`` is not registered.
        """
        c = self.campaign_index(campaign)
        t = self._now()
        self._advance(t)
        st, k = self.st, self._k
        dims = {}
        grace = max([cl.grace for cl in self.classes if cl.preemptible] or [0.0])
        for d, dname in enumerate(self.dims):
            k.settle(st, c, d, t)
            free = k.free_now(st, d)
            kappa = k.congestion_ppm(st, d) / PPM
            mult = k.congestion_mult(st, d) / PPM
            prices = {cl.name: k.price_pm(st, d, i) / CREDIT for i, cl in enumerate(self.classes)}
            cold = self.cold_wait(dname) if self.cold_wait is not None else None
            Bc = int(st.Bcap[c, d])
            dims[dname] = DimSupply(
                free=max(0, free), capacity=int(st.cap[d]),
                reclaimable=int(st.oppa[d]) + max(0, int(st.rev[d]) - int(st.prom[d])),
                congestion=kappa, multiplier=mult,
                # an unbounded bucket holds "unlimited" tokens, whatever the sentinel's
                # count after debits (as state() says None for it)
                tokens=math.inf if Bc >= MAXV else int(st.T[c, d]) / NS,
                bucket=math.inf if Bc >= MAXV else Bc / NS,
                held=int(st.H[c, d]), ceiling=int(st.b[c, d]), price=prices,
                wait={"warm": 0.0, "reclaim": grace, "cold": cold})
        left = int(st.left[c])
        return Supply(campaign, t / NS, math.inf if left >= MAXV else left / CREDIT,
                      self.envelopes[campaign].service_class, dims)

    @_op
    def quote(self, campaign: str, sizes: Sequence[int], durations: Sequence[float], *,
              dim: str | None = None, service_class: str | None = None) -> Quote:
        """Cost, path and wait for every (size, duration) pair, in one vectorised call.

        A what-if: each cell is what an intent for exactly that size and duration would
        meet now (SPEC §4.4, §7), and nothing is granted or debited.

        Parameters
        ----------
        campaign : str
            A registered campaign.
        sizes : sequence of int
            Sizes in [1, ``units.MAX_UNITS``]; non-empty.
        durations : sequence of float
            Seconds, one microsecond to ten years; non-empty. At most 1,000,000 cells
            in all.
        dim : str, optional
            A held dimension (default: the primary one).
        service_class : str, optional
            The class to price at (default: the campaign's).

        Returns
        -------
        Quote
            The grid, ``len(sizes)`` rows by ``len(durations)`` columns.

        Raises
        ------
        UnknownCampaign
            ``campaign`` is not registered.
        InvalidArgument
            ``dim``, ``service_class``, ``sizes`` or ``durations`` breaks its rule, or
            the grid is too large (``"sizes"``).
        """
        c = self.campaign_index(campaign)
        dname = dim if dim is not None else self.dims[0]
        if dname not in self._dim_index:
            raise InvalidArgument("dim", f"must be one of {self.dims}", dname)
        d = self._dim_index[dname]
        kc = self._class_of(campaign, service_class)
        sz = units.column(sizes, "sizes")
        if (sz.ndim != 1 or not sz.size or sz.dtype.kind not in "iu" or (sz < 1).any()
                or (sz > units.MAX_UNITS).any()):
            raise InvalidArgument("sizes", "must be a non-empty 1-D array of integers in "
                                  f"[1, {units.MAX_UNITS:,}]", sizes)
        sz = sz.astype(np.int64)
        du = units.ns_array(durations, "durations")
        lo_ns, hi_ns = _MIN_DURATION, _MAX_DURATION
        if not du.size or (du < lo_ns).any() or (du > hi_ns).any():
            raise InvalidArgument("durations", "must be a non-empty 1-D array of seconds in "
                                  f"[{units.MIN_DURATION:g}, {MAX_DURATION:,}]", durations)
        if sz.size * du.size > _MAX_GRID:
            raise InvalidArgument("sizes", f"sizes x durations must be at most {_MAX_GRID:,} "
                                  "cells", (sz.size, du.size))
        t = self._now()
        self._advance(t)
        cost, path_code, reason_code = self._k.quote(self.st, c, d, kc, sz, du, t)
        path = np.array(_PATHS, dtype=object)[np.asarray(path_code, dtype=np.int64)]
        reason = np.array(REASONS, dtype=object)[np.asarray(reason_code, dtype=np.int64)]
        grace = max([cl.grace for cl in self.classes if cl.preemptible] or [0.0])
        cold = self.cold_wait(dname) if self.cold_wait is not None else math.inf
        wait = np.where(path == "warm", 0.0, np.where(path == "reclaim", grace, cold))
        return Quote(sizes=sz, durations=du / NS,
                     cost=np.asarray(cost, dtype=np.float64) / CREDIT,
                     path=path.astype(str), wait=wait.astype(float), grantable=(reason == ""),
                     reason=reason.astype(str))

    # ------------------------------------------------------------------ batch
    @_op
    def admit_batch(self, campaign_idx: Any, units_: Any, durations: Any, now: float | None = None,
                    *, service_class: str | int | None = None, dim: str | None = None,
                    ttl: float | None = None) -> BatchResult:
        """Decide many intents at one instant, exactly as the same sequence of
        :meth:`acquire` calls would.

        Warm grants and certain refusals run in the compiled loop; reclaim and pending
        items drop to the policy layer one at a time. The whole batch is checked before
        any item is decided.

        Parameters
        ----------
        campaign_idx : array_like of int
            Campaign indices (from :meth:`register`), shape (n,).
        units_ : array_like of int
            Shape (n,) (min = max) or (n, 2) (min, max); 1 <= min <= max.
        durations : float or array_like of float
            Seconds, a scalar or shape (n,).
        now : float, optional
            The instant, >= the broker time (default: the clock's); a
            :class:`ManualClock` behind it is moved forward to it.
        service_class : str, optional
            A class name (default: each campaign's).
        dim : str, optional
            A held dimension (default: the primary one).
        ttl : float, optional
            The longest wait in the pending queue for the items that go pending (default:
            the broker's, as ``Intent.ttl``).

        Returns
        -------
        BatchResult
            Units granted, reason codes, lease ids, outcome codes and intent ids.

        Raises
        ------
        InvalidArgument
            An argument breaks its rule, naming it and the first bad position
            (``"units"``, ``"durations"``, ``"campaign_idx"``, ``"dim"``,
            ``"service_class"``, ``"ttl"``).
        TimeWentBackwards
            ``now`` is before the broker time.
        """
        st = self.st
        ci = units.index_array(campaign_idx, st.C, "campaign_idx")
        n = ci.shape[0]
        nmin, nmax, top = _batch_units(units_, n)
        if isinstance(durations, (int, float)) and not isinstance(durations, bool):
            # one duration for the batch: validated once (the same rounding as ns_array)
            one = units.to_ns(durations, "durations")
            if not _MIN_DURATION <= one <= _MAX_DURATION:
                raise InvalidArgument("durations", _DUR_RULE, durations)
            dur = self._constant(one, n)
        else:
            dur = units.ns_array(durations, "durations", n)     # a new contiguous column
            lo, hi = minmax(dur) if n else (_MIN_DURATION, _MIN_DURATION)
            if not _MIN_DURATION <= lo <= hi <= _MAX_DURATION:
                bad = int(np.flatnonzero((dur < _MIN_DURATION) | (dur > _MAX_DURATION))[0])
                raise InvalidArgument("durations", _DUR_RULE,
                                      f"{int(dur[bad]) / NS!r} at position {bad}")
        d = self._dim_index.get(dim if dim is not None else self.dims[0])
        if d is None:
            raise InvalidArgument("dim", f"must be one of {self.dims}", dim)
        if service_class is None and self._one_cls is not None:
            ks = self._constant(self._one_cls, n)       # every campaign has this class
            opp = self._opp_default
        elif service_class is None:
            ks = self._default_cls.take(ci)
            opp = self._opp_default
        else:
            name = service_class if isinstance(service_class, str) else None
            kk = self._cls_index.get(name) if name else None
            if kk is None:
                raise InvalidArgument("service_class", f"must be one of {list(self._cls_index)}",
                                      service_class)
            ks = self._constant(kk, n)
            opp = self.classes[kk].preemptible
        if ttl is not None and units.real(ttl, "ttl", hi=units.MAX_TTL,
                                          what="a number of seconds") <= 0:  # as Intent.ttl
            raise InvalidArgument("ttl", "must be > 0", ttl)
        ttl_ns = units.to_ns(ttl if ttl is not None else self.ttl, "ttl")
        t = self._now() if now is None else units.to_ns(now)
        if t < self._t:
            raise TimeWentBackwards("now", f"must be >= the broker time {self._t / NS}", t / NS)
        if isinstance(self.clock, ManualClock) and t / NS > self.clock.now():
            self.clock.set(t / NS)
        self._advance(t)
        return self._admit_batch_loop(ci, ks, d, nmin, nmax, dur, t, ttl_ns, opp, top)

    def _admit_batch_loop(self, ci: np.ndarray, ks: np.ndarray, d: int, nmin: np.ndarray,
                          nmax: np.ndarray, dur: np.ndarray, t: int, ttl: int, opp: bool = True,
                          top: int | None = None) -> BatchResult:
        """Warm grants and certain refusals in the compiled loop; a slow item (reclaim or
        pending) goes through the single path, flagged as part of the batch. With a
        journal, the loop also returns each item's rule inputs and state after, and its
        records go in as one columnar append, equal field for field to what the single
        path (which replay uses) writes. ``opp`` is False when no item's class is
        preemptible: the loop's grants are then all firm and none needs tracking as a
        reclaim victim. ``top`` (the largest max, if known) bounds the batch's slots, so
        their exact sum is needed only when the bound does not fit the arena."""
        st = self.st
        n = ci.shape[0]
        # every item is written by the loop or by the single path (np.empty, not zeros)
        out_n = np.empty(n, dtype=np.int64)
        out_r = np.empty(n, dtype=np.int64)
        out_l = np.empty(n, dtype=np.int64)
        slow = []                        # (item, outcome code) decided by the single path
        rec = np.empty((n, 11), dtype=np.int64) if self.journal is not None else None
        dims = self._constant(d, n)
        iid0 = self._next_intent
        self._next_intent += n
        slots = n * top if top is not None else None
        if slots is None or st.arena_top.item(0) + slots > st.arena.shape[0]:
            slots = int(nmax.sum()) if n else 0
        self._reserve(n, slots)
        private = False
        j = 0
        while j < n:
            j0 = j
            j = self._k.admit_batch(st, ci, ks, dims, nmin, nmax, dur, t, iid0, out_n, out_r,
                                    out_l, j, rec)
            if j > j0:
                if opp:
                    self._track_opportunistic(d, out_l[j0:j])
                if rec is not None:
                    self._journal_batch(j0, j, ci, ks, d, nmin, nmax, dur, t, iid0, ttl,
                                        out_n, out_r, out_l, rec)
            if j >= n:
                break
            if not private:
                # campaign_idx and units may be the caller's arrays, checked once; the single
                # path can run event callbacks, so the rest of the batch reads copies
                private = True
                same = nmax is nmin
                ci, nmin = ci.copy(), nmin.copy()
                nmax = nmin if same else nmax.copy()
            dec = self._acquire_ns(int(ci[j]), d, int(ks[j]), int(nmin[j]), int(nmax[j]),
                                   int(dur[j]), -1, None, ttl, t, None,
                                   batch=1 if j == 0 else 2, iid=iid0 + j)
            slow.append((j, _OUTCOME_CODE[dec.outcome]))
            out_n[j] = dec.units if dec.granted else 0
            out_r[j] = REASONS.index(dec.reason) if dec.reason else 0
            out_l[j] = dec.lease.id if dec.lease else -1
            j += 1
        # no lease: refused (units 0), unless the single path said pending
        out_o, iids = finish(out_n, out_l, iid0)
        for j, code in slow:
            out_o[j] = code
        return BatchResult(out_n, out_r, out_l, out_o, iids)

    def _journal_batch(self, j0: int, j: int, ci: np.ndarray, ks: np.ndarray, d: int,
                       nmin: np.ndarray, nmax: np.ndarray, dur: np.ndarray, t: int, iid0: int,
                       ttl: int, out_n: np.ndarray, out_r: np.ndarray, out_l: np.ndarray,
                       rec: np.ndarray) -> None:
        """Items j0..j of the compiled loop as ``acquire`` records, written in one pass
        from the loop's outputs straight into the journal's storage (journal/fill.py)."""
        from .journal.fill import fill_acquire
        jn: Journal = self.journal  # type: ignore[assignment]  # called only with a journal
        rows = jn.reserve(j - j0)
        fill_acquire(rows, jn.next_seq, j0, t, d, ttl, iid0, ci, ks, nmin, nmax, dur, out_n,
                     out_r, out_l, rec, self.st.cls[:, 0], self._deficit_last, self.st.cost)
        jn.append_reserved(rows)

    # ------------------------------------------------------------------ flow dimensions (§5)
    @_op
    def consume(self, campaign: str, dim: str, amount: float) -> Consumption:
        """Consume ``amount`` units of a flow dimension now (throttle at source, SPEC §5).

        The guaranteed bucket serves first; the rest must pass the campaign's sustained and
        peak buckets and the facility's shared bucket. A priced dimension (``price=``, in
        credits per unit) also charges credits, and is limited by them. What does not pass
        is a value to retry, not an error.

        Parameters
        ----------
        campaign : str
            A registered campaign.
        dim : str
            A flow dimension of the pool.
        amount : float
            Units to consume, >= 0.

        Returns
        -------
        Consumption
            The units allowed now, and when and why the rest may be retried.

        Raises
        ------
        UnknownCampaign
            ``campaign`` is not registered.
        InvalidArgument
            ``dim`` is not a flow dimension, or ``amount`` is out of range.
        """
        c = self.campaign_index(campaign)
        fd = self._flow_index.get(dim) if isinstance(dim, str) else None
        if fd is None:
            raise InvalidArgument("dim", f"must be a flow dimension, one of {self.flow_dims}", dim)
        a = units.to_fixed(amount, "amount")
        t = self._now()
        self._advance(t)
        return self._consume_ns(c, fd, a, t)

    def _consume_ns(self, c: int, fd: int, a: int, t: int) -> Consumption:
        st = self.st
        price = int(self._flow_price[fd])
        left = int(st.left[c])
        ask = a
        if price:       # an unlimited budget (left = MAXV) bounds the cost by MAXV, as decide
            ask = min(a, min(left, MAXV) * units.SCALE // price)
        # (only flow dimensions get here, and a broker with flow dimensions has self.flow)
        allowed, retry, bound = self.flow.consume_fixed(  # type: ignore[union-attr]
            np.array([c], np.int64), np.array([fd], np.int64), np.array([ask], np.int64),
            np.array([t], np.int64))
        got, wait = int(allowed[0]), int(retry[0])
        reason = 0
        if got < a:
            reason = CREDITS if got == ask and ask < a else (CAPACITY if int(bound[0]) == 3 else TOKENS)
        cost = -(-got * price // units.SCALE) if price else 0
        if cost:
            if left < MAXV:
                st.left[c] -= cost
            st.spent[c] = wrap(int(st.spent[c]) + cost)
            st.cred_debited[c] = wrap(int(st.cred_debited[c]) + cost)
        from .flow import NEVER
        retry_s = 0.0 if got >= a else (math.inf if wait == NEVER or reason == CREDITS else wait / NS)
        seq = -1
        if self.journal is not None:
            row = {}
            row["op"], row["t"], row["campaign"] = J.OP["consume"], t, c
            row["dim"], row["nmax"], row["units"] = len(self.dims) + fd, a, got
            row["cost"], row["reason"], row["outcome"] = cost, reason, 1 if got >= a else 3
            row["dur"] = -1 if wait == NEVER else wait
            row["credits_after"] = int(st.left[c])
            seq = self.journal.add(row)
        return Consumption(self._names[c], self.flow_dims[fd], a / units.SCALE,
                           got / units.SCALE, retry_s, REASONS[reason] or None,
                           cost / CREDIT, seq)

    @_op
    def consume_batch(self, campaign_idx: Any, dims: Any, amounts: Any) -> tuple[np.ndarray, np.ndarray]:
        """Many consumptions at this instant, exactly as the same sequence of
        :meth:`consume` calls.

        The compiled loop decides them at once when no priced dimension is involved
        (and there is no journal).

        Parameters
        ----------
        campaign_idx : array_like of int
            Campaign indices (from :meth:`register`), shape (n,).
        dims : str, int or array_like
            Flow dimensions by name or index, a scalar or shape (n,).
        amounts : float or array_like of float
            Units to consume, a scalar or shape (n,).

        Returns
        -------
        allowed : numpy.ndarray
            Units allowed now, per item.
        retry_after : numpy.ndarray
            Seconds after which the rest may pass: 0.0 when all passed, ``inf`` when never.

        Raises
        ------
        InvalidArgument
            The pool has no flow dimensions, or an argument breaks its rule, naming it
            (``"dims"``, ``"campaign_idx"``, ``"amounts"``).
        """
        if self.flow is None:
            raise InvalidArgument("dims", "the pool has no flow dimensions")
        st = self.st
        ci = units.index_array(campaign_idx, st.C, "campaign_idx")
        n = ci.shape[0]
        d = units.column(dims, "dims")
        if d.dtype.kind in "US":
            bad = [x for x in np.unique(d) if x not in self._flow_index]
            if bad:
                raise InvalidArgument("dims", f"must be flow dimensions, one of {self.flow_dims}",
                                      bad[0])
            d = np.array([self._flow_index[x] for x in d.reshape(-1)], np.int64).reshape(d.shape)
        if d.ndim == 0:
            d = np.full(n, int(d), np.int64)
        di = units.index_array(d, len(self.flow_dims), "dims")
        if di.shape[0] != n:
            raise InvalidArgument("dims", f"must be a scalar or have shape ({n},)", d.shape)
        amt = units.fixed_array(amounts, "amounts", n)
        t = self._now()
        self._advance(t)
        priced = bool(self._flow_price[di].any()) if n else False
        if priced or self.journal is not None:
            out = [self._consume_ns(int(ci[j]), int(di[j]), int(amt[j]), t) for j in range(n)]
            return (np.array([o.allowed for o in out], dtype=float),
                    np.array([o.retry_after for o in out], dtype=float))
        from .flow import NEVER
        allowed, retry, _ = self.flow.consume_fixed(ci, di, amt, np.array([t], np.int64))
        secs = retry / NS
        secs[retry == NEVER] = math.inf
        secs[allowed >= amt] = 0.0
        return allowed / units.SCALE, secs

    def subscribe(self, callback: Any) -> None:
        """Call ``callback(event)`` for every event as it happens (a facility binding
        enforces revocations this way), in addition to queueing it for :meth:`poll`."""
        if not callable(callback):
            raise InvalidArgument("callback", "must be callable", callback)
        self._subscribers.append(callback)

    # ------------------------------------------------------------------ pool size (§12)
    @_op
    def add_nodes(self, dim: str, nodes: Sequence[tuple[str, int]]) -> list[int]:
        """Grow the pool: ``nodes`` is a list of ``(name, slots)`` joining dimension
        ``dim`` now (a facility binding calls this when a pilot allocation starts).
        Returns the new slot ids."""
        d = self._dim_arg(dim)
        if not isinstance(nodes, (list, tuple)) or not nodes or not all(
                isinstance(x, (list, tuple)) and len(x) == 2 for x in nodes):
            raise InvalidArgument("nodes", "must be a non-empty list of (name, slots)", nodes)
        nodes = [(str(n), units.whole(k, f"nodes[{n}]", lo=1)) for n, k in nodes]
        live = {self._node_names[d][int(j)] for j in
                np.unique(self._node_of_slot[d][self._slot_alive[d]])} if self._slot_alive[d].any() else set()
        seen = set()
        for name, k in nodes:
            if not name or name in live or name in seen:
                raise InvalidArgument("nodes", "names must be non-empty, unique and not in the pool",
                                      name)
            seen.add(name)
        grown = self._node_of_slot[d].shape[0] + sum(k for _, k in nodes)
        if grown > units.MAX_UNITS:
            raise InvalidArgument("nodes", f"the dimension's slots would number {grown:,}, "
                                  f"more than {units.MAX_UNITS:,}", len(nodes))
        t = self._now()
        self._advance(t)
        st = self.st
        start = self._node_of_slot[d].shape[0]
        total = sum(k for _, k in nodes)
        ids = np.arange(start, start + total, dtype=np.int32)
        # the stack holds every slot of the dimension once they are all free again: the
        # held ones come back to it when their leases end
        need = start + total
        if need > st.free_slots.shape[1]:
            wider = np.zeros((st.D, max(need, 2 * st.free_slots.shape[1])), dtype=np.int32)
            wider[:, : st.free_slots.shape[1]] = st.free_slots
            st.free_slots = wider
        top = int(st.top[d])
        st.free_slots[d, top:top + total] = ids[::-1]
        st.top[d] = top + total
        st.cap[d] += total
        owner = []
        for name, k in nodes:
            self._node_names[d].append(name)
            owner.extend([len(self._node_names[d]) - 1] * k)
        self._node_of_slot[d] = np.concatenate([self._node_of_slot[d], np.array(owner, np.int64)])
        self._slot_alive[d] = np.concatenate([self._slot_alive[d], np.ones(total, bool)])
        self.pool.capacity[self.dims[d]] = int(st.cap[d])
        self.pool.slot_map[self.dims[d]].extend(nodes)
        self._journal_nodes("add_nodes", t, d, {"dim": self.dims[d], "nodes": nodes})
        self._serve_pending(t)
        return ids.tolist()  # type: ignore[no-any-return]  # numpy types tolist() as Any

    @_op
    def remove_nodes(self, dim: str, nodes: Sequence[str], grace: float = 0.0) -> list[int]:
        """Shrink the pool: ``nodes`` leave dimension ``dim`` (a pilot ends or fails).
        Their free slots go at once; every lease holding one of their slots is revoked
        with notice, ``grace`` seconds from now (0: at once), and its slots leave the pool
        when it ends. Returns the ids of the leases revoked."""
        d = self._dim_arg(dim)
        if not isinstance(nodes, (list, tuple)) or not nodes:
            raise InvalidArgument("nodes", "must be a non-empty list of node names", nodes)
        g = units.to_ns(grace, "grace", allow_negative=False)
        names = self._node_names[d]
        index = {n: j for j, n in enumerate(names)}
        alive_nodes = set(np.unique(self._node_of_slot[d][self._slot_alive[d]]).tolist())
        js = []
        for n in nodes:
            j = index.get(n)
            if j is None or j not in alive_nodes:
                raise InvalidArgument("nodes", "each must be a node in the pool", n)
            js.append(j)
        t = self._now()
        self._advance(t)
        st = self.st
        gone = np.isin(self._node_of_slot[d], js) & self._slot_alive[d]
        self._slot_alive[d] &= ~gone
        self._draining[d] += int(gone.sum())
        self._purge_retired()
        # leases holding a retired slot: revoke with notice
        n = st.nleases
        live = np.flatnonzero(((st.state[:n] == ACTIVE) | (st.state[:n] == REVOKING))
                              & (st.dim[:n] == d))
        hit = [st.lease_id(l) for l in live.tolist()
               if gone[st.arena[int(st.slot_off[l]):int(st.slot_off[l]) + int(st.units[l])]].any()]
        for lid in hit:
            r = lid & ROW_MASK
            if int(st.state[r]) == REVOKING and int(st.revoke_at[r]) <= t + g:
                continue
            if int(st.state[r]) == ACTIVE:
                st.rev[d] += int(st.units[r])
                if not st.firm[r]:
                    st.oppa[d] -= int(st.units[r])
                st.state[r] = REVOKING
            self._opp_active[d].discard(lid)
            self._revoking[d].add(lid)
            st.revoke_at[r] = t + g
            self._emit("preempt_notice", t, int(st.camp[r]), lid=lid, deadline=t + g,
                       reason=CAPACITY)
            self._push(t + g, _EV_REVOKE, lid)
        self.pool.capacity[self.dims[d]] = int(st.cap[d])
        gone_names = {names[j] for j in js}
        self.pool.slot_map[self.dims[d]] = [(nm, k) for nm, k in self.pool.slot_map[self.dims[d]]
                                            if nm not in gone_names]
        self._journal_nodes("remove_nodes", t, d, {"dim": self.dims[d], "nodes": list(nodes),
                                                   "grace": g})
        if g == 0:
            self._advance(t)  # revocations due now run now
        return hit

    def _purge_retired(self) -> None:
        """Drop retired slots (of removed nodes) from the free stacks; the pool shrinks
        by each one as it comes free."""
        st = self.st
        for d in range(st.D):
            if not self._draining[d]:
                continue
            top = int(st.top[d])
            ids = st.free_slots[d, :top]
            keep = self._slot_alive[d][ids]
            r = int((~keep).sum())
            if r:
                kept = ids[keep].copy()
                st.free_slots[d, : kept.shape[0]] = kept
                st.top[d] = kept.shape[0]
                st.cap[d] -= r
                self._draining[d] -= r
                self.pool.capacity[self.dims[d]] = int(st.cap[d])

    def _dim_arg(self, dim: str) -> int:
        d = self._dim_index.get(dim) if isinstance(dim, str) else None
        if d is None:
            raise InvalidArgument("dim", f"must be one of {self.dims}", dim)
        return d

    def _journal_nodes(self, op: str, t: int, d: int, payload: dict[str, Any]) -> None:
        if self.journal is None:
            return
        row = {}
        row["op"], row["t"], row["dim"], row["outcome"] = J.OP[op], t, d, 4
        row["units"] = int(self.st.cap[d])
        self.journal.add(row, json.dumps(payload, sort_keys=True))

    # ------------------------------------------------------------------ journal (§9)
    def sync(self) -> int:
        """Make every journaled decision durable; returns the highest durable seq (-1
        without a journal). A decision is acknowledged once its ``seq`` ≤ this."""
        return self.journal.flush() if self.journal is not None else -1

    def explain(self, record: int | dict[str, Any]) -> str:
        """Why a decision came out as it did, in one paragraph.

        The paragraph is built from the record's rule inputs (SPEC §9), so it explains the
        decision as it was taken, not the state now.

        Parameters
        ----------
        record : int or dict
            A journal seq (``Decision.seq``), or a record itself.

        Returns
        -------
        str
            The explanation.

        Raises
        ------
        InvalidArgument
            ``record`` is a seq and the broker has no journal.
        """
        if self.journal is None and not isinstance(record, dict):
            raise InvalidArgument("record", "needs a journal: Broker(..., journal=...)", record)
        rec = dict(self.journal.record(record)  # type: ignore[union-attr]  # (checked above)
                   if not isinstance(record, dict) else record)
        if 0 <= rec.get("dim", -1) < len(self.dims):
            rec.setdefault("dim_name", self.dims[rec["dim"]])
        if 0 <= rec.get("cls", -1) < len(self.classes):
            rec.setdefault("class_name", self.classes[rec["cls"]].name)
        if 0 <= rec.get("campaign", -1) < len(self._names):
            rec.setdefault("campaign_name", self._names[rec["campaign"]])
        return _explain(rec)

    @classmethod
    def replay(cls, journal: Journal, *, backend: str | None = None, clock: Any = None,
               resume: bool = True) -> "Broker":
        """Rebuild a broker from its journal (SPEC §9, invariant 8).

        Every input record is re-executed at its recorded time; the records the rebuilt
        broker writes must equal the journal's, field for field, or
        :class:`~bursarcore.errors.JournalCorrupt` names the first that differs. With
        ``resume`` the broker goes on appending to ``journal``.
        """
        if cls is Broker and _wants_reference(backend):
            from .reference.broker import ReferenceBroker
            return ReferenceBroker.replay(journal, clock=clock, resume=resume)  # type: ignore[return-value]
        return _replay(cls, journal, _replay_one, backend=backend, clock=clock, resume=resume,
                       attach=_attach_journal)

    # ------------------------------------------------------------------ introspection
    @_op
    def state(self) -> dict[str, Any]:
        """A JSON-serialisable picture of the broker: pool, campaigns, leases, pending."""
        t = self._now()
        self._advance(t)
        st, k = self.st, self._k
        deficit = self._deficit_array(t, commit=False)
        pool = {}
        for d, dn in enumerate(self.dims):
            pool[dn] = {"capacity": int(st.cap[d]), "occupied": int(st.occ[d]),
                        "free": int(k.free_now(st, d)), "firm": int(st.F[d]),
                        "unmet_guarantees": int(st.U[d]), "reclaimable": int(st.oppa[d]),
                        "revoking": int(st.rev[d]), "promised": int(st.prom[d]),
                        "congestion": k.congestion_ppm(st, d) / PPM,
                        "warm_headroom": int(st.headroom[d])}
        camps: dict[str, dict[str, Any]] = {}
        for c, name in enumerate(self._names):
            for d in range(len(self.dims)):
                k.settle(st, c, d, t)
            left = int(st.left[c])
            camps[name] = {
                "credits_left": None if left >= MAXV else left / CREDIT,
                "credits_escrowed": int(st.escrow[c]) / CREDIT,
                "credits_spent": int(st.spent[c]) / CREDIT,
                "credits_refunded": int(st.refunded[c]) / CREDIT,
                "deficit": float(deficit[c]),
                "held": {dn: int(st.H[c, d]) for d, dn in enumerate(self.dims)},
                "firm_held": {dn: int(st.Hf[c, d]) for d, dn in enumerate(self.dims)},
                "tokens": {dn: (None if int(st.Bcap[c, d]) >= MAXV else int(st.T[c, d]) / NS)
                           for d, dn in enumerate(self.dims)},
                "tokens_refilled": {dn: (None if int(st.Bcap[c, d]) >= MAXV
                                         else int(st.tok_minted[c, d]) / NS)
                                    for d, dn in enumerate(self.dims)},
                "envelope": self.envelopes[name].to_dict(),
            }
            for key in ("credits", "envelope"):
                env = camps[name]["envelope"]
                if key == "envelope":
                    for f in ("credits",):
                        if isinstance(env[f], float) and math.isinf(env[f]):
                            env[f] = None
                    env["burst"] = {dd: (None if isinstance(v, float) and math.isinf(v) else v)
                                    for dd, v in env["burst"].items()}
        return {"time": t / NS, "backend": self.backend, "pool": pool, "campaigns": camps,
                "leases": [l.to_dict() for l in self.leases()], "pending": self.pending()}


def _register_reference() -> None:
    from .reference.broker import ReferenceBroker
    abc.ABCMeta.register(Broker, ReferenceBroker)   # the same API: isinstance(b, Broker) holds for both


_register_reference()


def _attach_journal(b: Broker, journal: Journal) -> None:
    b.journal = journal


def _replay_one(b: Broker, op: int, r: np.ndarray, payload: str | None, t: int) -> None:
    """Re-execute one input record of a journal at its time t (see :meth:`Broker.replay`)."""
    if op == J.OP["register"]:
        b.register(*envelope_of(payload))
    elif op == J.OP["acquire"]:
        b._advance(t)
        deadline = J.deadline_of(int(r["deadline"]))
        b._acquire_ns(int(r["campaign"]), int(r["dim"]), int(r["cls"]), int(r["nmin"]),
                      int(r["nmax"]), int(r["dur"]), int(r["max_spend"]), deadline,
                      int(r["ttl"]), t, None, batch=int(r["batch"]))
    elif op == J.OP["release"]:
        b.release(int(r["lease"]))
    elif op == J.OP["renew"]:
        lid = b._lease_id(int(r["lease"]))
        b._advance(t)
        row = b._row(lid)
        b._journaled(op, lid, b._lease_info(row), t, int(r["dur"]), int(r["max_spend"]),
                     b._renew(lid, row, int(r["dur"]), int(r["max_spend"]), t))
    elif op == J.OP["cancel"]:
        b.cancel(int(r["intent"]))
    elif op == J.OP["advance"]:
        b._advance(t)
    elif op == J.OP["consume"]:
        b._advance(t)
        b._consume_ns(int(r["campaign"]), int(r["dim"]) - len(b.dims), int(r["nmax"]), t)
    elif op == J.OP["add_nodes"]:
        b.add_nodes(**nodes_of(payload))
    elif op == J.OP["remove_nodes"]:
        b.remove_nodes(**nodes_of(payload))
    else:
        raise ValueError(f"op {J.OPS[op]} cannot be replayed by this broker")
