"""File primitives of the task queue: atomic record writes, reads, directory fsyncs.

Every write goes to a hidden temp file beside its target and is renamed into place, so a
reader sees the old content or the new, never a partial record. Hidden names (leading
``.``) are ignored by every reader of the queue.
"""

from __future__ import annotations

import errno
import json
import os
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


def temp_file(path: str, text: str, *, durable: bool) -> str:
    """Write ``text`` to a new hidden temp file beside ``path`` (fsynced if ``durable``);
    returns its name."""
    d, base = os.path.split(path)
    tmp = os.path.join(d, f".{base}.{uuid.uuid4().hex[:12]}.tmp")
    with open(tmp, "xb") as f:
        f.write(text.encode())
        if durable:
            f.flush()
            os.fsync(f.fileno())
    return tmp


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
