"""The RASER-style runtime (SPEC §13): agent tasks in Slurm job arrays, in user space.

This package holds the pieces with no scheduler in them; see ``docs/runtime.md``.

* :mod:`.queue` — the shared-filesystem task queue (:class:`TaskQueue`): tasks as files,
  claims by atomic rename under a lock, heartbeats and stale reclaim, retries, tiers.
* :mod:`.tiers` — the tier policy (pure functions).
* :mod:`.locks` — the ``fcntl`` lock and the lock-file fallback.
"""

from .locks import FcntlLock, FileLock, LockError, LockTimeout, LockUnsupported
from .queue import STATES, Claim, NotAQueue, QueueConfig, QueueError, TaskQueue
from .tiers import TierPolicy

__all__ = [
    "TaskQueue",
    "QueueConfig",
    "Claim",
    "TierPolicy",
    "STATES",
    "QueueError",
    "NotAQueue",
    "LockError",
    "LockTimeout",
    "LockUnsupported",
    "FcntlLock",
    "FileLock",
]
