"""The pending queue (SPEC §4.5): intents that wait for capacity, tokens or credits, in the
order the specification gives (class rank, then fair-share deficit, then tokens, then
arrival), decided again whenever a limit that bound them may have risen.

:class:`PendingQueue` belongs to one :class:`~bursarcore.broker.Broker` and decides through
its engine (``broker._k`` over ``broker.st``): it files each waiting key under the limit
that failed it, with the watch that says when that limit may have risen (``file``), and a
pass (``serve``) decides only the keys whose watch fired. Granting a lease, planning a
reclaim and reading deficits stay the broker's (``_grant_pending``, ``_plan_reclaim``,
``_fair_keys``).
"""

from __future__ import annotations

import bisect
import heapq
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable

import numpy as np

from ..admission.envelope import Intent
from .. import units
from ..admission.state import (LIM_CAPACITY, LIM_CEILING, LIM_CREDITS, LIM_TOKENS,
                               LIMIT_REASONS, REASONS, RECLAIM)

if TYPE_CHECKING:
    from ..broker import Broker

__all__ = ["PendingQueue"]

NS = units.NS

# a watch entry of a filed pending key: (threshold, seq, the key's ver when filed, key)
_Watch = tuple[int, int, int, "_PKey"]


@dataclass
class _Pending:
    """A waiting intent. ``reason`` is the rule that bound it when it went pending; what
    :meth:`Broker.pending` reports is worked out when read (``PendingQueue.reasons``)."""
    intent_id: int
    campaign: int
    dim: int
    cls: int
    nmin: int
    nmax: int
    dur: int
    max_spend: int
    deadline: int | None
    expires: int
    arrival: int
    reason: int
    request: Intent | None = None
    # (None only between construction and queueing: every reader sees the key it is filed under)
    key: _PKey = field(default=None, repr=False, compare=False)  # type: ignore[assignment]


class _PKey:
    """The pending intents of one key K = (campaign, dim, class, duration, max_spend).

    They share class rank, deficit and tokens, so the queue order (SPEC §4.5) ranks keys
    and, within a key, goes by arrival; ``by_nmin`` holds their arrivals (= intent ids)
    in order per nmin, ``nmins`` the distinct nmins sorted.

    Between passes a key is either *woken* (``PendingQueue.woken``: the next pass decides it)
    or *filed* under one limit that a decision found below its smallest nmin, with the
    watch that tells when that limit may have risen (see ``PendingQueue.file``). ``ver`` moves
    whenever the key is woken or filed again, so the watches of an earlier filing are
    stale (each watch entry holds the ``ver`` it was filed with); ``alive`` is False once
    the key has no intents left."""

    __slots__ = ("c", "d", "k", "dur", "spend", "by_nmin", "nmins", "ver", "alive")

    def __init__(self, key: tuple[int, int, int, int, int]) -> None:
        self.c, self.d, self.k, self.dur, self.spend = key
        self.by_nmin: dict[int, list[int]] = {}
        self.nmins: list[int] = []
        self.ver = 0
        self.alive = True

    def after(self, a: int, m: float) -> int | None:
        """The first arrival after ``a`` among the intents with nmin < m."""
        nmins = self.nmins
        if len(nmins) == 1:              # the usual key: one agent's retries of one size
            if nmins[0] >= m:
                return None
            lst = self.by_nmin[nmins[0]]
            if lst[0] > a:                 # (the intent at ``a`` was granted)
                return lst[0]
            i = bisect.bisect_right(lst, a)
            return lst[i] if i < len(lst) else None
        best = None
        for v in nmins:
            if v >= m:
                break
            lst = self.by_nmin[v]
            i = bisect.bisect_right(lst, a)
            if i < len(lst) and (best is None or lst[i] < best):
                best = lst[i]
        return best


class PendingQueue:
    """The pending intents of one broker, by id, by campaign and by key, and the wake-ups
    of the filed keys.

    ``intents`` (id → intent), ``ended`` (campaigns with a lease ended or renewed since the
    last pass) and ``wown`` (per campaign, the keys such an event wakes) are read by the
    compiled acquire path, which wakes a campaign's keys as its leases expire."""

    def __init__(self, b: "Broker", dims: int) -> None:
        self.b = b
        self.intents: dict[int, _Pending] = {}
        # per campaign: its pending intents, in arrival order (pending(campaign), the cap)
        self.by_campaign: dict[int, dict[int, _Pending]] = {}
        # per key (campaign, dim, class, duration, max_spend): its pending intents
        self.keys: dict[tuple[int, int, int, int, int], _PKey] = {}
        self.passes = 0                       # passes over the queue so far
        # serve by woken keys (True) or intent by intent over the whole queue (False: the
        # specification's procedure, which the keyed pass must equal; tests compare them)
        self.by_key = True
        # the queue's wake-ups (see file): the keys the next pass decides; the campaigns
        # with a lease ended or renewed since the last pass, and per campaign the keys
        # that such an event wakes; a min-heap of token wake times; per dimension, heaps
        # of capacity thresholds (free units for opportunistic keys, reachable units and
        # firm room for firm ones) and of the congestion multipliers keys failed at
        # (negated: a max-heap). Heap entries are (threshold, seq, ver, key).
        self.woken: dict[_PKey, None] = {}
        self.ended: set[int] = set()
        self.wown: dict[int, list[tuple[int, _PKey]]] = {}
        self.wtime: list[tuple[int, int, int, _PKey]] = []
        self.wfree: list[list[_Watch]] = [[] for _ in range(dims)]
        self.wreach: list[list[_Watch]] = [[] for _ in range(dims)]
        self.wroom: list[list[_Watch]] = [[] for _ in range(dims)]
        self.wprice: list[list[_Watch]] = [[] for _ in range(dims)]
        self.wseq = 0                         # watch entries pushed (heap ties, compaction)
        self.wlive = 0                        # watch entries since the last compaction

    def full(self, c: int, cap: int | None) -> _Pending | None:
        """The oldest waiting intent of campaign c when it has ``cap`` waiting (None: it
        has room, or there is no cap)."""
        mine = self.by_campaign.get(c)
        if cap is None or mine is None or len(mine) < cap:
            return None
        return next(iter(mine.values()))

    def add(self, iid: int, c: int, d: int, k: int, nmin: int, nmax: int, dur: int,
            spend: int, deadline: int | None, expires: int, reason: int,
            request: Intent | None, lims: tuple[int, ...], t: int) -> _Pending:
        """Queue an intent that a decision at t, in the state as it stands, failed at nmin
        (``lims``: that decision's limits)."""
        key = (c, d, k, dur, spend)
        q = self.keys.get(key)
        if q is None:
            q = self.keys[key] = _PKey(key)
            lower = True
        else:
            lower = nmin < q.nmins[0] and q not in self.woken
        p = _Pending(iid, c, d, k, nmin, nmax, dur, spend, deadline, expires, iid, reason,
                     request, q)
        self.intents[iid] = p
        mine = self.by_campaign.get(c)
        if mine is None:
            mine = self.by_campaign[c] = {}
        mine[iid] = p
        lst = q.by_nmin.get(nmin)
        if lst is None:
            lst = q.by_nmin[nmin] = []
            bisect.insort(q.nmins, nmin)
        if lst and iid < lst[-1]:
            bisect.insort(lst, iid)
        else:
            lst.append(iid)               # intent ids grow: arrival order
        if lower:
            # the decision failed it at nmin, now its key's smallest, in this state: file
            # the key (more pending demand below only raises the price)
            self.file(q, lims, t)
        if self.b.st.cls[k, 2]:
            self.b.st.pend[d] += nmax
        return p

    def drop(self, iid: int) -> _Pending:
        p = self.intents.pop(iid)
        mine = self.by_campaign[p.campaign]
        del mine[iid]
        if not mine:
            del self.by_campaign[p.campaign]
        q = p.key
        lst = q.by_nmin[p.nmin]
        if lst[0] == iid:                 # grants and expiries mostly take the oldest
            del lst[0]
        else:
            del lst[bisect.bisect_left(lst, iid)]
        if not lst:
            del q.by_nmin[p.nmin]
            q.nmins.remove(p.nmin)
            if not q.nmins:
                del self.keys[(p.campaign, p.dim, p.cls, p.dur, p.max_spend)]
                q.alive = False
                self.woken.pop(q, None)
        if self.b.st.cls[p.cls, 2]:
            self.b.st.pend[p.dim] -= p.nmax
        return p

    # -- wake-ups ---------------------------------------------------------------------------
    # A pass decides only the keys that can have become grantable since they last failed.
    # A key that fails at its smallest nmin m is filed under one limit found below m, with
    # the watch that says when that limit may have risen to m (``_file``); until then the
    # key provably fails, and skipping it changes nothing (a decision that fails only
    # settles buckets, which is path-independent). The limits (the core's k_decide)
    # rise only through
    #   * the key's own campaign: a lease of it ending (holding down, tokens and credits
    #     refunded, an unmet guarantee back) or renewed (tokens refunded): ``_lease_ended``;
    #     for a node of a tree of envelopes (SPEC §14.2), a lease of any node of its tree
    #     (its top-level ancestor's subtree), which can lower an ancestor's load, refund
    #     an ancestor's bucket or budget, or give slack back on its path: its keys are
    #     watched under that top-level node (``_owner``);
    #   * time: the bucket refilling (an exact wake time) — and the congestion window's
    #     bins rolling, which lowers the multiplier;
    #   * its dimension: free, reachable or firm room units up, the multiplier down
    #     (releases, expiries, revocations, nodes, pending demand leaving). These are
    #     thresholds on per-dimension figures, kept in heaps and compared at each pass (and
    #     after each grant of a pass: a grant lowers pending demand and can free units by
    #     revoking more than it takes, so the price or the free units can move up).

    def _owner(self, c: int) -> int:
        """Whose lease ends a key of campaign c watches: c's own, or for a node of a tree
        every node's of its tree, filed under its top-level node."""
        st = self.b.st
        return st.path(c)[-1] if st.in_tree(c) else c

    def lease_ended(self, c: int) -> None:
        """A lease of campaign c ended or was renewed: its keys' own limits may rise, and
        those of every node of its tree."""
        if self.wown:
            c = self._owner(c)
            if c in self.wown:
                self.ended.add(c)

    def leases_ended(self, campaigns: list[int]) -> None:
        """:meth:`lease_ended` for each of ``campaigns``."""
        if self.wown:
            ended = set(campaigns)
            if self.b.st.has_tree():
                ended = {self._owner(c) for c in ended}
            self.ended.update(ended.intersection(self.wown))

    def wake_campaign(self, c: int) -> None:
        """Wake every key of campaign c (its watches go stale): c has become a node of a
        tree of envelopes (its first child registered), whose keys are filed again under
        its tree's watches at the next pass."""
        for q in self.keys.values():
            if q.c == c:
                self._wake(q)

    def _wpush(self, h: list[_Watch], thr: int, q: _PKey) -> None:
        self.wseq += 1
        self.wlive += 1
        heapq.heappush(h, (thr, self.wseq, q.ver, q))

    def file(self, q: _PKey, lims: tuple[int, ...], t: int) -> None:
        """File key q, which a decision at t in the state as it stands found below its
        smallest nmin (``lims``: that decision's limits, in ``LIMITS`` order), under one
        limit that fails it, with that limit's watch; a rule without a watch of its own has
        its keys decided again at every pass. A node of a tree of envelopes watches the
        lease ends of its whole tree (``_owner``), and its firm room is its path's slack."""
        st, k = self.b.st, self.b._k
        m = q.nmins[0]
        lc, lcap, ltok, lcred = (lims[LIM_CEILING], lims[LIM_CAPACITY], lims[LIM_TOKENS],
                                 lims[LIM_CREDITS])
        q.ver += 1
        c, d = q.c, q.d
        own = True
        if lc < m:
            pass                                  # b - H: only its own lease ends raise it
        elif ltok < m:                            # when the bucket holds them, if ever
            w = k.token_wait(st, c, d, m, q.dur)
            if w > 0:
                self._wpush(self.wtime, t + w, q)
        elif lcred < m and not st.cls[q.k, 2]:
            pass                                  # unpriced: only refunds raise it
        elif lcap < m:
            if st.cls[q.k, 3]:                    # opportunistic: free - headroom >= m
                self._wpush(self.wfree[d], m, q)
                own = False
            elif k.dim_figures(st, d)[1] < m:     # what a reclaim can reach
                self._wpush(self.wreach[d], m, q)
                own = False
            else:                                 # cap - F - U + slack of c's path >= m
                self._wpush(self.wroom[d], m - k.path_slack(st, c, d), q)
        elif lcred < m:                           # credits at a congestion-priced price
            self._wpush(self.wprice[d], -k.congestion_mult(st, d), q)
        else:                                     # another rule: decided again each pass
            self._wake(q)
            own = False
        if own:
            self.wlive += 1
            c = self._owner(c)
            lst = self.wown.get(c)
            if lst is None:
                lst = self.wown[c] = []
            lst.append((q.ver, q))
        if self.wlive > 4 * len(self.keys) + 4096:
            self._compact()

    def _compact(self) -> None:
        """Drop stale watch entries (keys woken, filed again or gone since)."""
        live = 0
        for hs in (self.wfree, self.wreach, self.wroom, self.wprice, [self.wtime]):
            for h in hs:
                h[:] = [e for e in h if e[3].alive and e[3].ver == e[2]]
                heapq.heapify(h)
                live += len(h)
        for c in list(self.wown):
            lst = [e for e in self.wown[c] if e[1].alive and e[1].ver == e[0]]
            if lst:
                self.wown[c] = lst
                live += len(lst)
            else:
                del self.wown[c]
        self.wlive = live

    def _wake(self, q: _PKey) -> None:
        q.ver += 1                                # every other watch of q goes stale
        self.woken[q] = None

    def _wake_heap(self, h: list[_Watch], lim: int, woke: list[_PKey] | None) -> None:
        """Wake the keys of heap h whose threshold is at most ``lim``."""
        while h and h[0][0] <= lim:
            _, _, v, q = heapq.heappop(h)
            if q.alive and q.ver == v:
                self._wake(q)
                if woke is not None:
                    woke.append(q)

    def _dim_figures(self, d: int) -> tuple[int, int, int]:
        """Dimension d's free units above the warm headroom, reachable units (free,
        reclaimable, revoking beyond promises) and firm room (capacity − firm holdings −
        unmet guarantees): what capacity limits compare with."""
        free, reach, room = self.b._k.dim_figures(self.b.st, d)
        return int(free), int(reach), int(room)

    def wake_dim(self, d: int, woke: list[_PKey] | None = None) -> None:
        """Wake the keys filed on dimension d whose capacity threshold is met or whose
        congestion multiplier has fallen below the one they failed at."""
        if self.wfree[d] or self.wreach[d] or self.wroom[d]:
            free, reach, room = self._dim_figures(d)
            self._wake_heap(self.wfree[d], free, woke)
            self._wake_heap(self.wreach[d], reach, woke)
            self._wake_heap(self.wroom[d], room, woke)
        h = self.wprice[d]
        if h:
            self._wake_heap(h, -self.b._k.congestion_mult(self.b.st, d) - 1, woke)

    def _collect_wakes(self, t: int) -> None:
        """Wake every key whose watch has fired by t (the state as it stands)."""
        if self.ended:
            for c in self.ended:
                for v, q in self.wown.pop(c, ()):
                    if q.alive and q.ver == v:
                        self._wake(q)
            self.ended.clear()
        self._wake_heap(self.wtime, t, None)
        for d in range(len(self.b.dims)):
            self.wake_dim(d)

    def wake_due(self, t: int) -> bool:
        """Whether a pass at t has a key to decide (what ``_collect_wakes`` would wake, or
        stale entries it would drop): False means the pass would do nothing but count
        itself. Reads only (``FastAcquire`` does the same checks in C)."""
        if self.woken or self.ended:
            return True
        if self.wtime and self.wtime[0][0] <= t:
            return True
        for d in range(len(self.b.dims)):
            if self.wfree[d] or self.wreach[d] or self.wroom[d]:
                free, reach, room = self._dim_figures(d)
                if ((self.wfree[d] and self.wfree[d][0][0] <= free)
                        or (self.wreach[d] and self.wreach[d][0][0] <= reach)
                        or (self.wroom[d] and self.wroom[d][0][0] <= room)):
                    return True
            h = self.wprice[d]
            if h and h[0][0] < -self.b._k.congestion_mult(self.b.st, d):
                return True
        return False

    def _wake_all(self) -> None:
        """Every key woken (the watches dropped): after a pass intent by intent."""
        for h in (*self.wfree, *self.wreach, *self.wroom, *self.wprice, self.wtime):
            h.clear()
        self.wown.clear()
        self.ended.clear()
        self.wlive = 0
        for q in self.keys.values():
            self._wake(q)

    # -- the pass ---------------------------------------------------------------------------
    def serve(self, t: int) -> None:
        """Grant what the queue can have at t, in the order of SPEC §4.5.

        Only the keys woken since they last failed are decided (see ``_file``), each at
        its smallest nmin: if none can be granted, no intent can, and the pass is over
        (the pass over every intent would grant nothing either). Otherwise the keys that
        can go through :meth:`_serve_keys` in queue order, and every key it decided is
        decided again at its end and filed, or left woken for the next pass."""
        if not self.intents:
            return
        self.passes += 1
        if not self.by_key:
            self._serve_intents(t)
            return
        self._collect_wakes(t)
        woken = self.woken
        if not woken:
            return
        st, decide = self.b.st, self.b._k.decide
        cand = []
        for q in list(woken):
            m = q.nmins[0]
            n, _, _, _, lims = decide(st, q.c, q.d, q.k, m, m, q.dur, q.spend, t)
            if n >= m:
                cand.append(q)
            else:
                del woken[q]
                self.file(q, lims, t)
        if cand:
            self._serve_keys(t, cand)

    def _serve_intents(self, t: int) -> None:
        """The pass intent by intent, over the whole queue (the specification the pass by
        woken keys must equal: ``by_key = False``)."""
        st = self.b.st
        if len(self.intents) > 1:
            keys = list(self.keys.values())
            rows = np.array([(q.c, q.d, q.k, q.nmins[0], q.dur, q.spend) for q in keys],
                            dtype=np.int64).reshape(-1, 6)
            if self.b._k.decide_keys(st, rows, t, np.zeros(len(keys), dtype=np.int64)) < 0:
                self._wake_all()
                return                    # nothing grantable: the pass grants nothing
            for c, d in {(q.c, q.d) for q in keys}:
                self.b._k.settle(st, c, d, t)
            deficit = self.b._fair_keys(t)
            order = list(self.intents.values())
            camp = np.fromiter((p.campaign for p in order), np.int64, len(order))
            dim = np.fromiter((p.dim for p in order), np.int64, len(order))
            rank = st.cls[np.fromiter((p.cls for p in order), np.int64, len(order)), 0]
            arrival = np.fromiter((p.arrival for p in order), np.int64, len(order))
            # class rank, then deficit (largest first), tokens (largest first), arrival
            idx = np.lexsort((arrival, -st.T[camp, dim], -deficit[camp], rank))
            order = [order[i] for i in idx.tolist()]
        else:
            order = list(self.intents.values())
        # Within one pass grants only consume, so limits only shrink: once an intent of
        # (campaign, dim, class, duration, max_spend) fails at nmin m, any other with
        # nmin >= m fails too.
        failed: dict[tuple[Any, ...], int] = {}
        for p in order:
            if p.intent_id not in self.intents:
                continue
            if p.deadline is not None and p.deadline < t:
                continue
            key = (p.campaign, p.dim, p.cls, p.dur, p.max_spend)
            seen = failed.get(key)
            if seen is not None and p.nmin >= seen:
                continue
            self.b._reserve(1, p.nmax)
            n, reason, path, pm, _ = self.b._k.decide(st, p.campaign, p.dim, p.cls, p.nmin,
                                                    p.nmax, p.dur, p.max_spend, t)
            if n < p.nmin:
                if seen is None or p.nmin < seen:
                    failed[key] = p.nmin
                continue
            plan = None
            if path == RECLAIM:
                plan = self.b._plan_reclaim(p.dim, n, t)
                if p.deadline is not None and plan[1] > p.deadline:
                    continue
            self.b._grant_pending(p, n, path, pm, plan, t)
        self._wake_all()

    def _serve_keys(self, t: int, cand: list[_PKey]) -> None:
        """The pass of :meth:`_serve_pending` over the keys ``cand`` that can be granted.

        The intents of a key K share class rank, deficit and tokens, so ordering the keys
        by those (as they stand at the start of the pass) and merging the keys that tie by
        arrival gives the intent order of §4.5. Within one pass grants only consume, so
        limits only shrink: once an intent of K fails at nmin m, any later one of K with
        nmin >= m fails too and is skipped; ``_PKey.after`` finds the next one with
        nmin < m. The keys not decided fail wherever the pass reaches them — except that a
        grant can raise its dimension's figures (pending demand leaves, so the multiplier
        can fall; revoking more than it takes frees units): after each grant the keys of
        that dimension whose watch fires join the pass where it has not reached them yet
        (those it has passed failed there, and stay woken for the next pass)."""
        st, pend, decide, settle = self.b.st, self.intents, self.b._k.decide, self.b._k.settle
        deficit = self.b._fair_keys(t) if len(pend) > 1 else None
        tok0: dict[tuple[int, int], int] = {}

        def place(q: _PKey) -> tuple[Any, ...]:
            cd = (q.c, q.d)
            tok = tok0.get(cd)
            if tok is None:                       # no grant to (c, d) yet in this pass
                settle(st, q.c, q.d, t)
                tok = tok0[cd] = int(st.T[q.c, q.d])
            dv = float(deficit[q.c]) if deficit is not None else 0.0
            # (lexsort's order: a NaN deficit after every number)
            return (int(st.cls[q.k, 0]), (1, 0.0) if dv != dv else (0, -dv), -tok)

        inf = math.inf
        heap = []
        members: list[_PKey] = []
        for q in cand:
            members.append(q)
            a = q.after(-1, inf)
            if a is not None:
                heap.append((place(q), a, q))
        heapq.heapify(heap)
        low: dict[_PKey, int] = {}
        woke: list[_PKey] = []
        while heap:
            o, a, q = heap[0]
            p = pend.get(a)
            if p is not None and (p.deadline is None or p.deadline >= t):
                self.b._reserve(1, p.nmax)
                n, reason, path, pm, _ = decide(st, p.campaign, p.dim, p.cls, p.nmin,
                                                p.nmax, p.dur, p.max_spend, t)
                if n < p.nmin:
                    low[q] = p.nmin
                else:
                    plan = None
                    if path == RECLAIM:
                        plan = self.b._plan_reclaim(p.dim, n, t)
                    if plan is None or p.deadline is None or plan[1] <= p.deadline:
                        self.b._grant_pending(p, n, path, pm, plan, t)
                        self.wake_dim(p.dim, woke)
                        for q2 in woke:
                            o2 = place(q2)
                            a2 = (q2.after(-1, inf) if o2 > o else
                                  q2.after(a, inf) if o2 == o else None)
                            if a2 is not None:
                                members.append(q2)
                                heapq.heappush(heap, (o2, a2, q2))
                        woke.clear()
                    # else: its reclaim plan misses its deadline; it waits on
            nxt = q.after(a, low.get(q, inf)) if q.alive else None
            if nxt is None:
                heapq.heappop(heap)
            else:
                heapq.heapreplace(heap, (o, nxt, q))
        for q in members:
            if not q.alive or q not in self.woken:
                continue
            m = q.nmins[0]
            n, _, _, _, lims = decide(st, q.c, q.d, q.k, m, m, q.dur, q.spend, t)
            if n < m:
                del self.woken[q]
                self.file(q, lims, t)

    def reasons(self, ps: Iterable[_Pending]) -> list[int]:
        """The reason code of each pending intent: the rule that binds it in the state as
        it stands (the first of ceiling, capacity, tokens, credits whose limit is at most
        max(0, the smallest limit) — what a pass would report for it now; for an intent
        that the next pass could grant, the tightest rule). Its key's limits are the same
        for all its intents: one decision per key."""
        st, decide, t = self.b.st, self.b._k.decide, self.b._cur.t
        why: dict[_PKey, int] = {}
        out = []
        for p in ps:
            q = p.key
            r = why.get(q)
            if r is None:
                _, _, _, _, lims = decide(st, q.c, q.d, q.k, 1, 1, q.dur, q.spend, t)
                bound = max(0, min(lims))
                r = why[q] = next(code for code, lim in zip(LIMIT_REASONS, lims)
                                  if lim <= bound)
            out.append(r)
        return out

    def listing(self, c: int | None) -> list[dict[str, Any]]:
        """:meth:`Broker.pending`: the intents of campaign c (all: None), in arrival order,
        each with the rule that binds it now."""
        b = self.b
        ps = list((self.intents if c is None else self.by_campaign.get(c, {})).values())
        return [{"intent_id": p.intent_id, "campaign": b._names[p.campaign],
                 "dim": b.dims[p.dim], "min": p.nmin, "max": p.nmax,
                 "duration": p.dur / NS, "reason": REASONS[r],
                 "expires": p.expires / NS, "service_class": b.classes[p.cls].name}
                for p, r in zip(ps, self.reasons(ps))]
