"""cffi binding of the C core's token-bucket table. Private: import
:mod:`bursarcore.buckets` instead (``BURSARCORE_BACKEND=cffi`` selects this one).

The same core as the Cython binding (``bursarcore.h``), called through cffi's compiled
API module ``bursarcore._cffi_core``: plain Python around it, so it runs wherever cffi
does (PyPy included). Python numbers are converted at the edge by :mod:`bursarcore.units`.

cffi releases the GIL around every call into C, and a table may not be used by two threads
at once (docs/c-api.md): each table's calls are serialised by its own lock, so an append
that grows the table (and moves its rows) never runs beside a batch.
"""

from __future__ import annotations

import math
import threading
from typing import Any

import numpy as np

from . import _validate, units
from ._cffi_core import ffi, lib
from ._corestatus import status_error, time_error, watermark_error
from .reference.buckets import _validate_state, initial

__all__ = ["TokenBuckets"]

_OK = lib.BC_OK
_EINDEX = lib.BC_EINDEX
_ETIME = lib.BC_ETIME
_NEVER = lib.BC_NEVER
_EXACT_INT = 1 << 53


def _plain(a: Any, dtype: type) -> bool:
    """A 1-D, C-contiguous, aligned, native-order array of ``dtype``."""
    return (type(a) is np.ndarray and a.ndim == 1 and a.dtype == dtype
            and a.flags.c_contiguous and a.flags.aligned and a.dtype.isnative)


def _ptr(a: np.ndarray, ctype: str = "int64_t *") -> Any:
    return ffi.cast(ctype, a.ctypes.data) if a.shape[0] else ffi.NULL


class TokenBuckets:
    """N token buckets in the C core's table; see :class:`bursarcore.buckets.TokenBuckets`."""

    backend = "cffi"

    def __init__(self, capacity: Any, rate: Any, tokens: Any = None, now: float = 0.0) -> None:
        cap, rat, tok, t0 = initial(capacity, rate, tokens, now)
        n = cap.shape[0]
        self._open(n, t0)
        c, r, k = (np.ascontiguousarray(x, dtype=np.int64) for x in (cap, rat, tok))
        st = self._call(lib.bc_buckets_extend, _ptr(c), _ptr(r), _ptr(k), n, t0, ffi.NULL)
        if st != _OK:
            raise status_error(st, "capacity")

    def _open(self, n: int, t0: int) -> None:
        out = ffi.new("bc_buckets **")
        st = lib.bc_buckets_new(max(n, 16), t0, out)
        if st != _OK:
            raise status_error(st, "now", t0 / units.NS)
        self._h = ffi.gc(out[0], lib.bc_buckets_free)
        self._lock = threading.Lock()

    def _call(self, f: Any, *args: Any) -> int:
        with self._lock:
            return f(self._h, *args)

    # -- the edge ------------------------------------------------------------------------
    def _index(self, i: Any) -> int:
        return _validate.index(i, lib.bc_buckets_len(self._h))

    def _check(self, st: int, k: int, t: int) -> None:
        if st == _OK:
            return
        if st == _ETIME:
            s = ffi.new("bc_bucket_state *")
            self._call(lib.bc_buckets_get, k, s)
            raise time_error(s.last, t)
        raise status_error(st, "i", k)

    def _column(self, which: int) -> np.ndarray:
        with self._lock:        # the length and the copy from one moment
            out = np.empty(lib.bc_buckets_len(self._h), dtype=np.int64)
            cols = [ffi.NULL] * 5
            cols[which] = _ptr(out)
            lib.bc_buckets_columns(self._h, *cols, out.shape[0])
        return out

    def _wm(self) -> int:
        return lib.bc_buckets_watermark(self._h)

    # -- the contract ----------------------------------------------------------------------
    def __len__(self) -> int:
        return lib.bc_buckets_len(self._h)

    @property
    def capacity(self) -> np.ndarray:
        return self._column(0) / units.SCALE

    @property
    def rate(self) -> np.ndarray:
        return self._column(1) / units.SCALE

    def try_debit(self, i: Any, amount: Any, now: Any) -> bool:
        t = units.to_ns(now)
        a = units.to_fixed(amount, "amount")
        k = self._index(i)
        granted = ffi.new("int *")
        self._check(self._call(lib.bc_buckets_try_debit, k, a, t, granted), k, t)
        return bool(granted[0])

    def try_debit_batch(self, idx: Any, amounts: Any, now: Any) -> np.ndarray:
        out = self._batch_fast(idx, amounts, now)
        if out is not None:
            return out
        ix = np.ascontiguousarray(units.index_array(idx, len(self)), dtype=np.int64)
        n = ix.shape[0]
        amt = np.ascontiguousarray(units.fixed_array(amounts, "amounts", n), dtype=np.int64)
        ts = np.ascontiguousarray(units.ns_array(now, "now", n), dtype=np.int64)
        return self._debit(ix, amt, ts)

    def _batch_fast(self, idx: Any, amounts: Any, now: Any) -> np.ndarray | None:
        """The common call (an int64 index array, floats or float64 arrays) handed to the
        core as it is, which converts and checks it; None for anything else or anything
        the core refuses (having changed nothing): the general path then decides."""
        if not (_plain(idx, np.int64) and idx.shape[0]):
            return None
        n = idx.shape[0]
        cols = []
        for x in (amounts, now):
            if isinstance(x, float):
                cols.append((ffi.new("double *", x), 1))
            elif _plain(x, np.float64) and x.shape[0] == n:
                cols.append((ffi.cast("double *", x.ctypes.data), n))
            else:
                return None
        out = np.empty(n, dtype=np.bool_)
        st = self._call(lib.bc_buckets_try_debit_batch_f64, _ptr(idx), n, *cols[0], *cols[1],
                        _ptr(out, "uint8_t *"), ffi.NULL)
        return out if st == _OK else None

    def _debit(self, ix: np.ndarray, amt: np.ndarray, ts: np.ndarray) -> np.ndarray:
        n = ix.shape[0]
        out = np.empty(n, dtype=np.bool_)
        if n == 0:
            return out
        st = self._call(lib.bc_buckets_try_debit_batch, _ptr(ix), n, _ptr(amt), amt.shape[0],
                        _ptr(ts), ts.shape[0], _ptr(out, "uint8_t *"), ffi.NULL)
        if st == _ETIME:        # the position and the bucket, in the library's words
            _validate.batch_times(ix, ts, self._column(4), self._wm())
        if st != _OK:
            raise status_error(st, "idx" if st == _EINDEX else "now" if st == _ETIME
                               else "amounts")
        return out

    def debit_fixed(self, idx: Any, amounts: Any, now_ns: Any) -> np.ndarray:
        """Batch debit on already-converted integers; see the Cython binding's."""
        ix, am, ts = (np.ascontiguousarray(x, dtype=np.int64) for x in (idx, amounts, now_ns))
        n = ix.shape[0]
        if am.shape[0] != n or (ts.shape[0] != n and ts.shape[0] != 1):
            raise status_error(lib.BC_EINVAL, "amounts", n)
        return self._debit(ix, am, ts)

    def refund(self, i: Any, amount: Any, now: Any) -> float:
        t = units.to_ns(now)
        a = units.to_fixed(amount, "amount")
        k = self._index(i)
        credited = ffi.new("int64_t *")
        self._check(self._call(lib.bc_buckets_refund, k, a, t, credited), k, t)
        return credited[0] / units.SCALE

    def tokens(self, now: Any) -> np.ndarray:
        t = units.to_ns(now)
        if t < self._wm():
            raise watermark_error(self._wm(), now)
        with self._lock:
            out = np.empty(lib.bc_buckets_len(self._h), dtype=np.int64)
            lib.bc_buckets_peek(self._h, t, _ptr(out), out.shape[0])
        return out / units.SCALE

    def set_rate(self, i: Any, rate: Any, now: Any) -> None:
        t = units.to_ns(now)
        r = units.to_fixed(rate, "rate")
        k = self._index(i)
        self._check(self._call(lib.bc_buckets_set_rate, k, r, t), k, t)

    def time_until(self, i: Any, amount: Any, now: Any) -> float:
        t = units.to_ns(now)
        a = units.to_fixed(amount, "amount")
        k = self._index(i)
        wait = ffi.new("int64_t *")
        self._check(self._call(lib.bc_buckets_time_until, k, a, t, wait), k, t)
        q = wait[0]
        return math.inf if q == _NEVER else q / units.NS

    def append(self, capacity: Any, rate: Any, tokens: Any = None, now: Any = None) -> int:
        c = units.to_fixed(capacity, "capacity")
        r = units.to_fixed(rate, "rate")
        tk = c if tokens is None else units.to_fixed(tokens, "tokens")
        if tk > c:
            raise status_error(lib.BC_ETOKENS, "tokens", tokens)
        t = None if now is None else units.to_ns(now)
        index = ffi.new("size_t *")
        with self._lock:        # the watermark and the append from one moment
            wm = lib.bc_buckets_watermark(self._h)
            if t is None:
                t = wm
            if t < wm:
                raise watermark_error(wm, now)
            st = lib.bc_buckets_append(self._h, c, r, tk, t, index)
        if st != _OK:
            raise status_error(st, "capacity")
        return index[0]

    @property
    def state(self) -> dict:
        return {"capacity": self._column(0), "rate": self._column(1),
                "tokens": self._column(2), "remainder": self._column(3),
                "last": self._column(4), "watermark": int(self._wm())}

    @classmethod
    def from_state(cls, state: dict) -> "TokenBuckets":
        cap, rate, tok, rem, last = _validate_state(state)
        self = cls.__new__(cls)
        self._open(cap.shape[0], int(state["watermark"]))
        s = ffi.new("bc_bucket_state *")
        for row in zip(cap.tolist(), rate.tolist(), tok.tolist(), rem.tolist(), last.tolist()):
            s.capacity, s.rate, s.tokens, s.remainder, s.last = row
            st = self._call(lib.bc_buckets_push, s)
            if st != _OK:
                raise status_error(st, "state")
        return self

    def __reduce__(self) -> tuple:
        return (type(self).from_state, (self.state,))
