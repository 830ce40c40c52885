"""Checkpoints of one task: its workspace and its agent's state, archived atomically.

SPEC §13 (after RASER §3): on preemption or walltime the worker stops the agent, saves the
workspace plus the agent's serialised state, exits 99, and a later worker resumes from the
newest checkpoint. The layout under a task's root (``<queue>/checkpoints/<task_id>``)::

    ckpt-000003/data.tar        uncompressed tar: workspace/<files...> and agent-state
    ckpt-000003/manifest.json   {format, seq, created_at, size, sha256, state_size, files}
    .tmp-000004-<random>/       a save in progress (or one a crash interrupted)
    broken/ckpt-000002.<random> a checkpoint that failed verification, kept for inspection

Guarantees (checked by ``tests/runtime/test_checkpoint.py``):

* A ``ckpt-<seq>`` directory appears only complete: the archive and manifest are written
  under a temporary name, fsynced, and the directory is renamed into place.
* :meth:`CheckpointStore.latest` returns only a checkpoint whose archive matches its
  manifest (size and sha256). A broken one is logged as an error and moved to ``broken/``,
  and the previous checkpoint is used: damage is never silently ignored nor silently lost.
* Sequence numbers are never reused (broken ones count), so a queue record naming a
  checkpoint never names a different one later.
* Restore extracts with :mod:`tarfile`'s ``data`` filter (no absolute names, no ``..``, no
  device files, no writing through links); symlinks pointing outside the workspace (a
  virtualenv's ``bin/python``) are kept as links, never followed.

The archive is uncompressed: agent workspaces hold source trees and caches, and at the
RASER bar (under 30 s for checkpoint/restore) raw disk bandwidth beats any compressor;
see ``benchmarks/runtime_checkpoint.py`` for measured times.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
import shutil
import stat
import tarfile
import time
import uuid
from dataclasses import dataclass
from typing import Callable

from ..errors import BursarError, InvalidArgument

__all__ = ["Checkpoint", "CheckpointStore", "CheckpointError", "empty_directory"]

log = logging.getLogger("bursarcore.runtime.checkpoint")

FORMAT = 1
DATA = "data.tar"
MANIFEST = "manifest.json"
STATE_MEMBER = "agent-state"
WS_PREFIX = "workspace"
_CKPT = re.compile(r"^ckpt-(\d{6,})$")
_BROKEN = re.compile(r"^ckpt-(\d{6,})\.")
_BUF = 1 << 20


class CheckpointError(BursarError):
    """A checkpoint could not be written or restored (the message says which and why)."""


@dataclass(frozen=True)
class Checkpoint:
    """One complete, verified checkpoint: ``path`` is its ``ckpt-<seq>`` directory;
    ``size`` and ``sha256`` describe its archive; ``created_at`` is the saving clock."""

    seq: int
    path: str
    created_at: float
    size: int
    sha256: str

    @property
    def archive(self) -> str:
        return os.path.join(self.path, DATA)


class _HashingWriter:
    """File-like sink that hashes and counts what passes through to ``f``."""

    def __init__(self, f) -> None:
        self.f = f
        self.h = hashlib.sha256()
        self.n = 0

    def write(self, b) -> int:
        self.h.update(b)
        self.n += len(b)
        return self.f.write(b)

    def tell(self) -> int:  # tarfile asks for offsets in stream mode only; be safe
        return self.n


def _sha256_file(path: str) -> tuple[int, str]:
    h = hashlib.sha256()
    n = 0
    with open(path, "rb") as f:
        while chunk := f.read(_BUF):
            h.update(chunk)
            n += len(chunk)
    return n, h.hexdigest()


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def empty_directory(path: str) -> None:
    """Delete everything inside ``path`` (not ``path`` itself); never follows symlinks."""
    with os.scandir(path) as it:
        entries = list(it)
    for e in entries:
        if e.is_dir(follow_symlinks=False):
            shutil.rmtree(e.path)
        else:
            os.unlink(e.path)


def _workspace_filter(ti: tarfile.TarInfo) -> tarfile.TarInfo | None:
    """Archive regular files, directories and links; skip FIFOs and device nodes (they
    cannot be restored safely and hold no agent data)."""
    if ti.ischr() or ti.isblk() or ti.isfifo():
        return None
    return ti


def _extract_filter(dest: str) -> Callable[[tarfile.TarInfo, str], tarfile.TarInfo | None]:
    """tarfile's ``data`` filter, except that a symlink may point outside ``dest``.

    Such a link is harmless as long as nothing is written through it, and the ``data``
    filter checks every member's real destination (resolving links already on disk), so
    a later member ``link/x`` aimed outside is still refused.
    """
    data_filter = getattr(tarfile, "data_filter", None)
    if data_filter is None:  # pragma: no cover - Python < 3.10.12 / 3.11.4
        raise CheckpointError("restoring needs tarfile's extraction filters (Python >= 3.11.4 "
                              "or 3.10.12)")
    link_errors = (tarfile.AbsoluteLinkError, tarfile.LinkOutsideDestinationError)

    def flt(member: tarfile.TarInfo, path: str) -> tarfile.TarInfo | None:
        try:
            return data_filter(member, path)
        except link_errors:
            if not member.issym():
                raise
            # the link's own name must still be inside dest: check it with the target
            # replaced by a harmless relative one
            probe = data_filter(member.replace(linkname=".", deep=False), path)
            return probe.replace(linkname=member.linkname, deep=False)

    return flt


class CheckpointStore:
    """The checkpoints of one task, under ``root`` (``<queue>/checkpoints/<task_id>``).

    ``keep``: complete checkpoints kept after a save (the newest ones; at least 1, default
    2 so that a checkpoint damaged after its save still leaves one to fall back to).
    ``clock``: the time stamped into manifests. ``durable``: fsync the archive, manifest
    and directories before the rename that publishes a checkpoint.
    """

    def __init__(self, root: str | os.PathLike[str], *, keep: int = 2,
                 clock: Callable[[], float] = time.time, durable: bool = True) -> None:
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise InvalidArgument("keep", "must be an integer >= 1", keep)
        self.root = os.fspath(root)
        self.keep = keep
        self.clock = clock
        self.durable = durable

    # ------------------------------------------------------------------ listing
    def _complete_seqs(self) -> list[int]:
        try:
            names = os.listdir(self.root)
        except FileNotFoundError:
            return []
        return sorted(int(m.group(1)) for n in names if (m := _CKPT.match(n)))

    def _all_seqs(self) -> list[int]:
        seqs = self._complete_seqs()
        try:
            seqs += [int(m.group(1)) for n in os.listdir(os.path.join(self.root, "broken"))
                     if (m := _BROKEN.match(n))]
        except FileNotFoundError:
            pass
        return seqs

    def _dir(self, seq: int) -> str:
        return os.path.join(self.root, f"ckpt-{seq:06d}")

    def seqs(self) -> list[int]:
        """Sequence numbers of the complete (not necessarily verified) checkpoints, oldest first."""
        return self._complete_seqs()

    # ------------------------------------------------------------------ save
    def save(self, workspace: str | os.PathLike[str], state: bytes) -> Checkpoint:
        """Archive ``workspace`` and the agent ``state`` as the next checkpoint, then prune
        to the newest ``keep``. Raises :class:`CheckpointError` if the workspace is missing
        or the write fails (nothing half-written is ever published)."""
        workspace = os.fspath(workspace)
        if not isinstance(state, (bytes, bytearray, memoryview)):
            raise InvalidArgument("state", "must be bytes", type(state).__name__)
        if not os.path.isdir(workspace):
            raise CheckpointError(f"workspace {workspace} is not a directory")
        os.makedirs(self.root, exist_ok=True)
        self._clean_temporaries()
        seq = max(self._all_seqs(), default=0) + 1
        tmp = os.path.join(self.root, f".tmp-{seq:06d}-{uuid.uuid4().hex[:8]}")
        os.mkdir(tmp)
        try:
            data_path = os.path.join(tmp, DATA)
            with open(data_path, "xb") as raw:
                sink = _HashingWriter(raw)
                # (typeshed's tarfile.open lacks copybufsize, which it passes on to TarFile)
                with tarfile.open(fileobj=sink, mode="w|",  # type: ignore[call-overload]
                                  format=tarfile.PAX_FORMAT, bufsize=_BUF, copybufsize=_BUF) as tar:
                    tar.add(workspace, arcname=WS_PREFIX, recursive=True, filter=_workspace_filter)
                    ti = tarfile.TarInfo(STATE_MEMBER)
                    ti.size = len(state)
                    ti.mtime = int(self.clock())
                    ti.mode = 0o600
                    tar.addfile(ti, io.BytesIO(bytes(state)))
                raw.flush()
                if self.durable:
                    os.fsync(raw.fileno())
            size, digest = sink.n, sink.h.hexdigest()
            created = float(self.clock())
            manifest = {"format": FORMAT, "seq": seq, "created_at": created, "size": size,
                        "sha256": digest, "state_size": len(state), "files": [DATA]}
            with open(os.path.join(tmp, MANIFEST), "x") as f:
                f.write(json.dumps(manifest, separators=(",", ":")))
                f.flush()
                if self.durable:
                    os.fsync(f.fileno())
            if self.durable:
                _fsync_dir(tmp)
            final = self._dir(seq)
            os.rename(tmp, final)
            if self.durable:
                _fsync_dir(self.root)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        ck = Checkpoint(seq, final, created, size, digest)
        log.info("checkpoint %s: saved seq %d (%d bytes)", self.root, seq, size)
        self.prune()
        return ck

    def _clean_temporaries(self) -> None:
        """Remove saves a crash interrupted: only the task's claim holder saves, so any
        temporary present when it starts a save is dead."""
        for n in os.listdir(self.root):
            if n.startswith(".tmp-"):
                shutil.rmtree(os.path.join(self.root, n), ignore_errors=True)
                log.warning("checkpoint %s: removed an interrupted save %s", self.root, n)

    def prune(self) -> list[int]:
        """Delete all but the newest ``keep`` complete checkpoints; returns the deleted seqs."""
        seqs = self._complete_seqs()
        gone = seqs[:-self.keep]
        for s in gone:
            shutil.rmtree(self._dir(s), ignore_errors=True)
        return gone

    # ------------------------------------------------------------------ verify / load
    def verify(self, seq: int) -> Checkpoint:
        """The checkpoint ``seq`` if its manifest parses and its archive matches it;
        otherwise :class:`CheckpointError` saying what is wrong."""
        d = self._dir(seq)
        try:
            with open(os.path.join(d, MANIFEST), "rb") as f:
                m = json.loads(f.read())
        except FileNotFoundError:
            raise CheckpointError(f"{d}: manifest missing") from None
        except ValueError as exc:
            raise CheckpointError(f"{d}: manifest unreadable ({exc})") from None
        if not isinstance(m, dict) or m.get("format") != FORMAT or m.get("seq") != seq:
            raise CheckpointError(f"{d}: manifest is not a format-{FORMAT} manifest of seq {seq}")
        try:
            size, digest = _sha256_file(os.path.join(d, DATA))
        except FileNotFoundError:
            raise CheckpointError(f"{d}: {DATA} missing") from None
        if size != m.get("size"):
            raise CheckpointError(f"{d}: {DATA} is {size} bytes, manifest says {m.get('size')} "
                                  "(truncated or overwritten)")
        if digest != m.get("sha256"):
            raise CheckpointError(f"{d}: {DATA} sha256 {digest} does not match manifest "
                                  f"{m.get('sha256')}")
        return Checkpoint(seq, d, float(m.get("created_at", 0.0)), size, digest)

    def _move_broken(self, seq: int, why: str) -> None:
        broken = os.path.join(self.root, "broken")
        os.makedirs(broken, exist_ok=True)
        dest = os.path.join(broken, f"ckpt-{seq:06d}.{uuid.uuid4().hex[:8]}")
        try:
            os.rename(self._dir(seq), dest)
        except FileNotFoundError:
            return
        log.error("checkpoint %s: seq %d is broken (%s); moved to %s", self.root, seq, why, dest)

    def latest(self) -> Checkpoint | None:
        """The newest checkpoint that verifies, or ``None``. Each newer one that fails
        verification is logged as an error and moved to ``broken/``."""
        for seq in reversed(self._complete_seqs()):
            try:
                return self.verify(seq)
            except CheckpointError as exc:
                self._move_broken(seq, str(exc))
        return None

    def restore(self, workspace: str | os.PathLike[str]) -> tuple[Checkpoint, bytes] | None:
        """Empty ``workspace`` and unpack the newest verified checkpoint into it; returns it
        and the agent state, or ``None`` (workspace untouched) if there is none.

        An archive that verifies but cannot be extracted safely (a member aimed outside
        the workspace) is moved to ``broken/`` and the previous checkpoint tried.
        """
        workspace = os.fspath(workspace)
        os.makedirs(workspace, exist_ok=True)
        while (ck := self.latest()) is not None:
            try:
                state = self._unpack(ck, workspace)
            except (tarfile.TarError, CheckpointError) as exc:
                # the archive itself is bad (hostile member, bad format); an OSError (disk
                # full) is the host's problem and propagates, leaving the checkpoint alone
                self._move_broken(ck.seq, f"cannot be extracted: {exc}")
                continue
            log.info("checkpoint %s: restored seq %d into %s", self.root, ck.seq, workspace)
            return ck, state
        return None

    def _unpack(self, ck: Checkpoint, workspace: str) -> bytes:
        empty_directory(workspace)
        state: bytes | None = None
        # unpack into a staging directory beside the workspace's content, then move the
        # members up: the archive's top directory is "workspace"
        stage = os.path.join(workspace, f".restore-{uuid.uuid4().hex[:8]}")
        os.mkdir(stage)
        try:
            flt = _extract_filter(stage)
            # (typeshed's tarfile.open lacks copybufsize, which it passes on to TarFile)
            with tarfile.open(ck.archive, mode="r:",  # type: ignore[call-overload]
                              copybufsize=_BUF) as tar:
                for member in tar:
                    if member.name == STATE_MEMBER:
                        f = tar.extractfile(member)
                        state = f.read() if f is not None else b""
                        continue
                    if member.name != WS_PREFIX and not member.name.startswith(WS_PREFIX + "/"):
                        raise CheckpointError(f"{ck.path}: unexpected member {member.name!r}")
                    tar.extract(member, stage, filter=flt)
            if state is None:
                raise CheckpointError(f"{ck.path}: no {STATE_MEMBER} member")
            top = os.path.join(stage, WS_PREFIX)
            if os.path.isdir(top):
                for n in os.listdir(top):
                    os.rename(os.path.join(top, n), os.path.join(workspace, n))
                try:
                    os.chmod(workspace, stat.S_IMODE(os.lstat(top).st_mode) | stat.S_IRWXU)
                except OSError:
                    pass
        except BaseException:
            shutil.rmtree(stage, ignore_errors=True)
            empty_directory(workspace)
            raise
        shutil.rmtree(stage, ignore_errors=True)
        return state

    def clear(self) -> None:
        """Delete every checkpoint of the task (after it completed)."""
        shutil.rmtree(self.root, ignore_errors=True)
