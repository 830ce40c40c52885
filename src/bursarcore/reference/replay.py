"""Replay (SPEC §9, invariant 8) of a reference broker: each input record re-executed
through the reference's own decision path (:func:`bursarcore.journal.replay.replay` reads
the journal and compares the records)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..journal import records as J
from ..journal.base import Journal
from ..journal.replay import replay_common
from ..journal.replay import replay as _replay

if TYPE_CHECKING:
    from .broker import ReferenceBroker

__all__ = ["replay"]


def replay(cls: type["ReferenceBroker"], journal: Journal, clock: Any = None,
           resume: bool = True) -> "ReferenceBroker":
    return _replay(cls, journal, _one, clock=clock, resume=resume, attach=_attach,
                   exact_start=True)


def _attach(b: "ReferenceBroker", journal: Journal) -> None:
    b.journal = journal
    if b._jw is not None:
        b._jw.j = journal


def _one(b: "ReferenceBroker", op: int, r: Any, payload: str | None, t: int) -> None:
    if replay_common(b, op, r, payload, t):
        return
    spend = int(r["max_spend"])
    if op == J.OP["acquire"]:
        b._advance(t)
        b._decide(int(r["campaign"]), int(r["dim"]), int(r["cls"]), int(r["nmin"]),
                  int(r["nmax"]), int(r["dur"]), None if spend < 0 else spend,
                  J.deadline_of(int(r["deadline"])), int(r["ttl"]), t, batch=int(r["batch"]))
    else:                                    # renew
        b._renew_ns(int(r["lease"]), int(r["dur"]), None if spend < 0 else spend)
