# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Layout experiment: one batched refill+debit loop over three memory layouts.

The arithmetic is the product kernel's (``bursarcore._buckets._refill`` and
``_debit_kernel``), written once in ``_step`` over five field pointers, so the layouts
differ only in where those fields live:

- ``debit_aos8``: one (N, 8) int64 row per bucket, 64-byte aligned (the product layout:
  capacity, rate, tokens, remainder, last update, 3 spare) — one cache line per bucket.
- ``debit_aos5``: one (N, 5) row, no padding — 40-byte rows, some straddle two lines.
- ``debit_soa``: five separate int64 arrays — five cache lines per bucket touched.

``debit_aos8_prefetch`` is the product layout with a software prefetch ``PF`` requests
ahead, to see how much of the large-table cost is memory latency the loop fails to hide.
"""

from libc.stdint cimport int64_t, uint8_t

cdef extern from *:
    ctypedef long long i128 "__int128"
    void prefetch_w "__builtin_prefetch"(const void* p, int rw, int locality) noexcept nogil

cdef int64_t NS = 1000000000
cdef int64_t I64_MAX = 0x7FFFFFFFFFFFFFFF
cdef enum:
    PF = 16  # requests ahead to prefetch


cdef inline uint8_t _step(int64_t* cap, int64_t* rate, int64_t* tok, int64_t* rem,
                          int64_t* last, int64_t t, int64_t a) noexcept nogil:
    cdef int64_t dt = t - last[0]
    cdef int64_t tk, r
    cdef i128 gained, room
    if dt > 0:
        last[0] = t
        tk = tok[0]
        if tk >= cap[0]:
            rem[0] = 0
        else:
            r = rate[0]
            if r != 0:
                gained = <i128>r * dt + rem[0]
                room = <i128>(cap[0] - tk) * NS
                if gained >= room:
                    tok[0] = cap[0]
                    rem[0] = 0
                elif gained <= I64_MAX:
                    tok[0] = tk + (<int64_t>gained) // NS
                    rem[0] = (<int64_t>gained) % NS
                else:
                    tok[0] = tk + <int64_t>(gained // NS)
                    rem[0] = <int64_t>(gained % NS)
    if tok[0] >= a:
        tok[0] -= a
        return 1
    return 0


def debit_aos8(int64_t[:, ::1] rows, const int64_t[::1] idx, const int64_t[::1] amt,
               int64_t t, uint8_t[::1] out):
    cdef Py_ssize_t k, n = idx.shape[0]
    cdef int64_t* base = &rows[0, 0]
    cdef int64_t* r
    with nogil:
        for k in range(n):
            r = base + idx[k] * 8
            out[k] = _step(r, r + 1, r + 2, r + 3, r + 4, t, amt[k])


def debit_aos8_prefetch(int64_t[:, ::1] rows, const int64_t[::1] idx,
                        const int64_t[::1] amt, int64_t t, uint8_t[::1] out):
    cdef Py_ssize_t k, n = idx.shape[0]
    cdef int64_t* base = &rows[0, 0]
    cdef int64_t* r
    with nogil:
        for k in range(n):
            if k + PF < n:
                prefetch_w(base + idx[k + PF] * 8, 1, 3)
            r = base + idx[k] * 8
            out[k] = _step(r, r + 1, r + 2, r + 3, r + 4, t, amt[k])


def debit_aos5(int64_t[:, ::1] rows, const int64_t[::1] idx, const int64_t[::1] amt,
               int64_t t, uint8_t[::1] out):
    cdef Py_ssize_t k, n = idx.shape[0]
    cdef int64_t* base = &rows[0, 0]
    cdef int64_t* r
    with nogil:
        for k in range(n):
            r = base + idx[k] * 5
            out[k] = _step(r, r + 1, r + 2, r + 3, r + 4, t, amt[k])


def debit_soa(int64_t[::1] cap, int64_t[::1] rate, int64_t[::1] tok, int64_t[::1] rem,
              int64_t[::1] last, const int64_t[::1] idx, const int64_t[::1] amt,
              int64_t t, uint8_t[::1] out):
    cdef Py_ssize_t k, i, n = idx.shape[0]
    with nogil:
        for k in range(n):
            i = idx[k]
            out[k] = _step(&cap[i], &rate[i], &tok[i], &rem[i], &last[i], t, amt[k])
