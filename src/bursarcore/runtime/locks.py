"""Mutual exclusion on a shared filesystem: an ``fcntl`` lock, or a lock-file protocol.

Both are context managers guarding one queue directory (SPEC §13; ``docs/runtime.md``
has the on-disk protocol).

:class:`FcntlLock`
    A POSIX record lock (``fcntl.lockf``, which NFS forwards to the server's lock manager)
    on ``<queue>/.lock``. The kernel drops it when the holder dies, so a crashed worker can
    never leave the queue locked. POSIX locks belong to a *process*: two opens of the same
    file in one process share one lock, and closing either releases it. So each process
    keeps one descriptor per lock file, and a :class:`threading.Lock` serialises its threads.

:class:`FileLock`
    For filesystems without working ``fcntl`` locks. The holder writes
    ``{"owner", "token", "at"}`` to a private temp file beside the lock and hard-links it
    (``link(2)``) to ``<queue>/.lock.excl``: the link is an atomic create-with-content (it fails with
    ``EEXIST`` while the lock is held), so the lock file is never seen empty or partial, and an
    unreadable lock file can only be damage (or a holder on a filesystem without hard links,
    which falls back to ``O_CREAT | O_EXCL`` and then writes). Others poll. A lock older than
    ``stale_after`` seconds (by the injected clock) is broken: the breaker renames it aside,
    checks that the file it moved is the one it judged stale (else puts it back with
    ``link``), and deletes it. An unreadable lock counts as stale once the *same* file
    (device, inode, mtime, ctime, size) has stayed unreadable for ``stale_after``; that
    memory is dropped whenever the lock is seen absent or readable, so a new lock that reuses
    the inode number starts afresh. Release deletes the file only if it still holds the
    holder's token. The residual risk — two breakers racing on the same stale lock while a
    third process takes it — needs a holder that stalled for ``stale_after`` seconds *and*
    two simultaneous breakers; keep ``stale_after`` far above the longest critical section
    (milliseconds) and clocks roughly in step across hosts.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import random
import socket
import threading
import time
import uuid
from typing import Any, Callable, Iterator

from ..errors import BursarError

__all__ = [
    "LockError",
    "LockUnsupported",
    "LockTimeout",
    "FcntlLock",
    "FileLock",
    "ShardLocks",
    "fcntl_supported",
    "UNSUPPORTED_ERRNOS",
]

log = logging.getLogger("bursarcore.runtime.locks")

try:  # pragma: no cover - always present on POSIX
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

UNSUPPORTED_ERRNOS = frozenset(
    e for e in (getattr(errno, n, None) for n in ("ENOLCK", "EOPNOTSUPP", "ENOTSUP", "ENOSYS", "EINVAL"))
    if e is not None
)
"""errno values meaning "this filesystem does not do fcntl locks" (NFS without lockd,
some FUSE and object-store mounts)."""

NO_LINK_ERRNOS = frozenset(
    e for e in (getattr(errno, n, None) for n in ("EPERM", "EOPNOTSUPP", "ENOTSUP", "ENOSYS"))
    if e is not None
)
"""errno values of ``link(2)`` meaning "this filesystem has no hard links" (vfat, some FUSE
and object-store mounts): :class:`FileLock` then creates its lock with ``O_EXCL``."""

_Identity = tuple[int, int, int, int, int]
"""``(st_dev, st_ino, st_mtime_ns, st_ctime_ns, st_size)``: one version of one file."""


def _identity(st: os.stat_result) -> _Identity:
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size)


def _parse_lock(data: bytes) -> dict[str, Any] | None:
    """A lock file's content, or None if it is not a complete lock record."""
    try:
        info = json.loads(data.decode() or "null")
    except ValueError:
        return None
    return info if isinstance(info, dict) and "token" in info else None


class LockError(BursarError):
    """Base class of lock failures."""


class LockUnsupported(LockError):
    """``fcntl`` locking is not supported where the queue lives."""


class LockTimeout(LockError):
    """The lock could not be taken within ``timeout`` seconds of real time."""


def fcntl_supported(directory: str) -> tuple[bool, str]:
    """Probe whether ``fcntl`` locks work in ``directory``: ``(ok, why_not)``."""
    if fcntl is None:
        return False, "the fcntl module is not available on this platform"
    path = os.path.join(directory, f".lockprobe.{os.getpid()}.{uuid.uuid4().hex[:8]}")
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        return False, f"cannot create a probe file: {exc}"
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.lockf(fd, fcntl.LOCK_UN)
        return True, ""
    except OSError as exc:
        if exc.errno in UNSUPPORTED_ERRNOS:
            return False, f"lockf failed: {exc}"
        return True, ""  # EAGAIN/EACCES: someone else holds it, so locking works
    finally:
        os.close(fd)
        try:
            os.unlink(path)
        except OSError:
            pass


# One descriptor and one thread lock per lock file per process (see module docstring).
_registry: dict[str, tuple[threading.Lock, int]] = {}
_registry_guard = threading.Lock()


def _reset_after_fork() -> None:
    # Locks are not inherited across fork; the child starts with its own descriptors.
    global _registry_guard
    for _, fd in _registry.values():
        try:
            os.close(fd)
        except OSError:
            pass
    _registry.clear()
    _registry_guard = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


class FcntlLock:
    """Exclusive ``fcntl.lockf`` lock on ``path`` (created if missing).

    ``timeout`` (seconds of real time, ``None`` = wait forever) bounds the wait; a
    filesystem that does not support the lock raises :class:`LockUnsupported`.
    """

    kind = "fcntl"

    def __init__(self, path: str, *, timeout: float | None = 600.0) -> None:
        if fcntl is None:  # pragma: no cover
            raise LockUnsupported("the fcntl module is not available")
        self.path = os.path.realpath(path)
        self.timeout = timeout

    def _entry(self) -> tuple[threading.Lock, int]:
        with _registry_guard:
            ent = _registry.get(self.path)
            if ent is None:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
                ent = (threading.Lock(), fd)
                _registry[self.path] = ent
            return ent

    def acquire(self) -> None:
        tlock, fd = self._entry()
        if not tlock.acquire(timeout=-1 if self.timeout is None else self.timeout):
            raise LockTimeout(f"{self.path}: another thread held the lock for {self.timeout} s")
        try:
            if self.timeout is None:
                fcntl.lockf(fd, fcntl.LOCK_EX)
                return
            # Poll with LOCK_NB so the wait is bounded; back off up to 20 ms.
            deadline = time.monotonic() + self.timeout
            delay = 0.0005
            while True:
                try:
                    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return
                except OSError as exc:
                    if exc.errno not in (errno.EAGAIN, errno.EACCES):
                        raise
                if time.monotonic() >= deadline:
                    raise LockTimeout(f"{self.path}: not acquired within {self.timeout} s")
                time.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, 0.02)
        except OSError as exc:
            tlock.release()
            if exc.errno in UNSUPPORTED_ERRNOS:
                raise LockUnsupported(f"{self.path}: fcntl locks not supported here ({exc})") from exc
            raise
        except BaseException:
            tlock.release()
            raise

    def release(self) -> None:
        tlock, fd = self._entry()
        try:
            fcntl.lockf(fd, fcntl.LOCK_UN)
        finally:
            tlock.release()

    def __enter__(self) -> "FcntlLock":
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class FileLock:
    """Lock-file protocol (temp file + ``link``) with stale-lock breaking; see module doc.

    ``clock`` supplies the timestamps written into the lock and compared against
    ``stale_after``; ``timeout`` bounds the wait in real time; ``sleep`` is the poll pause.
    """

    kind = "file"

    def __init__(
        self,
        path: str,
        *,
        clock: Callable[[], float] = time.time,
        stale_after: float = 60.0,
        timeout: float | None = 600.0,
        sleep: Callable[[float], None] = time.sleep,
        owner: str | None = None,
    ) -> None:
        self.path = path
        self.clock = clock
        self.stale_after = float(stale_after)
        self.timeout = timeout
        self.sleep = sleep
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}"
        self._token: str | None = None
        self._tlock = threading.Lock()
        # At most one entry: identity of the lock file last seen unreadable -> clock time it
        # was first seen so. Cleared whenever the lock is seen absent or readable.
        self._unreadable_since: dict[_Identity, float] = {}
        self._use_link = True  # False once link(2) proved unsupported here
        self.broken = 0  # stale locks this object broke (for tests and logs)

    def _try_create(self) -> bool:
        """Take the lock if it is free: ``True`` if this object now holds it."""
        if self._use_link and os.path.lexists(self.path):
            return False  # held: skip writing a temp file only to fail the link (link decides)
        token = uuid.uuid4().hex
        data = json.dumps({"owner": self.owner, "token": token, "at": self.clock()}).encode()
        if self._use_link:
            held = self._create_by_link(data, token)
            if held is not None:
                self._token = token if held else None
                return held
        # No hard links on this filesystem: O_EXCL create, then write. A waiter may see the
        # file empty in between; _stale() gives such a file stale_after seconds.
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        self._token = token
        return True

    def _create_by_link(self, data: bytes, token: str) -> bool | None:
        """Write ``data`` to a temp file and link it to the lock name: ``True`` if we hold
        the lock, ``False`` if someone else does, ``None`` if ``link`` is not supported."""
        d, base = os.path.split(self.path)
        tmp = os.path.join(d, f"{base if base.startswith('.') else '.' + base}.{token[:12]}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
            try:
                os.link(tmp, self.path)
                return True
            except FileExistsError:
                # NFS: a retransmitted LINK can report EEXIST although the first one
                # succeeded; the temp file's link count tells (open(2), O_EXCL notes).
                return os.stat(tmp).st_nlink == 2
            except OSError as exc:
                if exc.errno not in NO_LINK_ERRNOS:
                    raise
                self._use_link = False
                log.warning("lock %s: link(2) not supported here (%s); creating the lock with "
                            "O_EXCL, which a waiter can see empty until it is written", self.path, exc)
                return None
        finally:
            try:
                os.unlink(tmp)
            except OSError:
                pass

    def _inspect(self, path: str) -> tuple[dict[str, Any] | None, _Identity | None]:
        """``(content, identity)`` of the file at ``path``; identity ``None`` if absent.

        Content and identity come from one open descriptor, so a file released (deleted)
        between the two cannot be mistaken for an unreadable one.
        """
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None, None
        except OSError:  # present but unreadable to us (permissions, I/O error)
            try:
                return None, _identity(os.stat(path))
            except FileNotFoundError:
                return None, None
        try:
            st = os.fstat(fd)
            chunks = []
            try:
                while chunk := os.read(fd, 65536):
                    chunks.append(chunk)
            except OSError:  # I/O error: present, unreadable
                return None, _identity(st)
        finally:
            os.close(fd)
        return _parse_lock(b"".join(chunks)), _identity(st)

    def _read(self, path: str) -> dict[str, Any] | None:
        return self._inspect(path)[0]

    def _stale(self) -> dict[str, Any] | None:
        """The lock's content if it is stale, else None.

        An unreadable lock (``token`` None in the result) is stale once this very file —
        same device, inode, mtime, ctime and size — has been seen unreadable for longer than
        ``stale_after``. Seeing the lock absent or readable forgets it: a later lock file
        that reuses the inode number is a new lock.
        """
        info, ident = self._inspect(self.path)
        if ident is None:
            self._unreadable_since.clear()
            return None
        now = self.clock()
        if info is None:
            first = self._unreadable_since.get(ident)
            if first is None:
                self._unreadable_since.clear()
                self._unreadable_since[ident] = first = now
            if now - first > self.stale_after:
                return {"token": None, "owner": "?", "at": first, "identity": ident}
            return None
        self._unreadable_since.clear()
        at = info.get("at")
        if not isinstance(at, (int, float)) or now - at > self.stale_after:
            return info
        return None

    def _break(self, info: dict[str, Any]) -> None:
        aside = f"{self.path}.broken.{uuid.uuid4().hex[:12]}"
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return  # someone else broke or released it
        moved, ident = self._inspect(aside)
        same = (moved or {}).get("token") == info.get("token")
        judged = info.get("identity")
        if same and moved is None and judged is not None and ident is not None:
            # unreadable: the same file? (rename changes ctime, so compare the rest)
            same = (ident[0], ident[1], ident[2], ident[4]) == (judged[0], judged[1], judged[2], judged[4])
        if not same:
            # We moved a newer, live lock: put it back unless a newer one exists already.
            try:
                os.link(aside, self.path)
                log.warning("lock %s: moved a live lock of %s aside while breaking a stale one, "
                            "and put it back", self.path, (moved or {}).get("owner"))
            except OSError:
                log.error("lock %s: moved a live lock aside and could not restore it; "
                          "its holder %s may overlap with the next", self.path,
                          (moved or {}).get("owner"))
            os.unlink(aside)
            return
        os.unlink(aside)
        self._unreadable_since.clear()
        self.broken += 1
        log.warning("lock %s: broke a stale lock held by %s since %s (stale after %s s)",
                    self.path, info.get("owner"), info.get("at"), self.stale_after)

    def acquire(self) -> None:
        if not self._tlock.acquire(timeout=-1 if self.timeout is None else self.timeout):
            raise LockTimeout(f"{self.path}: another thread held the lock for {self.timeout} s")
        try:
            deadline = None if self.timeout is None else time.monotonic() + self.timeout
            delay = 0.0005
            while not self._try_create():
                info = self._stale()
                if info is not None:
                    self._break(info)
                    continue
                if deadline is not None and time.monotonic() >= deadline:
                    raise LockTimeout(f"{self.path}: not acquired within {self.timeout} s")
                self.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, 0.05)
        except BaseException:
            self._tlock.release()
            raise

    def release(self) -> None:
        try:
            info = self._read(self.path)
            if info is not None and info.get("token") == self._token:
                os.unlink(self.path)
            else:
                log.error("lock %s: released by %s after it had been broken as stale; the "
                          "critical section outlived stale_after=%s s", self.path, self.owner,
                          self.stale_after)
        finally:
            self._token = None
            self._tlock.release()

    def __enter__(self) -> "FileLock":
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


# ---------------------------------------------------------------------------- per-operation locks
# One thread lock per lock file per process, for ShardLocks' fcntl sections: a POSIX lock
# belongs to the process, and closing *any* descriptor of the file drops it, so two threads
# of one process must never have the same lock file open at once. No descriptor is kept.
_section_guards: dict[str, threading.Lock] = {}
_section_registry_guard = threading.Lock()


def _section_guard(path: str) -> threading.Lock:
    with _section_registry_guard:
        g = _section_guards.get(path)
        if g is None:
            g = _section_guards[path] = threading.Lock()
        return g


def _reset_sections_after_fork() -> None:
    # A thread of the parent may have held a guard at fork time; the child has no such
    # thread, and no descriptor to close (sections keep none open).
    global _section_registry_guard
    _section_guards.clear()
    _section_registry_guard = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_sections_after_fork)


class ShardLocks:
    """A family of named locks in one directory, each taken for one short section.

    ``kind="fcntl"``: the section opens ``<directory>/<name>``, takes an exclusive
    ``lockf`` and closes the descriptor at the end (which releases the lock), so the object
    holds **no descriptor between sections** and at most one during one. The kernel drops
    the lock of a process that dies inside a section. ``kind="file"``: the lock-file
    protocol of :class:`FileLock` on ``<directory>/<name>.excl`` (a stale one is broken
    after ``stale_after`` seconds by ``clock``), which holds no descriptor either.

    :meth:`hold` with ``wait=False`` makes one attempt and yields ``False`` if the lock is
    busy, so a caller can pass over a contended lock and try another.
    """

    def __init__(self, directory: str, kind: str, *, clock: Callable[[], float] = time.time,
                 stale_after: float = 60.0, timeout: float | None = 600.0,
                 sleep: Callable[[float], None] = time.sleep, owner: str | None = None) -> None:
        if kind not in ("fcntl", "file"):
            raise ValueError(f"kind must be 'fcntl' or 'file', not {kind!r}")
        if kind == "fcntl" and fcntl is None:  # pragma: no cover
            raise LockUnsupported("the fcntl module is not available")
        self.directory = os.path.realpath(directory)
        self.kind = kind
        self.clock = clock
        self.stale_after = float(stale_after)
        self.timeout = timeout
        self.sleep = sleep
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}"
        self._file_locks: dict[str, tuple[FileLock, FileLock]] = {}  # name -> (waiting, one try)
        self.closed = False

    def path(self, name: str) -> str:
        """The lock file of ``name``."""
        base = os.path.join(self.directory, name)
        return base if self.kind == "fcntl" else base + ".excl"

    @property
    def broken(self) -> int:
        """Stale lock files this object broke (lock-file protocol)."""
        return sum(a.broken + b.broken for a, b in self._file_locks.values())

    def close(self) -> None:
        """Forget the lock objects; any later :meth:`hold` raises :class:`LockError`."""
        self.closed = True
        self._file_locks.clear()

    @contextlib.contextmanager
    def hold(self, name: str, *, wait: bool = True) -> Iterator[bool]:
        """Hold lock ``name`` for the ``with`` body; yields ``True``, or ``False`` if
        ``wait=False`` and the lock was busy (the body then runs without it)."""
        if self.closed:
            raise LockError(f"{self.directory}: the queue handle was closed")
        if self.kind == "file":
            with self._hold_file(name, wait) as held:
                yield held
            return
        path = self.path(name)
        guard = _section_guard(path)
        if wait:
            if not guard.acquire(timeout=-1 if self.timeout is None else self.timeout):
                raise LockTimeout(f"{path}: another thread held the lock for {self.timeout} s")
        elif not guard.acquire(blocking=False):
            yield False
            return
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                if not self._lockf(fd, path, wait):
                    held = False
                else:
                    held = True
                yield held
            finally:
                os.close(fd)  # releases the lock
        finally:
            guard.release()

    def _lockf(self, fd: int, path: str, wait: bool) -> bool:
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        delay = 0.0002
        while True:
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except OSError as exc:
                if exc.errno in UNSUPPORTED_ERRNOS:
                    raise LockUnsupported(f"{path}: fcntl locks not supported here ({exc})") from exc
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
            if not wait:
                return False
            if deadline is not None and time.monotonic() >= deadline:
                raise LockTimeout(f"{path}: not acquired within {self.timeout} s")
            # Sections last well under a millisecond: poll fast, back off to 10 ms.
            time.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, 0.01)

    @contextlib.contextmanager
    def _hold_file(self, name: str, wait: bool) -> Iterator[bool]:
        pair = self._file_locks.get(name)
        if pair is None:
            mk = lambda timeout: FileLock(self.path(name), clock=self.clock,  # noqa: E731
                                          stale_after=self.stale_after, timeout=timeout,
                                          sleep=self.sleep, owner=self.owner)
            pair = self._file_locks[name] = (mk(self.timeout), mk(0.0))
        lock = pair[0] if wait else pair[1]
        try:
            lock.acquire()
        except LockTimeout:
            if wait:
                raise
            yield False
            return
        try:
            yield True
        finally:
            lock.release()
