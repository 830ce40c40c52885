"""The reference broker's journal records (SPEC §9): one record per decision, with the
request, the rule inputs (class rank, deficit, tokens and credits before, free and unmet
capacity, each rule's limit) and the state after (tokens, credits, holding), in the
columns of :mod:`bursarcore.journal.records` and the integer units of SPEC §2."""

from __future__ import annotations

import dataclasses
import json
import math
from typing import TYPE_CHECKING, Any

from ..admission.envelope import Envelope
from ..errors import InvalidArgument
from ..journal import records as J
from ..journal.base import Journal
from .leases import LeaseRecord
from .rules import CANCELLED, CREDIT, REASONS, UNLIMITED, WARM

if TYPE_CHECKING:
    from .core import BrokerCore
    from .leases import Campaign
    from .pending import PendingIntent

_EV_OP = {"expired": "expire", "revoked": "revoke", "activated": "activate",
          "preempt_notice": "preempt", "granted": "grant", "refused": "refuse"}
_OUTCOME = {"granted": 1, "pending": 2, "refused": 3}


class JournalWriter:
    """Writes the records of one reference broker to a journal sink."""

    def __init__(self, broker: "BrokerCore", journal: Journal) -> None:
        self.b = broker
        self.j = journal
        # the deficits the last decision that used them read (SPEC §6, §9), per campaign;
        # NaN for a campaign registered since
        self.deficits: list[float] = []
        self.renew_before: tuple[int, int] = (0, 0)

    def config(self) -> None:
        b = self.b
        cg = b.congestion
        config = {"pool": b.pool.to_dict(), "classes": [vars(c) for c in b.classes],
                  "congestion": {"window": cg.window, "bins": cg.bins,
                                 "thresholds": list(cg.thresholds),
                                 "multipliers": list(cg.multipliers)},
                  "price": b.price, "ttl": b.ttl, "half_life": b.half_life,
                  "enforcement": b.enforcement, "reuse_after": b.reuse_after,
                  "max_pending": b.max_pending, "borrow_grace": b.borrow_grace}
        self.j.add({"op": J.OP["config"], "t": b._t}, json.dumps(config, sort_keys=True))

    def register_payload(self, name: str, envelope: Envelope) -> str:
        try:
            return json.dumps({"name": name, "envelope": envelope.to_json()}, sort_keys=True,
                              allow_nan=False)
        except (TypeError, ValueError) as e:
            raise InvalidArgument("envelope", f"must be JSON-serialisable ({e})",
                                  envelope) from None

    def register(self, t: int, c: int, payload: str | None) -> None:
        self.deficits.append(math.nan)
        self.j.add({"op": J.OP["register"], "t": t, "campaign": c, "outcome": 4}, payload)

    def change(self, t: int, c: int, payload: str | None) -> None:
        self.j.add({"op": J.OP["change"], "t": t, "campaign": c, "outcome": 4}, payload)

    def remove(self, t: int, c: int, payload: str | None) -> None:
        self.j.add({"op": J.OP["remove"], "t": t, "campaign": c, "outcome": 4}, payload)

    def _after(self, row: dict[str, Any], c: int, d: int) -> None:
        """The state after, with c's bucket settled to the record's time."""
        camp = self.b._camps[c]
        h = camp.hold[d]
        h.settle(int(row["t"]), self.b._instant)
        row["tokens_after"], row["credits_after"], row["held_after"] = h.T, camp.left, h.H

    def before(self, c: "Campaign", d: int, k: int, dur: int, spend: int | None,
               t: int) -> dict[str, Any]:
        """An acquire's rule inputs as they stand before the decision."""
        b = self.b
        lim = b._limits(c, d, k, dur, spend, t)
        return {"rank": b._terms[k].rank, "deficit": self.deficits[c.index],
                "tokens_before": c.hold[d].T, "credits_before": c.left,
                "free": b._dim[d].free_now(), "unmet": b._unmet(d),
                **{f"lim_{name}": min(v, UNLIMITED) for name, v in lim.by_rule.items()},
                "level": b._levels(c, d, k, dur, spend)}

    def acquire(self, dec: Any, before: dict[str, Any], c: int, d: int, k: int, nmin: int,
                nmax: int, dur: int, spend: int | None, deadline: int | None, ttl: int, t: int,
                iid: int, batch: int) -> Any:
        row: dict[str, Any] = {"op": J.OP["acquire"], "t": t, "campaign": c, "dim": d, "cls": k,
                               "batch": batch, "nmin": nmin, "nmax": nmax, "dur": dur,
                               "max_spend": -1 if spend is None else spend,
                               "deadline": J.deadline_field(deadline), "ttl": ttl,
                               "intent": iid, **before}
        row["outcome"] = _OUTCOME.get(dec.outcome, 4)
        row["reason"] = REASONS.index(dec.reason) if dec.reason else 0
        row["path"] = J.PATH_CODE.get(dec.path or "", 0)
        row["units"] = dec.units
        if dec.lease is not None:
            row["lease"] = dec.lease.id
            rec = self.b._leases.get(dec.lease.id)
            row["cost"] = rec.cost if rec is not None else 0
        rule = J.binding_rule(dec.outcome, dec.reason or "", dec.units, nmax,
                              [row[f] for f in J.LIMIT_FIELDS])
        row["level"], row["level_figure"] = J.level_of(rule, *row["level"])
        self._after(row, c, d)
        return dataclasses.replace(dec, seq=self.j.add(row))

    def event(self, kind: str, t: int, c: int, lease: LeaseRecord | None,
              intent: "PendingIntent | None", deadline: int | None, reason: int,
              path: int) -> None:
        row: dict[str, Any] = {"op": J.OP[_EV_OP[kind]], "t": t, "campaign": c, "reason": reason}
        if lease is not None:
            row.update(lease=lease.id, units=lease.units, dim=lease.dim, cls=lease.cls,
                       intent=lease.intent, cost=lease.cost)
            self._after(row, c, lease.dim)
        if intent is not None:
            row.update(intent=intent.intent_id, dim=intent.dim, cls=intent.cls,
                       nmin=intent.nmin, nmax=intent.nmax, dur=intent.dur,
                       max_spend=-1 if intent.spend is None else intent.spend,
                       rank=self.b._terms[intent.cls].rank,
                       outcome=1 if kind == "granted" else 3,
                       path=(1 if path == WARM else 2) if kind == "granted" else 0)
            self._after(row, c, intent.dim)
        if deadline is not None:
            row["deadline"] = deadline
        self.j.add(row)

    def advance(self, t: int) -> None:
        self.j.add({"op": J.OP["advance"], "t": t, "outcome": 4})

    def cancel(self, t: int, p: "PendingIntent") -> None:
        row: dict[str, Any] = {"op": J.OP["cancel"], "t": t, "campaign": p.campaign,
                               "intent": p.intent_id, "dim": p.dim, "cls": p.cls,
                               "outcome": 4, "reason": CANCELLED}
        self._after(row, p.campaign, p.dim)
        self.j.add(row)

    def lease_info(self, rec: LeaseRecord | None) -> tuple[int, int, int, int, int] | None:
        """(campaign, dim, class, intent, units) of a lease before an operation on it."""
        if rec is None:
            return None
        return (rec.campaign, rec.dim, rec.cls, rec.intent, rec.units)

    def lease_op(self, op: str, lid: int, info: tuple[int, int, int, int, int] | None, t: int,
                 ext: int, spend: int | None, dec: Any) -> Any:
        row: dict[str, Any] = {"op": J.OP[op], "t": t, "lease": lid}
        if info is not None:
            c, d, k, intent, n = info
            row.update(campaign=c, dim=d, cls=k, intent=intent, units=n)
        row["dur"], row["max_spend"] = ext, -1 if spend is None else spend
        row["outcome"] = {"granted": 1, "refused": 3}.get(dec.outcome, 4)
        row["reason"] = REASONS.index(dec.reason) if dec.reason else 0
        row["cost"] = round(dec.cost * CREDIT)
        if op == "renew" and info is not None:
            row["tokens_before"], row["credits_before"] = self.renew_before
        if info is not None:
            self._after(row, info[0], info[1])
        return dataclasses.replace(dec, seq=self.j.add(row))

    def consume(self, t: int, c: int, dim: int, a: int, got: int, cost: int, reason: int,
                wait: int) -> int:
        row = {"op": J.OP["consume"], "t": t, "campaign": c, "dim": dim, "nmax": a,
               "units": got, "cost": cost, "reason": reason, "outcome": 1 if got >= a else 3,
               "dur": wait, "credits_after": self.b._camps[c].left}
        return self.j.add(row)

    def nodes(self, op: str, t: int, d: int, payload: dict[str, Any]) -> None:
        row = {"op": J.OP[op], "t": t, "dim": d, "outcome": 4, "units": self.b._dim[d].cap}
        self.j.add(row, json.dumps(payload, sort_keys=True))
