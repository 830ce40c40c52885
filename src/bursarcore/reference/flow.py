"""Reference flow-dimension engine (SPEC §5): the specification of :mod:`bursarcore._flow`.

A flow dimension is a rate (filesystem GB/s, inference tokens/s). Consumption is throttled
at source, as HTB/TBF do: ``consume(c, d, amount, now)`` returns how much passes now and,
for the rest, when to retry. Every unit passes a path of token buckets:

* the campaign's **guaranteed** bucket G (rate g, size g·window) serves first and needs
  nothing else — so a campaign within its guarantee is never throttled (SPEC §11.9);
* the rest needs, all at once, the campaign's **sustained** bucket S (rate s, size B), its
  **peak** bucket P (rate b, size b·window) and the dimension's shared **facility** bucket
  F (rate capacity − Σg, size (capacity − Σg)·window). The part allowed is the least any
  of the three holds, and all three are debited by it.

Units served by G are *also charged* to S and P, as far as they hold tokens (never below
zero, never blocking): HTB likewise charges a class's ceil for the traffic it sends under
its assured rate. With that, g ≤ s ≤ b are rates of the campaign's whole flow (SPEC §3):
over any interval of length T a campaign passes at most max(g·window, B) + s·T and at most
b·window + b·T (max(G, S) and max(G, P) each fall by exactly what a call allows and rise
by at most s·dt, resp. b·dt). G's units are not charged to F: F is only the unreserved
capacity, so over any interval the facility passes at most capacity·T + Σ bucket sizes.

Everything here is integers (SPEC §2): time in ns, amounts in fixed point
(:data:`bursarcore.units.SCALE` steps per unit), rates in fixed-point units per second,
refill by :func:`bursarcore.reference.buckets.refill` (exact, with remainder), so every
backend decides identically. Floats appear only at the public methods' edge, converted
once by :mod:`bursarcore.units` (results: ``float(fixed) / SCALE`` and ``float(ns) / 1e9``,
the same IEEE operations numpy performs on arrays).

``retry_after``, for a call that was not allowed in full, is the smallest wait (whole ns)
after which one call for the rest would be allowed in full if nothing else consumed
meanwhile — or, when the rest is more than the path can ever pass in one call, for as
much as it can (the most that one call could get once the buckets have refilled). It is
``inf`` when nothing more could ever pass (no access: every rate on the path is 0) or not
within :data:`MAX_WAIT` ns (146 years).

The compiled module imports the validation helpers below, so both backends refuse exactly
the same inputs with the same field names.
"""

from __future__ import annotations

import math
import numbers
import operator
from typing import Any, Mapping

import numpy as np

from .. import _validate, units
from ..errors import InvalidArgument, TimeWentBackwards
from ..units import NS, SCALE
from .buckets import refill

__all__ = ["FlowEngine", "CAMPAIGN_FIELDS", "FACILITY_FIELDS", "BOUND_NAMES", "NEVER",
           "MAX_WAIT"]

# Columns of state["campaigns"] (shape (campaigns, dims, 13)): three buckets of four
# integers each and the time all three were last settled (they are always settled together).
CAMPAIGN_FIELDS = ("g_size", "g_rate", "g_tokens", "g_remainder",
                   "s_size", "s_rate", "s_tokens", "s_remainder",
                   "p_size", "p_rate", "p_tokens", "p_remainder", "last")
# Columns of state["facility"] (shape (dims, 5)).
FACILITY_FIELDS = ("size", "rate", "tokens", "remainder", "last")

G, S, P = 0, 4, 8                 # offset of each campaign bucket within a row
SIZE, RATE, TOK, REM = 0, 1, 2, 3  # fields within a bucket (facility rows use them too)
LAST = 12                          # campaign rows
F_LAST = 4                         # facility rows

BOUND_NAMES = ("none", "sustained", "peak", "facility")
"""``bound`` codes of :meth:`FlowEngine.consume_fixed`: which bucket held the rest back."""
NEVER = (1 << 63) - 1
"""``retry_ns`` of :meth:`FlowEngine.consume_fixed` meaning "never" (``inf`` seconds)."""
MAX_WAIT = 1 << 62
"""The longest ``retry_after`` reported, in ns (about 146 years); longer is ``inf``."""


# -- validation, shared with the compiled backend --------------------------------------------

def _dims_capacity(capacity: Any) -> tuple[tuple[str, ...], list[int]]:
    if not isinstance(capacity, Mapping) or not capacity:
        raise InvalidArgument("capacity", "must be a non-empty mapping of flow dimension -> "
                              "units per second", capacity)
    dims, caps = [], []
    for d, v in capacity.items():
        if not isinstance(d, str) or not d:
            raise InvalidArgument("capacity", "dimension names must be non-empty strings", d)
        dims.append(d)
        caps.append(units.to_fixed(v, f"capacity[{d}]"))
    return tuple(dims), caps


def _window_ns(window: Any) -> int:
    w = units.to_ns(window, "window", allow_negative=False)
    if w <= 0:
        raise InvalidArgument("window", "must be > 0 seconds", window)
    return w


def _size(rate: int, window_ns: int, field: str) -> int:
    """A bucket that holds ``window`` seconds of ``rate``: floor(rate · window)."""
    size = rate * window_ns // NS
    if size > units.MAX_FIXED:
        raise InvalidArgument(field, "times window must be <= 2**62 fixed-point units", size)
    return size


def check_engine(capacity: Any, window: Any) -> tuple[tuple[str, ...], list[int], int]:
    """``(dims, capacity per dim in fixed point per second, window in ns)``, or raise."""
    dims, caps = _dims_capacity(capacity)
    w = _window_ns(window)
    for d, c in zip(dims, caps):
        _size(c, w, f"capacity[{d}]")
    return dims, caps, w


def _per_dim(m: Any, field: str, dims: tuple[str, ...]) -> dict:
    if m is None:
        return {}
    if not isinstance(m, Mapping):
        raise InvalidArgument(field, "must be a mapping of flow dimension -> value", m)
    for d in m:
        if d not in dims:
            raise InvalidArgument(f"{field}[{d}]", f"names no flow dimension (have {list(dims)})",
                                  d)
    return dict(m)


def _burst(v: Any, field: str) -> int:
    if isinstance(v, numbers.Real) and not isinstance(v, bool) and v == math.inf:
        return units.MAX_FIXED  # no bound: the sustained bucket can hold 2**62 fixed units
    return units.to_fixed(v, field)


def check_campaign(dims: tuple[str, ...], caps: list[int], gsum: list[int], window_ns: int,
                   guaranteed: Any, sustained: Any, ceiling: Any,
                   burst: Any) -> list[tuple[int, int, int, int]]:
    """Per dimension ``(g, s, b, B)`` in fixed point, or raise naming the field (SPEC §3).

    A dimension not named anywhere gets 0 everywhere (no access above nothing); within a
    dimension, sustained defaults to guaranteed, ceiling to sustained and burst to 0 — the
    defaults of :class:`bursarcore.Envelope`.
    """
    gm = _per_dim(guaranteed, "guaranteed", dims)
    sm = _per_dim(sustained, "sustained", dims)
    bm = _per_dim(ceiling, "ceiling", dims)
    Bm = _per_dim(burst, "burst", dims)
    out = []
    for k, d in enumerate(dims):
        g = units.to_fixed(gm[d], f"guaranteed[{d}]") if d in gm else 0
        s = units.to_fixed(sm[d], f"sustained[{d}]") if d in sm else g
        b = units.to_fixed(bm[d], f"ceiling[{d}]") if d in bm else s
        B = _burst(Bm[d], f"burst[{d}]") if d in Bm else 0
        if g > s:
            raise InvalidArgument(f"sustained[{d}]", f"must be >= guaranteed ({g / SCALE})",
                                  s / SCALE)
        if s > b:
            raise InvalidArgument(f"ceiling[{d}]", f"must be >= sustained ({s / SCALE})",
                                  b / SCALE)
        if gsum[k] + g > caps[k]:
            raise InvalidArgument(f"guaranteed[{d}]",
                                  f"would overbook the facility: guarantees would sum to "
                                  f"{(gsum[k] + g) / SCALE} > capacity {caps[k] / SCALE}",
                                  g / SCALE)
        _size(g, window_ns, f"guaranteed[{d}]")
        _size(b, window_ns, f"ceiling[{d}]")
        out.append((g, s, b, B))
    return out


def check_time(t: int, watermark: int, now: Any) -> None:
    if t < watermark:
        raise TimeWentBackwards("now", f"must be >= the last update {watermark / NS!r}", now)


def resolve_dim(d: Any, index: Mapping[str, int], ndims: int, field: str = "dim") -> int:
    if isinstance(d, str):
        k = index.get(d)
        if k is None:
            raise InvalidArgument(field, f"names no flow dimension (have {list(index)})", d)
        return k
    return _validate.index(d, ndims, field)


def check_batch(campaigns: Any, dims: Any, amounts: Any, now: Any, ncamp: int,
                index: Mapping[str, int], watermark: int,
                fixed: np.ndarray | None = None) -> tuple[np.ndarray, ...]:
    """Contiguous int64 ``(campaigns, dims, amounts, now_ns)``; ``dims``/``now_ns`` may have
    length 1 (one value for every request). Raises before anything changes. ``fixed``: the
    amounts, already checked and converted by the caller (the compiled fast path)."""
    ci = units.index_array(campaigns, ncamp, "campaigns")
    n = ci.shape[0]
    if isinstance(dims, str) or np.ndim(dims) == 0:
        di = np.array([resolve_dim(dims, index, len(index), "dims")], dtype=np.int64)
    else:
        di = units.index_array(dims, len(index), "dims")
        if di.shape[0] != n:
            raise InvalidArgument("dims", f"must be a scalar or have shape ({n},)", di.shape)
    if fixed is not None and fixed.shape == (n,):
        amt = fixed
    else:  # also raises for a wrongly shaped array the caller converted
        amt = np.ascontiguousarray(units.fixed_array(amounts, "amounts", n))
    if np.ndim(now) == 0:
        ts = np.array([units.to_ns(now)], dtype=np.int64)
    else:
        ts = np.ascontiguousarray(units.ns_array(now, "now", n))
    if ts.shape[0]:
        if ts.shape[0] > 1 and not bool((ts[1:] >= ts[:-1]).all()):
            k = int(np.flatnonzero(ts[1:] < ts[:-1])[0]) + 1
            raise TimeWentBackwards("now", "must be non-decreasing",
                                    f"{ts[k] / NS!r} at position {k}")
        check_time(int(ts[0]), watermark, float(ts[0]) / NS)
    return ci, di, amt, ts


def check_state(state: Any) -> tuple[tuple[str, ...], int, int, np.ndarray, np.ndarray,
                                     np.ndarray]:
    """``(dims, window_ns, watermark, capacity, facility, campaigns)`` from a ``state``
    dict, checked against every invariant the engine keeps; shared by every backend."""
    if not isinstance(state, dict):
        raise InvalidArgument("state", "must be a dict", type(state).__name__)
    for key in ("dims", "window", "watermark", "capacity", "facility", "campaigns"):
        if key not in state:
            raise InvalidArgument(f"state.{key}", "is required")
    dims = tuple(state["dims"])
    if not dims or len(set(dims)) != len(dims) or not all(isinstance(d, str) and d
                                                          for d in dims):
        raise InvalidArgument("state.dims", "must be distinct non-empty names", dims)
    nd = len(dims)

    def integer(key: str) -> int:
        try:
            return operator.index(state[key])
        except TypeError:
            raise InvalidArgument(f"state.{key}", "must be an integer",
                                  type(state[key]).__name__) from None

    def array(key: str, shape: tuple) -> np.ndarray:
        a = np.asarray(state[key])
        if a.dtype.kind not in "iu" or a.ndim != len(shape) or any(
                want is not None and got != want for got, want in zip(a.shape, shape)):
            raise InvalidArgument(f"state.{key}", f"must be an integer array of shape {shape}",
                                  (a.dtype.str, a.shape))
        if a.dtype.kind == "u" and a.size and int(a.max()) > units.MAX_FIXED:
            raise InvalidArgument(f"state.{key}", "is out of range", int(a.max()))
        return a.astype(np.int64)

    window, wm = integer("window"), integer("watermark")
    if not 0 < window <= units.MAX_NS:
        raise InvalidArgument("state.window", "must be in (0, MAX_NS]", window)
    if not -units.MAX_NS <= wm <= units.MAX_NS:
        raise InvalidArgument("state.watermark", "must be in [-MAX_NS, MAX_NS]", wm)
    cap = array("capacity", (nd,))
    fac = array("facility", (nd, len(FACILITY_FIELDS)))
    camp = array("campaigns", (None, nd, len(CAMPAIGN_FIELDS)))
    if ((cap < 0) | (cap > units.MAX_FIXED)).any():
        raise InvalidArgument("state.capacity", "must be in [0, MAX_FIXED]")

    def size_of(rate: np.ndarray) -> np.ndarray:  # floor(rate * window / NS) without overflow
        return np.array([int(r) * window // NS for r in rate.ravel()],
                        dtype=object).reshape(rate.shape)

    gsum = camp[:, :, G + RATE].sum(axis=0, dtype=object) if camp.shape[0] else \
        np.zeros(nd, dtype=object)
    if (gsum > cap.astype(object)).any():
        raise InvalidArgument("state.campaigns", "guarantees overbook the capacity")
    buckets = [("facility", fac, 0)] + [(f"campaigns.{x}", camp, off)
                                       for x, off in (("guaranteed", G), ("sustained", S),
                                                      ("peak", P))]
    for name, arr, off in buckets:
        size, rate, tok, rem = (arr[..., off + j] for j in (SIZE, RATE, TOK, REM))
        if ((rate < 0) | (rate > units.MAX_FIXED) | (size < 0) | (size > units.MAX_FIXED)).any():
            raise InvalidArgument(f"state.{name}", "rate and size must be in [0, MAX_FIXED]")
        if ((tok < 0) | (tok > size)).any():
            raise InvalidArgument(f"state.{name}", "tokens must be in [0, size]")
        if ((rem < 0) | (rem >= NS)).any() or (rem[tok == size] != 0).any():
            raise InvalidArgument(f"state.{name}", "remainder must be in [0, 1e9), 0 when full")
    if (fac[:, RATE].astype(object) != cap.astype(object) - gsum).any():
        raise InvalidArgument("state.facility", "rate must be capacity - sum of guarantees")
    if (fac[:, SIZE].astype(object) != size_of(fac[:, RATE])).any():
        raise InvalidArgument("state.facility", "size must be rate * window")
    if camp.shape[0]:
        g, s, b = camp[..., G + RATE], camp[..., S + RATE], camp[..., P + RATE]
        if ((g > s) | (s > b)).any():
            raise InvalidArgument("state.campaigns", "rates must keep g <= s <= b")
        if ((camp[..., G + SIZE].astype(object) != size_of(g)).any()
                or (camp[..., P + SIZE].astype(object) != size_of(b)).any()):
            raise InvalidArgument("state.campaigns", "guaranteed and peak sizes must be "
                                  "rate * window")
    last = np.concatenate([fac[:, F_LAST], camp[..., LAST].ravel()])
    if ((last < -units.MAX_NS) | (last > wm)).any():
        raise InvalidArgument("state", "last updates must be in [-MAX_NS, watermark]")
    return dims, window, wm, cap, fac, camp


# -- the engine ----------------------------------------------------------------------------

def _settle(row: list, off: int, dt: int) -> None:
    row[off + TOK], row[off + REM] = refill(row[off + TOK], row[off + REM], row[off + SIZE],
                                            row[off + RATE], dt)


def _level(row: list, off: int, dt: int) -> int:
    """Tokens the bucket at ``off`` would hold ``dt`` ns from its last settlement."""
    return refill(row[off + TOK], row[off + REM], row[off + SIZE], row[off + RATE], dt)[0]


def _limit(row: list, off: int) -> int:
    """Tokens the bucket holds once it has refilled (for ever if its rate is 0)."""
    return row[off + SIZE] if row[off + RATE] > 0 else row[off + TOK]


def passes(row: list, fac: list, amount: int, dt: int) -> bool:
    """Would one call for ``amount`` be allowed in full ``dt`` ns after both rows were
    settled, if nothing consumed meanwhile? (G alone; or S and P hold all of it — they are
    charged for all of it — and F the part G cannot give.)"""
    g = _level(row, G, dt)
    return g >= amount or (_level(row, S, dt) >= amount and _level(row, P, dt) >= amount
                           and g + _level(fac, 0, dt) >= amount)


def most(row: list, fac: list) -> int:
    """The most one call could ever be allowed, once every bucket has refilled."""
    g = _limit(row, G)
    return max(g, min(_limit(row, S), _limit(row, P), g + _limit(fac, 0)))


def wait(row: list, fac: list, amount: int) -> int:
    """Smallest ``dt`` in [0, MAX_WAIT] with ``passes(row, fac, amount, dt)``, else NEVER
    (``passes`` is monotone in ``dt``: every bucket only fills)."""
    if not passes(row, fac, amount, MAX_WAIT):
        return NEVER
    lo, hi = 0, MAX_WAIT
    while lo < hi:
        mid = (lo + hi) // 2
        if passes(row, fac, amount, mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


class FlowEngine:
    """Flow dimensions of every campaign; see :mod:`bursarcore.flow` for the contract."""

    backend = "reference"

    def __init__(self, capacity: Mapping[str, float], window: float = 1.0,
                 now: float = 0.0) -> None:
        dims, caps, w = check_engine(capacity, window)
        t0 = units.to_ns(now)
        self._dims = dims
        self._index = {d: k for k, d in enumerate(dims)}
        self._window = w
        self._cap = caps
        self._gsum = [0] * len(dims)
        self._fac = [[_size(c, w, ""), c, _size(c, w, ""), 0, t0] for c in caps]  # full
        self._rows: list[list[list[int]]] = []  # [campaign][dim] -> CAMPAIGN_FIELDS
        self._wm = t0

    # -- public surface ------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._rows)

    @property
    def dims(self) -> tuple[str, ...]:
        return self._dims

    @property
    def window(self) -> float:
        return self._window / NS

    @property
    def capacity(self) -> np.ndarray:
        return np.array(self._cap, dtype=np.int64) / SCALE

    @property
    def guaranteed_sum(self) -> np.ndarray:
        return np.array(self._gsum, dtype=np.int64) / SCALE

    def dim_index(self, name: str) -> int:
        return resolve_dim(name, self._index, len(self._dims))

    def add_campaign(self, guaranteed: Mapping[str, float] | None = None,
                     sustained: Mapping[str, float] | None = None,
                     ceiling: Mapping[str, float] | None = None,
                     burst: Mapping[str, float] | None = None,
                     now: float | None = None) -> int:
        spec = check_campaign(self._dims, self._cap, self._gsum, self._window, guaranteed,
                              sustained, ceiling, burst)
        t = self._wm if now is None else units.to_ns(now)
        check_time(t, self._wm, now)
        self._wm = t
        row_per_dim = []
        for k, (g, s, b, B) in enumerate(spec):
            fac = self._fac[k]
            # the facility keeps what it earned at the old rate, then shrinks to the new one
            _settle(fac, 0, t - fac[F_LAST])
            fac[F_LAST] = t
            self._gsum[k] += g
            fac[RATE] = self._cap[k] - self._gsum[k]
            fac[SIZE] = _size(fac[RATE], self._window, "")
            if fac[TOK] >= fac[SIZE]:
                fac[TOK], fac[REM] = fac[SIZE], 0
            gs, ps = _size(g, self._window, ""), _size(b, self._window, "")
            row_per_dim.append([gs, g, gs, 0, B, s, B, 0, ps, b, ps, 0, t])  # all full
        self._rows.append(row_per_dim)
        return len(self._rows) - 1

    def consume(self, campaign: int, dim: int | str, amount: float,
                now: float) -> tuple[float, float]:
        c = _validate.index(campaign, len(self._rows), "campaign")
        d = resolve_dim(dim, self._index, len(self._dims))
        a = units.to_fixed(amount)
        t = units.to_ns(now)
        check_time(t, self._wm, now)
        allowed, retry, _ = self._consume(c, d, a, t)
        return float(allowed) / SCALE, math.inf if retry == NEVER else float(retry) / NS

    def consume_batch(self, campaigns: Any, dims: Any, amounts: Any,
                      now: Any) -> tuple[np.ndarray, np.ndarray]:
        ci, di, amt, ts = check_batch(campaigns, dims, amounts, now, len(self._rows),
                                      self._index, self._wm)
        allowed, retry, _ = self.consume_fixed(ci, di, amt, ts)
        seconds = retry.astype(np.float64) / NS
        seconds[retry == NEVER] = math.inf
        return allowed / SCALE, seconds

    def consume_fixed(self, campaigns: np.ndarray, dims: np.ndarray, amounts: np.ndarray,
                      now_ns: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Sequential batch on converted, validated integers: ``(allowed, retry_ns, bound)``.

        ``dims`` and ``now_ns`` have length 1 (one for all) or ``len(campaigns)``. Only
        lengths are checked: out-of-range indices or times going backwards are undefined.
        ``retry_ns`` is :data:`NEVER` for never; ``bound`` indexes :data:`BOUND_NAMES`.
        """
        n = len(campaigns)
        if len(amounts) != n or len(dims) not in (1, n) or len(now_ns) not in (1, n):
            raise InvalidArgument("amounts", "lengths of campaigns, dims, amounts and now "
                                  "must agree", n)
        allowed = np.zeros(n, dtype=np.int64)
        retry = np.zeros(n, dtype=np.int64)
        bound = np.zeros(n, dtype=np.uint8)
        for j in range(n):
            d = int(dims[j if len(dims) == n else 0])
            t = int(now_ns[j if len(now_ns) == n else 0])
            allowed[j], retry[j], bound[j] = self._consume(int(campaigns[j]), d,
                                                           int(amounts[j]), t)
        return allowed, retry, bound

    def tokens(self, now: float) -> dict[str, np.ndarray]:
        """Tokens of every bucket at ``now`` (a peek, nothing changes): ``guaranteed``,
        ``sustained`` and ``peak`` of shape (campaigns, dims), ``facility`` of shape (dims,)."""
        t = units.to_ns(now)
        check_time(t, self._wm, now)
        nd = len(self._dims)
        out = {name: np.array([[_level(r, off, t - r[LAST]) for r in rows]
                               for rows in self._rows], dtype=np.int64).reshape(-1, nd) / SCALE
               for name, off in (("guaranteed", G), ("sustained", S), ("peak", P))}
        out["facility"] = np.array([_level(f, 0, t - f[F_LAST]) for f in self._fac],
                                   dtype=np.int64) / SCALE
        return out

    # -- the decision (integers) ---------------------------------------------------------------
    def _consume(self, c: int, d: int, a: int, t: int) -> tuple[int, int, int]:
        """``(allowed, retry_ns, bound)`` for ``a`` fixed-point units at ``t`` ns (SPEC §5)."""
        row, fac = self._rows[c][d], self._fac[d]
        if t > row[LAST]:
            for off in (G, S, P):
                _settle(row, off, t - row[LAST])
            row[LAST] = t
        if t > fac[F_LAST]:
            _settle(fac, 0, t - fac[F_LAST])
            fac[F_LAST] = t
        self._wm = max(self._wm, t)

        # 1. the guaranteed bucket serves first and needs nothing else; what it serves is
        #    charged to the sustained and peak buckets too, as far as they hold tokens
        x = min(a, row[G + TOK])
        row[G + TOK] -= x
        row[S + TOK] -= min(x, row[S + TOK])
        row[P + TOK] -= min(x, row[P + TOK])
        # 2. the rest needs the sustained, peak and facility buckets at once
        y = min(a - x, row[S + TOK], row[P + TOK], fac[TOK])
        row[S + TOK] -= y
        row[P + TOK] -= y
        fac[TOK] -= y
        allowed = x + y
        if allowed == a:
            return allowed, 0, 0
        # held back: the first of S, P, F that ran dry; then when to retry
        bound = 1 if row[S + TOK] == 0 else 2 if row[P + TOK] == 0 else 3
        target = min(a - allowed, most(row, fac))
        return allowed, (NEVER if target == 0 else wait(row, fac, target)), bound

    # -- state ---------------------------------------------------------------------------------
    @property
    def state(self) -> dict:
        """Integer state, the same layout in every backend (:data:`CAMPAIGN_FIELDS`,
        :data:`FACILITY_FIELDS`)."""
        nd = len(self._dims)
        return {
            "dims": self._dims,
            "window": self._window,
            "watermark": self._wm,
            "capacity": np.array(self._cap, dtype=np.int64),
            "facility": np.array(self._fac, dtype=np.int64).reshape(nd, len(FACILITY_FIELDS)),
            "campaigns": np.array(self._rows, dtype=np.int64).reshape(
                len(self._rows), nd, len(CAMPAIGN_FIELDS)),
        }

    @classmethod
    def from_state(cls, state: dict) -> "FlowEngine":
        dims, window, wm, cap, fac, camp = check_state(state)
        self = cls.__new__(cls)
        self._dims = dims
        self._index = {d: k for k, d in enumerate(dims)}
        self._window = window
        self._wm = wm
        self._cap = [int(x) for x in cap]
        self._fac = [[int(x) for x in f] for f in fac]
        self._rows = [[[int(x) for x in r] for r in rows] for rows in camp]
        self._gsum = [int(x) for x in camp[:, :, G + RATE].sum(axis=0, dtype=object)] \
            if len(camp) else [0] * len(dims)
        return self

    def __reduce__(self):
        return (type(self).from_state, (self.state,))
