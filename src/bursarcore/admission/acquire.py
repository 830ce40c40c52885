"""Single admission (SPEC §4, §4.5): ``acquire`` and its decision, the pending queue's
service, ``cancel`` and ``pending`` — the policy around the C core's decision for one
intent. With the Cython binding ``acquire`` first tries the compiled common case
(``FastAcquire``); anything else takes the general path here."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np

from .envelope import Intent, intent_inputs
from .pending import PendingQueue, _Pending
from .results import GRANTED_OUT, PENDING_OUT, REFUSED_OUT, Decision
from .state import (CANCELLED, CAPACITY, CREDIT, GRANTED, MAXV, PENDING_LIMIT, REASONS, RECLAIM,
                    REFUSED, ROW_MASK, TOKENS, WARM)
from ..errors import InvalidArgument, UnknownLease
from ..journal import records as J
from .._brokerbase import _EV_PENDING, NS, BrokerBase, Cursor, _op

__all__ = ["AcquireMixin", "AcquirePort"]


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class AcquirePort:
    """What a broker gives the compiled common case of ``acquire``
    (``_acquire.FastAcquire``) when it builds it, and the only way that code reaches the
    broker: the engine state, the pending queue and the cursor (read and written through
    their public fields), the broker's tables (read only, but for the two victim sets the
    fast path adds to and discards from), and the broker's steps for every case that
    leaves the common one. Each container is the broker's own object, never rebound."""

    state: Any                                 # the EngineState the core decides on
    queue: PendingQueue                        # intents, watches and pass counts (§4.5)
    cursor: Cursor                             # time, next intent id, journal, clock, events
    campaign_index: dict[str, int]             # campaign name -> row
    dim_index: dict[str, int]                  # held dimension -> index
    class_index: dict[str, int]                # service class -> row
    names: list[str]                           # campaign rows' names
    dims: list[str]                            # held dimensions
    class_names: list[str]                     # service classes' names, by row
    python_events: list[tuple[int, int, int, int]]   # the policy events' heap (time first)
    opportunistic: list[set[int]]              # per dimension: its opportunistic leases
    revoking: list[set[int]]                   # per dimension: its leases being revoked
    subscribers: list[Any]                     # event callbacks (the fast path runs none)
    draining: list[int]                        # per dimension: retired slots still held
    node_of_slot: list[np.ndarray]             # per dimension: each slot's node
    node_names: list[list[str]]                # per dimension: its nodes' names
    serve_pending: Callable[[int], None]       # a pass over the pending queue at t (ns)
    wake_shortcut: bool                        # the fast path may tell that no key is due
    slow: Callable[..., Decision]              # a decision that needs the policy layer
    retry_after: Callable[[int, int, int, int, int], float | None]
    reserve: Callable[[int, int], None]        # room for leases and slots, made first
    set_reserve: Callable[[int], None]         # a victim gone early: d's reclaim reserve anew
    lease: Callable[[int], Any]                # the Lease view of a lease id


class AcquireMixin(BrokerBase):
    """The broker's single admission: ``acquire``, ``cancel``, ``pending`` and the decision
    and pending-queue steps behind them."""

    # ------------------------------------------------------------------ acquire
    def _class_of(self, campaign: str, name: str | None) -> int:
        cname = name if name is not None else self.envelopes[campaign].service_class
        try:
            return self._cls_index[cname]
        except KeyError:
            raise InvalidArgument("service_class", f"must be one of {list(self._cls_index)}",
                                  cname) from None

    def _acquire_port(self) -> AcquirePort:
        """The broker's side of the compiled common case (see :class:`AcquirePort`). The
        fast path may skip a pass over the pending queue that would wake nothing only when
        that pass and its wake-up test are this class's own, not a subclass's."""
        tp = type(self)
        return AcquirePort(
            state=self.st, queue=self._queue, cursor=self._cur, campaign_index=self._cindex,
            dim_index=self._dim_index, class_index=self._cls_index, names=self._names,
            dims=list(self.dims), class_names=[c.name for c in self.classes],
            python_events=self._pyev, opportunistic=self._opp_active, revoking=self._revoking,
            subscribers=self._subscribers, draining=self._draining,
            node_of_slot=self._node_of_slot, node_names=self._node_names,
            serve_pending=self._serve_pending,
            wake_shortcut=(tp._serve_pending is AcquireMixin._serve_pending
                           and tp._wake_due is AcquireMixin._wake_due),
            slow=self._slow, retry_after=self._retry_after, reserve=self._reserve,
            set_reserve=self._set_reserve,
            lease=self.lease)

    def acquire(self, intent: Intent) -> Decision:
        """Decide an intent now (SPEC §4).

        Granted, pending or refused with a reason: a denial is a decision, not an
        exception, so only bad input raises, before any state changes.

        Parameters
        ----------
        intent : Intent
            The request.

        Returns
        -------
        Decision
            ``granted`` (with the lease, its path, cost and wait), ``pending`` (queued
            until its TTL or deadline; the binding ``reason`` and ``retry_after``) or
            ``refused`` (``reason``: ``ceiling``, ``capacity``, ``tokens``, ``credits``,
            ``deadline`` or ``pending_limit``).

        Raises
        ------
        UnknownCampaign
            ``intent.campaign`` is not registered.
        InvalidArgument
            ``intent`` is not an Intent, names a dimension the pool does not hold
            (``"units"``) or an unknown ``service_class``.
        TimeWentBackwards
            The clock ran backwards.
        """
        fast = self._fast
        if fast is not None:
            # the compiled common case (nothing unusual to do; with a journal it writes the
            # same records and ends the operation as @_op does); None when it does not
            # apply, with nothing changed
            dec: Decision | None = fast.acquire(intent)
            if dec is not None:
                return dec
        return self._acquire(intent)

    @_op
    def _acquire(self, intent: Intent) -> Decision:
        c, d, k, nmin, nmax, dur, spend_or_none, deadline, ttl = intent_inputs(self, intent)
        spend = -1 if spend_or_none is None else spend_or_none
        t = self._now()
        self._advance(t)
        return self._acquire_ns(c, d, k, nmin, nmax, dur, spend, deadline, ttl, t, intent)

    def _acquire_ns(self, c: int, d: int, k: int, nmin: int, nmax: int, dur: int, spend: int,
                    deadline: int | None, ttl: int, t: int, request: Intent | None = None,
                    batch: int = 0, iid: int | None = None) -> Decision:
        """One intent in engine integers, journaled (the entry point replay uses)."""
        if iid is None:
            iid = self._cur.next_intent
            self._cur.next_intent += 1
        if self.journal is None:
            return self._decide_one(iid, c, d, k, nmin, nmax, dur, spend, deadline, ttl, t,
                                    request)
        row = self._request_row(c, d, k, nmin, nmax, dur, spend, deadline, ttl, t, iid, batch)
        dec = self._decide_one(iid, c, d, k, nmin, nmax, dur, spend, deadline, ttl, t, request)
        self._record_decision(row, dec, c, d)
        return dataclasses.replace(dec, seq=self.journal.add(row))

    def _request_row(self, c: int, d: int, k: int, nmin: int, nmax: int, dur: int, spend: int,
                     deadline: int | None, ttl: int, t: int, iid: int,
                     batch: int) -> dict[str, Any]:
        """A journal row with the request and the rule inputs as they stand before the
        decision (SPEC §9): class rank, deficit, tokens, credits, free/unmet capacity and
        the limit each rule sets on the size."""
        st, kern = self.st, self._k
        row: dict[str, Any] = {}
        row["op"], row["t"], row["campaign"], row["dim"], row["cls"] = J.OP["acquire"], t, c, d, k
        row["batch"] = batch
        row["nmin"], row["nmax"], row["dur"], row["max_spend"] = nmin, nmax, dur, spend
        row["deadline"] = J.deadline_field(deadline)
        row["ttl"], row["intent"] = ttl, iid
        row["rank"] = int(st.cls[k, 0])
        row["deficit"] = self._cur.deficit_last[c]
        lims, lv, fig = kern.decide_levels(st, c, d, k, nmin, nmax, dur, spend, t)
        row["tokens_before"], row["credits_before"] = int(st.T[c, d]), int(st.left[c])
        row["free"], row["unmet"] = kern.free_now(st, d), int(st.U[d])
        row.update(zip(J.LIMIT_FIELDS, (min(x, MAXV) for x in lims)))
        row["level"] = (lv, fig)      # per rule, until the decision names its rule
        return row

    def _record_decision(self, row: dict[str, Any], dec: "Decision", c: int, d: int) -> None:
        row["outcome"] = {GRANTED_OUT: 1, PENDING_OUT: 2, REFUSED_OUT: 3}.get(dec.outcome, 4)
        row["reason"] = REASONS.index(dec.reason) if dec.reason else 0
        rule = J.binding_rule(dec.outcome, dec.reason or "", dec.units, row["nmax"],
                              [row[f] for f in J.LIMIT_FIELDS])
        row["level"], row["level_figure"] = J.level_of(rule, *row["level"])
        row["path"] = J.PATH_CODE.get(dec.path or "", 0)
        row["units"] = dec.units
        if dec.lease is not None:
            row["lease"] = dec.lease.id
            row["cost"] = int(self.st.cost[dec.lease.id & ROW_MASK])
        self._after(row, c, d)

    def _decide_one(self, iid: int, c: int, d: int, k: int, nmin: int, nmax: int, dur: int,
                    spend: int, deadline: int | None, ttl: int, t: int,
                    request: Intent | None) -> Decision:
        name = self._names[c]
        if deadline is not None and deadline < t:
            return Decision(REFUSED_OUT, iid, name, reason="deadline")
        self._reserve(1, nmax)
        buf = self._buf
        r = self._k.admit(self.st, c, d, k, nmin, nmax, dur, spend, t, iid, buf)
        if r == GRANTED:
            lid = int(buf[2])
            if not self.st.firm[lid & ROW_MASK]:
                self._opp_active[d].add(lid)
            return self._warm_decision(iid, c, int(buf[0]), lid, int(buf[3]))
        if r == REFUSED:
            reason = int(buf[1])
            return self._refusal(iid, c, reason,
                                 self._retry_after(c, d, nmin, dur, reason))
        return self._slow(iid, c, d, k, nmin, nmax, dur, spend, deadline, ttl, t, request)

    def _warm_decision(self, iid: int, c: int, n: int, lid: int, cost: int,
                       seq: int = -1) -> Decision:
        """The decision on a warm grant of n units as lease ``lid`` escrowing ``cost``
        (micro-credits), the lease as it stands now."""
        return Decision(GRANTED_OUT, iid, self._names[c], units=n, lease=self.lease(lid),
                        path="borrow" if self.st.borrowed(lid & ROW_MASK) else "warm",
                        cost=cost / CREDIT, seq=seq)

    def _refusal(self, iid: int, c: int, reason: int, retry_after: float | None,
                 seq: int = -1) -> Decision:
        """The decision on a refusal for ``reason`` (a code of ``REASONS``)."""
        return Decision(REFUSED_OUT, iid, self._names[c], reason=REASONS[reason],
                        retry_after=retry_after, seq=seq)

    def _slow(self, iid: int, c: int, d: int, k: int, nmin: int, nmax: int, dur: int, spend: int,
              deadline: int | None, ttl: int, t: int, request: Intent | None) -> Decision:
        """Reclaim or pend: the parts of §4 that need policy (victims, queue)."""
        name = self._names[c]
        n, reason, path, pm, lims = self._k.decide(self.st, c, d, k, nmin, nmax, dur, spend, t)
        if n >= nmin and path == RECLAIM:
            plan = self._plan_reclaim(d, n, t)
            if deadline is not None and plan[1] > deadline:
                return Decision(REFUSED_OUT, iid, name, reason="deadline",
                                wait=(plan[1] - t) / NS)
            lid = self._reclaim(c, d, k, n, dur, pm, t, iid, plan)
            return Decision(GRANTED_OUT, iid, name, units=n, lease=self.lease(lid),
                            path="reclaim", cost=int(self.st.cost[lid & ROW_MASK]) / CREDIT,
                            wait=(self._activation[lid] - t) / NS)
        oldest = self._queue.full(c, self.max_pending)
        if oldest is not None:
            # at its cap: a slot frees by the time its oldest waiting intent expires
            return Decision(REFUSED_OUT, iid, name, reason=REASONS[PENDING_LIMIT],
                            retry_after=max(0, oldest.expires - t) / NS)
        if self.max_pending == 0:
            return Decision(REFUSED_OUT, iid, name, reason=REASONS[PENDING_LIMIT])
        expires = t + ttl
        if deadline is not None:
            expires = min(expires, deadline)
        self._queue.add(iid, c, d, k, nmin, nmax, dur, spend, deadline, expires, reason,
                        request, lims, t)
        self._push(expires, _EV_PENDING, iid)
        return Decision(PENDING_OUT, iid, name, reason=REASONS[reason],
                        retry_after=self._retry_after(c, d, nmin, dur, reason))

    def _retry_after(self, c: int, d: int, nmin: int, dur: int, reason: int,
                     nxt: int | None = None) -> float | None:
        """When a retry of a refused or pending intent may succeed: for ``tokens`` when
        c's bucket on d holds what nmin units for dur need, for ``capacity`` at the next
        expiry (``nxt``, ns or -1, when the caller read it; else read now)."""
        st = self.st
        if reason == TOKENS:
            wait = self._k.token_wait(st, c, d, nmin, dur)
            return wait / NS if wait >= 0 else None
        if reason == CAPACITY:
            if nxt is None:
                nxt = self._k.next_expiry(st)
            return max(0, nxt - self._cur.t) / NS if nxt >= 0 else None
        return None

    def _serve_pending(self, t: int) -> None:
        """Grant what the queue can have at t, in the order of SPEC §4.5."""
        self._queue.serve(t)

    def _wake_due(self, t: int) -> bool:
        """Whether a pass at t has a key to decide (``PendingQueue.wake_due``)."""
        return self._queue.wake_due(t)

    def _grant_pending(self, p: _Pending, n: int, path: int, pm: int, plan: Any,
                       t: int) -> None:
        st = self.st
        self._queue.drop(p.intent_id)
        if path == WARM:
            lid = self._k.grant(st, p.campaign, p.dim, p.cls, n, p.dur, pm, t, False,
                                p.intent_id)
            if not st.firm[lid & ROW_MASK]:
                self._opp_active[p.dim].add(lid)
        else:
            lid = self._reclaim(p.campaign, p.dim, p.cls, n, p.dur, pm, t, p.intent_id, plan)
        self._emit("granted", t, p.campaign, lid=lid, iid=p.intent_id, pend=p, path=path)


    @_op
    def cancel(self, intent_id: int) -> bool:
        """Withdraw a pending intent.

        Parameters
        ----------
        intent_id : int
            The id of an intent this broker decided (``Decision.intent_id``).

        Returns
        -------
        bool
            True if it was pending and is withdrawn; False if it is no longer pending
            (granted, refused, expired or cancelled already).

        Raises
        ------
        UnknownLease
            ``intent_id`` is not an intent of this broker (``field`` is ``"intent_id"``).
        """
        if isinstance(intent_id, (bool, np.bool_)) or not isinstance(intent_id, (int, np.integer)):
            raise UnknownLease("intent_id", "is not an intent of this broker", intent_id)
        intent_id = int(intent_id)
        t = self._now()
        self._advance(t)
        if intent_id not in self._queue.intents:
            if isinstance(intent_id, int) and 0 <= intent_id < self._cur.next_intent:
                return False
            raise UnknownLease("intent_id", "is not an intent of this broker", intent_id)
        p = self._queue.drop(intent_id)
        if self.journal is not None:
            row = {}
            row["op"], row["t"], row["campaign"], row["intent"] = J.OP["cancel"], t, p.campaign, intent_id
            row["dim"], row["cls"], row["outcome"], row["reason"] = p.dim, p.cls, 4, CANCELLED
            self._after(row, p.campaign, p.dim)
            self.journal.add(row)
        return True

    def pending(self, campaign: str | None = None) -> list[dict[str, Any]]:
        """The pending intents, in arrival order, each with the rule that binds it now.

        A read: the reason is worked out from the state as it stands, and nothing moves.

        Parameters
        ----------
        campaign : str, optional
            Only this campaign's (read from its own index); default all.

        Returns
        -------
        list of dict
            One per intent: ``intent_id``, ``campaign``, ``dim``, ``min``, ``max``,
            ``duration``, ``reason``, ``expires`` (broker time) and ``service_class``.

        Raises
        ------
        UnknownCampaign
            ``campaign`` is not registered.
        """
        c = None if campaign is None else self.campaign_index(campaign)
        return self._queue.listing(c)
