"""The lease lifecycle (SPEC §5, §8): expiry, release, renewal, lease views, events and
the reclaim of opportunistic leases (SPEC §4.4) — the part of the broker that changes a
lease after its grant. Each step asks the C core through its binding for the arithmetic
and keeps the policy here: which victims a reclaim takes, what events a change emits,
what the journal records."""

from __future__ import annotations

import dataclasses
import heapq
from itertools import repeat
from operator import truediv
from typing import Any

import numpy as np

from .. import units
from ..admission.envelope import MAX_DURATION
from ..admission.pending import _Pending
from ..admission.results import GRANTED_OUT, REFUSED_OUT, Decision
from ..admission.state import (ACTIVE, CAPACITY, CREDIT, DEADLINE, LEASE_STATES, OK, REASONS,
                               RELEASED, REVOKED, REVOKING, ROW_MASK, STARTING, TTL, WARM)
from ..errors import InvalidArgument, UnknownLease
from ..journal import records as J
from .._brokerbase import _EV_ACTIVATE, _EV_PENDING, _EV_REVOKE, NS, BrokerBase, _op
from .types import Event, Lease, expired_events

__all__ = ["LifecycleMixin", "reclaim_reserve"]


def reclaim_reserve(steps: list[tuple[int, int]]) -> int:
    """SPEC §4.6 the units a dimension keeps free for its reclaim grants: ``steps`` are each
    starting grant's (activation time, +units) and each lease under notice's (deadline,
    −units); the reserve is the most, over the times τ, that the grants starting by τ need
    beyond the units under notice arriving by τ (0 if none)."""
    steps.sort()
    best = run = i = 0
    while i < len(steps):
        tau = steps[i][0]
        while i < len(steps) and steps[i][0] == tau:
            run += steps[i][1]
            i += 1
        best = max(best, run)
    return best

# release / renew of a stale lease id (an ended lease whose row now holds a later lease): as
# for any ended lease, refused with "invalid" -- but its campaign, intent and record are gone
_STALE = Decision(REFUSED_OUT, -1, "", reason="invalid")


class LifecycleMixin(BrokerBase):
    """The broker's lease lifecycle: ``release``, ``renew``, ``lease``, ``leases``,
    ``poll``, and the expiry, event and reclaim steps the other parts call."""

    def _expire_until(self, t: int) -> int:
        """Expire leases due by t. With a journal, one at a time, so each record's "state
        after" is the state right after that expiry, however the calls were spaced."""
        fast = self._fast
        if fast is not None and not self._subscribers and not any(self._draining):
            n: int = fast.expire(t)        # the same, compiled (events and records built in C)
            if n >= 0:                     # -1: a journal it does not write to (nothing done)
                return n
        if self.journal is None and not self._subscribers:
            return self._expire_quiet(t)
        k, st = self._k, self.st
        # one at a time with a journal, and with subscribers: a callback may grant, and a
        # grant may take the row of a lease ended but not yet reported
        buf = self._one_buf
        total = 0
        while True:
            m: int = k.advance(st, t, buf)
            for lid in buf[:m].tolist():
                r = lid & ROW_MASK
                d = int(st.dim[r])
                self._opp_active[d].discard(lid)
                if lid in self._revoking[d]:      # a victim gone before its deadline
                    self._revoking[d].discard(lid)
                    self._set_reserve(d)
                self._emit("expired", int(st.t_end[r]), int(st.camp[r]), lid=lid)
            if m:
                self._purge_retired()
            total += m
            if m < buf.shape[0]:
                return total

    def _expire_quiet(self, t: int) -> int:
        """:meth:`_expire_until` with no journal and no subscriber: the expired leases in
        blocks, each block's rows read at once (nothing can reuse a row before its event is
        built), the victim sets and the queue's watches told per block, and the events
        queued in expiry order as ``_emit`` would queue them."""
        k, st, buf = self._k, self.st, self._expired_buf
        names, events = self._names, self._cur.events
        total = 0
        while True:
            m: int = k.advance(st, t, buf)
            if m:
                lids = buf[:m]
                rows = lids & ROW_MASK
                dims = st.dim[rows]
                ids, camps = lids.tolist(), st.camp[rows].tolist()
                for d in np.unique(dims).tolist():
                    mine = ids if len(self.dims) == 1 else lids[dims == d].tolist()
                    self._opp_active[d].difference_update(mine)
                    if not self._revoking[d].isdisjoint(mine):   # victims gone early
                        self._revoking[d].difference_update(mine)
                        self._set_reserve(d)
                self._queue.leases_ended(camps)
                events.extend(expired_events(map(truediv, st.t_end[rows].tolist(), repeat(NS)),
                                             map(names.__getitem__, camps), ids,
                                             st.units[rows].tolist()))
                self._purge_retired()
            total += m
            if m < buf.shape[0]:
                return total

    _EV_OP = {"expired": "expire", "revoked": "revoke", "activated": "activate",
              "preempt_notice": "preempt", "granted": "grant", "refused": "refuse"}

    def _emit(self, kind: str, t: int, c: int, lid: int | None = None, iid: int | None = None,
              deadline: int | None = None, reason: int = 0, pend: _Pending | None = None,
              path: int = 0) -> None:
        """Queue an event for :meth:`poll` and journal it (a derived record)."""
        st = self.st
        n = 0
        if lid is not None:   # read the lease's row now: a subscriber may grant (and reuse it)
            r = lid & ROW_MASK
            n, d, lk, lintent, lcost = (int(st.units[r]), int(st.dim[r]), int(st.lcls[r]),
                                        int(st.intent[r]), int(st.cost[r]))
        if kind == "expired" or kind == "revoked":
            self._queue.lease_ended(c)
        ev = Event(kind, t / NS, self._names[c], lease_id=lid, intent_id=iid,
                   deadline=None if deadline is None else deadline / NS,
                   reason=REASONS[reason] if reason else None, units=n)
        self._cur.events.append(ev)
        for fn in self._subscribers:
            fn(ev)
        if self.journal is None:
            return
        row: dict[str, Any] = {}
        row["op"], row["t"], row["campaign"], row["reason"] = J.OP[self._EV_OP[kind]], t, c, reason
        if lid is not None:
            row["lease"], row["units"], row["dim"] = lid, n, d
            row["cls"], row["intent"] = lk, lintent
            row["cost"] = lcost
            self._after(row, c, d)
        if pend is not None:
            row["intent"], row["dim"], row["cls"] = pend.intent_id, pend.dim, pend.cls
            row["nmin"], row["nmax"], row["dur"] = pend.nmin, pend.nmax, pend.dur
            row["max_spend"] = pend.max_spend
            row["rank"] = int(st.cls[pend.cls, 0])
            row["outcome"] = 1 if kind == "granted" else 3
            row["path"] = (1 if path == WARM else 2) if kind == "granted" else 0
            self._after(row, c, pend.dim)
        if deadline is not None:
            row["deadline"] = deadline
        self.journal.add(row)

    def _after(self, row: dict[str, Any], c: int, d: int) -> None:
        """The record's "state after" for (c, d), with the bucket settled to the record's
        time: an operation that does not touch the bucket (a refused release, a cancel)
        would otherwise record whatever an earlier, unjournaled read (``state()``,
        ``supply()``) happened to settle it to, and replay would differ. Settling is
        path-independent (refill at the rate H fixes between changes of H), so it changes
        no later figure."""
        st = self.st
        self._k.settle(st, c, d, int(row["t"]))
        row["tokens_after"] = int(st.T[c, d])
        row["credits_after"] = int(st.left[c])
        row["held_after"] = st.held(c, d)

    def _push(self, t: int, kind: int, ident: int) -> None:
        self._seq += 1
        heapq.heappush(self._pyev, (t, kind, self._seq, ident))

    def _run_pyevent(self, kind: int, ident: int, t: int) -> None:
        st = self.st
        if kind == _EV_REVOKE:
            r = st.row_of(ident)
            if r < 0:         # ended (and left the revoking set) long ago: its row is reused
                return
            d = int(st.dim[r])
            self._revoking[d].discard(ident)
            if int(st.state[r]) == REVOKING and int(st.revoke_at[r]) == t:
                self._k.end_lease(st, ident, t, REVOKED)
                self._set_reserve(d)
                self._purge_retired()
                self._emit("revoked", t, int(st.camp[r]), lid=ident)
        elif kind == _EV_ACTIVATE:
            self._activation.pop(ident, None)
            r = st.row_of(ident)
            if r < 0:
                return
            d = int(st.dim[r])
            if int(st.state[r]) == STARTING and int(st.top[d]) < int(st.units[r]):
                # the pool shrank under a reclaim grant: it cannot be placed any more
                self._k.end_lease(st, ident, t, REVOKED)
                self._set_reserve(d)
                self._emit("revoked", t, int(st.camp[r]), lid=ident, reason=CAPACITY)
            elif int(st.state[r]) == STARTING:
                self._reserve(1, int(st.units[r]))
                self._k.activate(st, ident, t)
                self._set_reserve(d)
                self._emit("activated", t, int(st.camp[r]), lid=ident)
        elif kind == _EV_PENDING:
            p = self._queue.intents.get(ident)
            if p is not None and p.expires == t:
                reason = DEADLINE if p.deadline is not None and p.deadline <= t else TTL
                self._queue.drop(ident)
                self._emit("refused", t, p.campaign, iid=ident, reason=reason, pend=p)

    def _track_opportunistic(self, d: int, lids: np.ndarray) -> None:
        """Remember leases the compiled loop granted that are opportunistic (victims)."""
        lids = lids[lids >= 0]
        self._opp_active[d].update(lids[self.st.firm[lids & ROW_MASK] == 0].tolist())

    def _plan_reclaim(self, d: int, n: int, t: int) -> tuple[list[int], int]:
        """Victims and activation time for a reclaim grant of n units on d at t: units
        already revoking but not promised come first (at their deadlines), then active
        opportunistic leases in preemption order, each after its class grace."""
        st, k = self.st, self._k
        free = int(k.free_now(st, d))
        need = n - max(0, free)
        at = t
        # what comes to the pool beyond every promise, once every notice has run out
        surplus = int(k.dim_figures(st, d)[1]) - free - int(st.oppa[d])
        if need > 0 and surplus > 0:
            at = max([at] + [int(st.revoke_at[l & ROW_MASK]) for l in self._revoking[d]])
            need -= surplus
        victims = []
        for lid in self._victims(d, t) if need > 0 else ():
            if need <= 0:
                break
            victims.append(lid)
            need -= int(st.units[lid & ROW_MASK])
            at = max(at, t + self._revoke_grace(lid))
        if need > 0:  # decide() counted reclaimable units that the victim set lacks
            raise RuntimeError(f"bursarcore internal error: reclaim plan short by {need} units")
        return victims, at

    def _set_reserve(self, d: int) -> None:
        """SPEC §4.1, §4.6: after a change of d's reclaim grants or of its units under
        notice, the core's reserve for them (``resv``, see :func:`reclaim_reserve`): the
        activation times are the policy's."""
        st = self.st
        steps = [(at, int(st.units[lid & ROW_MASK])) for lid, at in self._activation.items()
                 if int(st.dim[lid & ROW_MASK]) == d]
        steps += [(int(st.revoke_at[lid & ROW_MASK]), -int(st.units[lid & ROW_MASK]))
                  for lid in self._revoking[d]]
        st.resv[d] = reclaim_reserve(steps)

    def _revoke_grace(self, lid: int) -> int:
        """ns between a preemption notice to lease lid and its revocation: its class's
        grace, or for a borrowed lease the broker's ``borrow_grace`` (SPEC §14.8)."""
        r = lid & ROW_MASK
        if self.st.borrowed(r):
            return self._borrow_grace_ns
        return int(self.st.cls[int(self.st.lcls[r]), 4])

    def _victims(self, d: int, t: int) -> list[int]:
        """Active revocable leases on d in preemption order: opportunistic ones before
        borrowed ones (SPEC §14.8), then smallest fair-share deficit first (with a tree,
        last in the Fair Tree order: SPEC §14.6), then largest lease, then lease id
        (SPEC §6)."""
        st = self.st
        ids = self._opp_active[d]
        if not ids:
            return []
        deficit = self._fair_keys(t)
        return sorted(ids, key=lambda l: (st.borrowed(l & ROW_MASK),
                                          deficit[int(st.camp[l & ROW_MASK])],
                                          -int(st.units[l & ROW_MASK]), l))

    def _reclaim(self, c: int, d: int, k: int, n: int, dur: int, pm: int, t: int, iid: int,
                 plan: tuple[list[int], int]) -> int:
        """Preempt the planned victims (notice now, revoked after their grace) and grant a
        starting lease that becomes active when they are gone (SPEC §4.1, §4.6)."""
        st = self.st
        victims, at = plan
        for lid in victims:
            deadline = self._k.preempt(st, lid, t, self._revoke_grace(lid))
            self._opp_active[d].discard(lid)
            self._revoking[d].add(lid)
            self._push(deadline, _EV_REVOKE, lid)
            self._emit("preempt_notice", t, int(st.camp[lid & ROW_MASK]), lid=lid,
                       deadline=deadline)
        self._reserve(1, n)
        lid = self._k.grant(st, c, d, k, n, dur, pm, t, True, iid)
        self._activation[lid] = at
        self._set_reserve(d)
        self._push(at, _EV_ACTIVATE, lid)
        return lid  # type: ignore[no-any-return]  # the kernel (picked at run time) is untyped

    # ------------------------------------------------------------------ leases
    def _lease_id(self, lease_id: Any) -> int:
        """``lease_id`` as an int, if this broker issued it (it may have ended since, and
        its row may hold a later lease: see :meth:`_row`)."""
        if isinstance(lease_id, (bool, np.bool_)) or not isinstance(lease_id, (int, np.integer)):
            raise UnknownLease("lease_id", "is not a lease of this broker", lease_id)
        try:
            self.st.row_of(int(lease_id))
        except KeyError:
            raise UnknownLease("lease_id", "is not a lease of this broker", lease_id) from None
        return int(lease_id)

    def _row(self, lid: int) -> int:
        """The row of an issued lease id, or -1 when the lease has ended and its row holds
        a later lease (a stale id: see docs/policy.md, "Memory")."""
        return self.st.row_of(lid)

    def _lease_info(self, r: int) -> tuple[int, int, int, int, int] | None:
        """(campaign, dim, class, intent, units) of the lease in row r (None: stale), read
        before an operation that may end it and let its row be reused."""
        if r < 0:
            return None
        st = self.st
        return (int(st.camp[r]), int(st.dim[r]), int(st.lcls[r]), int(st.intent[r]),
                int(st.units[r]))

    @_op
    def release(self, lease_id: int) -> Decision:
        """End a lease early: its units free now, unused tokens and credits are refunded.

        Parameters
        ----------
        lease_id : int
            A lease this broker issued.

        Returns
        -------
        Decision
            ``released``, with the units, the ended lease and ``cost`` the refund
            (negative); or ``refused`` with reason ``invalid`` if the lease has ended
            already (for an ended lease whose record was reused: intent id -1 and no
            campaign).

        Raises
        ------
        UnknownLease
            ``lease_id`` is not a lease of this broker.
        """
        lid = self._lease_id(lease_id)
        t = self._now()
        self._advance(t)
        r = self._row(lid)          # after the advance: it may have ended (and been reused)
        info = self._lease_info(r)
        return self._journaled(J.OP["release"], lid, info, t, 0, -1, self._release(lid, r, t))

    def _release(self, lid: int, r: int, t: int) -> Decision:
        st = self.st
        if r < 0:
            return _STALE
        state = int(st.state[r])
        c = int(st.camp[r])
        name = self._names[c]
        if state not in (STARTING, ACTIVE, REVOKING):
            return Decision(REFUSED_OUT, int(st.intent[r]), name, reason="invalid",
                            lease=self.lease(lid))
        before = int(st.refunded[c])
        self._k.end_lease(st, lid, t, RELEASED)
        self._queue.lease_ended(c)
        self._purge_retired()
        d = int(st.dim[r])
        self._opp_active[d].discard(lid)
        self._revoking[d].discard(lid)
        self._activation.pop(lid, None)
        if state != ACTIVE:               # a reclaim grant, or a victim before its deadline
            self._set_reserve(d)
        refund = int(st.refunded[c]) - before
        # the decision before serving the queue: a grant there may take this row
        dec = Decision("released", int(st.intent[r]), name, units=int(st.units[r]),
                       lease=self.lease(lid), cost=-refund / CREDIT)
        self._serve_pending(t)
        return dec

    def _journaled(self, op: int, lid: int, info: tuple[Any, ...] | None, t: int, ext: int,
                   spend: int,
                   dec: Decision) -> Decision:
        """Journal a release or renew decision on lease ``lid`` (``info``: its
        :meth:`_lease_info` from before the decision; None for a stale id, whose record
        names no campaign and carries no state after)."""
        if self.journal is None:
            return dec
        row = {}
        row["op"], row["t"], row["lease"] = op, t, lid
        if info is not None:
            c, d, k, intent, n = info
            row["campaign"], row["dim"] = c, d
            row["cls"], row["intent"], row["units"] = k, intent, n
        row["dur"], row["max_spend"] = ext, spend
        row["outcome"] = {GRANTED_OUT: 1, REFUSED_OUT: 3}.get(dec.outcome, 4)
        row["reason"] = REASONS.index(dec.reason) if dec.reason else 0
        row["cost"] = round(dec.cost * CREDIT)
        if op == J.OP["renew"] and info is not None:
            row["tokens_before"], row["credits_before"] = self._renew_before
        if info is not None:
            self._after(row, c, d)
        return dataclasses.replace(dec, seq=self.journal.add(row))

    @_op
    def renew(self, lease_id: int, duration: float, max_spend: float | None = None) -> Decision:
        """Extend an active lease by ``duration`` seconds.

        The extension passes SPEC §4.2 and §4.3 (tokens, credits) atomically: granted in
        full or refused with nothing changed.

        Parameters
        ----------
        lease_id : int
            A lease this broker issued.
        duration : float
            Seconds to add, one microsecond to ten years.
        max_spend : float, optional
            The most credits the extension may cost.

        Returns
        -------
        Decision
            ``granted`` (path ``warm``, ``cost`` the extension's price) or ``refused``
            with the rule (``tokens``, ``credits``; ``invalid`` for a lease that is not
            active), with the lease as it stands.

        Raises
        ------
        UnknownLease
            ``lease_id`` is not a lease of this broker.
        InvalidArgument
            ``duration`` or ``max_spend`` is out of range, or the lease would end past
            the engine's time range.
        """
        lid = self._lease_id(lease_id)
        ext = units.to_ns(units.real(duration, "duration", lo=units.MIN_DURATION,
                                     hi=MAX_DURATION, what="a number of seconds"), "duration")
        spend = -1 if max_spend is None else round(
            units.real(max_spend, "max_spend", hi=units.MAX_CREDITS) * CREDIT)
        t = self._now()
        self._advance(t)
        r = self._row(lid)
        if r >= 0 and int(self.st.t_end[r]) + ext > units.MAX_NS:
            raise InvalidArgument("duration", "would end the lease past the engine's time "
                                  f"range ({units.MAX_SECONDS:.6g} s)", duration)
        return self._journaled(J.OP["renew"], lid, self._lease_info(r), t, ext, spend,
                               self._renew(lid, r, ext, spend, t))

    def _renew(self, lid: int, r: int, ext: int, spend: int, t: int) -> Decision:
        st = self.st
        if r < 0:
            return _STALE
        c, d = int(st.camp[r]), int(st.dim[r])
        name = self._names[c]
        self._k.settle(st, c, d, t)
        self._renew_before = (int(st.T[c, d]), int(st.left[c]))
        if int(st.state[r]) != ACTIVE:
            return Decision(REFUSED_OUT, int(st.intent[r]), name, reason="invalid",
                            lease=self.lease(lid))
        self._reserve(1, 0)
        reason, price = self._k.renew(st, lid, ext, t, spend)
        if reason == OK:
            self._queue.lease_ended(c)          # (a renewal can refund tokens)
        if reason != OK:
            return Decision(REFUSED_OUT, int(st.intent[r]), name, reason=REASONS[reason],
                            lease=self.lease(lid), cost=price / CREDIT)
        return Decision(GRANTED_OUT, int(st.intent[r]), name, units=int(st.units[r]),
                        lease=self.lease(lid), path="warm", cost=price / CREDIT)

    def lease(self, lease_id: int) -> Lease:
        """The lease ``lease_id``, live or ended.

        An ended lease's record is kept until its row is reused (after ``reuse_after``
        later leases have ended), so memory stays bounded however many leases end.

        Parameters
        ----------
        lease_id : int
            A lease this broker issued.

        Returns
        -------
        Lease
            A snapshot of it now.

        Raises
        ------
        UnknownLease
            ``lease_id`` is not a lease of this broker, or it has ended and its record was
            reused (the message says so).
        """
        lid = self._lease_id(lease_id)
        r = self._row(lid)
        if r < 0:
            raise UnknownLease("lease_id", "has ended and its record was reused (it keeps no "
                               "record once reuse_after later leases have ended)", lease_id)
        st = self.st
        (camp, d, n, firm, state, k, t_grant, t_start, t_end, cost, off, revoke_at,
         intent) = (a.item(r) for a in (st.camp, st.dim, st.units, st.firm, st.state, st.lcls,
                                        st.t_grant, st.t_start, st.t_end, st.cost,
                                        st.slot_off, st.revoke_at, st.intent))
        slots: tuple[int, ...] = ()
        placement: tuple[tuple[str, int], ...] = ()
        if state == ACTIVE or state == REVOKING:
            slots = tuple(st.arena[off:off + n].tolist())
            owner = self._node_of_slot[d].take(slots).tolist()
            count: dict[int, int] = {}
            for j in owner:  # nodes in order of first appearance
                count[j] = count.get(j, 0) + 1
            names = self._node_names[d]
            placement = tuple([(names[j], c) for j, c in count.items()])
        started = off >= 0  # a reclaim grant released before its activation never started
        return Lease(
            id=lid, campaign=self._names[camp], dim=self.dims[d], units=n,
            state=LEASE_STATES[state], firm=bool(firm), service_class=self.classes[k].name,
            granted_at=t_grant / NS, start=t_start / NS if started else None,
            expiry=t_end / NS if started else None, cost=cost / CREDIT,
            revoke_at=revoke_at / NS if state in (REVOKING, REVOKED) else None,
            intent=intent, placement=placement, slots=slots)

    @_op
    def leases(self, campaign: str | None = None) -> list[Lease]:
        """The live leases: starting, active or revoking.

        Parameters
        ----------
        campaign : str, optional
            Only this campaign's; default all.

        Returns
        -------
        list of Lease
            Snapshots, after advancing to the clock (leases due to expire have ended).

        Raises
        ------
        UnknownCampaign
            ``campaign`` is not registered.
        """
        t = self._now()
        self._advance(t)
        st = self.st
        n = st.nleases
        live = (st.state[:n] == STARTING) | (st.state[:n] == ACTIVE) | (st.state[:n] == REVOKING)
        if campaign is not None:
            live &= st.camp[:n] == self.campaign_index(campaign)
        return [self.lease(st.lease_id(r)) for r in np.flatnonzero(live).tolist()]

    @_op
    def poll(self) -> list[Event]:
        """Advance to the clock and return the events since the last poll.

        Each event is returned once, in the order it happened, so a caller polling in a
        loop sees every expiry, revocation and pending grant exactly once.

        Returns
        -------
        list of Event
            The events, oldest first.
        """
        t = self._now()
        self._advance(t)
        ev, self._cur.events = self._cur.events, []
        if self._fast is not None:         # expiries the compiled path queued unbuilt
            ev = self._fast.events(ev, True)
        return ev

    def _queued_events(self) -> list[Event]:
        """The events the next :meth:`poll` returns so far, without taking them."""
        ev = self._cur.events
        return list(ev if self._fast is None else self._fast.events(ev, False))
