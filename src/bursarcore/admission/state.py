"""The engine's state: plain numpy arrays that every kernel backend reads and writes.

Policy objects (the :class:`~bursarcore.broker.Broker`) own one :class:`EngineState` and
ask the C core (through its Cython or cffi binding) to do the per-decision arithmetic on
it. Every number is an integer (SPEC §2):

* time: int64 ns; held units: int64 whole units;
* tokens: unit·ns (a unit-second is 1e9), so refill ``(s − H)·dt`` and the prepaid debit
  ``excess·duration`` are exact integer products;
* credits: micro-credits; prices: micro-credits per unit-hour; multipliers: ppm.

The lease store keeps running sums per dimension (occupied, promised, revoking, firm,
unmet guarantees, reclaimable) so no decision scans the leases (doorman's store habit).
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np
import numpy.typing as npt

from .. import _abi

__all__ = ["EngineState", "wrap", "REASONS", "LIMITS", "LIMIT_REASONS", "LEASE_STATES", "PATHS",
           "MAXV", "BOR_LIMIT", "BOR_LEND", "BOR_HELD", "BOR_FSUB", "BOR_WIDTH", "SIB_CHILD",
           "SIB_NEXT", "SIB_WIDTH", "HOUR_NS",
           "PPM", "ROW_BITS", "ROW_MASK", "GEN_MASK", "REUSE_AFTER"]

MAXV = 1 << 62                    # "unlimited" credits / burst, and the bound on magnitudes
HOUR_NS = 3_600_000_000_000
PPM = 1_000_000
CREDIT = 1_000_000                # micro-credits per credit

# reason codes (index into REASONS; 0 = none) and the rules with a limit, in the order a
# refusal names them (LIMITS, each decided as reason LIMIT_REASONS[i]): the core's header's
REASONS, LIMITS, LIMIT_REASONS = _abi.REASONS, _abi.LIMITS, _abi.LIMIT_REASONS
(OK, CAPACITY, TOKENS, CREDITS, CEILING, DEADLINE, TTL, INVALID, UNKNOWN_CAMPAIGN, CANCELLED,
 PENDING_LIMIT) = (REASONS.index(r) for r in (
    "", "capacity", "tokens", "credits", "ceiling", "deadline", "ttl", "invalid",
    "unknown_campaign", "cancelled", "pending_limit"))
LIM_CEILING, LIM_CAPACITY, LIM_TOKENS, LIM_CREDITS = (
    LIMITS.index(r) for r in ("ceiling", "capacity", "tokens", "credits"))
# kernel outcomes of admit/admit_batch items
GRANTED, REFUSED, SLOW = 0, 1, 2
# lease states
STARTING, ACTIVE, REVOKING, RELEASED, EXPIRED, REVOKED = range(6)
LEASE_STATES = ("starting", "active", "revoking", "released", "expired", "revoked")
WARM, RECLAIM, COLD = range(3)
PATHS = ("warm", "reclaim", "cold", "borrow")

# Campaign state is kept as records: one per (campaign, dimension) in ``cdrow`` (CD_WIDTH
# int64 columns, 128 bytes: two cache lines, the fields a grant reads and writes in the
# first) and one per campaign in ``crow`` (C_WIDTH columns, 64 bytes: one line; the fair-
# share pair are float64 in its last two columns), each on a 64-byte boundary, so a decision
# reads a campaign's three lines instead of a line per field. Every field is also an
# attribute, a view of its column (``st.T[c, d]``, ``st.left[c]``); the compiled engine's
# row structs (``_engine.CdRow``, ``CRow``) list the columns in this order.
# The tree of envelopes (SPEC §14) is kept in the last three columns: ``up``, the parent's
# index + 1 (-1 for a top-level node with children, 0 for a flat campaign); ``Rch``, Σ over
# the node's children of their commitments R; ``Xch``, Σ over them of what they add to its
# load, which H holds (SPEC §14.2: what its ceiling and bucket bind, own units plus Σ over
# its children of max(g_ch, K_ch); ``Hf`` counts its own firm units). Per (campaign,
# dimension) ``gch`` holds Σ of its children's guarantees and ``Hsub`` a node of a tree's
# subtree holding. A flat campaign has zeros in all five (its H is its holding).
_CD_FIELDS = ("tlast", "H", "T", "s", "b", "Bcap", "acc", "tok_debited",
              "g", "Hf", "tok_minted", "tok_refunded", "tok_clipped", "up", "Rch", "Xch")
CD_WIDTH = 16
_C_FIELDS = ("left", "escrow", "cred_debited", "budget", "spent", "refunded")
C_WIDTH = 8
# fair share (SPEC §6), per campaign, float64: fs_S = ∫ H(τ)·2^((τ − E)/half-life) dτ over
# the primary held dimension (unit-ns, E the epoch in fs_par[1]), folded at every change of
# H; fs_G = 2^((τ − E)/half-life) at the campaign's last change. Usage decayed to t is
# (fs_S + H·(w − fs_G)) / w with w = 2^((t − E)/half-life): exact at any t, and only
# holding changes (which the journal carries) write it, so a replay rebuilds it bit for bit
_CF_FIELDS = ("fs_S", "fs_G")     # crow's columns 6 and 7, read as float64
_ROW_FIELDS = _CD_FIELDS + _C_FIELDS + _CF_FIELDS
FS_REBASE = 256.0                 # |t − E| in half-lives beyond which E moves to t
# A lease is a record too: one row of ``lrow`` (L_WIDTH int64 columns, 128 bytes on a 64-byte
# boundary), so a grant writes two lines and an expiry reads them, wherever its row is; every
# field is a view of its column (``st.t_end[r]``). The compiled ``_engine.LRow`` lists them
# in this order.
_L_FIELDS = ("camp", "dim", "units", "firm", "state", "lcls", "t_end", "slot_off",
             "t_grant", "t_start", "dur", "excess", "cost", "revoke_at", "intent", "gen")
L_WIDTH = 16
# Per lease row, what each ancestor of a node of a tree prepaid (SPEC §14.2): the lease's
# own excess is its record's; its ancestors', nearest first, are ``lex[row * LEX_WIDTH:]``.
LEX_WIDTH = _abi.TREE_DEPTH - 1
# Borrowing (SPEC §14.8), per (campaign, dimension), ``bor[c, d]``: the borrow limit, the
# lend limit (MAXV: none), the units the campaign's borrowed leases hold, and a node of a
# tree's descendants' firm holding (with its own, what its idle guarantee is measured
# against).
BOR_LIMIT, BOR_LEND, BOR_HELD, BOR_FSUB = range(4)
BOR_WIDTH = 4
# The lists of siblings a borrower borrows from (SPEC §14.8), ``sib[v + 1]`` for campaign v
# and ``sib[0]`` for the pool, whose children are the top-level nodes: the first child's
# index + 1 (0: none) and the next sibling's index + 1 (-1: the last of its list; 0: in no
# list). The core's k_enlist keeps them: the kernels' ``enlist`` (a top-level node) and
# ``link`` (a child).
SIB_CHILD, SIB_NEXT = range(2)
SIB_WIDTH = 2
_VIEWS = frozenset(_ROW_FIELDS + _L_FIELDS)
# Lease ids and rows. The rows of ended leases are reused; a lease id names one use of a
# row: id = row | generation << ROW_BITS, the generation counting the row's reuses (0 for
# its first lease, so a store that never reuses a row has ids 0, 1, 2...). Generations wrap
# at GEN_MASK + 1 (2**30: ids stay below 2**62). An ended row goes to the back of a FIFO
# (``freeq``) and is taken again only while more than ``reuse_after`` other ended rows wait
# behind it (``lfree`` = [head, tail, reuse_after]; reuse_after < 0: rows are never reused)
# -- so an ended lease's record stays readable until that many later leases have ended.
ROW_BITS = 32
ROW_MASK = (1 << ROW_BITS) - 1
GEN_MASK = (1 << 30) - 1
REUSE_AFTER = 1024


_NO_BUMP = frozenset(("version", "binding_view"))

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
I32 = npt.NDArray[np.int32]


def wrap(x: int) -> int:
    """SPEC §2: cumulative counters (credits spent and refunded, an unlimited budget's
    escrow) are kept modulo 2**64 as signed int64, as the core's ``bc_wadd`` keeps them."""
    return ((x + (1 << 63)) & ((1 << 64) - 1)) - (1 << 63)


def _aligned_buf(n: int) -> np.ndarray:
    """Zeros for ``n`` int64 values and up to 7 more: room to start them on a 64-byte
    boundary (``_aligned``)."""
    return np.zeros(n + 8, dtype=np.int64)


def _aligned(buf: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """The C-contiguous ``shape`` view of ``buf`` that starts on its first 64-byte boundary."""
    off = (-(buf.ctypes.data % 64) // 8) % 8
    return buf[off:off + int(np.prod(shape))].reshape(shape)


def _aligned_zeros(shape: tuple[int, ...]) -> np.ndarray:
    """A C-contiguous int64 array of zeros whose data starts on a 64-byte boundary."""
    return _aligned(_aligned_buf(int(np.prod(shape))), shape)


class EngineState:
    """All integer state of one broker's held-dimension engine.

    ``version`` counts attribute assignments: it moves whenever an array is replaced
    (growth) or a scalar such as ``C`` changes, never on in-place writes. A compiled kernel
    caches raw pointers to the arrays (in ``binding_view``, dropped on every bump) and rebuilds
    them when it moves. ``gsum`` is Σ of the top-level g[c, d], kept by :meth:`add_campaign` (``g``
    changes nowhere else).
    """

    version: int = 0
    binding_view: object | None = None   # the binding's cached view of the arrays (opaque; never copied)

    # The fields, declared for type checkers (annotations only: none is a class attribute;
    # each is set per instance in __init__ / _set_rows / _set_leases / __setstate__).
    # shape: D dimensions, C campaigns (``_calloc`` allocated), L lease rows
    D: int
    cap: I64                          # (D,)
    headroom: I64
    occ: I64
    prom: I64
    rev: I64
    resv: I64                         # (D,) the reclaim grants' reserve (§4.6; the policy's)
    F: I64
    U: I64
    oppa: I64
    pend: I64
    price: I64
    gsum: I64                         # (D,) Σ of the top-level g[c, d]
    cls: I64                          # (classes, 6)
    cong_thr: I64
    cong_mult: I64
    bins: int
    bin_ns: int
    ring: I64                         # (D, bins)
    ring_sum: I64
    scal: I64                         # (4,)
    fs_par: I64                       # (2,)
    free_slots: I32                   # (D, max slots)
    top: I64
    C: int
    _calloc: int
    # campaign records and the views of their columns (_CD_FIELDS: (C, D); _C_FIELDS and
    # _CF_FIELDS: (C,))
    cdrow: I64                        # (_calloc, D, CD_WIDTH)
    crow: I64                         # (_calloc, C_WIDTH)
    tlast: I64
    H: I64
    T: I64
    s: I64
    b: I64
    Bcap: I64
    acc: I64
    tok_debited: I64
    g: I64
    Hf: I64
    tok_minted: I64
    tok_refunded: I64
    tok_clipped: I64
    up: I64
    Rch: I64
    Xch: I64
    gch: I64                          # (_calloc, D) Σ of a node's children's guarantees
    Hsub: I64                         # (_calloc, D) a node of a tree's subtree holding
    bor: I64                          # (_calloc, D, BOR_WIDTH) borrowing (SPEC §14.8)
    sib: I64                          # (_calloc + 1, SIB_WIDTH) sibling lists (SPEC §14.8)
    left: I64
    escrow: I64
    cred_debited: I64
    budget: I64
    spent: I64
    refunded: I64
    fs_S: F64
    fs_G: F64
    # lease records and the views of their columns (_L_FIELDS: (L,))
    lrow: I64                         # (L, L_WIDTH)
    camp: I64
    dim: I64
    units: I64
    firm: I64
    state: I64
    lcls: I64
    t_end: I64
    slot_off: I64
    t_grant: I64
    t_start: I64
    dur: I64
    excess: I64
    cost: I64
    revoke_at: I64
    intent: I64
    gen: I64
    lex: I64                          # (L * LEX_WIDTH,) what each ancestor prepaid; () if flat
    freeq: I64
    lfree: I64                        # [head, tail, reuse_after]
    arena: I32
    arena_top: I64                    # (1,)
    heap_t: I64
    heap_id: I64

    def __setattr__(self, name: str, value: object) -> None:
        object.__setattr__(self, name, value)
        if name not in _NO_BUMP:
            d = self.__dict__
            d["version"] = d.get("version", 0) + 1
            d.pop("binding_view", None)      # and let go of the arrays it points into

    def __getstate__(self) -> dict[str, object]:
        d = dict(self.__dict__)
        d.pop("binding_view", None)
        for f in _ROW_FIELDS + _L_FIELDS:  # views of cdrow / crow / lrow: rebuilt on load
            d.pop(f, None)
        return d

    def __setstate__(self, d: dict[str, Any]) -> None:
        d = dict(d)
        if "cdrow" in d:
            cd, cr = d.pop("cdrow"), d.pop("crow")
        else:                              # pickled before campaigns were records
            n, D = d["g"].shape
            cd, cr = np.zeros((n, D, CD_WIDTH), np.int64), np.zeros((n, C_WIDTH), np.int64)
            for j, f in enumerate(_CD_FIELDS):
                if f in d:                 # (the tree's columns came later: zeros)
                    cd[:, :, j] = d.pop(f)
            for j, f in enumerate(_C_FIELDS):
                cr[:, j] = d.pop(f)
            for j, f in enumerate(_CF_FIELDS):
                cr.view(np.float64)[:, len(_C_FIELDS) + j] = d.pop(f)
        if "lrow" in d:
            lr = d.pop("lrow")
        else:                              # pickled before leases were records
            L = d["camp"].shape[0]
            lr = np.zeros((L, L_WIDTH), np.int64)
            if "gen" not in d:             # pickled before rows were reused
                d["freeq"] = np.zeros(L, dtype=np.int64)
                # rows that ended before are not queued (they stay unused); new ends are
                d["lfree"] = np.array([0, 0, REUSE_AFTER], dtype=np.int64)
            for j, f in enumerate(_L_FIELDS):
                if f in d:
                    lr[:, j] = d.pop(f)
        if "lex" not in d:                 # pickled before the tree: no ancestor prepaid
            d["lex"] = np.zeros(0, dtype=np.int64)
        if "resv" not in d:                # pickled before the reserve was kept: prom − rev
            d["resv"] = np.zeros_like(d["rev"])
        self.__dict__.update(d)            # (gch, when pickled after the tree: _set_rows keeps it)
        self._set_rows(cd, cr, cd.shape[0])
        if "bor" not in d:                 # pickled before borrowing: none, lending unlimited
            self.bor[:self.C, :, BOR_LEND] = MAXV
        # the descendants' firm holding follows from the holdings, whatever a pickle kept
        self.bor[:self.C, :, BOR_FSUB] = self.subtree_sums(self.Hf) - self.Hf[:self.C]
        if "sib" not in d:                 # pickled before the sibling lists: built from up
            self._list_siblings()
        if "gsum" not in d:                # pickled before Σg was kept here
            self.gsum = self.g[:self.C].sum(axis=0, dtype=np.int64)
        buf = _aligned_buf(lr.shape[0] * L_WIDTH)
        self._set_leases(buf, lr.shape[0])
        self.lrow[:] = lr
        self.__dict__["version"] = d.get("version", 0) + 1

    def __init__(self, capacity: list[int], headroom: list[int], slot_counts: list[int],
                 classes: list[tuple[int, int, int, int, int, int]], price: list[int],
                 cong_thresholds: list[int], cong_mult: list[int], window_ns: int,
                 bins: int, instant: bool, half_life_ns: int = 600_000_000_000,
                 epoch_ns: int = 0, reuse_after: int | None = REUSE_AFTER) -> None:
        D = len(capacity)
        self.D = D

        def z() -> I64:
            return np.zeros(D, dtype=np.int64)

        self.cap = np.array(capacity, dtype=np.int64)
        self.headroom = np.array(headroom, dtype=np.int64)
        self.occ, self.prom, self.rev, self.F, self.U, self.oppa, self.pend = (z() for _ in range(7))
        self.resv = z()
        self.price = np.array(price, dtype=np.int64)
        self.gsum = z()                    # Σ of the top-level g[c, d], kept by add_campaign
        # class table: rank, mult_ppm, priced, preemptible, grace_ns, free_when_broke
        self.cls = np.array(classes, dtype=np.int64).reshape(-1, 6)
        self.cong_thr = np.array(cong_thresholds, dtype=np.int64)
        self.cong_mult = np.array(cong_mult, dtype=np.int64)
        self.bins = int(bins)
        self.bin_ns = max(1, int(window_ns) // int(bins))
        self.ring = np.zeros((D, bins), dtype=np.int64)
        self.ring_sum = z()
        # scalars kept in a small array so compiled kernels can write them in place:
        # [0] ring bin index, [1] instant-enforcement flag, [2] lease rows used (the
        # high-water mark: rows of ended leases are reused), [3] heap size
        self.scal = np.array([0, int(instant), 0, 0], dtype=np.int64)
        # fair share: [0] half-life in ns, [1] the epoch E of the fs_S / fs_G weights
        if int(half_life_ns) < 1:
            raise ValueError("half_life_ns must be >= 1")
        self.fs_par = np.array([int(half_life_ns), int(epoch_ns)], dtype=np.int64)
        # slots: per dimension a stack of free slot ids (top = scal-like array `top`)
        width = max(slot_counts) if slot_counts else 0
        self.free_slots = np.zeros((D, max(width, 1)), dtype=np.int32)
        self.top = z()
        for d, n in enumerate(slot_counts):
            self.free_slots[d, :n] = np.arange(n, dtype=np.int32)[::-1]  # pop gives slot 0 first
            self.top[d] = n
        # campaigns
        self.C = 0
        self._calloc = 0
        self._set_rows(np.zeros((0, D, CD_WIDTH), np.int64), np.zeros((0, C_WIDTH), np.int64), 0)
        # leases and their slot arena
        self._set_leases(_aligned_buf(0), 0)
        self.lex = np.zeros(0, dtype=np.int64)
        self.freeq = np.zeros(0, dtype=np.int64)
        if reuse_after is not None and (isinstance(reuse_after, bool) or int(reuse_after) < 0):
            raise ValueError("reuse_after must be None or an integer >= 0")
        self.lfree = np.array([0, 0, -1 if reuse_after is None else int(reuse_after)],
                              dtype=np.int64)
        self.arena = np.zeros(0, dtype=np.int32)
        self.arena_top = np.zeros(1, dtype=np.int64)
        self.heap_t = np.zeros(0, dtype=np.int64)
        self.heap_id = np.zeros(0, dtype=np.int64)
        self.grow_leases(1024, 1024 * 8)

    # -- growth ------------------------------------------------------------------------
    def add_campaign(self, g: npt.ArrayLike, s: npt.ArrayLike, b: npt.ArrayLike,
                     Bcap: npt.ArrayLike, budget: int, now_ns: int, top: bool = True) -> int:
        """A campaign's records. ``top``: a top-level node, whose guarantee joins U and
        ``gsum``, that the kernels' ``enlist`` lists among the top-level nodes next;
        otherwise a node of a tree (SPEC §14) that the kernels' ``link`` makes a child of
        its parent next (the state then keeps what each ancestor prepays per lease,
        ``lex``)."""
        if not top:
            self.keep_ancestor_excess()
        if self.C == self._calloc:
            self._set_rows(self.cdrow, self.crow, max(16, 2 * self._calloc))
        c = self.C
        self.g[c], self.s[c], self.b[c], self.Bcap[c] = g, s, b, Bcap
        self.T[c] = Bcap
        self.bor[c, :, BOR_LEND] = MAXV          # lends its idle guarantee without a limit
        self.tlast[c] = now_ns
        self.budget[c] = budget
        self.left[c] = budget
        if top:
            self.U += np.asarray(g, dtype=np.int64)
            self.gsum += np.asarray(g, dtype=np.int64)
        self.C += 1
        return c

    # -- the tree of envelopes (SPEC §14) -------------------------------------------------
    def parent(self, c: int) -> int:
        """Node c's parent's index, or -1 for a top-level node."""
        up = int(self.up[c, 0]) if self.D else 0
        return up - 1 if up > 0 else -1

    def has_tree(self) -> bool:
        """Whether any node of a tree of envelopes is registered (the ancestors' prepaid
        figures are kept from the first one on)."""
        return int(self.lex.shape[0]) != 0

    def in_tree(self, c: int) -> bool:
        """Whether c is a node of a tree (a child, or a top-level node with children)."""
        return self.D > 0 and int(self.up[c, 0]) != 0

    def path(self, c: int) -> list[int]:
        """c's path: c, its parent, ..., its top-level ancestor."""
        out = [c]
        while (c := self.parent(c)) >= 0:
            out.append(c)
        return out

    def keep_ancestor_excess(self) -> None:
        """Make room for what each ancestor prepays per lease (``lex``), once the first node
        of a tree of envelopes is registered: a flat broker keeps none. A MemoryError
        changes nothing."""
        if not self.lex.shape[0]:
            self.lex = np.zeros(self.lrow.shape[0] * LEX_WIDTH, dtype=np.int64)

    def borrowed(self, r: int) -> bool:
        """Whether the lease in row r is borrowed (SPEC §14.8): not firm, of a firm class."""
        return int(self.firm[r]) == 0 and int(self.cls[int(self.lcls[r]), 3]) == 0

    def held(self, c: int, d: int) -> int:
        """SPEC §14.2: the units the leases of c's subtree hold on d (its own, for a flat
        campaign; a node of a tree's ``H`` is its load)."""
        return int(self.Hsub[c, d]) if int(self.up[c, d]) != 0 else int(self.H[c, d])

    def subtree_sums(self, col: I64) -> I64:
        """Σ over each campaign's subtree of its own figures ``col`` (C, D): a child is
        registered after its parent, so one pass in reverse order adds children first."""
        out = np.array(col[:self.C], dtype=np.int64)
        up = self.up[:self.C, 0] if self.D else np.zeros(self.C, np.int64)
        for c in np.flatnonzero(up > 0)[::-1]:
            out[int(up[c]) - 1] += out[c]
        return out

    def _list_siblings(self) -> None:
        """``sib`` rebuilt from ``up``: each campaign, in the order they were registered,
        put at the head of its parent's list (the top level's, for a top-level node), as
        registration puts it (SPEC §14.8)."""
        sib = self.sib
        sib[:] = 0
        for c in range(self.C):
            p = self.parent(c)
            head = int(sib[p + 1, SIB_CHILD])
            sib[c + 1, SIB_NEXT] = head if head != 0 else -1
            sib[p + 1, SIB_CHILD] = c + 1

    def _set_rows(self, cd: np.ndarray, cr: np.ndarray, n: int) -> None:
        """Make ``cdrow`` / ``crow`` ``n`` records long, each record on a 64-byte boundary,
        holding the first ``C`` records of ``cd`` / ``cr`` (zeros after them), and point
        every campaign field at its column."""
        new_cd = _aligned_zeros((n, self.D, CD_WIDTH))
        new_cr = _aligned_zeros((n, C_WIDTH))
        keep = min(self.C, cd.shape[0])
        new_cd[:keep] = cd[:keep]
        new_cr[:keep] = cr[:keep]
        side = {}
        for f, shape, k in (("gch", (n, self.D), keep), ("Hsub", (n, self.D), keep),
                            ("bor", (n, self.D, BOR_WIDTH), keep),
                            ("sib", (n + 1, SIB_WIDTH), keep + 1)):  # (sib[0]: the pool's)
            side[f] = np.zeros(shape, dtype=np.int64)   # the columns beside the records
            old = self.__dict__.get(f)
            if old is not None:
                side[f][:min(k, old.shape[0])] = old[:k]
        self.cdrow, self.crow, self._calloc = new_cd, new_cr, n
        self.gch, self.Hsub, self.bor = side["gch"], side["Hsub"], side["bor"]
        self.sib = side["sib"]
        for j, f in enumerate(_CD_FIELDS):
            setattr(self, f, new_cd[:, :, j])
        for j, f in enumerate(_C_FIELDS):
            setattr(self, f, new_cr[:, j])
        fl = new_cr.view(np.float64)
        for j, f in enumerate(_CF_FIELDS):
            setattr(self, f, fl[:, len(_C_FIELDS) + j])

    def _set_leases(self, buf: np.ndarray, n: int, at: int | None = None) -> None:
        """Make ``lrow`` the ``n`` records in ``buf`` (its ``base`` is ``buf``) from value
        ``at``, by default its first 64-byte boundary, and point every lease field at its
        column."""
        lr = _aligned(buf, (n, L_WIDTH)) if at is None else \
            buf[at:at + n * L_WIDTH].reshape(n, L_WIDTH)
        self.lrow = lr
        for j, f in enumerate(_L_FIELDS):
            setattr(self, f, lr[:, j])

    def _grow_leases(self, new: int, keep: int) -> None:
        """``lrow`` ``new`` records long, keeping its first ``keep`` (zeros after them). In
        place when nothing else holds the records (``ndarray.resize``: a realloc, which
        moves large blocks by remapping their pages, and zero-fills the rest); else by
        copying. A MemoryError changes nothing."""
        d = self.__dict__
        old = d["lrow"].shape[0]
        buf = d["lrow"].base
        at = (d["lrow"].ctypes.data - buf.ctypes.data) // 8     # where the records start
        for f in _L_FIELDS + ("lrow", "binding_view"):    # the views: then only buf holds it
            d.pop(f, None)
        try:
            try:
                buf.resize(new * L_WIDTH + 8, refcheck=True)   # (the bytes keep their place)
            except ValueError:             # held elsewhere: copy instead
                nb = _aligned_buf(new * L_WIDTH)
                _aligned(nb, (keep, L_WIDTH))[:] = buf[at:at + keep * L_WIDTH].reshape(keep, L_WIDTH)
                buf, at = nb, None
            else:
                lr = _aligned(buf, (new, L_WIDTH))
                to = (lr.ctypes.data - buf.ctypes.data) // 8
                if to != at:               # the 64-byte boundary moved: shift the records
                    ctypes.memmove(lr.ctypes.data, buf.ctypes.data + 8 * at, 8 * keep * L_WIDTH)
                    at = None
                lr[keep:min(old + 1, new)] = 0   # (+1: the old rows, shifted by < 64 bytes)
        except BaseException:              # MemoryError: the records are as they were
            self._set_leases(buf, old, at)
            raise
        self._set_leases(buf, new)

    def _resize(self, name: str, new: int, keep: int) -> None:
        """Grow array ``name`` to ``new`` items, keeping its first ``keep`` and zeroing the
        rest (what a fresh ``np.zeros`` plus a copy gives). In place when nothing else
        holds the array (``ndarray.resize``: a realloc, which moves large blocks by
        remapping their pages instead of copying them); else by copying."""
        if name == "lrow":
            return self._grow_leases(new, keep)
        if name in _VIEWS:
            raise ValueError(f"EngineState.{name} is a view of its records: resize those")
        d = self.__dict__
        d.pop("binding_view", None)               # the compiled view holds a reference
        a = d.pop(name)
        old = a.shape[0]
        try:
            a.resize(new, refcheck=True)
        except ValueError:                 # a view or another reference: copy instead
            try:
                b2 = np.zeros(new, dtype=a.dtype)
            except BaseException:          # MemoryError: the state keeps its array
                d[name] = a
                raise
            b2[:keep] = a[:keep]
            a = b2
        except BaseException:              # MemoryError from the realloc: a is unchanged
            d[name] = a
            raise
        else:
            if keep < old:
                a[keep:old] = 0
        setattr(self, name, a)             # bumps version

    def reusable(self) -> int:
        """Ended rows that the next grants may take (see ``ROW_BITS``)."""
        head, tail, q = (int(x) for x in self.lfree)
        return tail - head - q if q >= 0 and tail - head > q else 0

    def grow_leases(self, min_free: int = 1, min_arena: int = 0) -> None:
        """Make room for ``min_free`` more leases and ``min_arena`` more slot ids."""
        n = int(self.scal[2])
        L = self.camp.shape[0]
        if n + min_free > L + self.reusable():
            new = max(2 * L, n + min_free, 1024)
            if new > 1 << ROW_BITS:
                raise OverflowError(f"lease store of {new} rows: rows must be < 2**{ROW_BITS}")
            # all or nothing: a MemoryError part way shrinks what already grew back to its
            # old length (rows from n on are zero, so keeping n restores it exactly)
            ring = np.zeros(new, dtype=np.int64)
            grown: list[tuple[str, int, int]] = []
            try:
                self._resize("lrow", new, n)
                grown.append(("lrow", L, n))
                if self.lex.shape[0]:          # (kept once a tree of envelopes exists)
                    self._resize("lex", new * LEX_WIDTH, n * LEX_WIDTH)
                    grown.append(("lex", L * LEX_WIDTH, n * LEX_WIDTH))
                for f in ("heap_t", "heap_id"):
                    size = getattr(self, f).shape[0]   # no reference kept: resize in place
                    if size < new + 1:                 # grow_heap may have made it larger
                        self._resize(f, new + 1, size)
                        grown.append((f, size, size))
            except BaseException:
                for f, size, keep in reversed(grown):
                    self._resize(f, size, keep)
                raise
            # the FIFO of ended rows is a ring as long as the store: lay it out afresh
            head, tail = int(self.lfree[0]), int(self.lfree[1])
            q = self.freeq
            if tail > head:
                ring[: tail - head] = q[np.arange(head, tail) % L]
            self.freeq = ring
            self.lfree[0], self.lfree[1] = 0, tail - head
        used = int(self.arena_top[0])
        size = self.arena.shape[0]
        if used + min_arena > size:
            # compact only when it frees a good share: ended leases' slot ids (used minus
            # the slots live leases hold, Σ occ) -- otherwise growing is cheaper than a
            # scan of every lease
            if used - int(self.occ.sum()) >= max(min_arena, size // 4):
                self._compact_arena()
                used = int(self.arena_top[0])
        if used + min_arena > size:
            self._resize("arena", max(2 * size, used + min_arena, 8192), used)

    def _compact_arena(self) -> None:
        """Drop the slot ids of ended leases: live leases' ranges are packed to the front."""
        n = self.nleases
        live = np.flatnonzero((self.state[:n] == ACTIVE) | (self.state[:n] == REVOKING))
        # a live lease's slot ids must survive: pack them to the front, in lease order
        if live.size == 0:
            self.arena_top[0] = 0
            return
        offs, lens = self.slot_off[live], self.units[live]
        idx = np.repeat(offs - np.concatenate(([0], np.cumsum(lens)[:-1])), lens) + np.arange(lens.sum())
        packed = self.arena[idx]
        self.arena[: packed.shape[0]] = packed
        self.slot_off[live] = np.concatenate(([0], np.cumsum(lens)[:-1]))
        self.arena_top[0] = packed.shape[0]

    def grow_heap(self) -> None:
        for f in ("heap_t", "heap_id"):
            size = getattr(self, f).shape[0]       # no reference kept: resize works in place
            self._resize(f, 2 * size + 16, size)

    @property
    def nleases(self) -> int:
        """Rows ever used (the high-water mark of the lease store), not a count of leases."""
        return int(self.scal[2])

    def lease_id(self, row: int) -> int:
        """The id of the lease that holds (or last held) ``row``."""
        return int(row) | (int(self.gen[row]) << ROW_BITS)

    def row_of(self, lid: int) -> int:
        """The row of lease ``lid``, or -1 for an ended lease whose row was reused since
        (a stale id). Raises KeyError for an id this store never issued."""
        lid = int(lid)
        row, g = lid & ROW_MASK, lid >> ROW_BITS
        if lid < 0 or row >= int(self.scal[2]) or g > GEN_MASK:
            raise KeyError(lid)
        cur = int(self.gen[row])
        if g == cur:
            return row
        if g < cur:             # generations go up by one per reuse: an older one was issued
            return -1
        raise KeyError(lid)     # (after a row's generation wraps, its oldest ids read as this)
