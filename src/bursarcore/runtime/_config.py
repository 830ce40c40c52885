"""Settings, claims and errors of the task queue (:mod:`bursarcore.runtime.queue`)."""

from __future__ import annotations

import os
import re
import socket
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

from ..errors import BursarError, InvalidArgument
from .tiers import TierPolicy

__all__ = ["QueueConfig", "Claim", "QueueError", "NotAQueue", "default_worker_id",
           "check_task_id", "FORMAT", "FORMATS", "MAX_SHARDS"]

FORMAT = 4
"""Format of the queues this version creates. Format 4: a shard's finished records
(``done``, ``failed``) in its ``finished/`` subdirectory. Format 3 (all of a shard's
records in its directory) is still opened, read and written in its own layout."""
FORMATS = (3, 4)
"""Formats this version opens."""
MAX_SHARDS = 4096
_ID = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]{0,199}$")
_OLD_FORMATS = {
    1: "one queue-wide lock (.lock)",
    2: "state directories pending/ claimed/ done/ failed/ shared by all shards",
}


class QueueError(BursarError):
    """The queue directory is unusable (missing, corrupt, or settings disagree)."""


class NotAQueue(QueueError):
    """``root`` has no ``queue.json``: create the queue first."""


@dataclass(frozen=True)
class QueueConfig:
    """Settings shared by every worker of a queue; stored in ``queue.json``.

    ``stale_after``: seconds without a heartbeat after which a peer reclaims a claim.
    ``max_failures``: a task that failed this many times goes to ``failed/``.
    ``tiers``, ``promote_after``, ``steal_down``: see :mod:`bursarcore.runtime.tiers`.
    ``stale_is_failure``: a stale reclaim counts as a failure (the worker probably died
    with the task, e.g. out of memory). ``scan_every``: a worker that claims also scans
    ``claimed/`` for stale claims at least this often, and whenever it finds nothing it may
    claim. ``lock``: ``"fcntl"`` or ``"file"``, decided at create time for every worker.
    ``lock_stale_after``: a lock file older than this is broken (file protocol only).
    ``durable``: fsync each record before the rename that publishes it, and the directory
    a create or move changed after it, so a transition survives power loss.
    ``lock_shards``: number of shards, each with its own lock and directory; tasks of
    different shards never wait for each other (more shards, fewer collisions).
    """

    stale_after: float = 180.0
    max_failures: int = 3
    tiers: int = 1
    promote_after: int = 1
    steal_down: bool = True
    stale_is_failure: bool = True
    scan_every: float = 30.0
    lock: str = "fcntl"
    lock_stale_after: float = 60.0
    durable: bool = True
    lock_shards: int = 64

    def __post_init__(self) -> None:
        for name in ("stale_after", "scan_every", "lock_stale_after"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise InvalidArgument(name, "must be a positive number of seconds", v)
        if isinstance(self.max_failures, bool) or not isinstance(self.max_failures, int) or self.max_failures < 1:
            raise InvalidArgument("max_failures", "must be an integer >= 1", self.max_failures)
        if self.lock not in ("fcntl", "file"):
            raise InvalidArgument("lock", "must be 'fcntl' or 'file'", self.lock)
        n = self.lock_shards
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_SHARDS:
            raise InvalidArgument("lock_shards", f"must be an integer in [1, {MAX_SHARDS}]", n)
        TierPolicy(self.tiers, self.promote_after, self.steal_down)  # validates them

    @property
    def policy(self) -> TierPolicy:
        return TierPolicy(self.tiers, self.promote_after, self.steal_down)

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, **asdict(self)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "QueueConfig":
        old = _OLD_FORMATS.get(data.get("format"))  # type: ignore[arg-type]
        if old is not None:
            raise QueueError(
                f"queue.json format {data.get('format')}: this queue was made by an earlier "
                f"bursarcore ({old}), which this version (format {FORMAT}, one directory per "
                "shard) does not read; finish it with the version that made it, or create a "
                "new queue")
        if data.get("format") not in FORMATS:
            raise QueueError(f"queue.json format {data.get('format')!r}, expected one of "
                             f"{FORMATS}")
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass
class Claim:
    """A worker's hold on one task; pass it back to heartbeat/complete/fail/release."""

    task_id: str
    token: str
    worker: str
    worker_tier: int
    tier: int
    payload: Any
    failures: int
    attempts: int
    resume: Any
    claimed_at: float
    lost: bool = field(default=False)


def default_worker_id() -> str:
    """``host:pid``, plus the Slurm array task (``JOB_TASK``) or job id when inside one."""
    wid = f"{socket.gethostname()}:{os.getpid()}"
    aj, at = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    if aj and at:
        return f"{wid}:{aj}_{at}"
    job = os.environ.get("SLURM_JOB_ID")
    return f"{wid}:{job}" if job else wid


def check_task_id(task_id: Any) -> str:
    if not isinstance(task_id, str) or not _ID.match(task_id):
        raise InvalidArgument("task_id", "must match [A-Za-z0-9_][A-Za-z0-9_-]{0,199}", task_id)
    return task_id
