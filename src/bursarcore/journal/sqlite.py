"""SQLite journal: the embedded durable default (stdlib ``sqlite3``, WAL, group commit).

Records are stored as their exact columnar bytes, in rows of the ``journal`` table:

* a record with a payload (``config``, ``register``, node changes), or one stored alone,
  is a row of its own: ``seq``, a few plain columns for people reading the file with
  ``sqlite3`` (``t``, ``op``, ``campaign``, ``outcome``, ``reason``), ``rec`` (its bytes),
  ``payload`` and ``crc`` = CRC-32 of the record's bytes and payload;
* consecutive records without payloads are stored as a *page*: ``seq`` is the page's last
  record, ``op`` (and ``campaign``, ``outcome``, ``reason``) is -1, ``t`` the last
  record's time, ``rec`` the records' bytes one after another, and ``crc`` a BLOB of one
  little-endian CRC-32 per record — so a page row costs SQLite one insert however many
  decisions it holds, and a damaged page still names the damaged record.

Queries through :meth:`query` run on the columnar copy loaded at open, so the table
carries no secondary index to slow inserts. Appends are buffered and committed in groups
of at least ``batch`` records, always at the end of a broker operation (so the file ends
on an operation boundary); ``flush()`` commits the rest. A decision counts as
acknowledged only once its seq is ≤ ``durable_seq`` (the broker's ``sync()`` and the
service wait for that). Opening a file verifies every record's CRC and sequence; a torn
or tampered database raises :class:`~bursarcore.errors.JournalCorrupt` naming the record.
Files written one row per record (before pages) read the same way.
"""

from __future__ import annotations

import json
import os
import sqlite3

import numpy as np

from ..errors import InvalidArgument, JournalCorrupt
from .base import Journal, RowStore, _as_bytes, check_rows, crc
from .fill import crc32_rows, pack_tuples
from .records import OP, RECORD_DTYPE

__all__ = ["SQLiteJournal"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS journal (
    seq INTEGER PRIMARY KEY, t INTEGER NOT NULL, op INTEGER NOT NULL,
    campaign INTEGER NOT NULL, outcome INTEGER NOT NULL, reason INTEGER NOT NULL,
    rec BLOB NOT NULL, payload TEXT, crc INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
"""
_INSERT = "INSERT INTO journal VALUES (?,?,?,?,?,?,?,?,?)"
_SIZE = RECORD_DTYPE.itemsize
_OP_AT = RECORD_DTYPE.fields["op"][1]
PAGE_RECORDS = 8192      # at most this many records in one page row (1.7 MB)
PAGE_SIZE = 16384        # SQLite page size of a new file (pages of records are large BLOBs:
                         # ~1.6x the commit rate of 4 KiB pages here)
WAL_AUTOCHECKPOINT = 1000   # SQLite pages (16 MB of WAL) between automatic checkpoints


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
            self._db.execute(f"PRAGMA page_size={PAGE_SIZE}")   # a new file only
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(f"PRAGMA synchronous={synchronous}")
            self._db.execute(f"PRAGMA wal_autocheckpoint={WAL_AUTOCHECKPOINT}")
            self._db.executescript(_SCHEMA)
        except sqlite3.DatabaseError as e:
            raise JournalCorrupt("file", f"{self.path} is not a readable journal: {e}") from None
        self._buf: list[tuple] = []      # rows of the journal table not yet committed
        self._tuples: list[tuple] = []
        self._tuple_payloads: dict[int, str] = {}
        self._payloads: dict[int, str] = {}
        self._rs = RowStore()
        self._load()

    @property
    def _rows_cache(self) -> np.ndarray:
        """Every record (subclasses written against the earlier layout read this)."""
        return self._rs.view()

    def _load(self) -> None:
        try:
            cur = self._db.execute("SELECT seq, rec, payload, crc FROM journal ORDER BY seq")
            data = cur.fetchall()
        except sqlite3.DatabaseError as e:
            raise JournalCorrupt("file", f"{self.path}: {e}") from None
        parts, expect = [], 0
        for seq, rec, payload, c in data:
            if isinstance(c, int):
                k = 1
            elif isinstance(c, bytes) and c and len(c) % 4 == 0:
                k = len(c) // 4
            else:
                raise JournalCorrupt(seq, "the checksum column holds no CRC")
            first = seq - k + 1
            if first != expect:
                raise JournalCorrupt(first, f"out of sequence: expected seq {expect}")
            got = len(rec) if isinstance(rec, (bytes, str)) else 0
            if not isinstance(rec, bytes) or got != k * _SIZE:
                bad = first + min(got // _SIZE, k - 1)
                what = (f"record is {got} bytes, expected {_SIZE}" if k == 1 else
                        f"page of records {first}..{seq} is {got} bytes, expected {k * _SIZE}")
                raise JournalCorrupt(bad, f"{what} (truncated or foreign)")
            if k == 1:
                if crc(rec, payload) != c:
                    raise JournalCorrupt(seq, "checksum mismatch (the record was altered or torn)")
            else:
                if payload is not None:
                    raise JournalCorrupt(first, f"page of records {first}..{seq} has a payload")
                bad = np.flatnonzero(crc32_rows(rec, _SIZE) != np.frombuffer(c, dtype="<u4"))
                if bad.size:
                    raise JournalCorrupt(first + int(bad[0]),
                                         "checksum mismatch (the record was altered or torn)")
            parts.append(rec)
            if payload is not None:
                self._payloads[seq] = payload
                if rec[_OP_AT] == OP["register"]:
                    try:
                        self.names.append(json.loads(payload)["name"])
                    except (ValueError, KeyError, TypeError):
                        raise JournalCorrupt(seq, "register payload is not valid") from None
            expect = seq + 1
        rows = np.frombuffer(b"".join(parts), dtype=RECORD_DTYPE).copy()
        check_rows(rows)
        self._rs = RowStore(rows=rows)
        self.next_seq = rows.shape[0]
        self.durable_seq = self.next_seq - 1

    def _store_one(self, record: tuple, payload: str | None, seq: int) -> None:
        self._tuples.append(record)
        if payload is not None:
            self._tuple_payloads[seq] = payload

    def _settle(self) -> None:
        """Turn buffered single records into rows (in bulk: one numpy conversion)."""
        if self._tuples:
            rows = np.empty(len(self._tuples), dtype=RECORD_DTYPE)
            pack_tuples(self._tuples, rows)
            pl, self._tuple_payloads = self._tuple_payloads, {}
            self._tuples = []
            self._store_rows(rows, pl)

    def _store(self, rows: np.ndarray, payloads: dict[int, str]) -> None:
        self._settle()
        self._store_rows(rows, payloads)

    def _store_rows(self, rows: np.ndarray, payloads: dict[int, str]) -> None:
        """Keep ``rows`` (consecutive seqs) and queue their table rows: one per record
        with a payload, pages for the runs between."""
        n = rows.shape[0]
        if not n:
            return
        raw = _as_bytes(rows)
        self._rs.extend(rows)
        self._payloads.update(payloads)
        crcs = crc32_rows(raw, _SIZE).astype("<u4", copy=False)
        first = int(rows["seq"][0])
        cuts = sorted(s - first for s in payloads if 0 <= s - first < n)
        buf, a = self._buf, 0
        for stop in cuts + [n]:
            while a < stop:
                b = min(stop, a + PAGE_RECORDS)
                if b - a == 1:
                    buf.append(self._single(rows, raw, a, first + a, int(crcs[a]), None))
                else:
                    buf.append((first + b - 1, int(rows["t"][b - 1]), -1, -1, -1, -1,
                                raw[a * _SIZE: b * _SIZE].tobytes(), None, crcs[a:b].tobytes()))
                a = b
            if stop < n:
                p = payloads[first + stop]
                rec = raw[stop * _SIZE: (stop + 1) * _SIZE].tobytes()
                buf.append(self._single(rows, raw, stop, first + stop, crc(rec, p), p))
                a = stop + 1

    @staticmethod
    def _single(rows: np.ndarray, raw: np.ndarray, i: int, seq: int, c: int,
                payload: str | None) -> tuple:
        r = rows[i]
        return (seq, int(r["t"]), int(r["op"]), int(r["campaign"]), int(r["outcome"]),
                int(r["reason"]), raw[i * _SIZE: (i + 1) * _SIZE].tobytes(), payload, c)

    def end_op(self, sync: bool = False) -> None:
        if sync or self.next_seq - 1 - self.durable_seq >= self.batch:
            self.flush()

    def take(self) -> list[tuple]:
        """Remove and return the table rows not yet committed (a batch for :meth:`commit`).

        Splitting :meth:`flush` in two lets a caller take the batch while it holds its
        own lock (between operations) and commit it outside, e.g. in a writer thread; the
        records stay readable in :meth:`rows` meanwhile."""
        self._settle()
        buf, self._buf = self._buf, []
        return buf

    def commit(self, batch: list[tuple]) -> int:
        """Write a batch from :meth:`take` in one transaction (all or nothing) and return
        the new :attr:`durable_seq`. Batches must be committed in the order taken."""
        if batch:
            db = self._db
            db.execute("BEGIN")
            try:
                db.executemany(_INSERT, batch)
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
            self.durable_seq = batch[-1][0]
        return self.durable_seq

    def flush(self) -> int:
        batch = self.take()
        try:
            return self.commit(batch)
        except BaseException:
            self._buf[:0] = batch             # not durable: keep it for the next flush
            raise

    def rows(self) -> np.ndarray:
        self._settle()
        return self._rs.view()

    def payloads(self) -> dict[int, str]:
        self._settle()
        return self._payloads

    def close(self) -> None:
        self.flush()
        self._db.close()
