# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Compiled token buckets. Private: import :mod:`bursarcore.buckets` instead.

Same contract, same integers as :mod:`bursarcore.reference.buckets` (the specification).
Layout: array-of-structs, one 64-byte row per bucket (capacity, rate, tokens, remainder,
last update, 3 spare), so a random access touches one cache line (see benchmarks/RESULTS.md
for the measurement against struct-of-arrays).
"""

import math

import numpy as np
cimport numpy as cnp
from libc.math cimport isfinite, llrint, fabs
from libc.stdint cimport int64_t, uint64_t

from . import _validate, units
from .errors import InvalidArgument, TimeWentBackwards
from .reference.buckets import _validate_state

cnp.import_array()

cdef extern from *:
    ctypedef long long i128 "__int128"

cdef extern from *:
    """
    #if defined(__GNUC__) || defined(__clang__)
    #define BURSAR_PREFETCH_W(p) __builtin_prefetch((p), 1, 3)
    #else
    #define BURSAR_PREFETCH_W(p) ((void)(p))
    #endif
    """
    void prefetch_w "BURSAR_PREFETCH_W"(const void* p) noexcept nogil

DEF W = 8            # int64 fields per row
DEF CAP = 0
DEF RATE = 1
DEF TOK = 2
DEF REM = 3
DEF LAST = 4
DEF AHEAD = 16       # batch kernel: rows prefetched this many requests ahead

cdef int64_t NS = 1000000000
cdef double NS_D = 1e9
cdef double SCALE_D = 1e6
cdef double MAX_SECONDS = <double>(1 << 62) / 1e9
cdef double MAX_UNITS = <double>(1 << 62) / 1e6
cdef int64_t I64_MAX = 0x7FFFFFFFFFFFFFFF
cdef int64_t EXACT_INT = 1LL << 53    # largest range of ints a double holds exactly; up to
                                      # here int / int in C equals Python's true division


cdef inline int64_t _ns(object now) except? -1:
    """Seconds to ns: floats inline, anything else through units.to_ns (the same rule)."""
    if type(now) is not float:
        return units.to_ns(now)
    cdef double x = <double>now
    if not isfinite(x):
        raise InvalidArgument("now", "must be finite", x)
    if fabs(x) > MAX_SECONDS:
        raise InvalidArgument("now", f"must be within +/-{MAX_SECONDS:.6g} s", x)
    return llrint(x * NS_D)


cdef inline int64_t _fixed(object amount, str field) except? -1:
    if type(amount) is not float:
        return units.to_fixed(amount, field)
    cdef double x = <double>amount
    if not isfinite(x):
        raise InvalidArgument(field, "must be finite", x)
    if x < 0:
        raise InvalidArgument(field, "must be >= 0", x)
    if x > MAX_UNITS:
        raise InvalidArgument(field, f"must be <= {MAX_UNITS:.6g}", x)
    return llrint(x * SCALE_D)


cdef inline void _refill(int64_t* row, int64_t t) noexcept nogil:
    """Settle one bucket at ``t`` (t >= last). Exact, see reference.buckets.refill."""
    cdef int64_t tok, rate
    cdef i128 gained, room, dt
    if t <= row[LAST]:
        return
    # t and last both lie in [-2**62, 2**62], so t - last can reach 2**63: take it in 128 bits
    dt = <i128>t - <i128>row[LAST]
    row[LAST] = t
    tok = row[TOK]
    if tok >= row[CAP]:
        row[REM] = 0
        return
    rate = row[RATE]
    if rate == 0:
        return
    gained = <i128>rate * dt + row[REM]
    room = <i128>(row[CAP] - tok) * NS
    if gained >= room:
        row[TOK] = row[CAP]
        row[REM] = 0
    elif gained <= I64_MAX:
        row[TOK] = tok + (<int64_t>gained) // NS
        row[REM] = (<int64_t>gained) % NS
    else:
        row[TOK] = tok + <int64_t>(gained // NS)
        row[REM] = <int64_t>(gained % NS)


cdef inline int64_t _peek(const int64_t* row, int64_t t, int64_t* rem_out) noexcept nogil:
    cdef int64_t tmp[W]
    cdef int j
    for j in range(W):
        tmp[j] = row[j]
    _refill(tmp, t)
    if rem_out != NULL:
        rem_out[0] = tmp[REM]
    return tmp[TOK]


cdef int64_t _debit_kernel(int64_t* base, const int64_t* idx, const int64_t* amt,
                           const int64_t* ts, cnp.npy_bool* out, Py_ssize_t n,
                           bint scalar_t) noexcept nogil:
    """Sequential batch: request k sees requests < k. Returns the newest time used."""
    cdef Py_ssize_t k
    cdef int64_t* row
    cdef int64_t t = ts[0], a, newest = ts[0]
    for k in range(n):
        # Random rows of a table larger than the cache each cost a memory round trip; asking
        # for row k + AHEAD now overlaps those trips (2-4x at 1M buckets, see
        # benchmarks/RESULTS.md). A prefetch never faults, whatever the index.
        if k + AHEAD < n:
            prefetch_w(base + idx[k + AHEAD] * W)
        row = base + idx[k] * W
        if not scalar_t:
            t = ts[k]
        _refill(row, t)
        a = amt[k]
        if row[TOK] >= a:
            row[TOK] -= a
            out[k] = 1
        else:
            out[k] = 0
        if t > newest:
            newest = t
    return newest


cdef inline bint _fixed_ok(double x) noexcept nogil:
    return x >= 0 and x <= MAX_UNITS             # NaN fails both, inf the second


cdef inline bint _seconds_ok(double x) noexcept nogil:
    return fabs(x) <= MAX_SECONDS                # NaN and inf fail


cdef inline bint _plain(object a, int typenum, Py_ssize_t n):
    """``a`` is a 1-D, C-contiguous, aligned, native-order array of ``typenum`` and length n."""
    if type(a) is not np.ndarray:
        return False
    cdef cnp.ndarray arr = <cnp.ndarray>a
    return (cnp.PyArray_NDIM(arr) == 1 and cnp.PyArray_TYPE(arr) == typenum
            and cnp.PyArray_IS_C_CONTIGUOUS(arr) and cnp.PyArray_ISBEHAVED_RO(arr)
            and (n < 0 or cnp.PyArray_DIM(arr, 0) == n))


cdef class TokenBuckets:
    """N token buckets in one aligned int64 array; see :class:`bursarcore.buckets.TokenBuckets`."""

    cdef object _buf          # owner of the memory (over-allocated for 64-byte alignment)
    cdef int64_t[:, ::1] _s   # (allocated, W) view, aligned
    cdef Py_ssize_t _n
    cdef int64_t _wm

    backend = "compiled"

    def __init__(self, capacity, rate, tokens=None, now=0.0):
        cap = units.fixed_array(np.atleast_1d(capacity), "capacity")
        n = cap.shape[0]
        rat = units.fixed_array(rate, "rate", n)
        tok = cap.copy() if tokens is None else units.fixed_array(tokens, "tokens", n)
        if (tok > cap).any():
            raise InvalidArgument("tokens", "must be <= capacity", units.from_fixed(int(tok.max())))
        t0 = _ns(now)
        self._alloc(max(n, 16))
        self._n = n
        arr = np.asarray(self._s)
        arr[:n, CAP] = cap
        arr[:n, RATE] = rat
        arr[:n, TOK] = tok
        arr[:n, REM] = 0
        arr[:n, LAST] = t0
        self._wm = t0

    cdef _alloc(self, Py_ssize_t rows):
        buf = np.zeros(rows * W + W, dtype=np.int64)
        off = (-(buf.ctypes.data % 64) // 8) % W
        view = buf[off:off + rows * W].reshape(rows, W)
        if self._n:
            view[:self._n] = np.asarray(self._s)[:self._n]
        self._buf = buf
        self._s = view

    cdef inline int64_t* _row(self, Py_ssize_t k) noexcept nogil:
        return &self._s[0, 0] + k * W

    cdef inline Py_ssize_t _check(self, object index, int64_t t) except -1:
        cdef Py_ssize_t i
        if type(index) is int:
            try:
                i = index
            except OverflowError:
                i = -1
            if i < 0 or i >= self._n:
                raise InvalidArgument("i", f"index out of range [0, {self._n})", index)
        else:
            i = _validate.index(index, self._n)
        if t < self._row(i)[LAST]:
            raise TimeWentBackwards("now", f"must be >= the bucket's last update "
                                    f"{self._row(i)[LAST] / 1e9!r}", t / 1e9)
        return i

    cdef inline void _touch(self, int64_t t) noexcept nogil:
        if t > self._wm:
            self._wm = t

    def __len__(self):
        return self._n

    @property
    def capacity(self):
        return np.asarray(self._s)[:self._n, CAP] / units.SCALE

    @property
    def rate(self):
        return np.asarray(self._s)[:self._n, RATE] / units.SCALE

    def try_debit(self, i, amount, now):
        cdef int64_t t = _ns(now)
        cdef int64_t a = _fixed(amount, "amount")
        cdef Py_ssize_t k = self._check(i, t)
        cdef int64_t* row = self._row(k)
        _refill(row, t)
        self._touch(t)
        if row[TOK] >= a:
            row[TOK] -= a
            return True
        return False

    def try_debit_batch(self, idx, amounts, now):
        out = self._batch_fast(idx, amounts, now)
        if out is not None:
            return out
        ix = units.index_array(idx, self._n)
        cdef Py_ssize_t n = ix.shape[0]
        amt = units.fixed_array(amounts, "amounts", n)
        ts = units.ns_array(now, "now", n)
        if n and ts.strides[0] == 0:
            ts = np.ascontiguousarray(ts)
        _validate.batch_times(ix, ts, np.asarray(self._s)[:self._n, LAST], self._wm)
        return self.debit_fixed(ix, np.ascontiguousarray(amt), ts)

    cdef object _batch_fast(self, object idx, object amounts, object now):
        """try_debit_batch for the common, valid call in one pass per input, or None.

        Taken when ``idx`` is a plain int64 array, ``amounts`` a float or a plain float64
        array, ``now`` a float or a plain float64 array, and every value is valid with
        ``now`` at or after every bucket's last update (and sorted, if an array). Anything
        else returns None and the general path (units.*_array, _validate.batch_times), which
        is the one that raises, decides. Same integers: llrint of the same IEEE product that
        units.*_array rounds with np.rint.
        """
        cdef Py_ssize_t n, k
        cdef const int64_t* ix
        cdef const double* src
        cdef int64_t* dst
        cdef uint64_t size = <uint64_t>self._n
        cdef bint bad = False, scalar_t = True
        cdef double x
        cdef int64_t t1 = 0
        cdef int64_t prev
        if not _plain(idx, cnp.NPY_INT64, -1):
            return None
        n = cnp.PyArray_DIM(<cnp.ndarray>idx, 0)
        if n == 0:
            return None
        ix = <const int64_t*>cnp.PyArray_DATA(<cnp.ndarray>idx)
        with nogil:
            for k in range(n):
                bad |= <uint64_t>ix[k] >= size
        if bad:
            return None

        amt = np.empty(n, dtype=np.int64)
        dst = <int64_t*>cnp.PyArray_DATA(<cnp.ndarray>amt)
        if isinstance(amounts, float):
            x = <double>amounts
            if not _fixed_ok(x):
                return None
            t1 = llrint(x * SCALE_D)
            with nogil:
                for k in range(n):
                    dst[k] = t1
        elif _plain(amounts, cnp.NPY_FLOAT64, n):
            src = <const double*>cnp.PyArray_DATA(<cnp.ndarray>amounts)
            with nogil:
                for k in range(n):
                    x = src[k]
                    if not _fixed_ok(x):
                        bad = True
                        break
                    dst[k] = llrint(x * SCALE_D)
            if bad:
                return None
        else:
            return None

        if isinstance(now, float):
            x = <double>now
            if not _seconds_ok(x):
                return None
            t1 = llrint(x * NS_D)
            if t1 < self._wm:
                return None
            ts = np.empty(1, dtype=np.int64)
            (<int64_t*>cnp.PyArray_DATA(<cnp.ndarray>ts))[0] = t1
        elif _plain(now, cnp.NPY_FLOAT64, n):
            scalar_t = n == 1
            ts = np.empty(n, dtype=np.int64)
            src = <const double*>cnp.PyArray_DATA(<cnp.ndarray>now)
            dst = <int64_t*>cnp.PyArray_DATA(<cnp.ndarray>ts)
            prev = self._wm
            with nogil:
                for k in range(n):
                    x = src[k]
                    if not _seconds_ok(x):
                        bad = True
                        break
                    dst[k] = llrint(x * NS_D)
                    if dst[k] < prev:
                        bad = True
                        break
                    prev = dst[k]
            if bad:
                return None
        else:
            return None

        out = np.empty(n, dtype=np.bool_)
        cdef int64_t newest
        cdef const int64_t* ap = <const int64_t*>cnp.PyArray_DATA(<cnp.ndarray>amt)
        cdef const int64_t* tp = <const int64_t*>cnp.PyArray_DATA(<cnp.ndarray>ts)
        cdef cnp.npy_bool* op = <cnp.npy_bool*>cnp.PyArray_DATA(<cnp.ndarray>out)
        # the GIL stays held: another thread's append() may move the rows (see debit_fixed)
        newest = _debit_kernel(self._row(0), ix, ap, tp, op, n, scalar_t)
        self._touch(newest)
        return out

    def debit_fixed(self, const int64_t[::1] idx, const int64_t[::1] amounts,
                    const int64_t[::1] now_ns):
        """Batch debit on already-converted, already-validated integers.

        For callers that keep their own fixed-point arrays (the admission engine,
        benchmarks). ``now_ns`` has length 1 (one instant) or ``len(idx)``. No checks are
        made beyond lengths: out-of-range indices or backwards times are undefined.
        """
        cdef Py_ssize_t n = idx.shape[0]
        if amounts.shape[0] != n or (now_ns.shape[0] != n and now_ns.shape[0] != 1):
            raise InvalidArgument("amounts", "lengths of idx, amounts and now must agree", n)
        out = np.empty(n, dtype=np.bool_)
        if n == 0:
            return out
        cdef cnp.npy_bool[::1] o = out.view(np.uint8)
        cdef int64_t newest
        # The GIL stays held: released, another thread's append() could move the rows
        # (the kernel would write freed memory and the batch be lost) or interleave debits.
        newest = _debit_kernel(self._row(0), &idx[0], &amounts[0], &now_ns[0],
                               <cnp.npy_bool*>&o[0], n, now_ns.shape[0] == 1 and n != 1)
        self._touch(newest)
        return out

    def refund(self, i, amount, now):
        cdef int64_t t = _ns(now)
        cdef int64_t a = _fixed(amount, "amount")
        cdef Py_ssize_t k = self._check(i, t)
        cdef int64_t* row = self._row(k)
        _refill(row, t)
        self._touch(t)
        cdef int64_t credited = min(a, row[CAP] - row[TOK])
        row[TOK] += credited
        if row[TOK] == row[CAP]:
            row[REM] = 0
        if credited <= EXACT_INT:
            return <double>credited / 1e6
        return <object>credited / units.SCALE

    def tokens(self, now):
        cdef int64_t t = _ns(now)
        if t < self._wm:
            raise TimeWentBackwards("now", f"must be >= the last update {self._wm / 1e9!r}", now)
        out = np.empty(self._n, dtype=np.int64)
        cdef int64_t[::1] o = out
        cdef Py_ssize_t k
        for k in range(self._n):  # with the GIL held, as in debit_fixed
            o[k] = _peek(self._row(k), t, NULL)
        return out / units.SCALE

    def set_rate(self, i, rate, now):
        cdef int64_t t = _ns(now)
        cdef int64_t r = _fixed(rate, "rate")
        cdef Py_ssize_t k = self._check(i, t)
        _refill(self._row(k), t)
        self._touch(t)
        self._row(k)[RATE] = r

    def time_until(self, i, amount, now):
        cdef int64_t t = _ns(now)
        cdef int64_t a = _fixed(amount, "amount")
        cdef Py_ssize_t k = self._check(i, t)
        cdef int64_t* row = self._row(k)
        cdef int64_t rem
        cdef int64_t tok = _peek(row, t, &rem)
        cdef i128 need, q
        if a <= tok:
            return 0.0
        if a > row[CAP] or row[RATE] == 0:
            return math.inf
        need = <i128>(a - tok) * NS - rem
        q = (need + row[RATE] - 1) // row[RATE]
        if q <= EXACT_INT:
            return <double>q / 1e9
        # beyond 2**53 ns a C double cannot hold q: use Python ints, as the reference does
        return (-(-((<object>a - <object>tok) * NS - <object>rem) // <object>row[RATE])) / units.NS

    def append(self, capacity, rate, tokens=None, now=None):
        cdef int64_t c = _fixed(capacity, "capacity")
        cdef int64_t r = _fixed(rate, "rate")
        cdef int64_t tk = c if tokens is None else _fixed(tokens, "tokens")
        if tk > c:
            raise InvalidArgument("tokens", "must be <= capacity", tokens)
        cdef int64_t t = self._wm if now is None else _ns(now)
        if t < self._wm:
            raise TimeWentBackwards("now", f"must be >= the last update {self._wm / 1e9!r}", now)
        if self._n == self._s.shape[0]:
            self._alloc(2 * self._n)
        cdef int64_t* row = self._row(self._n)
        row[CAP] = c
        row[RATE] = r
        row[TOK] = tk
        row[REM] = 0
        row[LAST] = t
        self._n += 1
        self._touch(t)
        return self._n - 1

    @property
    def state(self):
        arr = np.asarray(self._s)[:self._n]
        return {
            "capacity": arr[:, CAP].copy(),
            "rate": arr[:, RATE].copy(),
            "tokens": arr[:, TOK].copy(),
            "remainder": arr[:, REM].copy(),
            "last": arr[:, LAST].copy(),
            "watermark": int(self._wm),
        }

    @classmethod
    def from_state(cls, state):
        cap, rate, tok, rem, last = _validate_state(state)
        cdef TokenBuckets self = cls.__new__(cls)
        n = cap.shape[0]
        self._n = 0
        self._alloc(max(n, 16))
        self._n = n
        arr = np.asarray(self._s)
        arr[:n, CAP] = cap
        arr[:n, RATE] = rate
        arr[:n, TOK] = tok
        arr[:n, REM] = rem
        arr[:n, LAST] = last
        self._wm = int(state["watermark"])
        return self

    def __reduce__(self):
        return (type(self).from_state, (self.state,))
