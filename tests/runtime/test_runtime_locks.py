"""The two lock implementations on their own (the queue tests cover them in use)."""

from __future__ import annotations

import errno
import multiprocessing as mp

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
