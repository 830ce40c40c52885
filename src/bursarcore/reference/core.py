"""The reference broker's core: state, time, the admission decision, the pending queue
and the lease lifecycle, written from docs/spec.md (see :mod:`.broker`)."""

from __future__ import annotations

import heapq
import math
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from .. import units
from ..admission.classes import DEFAULT_CLASSES, Congestion, ServiceClass
from ..admission.envelope import MAX_DURATION, Envelope, Intent, Pool, intent_inputs
from ..clock import ManualClock
from ..errors import InvalidArgument, TimeWentBackwards, UnknownCampaign, UnknownLease
from ..journal.base import Journal
from .journaling import JournalWriter
from .leases import Campaign, Dimension, LeaseRecord, LeaseStore, seconds
from .pending import PendingIntent, PendingQueue
from . import fairshare, tree
from .rules import (CAPACITY, CREDIT, DEADLINE, NS, OK, PENDING_LIMIT, PPM,
                    REASONS, RECLAIM, TOKENS, TTL, WARM, ClassTerms, Limits,
                    congestion_multiplier, excess, lease_cost, limits, never, wrap)

__all__ = ["BrokerCore"]

REUSE_AFTER = 1024          # SPEC §4.6: rows of ended leases are reused after this many
MAX_PENDING = 1024          # SPEC §4.4: pending intents per campaign, by default
FS_REBASE = 256.0           # SPEC §6: the usage epoch moves when this many half-lives behind

# timers at one instant run in this order (SPEC §4.6, §4.5): revocations, activations,
# expiries of pending intents
_REVOKE, _ACTIVATE, _PENDING_END = 0, 1, 2


def _types() -> tuple[Any, ...]:
    from ..broker import BatchResult, Consumption, Decision, DimSupply, Event, Lease, Quote, Supply
    return Decision, Lease, Event, Supply, DimSupply, Quote, Consumption, BatchResult


class BrokerCore:
    """An agent resource broker over one pool, written from the specification.

    Same parameters, methods and results as :class:`bursarcore.Broker`; ``backend`` may
    only be ``None`` or ``"reference"``.
    """

    def __init__(self, pool: Pool, clock: Any = None, *, classes: Iterable[ServiceClass] | None = None,
                 congestion: Congestion | None = None, price: Mapping[str, float] | None = None,
                 ttl: float = 900.0, half_life: float = 600.0, enforcement: str = "prepaid",
                 backend: str | None = None, cold_wait: Any = None,
                 journal: Journal | None = None, durable: bool = False,
                 reuse_after: int | None = REUSE_AFTER,
                 max_pending: int | None = MAX_PENDING, borrow_grace: float = 60.0) -> None:
        (self._Decision, self._Lease, self._Event, self._Supply, self._DimSupply, self._Quote,
         self._Consumption, self._BatchResult) = _types()
        if not isinstance(pool, Pool):
            raise InvalidArgument("pool", "must be a Pool", pool)
        self._pool = pool
        self.clock = clock if clock is not None else ManualClock(0.0)
        self.classes = tuple(classes) if classes is not None else DEFAULT_CLASSES
        names = [c.name for c in self.classes]
        if not self.classes or len(set(names)) != len(names):
            raise InvalidArgument("classes", "must be a non-empty table with unique names", names)
        self._cls_index = {c.name: i for i, c in enumerate(self.classes)}
        # SPEC §7: the class table in engine units
        self._terms = [ClassTerms(c.name, c.rank, round(c.multiplier * PPM),
                                  bool(c.congestion_priced), bool(c.preemptible),
                                  units.to_ns(c.grace), bool(c.free_when_broke))
                       for c in self.classes]
        self.congestion = congestion or Congestion()
        if enforcement not in ("prepaid", "instant"):
            raise InvalidArgument("enforcement", "must be 'prepaid' or 'instant'", enforcement)
        self.enforcement = enforcement
        self._instant = enforcement == "instant"
        for name, v, hi in (("ttl", ttl, units.MAX_TTL), ("half_life", half_life, MAX_DURATION)):
            if units.real(v, name, hi=hi, what="a number of seconds") <= 0:
                raise InvalidArgument(name, "must be > 0", v)
        self.ttl, self.half_life = float(ttl), float(half_life)
        if units.real(borrow_grace, "borrow_grace", hi=MAX_DURATION,
                      what="a number of seconds") <= 0:
            raise InvalidArgument("borrow_grace", "must be > 0", borrow_grace)
        self.borrow_grace = float(borrow_grace)
        if backend not in (None, "reference"):
            raise InvalidArgument("backend", "must be 'reference' (or None)", backend)
        self.backend = "reference"
        if reuse_after is not None and (not isinstance(reuse_after, int)
                                        or isinstance(reuse_after, bool) or reuse_after < 0):
            raise InvalidArgument("reuse_after", "must be None or an integer >= 0", reuse_after)
        self.reuse_after = reuse_after
        if max_pending is not None and (not isinstance(max_pending, int)
                                        or isinstance(max_pending, bool) or max_pending < 0):
            raise InvalidArgument("max_pending", "must be None or an integer >= 0", max_pending)
        self.max_pending = max_pending
        self.dims = pool.dims
        self._dim_index = {d: i for i, d in enumerate(self.dims)}
        self.flow_dims = list(pool.flow)
        self._flow_index = {d: i for i, d in enumerate(self.flow_dims)}
        price = dict(price or {})
        for d in price:
            if d not in self._dim_index and d not in pool.flow:
                raise InvalidArgument(f"price[{d}]", "names a dimension the pool lacks", d)
        # SPEC §4.3, §5: held prices per unit-hour (default 1), flow prices per unit (default 0)
        self.price = {d: units.real(price.get(d, 1.0), f"price[{d}]", hi=units.MAX_PRICE)
                      for d in self.dims}
        self.price.update({d: units.real(price.get(d, 0.0), f"price[{d}]", hi=units.MAX_PRICE)
                           for d in self.flow_dims})
        self._held_price = [round(self.price[d] * CREDIT) for d in self.dims]
        self._flow_price = [round(self.price[d] * CREDIT) for d in self.flow_dims]
        self.cold_wait = cold_wait
        self._t = units.to_ns(self.clock.now())
        self._dim = [Dimension(d, pool.capacity[d], pool.warm_headroom[d],
                               list(pool.slot_map[d])) for d in self.dims]
        self._camps: list[Campaign] = []
        self._cindex: dict[str, int] = {}
        self.envelopes: dict[str, Envelope] = {}
        self._leases = LeaseStore(reuse_after)
        self._queue = PendingQueue()
        self._timers: list[tuple[int, int, int, int]] = []   # (time, kind, seq, id)
        self._timer_seq = 0
        self._activation: dict[int, int] = {}                 # starting lease -> its start
        self._events: list[Any] = []
        self._subscribers: list[Callable[[Any], None]] = []
        self._next_intent = 0
        # SPEC §7: the congestion window, a ring of bins of unmet priced demand per dimension
        cg = self.congestion
        self._bins = cg.bins
        self._bin_ns = max(1, units.to_ns(cg.window) // cg.bins)
        self._bin = self._t // self._bin_ns
        self._ring = [[0] * cg.bins for _ in self.dims]
        self._cong_thr = tuple(round(x * PPM) for x in cg.thresholds)
        self._cong_mult = tuple(round(x * PPM) for x in cg.multipliers)
        # SPEC §6: usage weights 2^((τ − E)/half-life) from the epoch E
        self._hl = max(1, units.to_ns(self.half_life, "half_life"))
        self._epoch = self._t
        self.flow = None
        if self.flow_dims:
            from .flow import FlowEngine
            self.flow = FlowEngine(pool.flow, window=1.0, now=self._t / NS)
        if journal is not None and not isinstance(journal, Journal):
            raise InvalidArgument("journal", "must be a bursarcore.journal.Journal", journal)
        if journal is not None and len(journal):
            raise InvalidArgument("journal", "is not empty: rebuild the broker from it with "
                                  "Broker.replay(journal)", len(journal))
        self.journal = journal
        self.durable = bool(durable)
        self._jw = JournalWriter(self, journal) if journal is not None else None
        if self._jw is not None:
            self._jw.config()


    @property
    def pool(self) -> Pool:
        """The pool as it stands: its capacity follows nodes joining and leaving (a removed
        node's held slots leave it as their leases end, SPEC §12)."""
        for dm in self._dim:
            self._pool.capacity[dm.name] = dm.cap
        return self._pool
    def _end_op(self) -> None:
        if self.journal is not None:
            self.journal.end_op(self.durable)

    # ------------------------------------------------------------------ the tree (§14)
    def _path(self, c: Campaign) -> list[Campaign]:
        """SPEC §14: c and its ancestors, c first."""
        return [self._camps[v] for v in c.path]

    def _settle_path(self, c: Campaign, d: int, t: int) -> None:
        """Bring the buckets of c and of its ancestors on d up to t (SPEC §4.2, §14)."""
        for v in self._path(c):
            v.hold[d].settle(t, self._instant)

    def _reload(self, d: int) -> None:
        """SPEC §14.2: every node's load K on d, recomputed from its definition."""
        for c, k in zip(self._camps, tree.loads(self._camps, d)):
            c.hold[d].K = k

    def _unmet(self, d: int) -> int:
        """The reserve of unmet guarantees on d: Σ_top R − F (SPEC §14; U of SPEC §4.1 in a
        flat set of campaigns)."""
        return tree.reserve(self._camps, d) - self._dim[d].F

    def campaign_index(self, name: str) -> int:
        try:
            return self._cindex[name]
        except (KeyError, TypeError):
            raise UnknownCampaign("campaign", "is not registered", name) from None

    @property
    def campaigns(self) -> list[str]:
        return [c.name for c in self._camps if not c.removed]

    # ------------------------------------------------------------------ time (§2)
    _t_force: int | None = None       # replay runs each input at its recorded time

    # replay's hold on time (journal.replay): each input re-executed at its recorded ns
    def _start_time(self, t: int) -> None:
        """Replay: the broker's time is ``t`` ns exactly (the journal's first record)."""
        self._t = t

    def _pin_time(self, t: int | None) -> None:
        """Replay: take the next operations at ``t`` ns (None: at the clock's time again)."""
        self._t_force = t

    def _end_replay(self) -> int:
        """Replay is over: time is the clock's again, and the events the replayed inputs
        queued are dropped (the original delivered them). Returns the broker's time (ns)."""
        self._t_force = None
        self._events = []
        return self._t

    def _now(self) -> int:
        if self._t_force is not None:
            return self._t_force
        t = units.to_ns(self.clock.now(), "clock")
        if t < self._t:
            raise TimeWentBackwards("clock", f"must not run backwards (last {self._t / NS})",
                                    t / NS)
        return t

    def _timer(self, t: int, kind: int, ident: int) -> None:
        self._timer_seq += 1
        heapq.heappush(self._timers, (t, kind, self._timer_seq, ident))

    def _advance(self, t: int) -> None:
        """Move time to t: every lease end, revocation, activation and pending expiry due
        by t happens at its own time, in time order; the pending queue is served at each
        timer's instant and at t (SPEC §4.5, §4.6)."""
        moved = t > self._t
        while self._timers and self._timers[0][0] <= t:
            te = self._timers[0][0]
            self._expire_until(te)
            while self._timers and self._timers[0][0] == te:
                _, kind, _, ident = heapq.heappop(self._timers)
                self._run_timer(kind, ident, te)
            self._serve(te)
        note = moved and bool(self._queue) and self._jw is not None
        self._roll_window(t)
        freed = self._expire_until(t)
        if moved or freed:
            self._serve(t)
        self._t = max(self._t, t)
        if note and self._jw is not None:
            self._jw.advance(t)

    def _expire_until(self, t: int) -> int:
        """SPEC §4.6: active and revoking leases whose expiry is due end as ``expired``,
        each at its expiry, in order of (expiry, lease id)."""
        due = sorted((x.end, x.id) for x in self._leases.live()
                     if x.state in ("active", "revoking") and x.end is not None and x.end <= t)
        for end, lid in due:
            rec = self._leases.get(lid)
            if rec is None or rec.state not in ("active", "revoking") or rec.end != end:
                continue
            self._end(rec, end, "expired")
            self._emit("expired", end, rec.campaign, lease=rec)
        return len(due)

    def _run_timer(self, kind: int, ident: int, t: int) -> None:
        if kind == _REVOKE:
            rec = self._leases.get(ident)
            if rec is not None and rec.state == "revoking" and rec.revoke_at == t:
                self._end(rec, t, "revoked")          # SPEC §4.6: revoked at its deadline
                self._emit("revoked", t, rec.campaign, lease=rec)
        elif kind == _ACTIVATE:
            self._activation.pop(ident, None)
            rec = self._leases.get(ident)
            if rec is None or rec.state != "starting":
                return
            if len(self._dim[rec.dim].free) < rec.units:
                # the pool shrank under a reclaim grant (nodes left): it cannot be placed
                rec.revoke_at = t
                self._end(rec, t, "revoked")
                self._emit("revoked", t, rec.campaign, lease=rec, reason=CAPACITY)
            else:
                dim = self._dim[rec.dim]
                dim.promised -= rec.units
                del dim.timeline[rec.id]
                self._place(rec, t)                   # SPEC §4.6: starting → active
                self._emit("activated", t, rec.campaign, lease=rec)
        else:
            p = self._queue.get(ident)
            if p is not None and p.expires == t:
                # SPEC §4.4: a pending intent's deadline or TTL passed: a refused event
                reason = DEADLINE if p.deadline is not None and p.deadline <= t else TTL
                self._drop(p)
                self._emit("refused", t, p.campaign, intent=p, reason=reason)

    def _roll_window(self, t: int) -> None:
        """SPEC §7: move the congestion window to the bin holding t, emptying bins that
        left it."""
        b = t // self._bin_ns
        if b <= self._bin:
            return
        for ring in self._ring:
            for j in range(1, min(b - self._bin, self._bins) + 1):
                ring[(self._bin + j) % self._bins] = 0
        self._bin = b

    def _emit(self, kind: str, t: int, c: int, lease: LeaseRecord | None = None,
              intent: PendingIntent | None = None, deadline: int | None = None,
              reason: int = 0, path: int = WARM) -> None:
        ev = self._Event(kind, t / NS, self._camps[c].name,
                         lease_id=None if lease is None else lease.id,
                         intent_id=None if intent is None else intent.intent_id,
                         deadline=seconds(deadline), reason=REASONS[reason] or None,
                         units=0 if lease is None else lease.units)
        self._events.append(ev)
        for fn in self._subscribers:
            fn(ev)
        if self._jw is not None:
            self._jw.event(kind, t, c, lease, intent, deadline, reason, path)

    # ------------------------------------------------------------------ fair share (§6)
    def _weight(self, t: int) -> float:
        """w(t) = 2^((t − E)/half-life), moving the epoch E to t when t is far past it
        (every campaign's folded usage rescaled alike, so no usage changes)."""
        x = float(t - self._epoch) / float(self._hl)
        if x > FS_REBASE:
            f = math.pow(2.0, -x)
            for c in self._camps:
                c.fs_S *= f
                c.fs_G *= f
            self._epoch = t
            x = 0.0
        return math.pow(2.0, x)

    def _fold(self, c: Campaign, t: int) -> None:
        """SPEC §6: fold ∫ H·w dτ up to t into c's usage before its primary holding
        changes (S += H·(w(t) − w(last change))); H is c's own holding (SPEC §14: fair
        share ranks every node by its own leases)."""
        w = self._weight(t)
        c.fs_S = c.fs_S + float(c.hold[0].own) * (w - c.fs_G)
        c.fs_G = w

    def _usage(self, t: int) -> list[float]:
        """SPEC §6: usage_c(t) = ∫ H_c(τ)·2^(−(t − τ)/half-life) dτ, in unit-seconds."""
        inv = math.pow(2.0, -(float(t - self._epoch) / float(self._hl)))
        scale = self._hl / math.log(2) / NS
        return [(c.fs_S * inv + float(c.hold[0].own) * (1.0 - c.fs_G * inv)) * scale
                for c in self._camps]

    def _deficits(self, t: int) -> list[float]:
        """SPEC §6, §14.6: the deficits, or with a tree the level deficits."""
        return fairshare.deficits(self._camps, self._usage(t))

    def deficits(self) -> dict[str, float]:
        """SPEC §6 at the broker time; a read."""
        try:
            t = self._now()
            self._advance(t)
            deficit = self._deficits(t)
            return {c.name: deficit[c.index] for c in self._camps if not c.removed}
        finally:
            self._end_op()

    # ------------------------------------------------------------------ holdings and prices
    def _change_holding(self, c: Campaign, d: int, delta: int, firm: bool, t: int) -> None:
        """c's own holding, the holding of every node on its path and, for a firm lease,
        F move by delta (SPEC §4.1, §14), and the loads are recomputed (only those on c's
        path can change). The path's buckets are settled to t first."""
        if d == 0:
            self._fold(c, t)
        self._settle_path(c, d, t)
        c.hold[d].own += delta
        if firm:
            c.hold[d].own_firm += delta
            self._dim[d].F += delta
        for v in self._path(c):
            v.hold[d].H += delta
            if firm:
                v.hold[d].Hf += delta
        self._reload(d)                                                    # SPEC §14.2

    def _kappa_ppm(self, d: int) -> int:
        """SPEC §7: κ = (unmet priced demand in the window + pending priced demand) /
        max(1, free units), in ppm."""
        dim = self._dim[d]
        return (sum(self._ring[d]) + dim.pending_priced) * PPM // max(1, dim.free_now())

    def _multiplier(self, d: int) -> int:
        return congestion_multiplier(self._kappa_ppm(d), self._cong_thr, self._cong_mult)

    def _unit_price(self, d: int, k: int) -> int:
        """SPEC §4.3, §7: micro-credits per unit-hour of class k on d now: the unit price
        times the class multiplier times, for a congestion-priced class, the congestion
        multiplier (each product rounded down to a micro-credit)."""
        m = self._terms[k].mult
        if self._terms[k].priced:
            m = m * self._multiplier(d) // PPM
        return self._held_price[d] * m // PPM

    def _charge(self, c: Campaign, k: int, price: int) -> int:
        """SPEC §4.3, §14: a ``free_when_broke`` class is served free when a budget on c's
        path cannot pay."""
        if self._terms[k].free_when_broke and price > min(v.left for v in self._path(c)):
            return 0
        return price

    def _shortfall(self, d: int, n: int) -> None:
        """SPEC §7: unmet priced demand enters the window's current bin."""
        self._ring[d][self._bin % self._bins] += n

    # ------------------------------------------------------------------ the decision (§4.4)
    def _limits(self, c: Campaign, d: int, k: int, dur: int, spend: int | None, t: int,
                borrowing: bool = False) -> Limits:
        """What each rule allows one more lease of c for dur ns at t (SPEC §4.1–§4.4);
        ``borrowing``: a borrowed lease's (SPEC §14.8)."""
        self._settle_path(c, d, t)
        firm = tree.firm_room(self._camps, self._dim[d].cap, c, d)          # SPEC §14
        E = tree.absorbed(self._camps, [x.hold[d].K for x in self._camps], c, d)
        borrow = tree.borrow_room(self._camps, c, d) if borrowing else None  # SPEC §14.8
        return limits(self._path(c), d, self._dim[d], self._terms[k], dur, spend,
                      self._unit_price(d, k), self._instant, firm, E, borrow)

    def _levels(self, c: Campaign, d: int, k: int, dur: int,
                spend: int | None) -> tuple[list[int], list[int]]:
        """SPEC §14.2: per rule, the node of c's path whose limit it is, and its figure
        (:func:`tree.binding_levels`); after :meth:`_limits` at the same time (settled)."""
        E = tree.absorbed(self._camps, [x.hold[d].K for x in self._camps], c, d)
        return tree.binding_levels(self._path(c), d, E, dur, self._instant, spend,
                                   self._terms[k].free_when_broke)

    def _never(self, c: Campaign, d: int, k: int, nmin: int, dur: int, price: int) -> int:
        """SPEC §4.4: the rule by which an intent can never be met, else OK."""
        bound = tree.firm_bound(self._camps, self._dim[d].cap, c, d)        # SPEC §14
        idle = tree.idle_loads(self._camps, d)
        rise = tree.rises(self._camps, idle, c, d, nmin)
        return never(self._path(c), d, self._dim[d], self._terms[k], bound, nmin, dur, price,
                     self._instant, [idle[v] for v in c.path], rise)

    def _retry_after(self, c: Campaign, d: int, nmin: int, dur: int, reason: int) -> float | None:
        """SPEC §4.4: for tokens, until the refill covers the minimum (none while nothing
        refills); for capacity, until the next scheduled expiry."""
        if reason == TOKENS:
            # SPEC §14: every bucket on the path that cannot cover the minimum must refill
            wait = 0
            rise = tree.rises(self._camps, [x.hold[d].K for x in self._camps], c, d, nmin)
            for v, r in zip(self._path(c), rise):
                h = v.hold[d]
                cost = excess(h.K, r, h.s) * dur
                need = cost - h.T
                if need <= 0:
                    continue
                if self._instant or h.s - h.K <= 0 or cost > h.B:
                    return None     # nothing refills, or the bucket can never hold the cost
                wait = max(wait, -(-need // (h.s - h.K)))
            return wait / NS if wait else None
        if reason == CAPACITY:
            ends = [x.end for x in self._leases.live()
                    if x.state in ("active", "revoking") and x.end is not None]
            return max(0, min(ends) - self._t) / NS if ends else None
        return None

    # ------------------------------------------------------------------ acquire (§4)
    def acquire(self, intent: Intent) -> Any:
        """SPEC §4: decide an intent now: granted, pending or refused with a reason."""
        try:
            c, d, k, nmin, nmax, dur, spend, deadline, ttl = intent_inputs(self, intent)
            t = self._now()
            self._advance(t)
            return self._decide(c, d, k, nmin, nmax, dur, spend, deadline, ttl, t)
        finally:
            self._end_op()

    def _class_of(self, campaign: str, name: str | None) -> int:
        cname = name if name is not None else self.envelopes[campaign].service_class
        try:
            return self._cls_index[cname]
        except KeyError:
            raise InvalidArgument("service_class", f"must be one of {list(self._cls_index)}",
                                  cname) from None

    def _decide(self, ci: int, d: int, k: int, nmin: int, nmax: int, dur: int,
                spend: int | None, deadline: int | None, ttl: int, t: int,
                batch: int = 0) -> Any:
        iid = self._next_intent
        self._next_intent += 1
        c = self._camps[ci]
        before = self._jw.before(c, d, k, dur, spend, t) if self._jw is not None else None
        dec = self._decide_intent(iid, c, d, k, nmin, nmax, dur, spend, deadline, ttl, t)
        if self._jw is not None and before is not None:
            dec = self._jw.acquire(dec, before, ci, d, k, nmin, nmax, dur, spend, deadline,
                                   ttl, t, iid, batch)
        return dec

    def _decide_intent(self, iid: int, c: Campaign, d: int, k: int, nmin: int, nmax: int,
                       dur: int, spend: int | None, deadline: int | None, ttl: int,
                       t: int) -> Any:
        Dec = self._Decision
        if deadline is not None and deadline < t:
            return Dec("refused", iid, c.name, reason="deadline")          # SPEC §4.4
        lim = self._limits(c, d, k, dur, spend, t)
        n = lim.size(nmax)
        cls = self._terms[k]
        if n < nmax and not cls.preemptible and c.hold[d].borrowed < c.hold[d].borrow:
            # SPEC §14.8: cut short by its firm room, a borrower may borrow what gives it more
            blim = self._limits(c, d, k, dur, spend, t, borrowing=True)
            nb = blim.size(nmax)
            if nb >= nmin and nb > (n if n >= nmin else 0):
                if cls.priced and blim.capacity < nmax and nb < nmax:
                    self._shortfall(d, nmax - nb)
                rec = self._grant(c, d, k, nb, dur, blim.price, t, iid, starting=False,
                                  borrowed=True)
                return Dec("granted", iid, c.name, units=nb, lease=self._snapshot(rec),
                           path="borrow", cost=rec.cost / CREDIT)
        if n >= nmin and n <= lim.warm:
            # SPEC §7: the part of a priced request that capacity cut off is unmet demand
            if cls.priced and lim.capacity < nmax and n < nmax:
                self._shortfall(d, nmax - n)
            rec = self._grant(c, d, k, n, dur, lim.price, t, iid, starting=False)
            return Dec("granted", iid, c.name, units=n, lease=self._snapshot(rec), path="warm",
                       cost=rec.cost / CREDIT)
        if n < nmin:
            reason = lim.binding(n)
            never = self._never(c, d, k, nmin, dur, lim.price)
            if never != OK:                                                # SPEC §4.4
                if cls.priced and never == CAPACITY:
                    self._shortfall(d, nmax)
                return Dec("refused", iid, c.name, reason=REASONS[never],
                           retry_after=self._retry_after(c, d, nmin, dur, never))
        else:
            # SPEC §4.1: too few free units; opportunistic leases are preempted for the rest
            victims, at = self._plan_reclaim(d, n, t)
            if deadline is not None and at > deadline:
                return Dec("refused", iid, c.name, reason="deadline", wait=(at - t) / NS)
            rec = self._reclaim(c, d, k, n, dur, lim.price, t, iid, victims, at)
            return Dec("granted", iid, c.name, units=n, lease=self._snapshot(rec),
                       path="reclaim", cost=rec.cost / CREDIT, wait=(at - t) / NS)
        # SPEC §4.4: it pends, unless its campaign is at its pending cap
        mine = self._queue.of_campaign(c.index)
        if self.max_pending is not None and mine and len(mine) >= self.max_pending:
            return Dec("refused", iid, c.name, reason=REASONS[PENDING_LIMIT],
                       retry_after=max(0, mine[0].expires - t) / NS)
        if self.max_pending == 0:
            return Dec("refused", iid, c.name, reason=REASONS[PENDING_LIMIT])
        expires = t + ttl if deadline is None else min(t + ttl, deadline)
        p = PendingIntent(iid, c.index, d, k, nmin, nmax, dur, spend, deadline, expires)
        self._queue.add(p)
        if cls.priced:
            self._dim[d].pending_priced += nmax       # SPEC §7: pending priced demand
        self._timer(expires, _PENDING_END, iid)
        return Dec("pending", iid, c.name, reason=REASONS[reason],
                   retry_after=self._retry_after(c, d, nmin, dur, reason))

    def _grant(self, c: Campaign, d: int, k: int, n: int, dur: int, price: int, t: int,
               intent: int, starting: bool, borrowed: bool = False) -> LeaseRecord:
        """Commit a grant (SPEC §4.2, §4.3): debit excess·d tokens and escrow the cost at
        this moment's price; a warm grant is placed now, a reclaim grant is ``starting``."""
        cls = self._terms[k]
        self._settle_path(c, d, t)
        # SPEC §4.2, §14.2: each node of the path prepays the rise of its load above its s
        exs = []
        rise = tree.rises(self._camps, [x.hold[d].K for x in self._camps], c, d, n)
        for v, r in zip(self._path(c), rise):
            h = v.hold[d]
            ex = 0 if self._instant else excess(h.K, r, h.s)
            h.T -= ex * dur
            exs.append(ex)
        # SPEC §4.3, §14: one cost, escrowed in every budget of the path
        charge = self._charge(c, k, lease_cost(n, dur, price))
        for v in self._path(c):
            if not v.unlimited:
                v.left -= charge
            v.escrow = wrap(v.escrow + charge)
        firm = not cls.preemptible and not borrowed      # SPEC §14.8: borrowed: revocable
        self._change_holding(c, d, n, firm, t)
        if borrowed:
            c.hold[d].borrowed += n
        rec = LeaseRecord(id=self._leases.new_id(), campaign=c.index, dim=d, units=n,
                          firm=firm, cls=k, state="starting", granted_at=t,
                          dur=dur, excess=exs, cost=charge, intent=intent, borrowed=borrowed)
        self._leases.put(rec)
        if starting:
            self._dim[d].promised += n
        else:
            self._place(rec, t)
        return rec

    def _place(self, rec: LeaseRecord, t: int) -> None:
        """The lease takes its slots and becomes active, expiring after its duration."""
        dim = self._dim[rec.dim]
        rec.slots = dim.take(rec.units)
        dim.occupied += rec.units
        if not rec.firm:
            dim.opp_active += rec.units
        rec.state, rec.start, rec.end = "active", t, t + rec.dur

    def _plan_reclaim(self, d: int, n: int, t: int) -> tuple[list[LeaseRecord], int]:
        """SPEC §4.1: units already revoking (not promised) count first, at their
        deadlines; then active opportunistic leases in order of smallest fair-share
        deficit, largest lease, lease id, each revocable after its class's grace."""
        dim = self._dim[d]
        need = n - max(0, dim.free_now())
        at = t
        surplus = dim.surplus()
        if need > 0 and surplus > 0:
            at = max([at] + [x.revoke_at or 0 for x in self._leases.live()
                             if x.dim == d and x.state == "revoking"])
            need -= surplus
        victims: list[LeaseRecord] = []
        opp = [x for x in self._leases.live()
               if x.dim == d and x.state == "active" and not x.firm] if need > 0 else []
        if opp:
            deficit = self._deficits(t)
            if self._jw is not None:
                self._jw.deficits = deficit
            # SPEC §14.8: opportunistic leases before borrowed ones
            if fairshare.is_tree(self._camps):   # SPEC §14.6: the last in the order first
                place = fairshare.fair_tree_rank(self._camps, deficit)
                opp.sort(key=lambda x: (x.borrowed, -place[x.campaign], -x.units, x.id))
            else:
                opp.sort(key=lambda x: (x.borrowed, deficit[x.campaign], -x.units, x.id))
            for x in opp:
                if need <= 0:
                    break
                victims.append(x)
                need -= x.units
                at = max(at, t + self._revoke_grace(x))
        if need > 0:
            raise RuntimeError(f"reference broker: reclaim plan short by {need} units")
        return victims, at

    def _revoke_grace(self, x: LeaseRecord) -> int:
        """ns from a preemption notice to the revocation: the lease's class grace, or the
        broker's ``borrow_grace`` for a borrowed lease (SPEC §14.8)."""
        return units.to_ns(self.borrow_grace) if x.borrowed else self._terms[x.cls].grace

    def _reclaim(self, c: Campaign, d: int, k: int, n: int, dur: int, price: int, t: int,
                 intent: int, victims: list[LeaseRecord], at: int) -> LeaseRecord:
        """SPEC §4.1, §4.6: preempt the victims (a notice now, revoked at now + grace) and
        grant a lease that starts when they are gone."""
        dim = self._dim[d]
        for v in victims:
            v.state, v.revoke_at = "revoking", t + self._revoke_grace(v)
            dim.revoking += v.units
            dim.opp_active -= v.units
            dim.timeline[v.id] = (v.revoke_at, -v.units)
            self._timer(v.revoke_at, _REVOKE, v.id)
            self._emit("preempt_notice", t, v.campaign, lease=v, deadline=v.revoke_at)
        rec = self._grant(c, d, k, n, dur, price, t, intent, starting=True)
        self._activation[rec.id] = at
        dim.timeline[rec.id] = (at, rec.units)
        self._timer(at, _ACTIVATE, rec.id)
        return rec

    def _end(self, rec: LeaseRecord, t: int, state: str) -> int:
        """End a lease at t (SPEC §4.2, §4.3, §4.6): its units free now; the unused part of
        its prepaid tokens comes back (up to B) and its credits pro rata, rounded down.
        Returns the credits refunded."""
        c, dim = self._camps[rec.campaign], self._dim[rec.dim]
        self._settle_path(c, rec.dim, t)
        dim.timeline.pop(rec.id, None)        # (a starting or a revoking lease)
        if rec.state == "starting":
            remaining = rec.dur
            dim.promised -= rec.units
        else:
            remaining = max(0, (rec.end or t) - t)
            dim.occupied -= rec.units
            if rec.state == "revoking":
                dim.revoking -= rec.units
            elif not rec.firm:
                dim.opp_active -= rec.units
            dim.give_back(rec.slots)
        # SPEC §14: tokens and credits flow back along the path they were taken from
        back = rec.cost * remaining // rec.dur
        for v, ex in zip(self._path(c), rec.excess):
            h = v.hold[rec.dim]
            h.T = min(h.B, h.T + ex * remaining)
            if not v.unlimited:
                v.left += back
            v.escrow = wrap(v.escrow - rec.cost)
            v.refunded = wrap(v.refunded + back)
            v.spent = wrap(v.spent + rec.cost - back)
        self._change_holding(c, rec.dim, -rec.units, rec.firm, t)
        if rec.borrowed:
            c.hold[rec.dim].borrowed -= rec.units
        rec.state = state
        self._activation.pop(rec.id, None)
        self._leases.ended_row(rec.id)
        return back

    # ------------------------------------------------------------------ pending queue (§4.5)
    def _drop(self, p: PendingIntent) -> None:
        self._queue.remove(p)
        if self._terms[p.cls].priced:
            self._dim[p.dim].pending_priced -= p.nmax

    def _serve(self, t: int) -> None:
        """SPEC §4.5: grant what the queue can have at t, in the order class rank,
        fair-share deficit (largest first), tokens (largest first), arrival; an intent
        that does not fit does not block the ones behind it."""
        if not self._queue:
            return
        ps = self._queue.all()
        if len(ps) > 1:
            if not any(self._limits(self._camps[p.campaign], p.dim, p.cls, p.dur, p.spend,
                                    t).size(p.nmin) >= p.nmin for p in ps):
                return                                    # nothing grantable: nothing moves
            deficit = self._deficits(t)
            if self._jw is not None:
                self._jw.deficits = deficit
            for p in ps:
                self._camps[p.campaign].hold[p.dim].settle(t, self._instant)
            # SPEC §14.6: with a tree, the Fair Tree order in place of the deficits'
            fair = (fairshare.fair_tree_rank(self._camps, deficit)
                    if fairshare.is_tree(self._camps) else [-x for x in deficit])
            ps.sort(key=lambda p: (self._terms[p.cls].rank, fair[p.campaign],
                                   -self._camps[p.campaign].hold[p.dim].T, p.intent_id))
        for p in ps:
            if self._queue.get(p.intent_id) is None:
                continue
            if p.deadline is not None and p.deadline < t:
                continue
            c = self._camps[p.campaign]
            lim = self._limits(c, p.dim, p.cls, p.dur, p.spend, t)
            n = lim.size(p.nmax)
            if n < p.nmin:
                continue
            if n <= lim.warm:
                self._drop(p)
                rec = self._grant(c, p.dim, p.cls, n, p.dur, lim.price, t, p.intent_id, False)
                self._emit("granted", t, c.index, lease=rec, intent=p, path=WARM)
            else:
                victims, at = self._plan_reclaim(p.dim, n, t)
                if p.deadline is not None and at > p.deadline:
                    continue                               # it waits on
                self._drop(p)
                rec = self._reclaim(c, p.dim, p.cls, n, p.dur, lim.price, t, p.intent_id,
                                    victims, at)
                self._emit("granted", t, c.index, lease=rec, intent=p, path=RECLAIM)

    # ------------------------------------------------------------------ leases (§4.6)
    def _record(self, lease_id: Any) -> tuple[int, LeaseRecord | None]:
        if isinstance(lease_id, (bool, np.bool_)) or not isinstance(lease_id, (int, np.integer)):
            raise UnknownLease("lease_id", "is not a lease of this broker", lease_id)
        try:
            return int(lease_id), self._leases.get(int(lease_id))
        except KeyError:
            raise UnknownLease("lease_id", "is not a lease of this broker", lease_id) from None

    def _snapshot(self, rec: LeaseRecord) -> Any:
        placed = rec.state in ("active", "revoking")
        return self._Lease(
            id=rec.id, campaign=self._camps[rec.campaign].name, dim=self.dims[rec.dim],
            units=rec.units, state=rec.state, firm=rec.firm,
            service_class=self.classes[rec.cls].name, granted_at=rec.granted_at / NS,
            start=seconds(rec.start), expiry=seconds(rec.end), cost=rec.cost / CREDIT,
            revoke_at=seconds(rec.revoke_at) if rec.state in ("revoking", "revoked") else None,
            intent=rec.intent,
            placement=self._dim[rec.dim].placement(rec.slots) if placed else (),
            slots=tuple(rec.slots) if placed else ())

