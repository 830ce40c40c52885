# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# distutils: extra_compile_args = -fwrapv -ffp-contract=off --param=max-inline-insns-single=2000 --param=inline-unit-growth=400
"""Compiled admission kernel. Private: the broker picks it through ``broker.ENGINES``.

The twin of :mod:`bursarcore.reference.engine` (the specification): the same functions,
the same signatures, the same return values, the same writes to the arrays of an
:class:`~bursarcore.admission.state.EngineState`, bit for bit (SPEC §2).

Design
------
* **A cached view of the state.** Fetching ~50 arrays from ``st`` on every call would
  cost more than the decision, so a :class:`_Ctx` holds raw pointers to all of them. It is
  cached on the state (``st._cctx``) and rebuilt when ``st.version`` moves, which
  ``EngineState`` bumps on every attribute assignment (array growth, ``C``).
* **C kernels, Python shells.** Every rule is an inline ``nogil`` C function over the
  pointer struct :c:type:`Eng`; the module-level functions only convert arguments, call
  them, and turn error codes into the exceptions the reference raises. ``admit_batch``
  runs its items in one C loop (GIL released for 64 items or more); its columns are read
  through raw pointers, not memoryviews (a buffer acquisition per column would cost more
  than a small batch's decisions).
* **The rules from the C core.** The arithmetic rules of SPEC §4 on one campaign's numbers
  (excess, sustained room, ceiling room, unmet guarantee, the unmet-guarantee reserve,
  warm capacity) are the core's ``core/src/rules.h``, written once and inlined into every
  path here: the decision, the batch pass, grants, renewals, the "never" checks, ``quote``
  and ``token_wait``.
* **Integers.** Products that can leave int64 (rate·dt, n·dur·pm, left·HOUR_NS,
  excess·dur, ex·(end − t)) are taken in ``__int128``; every ``//`` is Python's floor
  division, so negative values (outside the broker's domain) still match. A value the
  reference returns as a Python int is returned exactly, even beyond int64; stored values
  must fit int64, as in the reference (whose numpy stores raise OverflowError). Prices
  (``price_pm``) must fit int64: a price times multipliers above 9.2e12 credits per
  unit-hour raises OverflowError. Running counters wrap like numpy's ``+=``.
* **Few divisions on the hot path.** ``admit`` asks whether the token and credit limits
  bind (``T >= q·dur``, ``X >= q·den``: multiplications) and divides only when they do or
  when a refusal needs its reason; congestion thresholds compare ``num < thr·den``; the
  common cost fits one 64-bit division by a constant. ``decide`` returns every limit exact.
* **A fused pass for the batch's common item.** Without a journal, ``admit_batch`` runs
  ``k_batch_fast``: an item that is a full warm grant (its max fits its ceiling, the warm
  capacity, its tokens and credits, and there is room for its lease) is committed by the
  same ``k_commit`` as ``k_admit`` uses, after its limits are only compared with the max
  and its price taken from a cache while congestion cannot move it; any other item goes
  through ``k_admit``. It prefetches the campaign records of the item six ahead (a 10 k campaign
  batch's records live in L3) and, for writing, the lease record that the grant twelve on
  would take (``k_row_ahead``). ``tests/test_batch_fast_diff.py`` puts items at each limit
  and one off it.
* **Records, not a line per field.** A campaign's state is one :c:type:`CdRow` per
  dimension (two cache lines) and one :c:type:`CRow` (one line), the rows of ``st.cdrow`` /
  ``st.crow``; a lease is one :c:type:`LRow` (two lines), a row of ``st.lrow``. A grant
  reads three campaign lines and writes two lease lines rather than one line per field: in
  the batch pass outstanding misses, not instructions, set the pace. The field arrays that
  Python and the reference use are views of the records' columns.
  ``Eng``'s scalar fields are ``long long`` rather than ``int64_t`` (``long``), so that
  under strict aliasing a store through an ``int64_t*`` cannot change them.
* **No reallocation in C.** The expiry heap grows exactly when the reference grows it (a
  push into a full heap): the C code stops before the push, the shell calls
  ``st.grow_heap()`` and resumes, so the arrays stay identical in size too. The lease
  store, the slot arena and the free-slot stacks never grow here: a kernel that lacks room
  raises IndexError before changing anything (the reference does the same).
* **Preconditions** (the broker validates them): indices in range (campaign rows
  ``0 <= c < len(st.cdrow)``, ``0 <= d < D``, class rows, lease rows) — out-of-range indices
  raise IndexError here, where numpy would wrap negative ones; ``g`` is set only by
  ``EngineState.add_campaign`` (its column sums are cached with the view).
* Not thread-safe, like the reference: one caller at a time per state (the broker).
* **``FastAcquire``** is not a kernel of the state but ``Broker.acquire``'s common case
  (validate a plain ``Intent``, read the clock, expire, admit, build the ``Decision`` and
  its ``Lease``, queue the ``expired`` events) in one C call; it hands everything else back
  to the broker's general path (returns None before changing anything) or calls the broker's
  own methods (``_serve_pending``, ``_slow``, ``_retry_after``, ``_reserve``) where the
  general path would. Its reference is :mod:`bursarcore.reference.fastpath`; the
  decisions, events and state are checked against the general path by
  ``tests/test_fastpath_diff.py``. The result objects are the broker's frozen, slotted
  dataclasses, filled slot by slot (``_Maker``) instead of through their ``__init__``.
  ``expired`` events are queued as fields (``_ExpiredRun``, in their place in
  ``Broker._events``) and built when ``Broker.poll`` takes them (``FastAcquire.events``):
  an expiry then touches no Python object, and the events are built in one loop that
  prefetches the campaign names.
"""

import numpy as np
cimport numpy as cnp
from libc.stdint cimport int32_t, int64_t, uint64_t
from libc.math cimport pow as c_pow

from .admission import state as _state

cnp.import_array()

cdef extern from *:
    ctypedef long long i128 "__int128"
    ctypedef unsigned long long u128 "unsigned __int128"
    bint __builtin_mul_overflow(i128 a, i128 b, i128* r) noexcept nogil
    bint mul_over64 "__builtin_mul_overflow"(int64_t a, int64_t b, int64_t* r) noexcept nogil
    void prefetch "__builtin_prefetch"(const void* p) noexcept nogil
    void prefetch_w "__builtin_prefetch"(const void* p, int rw) noexcept nogil

# the admission rules of SPEC §4 that are arithmetic on one campaign's numbers: the C
# core's, written once (core/src/rules.h)
cdef extern from "rules.h" nogil:
    int64_t bc_excess(int64_t H, int64_t n, int64_t s)
    int64_t bc_sustained_room(int64_t H, int64_t s)
    int64_t bc_ceiling_room(int64_t b, int64_t H)
    int64_t bc_unmet(int64_t g, int64_t Hf)
    int64_t bc_firm_limit(int64_t cap, int64_t F, int64_t U, int64_t unmet_own)
    int64_t bc_warm_firm(int64_t free, int64_t firm_limit)
    int64_t bc_warm_opportunistic(int64_t free, int64_t headroom)
    int64_t bc_reachable(int64_t free, int64_t oppa, int64_t rev, int64_t prom)

cdef extern from *:
    """
    #define BC_HOUR_NS ((int64_t)3600000000000LL)
    #define BC_MAXV ((int64_t)4611686018427387904LL)
    #define BC_PPM ((int64_t)1000000LL)
    #define BC_I64_MAX ((int64_t)0x7FFFFFFFFFFFFFFFLL)
    #define BC_I64_MIN ((int64_t)(-0x7FFFFFFFFFFFFFFFLL - 1))
    #define BC_ROW_MASK ((int64_t)0xFFFFFFFFLL)
    #define BC_GEN_MASK ((int64_t)0x3FFFFFFFLL)
    """
    const int64_t HOUR "BC_HOUR_NS"
    const int64_t MAXV "BC_MAXV"
    const int64_t PPM "BC_PPM"
    const int64_t I64_MAX "BC_I64_MAX"
    const int64_t I64_MIN "BC_I64_MIN"
    const int64_t ROW_MASK "BC_ROW_MASK"      # lease id = row | generation << ROW_BITS
    const int64_t GEN_MASK "BC_GEN_MASK"

# class-table columns
cdef enum:
    RANK = 0
    MULT = 1
    PRICED = 2
    PREEMPT = 3
    GRACE = 4
    FREEBROKE = 5
    NCOL = 6

# reason codes, outcomes, lease states, paths (checked against admission.state at import)
cdef enum:
    R_OK = 0
    R_CAPACITY = 1
    R_TOKENS = 2
    R_CREDITS = 3
    R_CEILING = 4

cdef enum:
    O_GRANTED = 0
    O_REFUSED = 1
    O_SLOW = 2

cdef enum:
    L_STARTING = 0
    L_ACTIVE = 1
    L_REVOKING = 2
    L_RELEASED = 3
    L_EXPIRED = 4
    L_REVOKED = 5

cdef enum:
    ROW_BITS = 32

cdef enum:
    P_WARM = 0
    P_RECLAIM = 1
    P_COLD = 2

cdef i128 EXACT_DOUBLE = 1LL << 53     # integers a double holds exactly

# error codes of the C kernels (all < 0)
cdef enum:
    E_LEASES = -1      # lease store full
    E_ARENA = -2       # slot arena full
    E_SLOTS = -3       # too few free slots to place
    E_STACK = -4       # ending a lease would overfill the free-slot stack
    E_HEAPFULL = -5    # a push needs st.grow_heap() first (the shell grows and resumes)
    E_ZERODIV = -6
    E_INDEX = -7
    E_RANGE = -8       # a price that does not fit int64
    E_EMPTY = -9       # heap_pop on an empty heap
    E_ENDED = -10      # end_lease of a lease that has already ended

assert (_state.OK, _state.CAPACITY, _state.TOKENS, _state.CREDITS, _state.CEILING) == \
    (R_OK, R_CAPACITY, R_TOKENS, R_CREDITS, R_CEILING)
assert (_state.GRANTED, _state.REFUSED, _state.SLOW) == (O_GRANTED, O_REFUSED, O_SLOW)
assert (_state.STARTING, _state.ACTIVE, _state.REVOKING, _state.RELEASED, _state.EXPIRED,
        _state.REVOKED) == (L_STARTING, L_ACTIVE, L_REVOKING, L_RELEASED, L_EXPIRED, L_REVOKED)
assert (_state.WARM, _state.RECLAIM, _state.COLD) == (P_WARM, P_RECLAIM, P_COLD)
assert (_state.MAXV, _state.HOUR_NS, _state.PPM) == (MAXV, HOUR, PPM)
assert (_state.ROW_BITS, _state.ROW_MASK, _state.GEN_MASK) == (ROW_BITS, ROW_MASK, GEN_MASK)
cdef double FS_REBASE = _state.FS_REBASE

backend = "compiled"


# -- the view of a state ---------------------------------------------------------------------
cdef struct CdRow:
    # a (campaign, dimension) record: admission.state._CD_FIELDS in order, 128 bytes, the
    # fields a grant touches in the first line
    int64_t tlast, H, T, s, b, Bcap, acc, tok_debited
    int64_t g, Hf, tok_minted, tok_refunded, tok_clipped, pad0, pad1, pad2


cdef struct CRow:
    # a campaign's record: admission.state._C_FIELDS, then fair share (SPEC §6) as float64
    int64_t left, escrow, cred_debited, budget, spent, refunded
    double fsS, fsG


_CD_ORDER = ("tlast", "H", "T", "s", "b", "Bcap", "acc", "tok_debited", "g", "Hf",
             "tok_minted", "tok_refunded", "tok_clipped")
_C_ORDER = ("left", "escrow", "cred_debited", "budget", "spent", "refunded")
_L_ORDER = ("camp", "dim", "units", "firm", "state", "lcls", "t_end", "slot_off", "t_grant",
            "t_start", "dur", "excess", "cost", "revoke_at", "intent", "gen")


cdef struct LRow:
    # a lease's record: admission.state._L_FIELDS in order, 128 bytes
    int64_t camp, dim, units, firm, state, lcls, t_end, slot_off
    int64_t t_grant, t_start, dur, excess, cost, revoke_at, intent, gen


# a build whose records differ from admission.state's (a stale build): not importable, so
# the broker falls back to the reference (bursarcore._backend.compiled)
if tuple(_state._CD_FIELDS) != _CD_ORDER or tuple(_state._C_FIELDS) != _C_ORDER \
        or tuple(_state._CF_FIELDS) != ("fs_S", "fs_G") or tuple(_state._L_FIELDS) != _L_ORDER \
        or sizeof(CdRow) != _state.CD_WIDTH * 8 or sizeof(CRow) != _state.C_WIDTH * 8 \
        or sizeof(LRow) != _state.L_WIDTH * 8:
    raise ImportError("bursarcore._engine: its campaign or lease records differ from "
                      "admission.state's (a stale build: rebuild the extension)")


cdef struct Eng:
    # scalars as ``long long``, not int64_t (``long`` here): under strict aliasing a store
    # through an int64_t* cannot change them, so the compiler keeps them in registers
    long long D, K, NT, bins, W, calloc, L, A, HC
    long long bin_ns
    # pool, per dimension
    int64_t* cap
    int64_t* headroom
    int64_t* occ
    int64_t* prom
    int64_t* rev
    int64_t* F
    int64_t* U
    int64_t* oppa
    int64_t* pend
    int64_t* price
    int64_t* gsum
    int64_t* cls
    int64_t* cong_thr
    int64_t* cong_mult
    int64_t* ring
    int64_t* ring_sum
    int64_t* scal
    int32_t* free_slots
    int64_t* top
    # campaigns: one record per (campaign, dimension), one per campaign
    CdRow* cd
    CRow* cr
    int64_t* fs_par
    long long fs_t         # cache: the last time fs_weight computed, and its weight
    double fs_w
    bint fs_ok
    # leases: one record per row
    LRow* lr
    int64_t* freeq            # ring of ended rows (length L) and [head, tail, reuse_after]
    int64_t* lfree
    int32_t* arena
    int64_t* arena_top
    int64_t* heap_t
    int64_t* heap_id


cdef class _Ctx:
    """Raw pointers to every array of one EngineState (see the module docstring)."""

    cdef Eng e
    cdef list refs            # the arrays the pointers point into, kept alive
    cdef Py_ssize_t version
    cdef void* owner          # the state it was built from (borrowed: lives in its __dict__)
    cdef object out4_obj      # the last `out` array of admit and its data pointer
    cdef int64_t* out4_ptr
    cdef object adv_obj       # the last `out` array of advance, its data and length
    cdef int64_t* adv_ptr
    cdef Py_ssize_t adv_len


cdef void* _data(list refs, object a, str name, int typenum, int ndim, Py_ssize_t d0,
                 Py_ssize_t d1) except NULL:
    if type(a) is not np.ndarray:
        raise TypeError(f"EngineState.{name} must be a numpy array")
    cdef cnp.ndarray arr = <cnp.ndarray>a
    if cnp.PyArray_TYPE(arr) != typenum or cnp.PyArray_NDIM(arr) != ndim \
            or not cnp.PyArray_IS_C_CONTIGUOUS(arr) or not cnp.PyArray_ISWRITEABLE(arr):
        raise TypeError(f"EngineState.{name} must be a writeable C-contiguous "
                        f"{ndim}-d {'int32' if typenum == cnp.NPY_INT32 else 'int64'} array")
    if (d0 >= 0 and cnp.PyArray_DIM(arr, 0) != d0) or \
            (ndim >= 2 and d1 >= 0 and cnp.PyArray_DIM(arr, 1) != d1) or \
            (ndim == 3 and cnp.PyArray_DIM(arr, 2) != _state.CD_WIDTH):
        raise ValueError(f"EngineState.{name} has shape {a.shape}, expected ({d0}, {d1}"
                         + (f", {_state.CD_WIDTH})" if ndim == 3 else ")"))
    refs.append(a)
    return cnp.PyArray_DATA(arr)


cdef inline int64_t* _i64(list refs, object st, str name, int ndim, Py_ssize_t d0,
                          Py_ssize_t d1) except NULL:
    return <int64_t*>_data(refs, getattr(st, name), name, cnp.NPY_INT64, ndim, d0, d1)


cdef _Ctx _build(object st):
    cdef _Ctx x = _Ctx.__new__(_Ctx)
    cdef list refs = []
    cdef Eng* e = &x.e
    cdef Py_ssize_t D = st.D, C, i, j
    e.D = D
    e.K = st.cls.shape[0]
    e.NT = st.cong_thr.shape[0]
    e.bins = st.bins
    e.bin_ns = st.bin_ns
    if e.bins < 1 or e.bin_ns < 1:
        raise ValueError("EngineState.bins and bin_ns must be >= 1")
    e.cap = _i64(refs, st, "cap", 1, D, 0)
    e.headroom = _i64(refs, st, "headroom", 1, D, 0)
    e.occ = _i64(refs, st, "occ", 1, D, 0)
    e.prom = _i64(refs, st, "prom", 1, D, 0)
    e.rev = _i64(refs, st, "rev", 1, D, 0)
    e.F = _i64(refs, st, "F", 1, D, 0)
    e.U = _i64(refs, st, "U", 1, D, 0)
    e.oppa = _i64(refs, st, "oppa", 1, D, 0)
    e.pend = _i64(refs, st, "pend", 1, D, 0)
    e.price = _i64(refs, st, "price", 1, D, 0)
    e.cls = _i64(refs, st, "cls", 2, e.K, NCOL)
    e.cong_thr = _i64(refs, st, "cong_thr", 1, e.NT, 0)
    e.cong_mult = _i64(refs, st, "cong_mult", 1, e.NT + 1, 0)
    e.ring = _i64(refs, st, "ring", 2, D, e.bins)
    e.ring_sum = _i64(refs, st, "ring_sum", 1, D, 0)
    e.scal = _i64(refs, st, "scal", 1, 4, 0)
    e.W = st.free_slots.shape[1]
    e.free_slots = <int32_t*>_data(refs, st.free_slots, "free_slots", cnp.NPY_INT32, 2, D, -1)
    e.top = _i64(refs, st, "top", 1, D, 0)
    C = st.C
    e.calloc = st.cdrow.shape[0]
    if not 0 <= C <= e.calloc:
        raise ValueError("EngineState.C exceeds its campaign rows")
    e.cd = <CdRow*>_data(refs, st.cdrow, "cdrow", cnp.NPY_INT64, 3, e.calloc, D)
    e.cr = <CRow*>_data(refs, st.crow, "crow", cnp.NPY_INT64, 2, e.calloc, _state.C_WIDTH)
    e.fs_par = _i64(refs, st, "fs_par", 1, 2, 0)
    if e.fs_par[0] < 1:
        raise ValueError("EngineState.fs_par[0] (the half-life) must be >= 1")
    e.fs_ok = False
    e.L = st.lrow.shape[0]
    e.lr = <LRow*>_data(refs, st.lrow, "lrow", cnp.NPY_INT64, 2, e.L, _state.L_WIDTH)
    e.freeq = _i64(refs, st, "freeq", 1, e.L, 0)
    e.lfree = _i64(refs, st, "lfree", 1, 3, 0)
    e.A = st.arena.shape[0]
    e.arena = <int32_t*>_data(refs, st.arena, "arena", cnp.NPY_INT32, 1, e.A, 0)
    e.arena_top = _i64(refs, st, "arena_top", 1, 1, 0)
    e.HC = st.heap_t.shape[0]
    e.heap_t = _i64(refs, st, "heap_t", 1, e.HC, 0)
    e.heap_id = _i64(refs, st, "heap_id", 1, e.HC, 0)
    # Σ_c g[c, d], for never(); g only changes in add_campaign, which bumps the version
    gsum = np.zeros(D, dtype=np.int64)
    e.gsum = <int64_t*>_data(refs, gsum, "gsum", cnp.NPY_INT64, 1, D, 0)
    for j in range(D):
        for i in range(C):
            e.gsum[j] += e.cd[i * D + j].g
    x.refs = refs
    x.version = st.version
    x.owner = <void*>st
    st._cctx = x
    return x


cdef inline _Ctx _ctx(object st):
    """The cached view of ``st``, rebuilt if its arrays moved (``st.version``)."""
    cdef object o = st._cctx
    cdef _Ctx x
    if type(o) is _Ctx:
        x = <_Ctx>o
        if x.owner == <void*>st and x.version == <Py_ssize_t>st.version:
            return x
    return _build(st)


# -- integer helpers -------------------------------------------------------------------------
cdef inline int64_t fdiv64(int64_t a, int64_t b) noexcept nogil:
    """Python's a // b (b != 0)."""
    if b == -1:
        return -a
    cdef int64_t q = a // b
    if (a % b != 0) and ((a < 0) != (b < 0)):
        q -= 1
    return q


cdef inline int64_t fmod64(int64_t a, int64_t b) noexcept nogil:
    """Python's a % b (b > 0)."""
    cdef int64_t r = a % b
    if r < 0:
        r += b
    return r


cdef inline i128 fdiv128(i128 a, i128 b) noexcept nogil:
    """Python's a // b (b != 0), in 64 bits when both fit."""
    cdef i128 q
    if I64_MIN < a <= I64_MAX and I64_MIN < b <= I64_MAX:
        return fdiv64(<int64_t>a, <int64_t>b)
    if b == -1:
        return -a
    q = a // b
    if a - q * b != 0 and ((a < 0) != (b < 0)):
        q -= 1
    return q


cdef inline i128 fdiv_ppm(i128 a) noexcept nogil:
    """a // PPM (a constant divisor: a multiply, not a division, when a fits 64 bits)."""
    cdef int64_t v, q
    if I64_MIN < a <= I64_MAX:
        v = <int64_t>a
        q = v // PPM
        if v < 0 and q * PPM != v:
            q -= 1
        return q
    return fdiv128(a, PPM)


cdef inline bint mul_over(i128 a, i128 b, i128* r) noexcept nogil:
    return __builtin_mul_overflow(a, b, r)


cdef inline int64_t imax(int64_t a, int64_t b) noexcept nogil:
    return a if a > b else b


cdef inline int64_t imin(int64_t a, int64_t b) noexcept nogil:
    return a if a < b else b


cdef inline int64_t wadd(int64_t a, i128 b) noexcept nogil:
    """a + b wrapped to int64, like numpy's ``+=`` on an int64 array element."""
    return <int64_t>(<uint64_t>a + <uint64_t>(<int64_t>b))


cdef object _pyint(i128 v):
    """An exact Python int from a 128-bit value."""
    if I64_MIN <= v <= I64_MAX:
        return <int64_t>v
    cdef bint neg = v < 0
    cdef u128 u = <u128>(-v) if neg else <u128>v
    r = ((<object><uint64_t>(u >> 64)) << 64) | <object><uint64_t>u
    return -r if neg else r


cdef inline i128 k_cost(int64_t n, int64_t dur, int64_t pm) noexcept nogil:
    """ceil(n·dur·pm / HOUR_NS), exact (Python: ``-(-(n*dur*pm) // HOUR_NS)``)."""
    cdef i128 x = <i128>n * dur
    cdef u128 p
    cdef uint64_t p64
    cdef i128 a, r
    if x >= 0 and pm >= 0:
        if (x >> 63) == 0:                      # x·pm < 2**126
            p = <u128>x * <u128>pm
            if (p >> 64) == 0:                  # the common case: one 64-bit division
                p64 = <uint64_t>p
                return <i128>(p64 // <uint64_t>HOUR + (p64 % <uint64_t>HOUR != 0))
            return <i128>((p + <u128>(HOUR - 1)) // <u128>HOUR)
        a = x // HOUR                           # x·pm may exceed 2**127: split x
        r = x - a * HOUR
        return a * pm + (r * pm + (HOUR - 1)) // HOUR
    # a negative factor: the same split with floor division (x = a·HOUR + r, 0 <= r < HOUR),
    # so no product beyond r·pm (< 2**105) is formed: ceil(x·pm/H) = a·pm + ceil(r·pm/H)
    a = fdiv128(x, HOUR)
    r = x - a * HOUR
    return a * pm - fdiv128(-(r * pm), HOUR)


# -- tokens and holdings (SPEC §4.2) ---------------------------------------------------------
cdef inline void k_settle(Eng* e, Py_ssize_t c, Py_ssize_t d, int64_t t) noexcept nogil:
    cdef Py_ssize_t i = c * e.D + d
    cdef int64_t tl = e.cd[i].tlast, H, rate, T
    cdef i128 dt, add, room
    if tl >= t:
        return
    dt = <i128>t - tl
    e.cd[i].tlast = t
    H = e.cd[i].H
    # wadd keeps the low 64 bits of H·dt: the wrapping 64-bit product is those bits
    e.cd[i].acc = <int64_t>(<uint64_t>e.cd[i].acc + <uint64_t>H * (<uint64_t>t - <uint64_t>tl))
    rate = e.cd[i].s - H
    T = e.cd[i].T
    if rate > 0:
        room = <i128>e.cd[i].Bcap - T
        if room == 0:                 # a full bucket (or an unlimited one): nothing to add
            return
        add = <i128>rate * dt
        if room < add:
            add = room
        e.cd[i].T = <int64_t>(T + add)
        e.cd[i].tok_minted = wadd(e.cd[i].tok_minted, add)
    elif rate < 0 and e.scal[1] != 0:
        add = -(<i128>rate) * dt
        if add > T:
            add = T
        e.cd[i].T = <int64_t>(T - add)
        e.cd[i].tok_debited = wadd(e.cd[i].tok_debited, add)


cdef inline int64_t k_unmet(Eng* e, Py_ssize_t c, Py_ssize_t d) noexcept nogil:
    cdef Py_ssize_t i = c * e.D + d
    return bc_unmet(e.cd[i].g, e.cd[i].Hf)


cdef inline int64_t k_free(Eng* e, Py_ssize_t d) noexcept nogil:
    return e.cap[d] - e.occ[d] - imax(0, e.prom[d] - e.rev[d])


cdef double k_fs_weight(Eng* e, int64_t t) noexcept nogil:
    """The reference's fs_weight: 2^((t − E)/half-life), moving the epoch E to t when t is
    more than FS_REBASE half-lives ahead (rare: every ~43 h at 600 s). Cached per t (a
    batch's grants share one t), and the cache dropped when the epoch moves."""
    cdef double x, f
    cdef Py_ssize_t c
    if e.fs_ok and e.fs_t == t:
        return e.fs_w
    x = <double>(t - e.fs_par[1]) / <double>e.fs_par[0]
    if x > FS_REBASE:
        f = c_pow(2.0, -x)
        for c in range(e.calloc):
            e.cr[c].fsS = e.cr[c].fsS * f
            e.cr[c].fsG = e.cr[c].fsG * f
        e.fs_par[1] = t
        x = 0.0
    e.fs_w = c_pow(2.0, x)
    e.fs_t = t
    e.fs_ok = True
    return e.fs_w


cdef inline void k_hold(Eng* e, Py_ssize_t c, Py_ssize_t d, int64_t delta, bint firm) noexcept nogil:
    cdef Py_ssize_t i = c * e.D + d
    cdef int64_t before
    cdef double w
    if d == 0:   # fold the holding so far into c's fair-share usage (caller settled: tlast is now)
        w = e.fs_w if e.fs_ok and e.fs_t == e.cd[i].tlast else k_fs_weight(e, e.cd[i].tlast)
        e.cr[c].fsS = e.cr[c].fsS + <double>e.cd[i].H * (w - e.cr[c].fsG)
        e.cr[c].fsG = w
    e.cd[i].H += delta
    if firm:
        before = k_unmet(e, c, d)
        e.cd[i].Hf += delta
        e.F[d] += delta
        e.U[d] += k_unmet(e, c, d) - before


# -- congestion and price (SPEC §7) ----------------------------------------------------------
cdef inline void k_ring_advance(Eng* e, int64_t t) noexcept nogil:
    cdef int64_t bn = fdiv64(t, e.bin_ns)
    cdef int64_t cur = e.scal[0]
    cdef int64_t steps, j, k
    cdef Py_ssize_t d
    if bn <= cur:
        return
    steps = <int64_t>(<i128>bn - cur) if <i128>bn - cur < e.bins else e.bins
    for d in range(e.D):
        for j in range(1, steps + 1):
            k = fmod64(cur + j, e.bins)
            e.ring_sum[d] -= e.ring[d * e.bins + k]
            e.ring[d * e.bins + k] = 0
    e.scal[0] = bn


cdef inline i128 k_cong_ppm(Eng* e, Py_ssize_t d) noexcept nogil:
    return fdiv128((<i128>e.ring_sum[d] + e.pend[d]) * PPM, imax(1, k_free(e, d)))


cdef inline int64_t k_cong_mult(Eng* e, Py_ssize_t d) noexcept nogil:
    return k_cong_mult_f(e, d, k_free(e, d))


cdef inline int64_t k_cong_mult_f(Eng* e, Py_ssize_t d, int64_t free) noexcept nogil:
    """The multiplier with k_free(e, d) already known (``free``)."""
    # κ < thr  <=>  num // den < thr  <=>  num < thr·den  (den >= 1): no division needed
    cdef i128 dem = <i128>e.ring_sum[d] + e.pend[d]
    cdef i128 num, den
    cdef Py_ssize_t i
    if dem == 0 and (e.NT == 0 or e.cong_thr[0] > 0):
        return e.cong_mult[0]         # no demand: 0 < thr[0]·den for any den >= 1
    num = dem * PPM
    den = imax(1, free)
    for i in range(e.NT):
        if num < e.cong_thr[i] * den:
            return e.cong_mult[i]
    return e.cong_mult[e.NT]


cdef inline i128 k_price(Eng* e, Py_ssize_t d, Py_ssize_t k) noexcept nogil:
    return k_price_f(e, d, k, k_free(e, d))


cdef inline i128 k_price_f(Eng* e, Py_ssize_t d, Py_ssize_t k, int64_t free) noexcept nogil:
    """The price with k_free(e, d) already known (``free``)."""
    cdef const int64_t* kc = e.cls + k * NCOL
    cdef i128 m = kc[MULT]
    cdef int64_t cm
    if kc[PRICED] != 0:
        cm = k_cong_mult_f(e, d, free)
        if cm != PPM:                     # (x·PPM) // PPM is x: skip the division
            m = fdiv_ppm(m * cm)
    if m == PPM:
        return e.price[d]
    return fdiv_ppm(<i128>e.price[d] * m)


cdef inline void k_shortfall(Eng* e, Py_ssize_t d, int64_t units) noexcept nogil:
    cdef int64_t k = fmod64(e.scal[0], e.bins)
    e.ring[d * e.bins + k] += units
    e.ring_sum[d] += units


# -- the decision (SPEC §4.4) ----------------------------------------------------------------
cdef struct Dec:
    int64_t n
    int64_t reason
    int64_t path
    int64_t pm
    int64_t lim_ceil
    int64_t lim_cap
    int64_t lim_tok
    i128 lim_cred
    int64_t lim_warm


cdef inline int k_decide(Eng* e, Py_ssize_t c, Py_ssize_t d, Py_ssize_t k, int64_t nmin,
                         int64_t nmax, int64_t dur, int64_t max_spend, int64_t t,
                         bint exact, Dec* o) noexcept nogil:
    """The reference's decide. With ``exact`` false (the admit fast path) the token and
    credit limits are only computed (by division) when they may bind: ``T // dur >= q`` is
    ``T >= q·dur`` and ``X // den >= q`` is ``X >= q·den``. n, reason, path, pm and the
    capacity limits are always exact; lim_tok / lim_cred then hold lower bounds."""
    cdef Py_ssize_t i = c * e.D + d
    cdef const int64_t* kc = e.cls + k * NCOL
    cdef bint firm, tok_lazy = False, cred_lazy = False, capped = False, ok
    cdef int64_t H, s, T, base, free, lim_firm, lim_warm, m, n, left, need, mb
    cdef i128 pm, den = 0, X = 0, prod
    k_settle(e, c, d, t)
    firm = kc[PREEMPT] == 0
    H = e.cd[i].H
    s = e.cd[i].s
    o.lim_ceil = bc_ceiling_room(e.cd[i].b, H)
    T = e.cd[i].T
    base = bc_sustained_room(H, s)
    if e.scal[1] != 0:
        o.lim_tok = MAXV if T > 0 else base
    elif dur == 0:
        return E_ZERODIV
    elif exact or dur < 0:
        o.lim_tok = base + fdiv64(T, dur)
    else:
        tok_lazy = True
    free = k_free(e, d)
    pm = k_price_f(e, d, k, free)
    if pm > I64_MAX or pm < I64_MIN:
        return E_RANGE
    o.pm = <int64_t>pm
    o.lim_cred = MAXV
    if pm != 0:
        den = <i128>dur * pm
        left = e.cr[c].left
        if kc[FREEBROKE] == 0:     # (an unlimited budget, left = MAXV, bounds a cost too)
            if den == 0:
                return E_ZERODIV
            X = <i128>left * HOUR
            cred_lazy = True
        if max_spend >= 0:
            if den == 0:
                return E_ZERODIV
            # min(X1 // den, X2 // den) == min(X1, X2) // den; min(BIG, X2 // den) otherwise
            capped = not cred_lazy
            if capped or <i128>max_spend * HOUR < X:
                X = <i128>max_spend * HOUR
            cred_lazy = True
        if cred_lazy and (exact or den < 0):
            o.lim_cred = fdiv128(X, den)
            if capped and o.lim_cred > MAXV:
                o.lim_cred = MAXV
            cred_lazy = False
    if firm:
        lim_firm = bc_firm_limit(e.cap[d], e.F[d], e.U[d], k_unmet(e, c, d))
        lim_warm = bc_warm_firm(free, lim_firm)
        o.lim_cap = imin(bc_reachable(free, e.oppa[d], e.rev[d], e.prom[d]), lim_firm)
    else:
        lim_warm = bc_warm_opportunistic(free, e.headroom[d])
        o.lim_cap = lim_warm
    o.lim_warm = lim_warm
    m = imin(imin(nmax, o.lim_ceil), o.lim_cap)
    if tok_lazy:
        # lim_tok >= m (it does not bind) iff T >= (m − base)·dur; m − base fits int64
        # (both are below 2**62 in magnitude) and dur > 0 here, so when the product
        # overflows int64 its sign alone decides
        mb = m - base
        if (mb < 0 if mul_over64(mb, dur, &need) else T >= need):
            o.lim_tok = m
        else:
            o.lim_tok = base + fdiv64(T, dur)
            tok_lazy = False
    m = imin(m, o.lim_tok)
    if cred_lazy:
        if m <= 0:
            ok = X >= 0
        else:
            ok = (not capped or m <= MAXV) and not mul_over(m, den, &prod) and X >= prod
        if ok:
            o.lim_cred = m
        else:
            o.lim_cred = fdiv128(X, den)
            if capped and o.lim_cred > MAXV:
                o.lim_cred = MAXV
            cred_lazy = False
    if o.lim_cred < m:
        m = <int64_t>o.lim_cred
    n = imax(0, m)
    o.n = n
    o.reason = R_OK
    if n < nmin:
        if o.lim_ceil <= n:
            o.reason = R_CEILING
        elif o.lim_cap <= n:
            o.reason = R_CAPACITY
        else:
            if tok_lazy:
                o.lim_tok = base + fdiv64(T, dur)
            if o.lim_tok <= n:
                o.reason = R_TOKENS
            else:
                if cred_lazy:
                    o.lim_cred = fdiv128(X, den)
                    if capped and o.lim_cred > MAXV:
                        o.lim_cred = MAXV
                if o.lim_cred <= n:
                    o.reason = R_CREDITS
    o.path = P_WARM if n <= lim_warm else P_RECLAIM
    return 0


cdef inline i128 k_charge(Eng* e, Py_ssize_t c, const int64_t* kc, i128 price) noexcept nogil:
    """What a lease priced ``price`` is charged (SPEC §7): a class that runs free when the
    budget is spent costs nothing when the budget cannot pay it."""
    if kc[FREEBROKE] != 0 and price > e.cr[c].left:
        return 0
    return price


cdef inline int64_t k_never(Eng* e, Py_ssize_t c, Py_ssize_t d, Py_ssize_t k, int64_t nmin,
                            int64_t dur, int64_t pm) noexcept nogil:
    cdef Py_ssize_t i = c * e.D + d
    cdef const int64_t* kc = e.cls + k * NCOL
    cdef int64_t left
    # each rule at its most lenient: nothing held, the pool empty but for the others'
    # guarantees (a firm lease) or the headroom (an opportunistic one)
    if nmin > bc_ceiling_room(e.cd[i].b, 0):
        return R_CEILING
    if kc[PREEMPT] != 0:
        if nmin > bc_warm_opportunistic(e.cap[d], e.headroom[d]):
            return R_CAPACITY
    elif nmin > bc_firm_limit(e.cap[d], 0, e.gsum[d] - e.cd[i].g, 0):
        return R_CAPACITY
    if e.scal[1] == 0 and <i128>bc_excess(0, nmin, e.cd[i].s) * dur > e.cd[i].Bcap:
        return R_TOKENS
    left = e.cr[c].left
    if pm != 0 and left < MAXV and kc[FREEBROKE] == 0 \
            and k_cost(nmin, dur, pm) > <i128>left + e.cr[c].escrow:
        return R_CREDITS
    return R_OK


# -- expiry heap (array-based binary heap ordered by (time, lease id)) ----------------------
cdef inline bint k_before(int64_t at, int64_t aid, int64_t bt, int64_t bid) noexcept nogil:
    return at < bt or (at == bt and aid < bid)


cdef inline void k_heap_push(Eng* e, int64_t t, int64_t lid) noexcept nogil:
    """Push (t, lid); the caller checked ``scal[3] < HC``. The same moves as the reference's
    swaps, made by sliding parents down into a hole (the new entry stays in registers)."""
    cdef Py_ssize_t i = e.scal[3], p
    cdef int64_t* ht = e.heap_t
    cdef int64_t* hi = e.heap_id
    e.scal[3] = i + 1
    while i > 0:
        p = (i - 1) // 2
        if not k_before(t, lid, ht[p], hi[p]):
            break
        ht[i] = ht[p]
        hi[i] = hi[p]
        i = p
    ht[i] = t
    hi[i] = lid


cdef inline void k_heap_pop(Eng* e) noexcept nogil:
    """Pop the top; the caller checked ``scal[3] > 0``. Sift-down with a hole, as above."""
    cdef Py_ssize_t n = e.scal[3] - 1, i = 0, lo, r, m
    cdef int64_t* ht = e.heap_t
    cdef int64_t* hi = e.heap_id
    cdef int64_t xt = ht[n], xid = hi[n], mt, mid
    e.scal[3] = n
    while True:
        lo = 2 * i + 1
        if lo >= n:
            break
        m = lo
        mt = ht[lo]
        mid = hi[lo]
        r = lo + 1
        if r < n and k_before(ht[r], hi[r], mt, mid):
            m = r
            mt = ht[r]
            mid = hi[r]
        if not k_before(mt, mid, xt, xid):
            break
        ht[i] = mt
        hi[i] = mid
        i = m
    ht[i] = xt
    hi[i] = xid


# -- leases (SPEC §4.2, §4.3, §4.6) ----------------------------------------------------------
cdef inline bint k_reusable(Eng* e) noexcept nogil:
    """Whether the next grant takes an ended row: more than ``reuse_after`` wait."""
    return e.lfree[2] >= 0 and e.lfree[1] - e.lfree[0] > e.lfree[2]


cdef inline int64_t k_row_ahead(Eng* e, int64_t a) noexcept nogil:
    """The row the lease ``a`` new leases on takes, if none ends before: an ended row from
    the FIFO while more than ``reuse_after`` wait there (k_new_row), then unused rows."""
    cdef int64_t q = e.lfree[1] - e.lfree[0] - e.lfree[2], h
    if e.lfree[2] < 0 or q <= 0:
        return e.scal[2] + a
    if q > a:
        h = e.lfree[0] + a
        return e.freeq[h % e.L]
    return e.scal[2] + a - q


cdef inline int64_t k_new_lease(Eng* e, Py_ssize_t c, Py_ssize_t d, Py_ssize_t k, int64_t n,
                                bint firm, int64_t state, int64_t t, int64_t dur,
                                int64_t excess, int64_t cost, int64_t intent) noexcept nogil:
    """Take a row (k_new_row) and write a new lease's record to it; its id. Placement
    (start, end, slots) is the caller's."""
    cdef int64_t lid = k_new_row(e), r = lid & ROW_MASK
    e.lr[r].camp = c
    e.lr[r].dim = d
    e.lr[r].units = n
    e.lr[r].firm = firm
    e.lr[r].state = state
    e.lr[r].lcls = k
    e.lr[r].t_grant = t
    e.lr[r].dur = dur
    e.lr[r].excess = excess
    e.lr[r].cost = cost
    e.lr[r].intent = intent
    e.lr[r].revoke_at = 0
    return lid


cdef inline int64_t k_new_row(Eng* e) noexcept nogil:
    """The id of a new lease: the oldest reusable ended row (its generation moved on), or
    the next unused row (the caller checked there is one)."""
    cdef int64_t r, g
    if k_reusable(e):
        r = e.freeq[e.lfree[0] % e.L]
        e.lfree[0] += 1
        g = (e.lr[r].gen + 1) & GEN_MASK
        e.lr[r].gen = g
        return r | (g << ROW_BITS)
    r = e.scal[2]                 # an unused row: generation 0 (rows past the high-water
    e.scal[2] = r + 1             # mark are zero), so its id is the row
    return r


cdef inline void k_free_row(Eng* e, int64_t r) noexcept nogil:
    """Queue an ended lease's row for reuse."""
    if e.lfree[2] >= 0:
        e.freeq[e.lfree[1] % e.L] = r
        e.lfree[1] += 1


cdef inline int64_t k_row(Eng* e, int64_t lid) noexcept nogil:
    """The row of lease ``lid``, or -1 if out of range or stale (its row holds a later
    lease)."""
    cdef int64_t r = lid & ROW_MASK
    if lid < 0 or r >= e.L or e.lr[r].gen != (lid >> ROW_BITS):
        return -1
    return r


cdef inline int k_room(Eng* e, Py_ssize_t d, int64_t n, int64_t leases, bint place) noexcept nogil:
    """What the reference's ``_room`` checks, as an error code (0: room)."""
    if e.scal[2] + leases > e.L and not (leases == 1 and k_reusable(e)):
        return E_LEASES
    if place:
        if e.arena_top[0] + n > e.A:
            return E_ARENA
        if n > e.top[d]:
            return E_SLOTS
    return 0


cdef inline void k_place(Eng* e, int64_t lid, Py_ssize_t d, int64_t n, int64_t t) noexcept nogil:
    cdef int64_t off = e.arena_top[0], top = e.top[d], j, r = lid & ROW_MASK
    cdef const int32_t* fs = e.free_slots + d * e.W + top - 1
    cdef int32_t* ar = e.arena + off
    if n > 0:             # the first two by hand: no vectorised prologue for a small lease
        ar[0] = fs[0]
        if n > 1:
            ar[1] = fs[-1]
            for j in range(2, n):
                ar[j] = fs[-j]
    e.top[d] = top - n
    e.arena_top[0] = off + n
    e.lr[r].slot_off = off
    e.occ[d] += n
    if e.lr[r].firm == 0:
        e.oppa[d] += n
    e.lr[r].state = L_ACTIVE
    e.lr[r].t_start = t
    e.lr[r].t_end = t + e.lr[r].dur
    k_heap_push(e, t + e.lr[r].dur, lid)


cdef inline int64_t k_grant(Eng* e, Py_ssize_t c, Py_ssize_t d, Py_ssize_t k, int64_t n,
                            int64_t dur, int64_t pm, int64_t t, bint starting,
                            int64_t intent) noexcept nogil:
    """Commit a grant; returns the lease id, or an error code before any change."""
    cdef int err = k_room(e, d, n, 1, not starting)
    if err:
        return err
    if not starting and e.scal[3] >= e.HC:
        return E_HEAPFULL
    k_settle(e, c, d, t)
    return k_commit(e, c, d, k, n, dur, pm, t, starting, intent)


cdef inline int64_t k_commit(Eng* e, Py_ssize_t c, Py_ssize_t d, Py_ssize_t k, int64_t n,
                      int64_t dur, int64_t pm, int64_t t, bint starting,
                      int64_t intent) noexcept nogil:
    """k_grant once its checks passed (room, heap) and (c, d) is settled at t: k_admit
    comes here straight from its decision, which checked and settled the same."""
    return k_commit_cost(e, c, d, k, n, dur, k_cost(n, dur, pm), t, starting, intent)


cdef inline int64_t k_commit_cost(Eng* e, Py_ssize_t c, Py_ssize_t d, Py_ssize_t k,
                                  int64_t n, int64_t dur, i128 price, int64_t t,
                                  bint starting, int64_t intent) noexcept nogil:
    """k_commit with the lease's cost at its price already known (``price``:
    ``k_cost(n, dur, pm)``)."""
    cdef Py_ssize_t i = c * e.D + d
    cdef const int64_t* kc = e.cls + k * NCOL
    cdef bint firm
    cdef int64_t H, s, excess, lid, r
    cdef i128 debit
    firm = kc[PREEMPT] == 0
    H = e.cd[i].H
    s = e.cd[i].s
    excess = 0 if e.scal[1] != 0 else bc_excess(H, n, s)
    if excess != 0:       # (a lease within the sustained rate leaves the bucket as it is)
        debit = <i128>excess * dur
        e.cd[i].T = wadd(e.cd[i].T, -debit)
        e.cd[i].tok_debited = wadd(e.cd[i].tok_debited, debit)
    price = k_charge(e, c, kc, price)
    if price != 0:        # (a free lease leaves the credit sums as they are)
        if e.cr[c].left < MAXV:
            e.cr[c].left = wadd(e.cr[c].left, -price)
        e.cr[c].escrow = wadd(e.cr[c].escrow, price)
        e.cr[c].cred_debited = wadd(e.cr[c].cred_debited, price)
    k_hold(e, c, d, n, firm)
    lid = k_new_lease(e, c, d, k, n, firm, L_STARTING if starting else L_ACTIVE, t, dur,
                      excess, <int64_t>price, intent)
    r = lid & ROW_MASK
    if starting:
        e.prom[d] += n
        e.lr[r].t_start = 0
        e.lr[r].t_end = 0
        e.lr[r].slot_off = -1
    else:
        k_place(e, lid, d, n, t)
    return lid


cdef inline int k_activate(Eng* e, int64_t lid, int64_t t) noexcept nogil:
    cdef Py_ssize_t d = e.lr[lid & ROW_MASK].dim
    cdef int64_t n = e.lr[lid & ROW_MASK].units
    cdef int err
    if d < 0 or d >= e.D:
        return E_INDEX
    err = k_room(e, d, n, 0, True)
    if err:
        return err
    if e.scal[3] >= e.HC:
        return E_HEAPFULL
    e.prom[d] -= n
    k_place(e, lid, d, n, t)
    return 0


cdef inline int k_end_lease(Eng* e, int64_t lid, int64_t t, int64_t new_state) noexcept nogil:
    """End lease ``lid`` (the caller checked it is current: ``k_row``) and queue its row
    for reuse."""
    cdef int64_t r = lid & ROW_MASK
    cdef Py_ssize_t c = e.lr[r].camp, d = e.lr[r].dim, i
    cdef int64_t n = e.lr[r].units, state = e.lr[r].state, dur, off, top, j, price, T
    cdef bint firm = e.lr[r].firm != 0
    cdef i128 remaining, refund, room, got, back
    cdef const int32_t* ar
    cdef int32_t* fs
    if state != L_STARTING and state != L_ACTIVE and state != L_REVOKING:
        return E_ENDED
    if c < 0 or c >= e.calloc or d < 0 or d >= e.D:
        return E_INDEX
    if state != L_STARTING:
        if e.top[d] + n > e.W:
            return E_STACK
        if e.lr[r].slot_off < 0 or e.lr[r].slot_off + n > e.A:
            return E_INDEX
    i = c * e.D + d
    k_settle(e, c, d, t)
    dur = e.lr[r].dur
    if state == L_STARTING:
        remaining = dur
        e.prom[d] -= n
    else:
        remaining = <i128>e.lr[r].t_end - t
        if remaining < 0:
            remaining = 0
        e.occ[d] -= n
        if state == L_REVOKING:
            e.rev[d] -= n
        elif not firm:
            e.oppa[d] -= n
        off = e.lr[r].slot_off
        top = e.top[d]
        fs = e.free_slots + d * e.W + top
        ar = e.arena + off + n - 1
        for j in range(n):
            fs[j] = ar[-j]
        e.top[d] = top + n
    refund = <i128>e.lr[r].excess * remaining
    T = e.cd[i].T
    room = <i128>e.cd[i].Bcap - T
    got = refund if refund < room else room
    e.cd[i].T = wadd(T, got)
    e.cd[i].tok_refunded = wadd(e.cd[i].tok_refunded, got)
    e.cd[i].tok_clipped = wadd(e.cd[i].tok_clipped, refund - room if refund > room else 0)
    price = e.lr[r].cost
    if dur == 0:
        return E_ZERODIV
    back = 0 if remaining == 0 else fdiv128(<i128>price * remaining, dur)
    if e.cr[c].left < MAXV:
        e.cr[c].left = wadd(e.cr[c].left, back)
    e.cr[c].escrow = wadd(e.cr[c].escrow, -<i128>price)
    e.cr[c].refunded = wadd(e.cr[c].refunded, back)
    e.cr[c].spent = wadd(e.cr[c].spent, <i128>price - back)
    k_hold(e, c, d, -n, firm)
    e.lr[r].state = new_state
    k_free_row(e, r)
    return 0


cdef inline int k_renew(Eng* e, int64_t lid, int64_t ext, int64_t t, int64_t max_spend,
                        i128* price_out) noexcept nogil:
    """Returns a reason code (>= 0) or an error code (< 0); the price in ``price_out``."""
    cdef int64_t r = lid & ROW_MASK          # (the caller checked lid: k_row)
    cdef Py_ssize_t c = e.lr[r].camp, d = e.lr[r].dim, k = e.lr[r].lcls, i
    cdef int64_t n = e.lr[r].units, end, H, s, ex_new, left
    cdef i128 new_end, delta, pm, price, room, got
    cdef const int64_t* kc
    if c < 0 or c >= e.calloc or d < 0 or d >= e.D or k < 0 or k >= e.K:
        return E_INDEX
    i = c * e.D + d
    kc = e.cls + k * NCOL
    k_settle(e, c, d, t)
    end = e.lr[r].t_end
    H = e.cd[i].H
    s = e.cd[i].s
    new_end = <i128>end + ext
    price_out[0] = 0
    if e.scal[1] != 0:
        ex_new = 0
        delta = 0
    else:
        ex_new = bc_excess(H - n, n, s)       # the lease's n units as the top-most held
        delta = <i128>ex_new * (new_end - t) - <i128>e.lr[r].excess * (<i128>end - t)
        if delta > e.cd[i].T:
            return R_TOKENS
    pm = k_price(e, d, k)
    if pm > I64_MAX or pm < I64_MIN:
        return E_RANGE
    price = k_cost(n, ext, <int64_t>pm)
    left = e.cr[c].left
    price = k_charge(e, c, kc, price)
    price_out[0] = price
    if price > left:              # (an unlimited budget, left = MAXV, bounds a cost too)
        return R_CREDITS
    if 0 <= max_spend and max_spend < price:
        return R_CREDITS
    if e.scal[3] >= e.HC:
        return E_HEAPFULL
    if delta >= 0:
        e.cd[i].T = wadd(e.cd[i].T, -delta)
        e.cd[i].tok_debited = wadd(e.cd[i].tok_debited, delta)
    else:
        room = <i128>e.cd[i].Bcap - e.cd[i].T
        got = -delta if -delta < room else room
        e.cd[i].T = wadd(e.cd[i].T, got)
        e.cd[i].tok_refunded = wadd(e.cd[i].tok_refunded, got)
        e.cd[i].tok_clipped = wadd(e.cd[i].tok_clipped, -delta - room if -delta > room else 0)
    e.lr[r].excess = ex_new
    if left < MAXV:
        e.cr[c].left = wadd(e.cr[c].left, -price)
    e.cr[c].escrow = wadd(e.cr[c].escrow, price)
    e.cr[c].cred_debited = wadd(e.cr[c].cred_debited, price)
    e.lr[r].cost = wadd(e.lr[r].cost, price)
    e.lr[r].dur += ext
    e.lr[r].t_end = <int64_t>new_end
    k_heap_push(e, <int64_t>new_end, lid)
    return R_OK


cdef inline int64_t k_advance(Eng* e, int64_t t, int64_t* out, Py_ssize_t outlen,
                              int* err) noexcept nogil:
    cdef int64_t m = 0, te, lid, s, row
    cdef int r
    while e.scal[3] > 0 and e.heap_t[0] <= t and m < outlen:
        te = e.heap_t[0]
        lid = e.heap_id[0]
        k_heap_pop(e)
        row = lid & ROW_MASK
        if lid < 0 or row >= e.L:
            err[0] = E_INDEX
            return m
        s = e.lr[row].state
        if (e.lr[row].gen == (lid >> ROW_BITS) and (s == L_ACTIVE or s == L_REVOKING)
                and e.lr[row].t_end == te):
            r = k_end_lease(e, lid, te, L_EXPIRED)
            if r < 0:
                err[0] = r
                return m
            out[m] = lid
            m += 1
    return m


# -- the fast path ---------------------------------------------------------------------------
cdef inline int k_admit(Eng* e, Py_ssize_t c, Py_ssize_t d, Py_ssize_t k, int64_t nmin,
                        int64_t nmax, int64_t dur, int64_t max_spend, int64_t t,
                        int64_t intent, int64_t* out) noexcept nogil:
    """One decision; GRANTED/REFUSED/SLOW or an error code. E_HEAPFULL comes back before
    anything but the (idempotent) settle changed: grow the heap and call again."""
    cdef Dec r
    cdef int err = k_decide(e, c, d, k, nmin, nmax, dur, max_spend, t, False, &r)
    cdef int64_t lid, why
    cdef bint priced
    if err:
        return err
    out[0] = r.n
    out[1] = r.reason
    out[2] = -1
    out[3] = 0
    priced = e.cls[k * NCOL + PRICED] != 0
    if r.n >= nmin and r.path == P_WARM:
        err = k_room(e, d, r.n, 1, True)
        if err == 0 and e.scal[3] >= e.HC:
            return E_HEAPFULL
        if priced and r.lim_cap < nmax and r.n < nmax:
            k_shortfall(e, d, nmax - r.n)
        if err:
            return err
        lid = k_commit(e, c, d, k, r.n, dur, r.pm, t, False, intent)   # checked just above
        out[2] = lid
        out[3] = e.lr[lid & ROW_MASK].cost
        return O_GRANTED
    if r.n < nmin:
        why = k_never(e, c, d, k, nmin, dur, r.pm)
        if why != R_OK:
            out[1] = why
            if priced and why == R_CAPACITY:
                k_shortfall(e, d, nmax)
            return O_REFUSED
    return O_SLOW


DEF REC_WIDTH = 11
DEF PF_AHEAD = 6
DEF PF_ROWS = 12


cdef inline int64_t _cap(i128 x) noexcept nogil:
    return MAXV if x > MAXV else <int64_t>x


cdef inline bint k_batch_item(Eng* e, int64_t c, int64_t d, int64_t k, int64_t nmin,
                              int64_t nmax, int64_t dur, int64_t t, int64_t intent,
                              int64_t* buf, int64_t* on, int64_t* orz, int64_t* ol,
                              Py_ssize_t j, int* err) noexcept nogil:
    """Item j of a batch through k_admit: True once decided (its outputs written); False
    to stop at it (a SLOW item, or an error code in ``err``)."""
    cdef int rc = k_admit(e, c, d, k, nmin, nmax, dur, -1, t, intent, buf)
    if rc < 0:
        err[0] = rc
        return False
    if rc == O_SLOW:
        return False
    on[j] = buf[0]
    orz[j] = buf[1]
    ol[j] = buf[2]
    return True


cdef Py_ssize_t k_batch_fast(Eng* e, const int64_t* camps, const int64_t* ks,
                             const int64_t* dims, const int64_t* nmins, const int64_t* nmaxs,
                             const int64_t* durs, int64_t t, int64_t intent0, int64_t* on,
                             int64_t* orz, int64_t* ol, Py_ssize_t j, Py_ssize_t m,
                             int* err) noexcept nogil:
    """k_batch without a journal. An item that is a full warm grant (n = nmax, within its
    ceiling, the warm capacity, its tokens and credits, with room for the lease) is
    committed by k_commit, as k_admit would commit it, after the same checks in a cheaper
    form: its limits are compared with nmax (no reason, no path, no reclaim
    capacity: nmax <= lim_warm <= lim_cap, as oppa >= 0), and its price comes from a cache
    while it cannot change (an unpriced class, or no priced demand: κ = 0), its cost from a
    one-item memo (k_commit_cost takes it). Any other item
    goes through k_admit, exactly as in k_batch (which the differential tests compare with
    the reference, item by item)."""
    cdef int64_t buf[4]
    cdef Py_ssize_t D = e.D, K = e.K, calloc = e.calloc
    cdef bint instant = e.scal[1] != 0, firm = False, cached, fast
    cdef int64_t c, d, k, nmin, nmax, dur, i, H, s, T, base, mb, need, free, lim_warm
    cdef int64_t left, pm = 0, lid, cd = -1, ck = -1, cpm = 0
    cdef int64_t cn = -1, cdur = -1, cpm_cost = -1, pc, pd, pr
    cdef i128 pm128, den, prod, price, dem, ccost = 0
    cdef const int64_t* kc
    buf[0] = buf[1] = buf[2] = buf[3] = 0
    while j < m:
        c = camps[j]
        d = dims[j]
        k = ks[j]
        if <uint64_t>c >= <uint64_t>calloc or <uint64_t>d >= <uint64_t>D \
                or <uint64_t>k >= <uint64_t>K:                  # (negatives wrap high)
            err[0] = E_INDEX
            return j
        nmin = nmins[j]
        nmax = nmaxs[j]
        dur = durs[j]
        if j + PF_AHEAD < m:         # the campaign rows of a later item, from memory now
            pc = camps[j + PF_AHEAD]
            pd = dims[j + PF_AHEAD]
            if <uint64_t>pc < <uint64_t>calloc and <uint64_t>pd < <uint64_t>D:
                prefetch(&e.cd[pc * D + pd].tlast)    # the record's two lines
                prefetch(&e.cd[pc * D + pd].g)
                prefetch(&e.cr[pc])
            # the lease record a grant PF_ROWS on would write (if every item until then is
            # a grant), both lines, fetched for writing
            pr = k_row_ahead(e, PF_ROWS)
            if pr < e.L:
                prefetch_w(&e.lr[pr], 1)
                prefetch_w(&e.lr[pr].t_grant, 1)
        fast = False
        while True:                  # one pass: a break sends the item to k_admit
            if nmax < 1 or nmin > nmax or dur <= 0:
                break
            k_settle(e, c, d, t)
            i = c * D + d
            kc = e.cls + k * NCOL
            firm = kc[PREEMPT] == 0
            H = e.cd[i].H
            if nmax > bc_ceiling_room(e.cd[i].b, H):                   # ceiling
                break
            free = k_free(e, d)
            if firm:
                lim_warm = bc_warm_firm(free, bc_firm_limit(e.cap[d], e.F[d], e.U[d],
                                                            k_unmet(e, c, d)))
            else:
                lim_warm = bc_warm_opportunistic(free, e.headroom[d])
            if nmax > lim_warm:                                     # warm capacity
                break
            s = e.cd[i].s
            T = e.cd[i].T
            base = bc_sustained_room(H, s)
            if instant:                                             # tokens
                if T <= 0 and nmax > base:
                    break
            else:
                mb = nmax - base
                if not (mb < 0 if mul_over64(mb, dur, &need) else T >= need):
                    break
            if d == cd and k == ck:                                 # the price
                pm = cpm
            else:
                pm128 = k_price_f(e, d, k, free)
                if pm128 < 0 or pm128 > I64_MAX:
                    break
                pm = <int64_t>pm128
                dem = <i128>e.ring_sum[d] + e.pend[d]
                cached = kc[PRICED] == 0 or e.NT == 0 or (dem == 0 and e.cong_thr[0] > 0)
                if cached:
                    cd = d
                    ck = k
                    cpm = pm
            left = e.cr[c].left
            price = 0
            if pm != 0:
                if kc[FREEBROKE] == 0:                                  # credits
                    den = <i128>dur * pm
                    if mul_over(nmax, den, &prod) or <i128>left * HOUR < prod:
                        break
                if nmax != cn or dur != cdur or pm != cpm_cost:     # a one-item memo
                    cn = nmax
                    cdur = dur
                    cpm_cost = pm
                    ccost = k_cost(nmax, dur, pm)
                price = ccost
            if e.scal[2] + 1 > e.L and not k_reusable(e):           # room for the lease
                break
            if e.arena_top[0] + nmax > e.A or nmax > e.top[d] or e.scal[3] >= e.HC:
                break
            fast = True
            break
        if fast:
            lid = k_commit_cost(e, c, d, k, nmax, dur, price, t, False, intent0 + j)
            on[j] = nmax
            orz[j] = R_OK
            ol[j] = lid
            j += 1
            continue
        cd = -1                      # the item may add priced demand: drop the cached price
        if not k_batch_item(e, c, d, k, nmin, nmax, dur, t, intent0 + j, buf, on, orz, ol, j,
                            err):
            return j
        j += 1
    return m


cdef Py_ssize_t k_batch(Eng* e, const int64_t* camps, const int64_t* ks, const int64_t* dims,
                        const int64_t* nmins, const int64_t* nmaxs, const int64_t* durs,
                        int64_t t, int64_t intent0, int64_t* on, int64_t* orz, int64_t* ol,
                        Py_ssize_t j, Py_ssize_t m, int* err, int64_t* rec) noexcept nogil:
    cdef int64_t buf[4]
    cdef int64_t before[8]
    cdef int64_t c, d, k
    cdef int r
    cdef Dec x
    cdef Py_ssize_t i
    if rec == NULL:
        return k_batch_fast(e, camps, ks, dims, nmins, nmaxs, durs, t, intent0, on, orz, ol, j,
                            m, err)
    buf[0] = buf[1] = buf[2] = buf[3] = 0
    while j < m:     # with a journal: each item's rule inputs, exact, as the single path's
        c = camps[j]
        d = dims[j]
        k = ks[j]
        if c < 0 or c >= e.calloc or d < 0 or d >= e.D or k < 0 or k >= e.K:
            err[0] = E_INDEX
            return j
        r = k_decide(e, c, d, k, nmins[j], nmaxs[j], durs[j], -1, t, True, &x)
        if r < 0:
            err[0] = r
            return j
        i = c * e.D + d
        before[0] = e.cd[i].T
        before[1] = e.cr[c].left
        before[2] = k_free(e, d)
        before[3] = e.U[d]
        before[4] = _cap(x.lim_ceil)
        before[5] = _cap(x.lim_cap)
        before[6] = _cap(x.lim_tok)
        before[7] = _cap(x.lim_cred)
        if not k_batch_item(e, c, d, k, nmins[j], nmaxs[j], durs[j], t, intent0 + j, buf, on,
                            orz, ol, j, err):
            return j
        for r in range(8):
            rec[j * REC_WIDTH + r] = before[r]
        rec[j * REC_WIDTH + 8] = e.cd[i].T
        rec[j * REC_WIDTH + 9] = e.cr[c].left
        rec[j * REC_WIDTH + 10] = e.cd[i].H
        j += 1
    return m


# -- Python shells ---------------------------------------------------------------------------
cdef int _raise(int err, object what=None) except -1:
    if err == E_LEASES:
        raise IndexError("lease store full: call EngineState.grow_leases first")
    if err == E_ARENA:
        raise IndexError("slot arena full: call EngineState.grow_leases first")
    if err == E_SLOTS:
        raise IndexError(f"too few free slots to place {what}")
    if err == E_STACK:
        raise IndexError(f"lease {what} would overfill its dimension's free-slot stack")
    if err == E_ZERODIV:
        raise ZeroDivisionError("integer division or modulo by zero (duration 0)")
    if err == E_INDEX:
        raise IndexError(f"index out of range: {what}")
    if err == E_RANGE:
        raise OverflowError("price_pm does not fit int64 (price x multipliers too large)")
    if err == E_EMPTY:
        raise IndexError("heap_pop from an empty expiry heap")
    if err == E_ENDED:
        raise IndexError(f"lease {what} has already ended")
    raise RuntimeError(f"bursarcore._engine: unexpected error code {err}")


cdef inline int _cd(_Ctx x, Py_ssize_t c, Py_ssize_t d) except -1:
    if c < 0 or c >= x.e.calloc or d < 0 or d >= x.e.D:
        raise IndexError(f"campaign {c} / dimension {d} out of range")
    return 0


cdef inline int _kk(_Ctx x, Py_ssize_t k) except -1:
    if k < 0 or k >= x.e.K:
        raise IndexError(f"class {k} out of range [0, {x.e.K})")
    return 0


cdef inline int _dd(_Ctx x, Py_ssize_t d) except -1:
    if d < 0 or d >= x.e.D:
        raise IndexError(f"dimension {d} out of range [0, {x.e.D})")
    return 0


cdef inline int64_t _ll(_Ctx x, int64_t lid) except -1:
    """The row of lease ``lid``; IndexError if out of range or stale (see ``k_row``)."""
    cdef int64_t r = k_row(&x.e, lid)
    if r < 0:
        raise IndexError(f"lease {lid} out of range or stale")
    return r


cdef _Ctx _grow_heap(object st):
    st.grow_heap()
    return _ctx(st)


cdef int64_t* _i64_buffer(object out, Py_ssize_t need):
    """The data pointer of a writeable contiguous int64 array of length >= need, or NULL."""
    cdef cnp.ndarray a
    if type(out) is np.ndarray:
        a = <cnp.ndarray>out
        if cnp.PyArray_TYPE(a) == cnp.NPY_INT64 and cnp.PyArray_NDIM(a) == 1 \
                and cnp.PyArray_IS_C_CONTIGUOUS(a) and cnp.PyArray_ISWRITEABLE(a) \
                and cnp.PyArray_DIM(a, 0) >= need:
            return <int64_t*>cnp.PyArray_DATA(a)
    return NULL


def settle(st, Py_ssize_t c, Py_ssize_t d, int64_t t):
    """Bring campaign c's bucket on dimension d to time t (SPEC §4.2)."""
    cdef _Ctx x = _ctx(st)
    _cd(x, c, d)
    k_settle(&x.e, c, d, t)


def unmet(st, Py_ssize_t c, Py_ssize_t d):
    cdef _Ctx x = _ctx(st)
    _cd(x, c, d)
    return k_unmet(&x.e, c, d)


def free_now(st, Py_ssize_t d):
    """Units a warm grant may take now, counting units promised to starting leases."""
    cdef _Ctx x = _ctx(st)
    _dd(x, d)
    return k_free(&x.e, d)


def ring_advance(st, int64_t t):
    """Move the congestion window's ring to the bin holding t."""
    cdef _Ctx x = _ctx(st)
    k_ring_advance(&x.e, t)


def congestion_ppm(st, Py_ssize_t d):
    cdef _Ctx x = _ctx(st)
    _dd(x, d)
    return _pyint(k_cong_ppm(&x.e, d))


def congestion_mult(st, Py_ssize_t d):
    cdef _Ctx x = _ctx(st)
    _dd(x, d)
    return k_cong_mult(&x.e, d)


def price_pm(st, Py_ssize_t d, Py_ssize_t k):
    """Micro-credits per unit-hour for class k on dimension d, at this instant."""
    cdef _Ctx x = _ctx(st)
    _dd(x, d)
    _kk(x, k)
    return _pyint(k_price(&x.e, d, k))


def cost(int64_t n, int64_t dur, int64_t pm):
    """Credits (micro) for n units for dur ns at pm: ceil(n·dur·pm / hour)."""
    return _pyint(k_cost(n, dur, pm))


def decide(st, Py_ssize_t c, Py_ssize_t d, Py_ssize_t k, int64_t nmin, int64_t nmax,
           int64_t dur, int64_t max_spend, int64_t t):
    """Size an intent (SPEC §4.4); see :func:`bursarcore.reference.engine.decide`."""
    cdef _Ctx x = _ctx(st)
    cdef Dec r
    _cd(x, c, d)
    _kk(x, k)
    cdef int err = k_decide(&x.e, c, d, k, nmin, nmax, dur, max_spend, t, True, &r)
    if err:
        _raise(err)
    return (r.n, r.reason, r.path, r.pm,
            (r.lim_ceil, r.lim_cap, r.lim_tok, _pyint(r.lim_cred)))


def decide_keys(st, keys, int64_t t, out_reason):
    """The pending pass's "can anything be granted" probe: row j of ``keys`` (int64, shape
    (K, 6): campaign, dim, class, nmin, duration, max_spend) is decided at nmin = nmax =
    its nmin, in order; returns the first row that could be granted, or -1 with every
    row's reason in ``out_reason``. See :func:`bursarcore.reference.engine.decide_keys`.

    Decided as ``k_admit`` decides (the token and credit limits by comparison unless
    they bind): n and the reason are exact either way. Plain C-contiguous int64 arrays
    are read through their data pointers (the broker's, every probe); anything else
    through typed memoryviews."""
    cdef _Ctx x = _ctx(st)
    cdef const int64_t* kp = NULL
    cdef int64_t* op = NULL
    cdef cnp.ndarray a
    cdef const int64_t[:, ::1] kv
    cdef int64_t[::1] ov
    cdef Py_ssize_t j, K = 0
    if type(keys) is np.ndarray:
        a = <cnp.ndarray>keys
        if cnp.PyArray_TYPE(a) == cnp.NPY_INT64 and cnp.PyArray_NDIM(a) == 2 \
                and cnp.PyArray_IS_C_CONTIGUOUS(a) and cnp.PyArray_DIM(a, 1) == 6:
            K = cnp.PyArray_DIM(a, 0)
            kp = <const int64_t*>cnp.PyArray_DATA(a)
            op = _i64_buffer(out_reason, K)
    if kp == NULL or op == NULL:
        kv = keys
        ov = out_reason
        K = kv.shape[0]
        if kv.shape[1] != 6 or ov.shape[0] < K:
            raise ValueError("decide_keys: keys must have shape (K, 6) and out_reason length >= K")
        if K == 0:
            return -1
        kp = &kv[0, 0]
        op = &ov[0]
    return _decide_keys(x, kp, K, t, op)


cdef Py_ssize_t _decide_keys(_Ctx x, const int64_t* kp, Py_ssize_t K, int64_t t,
                             int64_t* op) except -2:
    cdef Py_ssize_t j, c, d, k
    cdef const int64_t* row
    cdef Dec r
    cdef int err
    for j in range(K):
        row = kp + 6 * j
        c, d, k = row[0], row[1], row[2]
        _cd(x, c, d)
        _kk(x, k)
        err = k_decide(&x.e, c, d, k, row[3], row[3], row[4], row[5], t, False, &r)
        if err:
            _raise(err)
        if r.n >= row[3]:
            return j
        op[j] = r.reason
    return -1


def never(st, Py_ssize_t c, Py_ssize_t d, Py_ssize_t k, int64_t nmin, int64_t dur, int64_t pm):
    """The reason an intent can never be met, or OK (SPEC §4.4)."""
    cdef _Ctx x = _ctx(st)
    _cd(x, c, d)
    _kk(x, k)
    return k_never(&x.e, c, d, k, nmin, dur, pm)


def dim_figures(st, Py_ssize_t d):
    """Dimension d's capacity levels (SPEC §4.1): free units above the warm headroom,
    units a reclaim can reach, and the firm room; see
    :func:`bursarcore.reference.engine.dim_figures`."""
    cdef _Ctx x = _ctx(st)
    if d < 0 or d >= x.e.D:
        raise IndexError(f"dimension {d} out of range")
    cdef Eng* e = &x.e
    cdef int64_t free = k_free(e, d)
    return (bc_warm_opportunistic(free, e.headroom[d]),
            bc_reachable(free, e.oppa[d], e.rev[d], e.prom[d]),
            bc_firm_limit(e.cap[d], e.F[d], e.U[d], 0))


def token_wait(st, Py_ssize_t c, Py_ssize_t d, int64_t n, int64_t dur):
    """ns until c's bucket holds the tokens n more units for dur ns need, refilling at
    s − H; -1 when it holds them now or never refills (SPEC §4.2, §4.5); see
    :func:`bursarcore.reference.engine.token_wait`. The caller settled the bucket."""
    cdef _Ctx x = _ctx(st)
    _cd(x, c, d)
    cdef Eng* e = &x.e
    cdef Py_ssize_t i = c * e.D + d
    cdef int64_t H = e.cd[i].H, s = e.cd[i].s
    cdef i128 need = <i128>bc_excess(H, n, s) * dur - e.cd[i].T
    if e.scal[1] != 0 or s - H <= 0 or need <= 0:
        return -1
    return _pyint((need + (s - H) - 1) // (s - H))


def quote(st, Py_ssize_t c, Py_ssize_t d, Py_ssize_t k, const int64_t[::1] sizes,
          const int64_t[::1] durs, int64_t t):
    """Every (size, duration) cell decided as an intent for exactly that size would be
    (SPEC §4.4, §7), changing nothing but c's settled bucket; see
    :func:`bursarcore.reference.engine.quote`. Returns (cost in micro-credits as float64,
    path codes, reason codes), each of shape (len(sizes), len(durs))."""
    cdef _Ctx x = _ctx(st)
    _cd(x, c, d)
    _kk(x, k)
    cdef Py_ssize_t a, b, na = sizes.shape[0], nb = durs.shape[0]
    cost = np.empty((na, nb), dtype=np.float64)
    path = np.empty((na, nb), dtype=np.int64)
    reason = np.empty((na, nb), dtype=np.int64)
    cdef double[:, ::1] co = cost
    cdef int64_t[:, ::1] pa = path, re = reason
    cdef Dec r
    cdef int err
    cdef int64_t n
    cdef i128 price
    for a in range(na):
        n = sizes[a]
        for b in range(nb):
            err = k_decide(&x.e, c, d, k, n, n, durs[b], -1, t, True, &r)
            if err:
                _raise(err)
            price = k_charge(&x.e, c, x.e.cls + k * NCOL, k_cost(n, durs[b], r.pm))
            co[a, b] = <double>price if -EXACT_DOUBLE <= price <= EXACT_DOUBLE \
                else float(_pyint(price))
            pa[a, b] = P_WARM if n <= r.lim_warm else P_RECLAIM if n <= r.lim_cap else P_COLD
            re[a, b] = (R_CEILING if r.lim_ceil < n else R_CAPACITY if r.lim_cap < n
                        else R_TOKENS if r.lim_tok < n else R_CREDITS if r.lim_cred < n
                        else R_OK)
    return cost, path, reason


def grant(st, Py_ssize_t c, Py_ssize_t d, Py_ssize_t k, int64_t n, int64_t dur, int64_t pm,
          int64_t t, bint starting, int64_t intent):
    """Commit a grant of n units; returns the lease id (see the reference)."""
    cdef _Ctx x = _ctx(st)
    _cd(x, c, d)
    _kk(x, k)
    cdef int64_t lid = k_grant(&x.e, c, d, k, n, dur, pm, t, starting, intent)
    if lid == E_HEAPFULL:
        x = _grow_heap(st)
        lid = k_grant(&x.e, c, d, k, n, dur, pm, t, starting, intent)
    if lid < 0:
        _raise(<int>lid, n)
    return lid


def activate(st, int64_t lid, int64_t t):
    """A starting lease's reclaim grace is over: its promised units become held slots."""
    cdef _Ctx x = _ctx(st)
    _ll(x, lid)
    cdef int err = k_activate(&x.e, lid, t)
    if err == E_HEAPFULL:
        x = _grow_heap(st)
        err = k_activate(&x.e, lid, t)
    if err:
        _raise(err, lid)


def preempt(st, int64_t lid, int64_t t, int64_t grace):
    """Mark an active opportunistic lease revoking; returns its revocation deadline."""
    cdef _Ctx x = _ctx(st)
    cdef int64_t r = _ll(x, lid)
    cdef Py_ssize_t d = x.e.lr[r].dim
    _dd(x, d)
    cdef int64_t n = x.e.lr[r].units
    x.e.lr[r].state = L_REVOKING
    x.e.lr[r].revoke_at = t + grace
    x.e.rev[d] += n
    x.e.oppa[d] -= n
    return t + grace


def end_lease(st, int64_t lid, int64_t t, int64_t new_state):
    """End a lease at t: free its units and slots, refund unused tokens and credits."""
    cdef _Ctx x = _ctx(st)
    _ll(x, lid)
    cdef int err = k_end_lease(&x.e, lid, t, new_state)
    if err:
        _raise(err, lid)


def renew(st, int64_t lid, int64_t ext, int64_t t, int64_t max_spend):
    """Extend an active lease by ext ns (SPEC §4.6); returns ``(reason, cost)``."""
    cdef _Ctx x = _ctx(st)
    cdef i128 price = 0
    _ll(x, lid)
    cdef int r = k_renew(&x.e, lid, ext, t, max_spend, &price)
    if r == E_HEAPFULL:
        x = _grow_heap(st)
        r = k_renew(&x.e, lid, ext, t, max_spend, &price)
    if r < 0:
        _raise(r, lid)
    return r, _pyint(price)


def heap_push(st, int64_t t, int64_t lid):
    cdef _Ctx x = _ctx(st)
    if x.e.scal[3] >= x.e.HC:
        x = _grow_heap(st)
    k_heap_push(&x.e, t, lid)


def heap_pop(st):
    cdef _Ctx x = _ctx(st)
    if x.e.scal[3] <= 0:
        _raise(E_EMPTY)
    k_heap_pop(&x.e)


def next_expiry(st):
    """Time of the earliest scheduled expiry (stale entries included), or -1."""
    cdef _Ctx x = _ctx(st)
    return x.e.heap_t[0] if x.e.scal[3] > 0 else -1


def advance(st, int64_t t, out):
    """Expire active or revoking leases whose end is <= t, in (end, id) order, until ``out``
    is full; writes their ids to ``out`` and returns how many (see the reference)."""
    cdef _Ctx x = _ctx(st)
    cdef int err = 0
    cdef int64_t* p
    cdef int64_t m
    cdef Py_ssize_t n
    if out is not x.adv_obj:
        p = _i64_buffer(out, 0)
        if p == NULL:                       # any other sequence: through a scratch array
            tmp = np.zeros(len(out), dtype=np.int64)
            m = advance(st, t, tmp)
            for n in range(min(m, len(out))):
                out[n] = int(tmp[n])
            return m
        x.adv_obj, x.adv_ptr, x.adv_len = out, p, len(out)
    m = k_advance(&x.e, t, x.adv_ptr, x.adv_len, &err)
    if err:
        _raise(err, "a lease id in the expiry heap")
    return m


def admit(st, Py_ssize_t c, Py_ssize_t d, Py_ssize_t k, int64_t nmin, int64_t nmax,
          int64_t dur, int64_t max_spend, int64_t t, int64_t intent, out):
    """One decision on the fast path; ``out`` (int64[4]) receives (n, reason, lease id,
    cost). Returns GRANTED, REFUSED or SLOW (see the reference)."""
    cdef _Ctx x = _ctx(st)
    cdef int64_t* p
    cdef int64_t local[4]
    cdef int r
    _cd(x, c, d)
    _kk(x, k)
    if out is x.out4_obj:
        p = x.out4_ptr
    else:
        p = _i64_buffer(out, 4)
        if p != NULL:
            x.out4_obj, x.out4_ptr = out, p
        else:
            p = local
    r = k_admit(&x.e, c, d, k, nmin, nmax, dur, max_spend, t, intent, p)
    if r == E_HEAPFULL:
        x = _grow_heap(st)
        r = k_admit(&x.e, c, d, k, nmin, nmax, dur, max_spend, t, intent, p)
    if p == local:
        out[0], out[1], out[2], out[3] = local[0], local[1], local[2], local[3]
    if r < 0:
        _raise(r, nmax)
    return r


cdef const int64_t* _col(object a, Py_ssize_t m, list keep, bint write) except NULL:
    """The data of an int64 column of at least m items; inputs of another type or layout
    are converted (a copy, kept alive in ``keep``), outputs must be int64 arrays."""
    cdef cnp.ndarray arr
    if type(a) is np.ndarray:
        arr = <cnp.ndarray>a
        if cnp.PyArray_TYPE(arr) == cnp.NPY_INT64 and cnp.PyArray_NDIM(arr) == 1 \
                and cnp.PyArray_IS_C_CONTIGUOUS(arr) and (not write or cnp.PyArray_ISWRITEABLE(arr)):
            if cnp.PyArray_DIM(arr, 0) < m:
                raise IndexError("admit_batch: every array needs at least len(camps) items")
            return <const int64_t*>cnp.PyArray_DATA(arr)
    if write:
        raise TypeError("admit_batch: out_n, out_reason and out_lease must be writeable "
                        "contiguous int64 numpy arrays")
    arr = np.ascontiguousarray(a, dtype=np.int64)
    if cnp.PyArray_NDIM(arr) != 1 or cnp.PyArray_DIM(arr, 0) < m:
        raise IndexError("admit_batch: every array needs at least len(camps) items")
    keep.append(arr)
    return <const int64_t*>cnp.PyArray_DATA(arr)


def admit_batch(st, camps, ks, dims, nmins, nmaxs, durs, int64_t t, int64_t intent0, out_n,
                out_reason, out_lease, Py_ssize_t start, rec=None):
    """Decide items start.. in order with :func:`admit` (max_spend -1) in one C loop; stop
    at the first SLOW item and return its index (or len). Item j's intent id is
    intent0 + j. Columns are int64 arrays (others are converted); outputs must be."""
    cdef Py_ssize_t m = len(camps), j = start
    cdef int err = 0
    cdef _Ctx x
    cdef list keep = []
    if j < 0:
        raise IndexError("admit_batch: start must be >= 0")
    if j >= m:
        return m
    cdef const int64_t* pc = _col(camps, m, keep, False)
    cdef const int64_t* pk = _col(ks, m, keep, False)
    cdef const int64_t* pd = _col(dims, m, keep, False)
    cdef const int64_t* p0 = _col(nmins, m, keep, False)
    cdef const int64_t* p1 = _col(nmaxs, m, keep, False)
    cdef const int64_t* pu = _col(durs, m, keep, False)
    cdef int64_t* on = <int64_t*>_col(out_n, m, keep, True)
    cdef int64_t* orz = <int64_t*>_col(out_reason, m, keep, True)
    cdef int64_t* ol = <int64_t*>_col(out_lease, m, keep, True)
    cdef int64_t* prec = NULL
    cdef int64_t[:, ::1] recv
    if rec is not None:
        recv = rec
        if recv.shape[0] < m or recv.shape[1] != REC_WIDTH:
            raise ValueError(f"rec must have shape ({m}, {REC_WIDTH})")
        prec = &recv[0, 0]
    x = _ctx(st)
    while True:
        if m - j >= 64:
            with nogil:
                j = k_batch(&x.e, pc, pk, pd, p0, p1, pu, t, intent0, on, orz, ol, j, m, &err,
                            prec)
        else:
            j = k_batch(&x.e, pc, pk, pd, p0, p1, pu, t, intent0, on, orz, ol, j, m, &err, prec)
        if err == E_HEAPFULL:
            err = 0
            x = _grow_heap(st)
            continue
        if err:
            _raise(err, f"item {j}")
        return j


# -- Broker.acquire's common case in one call (see bursarcore.reference.fastpath) -----------
from cpython.list cimport (PyList_Append, PyList_New, PyList_SET_ITEM, PyList_GET_ITEM,
                           PyList_GET_SIZE)
from cpython.tuple cimport PyTuple_New, PyTuple_SET_ITEM
from cpython.ref cimport Py_INCREF, PyObject
from cpython.set cimport PySet_Discard, PySet_Add, PySet_GET_SIZE
from cpython.dict cimport PyDict_GetItemWithError, PyDict_SetItem, PyDict_Next
from cpython.long cimport PyLong_AsLongLongAndOverflow
from libc.math cimport rint, isfinite, fabs
from libc.stdlib cimport realloc as c_realloc, free as c_free

DEF ADV_CHUNK = 256
DEF PLACE_MAX = 64
DEF MAKER_MAX = 16
DEF J_ACQUIRE = 2
DEF J_EXPIRE = 7
DEF J_ADVANCE = 12

cdef double _MAX_S = <double>(1 << 62) / 1e9
cdef double _MAX_FIXED_S = <double>(1 << 62) / 1e6
cdef object _NONE = None
cdef tuple _REASON_NAMES = tuple(_state.REASONS)
cdef tuple _STATE_NAMES = tuple(_state.LEASE_STATES)
cdef int64_t _R_DEADLINE = _state.REASONS.index("deadline")
cdef object _NAN = float("nan")
cdef dict _OUTCOME_CODE = {"granted": 1, "pending": 2, "refused": 3}
cdef dict _PATH_CODE = {"warm": 1, "reclaim": 2}

# the fields FastAcquire reads and fills, in each dataclass's order (checked at build time)
cdef tuple _INTENT_FIELDS = ("campaign", "units", "duration", "deadline", "max_spend",
                             "service_class", "ttl")
cdef enum:
    IN_CAMPAIGN, IN_UNITS, IN_DURATION, IN_DEADLINE, IN_MAX_SPEND, IN_CLASS, IN_TTL, IN_N
cdef tuple _DECISION_FIELDS = ("outcome", "intent_id", "campaign", "units", "lease", "path",
                               "reason", "retry_after", "cost", "wait", "seq")
cdef tuple _LEASE_FIELDS = ("id", "campaign", "dim", "units", "state", "firm", "service_class",
                            "granted_at", "start", "expiry", "cost", "revoke_at", "intent",
                            "placement", "slots")
cdef tuple _EVENT_FIELDS = ("kind", "time", "campaign", "lease_id", "intent_id", "deadline",
                            "reason", "units")
# ManualClock and its own ``now`` (``return self._t``), taken when the package is imported
# (bursarcore/__init__ imports the broker, which imports this module): a ``now`` patched in
# later is not this one, and FastAcquire then calls it
from .clock import ManualClock as _ManualClock
cdef object _MANUAL_NOW = _ManualClock.__dict__["now"]
# the broker's attributes FastAcquire reads (``_t`` and ``_next_intent``: and writes) as
# entries of its instance dict
cdef tuple _BROKER_ATTRS = ("journal", "durable", "_t_force", "ttl", "clock", "_t",
                            "_next_intent", "_default_cls", "_events", "_deficit_last")


cdef inline bint _count(object v, int64_t* out):
    """A plain int in [0, 2**62) (False: anything else, which the general path handles)."""
    cdef int ovf = 0
    cdef long long x
    if type(v) is not int:
        return False
    x = PyLong_AsLongLongAndOverflow(v, &ovf)
    if ovf or x < 0 or x >= (1LL << 62):
        return False
    out[0] = x
    return True


cdef inline bint _sec_ns(object x, int64_t* out):
    """units.to_ns for a plain float or a small int (False: anything else, or out of range,
    which the general path reports)."""
    cdef double v
    cdef int ovf = 0
    cdef long long i
    if type(x) is float:
        v = <double>x
    elif type(x) is int:
        i = PyLong_AsLongLongAndOverflow(x, &ovf)
        if ovf or not (-(1LL << 52) < i < (1LL << 52)):
            return False
        v = <double>i
    else:
        return False
    if not isfinite(v) or fabs(v) > _MAX_S:
        return False
    out[0] = <int64_t>rint(v * 1e9)
    return True


from libc.stdint cimport INT64_MIN

cdef inline int64_t _dl_field(bint has_dl, int64_t dl):
    """journal.records.deadline_field: -1 for none, INT64_MIN for a deadline of -1 ns."""
    if not has_dl:
        return -1
    return INT64_MIN if dl == -1 else dl


cdef inline object _div(int64_t v, int64_t by):
    """v / by as Python's int true division (correctly rounded): exact in doubles below 2**53."""
    if -(1LL << 53) <= v <= (1LL << 53):
        return (<double>v) / (<double>by)
    return (<object>v) / (<object>by)


cdef extern from *:
    """
    #include "structmember.h"
    static CYTHON_INLINE PyObject* bc_alloc(PyObject* cls) {
        PyTypeObject* tp = (PyTypeObject*)cls;
        return tp->tp_alloc(tp, 0);
    }
    /* where a member descriptor keeps its object field (a __slots__ entry), or -1 */
    static Py_ssize_t bc_slot_offset(PyObject* descr) {
        PyMemberDef* m;
        if (Py_TYPE(descr) != &PyMemberDescr_Type)
            return -1;
        m = ((PyMemberDescrObject*)descr)->d_member;
        if (m->type != T_OBJECT_EX || (m->flags & READONLY) || m->offset <= 0)
            return -1;
        return m->offset;
    }
    /* a slot's value, borrowed (NULL: unset) */
    static CYTHON_INLINE PyObject* bc_slot(PyObject* o, Py_ssize_t off) {
        return *(PyObject**)((char*)o + off);
    }
    /* set a slot of a new object (all its slots are NULL: nothing to release) */
    static CYTHON_INLINE void bc_fill(PyObject* o, Py_ssize_t off, PyObject* v) {
        Py_INCREF(v);
        *(PyObject**)((char*)o + off) = v;
    }
    /* a type's version tag: it changes whenever the type (or a base) is modified; 0: none */
    static CYTHON_INLINE unsigned int bc_type_tag(PyObject* tp) {
        PyTypeObject* t = (PyTypeObject*)tp;
        return PyType_HasFeature(t, Py_TPFLAGS_VALID_VERSION_TAG) ? t->tp_version_tag : 0;
    }
    """
    object bc_alloc(object cls)
    Py_ssize_t bc_slot_offset(object descr)
    PyObject* bc_slot(object o, Py_ssize_t off) noexcept
    void bc_fill(object o, Py_ssize_t off, object v) noexcept
    unsigned int bc_type_tag(object tp) noexcept
    void PyObject_GC_UnTrack(object o)


cdef int _slot_offsets(object cls, tuple names, Py_ssize_t* out) except -1:
    """The offsets of a slotted dataclass's fields, which must be ``names`` in this order."""
    import dataclasses
    if tuple(f.name for f in dataclasses.fields(cls)) != names or len(names) > MAKER_MAX:
        raise TypeError(f"{cls.__name__}: expected the fields {names}")
    cdef Py_ssize_t i, off
    for i, name in enumerate(names):
        off = bc_slot_offset(cls.__dict__.get(name))
        if off < 0:
            raise TypeError(f"{cls.__name__}.{name} is not a slot")
        out[i] = off
    return 0


cdef class _Maker:
    """Builds instances of a frozen, slotted dataclass without its ``__init__``: the object
    is allocated and its slots (all empty) set in place, at the offsets of the class's
    member descriptors, from values computed beforehand — no argument tuple and no
    ``object.__setattr__`` per field. Only for values that cannot form cycles (the object
    is untracked by the cycle collector)."""

    cdef object cls
    cdef Py_ssize_t off[MAKER_MAX]

    def __init__(self, cls, tuple names):
        _slot_offsets(cls, names, self.off)
        self.cls = cls

    cdef inline object new(self):
        return bc_alloc(self.cls)

    cdef inline void put(self, object o, Py_ssize_t i, object v) noexcept:
        bc_fill(o, self.off[i], v)

    cdef inline object done(self, object o):
        # frozen, and holding only atoms and tuples of atoms (a Decision: its Lease): it
        # can never be part of a reference cycle, so the cycle collector need not scan it
        PyObject_GC_UnTrack(o)
        return o


DEF RUN_W = 4            # an expiry queued in a run: end (ns), campaign, lease id, units
DEF RUN_AHEAD = 8        # building events: prefetch the campaign name this many ahead


cdef class _ExpiredRun:
    """``expired`` events that ``FastAcquire._expire`` queued in ``Broker._events``, built
    into :class:`Event` objects only when :meth:`Broker.poll` takes them
    (``FastAcquire.events``). Each is the fields its event needs, copied from the lease's
    row as it expired: by the time of the poll, the row can hold a later lease."""

    cdef object owner          # the FastAcquire that queued it
    cdef int64_t* rec          # RUN_W int64 per event
    cdef Py_ssize_t n, cap

    def __dealloc__(self):
        c_free(self.rec)

    def __len__(self):
        return self.n

    def __repr__(self):
        return f"<{self.n} expired events, built when polled>"

    cdef int reserve(self, Py_ssize_t m) except -1:
        """Room for ``m`` more events."""
        cdef Py_ssize_t cap = self.cap
        cdef int64_t* p
        if self.n + m <= cap:
            return 0
        cap = max(2 * cap, self.n + m, 64)
        p = <int64_t*>c_realloc(self.rec, cap * RUN_W * sizeof(int64_t))
        if p == NULL:
            raise MemoryError()
        self.rec = p
        self.cap = cap
        return 0


cdef class FastAcquire:
    """``Broker.acquire`` for the common case, in one call: an :class:`Intent` of plain
    values, no policy event due (the pending queue is served through
    ``Broker._serve_pending`` when the broker would serve it and a key's wake-up is due;
    with none due that pass would only count itself, done here: ``_serve``), a warm grant, a
    refusal or a decision that needs the policy layer (``Broker._slow``). With a journal
    (one whose ``Journal.add`` is not overridden) it writes the general path's records —
    ``expire`` per expiry, ``advance``, ``acquire`` — and ends the operation with
    ``journal.end_op(durable)`` as ``@_op`` does. Returns the :class:`Decision`, or None
    with nothing changed: the broker then takes its general path (which also raises every
    error). The specification is the broker's general path;
    :mod:`bursarcore.reference.fastpath` is the same algorithm in Python.

    Where the time of a call goes is Python's attribute machinery, so the hot reads skip
    it without caching anything the broker owns:

    * the intent's fields are read at their slot offsets (``Intent`` is slotted; the
      type is checked exactly, so the offsets are those of its member descriptors);
    * the broker's attributes (``_t``, ``_next_intent``, ``journal``, ``clock``...) are
      read and written as entries of its instance dict — what ``getattr``/``setattr`` do
      when the class defines no descriptor of that name and does not override attribute
      access, which is checked when this is built (otherwise: the general path). The
      broker stays the only place they live;
    * a :class:`~bursarcore.clock.ManualClock` (that class exactly, while its ``now`` is
      its own and the instance has none: checked again whenever the type's version tag
      moves, which it does on any change to the class) is read without calling ``now`` —
      it returns ``self._t``;
    * a campaign's default class comes from ``Broker._default_cls`` (set at registration
      from the envelope, which is immutable and registered once), not its envelope;
    * the view of the state (``_Ctx``) is fetched from the state's dict, and let go before
      any call that can grow the state, so ``EngineState._resize`` grows the lease store
      in place (``ndarray.resize`` refuses an array anything else references, and copies
      it instead) — and re-fetched after, as the arrays may have moved.
    """

    cdef object b, st, Intent
    cdef dict bd, sd
    cdef bint plain
    cdef Py_ssize_t ioff[MAKER_MAX]
    cdef _Maker Decision, Lease, Event
    cdef dict cindex, dim_index, cls_index, pending
    cdef list names, dims, cls_names, pyev, opp, revoking, subscribers, draining
    cdef list node_of_slot, node_names
    cdef int64_t adv[ADV_CHUNK]
    # Broker._default_cls as last seen (register replaces the array) and its data
    cdef object dcls
    cdef const int64_t* dcls_p
    cdef Py_ssize_t dcls_n
    # ManualClock, its own now(), the version tag it had when now() was checked (0: not
    # checked or not usable), the last clock read and its instance dict
    cdef object MClock, mc_now, clk
    cdef unsigned int mc_tag
    cdef dict clkd
    # the journal the broker had at the last call, and how to add to it: 0 not at all
    # (Journal.add is overridden: the general path), 1 through its _store_one, 2 straight
    # onto a MemoryJournal's buffered tuples
    cdef object jobj, Journal, MemoryJournal, replace
    cdef int jmode
    cdef bint jend
    # runs of expiries queued in Broker._events since the last poll (_ExpiredRun)
    cdef Py_ssize_t nrun
    # the pending queue's wake-up check done here (_serve): the broker's own _serve_pending
    # and _wake_due (not a subclass's), and the kernel module it was built with
    cdef bint cprobe
    cdef object kmod

    def __init__(self, broker, Decision, Lease, Event, Intent):
        b = broker
        self.b = b
        self.st = b.st
        self.sd = b.st.__dict__
        tp = type(b)
        self.plain = (tp.__getattribute__ is object.__getattribute__
                      and tp.__setattr__ is object.__setattr__
                      and not any(hasattr(tp, name) for name in _BROKER_ATTRS))
        self.bd = b.__dict__
        self.Decision = _Maker(Decision, _DECISION_FIELDS)
        self.Lease = _Maker(Lease, _LEASE_FIELDS)
        self.Event = _Maker(Event, _EVENT_FIELDS)
        self.Intent = Intent
        _slot_offsets(Intent, _INTENT_FIELDS, self.ioff)
        self.cindex, self.dim_index, self.cls_index = b._cindex, b._dim_index, b._cls_index
        self.pending = b._pending
        self.names, self.dims = b._names, list(b.dims)
        self.cls_names = [c.name for c in b.classes]
        self.pyev, self.opp, self.revoking = b._pyev, b._opp_active, b._revoking
        self.subscribers, self.draining = b._subscribers, b._draining
        self.node_of_slot, self.node_names = b._node_of_slot, b._node_names
        self.dcls = None
        import dataclasses
        from .journal import records as _jr
        from .journal.base import Journal
        from .journal.memory import MemoryJournal
        self.MClock, self.mc_now, self.mc_tag = _ManualClock, _MANUAL_NOW, 0
        if (_jr.OP["acquire"], _jr.OP["expire"], _jr.OP["advance"]) != \
                (J_ACQUIRE, J_EXPIRE, J_ADVANCE) or len(_jr.FIELDS) != 33 \
                or (_jr.deadline_field(None), _jr.deadline_field(-1)) != (-1, _dl_field(1, -1)):
            raise RuntimeError("FastAcquire: journal record codes moved")
        self.Journal, self.MemoryJournal, self.replace = Journal, MemoryJournal, dataclasses.replace
        self.jobj = None
        self.jmode = 0
        self.jend = False
        self.nrun = 0
        from .broker import Broker as _Broker
        self.cprobe = (getattr(tp, "_serve_pending", None) is _Broker._serve_pending
                       and getattr(tp, "_wake_due", None) is _Broker._wake_due)
        self.kmod = b._k

    def __call__(self, intent):
        return self.acquire(intent)

    # -- reads that skip the attribute machinery (see the class docstring) ----------------
    cdef inline object _attr(self, str name):
        """``getattr(broker, name)`` for a plain broker: its instance dict's entry."""
        cdef PyObject* p = PyDict_GetItemWithError(self.bd, name)
        if p == NULL:
            return getattr(self.b, name)      # raises the AttributeError
        return <object>p

    cdef inline _Ctx _cx(self):
        """``_ctx(st)``: the cached view, checked against the state's dict entries."""
        cdef PyObject* p = PyDict_GetItemWithError(self.sd, "_cctx")
        cdef PyObject* q
        cdef _Ctx x
        if p != NULL and type(<object>p) is _Ctx:
            x = <_Ctx><object>p
            q = PyDict_GetItemWithError(self.sd, "version")
            if q != NULL and type(<object>q) is int and x.owner == <void*>self.st \
                    and x.version == <Py_ssize_t><object>q:
                return x
        return _ctx(self.st)

    cdef object _now(self, object clock):
        """``clock.now()``; a ManualClock's ``_t`` read directly (see the class docstring)."""
        cdef PyObject* p
        cdef unsigned int tag
        if type(clock) is self.MClock:
            tag = bc_type_tag(self.MClock)
            if tag == 0 or tag != self.mc_tag:
                tag = self._manual_clock_tag()
            if tag != 0:
                if clock is not self.clk:
                    self.clkd = clock.__dict__
                    self.clk = clock
                if PyDict_GetItemWithError(self.clkd, "now") == NULL:
                    p = PyDict_GetItemWithError(self.clkd, "_t")
                    if p != NULL:
                        return <object>p
        return clock.now()

    cdef unsigned int _manual_clock_tag(self):
        """ManualClock's version tag if its ``now`` is still its own (``return self._t``)
        and attribute access is the default; else 0."""
        tp = self.MClock
        self.mc_tag = 0
        if (tp.now is self.mc_now and tp.__getattribute__ is object.__getattribute__
                and not hasattr(tp, "_t")):
            self.mc_tag = bc_type_tag(tp)     # the lookups above gave it one
        return self.mc_tag

    cdef Py_ssize_t _default_class(self, Py_ssize_t c) except -2:
        """The class of campaign c's envelope (``Broker._default_cls[c]``), or -1."""
        cdef object a = self._attr("_default_cls")
        cdef cnp.ndarray arr
        if a is not self.dcls:
            self.dcls = None
            if type(a) is not np.ndarray:
                return -1
            arr = <cnp.ndarray>a
            if cnp.PyArray_TYPE(arr) != cnp.NPY_INT64 or cnp.PyArray_NDIM(arr) != 1 \
                    or not cnp.PyArray_IS_C_CONTIGUOUS(arr):
                return -1
            self.dcls, self.dcls_p, self.dcls_n = a, <const int64_t*>cnp.PyArray_DATA(arr), \
                cnp.PyArray_DIM(arr, 0)
        if c < 0 or c >= self.dcls_n:
            return -1
        return self.dcls_p[c]

    # -- the result objects -----------------------------------------------------------------
    cdef object _decision(self, object outcome, object iid, object name, object units,
                          object lease, object path, object reason, object retry,
                          object cost, object seq):
        cdef _Maker m = self.Decision
        cdef object o = m.new()
        m.put(o, 0, outcome)
        m.put(o, 1, iid)
        m.put(o, 2, name)
        m.put(o, 3, units)
        m.put(o, 4, lease)
        m.put(o, 5, path)
        m.put(o, 6, reason)
        m.put(o, 7, retry)
        m.put(o, 8, cost)
        m.put(o, 9, 0.0)
        m.put(o, 10, seq)
        return m.done(o)

    cdef object _expired(self, object time, object name, object lid, object units):
        cdef _Maker m = self.Event
        cdef object o = m.new()
        m.put(o, 0, "expired")
        m.put(o, 1, time)
        m.put(o, 2, name)
        m.put(o, 3, lid)
        m.put(o, 4, None)
        m.put(o, 5, None)
        m.put(o, 6, None)
        m.put(o, 7, units)
        return m.done(o)

    # -- the journal --------------------------------------------------------------------------
    cdef int _journal_mode(self, object j) except -1:
        """How records reach ``j`` (see ``jmode``), cached per journal object."""
        cdef type tp
        if j is not self.jobj:
            tp = type(j)
            self.jobj = j
            if tp.add is not self.Journal.add:
                self.jmode = 0
            elif (tp._store_one is self.MemoryJournal._store_one
                  and tp._settle is self.MemoryJournal._settle):
                self.jmode = 2
            else:
                self.jmode = 1
            self.jend = tp.end_op is not self.Journal.end_op
        return self.jmode

    cdef int64_t _jadd(self, object j, tuple rec) except? -1:
        """Journal.add of a record already in field order (its seq is rec[0], read from
        ``j.next_seq`` by the caller)."""
        cdef int64_t seq = rec[0]
        cdef list lst
        if self.jmode == 2:
            lst = j._tuples
            PyList_Append(lst, rec)
            if len(lst) >= 4096:
                j._settle()
        else:
            j._store_one(rec, None, seq)
        j.next_seq = seq + 1
        return seq

    cdef int _jend(self, object j) except -1:
        """The end of an operation (what ``@_op`` does)."""
        cdef bint durable = self._attr("durable")
        if durable or self.jend:
            j.end_op(durable)
        return 0

    cdef int _admit(self, Py_ssize_t c, Py_ssize_t d, Py_ssize_t k, int64_t nmin,
                    int64_t nmax, int64_t dur, int64_t spend, int64_t t, int64_t iid,
                    int64_t* buf) except -1:
        """``k_admit`` with room made first (the broker's ``_reserve``) and the expiry heap
        grown if it fills; raises on an engine error. The caller holds no ``_Ctx`` across
        the call (the store can grow in place) and re-fetches it after: growing moves the
        arrays."""
        cdef _Ctx cx = self._cx()
        cdef Eng* e = &cx.e
        cdef int r
        if c < 0 or c >= e.calloc or k < 0 or k >= e.K or d < 0 or d >= e.D:
            raise IndexError(f"campaign {c} / class {k} / dim {d} out of range")
        if (e.scal[2] + 1 > e.L and not k_reusable(e)) or e.arena_top[0] + nmax > e.A \
                or e.scal[3] + 2 > e.HC:
            cx = None
            self.b._reserve(1, nmax)
            cx = self._cx()
            e = &cx.e
        r = k_admit(e, c, d, k, nmin, nmax, dur, spend, t, iid, buf)
        if r == E_HEAPFULL:
            cx = None
            self.st.grow_heap()
            cx = self._cx()
            e = &cx.e
            r = k_admit(e, c, d, k, nmin, nmax, dur, spend, t, iid, buf)
        if r < 0:
            _raise(r, nmax)
        return r

    # -- acquire ----------------------------------------------------------------------------
    cdef int _serve(self, int64_t t) except -1:
        """``Broker._serve_pending(t)`` (queue not empty). When no key's wake-up is due
        (``_due``: ``Broker._wake_due``), that pass would only count itself, which is
        done here; otherwise the broker's method."""
        if self.cprobe and self._attr("_k") is self.kmod \
                and self._attr("_queue_by_key") is True and not self._due(t):
            PyDict_SetItem(self.bd, "_pass", self._attr("_pass") + 1)
            return 0
        self.b._serve_pending(t)
        return 0

    cdef bint _due(self, int64_t t) except -1:
        """``Broker._wake_due(t)``: a key woken, a campaign's lease ended, a token wake time
        reached, or a dimension's free / reachable / firm-room units at a key's threshold
        or its congestion multiplier below one a key failed at (the heaps' tops)."""
        cdef object h, hf, hr, ho, hp
        cdef list lf, lr, lo, lp
        cdef _Ctx cx
        cdef Eng* e
        cdef Py_ssize_t d, D
        cdef int64_t free
        if len(self._attr("_woken")) or len(self._attr("_ended")):
            return True
        h = self._attr("_wtime")
        if h and h[0][0] <= t:
            return True
        lf, lr, lo, lp = (self._attr("_wfree"), self._attr("_wreach"), self._attr("_wroom"),
                          self._attr("_wprice"))
        cx = self._cx()
        e = &cx.e
        D = e.D
        if len(lf) != D or len(lr) != D or len(lo) != D or len(lp) != D:
            return True
        for d in range(D):
            hf, hr, ho, hp = lf[d], lr[d], lo[d], lp[d]
            if hf or hr or ho:
                free = k_free(e, d)
                if hf and hf[0][0] <= bc_warm_opportunistic(free, e.headroom[d]):
                    return True
                if hr and hr[0][0] <= bc_reachable(free, e.oppa[d], e.rev[d], e.prom[d]):
                    return True
                if ho and ho[0][0] <= bc_firm_limit(e.cap[d], e.F[d], e.U[d], 0):
                    return True
            if hp and hp[0][0] < -k_cong_mult(e, d):
                return True
        return False

    cpdef object acquire(self, object intent):
        cdef object b = self.b, v, key, x, jn, cname, um, sc, iid_obj, lid_obj, name, retry
        cdef PyObject* f[IN_N]
        cdef PyObject* p
        cdef PyObject* pk
        cdef PyObject* pv
        cdef Py_ssize_t c, d, k, i, pos = 0
        cdef int64_t nmin, nmax, dur, spend, dl = 0, ttl, t, told, iid, lid
        cdef bint has_dl = False, moved, due
        cdef Py_ssize_t freed
        cdef _Ctx cx
        cdef Eng* e
        cdef int r
        cdef double fv
        cdef int64_t buf[4]
        if type(intent) is not self.Intent or not self.plain:
            return None
        jn = self._attr("journal")
        if jn is not None and self._journal_mode(jn) == 0:
            return None
        if self._attr("_t_force") is not None:
            return None
        # -- the intent, as Broker._acquire reads it (anything unusual: the general path)
        for i in range(IN_N):
            f[i] = bc_slot(intent, self.ioff[i])
            if f[i] == NULL:
                return None
        cname = <object>f[IN_CAMPAIGN]
        um = <object>f[IN_UNITS]
        sc = <object>f[IN_CLASS]
        # (exact str keys: a lookup cannot run Python code or fail)
        if type(cname) is not str or not (sc is None or type(sc) is str):
            return None
        p = PyDict_GetItemWithError(self.cindex, cname)
        if p == NULL:
            return None
        c = <Py_ssize_t><object>p
        if type(um) is not dict or len(<dict>um) != 1:
            return None
        PyDict_Next(um, &pos, &pk, &pv)
        key, v = <object>pk, <object>pv
        if type(key) is not str:
            return None
        p = PyDict_GetItemWithError(self.dim_index, key)
        if p == NULL:
            return None
        d = <Py_ssize_t><object>p
        if sc is None:
            k = self._default_class(c)
            if k < 0:
                return None
        else:
            p = PyDict_GetItemWithError(self.cls_index, sc)
            if p == NULL:
                return None
            k = <Py_ssize_t><object>p
        if type(v) is int:
            if not _count(v, &nmin):
                return None
            nmax = nmin
        elif (type(v) is tuple or type(v) is list) and len(v) == 2:
            if not (_count(v[0], &nmin) and _count(v[1], &nmax)):
                return None
        else:
            return None
        if not _sec_ns(<object>f[IN_DURATION], &dur):
            return None
        x = <object>f[IN_MAX_SPEND]
        if x is None:
            spend = -1
        elif type(x) is float and isfinite(<double>x) and fabs(<double>x) < _MAX_FIXED_S:
            spend = <int64_t>rint(<double>x * 1e6)
        else:
            return None
        x = <object>f[IN_DEADLINE]
        if x is not None:
            if not _sec_ns(x, &dl):
                return None
            has_dl = True
        x = <object>f[IN_TTL]
        if not _sec_ns(self._attr("ttl") if x is None else x, &ttl):
            return None
        # -- the clock, as Broker._now reads it
        x = self._now(self._attr("clock"))
        if type(x) is not float:
            return None
        fv = <double>x
        if not isfinite(fv) or fabs(fv) > _MAX_S:
            return None
        t = <int64_t>rint(fv * 1e9)
        told = self._attr("_t")
        if t < told:
            return None
        # -- Broker._advance(t) when no python event is due and no subscriber would be
        # called back from inside the expiry loop
        if self.pyev and self.pyev[0][0] <= t:
            return None
        for x in self.draining:
            if x:
                return None
        moved = t > told
        cx = self._cx()
        e = &cx.e
        due = e.scal[3] > 0 and e.heap_t[0] <= t
        if due and self.subscribers:
            return None
        if jn is not None:
            cx = None
            return self._acquire_j(jn, c, d, k, nmin, nmax, dur, spend, has_dl, dl, ttl, t,
                                   moved, due, intent)
        k_ring_advance(e, t)
        freed = 0
        if due:
            freed = self._expire(e, t, None)
        cx = None                     # the calls below may grow the state
        if self.pending and (moved or freed):
            self._serve(t)
        if moved and t > <int64_t>self._attr("_t"):  # max(): a subscriber may have moved it
            PyDict_SetItem(self.bd, "_t", t)
        # -- Broker._acquire_ns / _decide_one
        iid_obj = self._attr("_next_intent")
        iid = iid_obj
        if type(iid_obj) is not int:
            iid_obj = iid
        PyDict_SetItem(self.bd, "_next_intent", iid + 1)
        name = self.names[c]
        if has_dl and dl < t:
            return self._decision("refused", iid_obj, name, 0, None, None, "deadline", None,
                                  0.0, -1)
        r = self._admit(c, d, k, nmin, nmax, dur, spend, t, iid, buf)
        if r == O_GRANTED:
            cx = self._cx()               # the state may have grown
            e = &cx.e
            lid = buf[2]
            lid_obj = lid
            if e.lr[lid & ROW_MASK].firm == 0:
                PySet_Add(self.opp[d], lid_obj)
            return self._decision("granted", iid_obj, name, buf[0],
                                  self._lease(e, lid, lid_obj, iid, iid_obj), "warm", None,
                                  None, _div(buf[3], 1000000), -1)
        if r == O_REFUSED:
            retry = None
            if buf[1] == R_TOKENS or buf[1] == R_CAPACITY:
                retry = b._retry_after(c, d, nmin, dur, buf[1])
            return self._decision("refused", iid_obj, name, 0, None, None,
                                  _REASON_NAMES[buf[1]], retry, 0.0, -1)
        return b._slow(iid, c, d, k, nmin, nmax, dur, spend, dl if has_dl else None, ttl, t,
                       intent)

    cdef object _acquire_j(self, object jn, Py_ssize_t c, Py_ssize_t d, Py_ssize_t k,
                           int64_t nmin, int64_t nmax, int64_t dur, int64_t spend, bint has_dl,
                           int64_t dl, int64_t ttl, int64_t t, bint moved, bint due,
                           object intent):
        """The rest of ``acquire`` with a journal (validated, nothing changed yet): the
        records ``Broker._advance`` and ``Broker._acquire_ns`` write, then what ``@_op``
        does at the end of an operation (``journal.end_op``)."""
        cdef object b = self.b, dec, name, deficit, l0, l1, l2, l3, lease_obj, retry, x
        cdef object iid_obj, lid_obj
        cdef bint note = moved and len(self.pending) > 0   # Broker._advance's, up front
        retry = None
        lease_obj = None
        cdef Py_ssize_t freed = 0, i
        cdef int64_t iid, seq, lid, tb, cb, fr, un, rank, units = 0, cost = 0, lease = -1
        cdef int64_t outcome = 0, reason = 0, path = 0
        cdef int r, err
        cdef _Ctx cx
        cdef Eng* e
        cdef Dec dc
        cdef int64_t buf[4]
        try:
            cx = self._cx()
            e = &cx.e
            k_ring_advance(e, t)
            if due:
                freed = self._expire(e, t, jn)
            cx = None
            if self.pending and (moved or freed):
                self._serve(t)
            if moved and t > <int64_t>self._attr("_t"):
                PyDict_SetItem(self.bd, "_t", t)
            if note:
                seq = jn.next_seq
                self._jadd(jn, (seq, t, J_ADVANCE, 4, 0, 0, 0, 0, -1, -1, -1, 0, 0, 0, -1, -1,
                                -1, 0, -1, -1, 0, _NAN, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0))
            # -- Broker._acquire_ns: the request row (rule inputs before the decision)
            iid_obj = self._attr("_next_intent")
            iid = iid_obj
            if type(iid_obj) is not int:
                iid_obj = iid
            PyDict_SetItem(self.bd, "_next_intent", iid + 1)
            cx = self._cx()
            e = &cx.e
            if c >= e.calloc or k >= e.K or d >= e.D:
                raise IndexError(f"campaign {c} / class {k} / dim {d} out of range")
            rank = e.cls[k * NCOL + RANK]
            deficit = self._attr("_deficit_last")[c]
            err = k_decide(e, c, d, k, nmin, nmax, dur, spend, t, True, &dc)
            if err:
                _raise(err)
            i = c * e.D + d
            tb, cb, fr, un = e.cd[i].T, e.cr[c].left, k_free(e, d), e.U[d]
            l0 = imin(dc.lim_ceil, MAXV)
            l1 = imin(dc.lim_cap, MAXV)
            l2 = imin(dc.lim_tok, MAXV)
            l3 = _pyint(dc.lim_cred if dc.lim_cred < MAXV else MAXV)
            # -- Broker._decide_one
            name = self.names[c]
            if has_dl and dl < t:
                outcome, reason = 3, _R_DEADLINE
                dec = None
            else:
                cx = None
                r = self._admit(c, d, k, nmin, nmax, dur, spend, t, iid, buf)
                cx = self._cx()           # the state may have grown
                e = &cx.e
                if r == O_GRANTED:
                    lid = buf[2]
                    lid_obj = lid
                    if e.lr[lid & ROW_MASK].firm == 0:
                        PySet_Add(self.opp[d], lid_obj)
                    outcome, path, units, lease, cost = 1, 1, buf[0], lid, e.lr[lid & ROW_MASK].cost
                    lease_obj = self._lease(e, lid, lid_obj, iid, iid_obj)
                    cx = self._cx()
                    e = &cx.e
                    dec = None
                elif r == O_REFUSED:
                    outcome, reason = 3, buf[1]
                    retry = None
                    if buf[1] == R_TOKENS or buf[1] == R_CAPACITY:
                        cx = None
                        retry = b._retry_after(c, d, nmin, dur, buf[1])
                        cx = self._cx()
                        e = &cx.e
                    dec = None
                else:
                    cx = None
                    dec = b._slow(iid, c, d, k, nmin, nmax, dur, spend,
                                  dl if has_dl else None, ttl, t, intent)
                    outcome = _OUTCOME_CODE.get(dec.outcome, 4)
                    x = dec.reason
                    reason = _state.REASONS.index(x) if x else 0
                    x = dec.path
                    path = _PATH_CODE.get(x or "", 0)
                    units = dec.units
                    x = dec.lease
                    cx = self._cx()
                    e = &cx.e
                    if x is not None:
                        lease = x.id
                        if k_row(e, lease) < 0:
                            raise IndexError(f"lease {lease} out of range or stale")
                        cost = e.lr[lease & ROW_MASK].cost
            # -- Broker._record_decision, journal.add
            i = c * e.D + d
            seq = jn.next_seq
            self._jadd(jn, (seq, t, J_ACQUIRE, outcome, reason, path, rank, 0, d, k, c, nmin,
                            nmax, dur, spend, _dl_field(has_dl, dl), ttl, units, lease, iid,
                            cost, deficit, tb, cb, fr, un, l0, l1, l2, l3, e.cd[i].T, e.cr[c].left,
                            e.cd[i].H))
            if dec is not None:
                return self.replace(dec, seq=seq)
            if outcome == 1:
                return self._decision("granted", iid_obj, name, units, lease_obj, "warm", None,
                                      None, _div(buf[3], 1000000), seq)
            if reason == _R_DEADLINE and has_dl and dl < t:
                return self._decision("refused", iid_obj, name, 0, None, None, "deadline",
                                      None, 0.0, seq)
            return self._decision("refused", iid_obj, name, 0, None, None,
                                  _REASON_NAMES[reason], retry, 0.0, seq)
        finally:
            self._jend(jn)

    cpdef Py_ssize_t expire(self, int64_t t) except? -2:
        """Broker._expire_until(t) when it has no subscriber and no retired slot draining
        (the broker checks): returns how many leases expired, or -1 (nothing done) when its
        journal takes records only through an overridden ``add`` (or the broker is not
        plain: see the class docstring)."""
        if not self.plain:
            return -1
        cdef object jn = self._attr("journal")
        if jn is not None and self._journal_mode(jn) == 0:
            return -1
        cdef _Ctx cx = self._cx()
        if cx.e.scal[3] > 0 and cx.e.heap_t[0] <= t:
            return self._expire(&cx.e, t, jn)
        return 0

    cdef Py_ssize_t _expire(self, Eng* e, int64_t t, object jn) except -1:
        """Broker._expire_until: expire, drop from the victim sets, and queue an
        ``expired`` event per lease (no subscriber: checked by the caller) — as fields in
        the run of expiries ``Broker._events`` ends with (a new one if it ends with
        anything else), built by :meth:`events` when ``poll`` takes them. With a journal,
        one lease at a time, each with its ``expire`` record (state right after it).
        Returns how many expired. Calls no code that can grow the state."""
        cdef int err = 0
        cdef Py_ssize_t m, j, chunk = ADV_CHUNK if jn is None else 1
        cdef int64_t lid, d, c, i, seq, r
        cdef int64_t* q
        cdef list events
        cdef object opp, rv, last
        cdef _ExpiredRun run = None
        cdef Py_ssize_t total = 0
        # the campaigns with queue keys to wake when a lease of theirs ends (Broker._wown),
        # and the set of those that had one (Broker._ended: Broker._lease_ended)
        cdef dict wown = self._attr("_wown")
        cdef set ended = self._attr("_ended") if len(wown) else None
        while True:
            m = k_advance(e, t, self.adv, chunk, &err)
            total += m
            if m:
                if run is None:
                    events = self._attr("_events")
                    j = PyList_GET_SIZE(events)
                    last = events[j - 1] if j else None
                    if type(last) is _ExpiredRun and (<_ExpiredRun>last).owner is self:
                        run = <_ExpiredRun>last
                    else:
                        run = _ExpiredRun.__new__(_ExpiredRun)
                        run.owner = self
                        PyList_Append(events, run)
                        self.nrun += 1
                run.reserve(m)
            for j in range(m):
                lid = self.adv[j]
                r = lid & ROW_MASK
                d = e.lr[r].dim
                if e.lr[r].firm == 0:
                    opp = self.opp[d]
                    if PySet_GET_SIZE(opp):
                        PySet_Discard(opp, lid)
                rv = self.revoking[d]
                if PySet_GET_SIZE(rv):
                    PySet_Discard(rv, lid)
                if ended is not None and e.lr[r].camp in wown:
                    PySet_Add(ended, e.lr[r].camp)
                q = run.rec + run.n * RUN_W
                q[0] = e.lr[r].t_end
                q[1] = e.lr[r].camp
                q[2] = lid
                q[3] = e.lr[r].units
                run.n += 1
                if jn is not None:
                    c = e.lr[r].camp
                    i = c * e.D + d
                    seq = jn.next_seq
                    self._jadd(jn, (seq, e.lr[r].t_end, J_EXPIRE, 0, 0, 0, 0, 0, d, e.lr[r].lcls,
                                    c, 0, 0, 0, -1, -1, -1, e.lr[r].units, lid, e.lr[r].intent,
                                    e.lr[r].cost, _NAN, 0, 0, 0, 0, 0, 0, 0, 0, e.cd[i].T,
                                    e.cr[c].left, e.cd[i].H))
            if err:
                _raise(err, "a lease id in the expiry heap")
            if m < chunk:
                return total

    cpdef list events(self, list ev, bint take):
        """``ev`` (``Broker._events``) with each run of expiries it holds replaced, where
        it stands, by their :class:`Event` objects: a new list (``ev`` itself if it holds
        none). ``take``: ``poll`` is taking them (the broker's list starts anew)."""
        cdef Py_ssize_t i, j, n = PyList_GET_SIZE(ev), total = 0, k = 0, nn
        cdef object x, o, tobj = None
        cdef _ExpiredRun run
        cdef const int64_t* q
        cdef int64_t tprev = 0, c
        cdef list out, names = self.names
        cdef bint runs = False
        if self.nrun == 0:
            return ev
        if take:
            self.nrun = 0
        for i in range(n):
            x = <object>PyList_GET_ITEM(ev, i)
            if type(x) is _ExpiredRun:
                total += (<_ExpiredRun>x).n
                runs = True
            else:
                total += 1
        if not runs:
            return ev
        out = PyList_New(total)
        nn = PyList_GET_SIZE(names)
        for i in range(n):
            x = <object>PyList_GET_ITEM(ev, i)
            if type(x) is not _ExpiredRun:
                Py_INCREF(x)
                PyList_SET_ITEM(out, k, x)
                k += 1
                continue
            run = <_ExpiredRun>x
            q = run.rec
            for j in range(run.n):
                # the name's refcount is a cache miss per event: start it early
                if j + RUN_AHEAD < run.n:
                    c = q[RUN_AHEAD * RUN_W + 1]
                    if 0 <= c < nn:
                        prefetch(PyList_GET_ITEM(names, c))
                if tobj is None or q[0] != tprev:   # expiries come in runs of one end
                    tprev = q[0]
                    tobj = _div(tprev, 1000000000)
                o = self._expired(tobj, names[q[1]], q[2], q[3])
                Py_INCREF(o)
                PyList_SET_ITEM(out, k, o)
                k += 1
                q += RUN_W
        return out

    cdef object _lease(self, Eng* e, int64_t lid, object lid_obj, int64_t iid, object iid_obj):
        """Broker.lease(lid) for an active lease just granted (placement from the slots);
        ``lid_obj`` and ``iid_obj`` are lid and the intent id as Python ints."""
        cdef int64_t r = lid & ROW_MASK
        cdef int64_t d = e.lr[r].dim, n = e.lr[r].units, off = e.lr[r].slot_off, j, q, nd = 0
        cdef int64_t nodes[PLACE_MAX]
        cdef int64_t counts[PLACE_MAX]
        cdef cnp.ndarray owner_arr
        cdef const int64_t* owner
        cdef int64_t no, nslots
        cdef Py_ssize_t m
        cdef tuple slots, placement
        cdef list nn
        cdef object campaign, dim, units, state, firm, cls, granted, start, expiry, cost
        cdef object intent
        cdef _Maker mk = self.Lease
        if n > PLACE_MAX or off < 0:
            return self.b.lease(lid)
        owner_arr = <cnp.ndarray>self.node_of_slot[d]
        owner = <const int64_t*>cnp.PyArray_DATA(owner_arr)
        nslots = cnp.PyArray_DIM(owner_arr, 0)
        slots = PyTuple_New(n)
        for j in range(n):
            q = e.arena[off + j]
            if q < 0 or q >= nslots:
                raise IndexError(f"slot {q} out of range")
            s_obj = <object>q
            Py_INCREF(s_obj)
            PyTuple_SET_ITEM(slots, j, s_obj)
            no = owner[q]
            for m in range(nd):
                if nodes[m] == no:
                    counts[m] += 1
                    break
            else:
                nodes[nd] = no
                counts[nd] = 1
                nd += 1
        nn = self.node_names[d]
        placement = PyTuple_New(nd)
        for j in range(nd):
            p_obj = (nn[nodes[j]], <object>counts[j])
            Py_INCREF(p_obj)
            PyTuple_SET_ITEM(placement, j, p_obj)
        campaign = self.names[e.lr[r].camp]
        dim = self.dims[d]
        units = n
        state = _STATE_NAMES[e.lr[r].state]
        firm = e.lr[r].firm != 0
        cls = self.cls_names[e.lr[r].lcls]
        granted = _div(e.lr[r].t_grant, 1000000000)
        start = _div(e.lr[r].t_start, 1000000000)
        expiry = _div(e.lr[r].t_end, 1000000000)
        cost = _div(e.lr[r].cost, 1000000)
        intent = iid_obj if e.lr[r].intent == iid else <object>e.lr[r].intent
        o = mk.new()
        mk.put(o, 0, lid_obj)
        mk.put(o, 1, campaign)
        mk.put(o, 2, dim)
        mk.put(o, 3, units)
        mk.put(o, 4, state)
        mk.put(o, 5, firm)
        mk.put(o, 6, cls)
        mk.put(o, 7, granted)
        mk.put(o, 8, start)
        mk.put(o, 9, expiry)
        mk.put(o, 10, cost)
        mk.put(o, 11, None)
        mk.put(o, 12, intent)
        mk.put(o, 13, placement)
        mk.put(o, 14, slots)
        return mk.done(o)
