# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Compiled journal helpers. Private: import :mod:`bursarcore.journal.fill` instead.

Same contract and same bytes as the pure-Python reference in :mod:`bursarcore.journal.fill`
(the specification): :func:`fill_acquire` writes a batch's ``acquire`` records in one pass
over the kernel's per-item outputs, :func:`crc32_rows` is zlib's CRC-32 of each record.
``Rec`` mirrors :data:`bursarcore.journal.records.RECORD_DTYPE` byte for byte (packed);
:func:`layout` lets the Python side check that before trusting it.
"""

import numpy as np
cimport numpy as cnp
from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t, uint32_t

from ._abi import LIMITS as _LIMITS

cnp.import_array()

cdef extern from "bursarcore.h":
    enum:
        BC_LIMITS       # the rules with a limit: a record's lim_* fields, in their order


cdef packed struct Rec:
    int64_t seq
    int64_t t
    int8_t op
    int8_t outcome
    int8_t reason
    int8_t path
    int8_t rank
    int8_t batch
    int16_t dim
    int16_t cls
    int32_t campaign
    int64_t nmin
    int64_t nmax
    int64_t dur
    int64_t max_spend
    int64_t deadline
    int64_t ttl
    int64_t units
    int64_t lease
    int64_t intent
    int64_t cost
    double deficit
    int64_t tokens_before
    int64_t credits_before
    int64_t free
    int64_t unmet
    int64_t lim[BC_LIMITS]
    int64_t tokens_after
    int64_t credits_after
    int64_t held_after
    int64_t level
    int64_t level_figure


DEF OP_ACQUIRE = 2
DEF OUT_GRANTED = 1
DEF OUT_REFUSED = 3
cdef int64_t ROW_MASK = (<int64_t>1 << 32) - 1   # lease id = row | generation << 32


def layout():
    """(itemsize, {field: offset}) of the compiled record, to compare with RECORD_DTYPE."""
    cdef Rec r
    cdef char* b = <char*>&r
    off = {
        "seq": <char*>&r.seq - b, "t": <char*>&r.t - b, "op": <char*>&r.op - b,
        "outcome": <char*>&r.outcome - b, "reason": <char*>&r.reason - b,
        "path": <char*>&r.path - b, "rank": <char*>&r.rank - b, "batch": <char*>&r.batch - b,
        "dim": <char*>&r.dim - b, "cls": <char*>&r.cls - b, "campaign": <char*>&r.campaign - b,
        "nmin": <char*>&r.nmin - b, "nmax": <char*>&r.nmax - b, "dur": <char*>&r.dur - b,
        "max_spend": <char*>&r.max_spend - b, "deadline": <char*>&r.deadline - b,
        "ttl": <char*>&r.ttl - b, "units": <char*>&r.units - b, "lease": <char*>&r.lease - b,
        "intent": <char*>&r.intent - b, "cost": <char*>&r.cost - b,
        "deficit": <char*>&r.deficit - b, "tokens_before": <char*>&r.tokens_before - b,
        "credits_before": <char*>&r.credits_before - b, "free": <char*>&r.free - b,
        "unmet": <char*>&r.unmet - b, "tokens_after": <char*>&r.tokens_after - b,
        "credits_after": <char*>&r.credits_after - b, "held_after": <char*>&r.held_after - b,
        "level": <char*>&r.level - b, "level_figure": <char*>&r.level_figure - b,
    }
    for q, name in enumerate(_LIMITS):
        off[f"lim_{name}"] = <char*>&r.lim[q] - b
    return sizeof(Rec), off


def fill_acquire(uint8_t[::1] raw, int64_t seq0, Py_ssize_t j0, int64_t t, int64_t d,
                 int64_t ttl, int64_t iid0, const int64_t[::1] ci, const int64_t[::1] ks,
                 const int64_t[::1] nmin, const int64_t[::1] nmax, const int64_t[::1] dur,
                 const int64_t[::1] out_n, const int64_t[::1] out_r,
                 const int64_t[::1] out_l, const int64_t[:, ::1] rec,
                 const int64_t[:] rank, const double[::1] deficit, const int64_t[:] cost):
    """Write items j0..j0+m of a batch as ``acquire`` records into ``raw`` (the bytes of m
    rows); the arguments are validated by the Python wrapper, indices here."""
    cdef Py_ssize_t m = raw.shape[0] // sizeof(Rec), i, j, q
    cdef Rec* r = <Rec*>&raw[0] if m else NULL
    cdef const int64_t* x
    cdef int64_t c, k, lid, row
    cdef Py_ssize_t nc = deficit.shape[0], nk = rank.shape[0], nl = cost.shape[0]
    if (j0 < 0 or j0 + m > ci.shape[0] or j0 + m > rec.shape[0]
            or rec.shape[1] != 9 + BC_LIMITS):
        raise IndexError("fill_acquire: batch slice out of range")
    with nogil:
        for i in range(m):
            j = j0 + i
            c = ci[j]
            k = ks[j]
            lid = out_l[j]
            row = lid & ROW_MASK              # the row of a lease id (admission.state)
            if c < 0 or c >= nc or k < 0 or k >= nk or (lid >= 0 and row >= nl):
                with gil:
                    raise IndexError(f"fill_acquire: item {j} indexes out of range")
            r.seq = seq0 + i
            r.t = t
            r.op = OP_ACQUIRE
            r.rank = <int8_t>rank[k]
            r.batch = 1 if j == 0 else 2
            r.dim = <int16_t>d
            r.cls = <int16_t>k
            r.campaign = <int32_t>c
            r.nmin = nmin[j]
            r.nmax = nmax[j]
            r.dur = dur[j]
            r.max_spend = -1
            r.deadline = -1
            r.ttl = ttl
            r.lease = lid
            r.intent = iid0 + j
            r.deficit = deficit[c]
            if lid >= 0:
                r.outcome = OUT_GRANTED
                r.reason = 0
                r.path = 1
                r.units = out_n[j]
                r.cost = cost[row]
            else:
                r.outcome = OUT_REFUSED
                r.reason = <int8_t>out_r[j]
                r.path = 0
                r.units = 0
                r.cost = 0
            x = &rec[j, 0]
            r.tokens_before = x[0]
            r.credits_before = x[1]
            r.free = x[2]
            r.unmet = x[3]
            for q in range(BC_LIMITS):
                r.lim[q] = x[4 + q]
            r.tokens_after = x[4 + BC_LIMITS]
            r.credits_after = x[5 + BC_LIMITS]
            r.held_after = x[6 + BC_LIMITS]
            r.level = x[7 + BC_LIMITS]
            r.level_figure = x[8 + BC_LIMITS]
            r += 1


# -- CRC-32 (zlib's: reflected 0xEDB88320), slice-by-8 -------------------------------------
cdef uint32_t T[8][256]


cdef void _tables() noexcept:
    cdef uint32_t c
    cdef int i, k
    for i in range(256):
        c = <uint32_t>i
        for k in range(8):
            c = (c >> 1) ^ (0xEDB88320u if c & 1 else 0u)
        T[0][i] = c
    for i in range(256):
        c = T[0][i]
        for k in range(1, 8):
            c = (c >> 8) ^ T[0][c & 0xFF]
            T[k][i] = c


_tables()


cdef inline uint32_t _le32(const uint8_t* p) noexcept nogil:
    return (<uint32_t>p[0]) | (<uint32_t>p[1] << 8) | (<uint32_t>p[2] << 16) | (<uint32_t>p[3] << 24)


cdef uint32_t _crc32(const uint8_t* p, Py_ssize_t n) noexcept nogil:
    cdef uint32_t crc = 0xFFFFFFFFu, a, b
    while n >= 8:
        a = _le32(p) ^ crc
        b = _le32(p + 4)
        crc = (T[7][a & 0xFF] ^ T[6][(a >> 8) & 0xFF] ^ T[5][(a >> 16) & 0xFF] ^ T[4][a >> 24]
               ^ T[3][b & 0xFF] ^ T[2][(b >> 8) & 0xFF] ^ T[1][(b >> 16) & 0xFF] ^ T[0][b >> 24])
        p += 8
        n -= 8
    while n > 0:
        crc = (crc >> 8) ^ T[0][(crc ^ p[0]) & 0xFF]
        p += 1
        n -= 1
    return crc ^ 0xFFFFFFFFu


def crc32_rows(const uint8_t[::1] raw, Py_ssize_t itemsize):
    """zlib.crc32 of each ``itemsize``-byte record of ``raw``, as a uint32 array."""
    if itemsize <= 0 or raw.shape[0] % itemsize:
        raise ValueError("crc32_rows: length is not a whole number of records")
    cdef Py_ssize_t n = raw.shape[0] // itemsize, i
    out = np.empty(n, dtype=np.uint32)
    cdef uint32_t[::1] o = out
    if n:
        with nogil:
            for i in range(n):
                o[i] = _crc32(&raw[i * itemsize], itemsize)
    return out


# -- single records: dict -> tuple -> packed rows --------------------------------------------
from cpython.dict cimport PyDict_GetItem
from cpython.object cimport PyObject
from cpython.tuple cimport PyTuple_New, PyTuple_SET_ITEM, PyTuple_GET_SIZE
from cpython.ref cimport Py_INCREF
from cpython.long cimport PyLong_AsLongLong
from cpython.float cimport PyFloat_AsDouble
from libc.string cimport memcpy

DEF NFIELDS = 35      # the fields of a record (RECORD_DTYPE)
cdef tuple _NAMES = ()
cdef tuple _DEFAULTS = ()
cdef int[NFIELDS] _KIND     # 0: int64, 1: int32, 2: int16, 3: int8, 4: float64
cdef Py_ssize_t[NFIELDS] _OFF
cdef Py_ssize_t _NF = 0


def setup(fields, defaults, kinds, offsets):
    """The record's field names, defaults, kinds and offsets (from RECORD_DTYPE)."""
    global _NAMES, _DEFAULTS, _NF
    if (len(fields) != NFIELDS or len(defaults) != NFIELDS or len(kinds) != NFIELDS
            or len(offsets) != NFIELDS):
        raise ValueError(f"setup: a record has {NFIELDS} fields")
    _NAMES, _DEFAULTS = tuple(fields), tuple(defaults)
    for i in range(NFIELDS):
        _KIND[i] = kinds[i]
        _OFF[i] = offsets[i]
    _NF = NFIELDS


def as_tuple(dict fields):
    """The record's values in field order, defaults where ``fields`` has none."""
    if _NF != NFIELDS:
        raise RuntimeError("as_tuple: setup() first")
    cdef tuple out = PyTuple_New(NFIELDS)
    cdef PyObject* v
    cdef object o
    cdef Py_ssize_t i
    for i in range(NFIELDS):
        v = PyDict_GetItem(fields, _NAMES[i])
        o = <object>v if v != NULL else _DEFAULTS[i]
        Py_INCREF(o)
        PyTuple_SET_ITEM(out, i, o)
    return out


def pack_tuples(list tuples, uint8_t[::1] raw, Py_ssize_t itemsize):
    """Write each NFIELDS-tuple into ``raw`` as a record. Returns False (``raw`` partly written)
    at the first value that is not a number in its field's range, so the caller lets numpy
    decide what such a value means."""
    cdef Py_ssize_t n = len(tuples), i, f
    cdef tuple tp
    cdef uint8_t* p
    cdef int64_t x
    cdef int32_t x4
    cdef int16_t x2
    cdef int8_t x1
    cdef double y
    cdef object o
    if _NF != NFIELDS or raw.shape[0] != n * itemsize:
        raise ValueError("pack_tuples: setup() first, and raw must hold len(tuples) records")
    for i in range(n):
        o = tuples[i]
        if type(o) is not tuple or PyTuple_GET_SIZE(o) != NFIELDS:
            return False
        tp = <tuple>o
        p = &raw[i * itemsize]
        for f in range(NFIELDS):
            o = tp[f]
            try:
                if _KIND[f] == 4:
                    y = PyFloat_AsDouble(o)
                    memcpy(p + _OFF[f], &y, 8)
                    continue
                x = PyLong_AsLongLong(o)
            except (TypeError, OverflowError, ValueError):
                return False
            if _KIND[f] == 0:
                memcpy(p + _OFF[f], &x, 8)
            elif _KIND[f] == 1:
                if x < -2147483648 or x > 2147483647:
                    return False
                x4 = <int32_t>x
                memcpy(p + _OFF[f], &x4, 4)
            elif _KIND[f] == 2:
                if x < -32768 or x > 32767:
                    return False
                x2 = <int16_t>x
                memcpy(p + _OFF[f], &x2, 2)
            else:
                if x < -128 or x > 127:
                    return False
                x1 = <int8_t>x
                memcpy(p + _OFF[f], &x1, 1)
    return True
