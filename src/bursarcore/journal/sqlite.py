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

Opening never makes a journal: ``SQLiteJournal(path)`` opens one that exists and holds
records, and ``SQLiteJournal(path, create=True)`` makes a new one where there is none
(a missing or zero-length file); anything else raises
:class:`~bursarcore.errors.JournalUnavailable` naming the path. Beside the database live

* ``<path>.lock``: an exclusive ``flock`` held for the life of the journal object (one
  writer per journal; a second open, in this process or another, is refused);
* ``<path>.hwm``: the high-water mark, the highest seq ever committed, rewritten after
  every commit group (and fsync'd when ``synchronous`` is FULL or EXTRA). A database that
  ends below it lost acknowledged records (its ``-wal`` file deleted, the file truncated or
  replaced by an older copy) and is refused at open.

The database, its ``-wal`` and ``-shm`` files (SQLite gives them the database's mode) and
both side files are created mode 0600: the journal holds every campaign's decisions.
"""

from __future__ import annotations

import fcntl
import json
import os
import sqlite3
import struct
import time
import zlib

import numpy as np

from ..errors import InvalidArgument, JournalCorrupt, JournalUnavailable
from .base import Journal, RowStore, _as_bytes, check_rows, crc
from .fill import crc32_rows, pack_tuples
from .records import OP, RECORD_DTYPE, RECORD_DTYPE_UNLEVELLED, RECORD_FIELDS, from_unlevelled

__all__ = ["SQLiteJournal", "HighWaterMark"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS journal (
    seq INTEGER PRIMARY KEY, t INTEGER NOT NULL, op INTEGER NOT NULL,
    campaign INTEGER NOT NULL, outcome INTEGER NOT NULL, reason INTEGER NOT NULL,
    rec BLOB NOT NULL, payload TEXT, crc INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
"""
_INSERT = "INSERT INTO journal VALUES (?,?,?,?,?,?,?,?,?)"
_SIZE = RECORD_DTYPE.itemsize
_OLD_SIZE = RECORD_DTYPE_UNLEVELLED.itemsize   # rows written before records named a level
_OP_AT = RECORD_FIELDS["op"][1]
PAGE_RECORDS = 8192      # at most this many records in one page row (1.7 MB)
PAGE_SIZE = 16384        # SQLite page size of a new file (pages of records are large BLOBs:
                         # a quarter of the overflow pages and WAL frames of 4 KiB per commit)
WAL_AUTOCHECKPOINT = 1000   # SQLite pages (16 MB of WAL) between automatic checkpoints
# the most seconds the high-water mark on disk may lag behind the last commit, by
# synchronous level: EXTRA after every commit group, FULL once a second, else never
_MARK_SYNC = {"EXTRA": 0.0, "FULL": 1.0, "NORMAL": None, "OFF": None}


def _unavailable(path: str, kind: str, problem: str) -> JournalUnavailable:
    return JournalUnavailable(path, problem, kind)


class HighWaterMark:
    """The highest journal seq ever committed, in a small file beside the database.

    Two checksummed slots in separate 512-byte sectors, overwritten in turn, so a write torn
    by a crash spoils at most the slot being written and the other still holds the mark
    before it; a new file is written whole, fsync'd and renamed into place. The mark is
    written only once its records are durable, so whatever of it survives a crash is never
    ahead of the database: it can only under-report, never refuse a sound journal.

    A write is one ``pwrite`` into the page cache, which a killed process, a deleted
    ``-wal`` file or a copied database cannot undo; ``sync`` is the most seconds the file
    on disk may lag behind it (``fdatasync`` at most that often, and on close; 0: after
    every write; None: left to the system). One ``fdatasync`` per commit group would cost
    group commit about as much as the commit itself. ``mark`` is -1 until something was
    committed."""

    _REC = struct.Struct("<8sqI")
    _MAGIC = b"bsrhwm1\0"
    _SLOT = 512

    def __init__(self, path: str, sync: float | None = 0.0) -> None:
        self.path = path
        self.sync = sync
        self.mark = -1
        self._fd = -1
        self._slot = 0
        self._synced = time.monotonic()
        self._dirty = False

    def _record(self, seq: int) -> bytes:
        head = self._MAGIC + struct.pack("<q", seq)
        return head + struct.pack("<I", zlib.crc32(head))

    def load(self) -> bool:
        """Read the mark; False if there is no file. Raises ``ValueError`` when the file
        holds no valid slot."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            return False
        data = os.pread(fd, 2 * self._SLOT, 0)
        best, slot = -1, None
        for i in (0, 1):
            chunk = data[i * self._SLOT: i * self._SLOT + self._REC.size]
            if len(chunk) == self._REC.size:
                magic, seq, c = self._REC.unpack(chunk)
                if magic == self._MAGIC and c == zlib.crc32(chunk[:16]) and seq >= -1 \
                        and (slot is None or seq > best):
                    best, slot = seq, i
        if slot is None:
            os.close(fd)
            raise ValueError(f"{self.path} holds no valid high-water mark")
        self._fd, self.mark, self._slot = fd, best, 1 - slot
        return True

    def create(self, seq: int) -> None:
        """A new mark file holding ``seq``, in place atomically (mode 0600)."""
        tmp = self.path + ".tmp"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            rec = self._record(seq).ljust(self._SLOT, b"\0")
            os.pwrite(fd, rec + rec, 0)
            os.fsync(fd)
            os.replace(tmp, self.path)
        except BaseException:
            os.close(fd)
            raise
        dfd = os.open(os.path.dirname(os.path.abspath(self.path)), os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        self.close()
        self._fd, self.mark, self._slot = fd, seq, 0

    def write(self, seq: int) -> None:
        """Raise the mark to ``seq`` (call only once ``seq`` is durable)."""
        os.pwrite(self._fd, self._record(seq), self._slot * self._SLOT)
        self._slot ^= 1
        self.mark = seq
        self._dirty = True
        if self.sync is not None and time.monotonic() - self._synced >= self.sync:
            self._sync()

    def _sync(self) -> None:
        os.fdatasync(self._fd)
        self._synced = time.monotonic()
        self._dirty = False

    def close(self) -> None:
        if self._fd >= 0:
            try:
                if self._dirty and self.sync is not None:
                    self._sync()
            finally:
                os.close(self._fd)
                self._fd = -1

    def drop(self) -> None:
        """Close without syncing (the object is going away)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _lock(path: str) -> int:
    """An exclusive ``flock`` on ``<path>.lock`` (the file keeps the holder's pid)."""
    lock_path = path + ".lock"
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as e:
        raise _unavailable(path, "unreadable",
                           f"cannot be locked: {lock_path}: {e.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        os.close(fd)
        who = f" (pid {holder})" if holder.isdigit() else ""
        raise _unavailable(path, "locked", f"is in use by another process{who}: one "
                           f"server per journal ({lock_path} is locked)") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


class SQLiteJournal(Journal):
    """``SQLiteJournal(path, batch=1024, synchronous="FULL", create=False)``.

    Opens the journal at ``path``, which must exist and hold records, loading and
    verifying it (every record's CRC and sequence, and that it reaches the high-water
    mark); with ``create=True`` makes a new one there instead, where there is no journal
    (a missing or zero-length file, or a journal that never committed a record). Either
    way the journal is locked until :meth:`close`."""

    durable = True

    def __init__(self, path: str | os.PathLike, batch: int = 1024,
                 synchronous: str = "FULL", *, create: bool = False) -> None:
        super().__init__()
        if not isinstance(batch, int) or batch < 1:
            raise InvalidArgument("batch", "must be an integer >= 1", batch)
        if synchronous not in ("OFF", "NORMAL", "FULL", "EXTRA"):
            raise InvalidArgument("synchronous", "must be OFF, NORMAL, FULL or EXTRA", synchronous)
        if not isinstance(create, bool):
            raise InvalidArgument("create", "must be True or False", create)
        self.path = os.fspath(path)
        self.batch = batch
        self._db: sqlite3.Connection | None = None
        self._lock_fd = -1
        self._hwm = HighWaterMark(self.path + ".hwm", sync=_MARK_SYNC[synchronous])
        self._buf: list[tuple] = []      # rows of the journal table not yet committed
        self._tuples: list[tuple] = []
        self._tuple_payloads: dict[int, str] = {}
        self._payloads: dict[int, str] = {}
        self._rs = RowStore()
        if not create and not os.path.exists(self.path):
            raise _unavailable(self.path, "missing", "does not exist")
        self._lock_fd = _lock(self.path)
        try:
            self._open(create, synchronous)
        except BaseException:
            self._release()
            raise

    def _open(self, create: bool, synchronous: str) -> None:
        path = self.path
        try:
            had_mark = self._hwm.load()
        except (OSError, ValueError) as e:
            raise _unavailable(path, "unreadable", f"has an unreadable high-water mark ({e}): "
                               f"remove {self._hwm.path} to accept the journal as it "
                               "stands") from None
        mark = self._hwm.mark
        fresh = not os.path.exists(path) or os.path.getsize(path) == 0
        if fresh:
            self._check_mark(-1, mark)        # emptied, not new: nothing is made over it
        try:
            if create and not os.path.exists(path):
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
                                 0o600))
            elif create and fresh:
                os.chmod(path, 0o600)
        except OSError as e:
            raise _unavailable(path, "unreadable", f"cannot be created: {e.strerror}") from None
        try:
            self._db = db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            has_table = db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' "
                                   "AND name = 'journal'").fetchone() is not None
        except sqlite3.DatabaseError as e:
            raise self._unreadable(e, mark) from None
        if not has_table:
            self._check_mark(-1, mark)
            if not create:
                raise _unavailable(path, "empty", "holds no records (it is empty or not a "
                                   "journal)")
            if not fresh:                     # another program's database: not ours to change
                raise _unavailable(path, "exists", "is an SQLite database but not a journal: "
                                   "a new journal is made only where there is none")
        try:
            db.execute(f"PRAGMA page_size={PAGE_SIZE}")   # a new file only
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(f"PRAGMA synchronous={synchronous}")
            db.execute(f"PRAGMA wal_autocheckpoint={WAL_AUTOCHECKPOINT}")
            if not has_table:
                db.executescript(_SCHEMA)
        except sqlite3.DatabaseError as e:
            raise self._unreadable(e, mark) from None
        self._load()
        last = self.next_seq - 1
        self._check_mark(last, mark)
        if create and last >= 0:
            raise _unavailable(path, "exists", f"already holds {last + 1} records: a new "
                               "journal is made only where there is none")
        if not create and last < 0:
            raise _unavailable(path, "empty", "holds no records")
        try:
            if not had_mark:
                self._hwm.create(last)
            elif mark < last:
                self._hwm.write(last)
        except OSError as e:
            raise _unavailable(path, "unreadable", "cannot write its high-water mark "
                               f"{self._hwm.path}: {e.strerror}") from None

    def _unreadable(self, e: Exception, mark: int) -> JournalUnavailable:
        acked = f"; {mark + 1} records were acknowledged" if mark >= 0 else ""
        return _unavailable(self.path, "unreadable", f"is not a readable SQLite journal "
                            f"({e}): the file is truncated, damaged or foreign{acked}")

    def _check_mark(self, last: int, mark: int) -> None:
        if last < mark:
            raise _unavailable(
                self.path, "lost",
                f"ends at record {last} but {mark + 1} records were acknowledged (its "
                f"high-water mark {self._hwm.path} is at record {mark}): the database or "
                "its -wal file was lost, truncated or replaced by an older copy. Restore "
                f"it, or remove {self._hwm.path} to accept the loss")

    def _release(self) -> None:
        try:
            if self._db is not None:
                self._db.close()
                self._db = None
            self._hwm.close()
        finally:
            if self._lock_fd >= 0:
                os.close(self._lock_fd)       # closing the last descriptor drops the flock
                self._lock_fd = -1

    def __del__(self) -> None:
        # an unreachable journal can write nothing more: let the file be opened again
        if getattr(self, "_lock_fd", -1) >= 0:
            self._hwm.drop()
            os.close(self._lock_fd)
            self._lock_fd = -1

    @property
    def _rows_cache(self) -> np.ndarray:
        """Every record (subclasses written against the earlier layout read this)."""
        return self._rs.view()

    def _load(self) -> None:
        parts: list[bytes] = []
        expect = 0                    # the seq of the next record
        assert self._db is not None   # (called right after the connection is opened)
        try:
            cur = self._db.execute("SELECT seq, rec, payload, crc FROM journal ORDER BY seq")
            for row in cur:
                expect = self._load_row(row, expect, parts)
        except sqlite3.DatabaseError as e:
            # a torn or truncated file reads up to the damage: name the first record lost
            raise JournalCorrupt(expect, f"unreadable from here on ({e}): the database is "
                                 "truncated or damaged") from None
        rows = np.frombuffer(b"".join(parts), dtype=RECORD_DTYPE).copy()
        check_rows(rows)
        self._rs = RowStore(rows=rows)
        self.next_seq = rows.shape[0]
        self.durable_seq = self.next_seq - 1

    def _load_row(self, row: tuple, expect: int, parts: list[bytes]) -> int:
        """Check one row of the table (a record or a page of them) that should hold seq
        ``expect`` onwards; keep its bytes; return the seq after it."""
        seq, rec, payload, c = row
        if not isinstance(seq, int):
            raise JournalCorrupt(expect, f"its row has no sequence number ({seq!r})")
        if isinstance(c, int):
            k = 1
        elif isinstance(c, bytes) and c and len(c) % 4 == 0:
            k = len(c) // 4
        else:
            raise JournalCorrupt(expect, f"its row (ending at seq {seq}) holds no checksum "
                                 "(truncated or damaged)")
        first = seq - k + 1
        if first != expect:
            raise JournalCorrupt(first, f"out of sequence: expected seq {expect}")
        got = len(rec) if isinstance(rec, (bytes, str)) else 0
        size = _OLD_SIZE if isinstance(rec, bytes) and got == k * _OLD_SIZE else _SIZE
        if not isinstance(rec, bytes) or got != k * size:
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
            torn = np.flatnonzero(crc32_rows(rec, size) != np.frombuffer(c, dtype="<u4"))
            if torn.size:
                raise JournalCorrupt(first + int(torn[0]),
                                     "checksum mismatch (the record was altered or torn)")
        if size != _SIZE:             # checked as written; read as records naming no level
            rec = from_unlevelled(np.frombuffer(rec, dtype=RECORD_DTYPE_UNLEVELLED)).tobytes()
        parts.append(rec)
        if payload is not None:
            self._payloads[seq] = payload
            if rec[_OP_AT] == OP["register"]:
                try:
                    self.names.append(json.loads(payload)["name"])
                except (ValueError, KeyError, TypeError):
                    raise JournalCorrupt(seq, "register payload is not valid") from None
        return seq + 1

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
        """Write a batch from :meth:`take` in one transaction (all or nothing), raise the
        high-water mark to it, and return the new :attr:`durable_seq`. Batches must be
        committed in the order taken."""
        if batch:
            db = self._db
            assert db is not None, "commit on a closed journal"
            db.execute("BEGIN")
            try:
                db.executemany(_INSERT, batch)
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
            self.durable_seq = batch[-1][0]
            # only now: the mark must never run ahead of what the database holds
            self._hwm.write(self.durable_seq)
        return self.durable_seq

    def flush(self) -> int:
        batch = self.take()
        try:
            return self.commit(batch)
        except BaseException:
            if batch and self.durable_seq < batch[-1][0]:
                self._buf[:0] = batch         # not durable: keep it for the next flush
            raise

    def rows(self) -> np.ndarray:
        self._settle()
        return self._rs.view()

    def payloads(self) -> dict[int, str]:
        self._settle()
        return self._payloads

    def close(self) -> None:
        """Commit what is buffered, close the database and drop the lock (once; closing
        again does nothing)."""
        if self._db is None:
            return
        try:
            self.flush()
        finally:
            self._release()
