"""Replay (SPEC §9, invariant 8) of a reference broker: each input record re-executed
through the reference's own decision path (:func:`bursarcore.journal.replay.replay` reads
the journal and compares the records)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..journal import records as J
from ..journal.base import Journal
from ..journal.replay import envelope_of, nodes_of
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
    if op == J.OP["register"]:
        b.register(*envelope_of(payload))
    elif op == J.OP["acquire"]:
        b._advance(t)
        spend = int(r["max_spend"])
        b._decide(int(r["campaign"]), int(r["dim"]), int(r["cls"]), int(r["nmin"]),
                  int(r["nmax"]), int(r["dur"]), None if spend < 0 else spend,
                  J.deadline_of(int(r["deadline"])), int(r["ttl"]), t, batch=int(r["batch"]))
    elif op == J.OP["release"]:
        b.release(int(r["lease"]))
    elif op == J.OP["renew"]:
        spend = int(r["max_spend"])
        b._renew_ns(int(r["lease"]), int(r["dur"]), None if spend < 0 else spend)
    elif op == J.OP["cancel"]:
        b.cancel(int(r["intent"]))
    elif op == J.OP["advance"]:
        b._advance(t)
    elif op == J.OP["consume"]:
        b._advance(t)
        b._consume_ns(int(r["campaign"]), int(r["dim"]) - len(b.dims), int(r["nmax"]), t)
    elif op == J.OP["add_nodes"]:
        b.add_nodes(**nodes_of(payload))
    elif op == J.OP["remove_nodes"]:
        b.remove_nodes(**nodes_of(payload))
    else:
        raise ValueError(f"op {J.OPS[op]} cannot be replayed by this broker")
