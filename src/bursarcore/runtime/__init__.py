"""The RASER-style runtime (SPEC §13): agent tasks in Slurm job arrays, in user space.

This package holds the pieces with no scheduler in them; see ``docs/runtime.md``.

* :mod:`.queue` — the shared-filesystem task queue (:class:`TaskQueue`): tasks as files,
  claims by atomic rename under per-task shard locks (no queue-wide lock), heartbeats and
  stale reclaim, retries, tiers.
* :mod:`.tiers` — the tier policy (pure functions).
* :mod:`.locks` — the ``fcntl`` lock, the lock-file fallback, and per-operation shard locks.
* :mod:`.checkpoint` — per-task checkpoints of workspace and agent state (verified, pruned).
* :mod:`.plugins` — plugin hooks, the built-in ``command`` and ``counter`` plugins, secrets.
* :mod:`.isolation` — how agents run: plain, bubblewrap, Apptainer.
* :mod:`.worker` — ``python -m bursarcore.runtime.worker``: the claim/run/checkpoint loop.
"""

from .checkpoint import Checkpoint, CheckpointError, CheckpointStore
from .isolation import ApptainerRunner, BwrapRunner, NoneRunner, Runner, RunnerUnavailable, get_runner
from .locks import FcntlLock, FileLock, LockError, LockTimeout, LockUnsupported
from .queue import STATES, Claim, NotAQueue, QueueConfig, QueueError, TaskQueue
from .plugins import Plugin, SecretRedactor, TaskContext, load_plugin, load_secrets
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
    "Checkpoint",
    "CheckpointStore",
    "CheckpointError",
    "Plugin",
    "TaskContext",
    "load_plugin",
    "load_secrets",
    "SecretRedactor",
    "Runner",
    "NoneRunner",
    "BwrapRunner",
    "ApptainerRunner",
    "RunnerUnavailable",
    "get_runner",
]
