"""cffi binding of the C core's admission engine. Private: the broker picks it through
``broker.ENGINES`` when ``BURSARCORE_BACKEND=cffi``.

The same kernels as the Cython binding (``core/src/engine.h``, compiled into
``bursarcore._cffi_core``), over the same :class:`~bursarcore.admission.state.EngineState`
arrays, with the same functions, signatures, return values and errors as
:mod:`bursarcore._engine`. Plain Python around cffi calls, so it runs wherever cffi does
(PyPy included). Where the Cython binding has its own fast path for ``Broker.acquire``
(``FastAcquire``), this one has none: the broker takes its general path.

The view of a state (a ``bc_eng`` struct of pointers into the arrays) is cached on the
state and rebuilt when ``st.version`` moves, as the Cython binding's is. Not thread-safe,
like the state itself: one caller at a time per state (the broker serialises its calls).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._cffi_core import ffi, lib
from ._corestatus import engine_error
from .admission import state as _state

__all__ = ["settle", "unmet", "path_slack", "child_room", "child_load_room", "link", "enlist",
           "change_node", "free_now", "ring_advance",
           "congestion_ppm", "congestion_mult", "price_pm", "cost", "decide", "decide_keys",
           "never", "dim_figures", "token_wait", "quote", "grant", "activate", "preempt", "end_lease",
           "renew", "heap_push", "heap_pop", "next_expiry", "advance", "admit", "admit_batch"]

backend = "cffi"

_E_HEAPFULL = lib.BC_E_HEAPFULL
_E_EMPTY = lib.BC_E_EMPTY
_I64 = np.dtype(np.int64)
_I32 = np.dtype(np.int32)
_EXACT = 1 << 53

if (lib.BC_E_LEASES, lib.BC_E_HEAPFULL, lib.BC_E_ZERODIV, lib.BC_E_ENDED) != (-1, -5, -6, -10):
    raise ImportError("bursarcore._cffi_engine: the core's error codes differ from "
                      "_corestatus.engine_error's")
if (ffi.sizeof("bc_cdrow") != _state.CD_WIDTH * 8 or ffi.sizeof("bc_crow") != _state.C_WIDTH * 8
        or ffi.sizeof("bc_lrow") != _state.L_WIDTH * 8):
    raise ImportError("bursarcore._cffi_engine: the core's records differ from "
                      "admission.state's (a stale build: rebuild the extension)")


def _wide(w: Any) -> int:
    """A Python int from a (hi, lo) pair."""
    return (int(w.hi) << 64) | int(w.lo)


def _array(a: Any, name: str, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """``a`` if it is a writeable C-contiguous array of ``dtype`` and ``shape`` (-1: any
    length on that axis); the error names the field, as the Cython binding's does."""
    if (type(a) is not np.ndarray or a.dtype != dtype or a.ndim != len(shape)
            or not a.flags.c_contiguous or not a.flags.writeable):
        raise TypeError(f"EngineState.{name} must be a writeable C-contiguous "
                        f"{len(shape)}-d {dtype.name} array")
    if any(want >= 0 and got != want for got, want in zip(a.shape, shape)):
        raise ValueError(f"EngineState.{name} has shape {a.shape}, expected {shape}")
    return a


class _Ctx:
    """A ``bc_eng`` over one state's arrays, and the arrays it points into."""

    __slots__ = ("e", "refs", "version", "owner", "D", "K", "calloc")

    def __init__(self, st: Any) -> None:
        e = ffi.new("bc_eng *")
        refs: list[Any] = []

        def ptr(name: str, shape: tuple[int, ...], ctype: str = "int64_t *",
                dtype: np.dtype = _I64) -> Any:
            a = _array(getattr(st, name), name, dtype, shape)
            refs.append(a)
            return ffi.cast(ctype, a.ctypes.data)

        D = int(st.D)
        e.D = D
        e.K = K = st.cls.shape[0]
        e.NT = NT = st.cong_thr.shape[0]
        e.bins = int(st.bins)
        e.bin_ns = int(st.bin_ns)
        if e.bins < 1 or e.bin_ns < 1:
            raise ValueError("EngineState.bins and bin_ns must be >= 1")
        for name in ("cap", "headroom", "occ", "prom", "rev", "resv", "F", "U", "oppa", "pend",
                     "price", "ring_sum", "top"):
            setattr(e, name, ptr(name, (D,)))
        e.cls = ptr("cls", (K, 6))
        e.cong_thr = ptr("cong_thr", (NT,))
        e.cong_mult = ptr("cong_mult", (NT + 1,))
        e.ring = ptr("ring", (D, int(e.bins)))
        e.scal = ptr("scal", (4,))
        e.free_slots = ptr("free_slots", (D, -1), "int32_t *", _I32)
        e.W = st.free_slots.shape[1]
        e.calloc = calloc = st.cdrow.shape[0]
        C = int(st.C)
        if not 0 <= C <= e.calloc:
            raise ValueError("EngineState.C exceeds its campaign rows")
        e.cd = ptr("cdrow", (calloc, D, _state.CD_WIDTH), "bc_cdrow *")
        e.cr = ptr("crow", (calloc, _state.C_WIDTH), "bc_crow *")
        e.gch = ptr("gch", (calloc, D))
        e.Hsub = ptr("Hsub", (calloc, D))
        e.bor = ptr("bor", (calloc, D, _state.BOR_WIDTH))
        e.sib = ptr("sib", (calloc + 1, _state.SIB_WIDTH))
        e.fs_par = ptr("fs_par", (2,))
        if e.fs_par[0] < 1:
            raise ValueError("EngineState.fs_par[0] (the half-life) must be >= 1")
        e.fs_ok = 0
        e.L = L = st.lrow.shape[0]
        e.lr = ptr("lrow", (L, _state.L_WIDTH), "bc_lrow *")
        # what each ancestor prepaid per lease: kept once a tree of envelopes exists
        e.lex = ptr("lex", (L * _state.LEX_WIDTH,)) if st.lex.shape[0] else ffi.NULL
        e.freeq = ptr("freeq", (L,))
        e.lfree = ptr("lfree", (3,))
        e.A = A = st.arena.shape[0]
        e.arena = ptr("arena", (A,), "int32_t *", _I32)
        e.arena_top = ptr("arena_top", (1,))
        e.HC = HC = st.heap_t.shape[0]
        e.heap_t = ptr("heap_t", (HC,))
        e.heap_id = ptr("heap_id", (HC,))
        e.gsum = ptr("gsum", (D,))                   # Σ_c g[c, d] (kept by add_campaign)
        self.e = e
        self.refs = refs
        self.version = st.version
        self.owner = st
        self.D = D
        self.K = int(e.K)
        self.calloc = int(e.calloc)


def _ctx(st: Any) -> _Ctx:
    x = st.binding_view
    if type(x) is _Ctx and x.owner is st and x.version == st.version:
        return x
    x = _Ctx(st)
    st.binding_view = x
    return x


def _grow_heap(st: Any) -> _Ctx:
    st.grow_heap()
    return _ctx(st)


def _cd(x: _Ctx, c: int, d: int) -> None:
    if not (0 <= c < x.calloc and 0 <= d < x.D):
        raise IndexError(f"campaign {c} / dimension {d} out of range")


def _kk(x: _Ctx, k: int) -> None:
    if not 0 <= k < x.K:
        raise IndexError(f"class {k} out of range [0, {x.K})")


def _dd(x: _Ctx, d: int) -> None:
    if not 0 <= d < x.D:
        raise IndexError(f"dimension {d} out of range [0, {x.D})")


def _ll(x: _Ctx, lid: int) -> int:
    r = lib.bce_row(x.e, lid)
    if r < 0:
        raise IndexError(f"lease {lid} out of range or stale")
    return int(r)


def _i64_out(a: Any, need: int, what: str) -> Any:
    """A pointer into a writeable contiguous int64 array of at least ``need`` items."""
    if (type(a) is not np.ndarray or a.dtype != _I64 or a.ndim != 1
            or not a.flags.c_contiguous or not a.flags.writeable):
        raise TypeError(f"{what} must be writeable contiguous int64 numpy arrays")
    if a.shape[0] < need:
        raise IndexError(f"{what}: every array needs at least len(camps) items")
    return ffi.cast("int64_t *", a.ctypes.data)


def _i64_in(a: Any, need: int, keep: list[Any], what: str) -> Any:
    arr = np.ascontiguousarray(a, dtype=np.int64)
    if arr.ndim != 1 or arr.shape[0] < need:
        raise IndexError(f"{what}: every array needs at least len(camps) items")
    keep.append(arr)
    return ffi.cast("int64_t *", arr.ctypes.data)


def settle(st: Any, c: int, d: int, t: int) -> None:
    """Bring campaign c's bucket on dimension d to time t (SPEC §4.2)."""
    x = _ctx(st)
    _cd(x, c, d)
    lib.bce_settle(x.e, c, d, t)


def unmet(st: Any, c: int, d: int) -> int:
    x = _ctx(st)
    _cd(x, c, d)
    return int(lib.bce_unmet(x.e, c, d))


def path_slack(st: Any, c: int, d: int) -> int:
    """SPEC §14.3: Σ slack_v over node c and its ancestors on d (c's unmet guarantee, for a
    flat campaign): a firm grant to c may take capacity − Σ_top R plus this."""
    x = _ctx(st)
    _cd(x, c, d)
    return int(lib.bce_path_slack(x.e, c, d))


def child_room(st: Any, p: int, d: int) -> int:
    """SPEC §14.1: the largest guarantee on d a new node under p (< 0: at the top level)
    may have now."""
    x = _ctx(st)
    if not 0 <= d < x.D:
        raise IndexError(f"dimension {d} out of range")
    if p >= 0:
        _cd(x, p, d)
    return int(lib.bce_child_room(x.e, p, d))


def child_load_room(st: Any, p: int, d: int) -> int:
    """SPEC §14.1: the largest guarantee on d a new child of p may have now without raising
    the load of a node on p's path above its sustained rate."""
    x = _ctx(st)
    if p < 0:
        raise IndexError(f"node {p} out of range")
    _cd(x, p, d)
    return int(lib.bce_child_load_room(x.e, p, d))


def link(st: Any, c: int, p: int, t: int) -> None:
    """SPEC §14.1: node c, just added (``EngineState.add_campaign(..., top=False)``),
    becomes a child of node p at t: guarantees, commitments and holdings of p's path
    follow. The caller checked the nesting and the room (:func:`child_room`)."""
    x = _ctx(st)
    if not 0 <= p < c < st.C:
        raise IndexError(f"node {c} / parent {p} out of range")
    if x.e.lex == ffi.NULL:
        raise ValueError("EngineState.lex: keep_ancestor_excess() before a node is linked")
    lib.bce_link(x.e, c, p, t)


def make_root(st: Any, c: int) -> None:
    """SPEC §14.8: flat campaign c becomes the root of a tree of its own (no children): its
    decisions take the tree's walk, which weighs borrowing; its figures stay a flat
    campaign's. Nothing for a node of a tree."""
    x = _ctx(st)
    if not 0 <= c < st.C:
        raise IndexError(f"campaign {c} out of range")
    if x.e.lex == ffi.NULL:
        raise ValueError("EngineState.lex: keep_ancestor_excess() before a root is made")
    lib.bce_make_root(x.e, c)


def enlist(st: Any, c: int) -> None:
    """SPEC §14.8: top-level node c, just added (``EngineState.add_campaign(...)``), joins
    the list of the top-level nodes, which a borrower among them borrows from (a child joins
    its parent's in :func:`link`)."""
    x = _ctx(st)
    if not 0 <= c < st.C or x.e.cd[c * x.D].up > 0:
        raise IndexError(f"top-level node {c} out of range")
    if x.e.sib[(c + 1) * _state.SIB_WIDTH + _state.SIB_NEXT] != 0:
        raise ValueError(f"node {c} is listed already")
    lib.bce_enlist(x.e, c, -1)


def change_node(st: Any, c: int, g: Any, s: Any, b: Any, Bcap: Any, budget: int,
                t: int) -> None:
    """SPEC §14.9: node c's envelope becomes (g, s, b, Bcap, budget) at t: its guarantees
    move through its parent's figures and its path's commitments and loads, its buckets
    are settled and clipped to their new sizes, its credits left move by the change of its
    budget. The caller checked every rule."""
    x = _ctx(st)
    if not 0 <= c < st.C:
        raise IndexError(f"node {c} out of range")
    arrs = [np.ascontiguousarray(a, dtype=np.int64) for a in (g, s, b, Bcap)]
    if any(a.shape != (x.D,) for a in arrs):
        raise ValueError("one figure per held dimension")
    if x.D == 0:
        return
    ptrs = [ffi.cast("const int64_t *", ffi.from_buffer(a)) for a in arrs]
    lib.bce_change_node(x.e, c, ptrs[0], ptrs[1], ptrs[2], ptrs[3], budget, t)


def free_now(st: Any, d: int) -> int:
    """Units a warm grant may take now, counting units promised to starting leases."""
    x = _ctx(st)
    _dd(x, d)
    return int(lib.bce_free(x.e, d))


def ring_advance(st: Any, t: int) -> None:
    """Move the congestion window's ring to the bin holding t."""
    lib.bce_ring_advance(_ctx(st).e, t)


def congestion_ppm(st: Any, d: int) -> int:
    x = _ctx(st)
    _dd(x, d)
    return _wide(lib.bce_cong_ppm(x.e, d))


def congestion_mult(st: Any, d: int) -> int:
    x = _ctx(st)
    _dd(x, d)
    return int(lib.bce_cong_mult(x.e, d))


def price_pm(st: Any, d: int, k: int) -> int:
    """Micro-credits per unit-hour for class k on dimension d, at this instant."""
    x = _ctx(st)
    _dd(x, d)
    _kk(x, k)
    return _wide(lib.bce_price(x.e, d, k))


def cost(n: int, dur: int, pm: int) -> int:
    """Credits (micro) for n units for dur ns at pm: ceil(n·dur·pm / hour)."""
    return _wide(lib.bce_cost(n, dur, pm))


def decide(st: Any, c: int, d: int, k: int, nmin: int, nmax: int, dur: int, max_spend: int,
           t: int) -> tuple[int, int, int, int, tuple[int, ...]]:
    """Size an intent (SPEC §4.4); the core's ``k_decide``."""
    x = _ctx(st)
    _cd(x, c, d)
    _kk(x, k)
    out = ffi.new("int64_t[]", 4 + lib.BC_LIMITS)
    err = lib.bce_decide(x.e, c, d, k, nmin, nmax, dur, max_spend, t, out)
    if err:
        raise engine_error(err)
    return (int(out[0]), int(out[1]), int(out[2]), int(out[3]),
            tuple(int(out[4 + i]) for i in range(lib.BC_LIMITS)))


def decide_levels(st: Any, c: int, d: int, k: int, nmin: int, nmax: int, dur: int,
                  max_spend: int, t: int) -> tuple[tuple[int, ...], tuple[int, ...],
                                                   tuple[int, ...]]:
    """An intent's decision as a journal records it before it is taken (SPEC §9, §14.2):
    the rules' limits, the node of the campaign's path whose limit each is (-1 for
    capacity) and that node's figure for the rule; the core's ``k_decide`` and
    ``k_levels_of``."""
    x = _ctx(st)
    _cd(x, c, d)
    _kk(x, k)
    L = lib.BC_LIMITS
    out = ffi.new("int64_t[]", 3 * L)
    err = lib.bce_decide_levels(x.e, c, d, k, nmin, nmax, dur, max_spend, t, out)
    if err:
        raise engine_error(err)
    return (tuple(int(out[i]) for i in range(L)), tuple(int(out[L + i]) for i in range(L)),
            tuple(int(out[2 * L + i]) for i in range(L)))


def decide_keys(st: Any, keys: Any, t: int, out_reason: Any) -> int:
    """The pending pass's probe (; the core's ``k_decide_keys``):
    the first row of ``keys`` (K × 6) that could be granted, or -1 with every row's
    reason in ``out_reason``."""
    x = _ctx(st)
    kv = np.ascontiguousarray(keys, dtype=np.int64)
    if kv.ndim != 2 or kv.shape[1] != 6 or len(out_reason) < kv.shape[0]:
        raise ValueError("decide_keys: keys must have shape (K, 6) and out_reason length >= K")
    K = kv.shape[0]
    if K == 0:
        return -1
    plain = (type(out_reason) is np.ndarray and out_reason.dtype == _I64
             and out_reason.ndim == 1 and out_reason.flags.c_contiguous
             and out_reason.flags.writeable)
    ov = out_reason if plain else np.zeros(K, dtype=np.int64)
    err = ffi.new("int *")
    j = int(lib.bce_decide_keys(x.e, ffi.cast("int64_t *", kv.ctypes.data), K, t,
                                ffi.cast("int64_t *", ov.ctypes.data), err))
    if not plain:
        for i in range(K if j < 0 else j):
            out_reason[i] = int(ov[i])
    if err[0]:
        raise engine_error(err[0], f"pending key row {j}")
    return j


def never(st: Any, c: int, d: int, k: int, nmin: int, dur: int, pm: int) -> int:
    """The reason an intent can never be met, or OK (SPEC §4.4)."""
    x = _ctx(st)
    _cd(x, c, d)
    _kk(x, k)
    return int(lib.bce_never(x.e, c, d, k, nmin, dur, pm))


def dim_figures(st: Any, d: int) -> tuple[int, int, int]:
    """Dimension d's capacity levels (SPEC §4.1); see
    the core's ``k_dim_figures``."""
    x = _ctx(st)
    if not 0 <= d < x.D:
        raise IndexError(f"dimension {d} out of range")
    out = ffi.new("int64_t[3]")
    lib.bce_dim_figures(x.e, d, out)
    return int(out[0]), int(out[1]), int(out[2])


def token_wait(st: Any, c: int, d: int, n: int, dur: int) -> int:
    """ns until c's bucket holds the tokens n more units for dur ns need; -1 when it holds
    them now or never refills (SPEC §4.2, §4.5). The caller settled the bucket."""
    x = _ctx(st)
    _cd(x, c, d)
    return _wide(lib.bce_token_wait(x.e, c, d, n, dur))


def quote(st: Any, c: int, d: int, k: int, sizes: Any, durs: Any,
          t: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every (size, duration) cell decided as an intent for exactly that size would be
    (SPEC §4.4, §7); the core's ``k_quote``."""
    x = _ctx(st)
    _cd(x, c, d)
    _kk(x, k)
    sv = np.ascontiguousarray(sizes, dtype=np.int64)
    dv = np.ascontiguousarray(durs, dtype=np.int64)
    na, nb = sv.shape[0], dv.shape[0]
    co = np.empty((na, nb), dtype=np.float64)
    path = np.empty((na, nb), dtype=np.int64)
    reason = np.empty((na, nb), dtype=np.int64)
    wide_at = ffi.new("int64_t *", 0)
    wide = ffi.new("bce_wide *")
    ps, pd_ = ffi.cast("int64_t *", sv.ctypes.data), ffi.cast("int64_t *", dv.ctypes.data)
    pc = ffi.cast("double *", co.ctypes.data)
    pp = ffi.cast("int64_t *", path.ctypes.data)
    pr = ffi.cast("int64_t *", reason.ctypes.data)
    flat = co.reshape(-1)
    while True:
        err = lib.bce_quote(x.e, c, d, k, ps, na, pd_, nb, t, pc, pp, pr, wide_at, wide)
        if err:
            raise engine_error(err)
        at = int(wide_at[0])
        if at < 0:
            return co, path, reason
        flat[at] = float(_wide(wide[0]))     # a charge no double holds exactly, rounded once
        wide_at[0] = at + 1


def grant(st: Any, c: int, d: int, k: int, n: int, dur: int, pm: int, t: int,
          starting: bool, intent: int) -> int:
    """Commit a grant of n units; returns the lease id (see the reference)."""
    x = _ctx(st)
    _cd(x, c, d)
    _kk(x, k)
    lid = lib.bce_grant(x.e, c, d, k, n, dur, pm, t, bool(starting), intent)
    if lid == _E_HEAPFULL:
        x = _grow_heap(st)
        lid = lib.bce_grant(x.e, c, d, k, n, dur, pm, t, bool(starting), intent)
    if lid < 0:
        raise engine_error(lid, n)
    return int(lid)


def activate(st: Any, lid: int, t: int) -> None:
    """A starting lease's reclaim grace is over: its promised units become held slots."""
    x = _ctx(st)
    _ll(x, lid)
    err = lib.bce_activate(x.e, lid, t)
    if err == _E_HEAPFULL:
        x = _grow_heap(st)
        err = lib.bce_activate(x.e, lid, t)
    if err:
        raise engine_error(err, lid)


def preempt(st: Any, lid: int, t: int, grace: int) -> int:
    """Mark an active opportunistic lease revoking; returns its revocation deadline."""
    x = _ctx(st)
    _ll(x, lid)
    err = lib.bce_preempt(x.e, lid, t, grace)
    if err:
        raise engine_error(err, f"dimension of lease {lid}")
    return t + grace


def end_lease(st: Any, lid: int, t: int, new_state: int) -> None:
    """End a lease at t: free its units and slots, refund unused tokens and credits."""
    x = _ctx(st)
    _ll(x, lid)
    err = lib.bce_end_lease(x.e, lid, t, new_state)
    if err:
        raise engine_error(err, lid)


def renew(st: Any, lid: int, ext: int, t: int, max_spend: int) -> tuple[int, int]:
    """Extend an active lease by ext ns (SPEC §4.6); returns ``(reason, cost)``."""
    x = _ctx(st)
    _ll(x, lid)
    price = ffi.new("bce_wide *")
    r = lib.bce_renew(x.e, lid, ext, t, max_spend, price)
    if r == _E_HEAPFULL:
        x = _grow_heap(st)
        r = lib.bce_renew(x.e, lid, ext, t, max_spend, price)
    if r < 0:
        raise engine_error(r, lid)
    return int(r), _wide(price[0])


def heap_push(st: Any, t: int, lid: int) -> None:
    x = _ctx(st)
    if x.e.scal[3] >= x.e.HC:
        x = _grow_heap(st)
    lib.bce_heap_push(x.e, t, lid)


def heap_pop(st: Any) -> None:
    x = _ctx(st)
    if x.e.scal[3] <= 0:
        raise engine_error(_E_EMPTY)
    lib.bce_heap_pop(x.e)


def next_expiry(st: Any) -> int:
    """Time of the earliest scheduled expiry, or -1 (stale entries at the heap's top are
    dropped first)."""
    return int(lib.bce_next_expiry(_ctx(st).e))


def advance(st: Any, t: int, out: Any) -> int:
    """Expire active or revoking leases whose end is <= t, in (end, id) order, until ``out``
    is full; writes their ids to ``out`` and returns how many (see the reference)."""
    x = _ctx(st)
    plain = (type(out) is np.ndarray and out.dtype == _I64 and out.ndim == 1
             and out.flags.c_contiguous and out.flags.writeable)
    buf = out if plain else np.zeros(len(out), dtype=np.int64)
    err = ffi.new("int *")
    m = int(lib.bce_advance(x.e, t, ffi.cast("int64_t *", buf.ctypes.data), len(buf), err))
    if not plain:
        for i in range(m):
            out[i] = int(buf[i])
    if err[0]:
        raise engine_error(err[0], "a lease id in the expiry heap")
    return m


def admit(st: Any, c: int, d: int, k: int, nmin: int, nmax: int, dur: int, max_spend: int,
          t: int, intent: int, out: Any) -> int:
    """One decision on the fast path; ``out`` (int64[4]) receives (n, reason, lease id,
    cost). Returns GRANTED, REFUSED or SLOW (see the reference)."""
    x = _ctx(st)
    _cd(x, c, d)
    _kk(x, k)
    buf = ffi.new("int64_t[4]")
    r = lib.bce_admit(x.e, c, d, k, nmin, nmax, dur, max_spend, t, intent, buf)
    if r == _E_HEAPFULL:
        x = _grow_heap(st)
        r = lib.bce_admit(x.e, c, d, k, nmin, nmax, dur, max_spend, t, intent, buf)
    out[0], out[1], out[2], out[3] = int(buf[0]), int(buf[1]), int(buf[2]), int(buf[3])
    if r < 0:
        raise engine_error(r, nmax)
    return int(r)


def admit_batch(st: Any, camps: Any, ks: Any, dims: Any, nmins: Any, nmaxs: Any, durs: Any,
                t: int, intent0: int, out_n: Any, out_reason: Any, out_lease: Any,
                start: int, rec: Any = None) -> int:
    """Decide items start.. in order with :func:`admit` (max_spend -1) in one C loop; stop
    at the first SLOW item and return its index (or len). Item j's intent id is
    intent0 + j. Columns are int64 arrays (others are converted); outputs must be."""
    m, j = len(camps), start
    if j < 0:
        raise IndexError("admit_batch: start must be >= 0")
    if j >= m:
        return m
    keep: list[Any] = []
    what = "admit_batch"
    pc, pk, pd_, p0, p1, pu = (_i64_in(a, m, keep, what)
                               for a in (camps, ks, dims, nmins, nmaxs, durs))
    outs = "admit_batch: out_n, out_reason and out_lease"
    on, orz, ol = (_i64_out(a, m, outs) for a in (out_n, out_reason, out_lease))
    prec = ffi.NULL
    if rec is not None:
        if (type(rec) is not np.ndarray or rec.dtype != _I64 or rec.ndim != 2
                or not rec.flags.c_contiguous or rec.shape[0] < m
                or rec.shape[1] != lib.BC_REC_WIDTH):
            raise ValueError(f"rec must have shape ({m}, {lib.BC_REC_WIDTH})")
        prec = ffi.cast("int64_t *", rec.ctypes.data)
    x = _ctx(st)
    err = ffi.new("int *")
    while True:
        err[0] = 0
        j = int(lib.bce_batch(x.e, pc, pk, pd_, p0, p1, pu, t, intent0, on, orz, ol, j, m,
                              err, prec))
        if err[0] == _E_HEAPFULL:
            x = _grow_heap(st)
            continue
        if err[0]:
            raise engine_error(err[0], f"item {j}")
        return j
