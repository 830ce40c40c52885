"""SQLite journal: the embedded durable default (stdlib ``sqlite3``, WAL, group commit).

Each record is stored as its exact columnar bytes (``rec``) with a CRC, beside a few plain
columns for people reading the file with ``sqlite3`` (queries through :meth:`query` run on
the columnar copy loaded at open, so the table carries no secondary index to slow inserts). Appends are buffered and committed in groups of at least ``batch``
records, always at the end of a broker operation (so the file ends on an operation
boundary); ``flush()`` commits the rest. A decision counts as acknowledged only once its seq is ≤
``durable_seq`` (the broker's ``sync()`` and the service wait for that). A torn or
tampered database raises :class:`~bursarcore.errors.JournalCorrupt` naming the record.
"""

from __future__ import annotations

import os
import sqlite3

import numpy as np

from ..errors import InvalidArgument, JournalCorrupt
from .base import Journal, check_rows, crc
from .records import OP, RECORD_DTYPE

__all__ = ["SQLiteJournal"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS journal (
    seq INTEGER PRIMARY KEY, t INTEGER NOT NULL, op INTEGER NOT NULL,
    campaign INTEGER NOT NULL, outcome INTEGER NOT NULL, reason INTEGER NOT NULL,
    rec BLOB NOT NULL, payload TEXT, crc INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
"""


class SQLiteJournal(Journal):
    """``SQLiteJournal(path, batch=1024, synchronous="FULL")``. Opening an existing file
    loads and verifies it (every record's CRC and sequence)."""

    durable = True

    def __init__(self, path: str | os.PathLike, batch: int = 1024,
                 synchronous: str = "FULL") -> None:
        super().__init__()
        if not isinstance(batch, int) or batch < 1:
            raise InvalidArgument("batch", "must be an integer >= 1", batch)
        if synchronous not in ("OFF", "NORMAL", "FULL", "EXTRA"):
            raise InvalidArgument("synchronous", "must be OFF, NORMAL, FULL or EXTRA", synchronous)
        self.path = os.fspath(path)
        self.batch = batch
        try:
            self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(f"PRAGMA synchronous={synchronous}")
            self._db.executescript(_SCHEMA)
        except sqlite3.DatabaseError as e:
            raise JournalCorrupt("file", f"{self.path} is not a readable journal: {e}") from None
        self._buf: list[tuple] = []
        self._pending_rows: list[np.ndarray] = []   # appended since rows() last merged
        self._tuples: list[tuple] = []
        self._tuple_payloads: dict[int, str] = {}
        self._rows_cache: np.ndarray | None = None
        self._payloads: dict[int, str] = {}
        self._load()

    def _load(self) -> None:
        try:
            cur = self._db.execute("SELECT seq, rec, payload, crc FROM journal ORDER BY seq")
            data = cur.fetchall()
        except sqlite3.DatabaseError as e:
            raise JournalCorrupt("file", f"{self.path}: {e}") from None
        rows = np.empty(len(data), dtype=RECORD_DTYPE)
        size = RECORD_DTYPE.itemsize
        import json
        for i, (seq, rec, payload, c) in enumerate(data):
            if not isinstance(rec, bytes) or len(rec) != size:
                raise JournalCorrupt(seq, f"record is {len(rec) if rec else 0} bytes, "
                                     f"expected {size} (truncated or foreign)")
            if crc(rec, payload) != c:
                raise JournalCorrupt(seq, "checksum mismatch (the record was altered or torn)")
            rows[i] = np.frombuffer(rec, dtype=RECORD_DTYPE)[0]
            if rows[i]["seq"] != seq:
                raise JournalCorrupt(seq, f"holds seq {int(rows[i]['seq'])}")
            if payload is not None:
                self._payloads[seq] = payload
                if rows[i]["op"] == OP["register"]:
                    try:
                        self.names.append(json.loads(payload)["name"])
                    except (ValueError, KeyError):
                        raise JournalCorrupt(seq, "register payload is not valid") from None
        check_rows(rows)
        self._rows_cache = rows
        self.next_seq = rows.shape[0]
        self.durable_seq = self.next_seq - 1

    def _store_one(self, record: tuple, payload: str | None, seq: int) -> None:
        self._tuples.append(record)
        if payload is not None:
            self._tuple_payloads[seq] = payload

    def _settle(self) -> None:
        """Turn buffered single records into rows (in bulk: one numpy conversion)."""
        if self._tuples:
            rows = np.array(self._tuples, dtype=RECORD_DTYPE)
            pl, self._tuple_payloads = self._tuple_payloads, {}
            self._tuples = []
            self._store_rows(rows, pl)

    def _store(self, rows: np.ndarray, payloads: dict[int, str]) -> None:
        self._settle()
        self._store_rows(rows, payloads)

    def _store_rows(self, rows: np.ndarray, payloads: dict[int, str]) -> None:
        raw = rows.tobytes()
        size = RECORD_DTYPE.itemsize
        seqs = rows["seq"].tolist()
        cols = np.stack([rows["t"], rows["op"].astype(np.int64), rows["campaign"].astype(np.int64),
                         rows["outcome"].astype(np.int64),
                         rows["reason"].astype(np.int64)], axis=1).tolist()
        for i, s in enumerate(seqs):
            rec = raw[i * size:(i + 1) * size]
            p = payloads.get(s)
            self._buf.append((s, *cols[i], rec, p, crc(rec, p)))
        self._payloads.update(payloads)
        self._pending_rows.append(rows.copy())

    def end_op(self, sync: bool = False) -> None:
        if sync or len(self._buf) + len(self._tuples) >= self.batch:
            self.flush()

    def flush(self) -> int:
        self._settle()
        if self._buf:
            db = self._db
            db.execute("BEGIN")
            db.executemany("INSERT INTO journal VALUES (?,?,?,?,?,?,?,?,?)", self._buf)
            db.execute("COMMIT")
            self.durable_seq = self._buf[-1][0]
            self._buf = []
        return self.durable_seq

    def rows(self) -> np.ndarray:
        self._settle()
        if self._rows_cache is None or self._pending_rows:
            parts = ([self._rows_cache] if self._rows_cache is not None else []) + \
                self._pending_rows
            self._rows_cache = np.concatenate(parts) if parts else np.empty(0, RECORD_DTYPE)
            self._pending_rows = []
        return self._rows_cache

    def payloads(self) -> dict[int, str]:
        self._settle()
        return self._payloads

    def close(self) -> None:
        self.flush()
        self._db.close()
