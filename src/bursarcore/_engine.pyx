# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Compiled admission kernel. Private: the broker picks it through ``broker.ENGINES``.

The Cython binding of the C core's engine (``core/src/engine.h``, ``leases.h``,
``admit.h``): each function checks its arguments, points the core at the arrays of an
:class:`~bursarcore.admission.state.EngineState` and turns its error codes into exceptions;
``_cffi_engine`` is the same interface through cffi. The core's declarations and this
module's view of a state (:class:`_Ctx`, ``_ctx``) are in ``_engine.pxd``, which
``_acquire`` (``Broker.acquire``'s common case in one call, ``FastAcquire``) and
``_results`` (the result objects it builds) cimport.

Design
------
* **A cached view of the state.** Fetching ~50 arrays from ``st`` on every call would
  cost more than the decision, so a :class:`_Ctx` holds raw pointers to all of them. It is
  cached on the state (``st.binding_view``) and rebuilt when ``st.version`` moves, which
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
"""

import numpy as np
cimport numpy as cnp
from libc.stdint cimport int32_t, int64_t, uint64_t
from libc.math cimport pow as c_pow

from ._corestatus import engine_error
from .admission import state as _state

cnp.import_array()

cdef i128 EXACT_DOUBLE = 1LL << 53     # integers a double holds exactly

assert (_state.OK, _state.CAPACITY, _state.TOKENS, _state.CREDITS, _state.CEILING) == \
    (R_OK, R_CAPACITY, R_TOKENS, R_CREDITS, R_CEILING)
assert (len(_state.REASONS), len(_state.LIMITS)) == (NREASONS, BC_LIMITS)
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
             "tok_minted", "tok_refunded", "tok_clipped", "up", "Rch", "Xch")
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
    e.resv = _i64(refs, st, "resv", 1, D, 0)
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
    e.gch = _i64(refs, st, "gch", 2, e.calloc, D)
    e.Hsub = _i64(refs, st, "Hsub", 2, e.calloc, D)
    e.bor = <int64_t*>_data(refs, st.bor.reshape(e.calloc, D * _state.BOR_WIDTH), "bor",
                            cnp.NPY_INT64, 2, e.calloc, D * _state.BOR_WIDTH)
    e.sib = _i64(refs, st, "sib", 2, e.calloc + 1, _state.SIB_WIDTH)
    e.fs_par = _i64(refs, st, "fs_par", 1, 2, 0)
    if e.fs_par[0] < 1:
        raise ValueError("EngineState.fs_par[0] (the half-life) must be >= 1")
    e.fs_ok = False
    e.L = st.lrow.shape[0]
    e.lr = <LRow*>_data(refs, st.lrow, "lrow", cnp.NPY_INT64, 2, e.L, _state.L_WIDTH)
    e.lex = NULL               # what each ancestor prepaid per lease: kept once a tree exists
    if st.lex.shape[0]:
        e.lex = _i64(refs, st, "lex", 1, e.L * _state.LEX_WIDTH, 0)
    e.freeq = _i64(refs, st, "freeq", 1, e.L, 0)
    e.lfree = _i64(refs, st, "lfree", 1, 3, 0)
    e.A = st.arena.shape[0]
    e.arena = <int32_t*>_data(refs, st.arena, "arena", cnp.NPY_INT32, 1, e.A, 0)
    e.arena_top = _i64(refs, st, "arena_top", 1, 1, 0)
    e.HC = st.heap_t.shape[0]
    e.heap_t = _i64(refs, st, "heap_t", 1, e.HC, 0)
    e.heap_id = _i64(refs, st, "heap_id", 1, e.HC, 0)
    e.gsum = _i64(refs, st, "gsum", 1, D, 0)      # Σ_c g[c, d] (kept by add_campaign)
    x.refs = refs
    x.version = st.version
    x.owner = <void*>st
    st.binding_view = x
    return x


cdef inline _Ctx _ctx(object st):
    """The cached view of ``st``, rebuilt if its arrays moved (``st.version``)."""
    cdef object o = st.binding_view
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


def path_slack(st, Py_ssize_t c, Py_ssize_t d):
    """SPEC §14.3: Σ slack_v over node c and its ancestors on d (c's unmet guarantee, for a
    flat campaign): a firm grant to c may take capacity − Σ_top R plus this."""
    cdef _Ctx x = _ctx(st)
    _cd(x, c, d)
    return k_path_slack(&x.e, c, d)


def child_room(st, Py_ssize_t p, Py_ssize_t d):
    """SPEC §14.1: the largest guarantee on d a new node under p (< 0: at the top level)
    may have now."""
    cdef _Ctx x = _ctx(st)
    _dd(x, d)
    if p >= 0:
        _cd(x, p, d)
    return k_child_room(&x.e, p, d)


def child_load_room(st, Py_ssize_t p, Py_ssize_t d):
    """SPEC §14.1: the largest guarantee on d a new child of p may have now without raising
    the load of a node on p's path above its sustained rate."""
    cdef _Ctx x = _ctx(st)
    _cd(x, p, d)
    if p < 0:
        raise IndexError(f"node {p} out of range")
    return k_child_load_room(&x.e, p, d)


def link(st, Py_ssize_t c, Py_ssize_t p, int64_t t):
    """SPEC §14.1: node c, just added (``EngineState.add_campaign(..., top=False)``),
    becomes a child of node p at t: guarantees, commitments and holdings of p's path
    follow. The caller checked the nesting and the room (:func:`child_room`)."""
    cdef _Ctx x = _ctx(st)
    if not 0 <= p < c < st.C:
        raise IndexError(f"node {c} / parent {p} out of range")
    if x.e.lex == NULL:
        raise ValueError("EngineState.lex: keep_ancestor_excess() before a node is linked")
    k_link(&x.e, c, p, t)


def make_root(st, Py_ssize_t c):
    """SPEC §14.8: flat campaign c becomes the root of a tree of its own (no children): its
    decisions take the tree's walk, which weighs borrowing; its figures stay a flat
    campaign's. Nothing for a node of a tree."""
    cdef _Ctx x = _ctx(st)
    if not 0 <= c < st.C:
        raise IndexError(f"campaign {c} out of range")
    if x.e.lex == NULL:
        raise ValueError("EngineState.lex: keep_ancestor_excess() before a root is made")
    k_make_root(&x.e, c)


def enlist(st, Py_ssize_t c):
    """SPEC §14.8: top-level node c, just added (``EngineState.add_campaign(...)``), joins
    the list of the top-level nodes, which a borrower among them borrows from (a child joins
    its parent's in :func:`link`)."""
    cdef _Ctx x = _ctx(st)
    if not 0 <= c < st.C or x.e.cd[c * x.e.D].up > 0:
        raise IndexError(f"top-level node {c} out of range")
    if x.e.sib[(c + 1) * _state.SIB_WIDTH + _state.SIB_NEXT] != 0:
        raise ValueError(f"node {c} is listed already")
    k_enlist(&x.e, c, -1)


def change_node(st, Py_ssize_t c, const int64_t[::1] g, const int64_t[::1] s,
                const int64_t[::1] b, const int64_t[::1] Bcap, int64_t budget, int64_t t):
    """SPEC §14.9: node c's envelope becomes (g, s, b, Bcap, budget) at t: its guarantees
    move through its parent's figures and its path's commitments and loads, its buckets
    are settled and clipped to their new sizes, its credits left move by the change of its
    budget. The caller checked every rule."""
    cdef _Ctx x = _ctx(st)
    if not 0 <= c < st.C:
        raise IndexError(f"node {c} out of range")
    if g.shape[0] != x.e.D or s.shape[0] != x.e.D or b.shape[0] != x.e.D \
            or Bcap.shape[0] != x.e.D:
        raise ValueError("one figure per held dimension")
    if x.e.D == 0:
        return
    k_change_node(&x.e, c, &g[0], &s[0], &b[0], &Bcap[0], budget, t)


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
    return (r.n, r.reason, r.path, r.pm, tuple([r.lim[li] for li in range(BC_LIMITS)]))


def decide_levels(st, Py_ssize_t c, Py_ssize_t d, Py_ssize_t k, int64_t nmin, int64_t nmax,
                  int64_t dur, int64_t max_spend, int64_t t):
    """An intent's decision as a journal records it before it is taken (SPEC §9, §14.2):
    the rules' limits, the node of the campaign's path whose limit each is (-1 for
    capacity, the pool's rule) and that node's figure for the rule, each a tuple in
    ``LIMITS`` order; the core's ``k_decide`` and ``k_levels_of``."""
    cdef _Ctx x = _ctx(st)
    cdef Dec r
    cdef int64_t lv[BC_LIMITS]
    cdef int64_t fig[BC_LIMITS]
    _cd(x, c, d)
    _kk(x, k)
    cdef int err = k_decide(&x.e, c, d, k, nmin, nmax, dur, max_spend, t, True, &r, NULL)
    if err:
        _raise(err)
    k_levels_of(&x.e, c, d, k, dur, max_spend, lv, fig)
    return (tuple([r.lim[li] for li in range(BC_LIMITS)]),
            tuple([lv[li] for li in range(BC_LIMITS)]),
            tuple([fig[li] for li in range(BC_LIMITS)]))


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
