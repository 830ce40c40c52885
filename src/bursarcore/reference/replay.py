"""Replay (SPEC §9, invariant 8): rebuild a reference broker from a journal by
re-executing every input record at its recorded time, and check that the records it writes
are the journal's, field for field."""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

import numpy as np

from ..admission.classes import Congestion, ServiceClass
from ..admission.envelope import Envelope, Pool
from ..clock import ManualClock
from ..errors import InvalidArgument, JournalCorrupt
from ..journal import records as J
from ..journal.base import Journal
from ..journal.memory import MemoryJournal
from .rules import NS

if TYPE_CHECKING:
    from .broker import ReferenceBroker


def replay(cls: type["ReferenceBroker"], journal: Journal, clock: Any = None,
           resume: bool = True) -> "ReferenceBroker":
    rows, pl = journal.rows(), journal.payloads()
    if rows.size == 0 or rows[0]["op"] != J.OP["config"] or 0 not in pl:
        raise JournalCorrupt(0, "a journal starts with its broker's config record")
    try:
        cfg = json.loads(pl[0])
        pool = Pool.from_dict(cfg["pool"])
        classes = [ServiceClass(**c) for c in cfg["classes"]]
        cg = cfg["congestion"]
        congestion = Congestion(window=cg["window"], bins=cg["bins"],
                                thresholds=tuple(cg["thresholds"]),
                                multipliers=tuple(cg["multipliers"]))
    except (ValueError, KeyError, TypeError) as e:
        raise JournalCorrupt(0, f"config record unreadable: {e}") from None
    clk = ManualClock(int(rows[0]["t"]) / NS)
    shadow = MemoryJournal()
    b = cls(pool, clk, classes=classes, congestion=congestion, price=cfg["price"],
            ttl=cfg["ttl"], half_life=cfg["half_life"], enforcement=cfg["enforcement"],
            journal=shadow, reuse_after=cfg.get("reuse_after"),
            max_pending=cfg.get("max_pending"))
    b._t = int(rows[0]["t"])
    for i in range(1, rows.shape[0]):
        r = rows[i]
        op = int(r["op"])
        if op not in J.INPUT_OPS:
            continue
        t = int(r["t"])
        b._t_force = t
        try:
            _one(b, op, r, pl.get(int(r["seq"])), t)
        except (InvalidArgument, KeyError, ValueError, IndexError) as e:
            raise JournalCorrupt(int(r["seq"]), f"cannot be replayed: {e}") from None
    b._t_force = int(rows[-1]["t"])
    b._advance(b._t_force)            # derived records after the last input come back too
    b._t_force = None
    b._events = []
    if clk.now() < b._t / NS:
        clk.set(b._t / NS)
    if clock is not None:
        b.clock = clock
    mine = shadow.rows()
    k = min(rows.shape[0], mine.shape[0])
    for seq in range(k):
        for f in J.FIELDS:
            x, y = rows[seq][f], mine[seq][f]
            if not (x == y or (f == "deficit" and np.isnan(x) and np.isnan(y))):
                raise JournalCorrupt(seq, f"replay diverged from the journal in field {f!r}")
    if rows.shape[0] != mine.shape[0]:
        raise JournalCorrupt(k, "replay diverged from the journal in length")
    if resume:
        b.journal = journal
        if b._jw is not None:
            b._jw.j = journal
        journal.flush()
    return b


def _one(b: "ReferenceBroker", op: int, r: Any, payload: str | None, t: int) -> None:
    if op == J.OP["register"]:
        p = json.loads(payload or "{}")
        env = dict(p["envelope"])
        if env.get("credits") is None:
            env["credits"] = math.inf
        env["burst"] = {k: (math.inf if v is None else v) for k, v in env["burst"].items()}
        b.register(p["name"], Envelope.from_dict(env))
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
        p = json.loads(payload or "{}")
        b.add_nodes(p["dim"], [tuple(x) for x in p["nodes"]])
    elif op == J.OP["remove_nodes"]:
        p = json.loads(payload or "{}")
        b.remove_nodes(p["dim"], p["nodes"], grace=p["grace"] / NS)
    else:
        raise ValueError(f"op {J.OPS[op]} cannot be replayed by this broker")


__all__ = ["replay"]
