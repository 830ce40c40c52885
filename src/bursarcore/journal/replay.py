"""Replay (SPEC §9, invariant 8): rebuild a broker from its journal by re-executing every
input record at its recorded time, and check that the records the rebuilt broker writes
are the journal's, field for field.

One procedure for every backend: :func:`replay` reads the config record, builds the broker
with a shadow journal, hands each input record to the backend's own ``one(broker, op, row,
payload, t)`` (which re-executes it through that broker's decision path) and compares.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Mapping, TypeVar

import numpy as np

from ..admission.classes import Congestion, ServiceClass
from ..admission.envelope import Envelope, Pool
from ..clock import ManualClock
from ..errors import InvalidArgument, JournalCorrupt
from . import records as J
from .base import Journal
from .memory import MemoryJournal

__all__ = ["replay", "replay_common"]

NS = 1_000_000_000
_LEASE_OPS = (J.OP["release"], J.OP["renew"])
B = TypeVar("B")


def _config(journal: Journal) -> tuple[np.ndarray, Mapping[int, str], dict[str, Any]]:
    """The journal's rows, payloads and the broker's constructor arguments."""
    rows, pl = journal.rows(), journal.payloads()
    if rows.size == 0 or rows[0]["op"] != J.OP["config"] or 0 not in pl:
        raise JournalCorrupt(0, "a journal starts with its broker's config record")
    try:
        cfg = json.loads(pl[0])
        cg = cfg["congestion"]
        kw = dict(pool=Pool.from_dict(cfg["pool"]),
                  classes=[ServiceClass(**c) for c in cfg["classes"]],
                  congestion=Congestion(window=cg["window"], bins=cg["bins"],
                                        thresholds=tuple(cg["thresholds"]),
                                        multipliers=tuple(cg["multipliers"])),
                  price=cfg["price"], ttl=cfg["ttl"], half_life=cfg["half_life"],
                  enforcement=cfg["enforcement"],
                  # journals written before rows were reused, or before the cap on
                  # pending intents, had neither: they replay as such
                  reuse_after=cfg.get("reuse_after"), max_pending=cfg.get("max_pending"),
                  # (and before borrowing: its default grace)
                  borrow_grace=cfg.get("borrow_grace", 60.0))
    except (ValueError, KeyError, TypeError) as e:
        raise JournalCorrupt(0, f"config record unreadable: {e}") from None
    return rows, pl, kw


def _compare(rows: np.ndarray, mine: np.ndarray) -> None:
    """The first record where ``mine`` differs from ``rows`` is named, with its field."""
    a = rows.view(np.uint8).reshape(rows.shape[0], -1) if rows.size else rows
    m = mine.view(np.uint8).reshape(mine.shape[0], -1) if mine.size else mine
    k = min(a.shape[0], m.shape[0])
    diff = np.flatnonzero((a[:k] != m[:k]).any(axis=1)) if k else np.zeros(0, int)
    for seq in diff.tolist():
        for f in J.FIELDS:
            if f in J.LEVEL_FIELDS and rows[seq]["level"] == J.LEVEL_UNRECORDED:
                continue            # a journal written before records named the level
            x, y = rows[seq][f], mine[seq][f]
            if not (x == y or (f == "deficit" and np.isnan(x) and np.isnan(y))):
                raise JournalCorrupt(seq, f"replay diverged from the journal in field {f!r}")
    if rows.shape[0] != mine.shape[0]:
        raise JournalCorrupt(k, "replay diverged from the journal in length")


def replay(cls: Callable[..., B], journal: Journal, one: Callable[[B, int, Any, str | None, int], None],
           *, backend: str | None = None, clock: Any = None, resume: bool = True,
           attach: Callable[[B, Journal], None], exact_start: bool = False) -> B:
    """Rebuild a broker of ``cls`` from ``journal``.

    ``one(b, op, row, payload, t)`` re-executes one input record at its time ``t`` (the
    broker takes it through its ``_pin_time``); ``attach(b, journal)`` makes the rebuilt
    broker go on appending to ``journal`` (with ``resume``); ``exact_start`` starts the
    broker's time at the config record's own nanosecond. A clock behind the journal is
    refused at its first use.
    """
    rows, pl, kw = _config(journal)
    t0 = int(rows[0]["t"])
    clk = ManualClock(t0 / NS)       # replay runs at the journal's times; ``clock`` after
    shadow = MemoryJournal()
    opts = {} if backend is None else {"backend": backend}
    b: Any = cls(kw.pop("pool"), clk, journal=shadow, **opts, **kw)
    if exact_start:
        b._start_time(t0)            # the journal's first time, not its float's rounding
    for i in range(1, rows.shape[0]):
        r = rows[i]
        op = int(r["op"])
        if op not in J.INPUT_OPS:
            continue
        t = int(r["t"])
        b._pin_time(t)
        try:
            if op in _LEASE_OPS:
                # the lease may be one the queue was granted by time passing to t (read by a
                # poll, which writes no record): the broker is at t before the id is checked
                b._advance(t)
            one(b, op, r, pl.get(int(r["seq"])), t)
        except (InvalidArgument, KeyError, ValueError, IndexError) as e:
            raise JournalCorrupt(int(r["seq"]), f"cannot be replayed: {e}") from None
    # derived records after the last input (expiries seen by a poll) come back too
    last = int(rows[-1]["t"])
    b._pin_time(last)
    b._advance(last)
    t_end = b._end_replay()
    if clk.now() < t_end / NS:
        clk.set(t_end / NS)
    if clock is not None:
        b.clock = clock
    _compare(rows, shadow.rows())
    if resume:
        attach(b, journal)
        journal.flush()
    return b


def replay_common(b: Any, op: int, r: Any, payload: str | None, t: int) -> bool:
    """Re-execute an input record that every broker replays through its public calls
    (registration, release, cancel, advance, consumption, nodes); False for one it must
    re-execute through its own decision path (acquire, renew)."""
    if op == J.OP["register"]:
        b.register(*envelope_of(payload))
    elif op == J.OP["change"]:
        b.change(*envelope_of(payload))
    elif op == J.OP["remove"]:
        b.remove(json.loads(payload or "{}")["name"])
    elif op == J.OP["release"]:
        b.release(int(r["lease"]))
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
    elif op not in (J.OP["acquire"], J.OP["renew"]):
        raise ValueError(f"op {J.OPS[op]} cannot be replayed by this broker")
    else:
        return False
    return True


def envelope_of(payload: str | None) -> tuple[str, Envelope]:
    """A ``register`` or ``change`` record's campaign name and envelope (JSON has no infinity: an
    unlimited budget or bucket is written as null)."""
    p = json.loads(payload or "{}")
    return p["name"], Envelope.from_dict(p["envelope"])


def nodes_of(payload: str | None) -> dict[str, Any]:
    """An ``add_nodes`` / ``remove_nodes`` record's arguments (the grace in seconds)."""
    p = json.loads(payload or "{}")
    out = {"dim": p["dim"], "nodes": [tuple(x) if isinstance(x, list) else x for x in p["nodes"]]}
    if "grace" in p:
        out["grace"] = p["grace"] / NS
    return out
