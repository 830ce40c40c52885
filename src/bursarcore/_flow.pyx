# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Compiled flow-dimension engine. Private: import :mod:`bursarcore.flow` instead.

Same contract, same integers as :mod:`bursarcore.reference.flow` (the specification), whose
validation helpers this module calls, so both refuse the same inputs the same way.
Layout: one 128-byte row (16 int64) per (campaign, dimension) holding the guaranteed,
sustained and peak buckets (size, rate, tokens, remainder each) and their shared last
update, so a decision touches one aligned pair of cache lines plus the dimension's
facility row. One bucket's arithmetic (refill, level, wait) is the C core's ``bucket.h``.

``retry_after`` is the same number as the reference's binary search over [0, MAX_WAIT],
found faster: closed forms for the single buckets, and for "guaranteed + facility" an
exact lower bound, a gallop and a bisection (see :func:`_wait`).
"""

import math

import numpy as np
cimport numpy as cnp
from libc.math cimport INFINITY, fabs, isfinite, llrint
from libc.stdint cimport int64_t, uint8_t

from . import _validate, units
from .errors import InvalidArgument
from .reference.flow import (CAMPAIGN_FIELDS, FACILITY_FIELDS, check_batch, check_campaign,
                             check_engine, check_state, check_time, resolve_dim)

cnp.import_array()

cdef extern from *:
    """
    static inline void bc_prefetch(const void *p) {
        __builtin_prefetch(p, 1, 3);
        __builtin_prefetch((const char *)p + 64, 1, 3);
    }
    """
    ctypedef long long i128 "__int128"
    void bc_prefetch(const void* p) nogil

DEF W = 16          # int64 per campaign row: 3 buckets x 4 + last + 3 spare
DEF G = 0
DEF S = 4
DEF P = 8
DEF LAST = 12
DEF FW = 8          # int64 per facility row: bucket (4), last, spare
DEF F_LAST = 4
DEF AHEAD = 8       # requests to prefetch ahead: a row is usually a cache miss (L2 < rows)
DEF SIZE = 0
DEF RATE = 1
DEF TOK = 2
DEF REM = 3

cdef int64_t NS = 1000000000
cdef double NS_D = 1e9
cdef double SCALE_D = 1e6
cdef double MAX_SECONDS = <double>(1 << 62) / 1e9
cdef double MAX_UNITS = <double>(1 << 62) / 1e6
cdef int64_t I64_MAX = 0x7FFFFFFFFFFFFFFF
cdef int64_t NEVER = 0x7FFFFFFFFFFFFFFF
cdef int64_t MAX_WAIT = 1LL << 62
cdef int64_t EXACT_INT = 1LL << 53

NEVER_NS = NEVER


# -- bucket arithmetic (b points at size, rate, tokens, remainder): the core's, written once

cdef extern from "bucket.h" nogil:
    void _settle "bc_bucket_settle"(int64_t* b, i128 dt)
    int64_t _level "bc_bucket_level"(const int64_t* b, i128 dt)
    int64_t _wait1 "bc_bucket_wait"(const int64_t* b, int64_t v)


cdef inline int64_t _limit(const int64_t* b) noexcept nogil:
    return b[SIZE] if b[RATE] > 0 else b[TOK]


cdef inline int64_t _sum(const int64_t* g, const int64_t* f, int64_t dt) noexcept nogil:
    return _level(g, dt) + _level(f, dt)


cdef int64_t _wait(const int64_t* row, const int64_t* f, int64_t T) noexcept nogil:
    """Smallest dt in [0, MAX_WAIT] at which one call for T > 0 passes in full, else NEVER.

    Passing at dt means G(dt) >= T, or S(dt) >= T and P(dt) >= T and G(dt) + F(dt) >= T
    (reference.flow.passes); so the answer is min(dG, first dt >= max(dS, dP) with
    G + F >= T), each single-bucket time in closed form.
    """
    cdef const int64_t* g = row + G
    cdef int64_t dG = _wait1(g, T), m = _wait1(row + S, T), lo, hi, lb, c, step, mid, rate
    cdef int64_t need64, lg, lf
    cdef i128 need
    cdef bint hi_passes
    c = _wait1(row + P, T)
    if c > m:
        m = c
    if m >= dG:
        return dG                           # NEVER when both are
    # dG > m, so m <= MAX_WAIT: search [m, hi] for the first dt with G + F >= T
    hi_passes = dG != NEVER                 # G(dG) >= T
    hi = dG if hi_passes else MAX_WAIT
    # exact lower bounds: the sum without caps, and each bucket capped at its size
    lb = m
    rate = g[RATE] + f[RATE]
    if rate > 0 and T > g[TOK] + f[TOK]:
        if T - g[TOK] - f[TOK] <= 9223372034LL:
            need64 = (T - g[TOK] - f[TOK]) * NS - g[REM] - f[REM]
            c = (need64 - 1) // rate + 1 if need64 > 0 else 0
        else:
            need = <i128>(T - g[TOK] - f[TOK]) * NS - g[REM] - f[REM]
            need = (need - 1) // rate + 1
            c = hi if need > hi else <int64_t>need
        if c > lb:
            lb = c
    if T > g[SIZE] and g[SIZE] > 0:
        c = _wait1(f, T - g[SIZE])
        if c > lb:
            lb = c
    if T > f[SIZE]:
        c = _wait1(g, T - f[SIZE])
        if c > lb:
            lb = c
    if lb >= hi:
        return hi if hi_passes or _sum(g, f, hi) >= T else NEVER
    lg = _level(g, lb)
    lf = _level(f, lb)
    if lg + lf >= T:
        return lb
    if lg + lf + 1 == T:
        # one short (always so at the uncapped bound: two floors lose < 2): the answer is
        # the first moment either bucket gains a step; each is a closed form
        c = _wait1(g, lg + 1)
        mid = _wait1(f, lf + 1)
        if mid < c:
            c = mid
        return c if c <= hi else NEVER
    # gallop from the bound (usually within a few ns), then bisect (lo fails, hi passes)
    lo = lb
    step = 1
    while hi - lo > step:
        mid = lo + step
        if _sum(g, f, mid) >= T:
            hi = mid
            hi_passes = True
            break
        lo = mid
        step *= 2
    if not hi_passes and _sum(g, f, hi) < T:
        return NEVER
    while hi - lo > 1:
        mid = lo + (hi - lo) // 2
        if _sum(g, f, mid) >= T:
            hi = mid
        else:
            lo = mid
    return hi


cdef inline int64_t _decide(int64_t* row, int64_t* f, int64_t a, int64_t t,
                            int64_t* retry, uint8_t* bound) noexcept nogil:
    """One consume of ``a`` fixed-point units at ``t`` ns: reference.flow.FlowEngine._consume."""
    cdef i128 dt
    cdef int64_t x, y, allowed, most, lim_g
    if t > row[LAST]:
        dt = <i128>t - row[LAST]
        _settle(row + G, dt)
        _settle(row + S, dt)
        _settle(row + P, dt)
        row[LAST] = t
    if t > f[F_LAST]:
        _settle(f, <i128>t - f[F_LAST])
        f[F_LAST] = t
    # 1. guaranteed first; charged to sustained and peak as far as they hold
    x = row[G + TOK]
    if a < x:
        x = a
    row[G + TOK] -= x
    row[S + TOK] -= x if x < row[S + TOK] else row[S + TOK]
    row[P + TOK] -= x if x < row[P + TOK] else row[P + TOK]
    # 2. the rest through sustained, peak and facility at once
    y = a - x
    if row[S + TOK] < y:
        y = row[S + TOK]
    if row[P + TOK] < y:
        y = row[P + TOK]
    if f[TOK] < y:
        y = f[TOK]
    row[S + TOK] -= y
    row[P + TOK] -= y
    f[TOK] -= y
    allowed = x + y
    if allowed == a:
        retry[0] = 0
        bound[0] = 0
        return allowed
    bound[0] = 1 if row[S + TOK] == 0 else (2 if row[P + TOK] == 0 else 3)
    lim_g = _limit(row + G)
    most = _limit(row + S)
    if _limit(row + P) < most:
        most = _limit(row + P)
    if lim_g + _limit(f) < most:
        most = lim_g + _limit(f)
    if lim_g > most:
        most = lim_g
    if a - allowed < most:
        most = a - allowed
    retry[0] = NEVER if most == 0 else _wait(row, f, most)
    return allowed


cdef int64_t _kernel(int64_t* rows, int64_t* fac, Py_ssize_t ndim, const int64_t* camp,
                     const int64_t* dims, bint one_dim, const int64_t* amt,
                     const int64_t* ts, bint one_time, void* out_a, void* out_r,
                     uint8_t* out_b, bint as_float, Py_ssize_t n) noexcept nogil:
    """Sequential batch: request k sees requests < k. Returns the newest time used."""
    cdef Py_ssize_t k
    cdef int64_t d = dims[0], t = ts[0], a, r, newest = ts[0]
    for k in range(n):
        if k + AHEAD < n:
            bc_prefetch(rows + (camp[k + AHEAD] * ndim + (d if one_dim else dims[k + AHEAD])) * W)
        if not one_dim:
            d = dims[k]
        if not one_time:
            t = ts[k]
        a = _decide(rows + (camp[k] * ndim + d) * W, fac + d * FW, amt[k], t, &r, &out_b[k])
        if as_float:
            (<double*>out_a)[k] = <double>a / SCALE_D
            (<double*>out_r)[k] = INFINITY if r == NEVER else <double>r / NS_D
        else:
            (<int64_t*>out_a)[k] = a
            (<int64_t*>out_r)[k] = r
        if t > newest:
            newest = t
    return newest


cdef object _fixed_array(object amounts):
    """A float64 1-D array of valid amounts converted in one pass (``np.rint(a * 1e6)``, as
    units.fixed_array does), or None when it is anything else or any value is bad, so that
    the shared checks then raise the reference's error."""
    if type(amounts) is not np.ndarray or amounts.dtype != np.float64 or amounts.ndim != 1:
        return None
    cdef const double[::1] a
    try:
        a = amounts
    except ValueError:  # not contiguous
        return None
    cdef Py_ssize_t n = a.shape[0], k
    out = np.empty(n, dtype=np.int64)
    cdef int64_t[::1] o = out
    cdef bint ok = True
    cdef double x
    with nogil:
        for k in range(n):
            x = a[k]
            if not (x >= 0 and x <= MAX_UNITS):   # also false for nan
                ok = False
                break
            o[k] = llrint(x * SCALE_D)
    return out if ok else None


cdef inline int64_t _ns(object now) except? -1:
    if type(now) is not float:
        return units.to_ns(now)
    cdef double x = <double>now
    if not isfinite(x):
        raise InvalidArgument("now", "must be finite", x)
    if fabs(x) > MAX_SECONDS:
        raise InvalidArgument("now", f"must be within +/-{MAX_SECONDS:.6g} s", x)
    return llrint(x * NS_D)


cdef inline int64_t _fixed(object amount) except? -1:
    if type(amount) is not float:
        return units.to_fixed(amount)
    cdef double x = <double>amount
    if not isfinite(x):
        raise InvalidArgument("amount", "must be finite", x)
    if x < 0:
        raise InvalidArgument("amount", "must be >= 0", x)
    if x > MAX_UNITS:
        raise InvalidArgument("amount", f"must be <= {MAX_UNITS:.6g}", x)
    return llrint(x * SCALE_D)


cdef class FlowEngine:
    """Flow dimensions of every campaign; see :class:`bursarcore.flow.FlowEngine`."""

    cdef object _buf              # owner of the campaign rows (over-allocated for alignment)
    cdef int64_t[:, ::1] _rows    # (allocated campaigns * ndim, W), 128-byte aligned
    cdef int64_t[:, ::1] _fac     # (ndim, FW)
    cdef Py_ssize_t _n, _nd
    cdef int64_t _window, _wm
    cdef tuple _dims
    cdef dict _index
    cdef list _cap, _gsum

    backend = "compiled"

    def __init__(self, capacity, window=1.0, now=0.0):
        dims, caps, w = check_engine(capacity, window)
        cdef int64_t t0 = _ns(now)
        self._setup(dims, w, t0, caps)
        fac = np.asarray(self._fac)
        for k, c in enumerate(caps):
            size = c * w // NS
            fac[k, :5] = (size, c, size, 0, t0)

    cdef _setup(self, tuple dims, int64_t window, int64_t wm, list caps):
        self._dims = dims
        self._index = {d: k for k, d in enumerate(dims)}
        self._nd = len(dims)
        self._window = window
        self._wm = wm
        self._cap = list(caps)
        self._gsum = [0] * self._nd
        self._fac = np.zeros((self._nd, FW), dtype=np.int64)
        self._n = 0
        self._alloc(16)

    cdef _alloc(self, Py_ssize_t campaigns):
        cdef Py_ssize_t rows = campaigns * self._nd
        buf = np.zeros(rows * W + W, dtype=np.int64)
        off = (-(buf.ctypes.data % 128) // 8) % W
        view = buf[off:off + rows * W].reshape(rows, W)
        if self._n:
            view[:self._n * self._nd] = np.asarray(self._rows)[:self._n * self._nd]
        self._buf = buf
        self._rows = view

    cdef inline int64_t* _row(self, Py_ssize_t c, Py_ssize_t d) noexcept nogil:
        return &self._rows[0, 0] + (c * self._nd + d) * W

    # -- public surface ------------------------------------------------------------------------
    def __len__(self):
        return self._n

    @property
    def dims(self):
        return self._dims

    @property
    def window(self):
        return self._window / 1e9

    @property
    def capacity(self):
        return np.array(self._cap, dtype=np.int64) / units.SCALE

    @property
    def guaranteed_sum(self):
        return np.array(self._gsum, dtype=np.int64) / units.SCALE

    def dim_index(self, name):
        return resolve_dim(name, self._index, self._nd)

    def add_campaign(self, guaranteed=None, sustained=None, ceiling=None, burst=None,
                     now=None):
        spec = check_campaign(self._dims, self._cap, self._gsum, self._window, guaranteed,
                              sustained, ceiling, burst)
        cdef int64_t t = self._wm if now is None else _ns(now)
        check_time(t, self._wm, now)
        self._wm = t
        if self._n * self._nd == self._rows.shape[0]:
            self._alloc(2 * self._n)
        cdef int64_t* f
        cdef int64_t* row
        cdef Py_ssize_t k
        cdef int64_t g, s, b, B
        for k in range(self._nd):
            g, s, b, B = spec[k]
            f = &self._fac[k, 0]
            if t > f[F_LAST]:
                _settle(f, <i128>t - f[F_LAST])
                f[F_LAST] = t
            self._gsum[k] += g
            f[RATE] = self._cap[k] - self._gsum[k]
            f[SIZE] = (<i128>f[RATE] * self._window) // NS
            if f[TOK] >= f[SIZE]:
                f[TOK] = f[SIZE]
                f[REM] = 0
            row = self._row(self._n, k)
            row[G + SIZE] = (<i128>g * self._window) // NS
            row[G + RATE] = g
            row[G + TOK] = row[G + SIZE]
            row[G + REM] = 0
            row[S + SIZE] = B
            row[S + RATE] = s
            row[S + TOK] = B
            row[S + REM] = 0
            row[P + SIZE] = (<i128>b * self._window) // NS
            row[P + RATE] = b
            row[P + TOK] = row[P + SIZE]
            row[P + REM] = 0
            row[LAST] = t
        self._n += 1
        return self._n - 1

    def consume(self, campaign, dim, amount, now):
        cdef Py_ssize_t c, d
        if type(campaign) is int and 0 <= campaign < self._n:
            c = campaign
        else:
            c = _validate.index(campaign, self._n, "campaign")
        if type(dim) is str and dim in self._index:
            d = self._index[dim]
        else:
            d = resolve_dim(dim, self._index, self._nd)
        cdef int64_t a = _fixed(amount)
        cdef int64_t t = _ns(now)
        if t < self._wm:
            check_time(t, self._wm, now)
        self._wm = t
        cdef int64_t r
        cdef uint8_t bound
        a = _decide(self._row(c, d), &self._fac[d, 0], a, t, &r, &bound)
        return (<double>a / SCALE_D, INFINITY if r == NEVER else <double>r / NS_D)

    def consume_batch(self, campaigns, dims, amounts, now):
        fixed = _fixed_array(amounts)  # one pass for float64 arrays; None: the general path
        ci, di, amt, ts = check_batch(campaigns, dims, amounts, now, self._n, self._index,
                                      self._wm, fixed)
        n = ci.shape[0]
        allowed = np.empty(n, dtype=np.float64)
        retry = np.empty(n, dtype=np.float64)
        self._run(ci, di, amt, ts, allowed, retry, np.empty(n, dtype=np.uint8), True)
        return allowed, retry

    def consume_fixed(self, const int64_t[::1] campaigns, const int64_t[::1] dims,
                      const int64_t[::1] amounts, const int64_t[::1] now_ns):
        """Sequential batch on converted, validated integers: ``(allowed, retry_ns, bound)``;
        see :meth:`bursarcore.reference.flow.FlowEngine.consume_fixed`."""
        cdef Py_ssize_t n = campaigns.shape[0]
        if amounts.shape[0] != n or dims.shape[0] not in (1, n) or now_ns.shape[0] not in (1, n):
            raise InvalidArgument("amounts", "lengths of campaigns, dims, amounts and now "
                                  "must agree", n)
        allowed = np.empty(n, dtype=np.int64)
        retry = np.empty(n, dtype=np.int64)
        bound = np.empty(n, dtype=np.uint8)
        self._run(campaigns, dims, amounts, now_ns, allowed, retry, bound, False)
        return allowed, retry, bound

    cdef _run(self, const int64_t[::1] ci, const int64_t[::1] di, const int64_t[::1] amt,
              const int64_t[::1] ts, cnp.ndarray out_a, cnp.ndarray out_r, uint8_t[::1] out_b,
              bint as_float):
        cdef Py_ssize_t n = ci.shape[0]
        if n == 0:
            return
        cdef void* oa = cnp.PyArray_DATA(out_a)
        cdef void* orr = cnp.PyArray_DATA(out_r)
        cdef int64_t newest
        with nogil:
            newest = _kernel(&self._rows[0, 0], &self._fac[0, 0], self._nd, &ci[0], &di[0],
                             di.shape[0] == 1, &amt[0], &ts[0], ts.shape[0] == 1,
                             oa, orr, &out_b[0], as_float, n)
        if newest > self._wm:
            self._wm = newest

    def tokens(self, now):
        cdef int64_t t = _ns(now)
        check_time(t, self._wm, now)
        cdef Py_ssize_t c, d, j
        cdef int64_t* row
        out = np.empty((3, self._n, self._nd), dtype=np.int64)
        cdef int64_t[:, :, ::1] o = out
        cdef int64_t off[3]
        off[0] = G
        off[1] = S
        off[2] = P
        for c in range(self._n):
            for d in range(self._nd):
                row = self._row(c, d)
                for j in range(3):
                    o[j, c, d] = _level(row + off[j], <i128>t - row[LAST])
        fac = np.array([_level(&self._fac[d, 0], <i128>t - self._fac[d, F_LAST])
                        for d in range(self._nd)], dtype=np.int64)
        return {"guaranteed": out[0] / units.SCALE, "sustained": out[1] / units.SCALE,
                "peak": out[2] / units.SCALE, "facility": fac / units.SCALE}

    # -- state ---------------------------------------------------------------------------------
    @property
    def state(self):
        rows = np.asarray(self._rows)[:self._n * self._nd, :len(CAMPAIGN_FIELDS)]
        return {
            "dims": self._dims,
            "window": int(self._window),
            "watermark": int(self._wm),
            "capacity": np.array(self._cap, dtype=np.int64),
            "facility": np.asarray(self._fac)[:, :len(FACILITY_FIELDS)].copy(),
            "campaigns": rows.reshape(self._n, self._nd, len(CAMPAIGN_FIELDS)).copy(),
        }

    @classmethod
    def from_state(cls, state):
        dims, window, wm, cap, fac, camp = check_state(state)
        cdef FlowEngine self = cls.__new__(cls)
        self._setup(dims, window, wm, [int(x) for x in cap])
        n = camp.shape[0]
        self._alloc(max(n, 16))
        self._n = n
        np.asarray(self._fac)[:, :len(FACILITY_FIELDS)] = fac
        np.asarray(self._rows)[:n * self._nd, :len(CAMPAIGN_FIELDS)] = camp.reshape(
            n * self._nd, len(CAMPAIGN_FIELDS))
        if n:
            self._gsum = [int(x) for x in camp[:, :, G + RATE].sum(axis=0, dtype=object)]
        return self

    def __reduce__(self):
        return (type(self).from_state, (self.state,))
