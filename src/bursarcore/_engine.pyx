# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# distutils: extra_compile_args = -fwrapv -ffp-contract=off --param=max-inline-insns-single=2000 --param=inline-unit-growth=400
"""Compiled admission kernel. Private: the broker picks it through ``broker.ENGINES``.

The Cython binding of the C core's engine (``core/src/engine.h``, ``leases.h``,
``admit.h``): each function checks its arguments, points the core at the arrays of an
:class:`~bursarcore.admission.state.EngineState` and turns its error codes into exceptions;
``_cffi_engine`` is the same interface through cffi.

Design
------
* **A cached view of the state.** Fetching ~50 arrays from ``st`` on every call would
  cost more than the decision, so a :class:`_Ctx` holds raw pointers to all of them. It is
  cached on the state (``st._cctx``) and rebuilt when ``st.version`` moves, which
  ``EngineState`` bumps on every attribute assignment (array growth, ``C``).
* **The kernels are the C core's.** Every rule is one inline function of
  ``core/src/engine.h`` over the pointer struct ``bc_eng`` (here :c:type:`Eng`), with the
  arithmetic on one campaign's numbers from ``core/src/rules.h``; this module compiles them
  into itself so they inline, and its module-level functions only convert arguments, call
  them, and turn error codes into the exceptions the reference raises. The decision, the
  batch loop, grants, renewals, the "never" checks, ``quote`` and ``token_wait`` call the
  same functions: a rule changed there changes every path.
* **The batch.** ``admit_batch`` runs its items in one C loop (``k_batch``: each item
  through the same ``k_admit`` as a single admission; GIL released for 64 items or more),
  reading its columns through raw pointers, not memoryviews (a buffer acquisition per
  column would cost more than a small batch's decisions). The loop remembers the last
  price while nothing in the batch can move it and the last cost (``bc_memo``), and
  prefetches the campaign records of the item six ahead (a 10 k campaign batch's records
  live in L3) and, for writing, the lease record that the grant twelve on would take.
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
  general path would. The
  decisions, events and state are checked against the general path by
  ``tests/backends/test_acquire_paths_agree.py``. The result objects are the broker's frozen, slotted
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

from ._corestatus import engine_error
from .admission import state as _state

cnp.import_array()

cdef extern from *:
    ctypedef long long i128 "bc_i128"
    ctypedef unsigned long long u128 "bc_u128"

# The admission engine: the C core's (core/src/engine.h), every rule once; this module
# binds it to EngineState's arrays and to Python.
cdef extern from "engine.h" nogil:
    const int64_t HOUR "BC_HOUR_NS"
    const int64_t MAXV "BC_MAXV"
    const int64_t PPM "BC_PPM"
    const int64_t I64_MAX "BC_I64_MAX"
    const int64_t I64_MIN "BC_I64_MIN"
    const int64_t ROW_MASK "BC_ROW_MASK"      # lease id = row | generation << ROW_BITS
    const int64_t GEN_MASK "BC_GEN_MASK"
    const int64_t ROW_BITS "BC_ROW_BITS"
    const double C_FS_REBASE "BC_FS_REBASE"
    const int64_t REC_WIDTH "BC_REC_WIDTH"

    # class-table columns
    enum:
        RANK "BC_K_RANK"
        MULT "BC_K_MULT"
        PRICED "BC_K_PRICED"
        PREEMPT "BC_K_PREEMPT"
        GRACE "BC_K_GRACE"
        FREEBROKE "BC_K_FREEBROKE"
        NCOL "BC_K_NCOL"
    # reason codes, outcomes, lease states, paths (checked against admission.state below)
    enum:
        R_OK "BC_REASON_NONE"
        R_CAPACITY "BC_REASON_CAPACITY"
        R_TOKENS "BC_REASON_TOKENS"
        R_CREDITS "BC_REASON_CREDITS"
        R_CEILING "BC_REASON_CEILING"
    enum:
        O_GRANTED "BC_GRANTED"
        O_REFUSED "BC_REFUSED"
        O_SLOW "BC_DEFERRED"
    enum:
        L_STARTING "BC_LEASE_STARTING"
        L_ACTIVE "BC_LEASE_ACTIVE"
        L_REVOKING "BC_LEASE_REVOKING"
        L_RELEASED "BC_LEASE_RELEASED"
        L_EXPIRED "BC_LEASE_EXPIRED"
        L_REVOKED "BC_LEASE_REVOKED"
    enum:
        P_WARM "BC_P_WARM"
        P_RECLAIM "BC_P_RECLAIM"
        P_COLD "BC_P_COLD"
    # error codes of the kernels (all < 0)
    enum:
        E_LEASES "BC_E_LEASES"
        E_ARENA "BC_E_ARENA"
        E_SLOTS "BC_E_SLOTS"
        E_STACK "BC_E_STACK"
        E_HEAPFULL "BC_E_HEAPFULL"
        E_ZERODIV "BC_E_ZERODIV"
        E_INDEX "BC_E_INDEX"
        E_RANGE "BC_E_RANGE"
        E_EMPTY "BC_E_EMPTY"
        E_ENDED "BC_E_ENDED"

    ctypedef struct CdRow "bc_cdrow":
        int64_t tlast, H, T, s, b, Bcap, acc, tok_debited
        int64_t g, Hf, tok_minted, tok_refunded, tok_clipped, pad0, pad1, pad2
    ctypedef struct CRow "bc_crow":
        int64_t left, escrow, cred_debited, budget, spent, refunded
        double fsS, fsG
    ctypedef struct LRow "bc_lrow":
        int64_t camp, dim, units, firm, state, lcls, t_end, slot_off
        int64_t t_grant, t_start, dur, excess, cost, revoke_at, intent, gen
    ctypedef struct Eng "bc_eng":
        long long D, K, NT, bins, W, calloc, L, A, HC
        long long bin_ns
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
        CdRow* cd
        CRow* cr
        int64_t* fs_par
        long long fs_t
        double fs_w
        int fs_ok
        LRow* lr
        int64_t* freeq
        int64_t* lfree
        int32_t* arena
        int64_t* arena_top
        int64_t* heap_t
        int64_t* heap_id
    ctypedef struct Dec "bc_dec":
        int64_t n, reason, path, pm, lim_ceil, lim_cap, lim_tok
        i128 lim_cred
        int64_t lim_warm
    ctypedef struct Memo "bc_memo":
        pass

    # the arithmetic of SPEC §2 and the rules of §4 on one campaign's numbers (rules.h)
    int64_t imax "bc_max64"(int64_t a, int64_t b)
    int64_t imin "bc_min64"(int64_t a, int64_t b)
    int64_t fdiv64 "bc_fdiv64"(int64_t a, int64_t b)
    int64_t fmod64 "bc_fmod64"(int64_t a, int64_t b)
    i128 fdiv128 "bc_fdiv128"(i128 a, i128 b)
    i128 fdiv_ppm "bc_fdiv_ppm"(i128 a)
    int64_t wadd "bc_wadd"(int64_t a, i128 b)
    int64_t _cap "bc_cap_maxv"(i128 x)
    int64_t bc_excess(int64_t H, int64_t n, int64_t s)
    int64_t bc_sustained_room(int64_t H, int64_t s)
    int64_t bc_ceiling_room(int64_t b, int64_t H)
    int64_t bc_unmet(int64_t g, int64_t Hf)
    int64_t bc_firm_limit(int64_t cap, int64_t F, int64_t U, int64_t unmet_own)
    int64_t bc_warm_firm(int64_t free, int64_t firm_limit)
    int64_t bc_warm_opportunistic(int64_t free, int64_t headroom)
    int64_t bc_reachable(int64_t free, int64_t oppa, int64_t rev, int64_t prom)
    i128 k_cost "bc_cost"(int64_t n, int64_t dur, int64_t pm)
    bint mul_over "k_mul_over"(i128 a, i128 b, i128* r)
    bint mul_over64 "k_mul_over64"(int64_t a, int64_t b, int64_t* r)

    # the engine's kernels (engine.h)
    void k_memo_init(Memo* mo)
    void k_settle(Eng* e, int64_t c, int64_t d, int64_t t)
    int64_t k_unmet(const Eng* e, int64_t c, int64_t d)
    int64_t k_free(const Eng* e, int64_t d)
    double k_fs_weight(Eng* e, int64_t t)
    void k_hold(Eng* e, int64_t c, int64_t d, int64_t delta, int firm)
    void k_ring_advance(Eng* e, int64_t t)
    i128 k_cong_ppm(const Eng* e, int64_t d)
    int64_t k_cong_mult(const Eng* e, int64_t d)
    int64_t k_cong_mult_f(const Eng* e, int64_t d, int64_t free)
    i128 k_price(const Eng* e, int64_t d, int64_t k)
    i128 k_price_f(const Eng* e, int64_t d, int64_t k, int64_t free)
    void k_shortfall(Eng* e, int64_t d, int64_t units)
    i128 k_charge(const Eng* e, int64_t c, const int64_t* kc, i128 price)
    int k_decide(Eng* e, int64_t c, int64_t d, int64_t k, int64_t nmin, int64_t nmax,
                 int64_t dur, int64_t max_spend, int64_t t, int exact, Dec* o, Memo* mo)
    int64_t k_never(const Eng* e, int64_t c, int64_t d, int64_t k, int64_t nmin,
                    int64_t dur, int64_t pm)
    void k_heap_push(Eng* e, int64_t t, int64_t lid)
    void k_heap_pop(Eng* e)
    int64_t k_next_expiry(Eng* e)
    bint k_reusable(const Eng* e)
    int64_t k_row_ahead(const Eng* e, int64_t a)
    int64_t k_row(const Eng* e, int64_t lid)
    int k_room(const Eng* e, int64_t d, int64_t n, int64_t leases, int place)
    int64_t k_grant(Eng* e, int64_t c, int64_t d, int64_t k, int64_t n, int64_t dur,
                    int64_t pm, int64_t t, int starting, int64_t intent)
    int64_t k_commit(Eng* e, int64_t c, int64_t d, int64_t k, int64_t n, int64_t dur,
                     int64_t pm, int64_t t, int starting, int64_t intent, Memo* mo)
    int k_activate(Eng* e, int64_t lid, int64_t t)
    int k_end_lease(Eng* e, int64_t lid, int64_t t, int64_t new_state)
    int k_renew(Eng* e, int64_t lid, int64_t ext, int64_t t, int64_t max_spend,
                i128* price_out)
    int64_t k_advance(Eng* e, int64_t t, int64_t* out, int64_t outlen, int* err)
    int k_admit(Eng* e, int64_t c, int64_t d, int64_t k, int64_t nmin, int64_t nmax,
                int64_t dur, int64_t max_spend, int64_t t, int64_t intent, int64_t* out,
                Memo* mo)
    int64_t k_batch(Eng* e, const int64_t* camps, const int64_t* ks, const int64_t* dims,
                    const int64_t* nmins, const int64_t* nmaxs, const int64_t* durs,
                    int64_t t, int64_t intent0, int64_t* on, int64_t* orz, int64_t* ol,
                    int64_t j, int64_t m, int* err, int64_t* rec)
    void k_sum_guarantees(Eng* e, int64_t C)
    void k_dim_figures(const Eng* e, int64_t d, int64_t* out)
    i128 k_token_wait(const Eng* e, int64_t c, int64_t d, int64_t n, int64_t dur)
    int k_quote_cell(Eng* e, int64_t c, int64_t d, int64_t k, int64_t n, int64_t dur,
                     int64_t t, i128* charge, int64_t* path, int64_t* reason)
    int64_t k_decide_keys(Eng* e, const int64_t* keys, int64_t K, int64_t t,
                          int64_t* out_reason, int* err)
    int k_preempt(Eng* e, int64_t lid, int64_t t, int64_t grace)
    int64_t k_batch_plain(Eng* e, const int64_t* camps, const int64_t* ks,
                          const int64_t* dims, const int64_t* nmins, const int64_t* nmaxs,
                          const int64_t* durs, int64_t t, int64_t intent0, int64_t* on,
                          int64_t* orz, int64_t* ol, int64_t j, int64_t m, int* err)
    int64_t k_batch_rec(Eng* e, const int64_t* camps, const int64_t* ks,
                        const int64_t* dims, const int64_t* nmins, const int64_t* nmaxs,
                        const int64_t* durs, int64_t t, int64_t intent0, int64_t* on,
                        int64_t* orz, int64_t* ol, int64_t j, int64_t m, int* err,
                        int64_t* rec)

cdef extern from *:
    void prefetch "__builtin_prefetch"(const void* p) noexcept nogil
    void prefetch_w "__builtin_prefetch"(const void* p, int rw) noexcept nogil

cdef i128 EXACT_DOUBLE = 1LL << 53     # integers a double holds exactly

assert (_state.OK, _state.CAPACITY, _state.TOKENS, _state.CREDITS, _state.CEILING) == \
    (R_OK, R_CAPACITY, R_TOKENS, R_CREDITS, R_CEILING)
assert (_state.GRANTED, _state.REFUSED, _state.SLOW) == (O_GRANTED, O_REFUSED, O_SLOW)
assert (_state.STARTING, _state.ACTIVE, _state.REVOKING, _state.RELEASED, _state.EXPIRED,
        _state.REVOKED) == (L_STARTING, L_ACTIVE, L_REVOKING, L_RELEASED, L_EXPIRED, L_REVOKED)
assert (_state.WARM, _state.RECLAIM, _state.COLD) == (P_WARM, P_RECLAIM, P_COLD)
assert (_state.MAXV, _state.HOUR_NS, _state.PPM) == (MAXV, HOUR, PPM)
assert (_state.ROW_BITS, _state.ROW_MASK, _state.GEN_MASK) == (ROW_BITS, ROW_MASK, GEN_MASK)
assert _state.FS_REBASE == C_FS_REBASE
cdef double FS_REBASE = _state.FS_REBASE

backend = "compiled"


# -- the view of a state ---------------------------------------------------------------------
_CD_ORDER = ("tlast", "H", "T", "s", "b", "Bcap", "acc", "tok_debited", "g", "Hf",
             "tok_minted", "tok_refunded", "tok_clipped")
_C_ORDER = ("left", "escrow", "cred_debited", "budget", "spent", "refunded")
_L_ORDER = ("camp", "dim", "units", "firm", "state", "lcls", "t_end", "slot_off", "t_grant",
            "t_start", "dur", "excess", "cost", "revoke_at", "intent", "gen")

# a build whose records differ from admission.state's (a stale build): not importable, so
# the broker falls back to the reference (bursarcore._backend.compiled)
if tuple(_state._CD_FIELDS) != _CD_ORDER or tuple(_state._C_FIELDS) != _C_ORDER \
        or tuple(_state._CF_FIELDS) != ("fs_S", "fs_G") or tuple(_state._L_FIELDS) != _L_ORDER \
        or sizeof(CdRow) != _state.CD_WIDTH * 8 or sizeof(CRow) != _state.C_WIDTH * 8 \
        or sizeof(LRow) != _state.L_WIDTH * 8:
    raise ImportError("bursarcore._engine: its campaign or lease records differ from "
                      "admission.state's (a stale build: rebuild the extension)")


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
    k_sum_guarantees(e, C)
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
cdef object _pyint(i128 v):
    """An exact Python int from a 128-bit value."""
    if I64_MIN <= v <= I64_MAX:
        return <int64_t>v
    cdef bint neg = v < 0
    cdef u128 u = <u128>(-v) if neg else <u128>v
    r = ((<object><uint64_t>(u >> 64)) << 64) | <object><uint64_t>u
    return -r if neg else r



# -- Python shells ---------------------------------------------------------------------------
cdef int _raise(int err, object what=None) except -1:
    raise engine_error(err, what)


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
    """Size an intent (SPEC §4.4); the core's ``k_decide``."""
    cdef _Ctx x = _ctx(st)
    cdef Dec r
    _cd(x, c, d)
    _kk(x, k)
    cdef int err = k_decide(&x.e, c, d, k, nmin, nmax, dur, max_spend, t, True, &r, NULL)
    if err:
        _raise(err)
    return (r.n, r.reason, r.path, r.pm,
            (r.lim_ceil, r.lim_cap, r.lim_tok, _pyint(r.lim_cred)))


def decide_keys(st, keys, int64_t t, out_reason):
    """The pending pass's "can anything be granted" probe: row j of ``keys`` (int64, shape
    (K, 6): campaign, dim, class, nmin, duration, max_spend) is decided at nmin = nmax =
    its nmin, in order; returns the first row that could be granted, or -1 with every
    row's reason in ``out_reason``. See the core's ``k_decide_keys``.

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
    cdef int err = 0
    cdef int64_t j = k_decide_keys(&x.e, kp, K, t, op, &err)
    if err:
        _raise(err, f"pending key row {j}")
    return j


def never(st, Py_ssize_t c, Py_ssize_t d, Py_ssize_t k, int64_t nmin, int64_t dur, int64_t pm):
    """The reason an intent can never be met, or OK (SPEC §4.4)."""
    cdef _Ctx x = _ctx(st)
    _cd(x, c, d)
    _kk(x, k)
    return k_never(&x.e, c, d, k, nmin, dur, pm)


def dim_figures(st, Py_ssize_t d):
    """Dimension d's capacity levels (SPEC §4.1): free units above the warm headroom,
    units a reclaim can reach, and the firm room; see
    the core's ``k_dim_figures``."""
    cdef _Ctx x = _ctx(st)
    cdef int64_t out[3]
    if d < 0 or d >= x.e.D:
        raise IndexError(f"dimension {d} out of range")
    k_dim_figures(&x.e, d, out)
    return (out[0], out[1], out[2])


def token_wait(st, Py_ssize_t c, Py_ssize_t d, int64_t n, int64_t dur):
    """ns until c's bucket holds the tokens n more units for dur ns need, refilling at
    s − H; -1 when it holds them now or never refills (SPEC §4.2, §4.5); see
    the core's ``k_token_wait``. The caller settled the bucket."""
    cdef _Ctx x = _ctx(st)
    _cd(x, c, d)
    return _pyint(k_token_wait(&x.e, c, d, n, dur))


def quote(st, Py_ssize_t c, Py_ssize_t d, Py_ssize_t k, const int64_t[::1] sizes,
          const int64_t[::1] durs, int64_t t):
    """Every (size, duration) cell decided as an intent for exactly that size would be
    (SPEC §4.4, §7), changing nothing but c's settled bucket; see
    the core's ``k_quote``. Returns (cost in micro-credits as float64,
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
    cdef int err
    cdef int64_t p, why
    cdef i128 price
    for a in range(na):
        for b in range(nb):
            err = k_quote_cell(&x.e, c, d, k, sizes[a], durs[b], t, &price, &p, &why)
            if err:
                _raise(err)
            co[a, b] = <double>price if -EXACT_DOUBLE <= price <= EXACT_DOUBLE \
                else float(_pyint(price))
            pa[a, b] = p
            re[a, b] = why
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
    _ll(x, lid)
    cdef int err = k_preempt(&x.e, lid, t, grace)
    if err:
        _raise(err, f"dimension of lease {lid}")
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
    """Time of the earliest scheduled expiry, or -1 (stale entries at the heap's top are
    dropped first); the core's ``k_next_expiry``."""
    cdef _Ctx x = _ctx(st)
    return k_next_expiry(&x.e)


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
    r = k_admit(&x.e, c, d, k, nmin, nmax, dur, max_spend, t, intent, p, NULL)
    if r == E_HEAPFULL:
        x = _grow_heap(st)
        r = k_admit(&x.e, c, d, k, nmin, nmax, dur, max_spend, t, intent, p, NULL)
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
        if prec == NULL:
            if m - j >= 64:
                with nogil:
                    j = k_batch_plain(&x.e, pc, pk, pd, p0, p1, pu, t, intent0, on, orz, ol,
                                      j, m, &err)
            else:
                j = k_batch_plain(&x.e, pc, pk, pd, p0, p1, pu, t, intent0, on, orz, ol, j, m,
                                  &err)
        else:
            with nogil:
                j = k_batch_rec(&x.e, pc, pk, pd, p0, p1, pu, t, intent0, on, orz, ol, j, m,
                                &err, prec)
        if err == E_HEAPFULL:
            err = 0
            x = _grow_heap(st)
            continue
        if err:
            _raise(err, f"item {j}")
        return j


# -- Broker.acquire's common case in one call ---------------------------------------------------
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
    error). The specification is the broker's general path.

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
    cdef object q             # the broker's PendingQueue: its public intents and wake-ups
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

    def __init__(self, broker, queue, Decision, Lease, Event, Intent):
        b = broker
        self.b = b
        self.q = queue
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
        self.pending = queue.intents
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
        r = k_admit(e, c, d, k, nmin, nmax, dur, spend, t, iid, buf, NULL)
        if r == E_HEAPFULL:
            cx = None
            self.st.grow_heap()
            cx = self._cx()
            e = &cx.e
            r = k_admit(e, c, d, k, nmin, nmax, dur, spend, t, iid, buf, NULL)
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
            self.q.passes += 1
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
        cdef int64_t fig[3]
        cdef object q = self.q
        if len(q.woken) or len(q.ended):
            return True
        h = q.wtime
        if h and h[0][0] <= t:
            return True
        lf, lr, lo, lp = q.wfree, q.wreach, q.wroom, q.wprice
        cx = self._cx()
        e = &cx.e
        D = e.D
        if len(lf) != D or len(lr) != D or len(lo) != D or len(lp) != D:
            return True
        for d in range(D):
            hf, hr, ho, hp = lf[d], lr[d], lo[d], lp[d]
            if hf or hr or ho:
                k_dim_figures(e, d, fig)
                if hf and hf[0][0] <= fig[0]:
                    return True
                if hr and hr[0][0] <= fig[1]:
                    return True
                if ho and ho[0][0] <= fig[2]:
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
            err = k_decide(e, c, d, k, nmin, nmax, dur, spend, t, True, &dc, NULL)
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
        # the campaigns with queue keys to wake when a lease of theirs ends (the queue's
        # wown), and the set of those that had one (its ended: PendingQueue.lease_ended)
        cdef dict wown = self.q.wown
        cdef set ended = self.q.ended if len(wown) else None
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
