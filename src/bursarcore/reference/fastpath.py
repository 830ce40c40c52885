"""Reference for the compiled ``_engine.FastAcquire``: ``Broker.acquire``'s common case in
one call, in plain Python.

The specification of an acquire is the broker's general path (``Broker._acquire``:
validate, read the clock, ``_advance``, ``_acquire_ns``). ``FastAcquire.acquire(intent)``
takes a shortcut through the same steps when none of the policy layer's work is due:

* the intent holds plain values (a ``str`` campaign that is registered, a ``dict`` with one
  held dimension mapped to an ``int`` or an ``(int, int)`` pair, float or int seconds, a
  float ``max_spend``) — anything else, including every invalid input, goes the general
  way, which raises the errors;
* the broker is not replaying, and its journal (if any) takes records through
  ``Journal.add`` as defined by the base class (not overridden);
* no policy event (revocation, activation, pending TTL) is due, no retired slot is
  draining, and no lease comes due while a subscriber listens (its callbacks run inside
  the expiry loop of the general path).

It then runs ``ring_advance``, the expiries (an ``expired`` event each, the victim sets
kept, the campaign's queue keys told: ``Broker._lease_ended``), the pending queue when the
broker would serve it (the clock moved or a lease expired: ``Broker._serve_pending``, or
only its count when no key's wake-up is due, ``Broker._wake_due``), and one ``admit``; a decision that needs the policy
layer goes to ``Broker._slow``. With a journal it writes the records the general path
writes — an ``expire`` record after each expiry (the state right after it), the
``advance`` record when a moved clock served a non-empty queue, and the ``acquire`` record
(request, rule inputs before, outcome, state after; its seq in the decision) — and then
calls ``journal.end_op(durable)`` as ``@_op`` does. It returns the
:class:`~bursarcore.broker.Decision`, or ``None`` — with nothing changed — when the shortcut
does not apply. The compiled twin returns equal decisions, writes equal records and leaves
equal state (``tests/backends/test_acquire_paths_agree.py``).
"""

from __future__ import annotations

import dataclasses
import math

from ..admission.state import (CAPACITY, GRANTED, LEASE_STATES, MAXV, REASONS, REFUSED,
                               ROW_MASK, TOKENS)
from ..journal.base import Journal
from ..journal.records import OP, deadline_field

__all__ = ["FastAcquire"]

_NS = 1_000_000_000
_CREDIT = 1_000_000
_DEADLINE = -1           # FastAcquire._decide: refused for a deadline already past
_MAX_S = (1 << 62) / 1e9
_MAX_FIXED_S = (1 << 62) / 1e6
_PLACE_MAX = 64
_ADV_CHUNK = 256


def _sec_ns(x) -> int | None:
    """units.to_ns for a plain float or a small int; None for anything else."""
    if type(x) is float:
        v = x
    elif type(x) is int and -(1 << 52) < x < (1 << 52):
        v = float(x)
    else:
        return None
    if not math.isfinite(v) or abs(v) > _MAX_S:
        return None
    return int(round(v * 1e9))


def _mk(cls, fields: dict):
    """A frozen (slotted) dataclass instance with these fields, as its ``__init__`` would
    build it."""
    o = cls.__new__(cls)
    for k, v in fields.items():
        object.__setattr__(o, k, v)
    return o


class FastAcquire:
    """See the module docstring. Built once per broker (it keeps the broker's tables)."""

    def __init__(self, broker, Decision, Lease, Event, Intent) -> None:
        b = broker
        self.b, self.st, self.k = b, b.st, b._k
        self.Decision, self.Lease, self.Event, self.Intent = Decision, Lease, Event, Intent
        self.cindex, self.dim_index, self.cls_index = b._cindex, b._dim_index, b._cls_index
        self.pending = b._pending
        self.names, self.dims = b._names, list(b.dims)
        self.cls_names = [c.name for c in b.classes]
        self.pyev, self.opp, self.revoking = b._pyev, b._opp_active, b._revoking
        self.subscribers, self.draining = b._subscribers, b._draining
        self.node_of_slot, self.node_names = b._node_of_slot, b._node_names
        self.buf = [0, 0, 0, 0]
        self.adv = [0] * _ADV_CHUNK
        self.adv1 = [0]       # with a journal: one expiry at a time

    @staticmethod
    def _journal_ok(jn) -> bool:
        """Records reach ``jn`` through ``Journal.add`` itself (not an override)."""
        return type(jn).add is Journal.add

    def _serve(self, t: int) -> None:
        """``Broker._serve_pending(t)`` (queue not empty): when no key's wake-up is due
        (``Broker._wake_due``), that pass would only count itself, which is done here."""
        b = self.b
        if b._queue_by_key and not b._wake_due(t):
            b._pass += 1
        else:
            b._serve_pending(t)

    def _admit(self, c, d, kc, nmin, nmax, dur, spend, t, iid):
        """``admit`` with room made first (the broker's ``_reserve``); fills ``self.buf``."""
        st = self.st
        if ((int(st.scal[2]) + 1 > st.camp.shape[0] and not st.reusable())
                or int(st.arena_top[0]) + nmax > st.arena.shape[0]
                or int(st.scal[3]) + 2 > st.heap_t.shape[0]):
            self.b._reserve(1, nmax)
        return self.k.admit(st, c, d, kc, nmin, nmax, dur, spend, t, iid, self.buf)

    def acquire(self, intent):
        b, st, k = self.b, self.st, self.k
        if type(intent) is not self.Intent:
            return None
        jn = b.journal
        if jn is not None and not self._journal_ok(jn):
            return None
        if b._t_force is not None:
            return None
        # the intent, as Broker._acquire reads it
        c = self.cindex.get(intent.campaign)
        if c is None:
            return None
        um = intent.units
        if type(um) is not dict or len(um) != 1:
            return None
        key, v = next(iter(um.items()))
        d = self.dim_index.get(key)
        if d is None:
            return None
        sc = intent.service_class
        if sc is None:
            # the envelope's class, as the broker recorded it at registration (an envelope
            # is immutable and registered once): one array read, not two lookups by name
            kc = int(b._default_cls[c])
        else:
            kc = self.cls_index.get(sc)
            if kc is None:
                return None
        if type(v) is int:
            if not 0 <= v < (1 << 62):
                return None
            nmin = nmax = v
        elif (type(v) is tuple or type(v) is list) and len(v) == 2 \
                and type(v[0]) is int and type(v[1]) is int:
            if not (0 <= v[0] < (1 << 62) and 0 <= v[1] < (1 << 62)):
                return None
            nmin, nmax = v[0], v[1]
        else:
            return None
        dur = _sec_ns(intent.duration)
        if dur is None:
            return None
        x = intent.max_spend
        if x is None:
            spend = -1
        elif type(x) is float and math.isfinite(x) and abs(x) < _MAX_FIXED_S:
            spend = int(round(x * 1e6))
        else:
            return None
        deadline = None
        if intent.deadline is not None:
            deadline = _sec_ns(intent.deadline)
            if deadline is None:
                return None
        ttl = _sec_ns(b.ttl if intent.ttl is None else intent.ttl)
        if ttl is None:
            return None
        # the clock, as Broker._now reads it
        x = b.clock.now()
        if type(x) is not float or not math.isfinite(x) or abs(x) > _MAX_S:
            return None
        t = int(round(x * 1e9))
        told = b._t
        if t < told:
            return None
        # Broker._advance(t) when it has no policy work to do
        if self.pyev and self.pyev[0][0] <= t:
            return None
        if any(self.draining):
            return None
        moved = t > told
        due = int(st.scal[3]) > 0 and int(st.heap_t[0]) <= t
        if due and self.subscribers:
            return None
        if jn is not None:
            try:
                return self._acquire_j(jn, c, d, kc, nmin, nmax, dur, spend, deadline, ttl,
                                       t, moved, due, intent)
            finally:
                if b.durable or type(jn).end_op is not Journal.end_op:
                    jn.end_op(b.durable)
        k.ring_advance(st, t)
        freed = self._expire(t) if due else 0
        if self.pending and (moved or freed):
            self._serve(t)
        if moved and t > b._t:        # max(): a subscriber may have moved it meanwhile
            b._t = t
        # Broker._acquire_ns / _decide_one
        iid = b._next_intent
        b._next_intent = iid + 1
        return self._decide(iid, c, d, kc, nmin, nmax, dur, spend, deadline, ttl, t,
                            intent)[0]

    __call__ = acquire

    def _decide(self, iid, c, d, kc, nmin, nmax, dur, spend, deadline, ttl, t, intent):
        """Broker._decide_one on the fast path: the Decision and how it was reached
        (_DEADLINE, or admit's GRANTED / REFUSED / SLOW, with its outputs in ``self.buf``)."""
        b, st = self.b, self.st
        name = self.names[c]
        if deadline is not None and deadline < t:
            return _mk(self.Decision, {"outcome": "refused", "intent_id": iid,
                                       "campaign": name, "units": 0, "lease": None,
                                       "path": None, "reason": "deadline",
                                       "retry_after": None, "cost": 0.0, "wait": 0.0,
                                       "seq": -1}), _DEADLINE
        buf = self.buf
        r = self._admit(c, d, kc, nmin, nmax, dur, spend, t, iid)
        if r == GRANTED:
            lid = int(buf[2])
            if not st.firm[lid & ROW_MASK]:
                self.opp[d].add(lid)
            return _mk(self.Decision, {"outcome": "granted", "intent_id": iid,
                                       "campaign": name, "units": int(buf[0]),
                                       "lease": self._lease(lid), "path": "warm",
                                       "reason": None, "retry_after": None,
                                       "cost": int(buf[3]) / _CREDIT, "wait": 0.0,
                                       "seq": -1}), r
        if r == REFUSED:
            reason = int(buf[1])
            retry = None
            if reason == TOKENS or reason == CAPACITY:
                retry = b._retry_after(c, d, nmin, dur, reason)
            return _mk(self.Decision, {"outcome": "refused", "intent_id": iid,
                                       "campaign": name, "units": 0, "lease": None,
                                       "path": None, "reason": REASONS[reason],
                                       "retry_after": retry, "cost": 0.0, "wait": 0.0,
                                       "seq": -1}), r
        return b._slow(iid, c, d, kc, nmin, nmax, dur, spend, deadline, ttl, t, intent), r

    def _acquire_j(self, jn, c, d, kc, nmin, nmax, dur, spend, deadline, ttl, t, moved, due,
                   intent):
        """The rest of ``acquire`` with a journal (validated, nothing changed yet): what
        ``Broker._advance`` and ``Broker._acquire_ns`` do and write (the caller ends the
        operation)."""
        b, st, k = self.b, self.st, self.k
        note = moved and bool(self.pending)          # Broker._advance's, up front
        k.ring_advance(st, t)
        freed = self._expire(t, jn) if due else 0
        if self.pending and (moved or freed):
            self._serve(t)
        if moved and t > b._t:
            b._t = t
        if note:
            jn.add({"op": OP["advance"], "t": t, "outcome": 4})
        # Broker._acquire_ns: the request row, with the rule inputs before the decision
        iid = b._next_intent
        b._next_intent = iid + 1
        row = {"op": OP["acquire"], "t": t, "campaign": c, "dim": d, "cls": kc, "batch": 0,
               "nmin": nmin, "nmax": nmax, "dur": dur, "max_spend": spend,
               "deadline": deadline_field(deadline), "ttl": ttl, "intent": iid,
               "rank": int(st.cls[kc, 0]), "deficit": b._deficit_last[c]}
        _, _, _, _, lims = k.decide(st, c, d, kc, nmin, nmax, dur, spend, t)
        row["tokens_before"], row["credits_before"] = int(st.T[c, d]), int(st.left[c])
        row["free"], row["unmet"] = k.free_now(st, d), int(st.U[d])
        row["lim_ceiling"], row["lim_capacity"], row["lim_tokens"], row["lim_credits"] = \
            (min(x, MAXV) for x in lims)
        # Broker._decide_one, and the decision's fields of the record
        dec, r = self._decide(iid, c, d, kc, nmin, nmax, dur, spend, deadline, ttl, t, intent)
        buf = self.buf
        if r == _DEADLINE:
            row["outcome"], row["reason"] = 3, REASONS.index("deadline")
        elif r == GRANTED:
            lid = int(buf[2])
            row["outcome"], row["path"], row["units"] = 1, 1, int(buf[0])
            row["lease"], row["cost"] = lid, int(st.cost[lid & ROW_MASK])
        elif r == REFUSED:
            row["outcome"], row["reason"] = 3, int(buf[1])
        else:
            row["outcome"] = {"granted": 1, "pending": 2, "refused": 3}.get(dec.outcome, 4)
            row["reason"] = REASONS.index(dec.reason) if dec.reason else 0
            row["path"] = {"warm": 1, "reclaim": 2}.get(dec.path or "", 0)
            row["units"] = dec.units
            if dec.lease is not None:
                row["lease"] = dec.lease.id
                if st.row_of(dec.lease.id) < 0:
                    raise IndexError(f"lease {dec.lease.id} out of range or stale")
                row["cost"] = int(st.cost[dec.lease.id & ROW_MASK])
        # Broker._record_decision's state after, journal.add
        row["tokens_after"], row["credits_after"] = int(st.T[c, d]), int(st.left[c])
        row["held_after"] = int(st.H[c, d])
        return dataclasses.replace(dec, seq=jn.add(row))

    def expire(self, t: int) -> int:
        """Broker._expire_until(t) when it has no subscriber and no retired slot draining
        (the broker checks): returns how many leases expired, or -1 (nothing done) when its
        journal takes records only through an overridden ``add``."""
        st, jn = self.st, self.b.journal
        if jn is not None and not self._journal_ok(jn):
            return -1
        if int(st.scal[3]) > 0 and int(st.heap_t[0]) <= t:
            return self._expire(t, jn)
        return 0

    def _expire(self, t: int, jn=None) -> int:
        """Broker._expire_until (no subscriber: checked by the caller); with a journal one
        lease at a time, each with its ``expire`` record (the state right after it).
        Returns how many leases expired."""
        st, k = self.st, self.k
        adv = self.adv if jn is None else self.adv1
        events = self.b._events
        total = 0
        while True:
            m = k.advance(st, t, adv)
            total += m
            for lid in adv[:m]:
                r = lid & ROW_MASK
                d = int(st.dim[r])
                self.b._lease_ended(int(st.camp[r]))
                if not st.firm[r]:
                    self.opp[d].discard(lid)
                self.revoking[d].discard(lid)
                events.append(_mk(self.Event, {
                    "kind": "expired", "time": int(st.t_end[r]) / _NS,
                    "campaign": self.names[int(st.camp[r])], "lease_id": lid,
                    "intent_id": None, "deadline": None, "reason": None,
                    "units": int(st.units[r])}))
                if jn is not None:
                    c = int(st.camp[r])
                    jn.add({"op": OP["expire"], "t": int(st.t_end[r]), "campaign": c,
                            "reason": 0, "lease": lid, "units": int(st.units[r]), "dim": d,
                            "cls": int(st.lcls[r]), "intent": int(st.intent[r]),
                            "cost": int(st.cost[r]), "tokens_after": int(st.T[c, d]),
                            "credits_after": int(st.left[c]), "held_after": int(st.H[c, d])})
            if m < len(adv):
                return total

    def events(self, ev: list, take: bool) -> list:
        """``Broker.poll``'s list from ``Broker._events``: ``ev`` itself. (The compiled
        path queues its expiries as fields and builds their events here, when ``poll``
        takes them; these are built as they expire, and are the same events.)"""
        return ev

    def _lease(self, lid: int):
        """Broker.lease(lid) for an active lease just granted."""
        st = self.st
        r = lid & ROW_MASK
        d, n, off = int(st.dim[r]), int(st.units[r]), int(st.slot_off[r])
        if n > _PLACE_MAX or off < 0:
            return self.b.lease(lid)
        slots = tuple(st.arena[off:off + n].tolist())
        owner = self.node_of_slot[d]
        count: dict[int, int] = {}
        for q in slots:
            j = int(owner[q])
            count[j] = count.get(j, 0) + 1
        names = self.node_names[d]
        return _mk(self.Lease, {
            "id": lid, "campaign": self.names[int(st.camp[r])], "dim": self.dims[d],
            "units": n, "state": LEASE_STATES[int(st.state[r])], "firm": bool(st.firm[r]),
            "service_class": self.cls_names[int(st.lcls[r])],
            "granted_at": int(st.t_grant[r]) / _NS, "start": int(st.t_start[r]) / _NS,
            "expiry": int(st.t_end[r]) / _NS, "cost": int(st.cost[r]) / _CREDIT,
            "revoke_at": None, "intent": int(st.intent[r]),
            "placement": tuple((names[j], cnt) for j, cnt in count.items()), "slots": slots})

