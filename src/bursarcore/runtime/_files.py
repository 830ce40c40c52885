"""File primitives of the task queue: atomic record writes, reads, directory fsyncs.

Every write goes to a hidden temp file beside its target and is renamed into place, so a
reader sees the old content or the new, never a partial record. Hidden names (leading
``.``) are ignored by every reader of the queue.
"""

from __future__ import annotations

import errno
import json
import math
import os
import stat
import uuid
from typing import Any

Record = dict[str, Any]
"""A task record as stored on disk (see :mod:`bursarcore.runtime.queue` and docs/runtime.md)."""

_DIR_FSYNC_UNSUPPORTED = frozenset(
    e for e in (getattr(errno, n, None) for n in ("EINVAL", "EOPNOTSUPP", "ENOTSUP", "EBADF"))
    if e is not None
)


def read_json(path: str) -> Record:
    with open(path, "rb") as f:
        rec: Record = json.loads(f.read())
    return rec


def dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))


LEASE_MARK = stat.S_IXUSR
"""Mode bit of a lease-marked claimed record (see :func:`mark_lease`). No record is
created with it (records are created with mode ``0o666`` less the umask)."""


def mark_lease(fd: int, heartbeat: float, size: int) -> bool:
    """Give the open record ``fd`` of ``size`` bytes (written, not yet published) the
    lease mark: its modification time set to ``heartbeat`` rounded down to the millisecond,
    less one millisecond, plus ``size % 10**6`` nanoseconds (a check: a write in place
    sets another time), then :data:`LEASE_MARK` set. The bit is set only once the time is,
    so a marked record's time is never later than its heartbeat; a filesystem that refuses
    either, or keeps coarser times, leaves the record unmarked or failing the check (a
    stale scan then reads it). Returns whether it was marked."""
    try:
        ms = math.floor(heartbeat * 1e3) - 1
        if ms < 0:
            return False
        ns = ms * 1_000_000 + size % 1_000_000
        os.utime(fd, ns=(ns, ns))
        os.fchmod(fd, stat.S_IMODE(os.fstat(fd).st_mode) | LEASE_MARK)
    except (OSError, OverflowError, ValueError, TypeError, NotImplementedError):
        return False  # (a platform without utime or fchmod on a descriptor: unmarked)
    return True


def lease_of(st: os.stat_result) -> float | None:
    """A lower bound of the heartbeat of a record that carries the lease mark intact
    (:func:`mark_lease`), or ``None``: no mark, or a time or size that changed since."""
    t = st.st_mtime_ns
    if not st.st_mode & LEASE_MARK or t % 1_000_000 != st.st_size % 1_000_000:
        return None
    return t / 1e9


def temp_file(path: str, text: str, *, durable: bool, lease: float | None = None) -> str:
    """Write ``text`` to a new hidden temp file beside ``path`` (fsynced if ``durable``);
    returns its name. ``lease``: the heartbeat of the claimed record ``text`` is, written
    as its lease mark (:func:`mark_lease`)."""
    d, base = os.path.split(path)
    tmp = os.path.join(d, f".{base}.{uuid.uuid4().hex[:12]}.tmp")
    data = text.encode()
    fd = os.open(tmp, _CREATE, 0o666)  # (no buffered file object: one write, no fstat)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        if lease is not None:
            mark_lease(fd, lease, len(data))
        if durable:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        unlink(tmp)
        raise
    os.close(fd)
    return tmp


_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)


def unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def write_text(path: str, text: str, *, durable: bool, sync_dir: bool = True) -> None:
    """Atomic replace: write a hidden temp file beside ``path``, then rename over it.

    ``durable``: fsync the file before the rename and (with ``sync_dir``) its directory
    after it, so the new content survives power loss once this returns.
    """
    tmp = temp_file(path, text, durable=durable)
    try:
        os.replace(tmp, path)
    except BaseException:
        unlink(tmp)
        raise
    if durable and sync_dir:
        fsync_dir(os.path.dirname(path))


def write_json(path: str, obj: Any, *, durable: bool, sync_dir: bool = True) -> None:
    write_text(path, dumps(obj), durable=durable, sync_dir=sync_dir)


def fsync_dir(directory: str) -> None:
    """fsync a directory, making the creates, renames and deletes in it durable.

    A filesystem that cannot fsync a directory (``EINVAL`` and kin: some FUSE and network
    mounts, which persist metadata on their own terms) is skipped silently.
    """
    fd = os.open(directory or ".", os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in _DIR_FSYNC_UNSUPPORTED:
            raise
    finally:
        os.close(fd)


def listdir(directory: str) -> list[str]:
    """Names in ``directory`` (none if it does not exist)."""
    try:
        return os.listdir(directory)
    except FileNotFoundError:
        return []
