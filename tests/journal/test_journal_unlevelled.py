"""Journals written before records named the level of a tree that bound a decision (SPEC §9,
§14.2) still read and replay: their records are a prefix of today's, and their level reads
as not recorded (``LEVEL_UNRECORDED``), which explain names nowhere and replay does not
compare."""

from __future__ import annotations

import json
import math
import sqlite3
import zlib

import numpy as np
import pytest

from bursarcore import Broker, Envelope, Intent, ManualClock, Pool
from bursarcore.errors import JournalCorrupt
from bursarcore.journal import MemoryJournal, SQLiteJournal, export_jsonl, import_jsonl
from bursarcore.journal.base import crc
from bursarcore.journal.records import LEVEL_FIELDS, LEVEL_UNRECORDED, RECORD_DTYPE_UNLEVELLED

OLD = RECORD_DTYPE_UNLEVELLED.itemsize


def _tree_run() -> Broker:
    b = Broker(Pool(gpu=1024), clock=ManualClock(0.0), journal=MemoryJournal())
    for name, ceiling in (("astro", 512), ("astro/survey", 1024)):
        b.register(name, Envelope(credits=1e6, sustained={"gpu": 64}, ceiling={"gpu": ceiling},
                                  burst={"gpu": math.inf}))
    d = b.acquire(Intent("astro/survey", units={"gpu": (1, 1024)}, duration=600))
    assert b.journal.record(d.seq)["level"] == 0       # astro's ceiling bound it
    b.clock.advance(700)
    b.poll()
    return b


def _to_sqlite(b: Broker, path) -> None:
    """b's journal, copied into a new SQLite journal at path."""
    j = SQLiteJournal(path, create=True)
    j.append(b.journal.rows(), b.journal.payloads())
    j.flush()
    j.close()


def _as_old_sqlite(path) -> None:
    """Rewrite every row of a SQLite journal as the earlier layout wrote it."""
    db = sqlite3.connect(path)
    for seq, rec, payload, c in db.execute("SELECT seq, rec, payload, crc FROM journal").fetchall():
        if isinstance(c, int):
            old = rec[:OLD]
            db.execute("UPDATE journal SET rec = ?, crc = ? WHERE seq = ?",
                       (old, crc(old, payload), seq))
        else:
            size = len(rec) // (len(c) // 4)
            parts = [rec[i:i + OLD] for i in range(0, len(rec), size)]
            crcs = np.array([zlib.crc32(p) for p in parts], dtype="<u4").tobytes()
            db.execute("UPDATE journal SET rec = ?, crc = ? WHERE seq = ?",
                       (b"".join(parts), crcs, seq))
    db.commit()
    db.close()


def _check(j, b: Broker) -> None:
    rows = j.rows()
    assert (rows["level"] == LEVEL_UNRECORDED).all() and (rows["level_figure"] == 0).all()
    acq = int(np.flatnonzero(rows["op"] == 2)[0])
    assert "binds, not" not in b.explain(j.record(acq))        # no level named
    again = Broker.replay(j, clock=ManualClock(b.clock.now()), resume=False)
    assert again.state() == b.state()


def test_an_older_sqlite_journal_reads_and_replays(tmp_path):
    b = _tree_run()
    _to_sqlite(b, tmp_path / "j.db")
    db = sqlite3.connect(tmp_path / "j.db")
    assert db.execute("SELECT count(*) FROM journal WHERE op = -1").fetchone()[0] >= 1  # a page
    db.close()
    _as_old_sqlite(tmp_path / "j.db")
    old = SQLiteJournal(tmp_path / "j.db")
    _check(old, b)
    old.close()


def test_an_older_jsonl_journal_reads_and_replays(tmp_path):
    b = _tree_run()
    export_jsonl(b.journal, tmp_path / "j.jsonl")
    lines = []
    for raw, line in zip(b.journal.rows(), open(tmp_path / "j.jsonl", encoding="utf-8")):
        d = json.loads(line)
        for f in LEVEL_FIELDS:
            del d[f]
        payload = json.dumps(d["payload"], sort_keys=True) if d["payload"] is not None else None
        d["crc"] = crc(raw.tobytes()[:OLD], payload)
        lines.append(json.dumps(d, sort_keys=True) + "\n")
    (tmp_path / "old.jsonl").write_text("".join(lines), encoding="utf-8")
    _check(import_jsonl(tmp_path / "old.jsonl"), b)


def test_an_altered_older_record_is_still_caught(tmp_path):
    b = _tree_run()
    _to_sqlite(b, tmp_path / "j.db")
    _as_old_sqlite(tmp_path / "j.db")
    db = sqlite3.connect(tmp_path / "j.db")
    seq, rec = db.execute("SELECT seq, rec FROM journal ORDER BY seq DESC LIMIT 1").fetchone()
    bad = bytearray(rec)
    bad[-3] ^= 1
    db.execute("UPDATE journal SET rec = ? WHERE seq = ?", (bytes(bad), seq))
    db.commit()
    db.close()
    with pytest.raises(JournalCorrupt, match="checksum"):
        SQLiteJournal(tmp_path / "j.db")
