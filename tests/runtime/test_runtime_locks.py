"""The two lock implementations on their own (the queue tests cover them in use)."""

from __future__ import annotations

import errno
import json
import multiprocessing as mp
import os
import threading

import pytest

from bursarcore.runtime import FcntlLock, FileLock, LockTimeout, LockUnsupported
from bursarcore.runtime import locks as locks_mod


def _hold(path, ready, done):
    with FcntlLock(path):
        ready.set()
        done.wait(20)


def test_fcntl_lock_excludes_another_process(tmp_path):
    path = str(tmp_path / ".lock")
    ctx = mp.get_context("fork")
    ready, done = ctx.Event(), ctx.Event()
    p = ctx.Process(target=_hold, args=(path, ready, done))
    p.start()
    try:
        assert ready.wait(20)
        with pytest.raises(LockTimeout):
            FcntlLock(path, timeout=0.05).acquire()
    finally:
        done.set()
        p.join(20)
    with FcntlLock(path, timeout=5):  # free once the holder exits
        pass


def test_fcntl_lock_is_shared_by_objects_of_one_process(tmp_path):
    a, b = FcntlLock(str(tmp_path / ".lock")), FcntlLock(str(tmp_path / ".lock"), timeout=0.01)
    with a:
        # a second object in the same process must not get it (POSIX locks are per process;
        # the thread lock keeps the two apart)
        with pytest.raises(LockTimeout):
            b.acquire()
    with b:
        pass


def test_fcntl_unsupported_errno_raises_lock_unsupported(tmp_path, monkeypatch):
    def lockf(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(locks_mod.fcntl, "lockf", lockf)
    ok, why = locks_mod.fcntl_supported(str(tmp_path))
    assert not ok and "No locks available" in why
    with pytest.raises(LockUnsupported):
        FcntlLock(str(tmp_path / ".lock")).acquire()
    monkeypatch.undo()
    with FcntlLock(str(tmp_path / ".lock"), timeout=1):  # the thread lock was released
        pass


def test_fcntl_supported_here(tmp_path):
    assert locks_mod.fcntl_supported(str(tmp_path)) == (True, "")


def test_file_lock_basic_and_release_checks_token(tmp_path, caplog):
    t = [100.0]
    lk = FileLock(str(tmp_path / ".lock.excl"), clock=lambda: t[0], owner="me")
    with lk:
        assert (tmp_path / ".lock.excl").exists()
    assert not (tmp_path / ".lock.excl").exists()
    lk.acquire()
    # someone broke our lock and took it: release must not delete theirs
    (tmp_path / ".lock.excl").write_text('{"owner": "other", "token": "t2", "at": 100}')
    lk.release()
    assert (tmp_path / ".lock.excl").exists()
    assert "after it had been broken as stale" in caplog.text


def test_file_lock_break_puts_back_a_lock_that_changed(tmp_path):
    """The breaker moved a lock that is not the one it judged stale: it restores it."""
    path = tmp_path / ".lock.excl"
    lk = FileLock(str(path), clock=lambda: 1000.0, stale_after=60)
    path.write_text('{"owner": "new", "token": "fresh", "at": 1000}')
    lk._break({"owner": "old", "token": "stale", "at": 0})
    assert '"fresh"' in path.read_text() and lk.broken == 0
    assert [p.name for p in tmp_path.iterdir()] == [".lock.excl"]


# ---------------------------------------------------------------------- lock-file protocol
# Interleavings below are controlled with events and injected clocks/sleeps, never timing.


def test_file_lock_never_breaks_a_live_lock_that_reused_an_inode(tmp_path, monkeypatch, clock):
    """RESULTS_runtime.md §4.1: a waiter remembered an inode as "unreadable since t"; the
    lock was released, and 61 s later a new holder's lock file got the same inode number.
    Caught between create and write, it used to look 61 s unreadable and was broken (two
    holders). Now a lock file appears with its content (temp file + link), so the waiter
    finds a fresh lock, or none, and never breaks a live one."""

    path = str(tmp_path / ".lock.excl")
    waiter = FileLock(path, clock=clock, stale_after=60, timeout=10, sleep=lambda dt: None, owner="W")
    # H1, an O_EXCL holder caught between create and write: remembered as unreadable
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    ino1 = os.fstat(fd).st_ino
    assert waiter._stale() is None
    os.write(fd, json.dumps({"owner": "H1", "token": "a", "at": clock()}).encode())
    os.close(fd)
    os.unlink(path)  # H1 releases; the waiter does not look in between
    clock.advance(61)

    # ext4 gives the next lock file the same inode number; make that certain here
    real_stat = os.stat

    def stat(p, *args, **kwargs):
        st = real_stat(p, *args, **kwargs)
        return os.stat_result((st.st_mode, ino1) + tuple(st)[2:]) if os.fspath(p) == path else st

    monkeypatch.setattr(locks_mod.os, "stat", stat)

    # H2 takes the lock; its clock (read while it builds the lock record) blocks, which holds
    # it at the point where the old protocol had created an empty lock file.
    in_clock, go, released = threading.Event(), threading.Event(), threading.Event()
    seen: list[str] = []
    progressed = threading.Event()

    def h2_clock():
        in_clock.set()
        assert go.wait(10)
        return clock()

    def h2_sleep(dt):  # H2 found the lock held and waits for it
        seen.append("waiting")
        progressed.set()
        assert released.wait(10)

    h2 = FileLock(path, clock=h2_clock, stale_after=60, timeout=10, sleep=h2_sleep, owner="H2")

    def run_h2():
        h2.acquire()
        seen.append("acquired")
        progressed.set()

    t = threading.Thread(target=run_h2)
    t.start()
    try:
        assert in_clock.wait(10)
        waiter.acquire()  # must not break H2's lock
        assert waiter.broken == 0
        go.set()
        assert progressed.wait(10)
        assert seen[0] == "waiting", "H2 and the waiter both hold the lock"
        with open(path) as f:
            assert json.load(f)["owner"] == "W"
        waiter.release()
    finally:
        go.set()
        released.set()
        t.join(10)
    assert seen == ["waiting", "acquired"]
    with open(path) as f:
        assert json.load(f)["owner"] == "H2"
    h2.release()
    assert os.listdir(tmp_path) == []  # no temp file or lock left behind


def test_file_lock_unreadable_memory_is_per_file_and_forgotten(tmp_path, clock):
    """An unreadable lock is stale only if the *same* file (inode, mtime, ctime, size) stayed
    unreadable for stale_after; seeing the lock absent or readable forgets it."""

    path = tmp_path / ".lock.excl"
    lk = FileLock(str(path), clock=clock, stale_after=60, sleep=lambda dt: None)
    path.write_bytes(b"")
    assert lk._stale() is None and len(lk._unreadable_since) == 1
    path.unlink()
    assert lk._stale() is None
    assert lk._unreadable_since == {}  # absent: forgotten (it used to be kept forever)
    clock.advance(61)
    path.write_bytes(b"")  # a new unreadable file: its clock starts now
    assert lk._stale() is None
    clock.advance(30)
    path.write_text('{"owner": "h", "token": "t", "at": %r}' % clock())
    assert lk._stale() is None and lk._unreadable_since == {}  # readable: forgotten
    os.truncate(path, 3)  # damaged in place: another file version, counted afresh
    assert lk._stale() is None
    clock.advance(60)
    assert lk._stale() is None  # exactly stale_after: not older than it
    clock.advance(1)
    info = lk._stale()
    assert info is not None and info["token"] is None and info["at"] == clock() - 61
    lk._break(info)
    assert lk.broken == 1 and not path.exists() and lk._unreadable_since == {}


def test_file_lock_break_keeps_an_unreadable_lock_it_did_not_judge(tmp_path, clock):
    """Judged stale: one unreadable file; found at the lock name when breaking: another.
    Both lack a token, so only the file identity tells them apart: it is put back."""
    path = tmp_path / ".lock.excl"
    lk = FileLock(str(path), clock=clock, stale_after=60)
    path.write_bytes(b"")
    assert lk._stale() is None
    clock.advance(61)
    info = lk._stale()
    assert info is not None and info["token"] is None
    path.unlink()
    path.write_bytes(b"{")  # a different (damaged) lock file appeared meanwhile
    lk._break(info)
    assert lk.broken == 0 and path.read_bytes() == b"{"
    assert [p.name for p in tmp_path.iterdir()] == [".lock.excl"]


def test_file_lock_release_between_looks_is_not_unreadable(tmp_path, clock, monkeypatch):
    """A holder that releases while a waiter looks at its lock leaves the waiter with "no
    lock", not with "an unreadable lock" to time."""

    path = tmp_path / ".lock.excl"
    lk = FileLock(str(path), clock=clock, stale_after=60)
    path.write_text('{"owner": "h", "token": "t", "at": %r}' % clock())
    real_open, real_stat = os.open, os.stat

    def release():
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass

    def open_after_release(p, flags, *a):  # the holder releases just before the open ...
        if os.fspath(p) == str(path):
            release()
        return real_open(p, flags, *a)

    def stat_then_release(p, *a, **k):  # ... or just after a stat (the old code's window)
        st = real_stat(p, *a, **k)
        if os.fspath(p) == str(path):
            release()
        return st

    monkeypatch.setattr(locks_mod.os, "open", open_after_release)
    monkeypatch.setattr(locks_mod.os, "stat", stat_then_release)
    assert lk._stale() is None
    assert lk._unreadable_since == {}


def test_file_lock_without_hard_links_falls_back_to_o_excl(tmp_path, clock, monkeypatch, caplog):

    def no_link(src, dst):
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(locks_mod.os, "link", no_link)
    lk = FileLock(str(tmp_path / ".lock.excl"), clock=clock, owner="me")
    with lk:
        assert '"owner": "me"' in (tmp_path / ".lock.excl").read_text()
    assert lk._use_link is False and "link(2) not supported" in caplog.text
    with lk:  # stays on O_EXCL without trying link again
        pass
    assert os.listdir(tmp_path) == []


def test_file_lock_link_reported_eexist_after_success_is_held(tmp_path, clock, monkeypatch):
    """NFS can answer a retransmitted LINK with EEXIST although the link was made; the temp
    file's link count (2) shows the lock is ours."""

    real_link = os.link

    def link_then_eexist(src, dst):
        real_link(src, dst)
        raise FileExistsError(17, "File exists")

    monkeypatch.setattr(locks_mod.os, "link", link_then_eexist)
    lk = FileLock(str(tmp_path / ".lock.excl"), clock=clock, timeout=0.0, sleep=lambda dt: None)
    lk.acquire()
    lk.release()
    assert os.listdir(tmp_path) == []
