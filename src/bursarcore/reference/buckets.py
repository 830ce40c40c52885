"""Reference token buckets (the specification of :mod:`bursarcore._buckets`).

A bucket has a capacity C, a refill rate r, tokens T and a last-update time. Time is int
nanoseconds and amounts are int fixed point (:mod:`bursarcore.units`); the public methods
take float seconds and float units and convert once.

Refill is exact: the sub-step remainder of ``r * dt`` is kept (``rem``, in fixed-point
nanoseconds), so settling a bucket at t1 and then t2 gives the same tokens as settling it
at t2 alone. A full bucket holds no remainder.
"""

from __future__ import annotations

import math
import operator
from typing import Any

import numpy as np

from .. import _validate, units
from ..errors import InvalidArgument, TimeWentBackwards
from ..units import NS, SCALE

__all__ = ["TokenBuckets", "refill", "initial", "MAX_WAIT"]

#: the longest wait ``time_until`` reports, in ns (146 years); a longer one is ``inf``,
#: as for a wait no time ends
MAX_WAIT = 1 << 62


def refill(tokens: int, rem: int, capacity: int, rate: int, dt: int) -> tuple[int, int]:
    """Tokens and remainder after ``dt`` ns of refill at ``rate`` (fixed point per second)."""
    if tokens >= capacity:
        return capacity, 0
    if dt <= 0 or rate == 0:
        return tokens, rem
    gained = rate * dt + rem
    room = (capacity - tokens) * NS
    if gained >= room:
        return capacity, 0
    return tokens + gained // NS, gained % NS


def initial(capacity: Any, rate: Any, tokens: Any, now: Any) -> tuple[np.ndarray, np.ndarray,
                                                                      np.ndarray, int]:
    """A new table's arguments at the edge, checked and converted (every backend's
    constructor): capacities, rates and tokens as int64 fixed point (tokens default to
    full, never above the capacity) and ``now`` in ns."""
    cap = units.fixed_array(np.atleast_1d(capacity), "capacity")
    n = cap.shape[0]
    rat = units.fixed_array(rate, "rate", n)
    tok = cap.copy() if tokens is None else units.fixed_array(tokens, "tokens", n)
    if (tok > cap).any():
        raise InvalidArgument("tokens", "must be <= capacity", units.from_fixed(int(tok.max())))
    return cap, rat, tok, units.to_ns(now)


class TokenBuckets:
    """N token buckets; see :class:`bursarcore.buckets.TokenBuckets` for the contract."""

    backend = "reference"

    def __init__(self, capacity: Any, rate: Any, tokens: Any = None, now: float = 0.0) -> None:
        cap, rat, tok, t0 = initial(capacity, rate, tokens, now)
        n = cap.shape[0]
        self._cap = [int(x) for x in cap]
        self._rate = [int(x) for x in rat]
        self._tok = [int(x) for x in tok]
        self._rem = [0] * n
        self._last = [t0] * n
        self._wm = t0

    # -- checks ------------------------------------------------------------------------
    def _at(self, i: Any, t: int) -> int:
        """Index ``i``, checked, for an operation at ``t`` ns (after ``now`` was converted)."""
        k = _validate.index(i, len(self._cap))
        if t < self._last[k]:
            raise TimeWentBackwards("now", f"must be >= the bucket's last update "
                                    f"{self._last[k] / NS!r}", t / NS)
        return k

    def _all_at(self, now: float) -> int:
        t = units.to_ns(now)
        if t < self._wm:
            raise TimeWentBackwards("now", f"must be >= the last update {self._wm / NS!r}", now)
        return t

    # -- kernel --------------------------------------------------------------------------
    def _settle(self, k: int, t: int) -> None:
        if t > self._last[k]:
            self._tok[k], self._rem[k] = refill(self._tok[k], self._rem[k], self._cap[k],
                                                self._rate[k], t - self._last[k])
            self._last[k] = t
            if t > self._wm:
                self._wm = t

    def _debit(self, k: int, amount: int, t: int) -> bool:
        self._settle(k, t)
        if self._tok[k] >= amount:
            self._tok[k] -= amount
            return True
        return False

    # -- public --------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._cap)

    @property
    def capacity(self) -> np.ndarray:
        return np.array(self._cap, dtype=np.int64) / SCALE

    @property
    def rate(self) -> np.ndarray:
        return np.array(self._rate, dtype=np.int64) / SCALE

    def try_debit(self, i: int, amount: float, now: float) -> bool:
        t = units.to_ns(now)
        a = units.to_fixed(amount)
        return self._debit(self._at(i, t), a, t)

    def try_debit_batch(self, idx: Any, amounts: Any, now: Any) -> np.ndarray:
        ix = units.index_array(idx, len(self._cap))
        n = ix.shape[0]
        amt = units.fixed_array(amounts, "amounts", n)
        ts = units.ns_array(now, "now", n)
        _validate.batch_times(ix, ts, np.array(self._last, dtype=np.int64), self._wm)
        return self.debit_fixed(ix, amt, ts)

    def debit_fixed(self, idx: np.ndarray, amounts: np.ndarray, now_ns: np.ndarray) -> np.ndarray:
        """Batch debit on converted, validated integers (``now_ns`` of length 1 or n)."""
        n = len(idx)
        if len(amounts) != n or len(now_ns) not in (n, 1):
            raise InvalidArgument("amounts", "lengths of idx, amounts and now must agree", n)
        out = np.zeros(n, dtype=bool)
        for j in range(n):
            t = int(now_ns[j if len(now_ns) == n else 0])
            out[j] = self._debit(int(idx[j]), int(amounts[j]), t)
        return out

    def refund(self, i: int, amount: float, now: float) -> float:
        t = units.to_ns(now)
        a = units.to_fixed(amount)
        k = self._at(i, t)
        self._settle(k, t)
        credited = min(a, self._cap[k] - self._tok[k])
        self._tok[k] += credited
        if self._tok[k] == self._cap[k]:
            self._rem[k] = 0
        return credited / SCALE

    def tokens(self, now: float) -> np.ndarray:
        t = self._all_at(now)
        out = [refill(self._tok[k], self._rem[k], self._cap[k], self._rate[k], t - self._last[k])[0]
               for k in range(len(self._cap))]
        return np.array(out, dtype=np.int64) / SCALE

    def set_rate(self, i: int, rate: float, now: float) -> None:
        t = units.to_ns(now)
        r = units.to_fixed(rate, "rate")
        k = self._at(i, t)
        self._settle(k, t)
        self._rate[k] = r

    def time_until(self, i: int, amount: float, now: float) -> float:
        t = units.to_ns(now)
        a = units.to_fixed(amount)
        k = self._at(i, t)
        tok, rem = refill(self._tok[k], self._rem[k], self._cap[k], self._rate[k], t - self._last[k])
        if a <= tok:
            return 0.0
        if a > self._cap[k] or self._rate[k] == 0:
            return math.inf
        wait = -(-((a - tok) * NS - rem) // self._rate[k])
        return math.inf if wait > MAX_WAIT else wait / NS

    def append(self, capacity: float, rate: float, tokens: float | None = None,
               now: float | None = None) -> int:
        c = units.to_fixed(capacity, "capacity")
        r = units.to_fixed(rate, "rate")
        tk = c if tokens is None else units.to_fixed(tokens, "tokens")
        if tk > c:
            raise InvalidArgument("tokens", "must be <= capacity", tokens)
        t = self._wm if now is None else units.to_ns(now)
        if t < self._wm:
            raise TimeWentBackwards("now", f"must be >= the last update {self._wm / NS!r}", now)
        self._cap.append(c)
        self._rate.append(r)
        self._tok.append(tk)
        self._rem.append(0)
        self._last.append(t)
        self._wm = max(self._wm, t)
        return len(self._cap) - 1

    # -- state ---------------------------------------------------------------------------
    @property
    def state(self) -> dict:
        """Integer state, identical in layout for every backend (see :data:`STATE_FIELDS`)."""
        return {
            "capacity": np.array(self._cap, dtype=np.int64),
            "rate": np.array(self._rate, dtype=np.int64),
            "tokens": np.array(self._tok, dtype=np.int64),
            "remainder": np.array(self._rem, dtype=np.int64),
            "last": np.array(self._last, dtype=np.int64),
            "watermark": int(self._wm),
        }

    @classmethod
    def from_state(cls, state: dict) -> "TokenBuckets":
        self = cls.__new__(cls)
        arrays = _validate_state(state)
        self._cap, self._rate, self._tok, self._rem, self._last = (
            [int(x) for x in a] for a in arrays)
        self._wm = operator.index(state["watermark"])
        return self

    def __reduce__(self):
        return (type(self).from_state, (self.state,))


STATE_FIELDS = ("capacity", "rate", "tokens", "remainder", "last")


def _validate_state(state: dict) -> list[np.ndarray]:
    """Check a ``state`` dict before it becomes buckets; shared by every backend."""
    if not isinstance(state, dict):
        raise InvalidArgument("state", "must be a dict", type(state).__name__)
    arrays = []
    for name in STATE_FIELDS + ("watermark",):
        if name not in state:
            raise InvalidArgument(f"state.{name}", "is required")
    for name in STATE_FIELDS:
        a = np.asarray(state[name])
        if a.ndim != 1 or a.dtype.kind not in "iu":
            raise InvalidArgument(f"state.{name}", "must be a 1-D integer array", a.dtype)
        if a.dtype.kind == "u" and a.size and int(a.max()) > units.MAX_FIXED:
            # checked before the cast, which would wrap it to a negative int64
            raise InvalidArgument(f"state.{name}", "is out of range", int(a.max()))
        arrays.append(a.astype(np.int64))
    n = arrays[0].shape[0]
    if any(a.shape[0] != n for a in arrays):
        raise InvalidArgument("state", "arrays must have equal length")
    try:
        wm = operator.index(state["watermark"])
    except TypeError:
        raise InvalidArgument("state.watermark", "must be an integer",
                              type(state["watermark"]).__name__) from None
    if not -units.MAX_NS <= wm <= units.MAX_NS:
        raise InvalidArgument("state.watermark", "must be in [-MAX_NS, MAX_NS]", wm)
    cap, rate, tok, rem, last = arrays
    if (cap < 0).any() or (cap > units.MAX_FIXED).any():
        raise InvalidArgument("state.capacity", "must be in [0, MAX_FIXED]")
    if (rate < 0).any() or (rate > units.MAX_FIXED).any():
        raise InvalidArgument("state.rate", "must be in [0, MAX_FIXED]")
    if (tok < 0).any() or (tok > cap).any():
        raise InvalidArgument("state.tokens", "must be in [0, capacity]")
    if (rem < 0).any() or (rem >= NS).any():
        raise InvalidArgument("state.remainder", "must be in [0, 1e9)")
    if (rem[tok == cap] != 0).any():
        raise InvalidArgument("state.remainder", "must be 0 for a full bucket")
    if (last < -units.MAX_NS).any() or (last > units.MAX_NS).any():
        raise InvalidArgument("state.last", "must be in [-MAX_NS, MAX_NS]")
    if n and int(last.max()) > wm:
        raise InvalidArgument("state.watermark", "must be >= every last update")
    return arrays
