"""A task queue on a shared filesystem: files, renames and short per-task locks; no
database, no service, no queue-wide lock.

SPEC §13 (after RASER §3). The full on-disk protocol is in ``docs/runtime.md``; in short
(format 2)::

    <root>/queue.json            settings every worker obeys (written once, at create)
    <root>/seq                   next submission number (changed under the lock .locks/seq)
    <root>/pending.gen           grows by one byte whenever a task enters pending/ (a hint)
    <root>/.locks/<k>            shard lock k, k = crc32(task id) % lock_shards (fcntl), or
    <root>/.locks/<k>.excl       the same lock in the lock-file protocol (lock = "file")
    <root>/ids/<id>              empty marker: this id was put (ids are unique forever)
    <root>/pending/<tier>.<failures>.<seq>.<id>.json
    <root>/claimed/<id>.json     record with claim {worker, token, heartbeat, ...}
    <root>/done/<id>.json        record with result
    <root>/failed/<id>.json      record with reason

Every change of one task happens while holding *that task's shard lock*, for the few
system calls of the change only; no operation holds a lock for more than one task at a
time, so transitions of tasks in different shards run in parallel and ``put_many`` never
blocks a claim for longer than one task's write. A handle keeps no file descriptor open
between calls (an fcntl section opens its lock file, locks it, and closes it).

Guarantees (checked by ``tests/runtime``):

* Every task is in exactly one of ``pending/ claimed/ done/ failed/`` at every instant:
  each state change is one ``rename`` of the task's file, made under its shard lock, and
  every writer of a task holds that lock.
* A claim is held by one worker at a time. A worker's heartbeat, completion, failure or
  release is accepted only while its claim token is the one in ``claimed/<id>.json``; once a
  peer has reclaimed the task as stale, the old worker's calls return ``False``/``"lost"``.
* A result reaches ``done/`` exactly once: only the current claim may complete, and the
  move out of ``claimed/`` ends that claim.
* A claim whose heartbeat is older than ``stale_after`` (default 180 s) is reclaimed by any
  peer, and (by default) counts as a failure: a worker killed for memory routes its task
  up a tier. A task that failed ``max_failures`` times goes to ``failed/`` with the reason.
* Crash consistency: a record is rewritten (temp file + rename) *before* the rename that
  moves it, and a record's ``state`` says where it is going; a worker that dies between
  the two leaves a record that the next stale scan moves on without counting anything
  twice. A worker that dies inside a section drops its fcntl lock with it (a lock file is
  broken after ``lock_stale_after``). With ``durable=True`` (default) the record is fsynced
  before it is published and the changed directories after (outside the lock, before the
  call returns), so a transition that returned survives power loss.

Claiming without a global lock: a handle lists ``pending/`` and keeps the eligible names
sorted by preference (per worker tier); it re-lists when ``pending.gen`` changed (a task
was added) or its list ran out. It tries the names in order: a name already gone is
skipped with one ``stat``; a name whose shard lock is busy is passed over (one
non-blocking attempt). A claimer that met a busy lock is in a crowd: it then picks at
random among its best 8 remaining names, and after 4 busy ones it waits, asleep, for the
best of those, so concurrent claimers spread over the shards instead of chasing one name
or queueing behind one lock. The preference order is exact for one claimer and
approximate (by the few names in flight) between concurrent claimers.

Format 1 queues (one queue-wide ``.lock``) are refused with :class:`QueueError`: finish them
with the version that made them, since workers of both kinds on one queue would not
exclude each other.

Time comes only from ``clock`` (float seconds, wall time shared by all hosts), so tests
drive it by hand. Heartbeat and stale decisions compare clock readings of different hosts:
keep clocks within a small fraction of ``stale_after``.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import random
import re
import socket
import time
import uuid
import zlib
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping

from ..errors import BursarError, InvalidArgument
from .locks import LockUnsupported, ShardLocks, fcntl_supported
from .tiers import TierPolicy

__all__ = [
    "QueueConfig",
    "TaskQueue",
    "Claim",
    "QueueError",
    "NotAQueue",
    "STATES",
    "default_worker_id",
]

log = logging.getLogger("bursarcore.runtime.queue")

STATES = ("pending", "claimed", "done", "failed")
FORMAT = 2
HISTORY_LIMIT = 50
MAX_SHARDS = 4096
_GEN_RESET = 1 << 20  # pending.gen is truncated once it reaches 1 MiB
_ID = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]{0,199}$")
_UNSET: Any = object()
Record = dict[str, Any]
"""A task record as stored on disk (see the module docstring and docs/runtime.md)."""


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
    ``durable``: fsync each record before the rename that publishes it, and the directories
    a create or move changed after it, so a transition survives power loss.
    ``lock_shards``: number of shard locks; tasks of different shards never wait for each
    other (more shards, fewer collisions; each is one small file, created on first use).
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
        if data.get("format") == 1:
            raise QueueError(
                "queue.json format 1: this queue was made by an earlier bursarcore with one "
                "queue-wide lock (.lock), which this version (format 2, per-task shard locks) "
                "does not take; finish it with the version that made it, or create a new queue")
        if data.get("format") != FORMAT:
            raise QueueError(f"queue.json format {data.get('format')!r}, expected {FORMAT}")
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


def _pending_name(tier: int, failures: int, seq: int, task_id: str) -> str:
    return f"{tier}.{failures}.{seq:012d}.{task_id}.json"


def _parse_pending(name: str) -> tuple[int, int, int, str] | None:
    if name.startswith(".") or not name.endswith(".json"):
        return None
    parts = name[:-5].split(".")
    if len(parts) != 4:
        return None
    try:
        return int(parts[0]), int(parts[1]), int(parts[2]), parts[3]
    except ValueError:
        return None


_NOT_ELIGIBLE = (float("inf"),)
"""Preference key of a pending name a worker may not claim: above every real key."""


class _PickKeys(dict[str, tuple[float, ...]]):
    """Pending file name -> preference key for one worker tier, parsed on first lookup."""

    def __init__(self, policy: TierPolicy, worker_tier: int) -> None:
        super().__init__()
        self.policy = policy
        self.worker_tier = worker_tier

    def __missing__(self, name: str) -> tuple[float, ...]:
        p = _parse_pending(name)
        pol, w = self.policy, self.worker_tier
        if p is None or not pol.eligible(w, p[0]):
            key: tuple[float, ...] = _NOT_ELIGIBLE
        else:
            key = pol.preference(w, p[0], p[1], p[2])
        self[name] = key
        return key


def _entries(directory: str) -> list[str]:
    try:
        return [n for n in os.listdir(directory) if n.endswith(".json") and not n.startswith(".")]
    except FileNotFoundError:
        return []


_GONE, _BUSY = "gone", "busy"
"""Outcomes of one claim attempt on a pending name other than a :class:`Claim`."""
_SPREAD = 8
"""A claimer in a crowd picks at random among this many of its best remaining names."""
_MAX_PASSED = 4
"""Busy names a claim passes over before it waits for the best of them. Waiting sleeps;
trying ever more names keeps a crowd of claimers runnable, and on a machine with far fewer
cores than workers the kernel then preempts the holders of the directory locks that every
rename needs (measured: 256 workers on 2 cores, renames of 0.5 s without this bound)."""


class TaskQueue:
    """Open the queue at ``root`` (created by :meth:`create`).

    ``clock``: float seconds, shared meaning across hosts (default :func:`time.time`).
    ``worker``: this process's worker id in claims and history (default
    :func:`default_worker_id`). ``lock_timeout``: real seconds to wait for a shard lock
    before :class:`~bursarcore.runtime.locks.LockTimeout`. ``sleep``: the lock-file poll
    pause. A handle holds no open file between calls; :meth:`close` (or ``with``) ends it.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        clock: Callable[[], float] = time.time,
        worker: str | None = None,
        lock_timeout: float | None = 600.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.root = os.fspath(root)
        self.clock = clock
        self.worker = worker or default_worker_id()
        cfg_path = os.path.join(self.root, "queue.json")
        try:
            with open(cfg_path, "rb") as f:
                data = json.loads(f.read())
        except FileNotFoundError:
            raise NotAQueue(f"{self.root}: no queue.json (create the queue first)") from None
        except ValueError as exc:
            raise QueueError(f"{cfg_path}: {exc}") from None
        self.config = QueueConfig.from_json(data)
        self.policy = self.config.policy
        self._dirs = {s: os.path.join(self.root, s) for s in STATES}
        self._ids = os.path.join(self.root, "ids")
        self._gen = os.path.join(self.root, "pending.gen")
        locks_dir = os.path.join(self.root, ".locks")
        if self.config.lock == "fcntl":
            ok, why = fcntl_supported(self.root)
            if not ok:
                raise LockUnsupported(
                    f"{self.root}: the queue was created for fcntl locks, which do not work on "
                    f"this host's mount ({why}); recreate it with lock='file' (every worker of "
                    "a queue must use the same lock)")
        else:
            log.info("queue %s: using the lock-file protocol (.locks/<k>.excl, temp file + link)",
                     self.root)
        os.makedirs(locks_dir, exist_ok=True)
        self._lock = ShardLocks(locks_dir, self.config.lock, clock=clock,
                                stale_after=self.config.lock_stale_after, timeout=lock_timeout,
                                sleep=sleep, owner=self.worker)
        self._last_scan = float("-inf")
        # worker tier -> pending file name -> preference key (see _candidates)
        self._pick_keys: dict[int, _PickKeys] = {}
        # worker tier -> [pending.gen stamp, eligible names sorted best-last]
        self._cands: dict[int, list[Any]] = {}
        self._rng = random.Random()  # spreads a crowd of claimers (see _take_best)

    # ------------------------------------------------------------------ creation
    @classmethod
    def create(
        cls,
        root: str | os.PathLike[str],
        config: QueueConfig | None = None,
        *,
        lock: str = "auto",
        **kwargs: Any,
    ) -> "TaskQueue":
        """Create (or reopen, if the settings match) a queue at ``root`` and open it.

        ``lock="auto"`` probes ``fcntl`` on the filesystem and falls back to the lock-file
        protocol where it does not work, logging a warning; ``"fcntl"`` / ``"file"`` force
        one (``"file"`` is also forced by ``BURSAR_QUEUE_LOCK=file`` at create time).
        ``config.lock`` is overridden by the decision. Extra keyword arguments go to
        :class:`TaskQueue`.
        """
        root = os.fspath(root)
        config = config or QueueConfig()
        env = os.environ.get("BURSAR_QUEUE_LOCK", "").strip()
        if lock == "auto" and env:
            lock = env
        if lock not in ("auto", "fcntl", "file"):
            raise InvalidArgument("lock", "must be 'auto', 'fcntl' or 'file'", lock)
        os.makedirs(root, exist_ok=True)
        cfg_path = os.path.join(root, "queue.json")
        existing = None
        if os.path.exists(cfg_path):
            with open(cfg_path, "rb") as f:
                existing = QueueConfig.from_json(json.loads(f.read()))
        if lock == "auto" and existing is not None:
            lock = existing.lock  # reopening: the queue's lock was decided when it was made
        elif lock == "auto":
            ok, why = fcntl_supported(root)
            lock = "fcntl" if ok else "file"
            if not ok:
                log.warning("queue %s: fcntl locks not supported (%s); falling back to the "
                            "lock-file protocol", root, why)
        elif lock == "fcntl":
            ok, why = fcntl_supported(root)
            if not ok:
                raise LockUnsupported(f"{root}: fcntl locks not supported ({why})")
        config = QueueConfig(**{**asdict(config), "lock": lock})
        for d in (*STATES, "ids", ".locks"):
            os.makedirs(os.path.join(root, d), exist_ok=True)
        if existing is not None:
            if existing != config:
                raise QueueError(f"{root}: exists with other settings {existing} (wanted {config})")
        else:
            _write_json(cfg_path, config.to_json(), durable=config.durable)
        return cls(root, **kwargs)

    def close(self) -> None:
        """End this handle: caches dropped, later changes refused. Idempotent. (A handle
        keeps no descriptor open between calls, so this frees memory only.)"""
        self._lock.close()
        self._pick_keys.clear()
        self._cands.clear()

    def __enter__(self) -> "TaskQueue":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ plumbing
    def _path(self, state: str, name: str) -> str:
        return os.path.join(self._dirs[state], name)

    def _shard(self, task_id: str) -> str:
        """Name of the lock of ``task_id``'s shard; every change of that task holds it."""
        return str(zlib.crc32(task_id.encode()) % self.config.lock_shards)

    def _write(self, path: str, record: Record, *, sync_dir: bool = True) -> None:
        """Atomically (re)write ``record`` at ``path``. ``sync_dir=False`` when a
        :meth:`_move` of ``path`` follows at once and syncs its directory anyway."""
        _write_json(path, record, durable=self.config.durable, sync_dir=sync_dir)

    def _move(self, src: str, dst: str, synced: set[str]) -> None:
        """``rename(src, dst)``; adds both directories to ``synced``, which the caller
        fsyncs (:meth:`_sync`) after leaving the shard lock and before returning."""
        os.rename(src, dst)
        synced.add(os.path.dirname(dst))
        synced.add(os.path.dirname(src))

    def _sync(self, dirs: Iterable[str]) -> None:
        """fsync ``dirs`` if durable: the moves made in them survive power loss. Done
        outside the shard lock: what a peer sees does not depend on it, only what a
        power loss keeps, and the call has not returned yet."""
        if self.config.durable:
            for d in sorted(dirs):
                _fsync_dir(d)

    def _bump(self) -> None:
        """Tell claimers that a task entered ``pending/`` (they re-list): one appended byte,
        so the size changes with every addition whatever the timestamp granularity."""
        fd = os.open(self._gen, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            if os.write(fd, b".") and os.fstat(fd).st_size >= _GEN_RESET:
                os.ftruncate(fd, 0)
        finally:
            os.close(fd)

    def _history(self, rec: Record, now: float, event: str, **extra: Any) -> None:
        h = rec.setdefault("history", [])
        h.append({"at": now, "event": event, "worker": self.worker, **extra})
        del h[:-HISTORY_LIMIT]

    def _to_pending(self, src: str, rec: Record, synced: set[str]) -> None:
        """Rewrite ``src`` as a pending record, then move it to its pending name."""
        rec["state"] = "pending"
        rec["claim"] = None
        rec["tier"] = self.policy.tier_of(rec["base_tier"], rec["failures"])
        self._write(src, rec, sync_dir=False)
        self._move(src, self._path("pending", _pending_name(rec["tier"], rec["failures"], rec["seq"], rec["id"])),
                   synced)
        self._bump()

    def _route_failure(self, src: str, rec: Record, now: float, reason: str, synced: set[str]) -> str:
        """After ``failures`` was incremented: retry (pending) or give up (failed)."""
        if rec["failures"] >= self.config.max_failures:
            rec.update(state="failed", claim=None, reason=reason, failed_at=now)
            self._write(src, rec, sync_dir=False)
            self._move(src, self._path("failed", rec["id"] + ".json"), synced)
            return "failed"
        self._to_pending(src, rec, synced)
        return "retry"

    def _own(self, claim: Claim) -> tuple[str, Record] | None:
        """The claimed record if ``claim`` still holds it (under its shard lock)."""
        path = self._path("claimed", claim.task_id + ".json")
        try:
            rec = _read_json(path)
        except FileNotFoundError:
            claim.lost = True
            return None
        c = rec.get("claim")
        if rec.get("state") != "claimed" or not c or c.get("token") != claim.token:
            claim.lost = True
            return None
        return path, rec

    def _next_seq(self, n: int) -> int:
        """Reserve ``n`` submission numbers (under the ``seq`` lock, held for this only)."""
        path = os.path.join(self.root, "seq")
        with self._lock.hold("seq"):
            try:
                with open(path) as f:
                    first = int(f.read().strip() or 0)
            except FileNotFoundError:
                first = 0
            _write_text(path, f"{first + n}\n", durable=self.config.durable)
        return first

    # ------------------------------------------------------------------ submit
    def put(self, task_id: str, payload: Any = None, *, tier: int = 0) -> bool:
        """Add one task; ``False`` if the id was ever put before (ids are unique)."""
        return self.put_many([(task_id, payload, tier)]) == 1

    def put_many(self, tasks: Iterable[tuple[Any, ...]]) -> int:
        """Add ``(task_id, payload[, tier])`` tuples; returns how many were new.

        Ids already present in any state are skipped, so re-running a submission is
        harmless. Payloads must be JSON-serialisable; every item is checked before any
        state changes.

        Each task is written (and fsynced) to a temp file first; then, under its shard
        lock only, its ``ids/<id>`` marker is created with ``O_EXCL`` (which decides
        uniqueness) and the record is renamed into ``pending/``. So claims go on during a
        long submission, and claimers see its first tasks before it ends. A marker without
        a task (a submitter died between the two steps) is found under the same lock and
        the task is put after all.
        """
        items = []
        for t in tasks:
            t = tuple(t)
            if len(t) not in (2, 3):
                raise InvalidArgument("tasks", "items must be (task_id, payload[, tier])", t)
            task_id, payload, tier = t if len(t) == 3 else (*t, 0)
            check_task_id(task_id)
            self.policy.check_tier(tier)
            json.dumps(payload)  # fail before any state changes
            items.append((task_id, payload, tier))
        # the first of each id, in order (a later duplicate in the batch is dropped)
        seen: set[str] = set()
        unique = []
        for it in items:
            if it[0] not in seen:
                seen.add(it[0])
                unique.append(it)
        items = unique
        if not items:
            return 0
        now = self.clock()
        seq = self._next_seq(len(items))
        durable = self.config.durable
        pending_ids: set[str] | None = None  # one listing, taken on the first known id
        added = 0
        for k, (task_id, payload, tier) in enumerate(items):
            marker = os.path.join(self._ids, task_id)
            name = _pending_name(tier, 0, seq + k, task_id)
            dst = self._path("pending", name)
            rec = {"format": FORMAT, "id": task_id, "payload": payload, "seq": seq + k,
                   "base_tier": tier, "tier": tier, "failures": 0, "attempts": 0,
                   "state": "pending", "submitted_at": now, "claim": None, "resume": None,
                   "history": []}
            text = json.dumps(rec, separators=(",", ":"))
            tmp = None
            if not os.path.lexists(marker):  # the common case: write before taking the lock
                tmp = _temp_file(dst, text, durable=durable)
            try:
                with self._lock.hold(self._shard(task_id)):
                    try:
                        os.close(os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
                    except FileExistsError:
                        if pending_ids is None:
                            pending_ids = self._pending_ids()
                        if self._known_locked(task_id, pending_ids):
                            continue
                        log.warning("queue %s: id %s has a marker but no task (a submitter "
                                    "died); putting it", self.root, task_id)
                    if tmp is None:
                        tmp = _temp_file(dst, text, durable=durable)
                    os.replace(tmp, dst)
                    tmp = None
            finally:
                if tmp is not None:
                    _unlink(tmp)
            added += 1
            if added % 256 == 0:
                self._bump()  # let claimers start on the batch's head
        if added:
            self._sync((self._ids, self._dirs["pending"]))
            self._bump()
        return added

    def _pending_ids(self) -> set[str]:
        return {p[3] for p in map(_parse_pending, _entries(self._dirs["pending"])) if p}

    def _known_locked(self, task_id: str, pending_ids: set[str]) -> bool:
        """Is ``task_id`` in some state? Called under its shard lock, so it cannot move.

        ``pending_ids`` may be older than the lock: a hit there is still proof (a task
        never vanishes, and it is in none of the other states now), a miss is re-checked
        with a fresh listing (rare: only a marker left by a dead submitter misses)."""
        for s in ("claimed", "done", "failed"):
            if os.path.lexists(self._path(s, task_id + ".json")):
                return True
        if task_id in pending_ids:
            return True
        pending_ids |= self._pending_ids()
        return task_id in pending_ids

    # ------------------------------------------------------------------ work
    def claim(self, worker_tier: int = 0) -> Claim | None:
        """Claim the pending task this tier's worker prefers, or ``None`` if none is eligible.

        Reclaims stale claims (see :meth:`reclaim_stale`) first if ``scan_every`` seconds
        passed since this object last scanned, so a dead worker's task returns to pending
        within ``stale_after + scan_every`` while any worker keeps claiming; and, if that did
        not happen in this call, whenever no pending task is eligible, so a worker never
        returns ``None`` (and exits) while a stale claim it could take back sits in
        ``claimed/``. The scan reads every claimed record (at most as many as workers)
        without a lock, and takes a task's shard lock only to move it.
        """
        self.policy.check_tier(worker_tier, "worker_tier")
        now = self.clock()
        scanned = now - self._last_scan >= self.config.scan_every
        if scanned:
            self._scan_claimed(now)
        while True:
            got = self._take_best(worker_tier, now)
            if got is not None or scanned:
                return got
            scanned = True
            self._scan_claimed(now)

    def _candidates(self, worker_tier: int, refresh: bool = False) -> list[str]:
        """Eligible pending names for ``worker_tier``, best last (so ``pop()`` is next).

        Re-lists ``pending/`` when ``pending.gen`` changed since the last listing (a task
        was added), when the list ran out, or on ``refresh``; otherwise the list from the
        last listing, from which names already taken are dropped as they are met. Each
        name is parsed once per object and worker tier (:class:`_PickKeys`); keys of names
        no longer listed are dropped once they outnumber the listing.
        """
        try:
            st = os.stat(self._gen)
            stamp: Any = (st.st_size, st.st_mtime_ns, st.st_ino)
        except FileNotFoundError:
            stamp = None
        ent = self._cands.get(worker_tier)
        if ent is not None and ent[1] and ent[0] == stamp and not refresh:
            return ent[1]
        try:
            names = os.listdir(self._dirs["pending"])
        except FileNotFoundError:
            names = []
        keys = self._pick_keys.get(worker_tier)
        if keys is None or len(keys) > 2 * len(names) + 1024:
            keys = self._pick_keys[worker_tier] = _PickKeys(self.policy, worker_tier)
        # ties (only between names that are not records) go to the first listed, as min()
        order = sorted(names, key=keys.__getitem__)
        cands = [n for n in reversed(order) if keys[n] is not _NOT_ELIGIBLE]
        self._cands[worker_tier] = [stamp, cands]
        return cands

    def _pick(self, worker_tier: int) -> tuple[str, str] | None:
        """``(name, task_id)`` of the pending file this tier would try first (the smallest
        :meth:`TierPolicy.preference <bursarcore.runtime.tiers.TierPolicy.preference>`
        key among eligible names still present), or ``None``. Takes nothing."""
        for refresh in (False, True):
            cands = self._candidates(worker_tier, refresh)
            while cands:
                name = cands[-1]
                if os.path.lexists(self._path("pending", name)):
                    return name, name[:-5].split(".")[3]
                cands.pop()
        return None

    def _take_best(self, worker_tier: int, now: float) -> Claim | None:
        """Try eligible names best first (see the module docstring): ``None`` only after
        a fresh listing offered nothing that could be taken.

        Alone, a claimer takes names in exact preference order. Once it meets a busy shard
        lock (a peer is mid-change there, most often taking that very name) it is in a
        crowd: it then tries a random one of the best :data:`_SPREAD` remaining names, so
        that the crowd does not chase one name, and after :data:`_MAX_PASSED` busy ones it
        waits, asleep, for the best of those."""
        for refresh in (False, True):
            cands = self._candidates(worker_tier, refresh)
            crowd = False
            while cands:
                busy: list[str] = []
                while cands and len(busy) < _MAX_PASSED:
                    k = -1 - self._rng.randrange(min(_SPREAD, len(cands))) if crowd else -1
                    name = cands.pop(k)
                    got = self._try_claim(name, worker_tier, now, wait=False)
                    if isinstance(got, Claim):
                        self._restore(cands, busy, worker_tier)
                        return got
                    if got == _BUSY:
                        busy.append(name)
                        crowd = True
                busy.sort(key=self._pick_keys[worker_tier].__getitem__)
                for k, name in enumerate(busy):
                    got = self._try_claim(name, worker_tier, now, wait=True)
                    if isinstance(got, Claim):
                        self._restore(cands, busy[k + 1:], worker_tier)
                        return got
        return None

    def _restore(self, cands: list[str], names: list[str], worker_tier: int) -> None:
        """Put names passed over (busy, not taken) back among ``cands``, best last."""
        if names:
            cands.extend(names)
            cands.sort(key=self._pick_keys[worker_tier].__getitem__, reverse=True)

    def _try_claim(self, name: str, worker_tier: int, now: float, *, wait: bool) -> Claim | str:
        src = self._path("pending", name)
        if not os.path.lexists(src):
            return _GONE  # taken by a peer since the listing: no lock needed to know
        task_id = name[:-5].split(".")[3]
        synced: set[str] = set()
        with self._lock.hold(self._shard(task_id), wait=wait) as held:
            if not held:
                return _BUSY
            try:
                rec = _read_json(src)
            except FileNotFoundError:
                return _GONE
            except ValueError as exc:  # only outside damage: every write is atomic
                self._quarantine(src, exc)
                return _GONE
            token = uuid.uuid4().hex
            rec["attempts"] = rec.get("attempts", 0) + 1
            rec["state"] = "claimed"
            rec["claim"] = {"worker": self.worker, "token": token, "worker_tier": worker_tier,
                            "claimed_at": now, "heartbeat": now}
            self._history(rec, now, "claim", worker_tier=worker_tier)
            self._write(src, rec, sync_dir=False)
            self._move(src, self._path("claimed", task_id + ".json"), synced)
        self._sync(synced)
        return Claim(task_id, token, self.worker, worker_tier, rec["tier"], rec["payload"],
                     rec["failures"], rec["attempts"], rec.get("resume"), now)

    def _quarantine(self, path: str, exc: Exception) -> None:
        aside = os.path.join(self.root, "corrupt")
        os.makedirs(aside, exist_ok=True)
        os.rename(path, os.path.join(aside, os.path.basename(path)))
        log.error("queue %s: unreadable record %s (%s); moved to corrupt/", self.root, path, exc)

    def heartbeat(self, claim: Claim, *, resume: Any = _UNSET) -> bool:
        """Refresh the claim's heartbeat (and optionally its ``resume`` data, e.g. the path
        of the newest checkpoint). ``False`` means the claim was lost: stop the task."""
        if resume is not _UNSET:
            json.dumps(resume)
        with self._lock.hold(self._shard(claim.task_id)):
            own = self._own(claim)
            if own is None:
                return False
            path, rec = own
            rec["claim"]["heartbeat"] = self.clock()
            if resume is not _UNSET:
                rec["resume"] = claim.resume = resume
            self._write(path, rec, sync_dir=False)
        self._sync((self._dirs["claimed"],))
        return True

    def complete(self, claim: Claim, result: Any = None) -> bool:
        """Record the result in ``done/``; ``False`` (and nothing written) if the claim was lost."""
        json.dumps(result)
        synced: set[str] = set()
        with self._lock.hold(self._shard(claim.task_id)):
            own = self._own(claim)
            if own is None:
                return False
            path, rec = own
            now = self.clock()
            rec.update(state="done", result=result, completed_at=now, completed_by=self.worker)
            self._history(rec, now, "done")
            self._write(path, rec, sync_dir=False)
            self._move(path, self._path("done", claim.task_id + ".json"), synced)
        self._sync(synced)
        return True

    def fail(self, claim: Claim, reason: str) -> str:
        """Count a failure: ``"retry"`` (back to pending, maybe a tier up), ``"failed"``
        (``max_failures`` reached; in ``failed/`` with ``reason``) or ``"lost"``."""
        synced: set[str] = set()
        with self._lock.hold(self._shard(claim.task_id)):
            own = self._own(claim)
            if own is None:
                return "lost"
            path, rec = own
            now = self.clock()
            rec["failures"] += 1
            self._history(rec, now, "fail", reason=str(reason))
            out = self._route_failure(path, rec, now, str(reason), synced)
        self._sync(synced)
        return out

    def release(self, claim: Claim, reason: str = "released", *, resume: Any = _UNSET) -> bool:
        """Give the task back without counting a failure (preemption, walltime, shutdown);
        ``resume`` is kept for the next claimer. ``False`` if the claim was lost."""
        if resume is not _UNSET:
            json.dumps(resume)
        synced: set[str] = set()
        with self._lock.hold(self._shard(claim.task_id)):
            own = self._own(claim)
            if own is None:
                return False
            path, rec = own
            if resume is not _UNSET:
                rec["resume"] = resume
            self._history(rec, self.clock(), "release", reason=str(reason))
            self._to_pending(path, rec, synced)
        self._sync(synced)
        return True

    # ------------------------------------------------------------------ recovery
    def reclaim_stale(self) -> list[str]:
        """Move claims whose heartbeat is older than ``stale_after`` back to pending (or to
        ``failed/``), and finish moves that a crashed worker left half done. Returns the
        ids of the stale claims taken."""
        return self._scan_claimed(self.clock())

    def _scan_claimed(self, now: float) -> list[str]:
        """Read every record in ``claimed/`` without a lock; for one that is stale, half
        moved or unreadable, take its shard lock, read it again and act on what it says
        then (a heartbeat may have come in between)."""
        self._last_scan = now
        taken: list[str] = []
        synced: set[str] = set()
        for name in _entries(self._dirs["claimed"]):
            path = self._path("claimed", name)
            try:
                rec = _read_json(path)
            except FileNotFoundError:
                continue
            except ValueError:
                rec = None
            if rec is not None and not self._needs_action(rec, now):
                continue
            with self._lock.hold(self._shard(name[:-5])):
                self._act_on_claimed(path, name, now, taken, synced)
        self._sync(synced)
        return taken

    def _needs_action(self, rec: Record, now: float) -> bool:
        if rec.get("state") != "claimed" or not rec.get("claim"):
            return True
        return now - rec["claim"].get("heartbeat", float("-inf")) > self.config.stale_after

    def _act_on_claimed(self, path: str, name: str, now: float, taken: list[str],
                        synced: set[str]) -> None:
        """One claimed record, under its shard lock (see :meth:`_scan_claimed`)."""
        try:
            rec = _read_json(path)
        except FileNotFoundError:
            return
        except ValueError as exc:
            self._quarantine(path, exc)
            return
        state = rec.get("state")
        if state == "done":  # completer died between rewrite and rename
            self._move(path, self._path("done", name), synced)
        elif state == "failed":
            self._move(path, self._path("failed", name), synced)
        elif state == "pending" or not rec.get("claim"):
            self._to_pending(path, rec, synced)
        elif self._needs_action(rec, now):
            hb = rec["claim"].get("heartbeat", float("-inf"))
            who = rec["claim"].get("worker")
            reason = f"heartbeat stale for {now - hb:.0f} s (worker {who})"
            self._history(rec, now, "stale", reason=reason, holder=who)
            taken.append(rec["id"])
            if self.config.stale_is_failure:
                rec["failures"] += 1
                self._route_failure(path, rec, now, reason, synced)
            else:
                self._to_pending(path, rec, synced)
            log.warning("queue %s: reclaimed %s: %s", self.root, rec["id"], reason)

    def requeue_failed(self, task_ids: Iterable[str] | None = None) -> list[str]:
        """Move failed tasks (all, or ``task_ids``) back to pending with their failure count
        reset; each keeps the tier it had reached as its new base tier."""
        names = [f"{check_task_id(t)}.json" for t in task_ids] if task_ids is not None \
            else _entries(self._dirs["failed"])
        moved = []
        synced: set[str] = set()
        now = self.clock()
        for name in names:
            path = self._path("failed", name)
            with self._lock.hold(self._shard(name[:-5])):
                try:
                    rec = _read_json(path)
                except FileNotFoundError:
                    continue
                rec["base_tier"] = rec.get("tier", rec["base_tier"])
                rec["failures"] = 0
                rec.pop("reason", None)
                rec.pop("failed_at", None)
                self._history(rec, now, "requeue")
                self._to_pending(path, rec, synced)
            moved.append(rec["id"])
        self._sync(synced)
        return moved

    # ------------------------------------------------------------------ inspection
    def counts(self) -> dict[str, int]:
        """Number of tasks per state (directory listings only; no lock, no reads)."""
        return {s: len(_entries(d)) for s, d in self._dirs.items()}

    def counts_by_tier(self) -> dict[str, dict[int, int]]:
        """Tasks per state and tier. Pending comes from file names; the other states read
        every record, so this costs one read per task."""
        out: dict[str, dict[int, int]] = {s: {} for s in STATES}
        for name in _entries(self._dirs["pending"]):
            p = _parse_pending(name)
            if p:
                out["pending"][p[0]] = out["pending"].get(p[0], 0) + 1
        for s in ("claimed", "done", "failed"):
            for name in _entries(self._dirs[s]):
                try:
                    t = _read_json(self._path(s, name)).get("tier", 0)
                except (OSError, ValueError):
                    continue
                out[s][t] = out[s].get(t, 0) + 1
        return out

    def get(self, task_id: str) -> tuple[str, Record] | None:
        """``(state, record)`` of a task, or ``None`` if unknown."""
        check_task_id(task_id)
        for s in ("claimed", "done", "failed"):
            try:
                return s, _read_json(self._path(s, task_id + ".json"))
            except FileNotFoundError:
                pass
        for name in _entries(self._dirs["pending"]):
            p = _parse_pending(name)
            if p and p[3] == task_id:
                try:
                    return "pending", _read_json(self._path("pending", name))
                except FileNotFoundError:
                    return self.get(task_id)  # moved while we looked
        return None

    def results(self) -> Iterator[tuple[str, Any]]:
        """``(task_id, result)`` for every task in ``done/``."""
        for name in sorted(_entries(self._dirs["done"])):
            yield name[:-5], _read_json(self._path("done", name)).get("result")

    def check(self) -> list[str]:
        """Invariant check: each task id in exactly one state, records agree with their
        directory. Returns problems; empty means consistent. A record a crashed worker
        left half-moved in ``claimed/`` is reported until the next stale scan
        (:meth:`reclaim_stale`) finishes the move.

        One pass over the directories without locks finds suspects (an id seen in two
        listings, a record that disagrees or cannot be read); each suspect is then judged
        again under its shard lock, where it cannot move, so a task merely in flight
        between two listings is not reported while peers keep working."""
        problems: list[str] = []
        where: dict[str, list[str]] = {}
        suspects: set[str] = set()
        for s in STATES:
            for name in _entries(self._dirs[s]):
                if s == "pending":
                    p = _parse_pending(name)
                    if p is None:
                        problems.append(f"pending/{name}: bad name")
                        continue
                    task_id = p[3]
                else:
                    task_id = name[:-5]
                where.setdefault(task_id, []).append(s)
                if self._record_problem(s, name, task_id) is not None:
                    suspects.add(task_id)
        suspects.update(t for t, w in where.items() if len(w) > 1)
        for task_id in sorted(suspects):
            with self._lock.hold(self._shard(task_id)):
                places = [(s, task_id + ".json") for s in ("claimed", "done", "failed")
                          if os.path.lexists(self._path(s, task_id + ".json"))]
                places += [("pending", n) for n in _entries(self._dirs["pending"])
                           if (_parse_pending(n) or (0, 0, 0, None))[3] == task_id]
                places.sort(key=lambda sn: STATES.index(sn[0]))
                for s, name in places:
                    why = self._record_problem(s, name, task_id)
                    if why is not None:
                        problems.append(why)
                if len(places) > 1:
                    problems.append(f"{task_id}: in {[s for s, _ in places]}")
        return problems

    def _record_problem(self, state: str, name: str, task_id: str) -> str | None:
        try:
            rec = _read_json(self._path(state, name))
        except (OSError, ValueError) as exc:
            return f"{state}/{name}: {exc}"
        # a claim that died between rewriting a pending file and moving it leaves state
        # "claimed" in pending/: an ordinary pending task, so not a problem
        ok = rec.get("state") == state or (state == "pending" and rec.get("state") == "claimed")
        if not ok or rec.get("id") != task_id:
            return f"{state}/{name}: record says {rec.get('state')}/{rec.get('id')}"
        return None


def _read_json(path: str) -> Record:
    with open(path, "rb") as f:
        rec: Record = json.loads(f.read())
    return rec


def _temp_file(path: str, text: str, *, durable: bool) -> str:
    """Write ``text`` to a new hidden temp file beside ``path`` (fsynced if ``durable``);
    returns its name. Hidden names are ignored by every reader of the queue."""
    d, base = os.path.split(path)
    tmp = os.path.join(d, f".{base}.{uuid.uuid4().hex[:12]}.tmp")
    with open(tmp, "xb") as f:
        f.write(text.encode())
        if durable:
            f.flush()
            os.fsync(f.fileno())
    return tmp


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _write_text(path: str, text: str, *, durable: bool, sync_dir: bool = True) -> None:
    """Atomic replace: write a hidden temp file beside ``path``, then rename over it.

    ``durable``: fsync the file before the rename and (with ``sync_dir``) its directory
    after it, so the new content survives power loss once this returns.
    """
    tmp = _temp_file(path, text, durable=durable)
    try:
        os.replace(tmp, path)
    except BaseException:
        _unlink(tmp)
        raise
    if durable and sync_dir:
        _fsync_dir(os.path.dirname(path))


def _write_json(path: str, obj: Any, *, durable: bool, sync_dir: bool = True) -> None:
    _write_text(path, json.dumps(obj, separators=(",", ":")), durable=durable, sync_dir=sync_dir)


_DIR_FSYNC_UNSUPPORTED = frozenset(
    e for e in (getattr(errno, n, None) for n in ("EINVAL", "EOPNOTSUPP", "ENOTSUP", "EBADF"))
    if e is not None
)


def _fsync_dir(directory: str) -> None:
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
