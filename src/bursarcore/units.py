"""Conversion between the float API edge and the integer kernels (SPEC §2).

Inside every kernel, time is int64 **nanoseconds** and amounts (tokens, units, credits) are
int64 **fixed point** with :data:`SCALE` steps per unit; rates are fixed-point units per
second. Conversion happens once, here, with round-half-even on the IEEE product
(``x * 1e9`` / ``x * 1e6``) — the compiled kernels use ``llrint`` on the same product, so
every backend sees the same integers.

Magnitudes are bounded by :data:`MAX_FIXED` and :data:`MAX_NS` (2**62) so that sums of two
values and the 128-bit products inside the kernels cannot overflow.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np
import numpy.typing as npt

from .batchprep import minmax
from .errors import InvalidArgument

__all__ = [
    "NS",
    "SCALE",
    "MAX_NS",
    "MAX_FIXED",
    "to_ns",
    "to_fixed",
    "ns_array",
    "fixed_array",
    "index_array",
    "from_ns",
    "from_fixed",
    "MAX_UNITS",
    "MAX_SECONDS",
    "MAX_DURATION",
    "MIN_DURATION",
    "MAX_TTL",
    "MAX_CREDITS",
    "MAX_BURST",
    "MAX_AMOUNT",
    "MAX_PRICE",
    "MAX_MULTIPLIER",
    "real",
    "whole",
]

NS = 1_000_000_000
"""Nanoseconds per second."""
SCALE = 1_000_000
"""Fixed-point steps per unit (micro-units)."""
MAX_NS = 1 << 62
MAX_FIXED = 1 << 62
_MAX_SECONDS = MAX_NS / NS
_MAX_UNITS = MAX_FIXED / SCALE

# The representable range of every input (SPEC §2). A value outside it is refused where it
# crosses the edge, naming the field, before anything changes; inside it no balance can
# overflow the engine's int64 fixed point, in any backend. The HTTP schema uses the same
# bounds.
MAX_UNITS = 1 << 24
"""Held units of one dimension (16,777,216): a pool's capacity, an envelope's guaranteed,
sustained and ceiling, an intent's min and max, a node's slots. The slot map holds one
int64 per unit, so this also bounds a pool's memory."""
MAX_SECONDS = _MAX_SECONDS
"""The largest magnitude of a time (``now``, a deadline): 2**62 ns, about 146 years."""
MAX_DURATION = 10 * 365 * 86400
"""The longest lease or renewal, in seconds (ten years)."""
MIN_DURATION = 1e-6
"""The shortest lease or renewal, in seconds (one microsecond)."""
MAX_TTL = 86_400.0
"""The longest wait in the pending queue, in seconds (one day)."""
MAX_CREDITS = 1e12
"""The largest budget, ``max_spend`` or lease cost, in credits: micro-credits in int64 with
room for a campaign's escrow and refunds."""
MAX_BURST = (MAX_FIXED // 2) / NS
"""The largest finite held-dimension bucket, in unit-seconds (about 2.3e9); ``inf`` is no
bound."""
MAX_AMOUNT = _MAX_UNITS
"""The largest flow amount or rate, in units (2**62 micro-units, about 4.6e12)."""
MAX_PRICE = 1e3
"""The largest unit price: credits per unit-hour (held) or per unit (flow)."""
MAX_MULTIPLIER = 100.0
"""The largest class or congestion multiplier. With MAX_PRICE, MAX_UNITS and MAX_DURATION
the exact cost product n·duration·price stays inside 128 bits."""


def real(value: object, field: str, *, lo: float = 0.0, hi: float = math.inf,
         allow_inf: bool = False, what: str = "a number") -> float:
    """A real number in ``[lo, hi]`` (or ``inf`` with ``allow_inf``) as a plain float.

    The one check every numeric input goes through: Python and numpy numbers alike
    (``np.int64(10)`` is 10.0), never a boolean, NaN, or an int too large for a float.

    Parameters
    ----------
    value
        The number to check.
    field
        The input's name, for the error (``"credits"``, ``"units[gpu]"``).
    lo, hi
        The range, inclusive.
    allow_inf
        Accept ``inf`` as well (an unlimited budget or bucket).
    what
        What the value must be, for the error of a value that is not a number.

    Returns
    -------
    float
        ``value`` as a plain float; ``-0.0`` is 0.0.

    Raises
    ------
    InvalidArgument
        Naming ``field`` and the rule, for a value outside the range or not a number.
    """
    if type(value) is float and lo <= value <= hi and math.isfinite(value):  # common case
        return value + 0.0
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise InvalidArgument(field, f"must be {what}", value)
    try:
        x = float(value)
    except OverflowError:       # an int (or Fraction) beyond any float
        raise InvalidArgument(field, _range_rule(lo, hi, allow_inf), value) from None
    if math.isnan(x):
        raise InvalidArgument(field, "must not be NaN", value)
    if math.isinf(x) and allow_inf and x > 0:
        return x
    if not lo <= x <= hi:
        raise InvalidArgument(field, _range_rule(lo, hi, allow_inf), value)
    return x + 0.0              # -0.0 -> 0.0


def whole(value: object, field: str, *, lo: int = 0, hi: int = MAX_UNITS) -> int:
    """A whole number of held units in ``[lo, hi]`` as a plain int.

    Parameters
    ----------
    value
        ``3``, ``3.0`` and ``np.int32(3)`` alike.
    field
        The input's name, for the error.
    lo, hi
        The range, inclusive (by default 0 to :data:`MAX_UNITS`).

    Returns
    -------
    int

    Raises
    ------
    InvalidArgument
        Naming ``field`` and the rule, for a fraction, a value outside the range or a value
        that is not a number.
    """
    if type(value) is int and lo <= value <= hi:     # the common case, without the ABCs
        return value
    if isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_)):
        k = int(value)
        if not lo <= k <= hi:
            raise InvalidArgument(field, _range_rule(lo, hi, False, " units"), value)
        return k
    x = real(value, field, lo=lo, hi=hi, what="a whole number of units")
    if x != math.floor(x):
        raise InvalidArgument(field, "must be a whole number of units (held dimension)", value)
    return int(x)


def _range_rule(lo: float, hi: float, allow_inf: bool, unit: str = "") -> str:
    def fmt(v: float) -> str:
        return f"{int(v):,}" if v == int(v) and abs(v) < 1e15 else f"{v:.6g}"
    inf = " or inf" if allow_inf else ""
    if hi == math.inf:
        return f"must be >= {fmt(lo)}{unit}{inf}"
    return f"must be in [{fmt(lo)}, {fmt(hi)}]{unit}{inf}"


def to_ns(seconds: float, field: str = "now", *, allow_negative: bool = True) -> int:
    """Float seconds to int nanoseconds, or :class:`InvalidArgument` naming ``field``."""
    if type(seconds) is not float and (not isinstance(seconds, numbers.Real)
                                       or isinstance(seconds, (bool, np.bool_))):
        raise InvalidArgument(field, "must be a real number of seconds", seconds)
    try:
        x = float(seconds)
    except OverflowError:  # an int (or Fraction) too large for a float
        raise InvalidArgument(field, f"must be within +/-{_MAX_SECONDS:.6g} s", seconds) from None
    if not math.isfinite(x):
        raise InvalidArgument(field, "must be finite", seconds)
    if x < 0 and not allow_negative:
        raise InvalidArgument(field, "must be >= 0", seconds)
    if abs(x) > _MAX_SECONDS:
        raise InvalidArgument(field, f"must be within +/-{_MAX_SECONDS:.6g} s", seconds)
    return int(round(x * NS))


def to_fixed(amount: float, field: str = "amount") -> int:
    """Non-negative float units to fixed point, or :class:`InvalidArgument`."""
    if type(amount) is not float and (not isinstance(amount, numbers.Real)
                                      or isinstance(amount, (bool, np.bool_))):
        raise InvalidArgument(field, "must be a real number", amount)
    try:
        x = float(amount)
    except OverflowError:
        raise InvalidArgument(field, "must be >= 0" if amount < 0 else
                              f"must be <= {_MAX_UNITS:.6g}", amount) from None
    if not math.isfinite(x):
        raise InvalidArgument(field, "must be finite", amount)
    if x < 0:
        raise InvalidArgument(field, "must be >= 0", amount)
    if x > _MAX_UNITS:
        raise InvalidArgument(field, f"must be <= {_MAX_UNITS:.6g}", amount)
    return int(round(x * SCALE))


def column(values: Any, field: str) -> np.ndarray:
    """``np.asarray(values)``, or :class:`InvalidArgument` for what is not an array of
    numbers (ragged lists, mixed objects)."""
    try:
        return np.asarray(values)
    except (ValueError, TypeError, OverflowError):
        raise InvalidArgument(field, "must be an array of numbers", values) from None


def _float_array(values: Any, field: str,
                 n: int | None) -> tuple[npt.NDArray[np.float64], float, float]:
    """A float64 column of finite values, and its least and greatest (0.0 if empty)."""
    a = column(values, field)
    if a.dtype.kind not in "fiu":
        raise InvalidArgument(field, "must be numbers (not booleans)" if a.dtype.kind == "b"
                              else "must be numeric", _show(values))
    a = a.astype(np.float64, copy=False)
    if n is not None:
        if a.ndim == 0:
            a = np.broadcast_to(a, (n,))
        elif a.shape != (n,):
            raise InvalidArgument(field, f"must be a scalar or have shape ({n},)", a.shape)
    elif a.ndim != 1:
        raise InvalidArgument(field, "must be one-dimensional", a.shape)
    if not a.size:
        return a, 0.0, 0.0
    # min and max (NaN propagates through both) check every rule in two passes; the masks
    # run only to name the first bad item
    lo, hi = float(a.min()), float(a.max())
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise InvalidArgument(field, "must be finite", _first(a, ~np.isfinite(a)))
    return a, lo, hi


def _show(values: Any) -> object:
    """What a message shows of a bad column: the value itself when small."""
    a = np.asarray(values, dtype=object) if not isinstance(values, np.ndarray) else values
    return values if a.size <= 8 else f"<{a.size} values of {a.dtype}>"


def _first(a: np.ndarray, bad: np.ndarray) -> object:
    k = int(np.flatnonzero(bad)[0])
    return f"{a[k]!r} at position {k}"


def ns_array(values: Any, field: str = "now", n: int | None = None) -> npt.NDArray[np.int64]:
    """Float seconds (scalar broadcast to ``n`` or 1-D array) to an int64 ns array."""
    a, lo, hi = _float_array(values, field, n)
    if max(-lo, hi) > _MAX_SECONDS:
        raise InvalidArgument(field, f"must be within +/-{_MAX_SECONDS:.6g} s",
                              _first(a, np.abs(a) > _MAX_SECONDS))
    return np.rint(a * NS).astype(np.int64)


def fixed_array(values: Any, field: str = "amounts",
                n: int | None = None) -> npt.NDArray[np.int64]:
    """Non-negative float units (scalar or 1-D) to an int64 fixed-point array."""
    a, lo, hi = _float_array(values, field, n)
    if lo < 0:
        raise InvalidArgument(field, "must be >= 0", _first(a, a < 0))
    if hi > _MAX_UNITS:
        raise InvalidArgument(field, f"must be <= {_MAX_UNITS:.6g}", _first(a, a > _MAX_UNITS))
    return np.rint(a * SCALE).astype(np.int64)


def index_array(values: Any, size: int, field: str = "idx") -> np.ndarray:
    """Integer indices in ``[0, size)`` as a contiguous int64 array."""
    a = values if type(values) is np.ndarray else column(values, field)
    if a.ndim != 1:
        raise InvalidArgument(field, "must be one-dimensional", a.shape)
    if a.size == 0:
        return np.zeros(0, np.int64)
    if a.dtype.kind not in "iu":
        raise InvalidArgument(field, "must be integers", a.dtype)
    if a.dtype == np.int64 and a.flags.c_contiguous:
        lo, hi = minmax(a)                  # one pass (a column is often out of cache)
    else:
        lo, hi = int(a.min()), int(a.max())
    if lo < 0 or hi >= size:
        bad = lo if lo < 0 else hi
        raise InvalidArgument(field, f"index out of range [0, {size})", bad)
    return np.ascontiguousarray(a, dtype=np.int64)


def from_ns(ns: int) -> float:
    return ns / NS


def from_fixed(fp: int) -> float:
    return fp / SCALE


def dim_column(dims: Any, index: dict[str, int], n: int) -> np.ndarray:
    """A batch's flow-dimension column: names (each one of ``index``'s) or indices, a
    scalar for the whole batch or one per item of the n; as int64 indices."""
    d = column(dims, "dims")
    if d.dtype.kind in "US":
        bad = [x for x in np.unique(d) if x not in index]
        if bad:
            raise InvalidArgument("dims", f"must be flow dimensions, one of {list(index)}", bad[0])
        d = np.array([index[x] for x in d.reshape(-1)], np.int64).reshape(d.shape)
    if d.ndim == 0:
        d = np.full(n, int(d), np.int64)
    di = index_array(d, len(index), "dims")
    if di.shape[0] != n:
        raise InvalidArgument("dims", f"must be a scalar or have shape ({n},)", d.shape)
    return di
