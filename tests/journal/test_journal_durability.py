"""What the SQLite journal refuses at open, and why: a journal is made only when asked, one
process has it at a time, a database that lost acknowledged records (its ``-wal`` file
gone, the file cut short or swapped for an older copy) is caught by the high-water mark
beside it, damage is named by the record it reaches, and every file is private (0600).
The JSON lines reader names records the same way."""

from __future__ import annotations

import os
import shutil
import sqlite3
import stat
import subprocess
import sys
import textwrap

import pytest

from bursarcore import Broker, Envelope, Intent, ManualClock, Pool
from bursarcore.errors import JournalCorrupt, JournalUnavailable
from bursarcore.journal import MemoryJournal, SQLiteJournal, export_jsonl, import_jsonl
from bursarcore.journal.sqlite import HighWaterMark

ENV = Envelope(credits=1e6, sustained={"gpu": 64}, ceiling={"gpu": 64}, burst={"gpu": 1e9})


def _drive(j, n, start=0.0):
    """A broker on ``j`` making ``n`` grants and expiries; returns it, synced."""
    b = Broker(Pool(gpu=64), clock=ManualClock(start), backend="reference", journal=j)
    b.register("a", ENV)
    _more(b, n)
    return b


def _more(b, n):
    for _ in range(n):
        b.acquire(Intent("a", units={"gpu": 1}, duration=1.0))
        b.clock.advance(0.5)
        b.poll()
    b.sync()


def _snapshot(src_dir, dst_dir, skip=()):
    """Copy every file of a journal's directory (as a crash would leave it), but ``skip``."""
    os.makedirs(dst_dir)
    for name in os.listdir(src_dir):
        if not any(name.endswith(s) for s in skip):
            shutil.copy(os.path.join(src_dir, name), os.path.join(dst_dir, name))


# ------------------------------------------------------------------ made only when asked
def test_a_missing_journal_is_refused_and_not_made(tmp_path):
    p = tmp_path / "j.db"
    with pytest.raises(JournalUnavailable) as e:
        SQLiteJournal(p)
    assert e.value.kind == "missing" and str(p) in str(e.value)
    assert os.listdir(tmp_path) == []          # no database, no lock, no mark


def test_a_zero_length_journal_is_refused_not_started_afresh(tmp_path):
    p = tmp_path / "j.db"
    p.write_bytes(b"")
    with pytest.raises(JournalUnavailable) as e:
        SQLiteJournal(p)
    assert e.value.kind == "empty" and "holds no records" in str(e.value)
    assert p.stat().st_size == 0               # left as it was
    # asked for, a new journal is made there
    j = SQLiteJournal(p, create=True)
    _drive(j, 3)
    j.close()
    again = SQLiteJournal(p)
    assert len(again) == len(j) > 0
    again.close()


def test_create_refuses_where_a_journal_with_records_is(tmp_path):
    p = tmp_path / "j.db"
    j = SQLiteJournal(p, create=True)
    _drive(j, 2)
    n = len(j)
    j.close()
    with pytest.raises(JournalUnavailable) as e:
        SQLiteJournal(p, create=True)
    assert e.value.kind == "exists" and f"already holds {n} records" in str(e.value)
    assert len(SQLiteJournal(p)) == n


def test_a_journal_that_never_committed_opens_only_to_be_made_again(tmp_path):
    p = tmp_path / "j.db"
    SQLiteJournal(p, create=True).close()      # made, nothing committed
    with pytest.raises(JournalUnavailable) as e:
        SQLiteJournal(p)
    assert e.value.kind == "empty"
    j = SQLiteJournal(p, create=True)
    assert len(j) == 0
    j.close()


def test_a_zero_length_file_whose_records_were_acknowledged_is_refused_even_to_create(tmp_path):
    p = tmp_path / "j.db"
    j = SQLiteJournal(p, create=True)
    _drive(j, 5)
    n = len(j)
    j.close()
    p.write_bytes(b"")                         # the database emptied; its mark survives
    for create in (False, True):
        with pytest.raises(JournalUnavailable) as e:
            SQLiteJournal(p, create=create)
        assert e.value.kind == "lost"
        assert f"ends at record -1 but {n} records were acknowledged" in str(e.value)


# ------------------------------------------------------------------ the high-water mark
def test_losing_the_wal_file_is_caught_by_the_high_water_mark(tmp_path):
    src = tmp_path / "live"
    src.mkdir()
    p = src / "j.db"
    j = SQLiteJournal(p, batch=16, create=True)
    b = _drive(j, 50)
    # a checkpoint moves what is committed so far into the database file; what follows
    # stays in the -wal file until the next one
    db = sqlite3.connect(p)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    kept = len(j)
    _more(b, 300)
    assert j.durable_seq == len(j) - 1 > kept
    # the machine stops here; the copy keeps everything but the -wal file
    _snapshot(src, tmp_path / "copy", skip=("-wal", "-shm"))
    copy = tmp_path / "copy" / "j.db"
    with pytest.raises(JournalUnavailable) as e:
        SQLiteJournal(copy)
    assert e.value.kind == "lost"
    assert (f"journal {copy} ends at record {kept - 1} but {len(j)} records were "
            "acknowledged") in str(e.value)
    # the whole snapshot (with its -wal) is sound
    _snapshot(src, tmp_path / "whole")
    whole = SQLiteJournal(tmp_path / "whole" / "j.db")
    assert whole.rows().tobytes() == j.rows().tobytes()
    whole.close()
    j.close()


def test_the_mark_follows_every_commit_and_never_runs_ahead(tmp_path):
    p = tmp_path / "j.db"
    j = SQLiteJournal(p, batch=10**6, create=True)
    mark = HighWaterMark(str(p) + ".hwm")
    assert mark.load() and mark.mark == -1
    b = _drive(j, 0)
    for _ in range(3):
        b.acquire(Intent("a", units={"gpu": 1}, duration=5.0))
        assert j.durable_seq < len(j) - 1      # buffered, not committed: not marked
        m = HighWaterMark(str(p) + ".hwm")
        assert m.load() and m.mark == j.durable_seq
        b.sync()
        m = HighWaterMark(str(p) + ".hwm")
        assert m.load() and m.mark == j.durable_seq == len(j) - 1
        m.close()
    mark.close()
    j.close()


def test_a_torn_slot_of_the_mark_falls_back_to_the_other(tmp_path):
    p = tmp_path / "j.db"
    j = SQLiteJournal(p, batch=1, create=True)
    _drive(j, 4)
    top = j.durable_seq
    j.close()
    hwm = str(p) + ".hwm"
    m = HighWaterMark(hwm)
    assert m.load() and m.mark == top
    slot = 1 - m._slot                          # the slot holding the newest mark
    m.close()
    with open(hwm, "r+b") as f:
        f.seek(slot * 512 + 10)
        f.write(b"\xff\xff")
    m = HighWaterMark(hwm)
    assert m.load() and m.mark == top - 1       # the mark before it: never ahead
    m.close()
    assert len(SQLiteJournal(p)) == top + 1     # and the journal opens
    with open(hwm, "r+b") as f:                 # both slots spoilt: refused, named
        f.write(b"\0" * 1024)
    with pytest.raises(JournalUnavailable) as e:
        SQLiteJournal(p)
    assert e.value.kind == "unreadable" and hwm in str(e.value)


def test_a_journal_without_a_mark_opens_and_gets_one(tmp_path):
    p = tmp_path / "j.db"
    j = SQLiteJournal(p, create=True)
    _drive(j, 3)
    n = len(j)
    j.close()
    os.unlink(str(p) + ".hwm")
    again = SQLiteJournal(p)
    m = HighWaterMark(str(p) + ".hwm")
    assert m.load() and m.mark == n - 1
    m.close()
    again.close()


def test_a_failed_mark_write_does_not_commit_the_batch_twice(tmp_path, monkeypatch):
    j = SQLiteJournal(tmp_path / "j.db", batch=10**6, create=True)
    b = _drive(j, 1)
    b.acquire(Intent("a", units={"gpu": 1}, duration=5.0))
    real = j._hwm.write

    def fail(seq):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(j._hwm, "write", fail)
    with pytest.raises(OSError):
        j.flush()
    assert j.durable_seq == len(j) - 1          # the transaction itself went through
    monkeypatch.setattr(j._hwm, "write", real)
    b.acquire(Intent("a", units={"gpu": 1}, duration=5.0))
    assert j.flush() == len(j) - 1              # no duplicate rows, no primary-key error
    j.close()
    assert len(SQLiteJournal(tmp_path / "j.db")) == len(j)


# ------------------------------------------------------------------ damage names the record
def test_a_truncated_database_names_the_first_record_it_lost(tmp_path):
    p = tmp_path / "j.db"
    j = SQLiteJournal(p, batch=16, create=True)
    _drive(j, 3000)
    n = len(j)
    j.close()                                   # checkpointed: everything in the file
    size = p.stat().st_size
    if os.path.exists(str(p) + ".hwm"):         # the damage itself, not the mark, speaks
        os.unlink(str(p) + ".hwm")
    os.truncate(p, size - size // 100)          # the last pages are gone
    with pytest.raises(JournalCorrupt) as e:
        SQLiteJournal(p)
    assert 0 < e.value.record < n               # the first record not read, not "0"
    assert "truncated or damaged" in e.value.problem
    os.truncate(p, size // 2)                   # cut so short SQLite reads nothing
    with pytest.raises(JournalUnavailable) as e:
        SQLiteJournal(p)
    assert e.value.kind == "unreadable" and str(p) in str(e.value)


def test_jsonl_errors_name_the_record(tmp_path):
    j = MemoryJournal()
    _drive(j, 3)
    p = tmp_path / "j.jsonl"
    n = export_jsonl(j, p)
    lines = p.read_text().splitlines(keepends=True)
    p.write_text("".join(lines)[:-5])           # the last line cut short
    with pytest.raises(JournalCorrupt) as e:
        import_jsonl(p)
    assert e.value.record == n - 1 and f"line {n} is truncated" in str(e.value)
    bad = list(lines)
    bad[4] = bad[4][:20] + "\n"                 # a line that is no longer JSON
    p.write_text("".join(bad))
    with pytest.raises(JournalCorrupt) as e:
        import_jsonl(p)
    assert e.value.record == 4 and "line 5 is unreadable" in str(e.value)
    bad = list(lines)
    bad[6] = bad[6].replace('"units": 1', '"units": 2')
    p.write_text("".join(bad))
    with pytest.raises(JournalCorrupt) as e:
        import_jsonl(p)
    assert e.value.record == 6 and "line 7: checksum mismatch" in str(e.value)


# ------------------------------------------------------------------ one process at a time
LOCKER = textwrap.dedent("""
    import sys
    from bursarcore.errors import JournalUnavailable
    from bursarcore.journal import SQLiteJournal
    try:
        SQLiteJournal(sys.argv[1]).close()
    except JournalUnavailable as e:
        print(e.kind, e, flush=True)
        sys.exit(3)
    print("opened", flush=True)
""")


def test_a_journal_is_locked_while_open_and_released_on_close(tmp_path):
    p = tmp_path / "j.db"
    j = SQLiteJournal(p, create=True)
    _drive(j, 2)
    with pytest.raises(JournalUnavailable) as e:
        SQLiteJournal(p)                        # in this process
    assert e.value.kind == "locked" and f"pid {os.getpid()}" in str(e.value)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    other = subprocess.run([sys.executable, "-c", LOCKER, str(p)], capture_output=True,
                           text=True, timeout=60, env=env)
    assert other.returncode == 3 and other.stdout.startswith("locked "), other
    assert "in use by another process" in other.stdout
    j.close()
    j.close()                                   # a second close does nothing
    other = subprocess.run([sys.executable, "-c", LOCKER, str(p)], capture_output=True,
                           text=True, timeout=60, env=env)
    assert other.returncode == 0 and other.stdout == "opened\n", other
    SQLiteJournal(p).close()


def test_a_refused_open_releases_the_lock(tmp_path):
    p = tmp_path / "j.db"
    p.write_bytes(b"not a database at all " * 200)
    for _ in range(2):                          # refused the same way twice: not "locked"
        with pytest.raises(JournalUnavailable) as e:
            SQLiteJournal(p)
        assert e.value.kind == "unreadable"


# ------------------------------------------------------------------ private files
def test_journal_files_are_created_private(tmp_path):
    old = os.umask(0o022)
    try:
        p = tmp_path / "j.db"
        j = SQLiteJournal(p, create=True)
        _drive(j, 2)
        names = ["j.db", "j.db-wal", "j.db-shm", "j.db.hwm", "j.db.lock"]
        modes = {n: stat.S_IMODE((tmp_path / n).stat().st_mode)
                 for n in names if (tmp_path / n).exists()}
        assert modes == {n: 0o600 for n in names}
        j.close()
        e = tmp_path / "e.db"                   # an empty file made into a journal
        e.write_bytes(b"")
        os.chmod(e, 0o644)
        SQLiteJournal(e, create=True).close()
        assert stat.S_IMODE(e.stat().st_mode) == 0o600
    finally:
        os.umask(old)


def test_create_leaves_another_programs_database_alone(tmp_path):
    p = tmp_path / "other.db"
    db = sqlite3.connect(p)
    db.execute("CREATE TABLE t (x)")
    db.commit()
    db.close()
    with pytest.raises(JournalUnavailable) as e:
        SQLiteJournal(p, create=True)
    assert e.value.kind == "exists" and "not a journal" in str(e.value)
    db = sqlite3.connect(p)
    assert [r[0] for r in db.execute("SELECT name FROM sqlite_master")] == ["t"]
    db.close()


def test_create_over_an_emptied_journal_makes_no_file(tmp_path):
    p = tmp_path / "j.db"
    j = SQLiteJournal(p, create=True)
    _drive(j, 2)
    j.close()
    os.unlink(p)                                # gone; its mark says records were acked
    with pytest.raises(JournalUnavailable) as e:
        SQLiteJournal(p, create=True)
    assert e.value.kind == "lost" and not p.exists()
