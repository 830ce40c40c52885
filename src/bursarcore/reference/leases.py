"""The reference broker's records: campaigns, their holdings, leases, dimensions.

Plain dataclasses with named fields, in the integer units of SPEC §2. The lease store hands
out ids ``row | generation << 32`` and reuses the row of an ended lease once more than
``reuse_after`` later ended leases wait behind it (SPEC §4.6, policy.md "Memory").
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Sequence

from .rules import NS, wrap

ROW_BITS = 32
ROW_MASK = (1 << ROW_BITS) - 1
GEN_MASK = (1 << 30) - 1

STATES = ("starting", "active", "revoking", "released", "expired", "revoked")
LIVE = ("starting", "active", "revoking")


@dataclass
class Holding:
    """One campaign (a node of the tree of envelopes, SPEC §14) on one held dimension
    (SPEC §3, §4.2). H counts the units held by the leases of the node and of every node
    below it; ``own`` only the node's own. Its ceiling and bucket bind its load K (SPEC
    §14.2): its own units plus, per child, the larger of the child's guarantee and the
    child's load (H, for a node without children)."""
    g: int
    s: int
    b: int
    B: int                  # bucket size, unit·ns (UNLIMITED for inf)
    T: int                  # tokens, unit·ns; buckets start full
    settled: int            # the time T was last brought up to
    H: int = 0              # units held by the subtree's starting, active and revoking leases
    Hf: int = 0             # of which firm
    own: int = 0            # units held by the node's own leases
    own_firm: int = 0       # of which firm (SPEC §14: firm_own)
    K: int = 0              # the load (SPEC §14.2), recomputed from its definition at
                            # every change of a holding or of the tree
    minted: int = 0         # tokens the refill added (SPEC §11 invariant 5), modulo 2**64
    borrow: int = 0         # SPEC §14.8: the most units its borrowed leases may hold
    lend: int = 1 << 62     # ... the most of its idle guarantee its siblings may borrow
    borrowed: int = 0       # ... the units its own borrowed leases hold

    def settle(self, t: int, instant: bool) -> None:
        """SPEC §4.2, §14.2: while K < s, T refills at (s − K) per second, capped at B.
        (Instant mode, for experiments only, drains at K − s, floored at 0.)
        Path-independent: the rate is fixed between changes of K, so settling more often
        changes nothing."""
        dt = t - self.settled
        if dt <= 0:
            return
        self.settled = t
        rate = self.s - self.K
        if rate > 0:
            T = min(self.B, self.T + rate * dt)
            self.minted = wrap(self.minted + T - self.T)
            self.T = T
        elif rate < 0 and instant:
            self.T = max(0, self.T + rate * dt)


@dataclass
class Campaign:
    """A registered campaign and its envelope in engine units (SPEC §3, §4.3, §6): a node
    of the tree of envelopes (SPEC §14). ``path`` is the node and its ancestors, the node
    first and its top-level ancestor last (just the node for a top-level campaign); its
    budget binds, and its escrow and spending count, the leases of its whole subtree."""
    index: int
    name: str
    service_class: str
    share: float
    left: int               # credits left, micro-credits (UNLIMITED: not drawn down)
    hold: list[Holding]
    parent: int | None = None
    path: list[int] = field(default_factory=list)
    children: list[int] = field(default_factory=list)
    removed: bool = False   # SPEC §14.9: its name unknown, its index never reused
    escrow: int = 0
    spent: int = 0
    refunded: int = 0
    # fair share on the primary dimension (SPEC §6): usage of the node's own leases,
    # folded at each change of its own holding
    fs_S: float = 0.0
    fs_G: float = 0.0

    @property
    def unlimited(self) -> bool:
        return self.left >= (1 << 62)


@dataclass
class LeaseRecord:
    """One lease (SPEC §4.6)."""
    id: int
    campaign: int
    dim: int
    units: int
    firm: bool
    cls: int
    state: str
    granted_at: int
    dur: int                # ns paid for so far (renewals add)
    excess: list[int]       # units of load above s that were prepaid, per ns, at each
                            # node of the campaign's path (SPEC §14.2), in the path's order
    cost: int               # micro-credits escrowed (renewals add)
    intent: int
    borrowed: bool = False  # SPEC §14.8: held on siblings' idle guarantees, revocable
    start: int | None = None
    end: int | None = None
    revoke_at: int | None = None
    slots: list[int] = field(default_factory=list)


class LeaseStore:
    """Lease ids and the records of live and recently ended leases (SPEC §4.6)."""

    def __init__(self, reuse_after: int | None) -> None:
        self.reuse_after = reuse_after
        self.rows: list[LeaseRecord | None] = []     # the current record of each row
        self.gen: list[int] = []
        self.ended: deque[int] = deque()              # ended rows, oldest first

    def new_id(self) -> int:
        q = self.reuse_after
        if q is not None and len(self.ended) > q:
            r = self.ended.popleft()
            self.gen[r] = (self.gen[r] + 1) & GEN_MASK
            return r | (self.gen[r] << ROW_BITS)
        self.rows.append(None)
        self.gen.append(0)
        return len(self.rows) - 1

    def put(self, rec: LeaseRecord) -> None:
        self.rows[rec.id & ROW_MASK] = rec

    def ended_row(self, lid: int) -> None:
        if self.reuse_after is not None:
            self.ended.append(lid & ROW_MASK)

    def get(self, lid: int) -> LeaseRecord | None:
        """The record of issued id ``lid``, or None when its row holds a later lease.
        KeyError for an id never issued."""
        r, g = lid & ROW_MASK, lid >> ROW_BITS
        if lid < 0 or r >= len(self.rows) or g > GEN_MASK:
            raise KeyError(lid)
        if g == self.gen[r]:
            return self.rows[r]
        if g < self.gen[r]:
            return None
        raise KeyError(lid)

    def live(self) -> list[LeaseRecord]:
        """Live leases, in row order."""
        return [x for x in self.rows if x is not None and x.state in LIVE]


class Dimension:
    """One held dimension: capacity, the free slots and the running sums SPEC §4.1 reads
    (kept as sums so no rule scans the leases). The reserve of unmet guarantees is not
    kept here: it is computed from the tree of envelopes (:mod:`.tree`, SPEC §14)."""

    def __init__(self, name: str, capacity: int, headroom: int,
                 slot_map: list[tuple[str, int]]) -> None:
        self.name = name
        self.cap = capacity
        self.headroom = headroom
        self.node_names: list[str] = []
        self.node_of_slot: list[int] = []
        for node, k in slot_map:
            self.node_names.append(node)
            self.node_of_slot.extend([len(self.node_names) - 1] * k)
        # free slots as a stack: the next grant takes slot 0 first
        self.free: list[int] = list(range(len(self.node_of_slot)))[::-1]
        self.occupied = 0       # units on placed leases (active, revoking)
        self.promised = 0       # units promised to starting (reclaim) leases
        self.revoking = 0       # units of revoking leases
        # SPEC §4.6 the reclaim timeline: per starting lease (its activation, +units), per
        # revoking lease (its deadline, -units)
        self.timeline: dict[int, tuple[int, int]] = {}
        self.opp_active = 0     # units of active opportunistic leases
        self.F = 0              # firm units held (SPEC §4.1)
        self.pending_priced = 0  # nmax of waiting congestion-priced intents (SPEC §7)
        self.retired: set[int] = set()   # slots of removed nodes (SPEC §12)

    def reserve(self) -> int:
        """SPEC §4.6: the units kept free for the starting (reclaim) leases: the most, over
        every time τ, that the leases starting by τ need beyond the units of the revoking
        leases whose deadline is by τ."""
        most = 0
        for tau in {at for at, _ in self.timeline.values()}:
            most = max(most, sum(n for at, n in self.timeline.values() if at <= tau))
        return most

    def free_now(self) -> int:
        """Units a warm grant may take: capacity less placed units and the reserve."""
        return self.cap - self.occupied - self.reserve()

    def surplus(self) -> int:
        """What the revoking leases bring beyond the promises once every one is revoked
        (the units a reclaim may count on at the latest deadline; SPEC §4.1, §4.6)."""
        return self.reserve() + self.revoking - self.promised

    def reachable(self) -> int:
        """Units a reclaim can reach: free, lent to opportunistic leases, and the surplus
        of the revoking leases (SPEC §4.1)."""
        return self.free_now() + self.opp_active + self.surplus()

    def opportunistic_room(self) -> int:
        """Free units an opportunistic lease may take: all but the warm headroom."""
        return max(0, self.free_now() - self.headroom)

    def take(self, n: int) -> list[int]:
        taken = self.free[len(self.free) - n:][::-1]
        del self.free[len(self.free) - n:]
        return taken

    def give_back(self, slots: list[int]) -> None:
        """Slots of an ended lease are free again; a retired one leaves the pool instead."""
        back = [x for x in reversed(slots) if x not in self.retired]
        self.cap -= len(slots) - len(back)
        self.free.extend(back)

    def live_nodes(self) -> set[str]:
        return {self.node_names[self.node_of_slot[x]] for x in range(len(self.node_of_slot))
                if x not in self.retired}

    def add(self, nodes: list[tuple[str, int]]) -> list[int]:
        """SPEC §12: new nodes' slots join the pool, free."""
        start = len(self.node_of_slot)
        for name, k in nodes:
            self.node_names.append(name)
            self.node_of_slot.extend([len(self.node_names) - 1] * k)
        ids = list(range(start, len(self.node_of_slot)))
        self.free.extend(reversed(ids))
        self.cap += len(ids)
        return ids

    def retire(self, nodes: Sequence[str]) -> set[int]:
        """SPEC §12: the nodes' slots leave the pool: free ones now, held ones when their
        leases end. Returns the slots retired."""
        names = set(nodes)
        gone = {x for x in range(len(self.node_of_slot))
                if x not in self.retired and self.node_names[self.node_of_slot[x]] in names}
        self.retired |= gone
        kept = [x for x in self.free if x not in gone]
        self.cap -= len(self.free) - len(kept)
        self.free = kept
        return gone

    def placement(self, slots: list[int]) -> tuple[tuple[str, int], ...]:
        """``(node, units)`` in order of first appearance."""
        count: dict[int, int] = {}
        for s in slots:
            j = self.node_of_slot[s]
            count[j] = count.get(j, 0) + 1
        return tuple((self.node_names[j], k) for j, k in count.items())


def seconds(ns: int | None) -> float | None:
    return None if ns is None else ns / NS


def inf_or(v: int, scale: int, sentinel: int = 1 << 62) -> float:
    return math.inf if v >= sentinel else v / scale
