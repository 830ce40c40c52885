"""The reference broker's reads and bulk operations: supply and quotes (SPEC §8), batches
(SPEC §4.4), flow dimensions (SPEC §5), pool size (SPEC §12), state and the journal's
reads (SPEC §9). A mixin of :class:`~bursarcore.reference.broker.ReferenceBroker`."""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from .. import units
from ..admission.envelope import MAX_DURATION, quote_grid
from ..clock import ManualClock
from ..errors import InvalidArgument, TimeWentBackwards, UnknownLease
from ..admission.paths import refuse_removed
from .core import _REVOKE, BrokerCore
from .leases import LIVE, LeaseRecord, inf_or
from . import tree
from .rules import (CAPACITY, COLD, CREDIT, CREDITS, NS, PATHS, PPM, REASONS, RECLAIM,
                    TOKENS, UNLIMITED, WARM, excess, lease_cost, wrap)


_MIN_DUR = round(units.MIN_DURATION * NS)
_MAX_DUR = MAX_DURATION * NS
_DUR_RULE = (f"must be seconds in [{units.MIN_DURATION:g}, {MAX_DURATION:,}] "
             "(one microsecond to ten years)")
_NEVER = (1 << 63) - 1       # the flow engine's "never"
_FACILITY = 3                # the flow engine's bound code of the facility's bucket


class BrokerViews(BrokerCore):
    """Supply, quotes, batches, flow, nodes and introspection of the reference broker."""

    def _grace(self) -> float:
        """SPEC §8: the reclaim path's wait is the preemption grace (the longest a victim
        may have: ``borrow_grace`` too once a campaign may borrow, SPEC §14.8)."""
        graces = [c.grace for c in self.classes if c.preemptible]
        if any(e.borrow_limit for e in self.envelopes.values()):
            graces.append(self.borrow_grace)
        return max(graces or [0.0])

    def cancel(self, intent_id: int) -> bool:
        """Withdraw a pending intent: True if it was pending, False if no longer."""
        try:
            if isinstance(intent_id, (bool, np.bool_)) or not isinstance(intent_id, (int, np.integer)):
                raise UnknownLease("intent_id", "is not an intent of this broker", intent_id)
            intent_id = int(intent_id)
            t = self._now()
            self._advance(t)
            p = self._queue.get(intent_id)
            if p is None:
                if 0 <= intent_id < self._next_intent:
                    return False
                raise UnknownLease("intent_id", "is not an intent of this broker", intent_id)
            self._drop(p)
            if self._jw is not None:
                self._jw.cancel(t, p)
            return True
        finally:
            self._end_op()

    def pending(self, campaign: str | None = None) -> list[dict[str, Any]]:
        """The pending intents in arrival order, each with the rule that binds it now (the
        first rule at the smallest limit; SPEC §4.4)."""
        ci = None if campaign is None else self.campaign_index(campaign)
        ps = self._queue.all() if ci is None else self._queue.of_campaign(ci)
        out = []
        for p in ps:
            lim = self._limits(self._camps[p.campaign], p.dim, p.cls, p.dur, p.spend, self._t)
            why = lim.tightest()
            out.append({"intent_id": p.intent_id, "campaign": self._camps[p.campaign].name,
                        "dim": self.dims[p.dim], "min": p.nmin, "max": p.nmax,
                        "duration": p.dur / NS, "reason": REASONS[why],
                        "expires": p.expires / NS, "service_class": self.classes[p.cls].name})
        return out

    def release(self, lease_id: int) -> Any:
        """End a lease early; unused tokens and credits come back (SPEC §4.2, §4.3)."""
        try:
            lid, _ = self._record(lease_id)
            t = self._now()
            self._advance(t)
            _, rec = self._record(lid)
            before = self._jw.lease_info(rec) if self._jw is not None else None
            dec = self._release(rec, t)
            if self._jw is not None:
                dec = self._jw.lease_op("release", lid, before, t, 0, None, dec)
            return dec
        finally:
            self._end_op()

    def _release(self, rec: LeaseRecord | None, t: int) -> Any:
        Dec = self._Decision
        if rec is None:
            return Dec("refused", -1, "", reason="invalid")
        name = self._camps[rec.campaign].name
        if rec.state not in LIVE:
            return Dec("refused", rec.intent, name, reason="invalid", lease=self._snapshot(rec))
        back = self._end(rec, t, "released")
        dec = Dec("released", rec.intent, name, units=rec.units, lease=self._snapshot(rec),
                  cost=-back / CREDIT)
        self._serve(t)
        return dec

    def renew(self, lease_id: int, duration: float, max_spend: float | None = None) -> Any:
        """SPEC §4.6: extend an active lease, re-running §4.2 and §4.3 atomically."""
        try:
            lid, _ = self._record(lease_id)
            ext = units.to_ns(units.real(duration, "duration", lo=units.MIN_DURATION,
                                         hi=MAX_DURATION, what="a number of seconds"), "duration")
            spend = None if max_spend is None else round(
                units.real(max_spend, "max_spend", hi=units.MAX_CREDITS) * CREDIT)
            return self._renew_ns(lid, ext, spend)
        finally:
            self._end_op()

    def _renew_ns(self, lid: int, ext: int, spend: int | None) -> Any:
        """A renewal in engine integers, journaled (the entry point replay uses)."""
        t = self._now()
        self._advance(t)
        _, rec = self._record(lid)
        if rec is not None and (rec.end or 0) + ext > units.MAX_NS:
            raise InvalidArgument("duration", "would end the lease past the engine's time "
                                  f"range ({units.MAX_SECONDS:.6g} s)", ext / NS)
        before = self._jw.lease_info(rec) if self._jw is not None else None
        dec = self._renew(rec, ext, spend, t)
        if self._jw is not None:
            dec = self._jw.lease_op("renew", lid, before, t, ext, spend, dec)
        return dec

    def _renew(self, rec: LeaseRecord | None, ext: int, spend: int | None, t: int) -> Any:
        Dec = self._Decision
        if rec is None:
            return Dec("refused", -1, "", reason="invalid")
        c = self._camps[rec.campaign]
        path = self._path(c)
        self._settle_path(c, rec.dim, t)
        if self._jw is not None:
            self._jw.renew_before = (c.hold[rec.dim].T, c.left)
        if rec.state != "active":
            return Dec("refused", rec.intent, c.name, reason="invalid", lease=self._snapshot(rec))
        end = rec.end or t
        new_end = end + ext
        ex_new, delta = [0] * len(path), [0] * len(path)
        if not self._instant:
            # SPEC §4.2, §14.2: the remaining prepaid segment is re-priced as the top-most
            # holding, at every node of the path: on the rise of its load from the load
            # without this lease
            own = [x.hold[rec.dim].own for x in self._camps]
            own[c.index] -= rec.units
            without = tree.loads(self._camps, rec.dim, own)
            for j, v in enumerate(path):
                h = v.hold[rec.dim]
                ex_new[j] = excess(without[v.index], h.K - without[v.index], h.s)
                delta[j] = ex_new[j] * (new_end - t) - rec.excess[j] * (end - t)
                if delta[j] > h.T:
                    return Dec("refused", rec.intent, c.name, reason="tokens",
                               lease=self._snapshot(rec), cost=0.0)
        price = self._charge(c, rec.cls, lease_cost(rec.units, ext,
                                                    self._unit_price(rec.dim, rec.cls)))
        left = min(v.left for v in path)
        if price > min(left, UNLIMITED) or (spend is not None and spend < price):
            return Dec("refused", rec.intent, c.name, reason="credits",
                       lease=self._snapshot(rec), cost=price / CREDIT)      # SPEC §4.3
        for j, v in enumerate(path):
            h = v.hold[rec.dim]
            h.T = h.T - delta[j] if delta[j] >= 0 else min(h.B, h.T - delta[j])
            if not v.unlimited:
                v.left -= price
            v.escrow = wrap(v.escrow + price)
        rec.excess = ex_new
        rec.cost = wrap(rec.cost + price)
        rec.dur += ext
        rec.end = new_end
        return Dec("granted", rec.intent, c.name, units=rec.units, lease=self._snapshot(rec),
                   path="warm", cost=price / CREDIT)

    def lease(self, lease_id: int) -> Any:
        """The lease ``lease_id``, live or ended (until its record is reused)."""
        _, rec = self._record(lease_id)
        if rec is None:
            raise UnknownLease("lease_id", "has ended and its record was reused (it keeps no "
                               "record once reuse_after later leases have ended)", lease_id)
        return self._snapshot(rec)

    def leases(self, campaign: str | None = None) -> list[Any]:
        """The live leases (starting, active, revoking), after advancing to the clock."""
        try:
            t = self._now()
            self._advance(t)
            ci = None if campaign is None else self.campaign_index(campaign)
            return [self._snapshot(x) for x in self._leases.live()
                    if ci is None or x.campaign == ci]
        finally:
            self._end_op()

    def poll(self) -> list[Any]:
        """Advance to the clock; the events since the last poll, oldest first."""
        try:
            self._advance(self._now())
            ev, self._events = self._events, []
            return ev
        finally:
            self._end_op()

    def subscribe(self, callback: Any) -> None:
        """Call ``callback(event)`` for every event as it happens."""
        if not callable(callback):
            raise InvalidArgument("callback", "must be callable", callback)
        self._subscribers.append(callback)

    # ------------------------------------------------------------------ supply (§8)
    def supply(self, campaign: str) -> Any:
        """SPEC §8: free and reclaimable units, congestion, tokens, prices and waits per
        held dimension, and the credits left."""
        try:
            ci = self.campaign_index(campaign)
            t = self._now()
            self._advance(t)
            c = self._camps[ci]
            dims = {}
            for d, dname in enumerate(self.dims):
                h, dim = c.hold[d], self._dim[d]
                h.settle(t, self._instant)
                unlimited = h.B >= UNLIMITED
                dims[dname] = self._DimSupply(
                    free=max(0, dim.free_now()), capacity=dim.cap,
                    reclaimable=dim.opp_active + dim.surplus(),
                    congestion=self._kappa_ppm(d) / PPM, multiplier=self._multiplier(d) / PPM,
                    tokens=math.inf if unlimited else h.T / NS,
                    bucket=math.inf if unlimited else h.B / NS,
                    held=h.H, ceiling=h.b,
                    price={cl.name: self._unit_price(d, i) / CREDIT
                           for i, cl in enumerate(self.classes)},
                    wait={"warm": 0.0, "reclaim": self._grace(),
                          "cold": self.cold_wait(dname) if self.cold_wait is not None else None})
            return self._Supply(c.name, t / NS, inf_or(c.left, CREDIT), c.service_class, dims)
        finally:
            self._end_op()

    def quote(self, campaign: str, sizes: Sequence[int],
              durations: Sequence[float], *, dim: str | None = None,
              service_class: str | None = None) -> Any:
        """SPEC §8: each cell is what an intent for exactly that size and duration would
        meet now: grantable exactly when ``acquire`` would grant it, on the same path and
        at the same charge; otherwise the first rule the full size breaks."""
        try:
            ci = self.campaign_index(campaign)
            dname = dim if dim is not None else self.dims[0]
            if dname not in self._dim_index:
                raise InvalidArgument("dim", f"must be one of {self.dims}", dname)
            d = self._dim_index[dname]
            k = self._class_of(campaign, service_class)
            sz, du = quote_grid(sizes, durations)
            t = self._now()
            self._advance(t)
            c = self._camps[ci]
            ns, ds = [int(x) for x in sz.tolist()], [int(x) for x in du.tolist()]
            cost = np.zeros((len(ns), len(ds)))
            path = np.empty((len(ns), len(ds)), dtype=object)
            reason = np.empty((len(ns), len(ds)), dtype=object)
            grace = self._grace()
            cold = self.cold_wait(dname) if self.cold_wait is not None else math.inf
            wait = np.zeros((len(ns), len(ds)))
            for j, dur in enumerate(ds):
                lim = self._limits(c, d, k, dur, None, t)
                for i, n in enumerate(ns):
                    cost[i, j] = float(self._charge(c, k, lease_cost(n, dur, lim.price)))
                    p = WARM if n <= lim.warm else RECLAIM if n <= lim.capacity else COLD
                    path[i, j] = PATHS[p]
                    wait[i, j] = 0.0 if p == WARM else grace if p == RECLAIM else cold
                    reason[i, j] = REASONS[lim.first_broken(n)]
            return self._Quote(sizes=sz.astype(np.int64), durations=du / NS, cost=cost / CREDIT,
                               path=path.astype(str), wait=wait, grantable=(reason == ""),
                               reason=reason.astype(str))
        finally:
            self._end_op()

    # ------------------------------------------------------------------ batch (§4.4)
    def admit_batch(self, campaign_idx: Any, units_: Any, durations: Any,
                    now: float | None = None, *, service_class: str | int | None = None,
                    dim: str | None = None, ttl: float | None = None) -> Any:
        """SPEC §4.4: many intents at one instant, exactly as the same sequence of
        ``acquire`` calls (the whole batch is checked first)."""
        try:
            ci = units.index_array(campaign_idx, len(self._camps), "campaign_idx")
            refuse_removed(ci, {c.index for c in self._camps if c.removed})   # SPEC §14.9
            n = ci.shape[0]
            u = units.column(units_, "units")
            if u.dtype.kind not in "iu":
                raise InvalidArgument("units", "must be integers", u.dtype)
            if u.shape == (n,):
                lo_hi = [(int(x), int(x)) for x in u.tolist()]
            elif u.shape == (n, 2):
                lo_hi = [(int(a), int(b)) for a, b in u.tolist()]
            else:
                raise InvalidArgument("units", f"must have shape ({n},) or ({n}, 2)", u.shape)
            for j, (a, b) in enumerate(lo_hi):
                if not 1 <= a <= b <= units.MAX_UNITS:
                    raise InvalidArgument("units", f"need 1 <= min <= max <= {units.MAX_UNITS:,}",
                                          f"{(a, b)!r} at position {j}")
            if isinstance(durations, (int, float)) and not isinstance(durations, bool):
                one = units.to_ns(durations, "durations")
                if not _MIN_DUR <= one <= _MAX_DUR:
                    raise InvalidArgument("durations", _DUR_RULE, durations)
                durs = [one] * n
            else:
                durs = [int(x) for x in units.ns_array(durations, "durations", n).tolist()]
                for j, x in enumerate(durs):
                    if not _MIN_DUR <= x <= _MAX_DUR:
                        raise InvalidArgument("durations", _DUR_RULE, f"{x / NS!r} at position {j}")
            d = self._dim_index.get(dim if dim is not None else self.dims[0])
            if d is None:
                raise InvalidArgument("dim", f"must be one of {self.dims}", dim)
            if service_class is None:
                ks = [self._cls_index[self._camps[int(c)].service_class] for c in ci.tolist()]
            else:
                kk = self._cls_index.get(service_class) if isinstance(service_class, str) else None
                if kk is None:
                    raise InvalidArgument("service_class",
                                          f"must be one of {list(self._cls_index)}", service_class)
                ks = [kk] * n
            if ttl is not None and units.real(ttl, "ttl", hi=units.MAX_TTL,
                                              what="a number of seconds") <= 0:
                raise InvalidArgument("ttl", "must be > 0", ttl)
            ttl_ns = units.to_ns(ttl if ttl is not None else self.ttl, "ttl")
            t = self._now() if now is None else units.to_ns(now)
            if t < self._t:
                raise TimeWentBackwards("now", f"must be >= the broker time {self._t / NS}",
                                        t / NS)
            if isinstance(self.clock, ManualClock) and t / NS > self.clock.now():
                self.clock.set(t / NS)
            self._advance(t)
            out = np.zeros((5, n), dtype=np.int64)
            code = {"granted": 0, "refused": 1, "pending": 2}
            for j, c in enumerate(ci.tolist()):
                a, b = lo_hi[j]
                dec = self._decide(int(c), d, ks[j], a, b, durs[j], None, None, ttl_ns, t,
                                   batch=1 if j == 0 else 2)
                out[0, j] = dec.units if dec.granted else 0
                out[1, j] = REASONS.index(dec.reason) if dec.reason else 0
                out[2, j] = dec.lease.id if dec.lease is not None else -1
                out[3, j] = code[dec.outcome]
                out[4, j] = dec.intent_id
            return self._BatchResult(out[0], out[1], out[2], out[3], out[4])
        finally:
            self._end_op()

    # ------------------------------------------------------------------ flow (§5)
    def consume(self, campaign: str, dim: str, amount: float) -> Any:
        """SPEC §5: throttle at source; the amount allowed now and when to retry the rest."""
        try:
            ci = self.campaign_index(campaign)
            fd = self._flow_index.get(dim) if isinstance(dim, str) else None
            if fd is None:
                raise InvalidArgument("dim", f"must be a flow dimension, one of {self.flow_dims}",
                                      dim)
            a = units.to_fixed(amount, "amount")
            t = self._now()
            self._advance(t)
            return self._consume_ns(ci, fd, a, t)
        finally:
            self._end_op()

    def _consume_ns(self, ci: int, fd: int, a: int, t: int) -> Any:
        c = self._camps[ci]
        path = self._path(c)
        price = self._flow_price[fd]
        ask = a
        if price:          # SPEC §5, §14: a flow unit costs credits; every budget on the
            # path binds it
            ask = min(a, min(min(v.left for v in path), UNLIMITED) * units.SCALE // price)
        assert self.flow is not None
        allowed, retry, bound = self.flow.consume_fixed(
            np.array([ci], np.int64), np.array([fd], np.int64), np.array([ask], np.int64),
            np.array([t], np.int64))
        got, wait = int(allowed[0]), int(retry[0])
        reason = 0
        if got < a:
            reason = (CREDITS if got == ask and ask < a
                      else CAPACITY if int(bound[0]) == _FACILITY else TOKENS)
        cost = -(-got * price // units.SCALE) if price else 0
        if cost:
            for v in path:
                if not v.unlimited:
                    v.left -= cost
                v.spent = wrap(v.spent + cost)
        retry_s = 0.0 if got >= a else (math.inf if wait == _NEVER or reason == CREDITS
                                        else wait / NS)
        seq = self._jw.consume(t, ci, len(self.dims) + fd, a, got, cost, reason,
                               -1 if wait == _NEVER else wait) if self._jw is not None else -1
        return self._Consumption(c.name, self.flow_dims[fd], a / units.SCALE,
                                 got / units.SCALE, retry_s, REASONS[reason] or None,
                                 cost / CREDIT, seq)

    def consume_batch(self, campaign_idx: Any, dims: Any,
                      amounts: Any) -> tuple[np.ndarray, np.ndarray]:
        """SPEC §5: many consumptions at this instant, exactly as the same ``consume`` calls."""
        try:
            if self.flow is None:
                raise InvalidArgument("dims", "the pool has no flow dimensions")
            ci = units.index_array(campaign_idx, len(self._camps), "campaign_idx")
            refuse_removed(ci, {c.index for c in self._camps if c.removed})   # SPEC §14.9
            n = ci.shape[0]
            di = units.dim_column(dims, self._flow_index, n)
            amt = units.fixed_array(amounts, "amounts", n)
            t = self._now()
            self._advance(t)
            out = [self._consume_ns(int(ci[j]), int(di[j]), int(amt[j]), t) for j in range(n)]
            return (np.array([o.allowed for o in out], dtype=float),
                    np.array([o.retry_after for o in out], dtype=float))
        finally:
            self._end_op()

    # ------------------------------------------------------------------ pool size (§12)
    def _dim_arg(self, dim: str) -> int:
        d = self._dim_index.get(dim) if isinstance(dim, str) else None
        if d is None:
            raise InvalidArgument("dim", f"must be one of {self.dims}", dim)
        return d

    def add_nodes(self, dim: str, nodes: Sequence[tuple[str, int]]) -> list[int]:
        """SPEC §12: nodes join a held dimension; their slots are free at once."""
        try:
            d = self._dim_arg(dim)
            if not isinstance(nodes, (list, tuple)) or not nodes or not all(
                    isinstance(x, (list, tuple)) and len(x) == 2 for x in nodes):
                raise InvalidArgument("nodes", "must be a non-empty list of (name, slots)", nodes)
            nodes = [(str(n), units.whole(k, f"nodes[{n}]", lo=1)) for n, k in nodes]
            dm = self._dim[d]
            live = dm.live_nodes()
            seen = set()
            for name, _ in nodes:
                if not name or name in live or name in seen:
                    raise InvalidArgument("nodes", "names must be non-empty, unique and not in "
                                          "the pool", name)
                seen.add(name)
            grown = len(dm.node_of_slot) + sum(k for _, k in nodes)
            if grown > units.MAX_UNITS:
                raise InvalidArgument("nodes", f"the dimension's slots would number {grown:,}, "
                                      f"more than {units.MAX_UNITS:,}", len(nodes))
            t = self._now()
            self._advance(t)
            ids = dm.add(nodes)
            self.pool.capacity[self.dims[d]] = dm.cap
            self.pool.slot_map[self.dims[d]].extend(nodes)
            if self._jw is not None:
                self._jw.nodes("add_nodes", t, d, {"dim": self.dims[d], "nodes": nodes})
            self._serve(t)
            return ids
        finally:
            self._end_op()

    def remove_nodes(self, dim: str, nodes: Sequence[str],
                     grace: float = 0.0) -> list[int]:
        """SPEC §12: nodes leave; their free slots go at once, and every lease on one of
        their slots is revoked with notice ``grace`` seconds from now."""
        try:
            d = self._dim_arg(dim)
            if not isinstance(nodes, (list, tuple)) or not nodes:
                raise InvalidArgument("nodes", "must be a non-empty list of node names", nodes)
            g = units.to_ns(grace, "grace", allow_negative=False)
            dm = self._dim[d]
            live = dm.live_nodes()
            for name in nodes:
                if name not in live:
                    raise InvalidArgument("nodes", "each must be a node in the pool", name)
            t = self._now()
            self._advance(t)
            gone = dm.retire(nodes)
            hit = [x for x in self._leases.live()
                   if x.dim == d and x.state in ("active", "revoking")
                   and any(s in gone for s in x.slots)]
            for x in hit:
                if x.state == "revoking" and (x.revoke_at or 0) <= t + g:
                    continue
                if x.state == "active":
                    dm.revoking += x.units
                    if not x.firm:
                        dm.opp_active -= x.units
                    x.state = "revoking"
                x.revoke_at = t + g
                dm.timeline[x.id] = (x.revoke_at, -x.units)
                self._timer(t + g, _REVOKE, x.id)
                self._emit("preempt_notice", t, x.campaign, lease=x, deadline=t + g,
                           reason=CAPACITY)
            self.pool.capacity[self.dims[d]] = dm.cap
            names = set(nodes)
            self.pool.slot_map[self.dims[d]] = [(nm, k) for nm, k in
                                                self.pool.slot_map[self.dims[d]]
                                                if nm not in names]
            if self._jw is not None:
                self._jw.nodes("remove_nodes", t, d, {"dim": self.dims[d], "nodes": list(nodes),
                                                      "grace": g})
            if g == 0:
                self._advance(t)
            return [x.id for x in hit]
        finally:
            self._end_op()

    # ------------------------------------------------------------------ journal (§9)
    def sync(self) -> int:
        """Make every journaled decision durable; the highest durable seq (-1: no journal)."""
        return self.journal.flush() if self.journal is not None else -1

    def explain(self, record: int | dict[str, Any]) -> str:
        """Why a decision came out as it did, from its record's rule inputs (SPEC §9)."""
        from ..journal.explain import explain
        if self.journal is None and not isinstance(record, dict):
            raise InvalidArgument("record", "needs a journal: Broker(..., journal=...)", record)
        rec = dict(record if isinstance(record, dict)
                   else self.journal.record(record))  # type: ignore[union-attr]
        if 0 <= rec.get("dim", -1) < len(self.dims):
            rec.setdefault("dim_name", self.dims[rec["dim"]])
        if 0 <= rec.get("cls", -1) < len(self.classes):
            rec.setdefault("class_name", self.classes[rec["cls"]].name)
        if 0 <= rec.get("campaign", -1) < len(self._camps):
            rec.setdefault("campaign_name", self._camps[rec["campaign"]].name)
        if 0 <= rec.get("level", -1) < len(self._camps):                 # SPEC §14.2
            rec.setdefault("level_name", self._camps[rec["level"]].name)
        return explain(rec)

    # ------------------------------------------------------------------ introspection
    def state(self, *, leases: bool = True) -> dict[str, Any]:
        """A JSON-serialisable picture of the broker: pool, campaigns, leases (an empty list
        with ``leases=False``), pending."""
        try:
            t = self._now()
            self._advance(t)
            deficit = self._deficits(t)
            pool = {}
            for d, dn in enumerate(self.dims):
                dm = self._dim[d]
                pool[dn] = {"capacity": dm.cap, "occupied": dm.occupied, "free": dm.free_now(),
                            "firm": dm.F, "unmet_guarantees": self._unmet(d),
                            "reclaimable": dm.opp_active, "revoking": dm.revoking,
                            "promised": dm.promised,
                            "reserved": dm.cap - dm.occupied - dm.free_now(),
                            "congestion": self._kappa_ppm(d) / PPM,
                            "warm_headroom": dm.headroom}
            camps: dict[str, dict[str, Any]] = {}
            for c in self._camps:
                if c.removed:                   # SPEC §14.9
                    continue
                for h in c.hold:
                    h.settle(t, self._instant)
                env = self.envelopes[c.name].to_json()
                camps[c.name] = {
                    "credits_left": None if c.unlimited else c.left / CREDIT,
                    "credits_escrowed": c.escrow / CREDIT,
                    "credits_spent": c.spent / CREDIT,
                    "credits_refunded": c.refunded / CREDIT,
                    "deficit": float(deficit[c.index]),
                    "held": {dn: c.hold[d].H for d, dn in enumerate(self.dims)},
                    "firm_held": {dn: c.hold[d].Hf for d, dn in enumerate(self.dims)},
                    "borrowed": {dn: c.hold[d].borrowed for d, dn in enumerate(self.dims)},
                    "tokens": {dn: (None if c.hold[d].B >= UNLIMITED else c.hold[d].T / NS)
                               for d, dn in enumerate(self.dims)},
                    "tokens_refilled": {dn: (None if c.hold[d].B >= UNLIMITED
                                             else c.hold[d].minted / NS)
                                        for d, dn in enumerate(self.dims)},
                    "envelope": env}
            held = [self._snapshot(x).to_dict() for x in self._leases.live()] if leases else []
            return {"time": t / NS, "backend": self.backend, "pool": pool, "campaigns": camps,
                    "leases": held, "pending": self.pending()}
        finally:
            self._end_op()


__all__ = ["BrokerViews"]
