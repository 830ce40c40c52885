# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Cython binding of the C core's token-bucket table. Private: import
:mod:`bursarcore.buckets` instead.

Same contract, same integers as :mod:`bursarcore.reference.buckets` (the specification).
The arithmetic and every check of state live in ``core/`` (``bursarcore.h``); this module
converts Python numbers at the edge (:mod:`bursarcore.units`' rules), calls the core and
turns its status codes into the library's exceptions.
"""

import math

import numpy as np
cimport numpy as cnp
from libc.math cimport isfinite, llrint, fabs
from libc.stdint cimport int64_t, uint8_t

from . import _validate, units
from ._corestatus import status_error, time_error, watermark_error
from .errors import InvalidArgument
from .reference.buckets import _validate_state, initial

cnp.import_array()

# the core compiled into this module as one unit, so the compiler can inline its calls
cdef extern from "unity.c":
    pass

cdef extern from "bursarcore.h" nogil:
    int BC_OK, BC_EINVAL, BC_ERANGE, BC_EINDEX, BC_ETIME, BC_ENOMEM, BC_ETOKENS
    int64_t BC_NEVER
    ctypedef struct bc_buckets:
        pass
    ctypedef struct bc_bucket_state:
        int64_t capacity, rate, tokens, remainder, last
    const char* bc_strerror(int status)
    int bc_buckets_new(size_t reserve, int64_t now, bc_buckets** out)
    void bc_buckets_free(bc_buckets* b)
    size_t bc_buckets_len(const bc_buckets* b)
    int64_t bc_buckets_watermark(const bc_buckets* b)
    int bc_buckets_append(bc_buckets* b, int64_t capacity, int64_t rate, int64_t tokens,
                          int64_t now, size_t* index)
    int bc_buckets_extend(bc_buckets* b, const int64_t* capacity, const int64_t* rate,
                          const int64_t* tokens, size_t n, int64_t now, size_t* bad)
    int bc_buckets_push(bc_buckets* b, const bc_bucket_state* s)
    int bc_buckets_get(const bc_buckets* b, size_t i, bc_bucket_state* out)
    int bc_buckets_columns(const bc_buckets* b, int64_t* capacity, int64_t* rate,
                           int64_t* tokens, int64_t* remainder, int64_t* last, size_t n)
    int bc_buckets_try_debit(bc_buckets* b, size_t i, int64_t amount, int64_t now,
                             int* granted)
    int bc_buckets_try_debit_batch(bc_buckets* b, const int64_t* idx, size_t n,
                                   const int64_t* amount, size_t n_amount,
                                   const int64_t* now, size_t n_now,
                                   uint8_t* granted, size_t* bad)
    int bc_buckets_try_debit_batch_f64(bc_buckets* b, const int64_t* idx, size_t n,
                                       const double* amount, size_t n_amount,
                                       const double* now, size_t n_now,
                                       uint8_t* granted, size_t* bad)
    int bc_buckets_refund(bc_buckets* b, size_t i, int64_t amount, int64_t now,
                          int64_t* credited)
    int bc_buckets_set_rate(bc_buckets* b, size_t i, int64_t rate, int64_t now)
    int bc_buckets_peek(const bc_buckets* b, int64_t now, int64_t* out, size_t n)
    int bc_buckets_time_until(const bc_buckets* b, size_t i, int64_t amount, int64_t now,
                              int64_t* wait)

cdef double NS_D = 1e9
cdef double SCALE_D = 1e6
cdef double MAX_SECONDS = <double>(1 << 62) / 1e9
cdef double MAX_UNITS = <double>(1 << 62) / 1e6
cdef int64_t EXACT_INT = 1LL << 53    # up to here an int64 / 1e6 or 1e9 in C equals
                                      # Python's correctly rounded int / int


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


cdef inline object _units(int64_t x):
    if x <= EXACT_INT:
        return <double>x / SCALE_D
    return <object>x / units.SCALE


cdef inline bint _plain(object a, int typenum, Py_ssize_t n):
    """``a`` is a 1-D, C-contiguous, aligned, native-order array of ``typenum`` and length n."""
    if type(a) is not np.ndarray:
        return False
    cdef cnp.ndarray arr = <cnp.ndarray>a
    return (cnp.PyArray_NDIM(arr) == 1 and cnp.PyArray_TYPE(arr) == typenum
            and cnp.PyArray_IS_C_CONTIGUOUS(arr) and cnp.PyArray_ISBEHAVED_RO(arr)
            and (n < 0 or cnp.PyArray_DIM(arr, 0) == n))


cdef int _fail(int st, str what) except -1:
    raise status_error(st, what)


cdef class TokenBuckets:
    """N token buckets in the C core's table; see :class:`bursarcore.buckets.TokenBuckets`."""

    cdef bc_buckets* _h

    backend = "cython"

    def __cinit__(self):
        self._h = NULL

    def __dealloc__(self):
        bc_buckets_free(self._h)

    def __init__(self, capacity, rate, tokens=None, now=0.0):
        cap, rat, tok, t0_ = initial(capacity, rate, tokens, now)
        n = cap.shape[0]
        cdef int64_t t0 = t0_
        self._open(n, t0)
        cdef const int64_t[::1] c = np.ascontiguousarray(cap)
        cdef const int64_t[::1] r = np.ascontiguousarray(rat)
        cdef const int64_t[::1] k = np.ascontiguousarray(tok)
        cdef int st = BC_OK
        if n:
            st = bc_buckets_extend(self._h, &c[0], &r[0], &k[0], <size_t>n, t0, NULL)
        if st != BC_OK:
            _fail(st, "capacity")

    cdef _open(self, Py_ssize_t n, int64_t t0):
        cdef bc_buckets* h = NULL
        cdef int st = bc_buckets_new(<size_t>max(n, 16), t0, &h)
        if st != BC_OK:
            _fail(st, "now")
        bc_buckets_free(self._h)
        self._h = h

    cdef size_t _index(self, object index) except? 0:
        """``index`` as the core's size_t; a negative or too large one raises here."""
        cdef Py_ssize_t i
        cdef Py_ssize_t n = <Py_ssize_t>bc_buckets_len(self._h)
        if type(index) is int:
            try:
                i = index
            except OverflowError:
                i = -1
            if i < 0 or i >= n:
                raise InvalidArgument("i", f"index out of range [0, {n})", index)
            return <size_t>i
        return <size_t>_validate.index(index, n)

    cdef int _check(self, int st, size_t k, int64_t t) except -1:
        cdef bc_bucket_state s
        if st == BC_OK:
            return 0
        if st == BC_ETIME:
            bc_buckets_get(self._h, k, &s)
            raise time_error(s.last, t)
        return _fail(st, "i")

    def __len__(self):
        return bc_buckets_len(self._h)

    cdef object _column(self, int which):
        cdef Py_ssize_t n = <Py_ssize_t>bc_buckets_len(self._h)
        out = np.empty(n, dtype=np.int64)
        cdef int64_t[::1] o = out
        cdef int64_t* p = &o[0] if n else NULL
        bc_buckets_columns(self._h, p if which == 0 else NULL, p if which == 1 else NULL,
                           p if which == 2 else NULL, p if which == 3 else NULL,
                           p if which == 4 else NULL, <size_t>n)
        return out

    @property
    def capacity(self):
        return self._column(0) / units.SCALE

    @property
    def rate(self):
        return self._column(1) / units.SCALE

    def try_debit(self, i, amount, now):
        cdef int64_t t = _ns(now)
        cdef int64_t a = _fixed(amount, "amount")
        cdef size_t k = self._index(i)
        cdef int granted = 0
        self._check(bc_buckets_try_debit(self._h, k, a, t, &granted), k, t)
        return granted != 0

    def try_debit_batch(self, idx, amounts, now):
        out = self._batch_fast(idx, amounts, now)
        if out is not None:
            return out
        ix = np.ascontiguousarray(units.index_array(idx, <Py_ssize_t>bc_buckets_len(self._h)))
        cdef Py_ssize_t n = ix.shape[0]
        amt = np.ascontiguousarray(units.fixed_array(amounts, "amounts", n))
        ts = np.ascontiguousarray(units.ns_array(now, "now", n))
        return self._debit_checked(ix, amt, ts)

    cdef object _debit_checked(self, object ix, object amt, object ts):
        out = np.empty(ix.shape[0], dtype=np.bool_)
        if ix.shape[0] == 0:
            return out
        cdef int st = self._debit(ix, amt, ts, out)
        if st == BC_ETIME:      # the position and the bucket, in the library's words
            _validate.batch_times(ix, ts, self._column(4), bc_buckets_watermark(self._h))
        if st != BC_OK:
            _fail(st, "idx" if st == BC_EINDEX else "now" if st == BC_ETIME else "amounts")
        return out

    cdef object _batch_fast(self, object idx, object amounts, object now):
        """try_debit_batch for the common call, or None: ``idx`` a plain int64 array,
        ``amounts`` and ``now`` floats or plain float64 arrays, handed to the core as they
        are (it converts them as units does, and checks them). Anything else, and any call
        the core refuses (having changed nothing), returns None: the general path
        (units.*_array, _validate.batch_times) decides, which is the one that raises."""
        cdef Py_ssize_t n
        cdef double a1, t1
        cdef const double* ap
        cdef const double* tp
        cdef size_t na = 1, nt = 1, bad = 0
        if not _plain(idx, cnp.NPY_INT64, -1):
            return None
        n = cnp.PyArray_DIM(<cnp.ndarray>idx, 0)
        if n == 0:
            return None
        if isinstance(amounts, float):
            a1 = <double>amounts
            ap = &a1
        elif _plain(amounts, cnp.NPY_FLOAT64, n):
            ap = <const double*>cnp.PyArray_DATA(<cnp.ndarray>amounts)
            na = <size_t>n
        else:
            return None
        if isinstance(now, float):
            t1 = <double>now
            tp = &t1
        elif _plain(now, cnp.NPY_FLOAT64, n):
            tp = <const double*>cnp.PyArray_DATA(<cnp.ndarray>now)
            nt = <size_t>n
        else:
            return None
        out = np.empty(n, dtype=np.bool_)
        # the GIL stays held: another thread's append() may move the rows (see _debit)
        if bc_buckets_try_debit_batch_f64(
                self._h, <const int64_t*>cnp.PyArray_DATA(<cnp.ndarray>idx), <size_t>n,
                ap, na, tp, nt, <uint8_t*>cnp.PyArray_DATA(<cnp.ndarray>out), &bad) != BC_OK:
            return None
        return out

    cdef int _debit(self, object idx, object amt, object ts, object out):
        """The core's batch on int64 arrays (C-contiguous, lengths checked by the caller).

        The GIL stays held: released, another thread's append() could move the rows (the
        batch would write freed memory) or interleave its debits."""
        cdef size_t bad = 0
        return bc_buckets_try_debit_batch(
            self._h, <const int64_t*>cnp.PyArray_DATA(<cnp.ndarray>idx),
            <size_t>cnp.PyArray_DIM(<cnp.ndarray>idx, 0),
            <const int64_t*>cnp.PyArray_DATA(<cnp.ndarray>amt),
            <size_t>cnp.PyArray_DIM(<cnp.ndarray>amt, 0),
            <const int64_t*>cnp.PyArray_DATA(<cnp.ndarray>ts),
            <size_t>cnp.PyArray_DIM(<cnp.ndarray>ts, 0),
            <uint8_t*>cnp.PyArray_DATA(<cnp.ndarray>out), &bad)

    def debit_fixed(self, idx, amounts, now_ns):
        """Batch debit on already-converted integers (int64 arrays).

        For callers that keep their own fixed-point arrays (the admission engine,
        benchmarks). ``now_ns`` has length 1 (one instant) or ``len(idx)``. The core
        still checks every index, amount and time and refuses the whole batch, changing
        nothing, if one is wrong.
        """
        ix = np.ascontiguousarray(idx, dtype=np.int64)
        am = np.ascontiguousarray(amounts, dtype=np.int64)
        ts = np.ascontiguousarray(now_ns, dtype=np.int64)
        cdef Py_ssize_t n = ix.shape[0]
        if am.shape[0] != n or (ts.shape[0] != n and ts.shape[0] != 1):
            raise InvalidArgument("amounts", "lengths of idx, amounts and now must agree", n)
        return self._debit_checked(ix, am, ts)

    def refund(self, i, amount, now):
        cdef int64_t t = _ns(now)
        cdef int64_t a = _fixed(amount, "amount")
        cdef size_t k = self._index(i)
        cdef int64_t credited = 0
        self._check(bc_buckets_refund(self._h, k, a, t, &credited), k, t)
        return _units(credited)

    def tokens(self, now):
        cdef int64_t t = _ns(now)
        cdef int64_t wm = bc_buckets_watermark(self._h)
        if t < wm:
            raise watermark_error(wm, now)
        cdef Py_ssize_t n = <Py_ssize_t>bc_buckets_len(self._h)
        out = np.empty(n, dtype=np.int64)
        cdef int64_t[::1] o = out
        if n:
            bc_buckets_peek(self._h, t, &o[0], <size_t>n)
        return out / units.SCALE

    def set_rate(self, i, rate, now):
        cdef int64_t t = _ns(now)
        cdef int64_t r = _fixed(rate, "rate")
        cdef size_t k = self._index(i)
        self._check(bc_buckets_set_rate(self._h, k, r, t), k, t)

    def time_until(self, i, amount, now):
        cdef int64_t t = _ns(now)
        cdef int64_t a = _fixed(amount, "amount")
        cdef size_t k = self._index(i)
        cdef int64_t q = 0
        self._check(bc_buckets_time_until(self._h, k, a, t, &q), k, t)
        if q == BC_NEVER:
            return math.inf
        if q <= EXACT_INT:
            return <double>q / NS_D
        return <object>q / units.NS

    def append(self, capacity, rate, tokens=None, now=None):
        cdef int64_t c = _fixed(capacity, "capacity")
        cdef int64_t r = _fixed(rate, "rate")
        cdef int64_t tk = c if tokens is None else _fixed(tokens, "tokens")
        if tk > c:
            raise InvalidArgument("tokens", "must be <= capacity", tokens)
        cdef int64_t wm = bc_buckets_watermark(self._h)
        cdef int64_t t = wm if now is None else _ns(now)
        if t < wm:
            raise watermark_error(wm, now)
        cdef size_t index = 0
        cdef int st = bc_buckets_append(self._h, c, r, tk, t, &index)
        if st != BC_OK:
            _fail(st, "capacity")
        return index

    @property
    def state(self):
        return {
            "capacity": self._column(0),
            "rate": self._column(1),
            "tokens": self._column(2),
            "remainder": self._column(3),
            "last": self._column(4),
            "watermark": int(bc_buckets_watermark(self._h)),
        }

    @classmethod
    def from_state(cls, state):
        cap, rate, tok, rem, last = _validate_state(state)
        cdef TokenBuckets self = cls.__new__(cls)
        cdef Py_ssize_t n = cap.shape[0], j
        cdef int64_t wm = int(state["watermark"])
        self._open(n, wm)
        cdef bc_bucket_state s
        cdef int st
        for j in range(n):
            s.capacity = cap[j]
            s.rate = rate[j]
            s.tokens = tok[j]
            s.remainder = rem[j]
            s.last = last[j]
            st = bc_buckets_push(self._h, &s)
            if st != BC_OK:
                _fail(st, "state")
        return self

    def __reduce__(self):
        return (type(self).from_state, (self.state,))
