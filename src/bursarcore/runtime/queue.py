"""A task queue on a shared filesystem: files, renames and short per-task locks; no
database, no service, no queue-wide lock (SPEC §13, after RASER §3).

``docs/runtime.md`` (section 1) describes it in full: the files of a queue ("On disk"),
each transition with its precondition, rewrite and rename ("Transitions"), the stale scan
and its lease mark, the claimers' choice of names ("Claims", "The shared listing"), and
which fsyncs ``durable=True`` takes and why each is needed ("Durability"). It guarantees,
as ``tests/runtime`` checks:

* Every task is in exactly one of the states ``pending claimed done failed`` at every
  instant: each state change is one atomic ``rename`` of the task's file inside its shard,
  made under its shard lock, which every writer of the task holds.
* No operation holds a lock for more than one task at a time, so tasks of different
  shards change in parallel and ``put_many`` blocks a claim for one task's write at most.
  A handle keeps no file descriptor open between calls.
* A claim is held by one worker at a time. Its heartbeat, completion, failure or release
  is accepted only while its token is the one in the claimed record; once a peer has
  reclaimed the task as stale, the old worker's calls return ``False``/``"lost"``. Only
  the current claim can complete, and the move out of ``claimed`` ends it: a result
  reaches ``done`` exactly once.
* A claim whose heartbeat is older than ``stale_after`` is reclaimed by any peer (by
  default as a failure); a task that failed ``max_failures`` times goes to ``failed`` with
  the reason. The scan skips unread only a record whose lease mark shows it within its
  lease: a marked time is never later than the heartbeat, so a record skipped is not stale.
* Crash consistency: a record says where it is going before it moves, so a worker that
  dies between the two leaves a record that the next stale scan moves on without counting
  anything twice; a worker that dies inside a section leaves no lock behind.
* With ``durable=True`` (default) a transition that returned survives power loss.

A queue of format 3 is opened, read and written in its own layout (not migrated), so
workers of the version that made it can share it; formats 1 and 2 are refused with
:class:`QueueError`. Time comes only from ``clock`` (float seconds, wall time shared by
all hosts), so tests drive it by hand; keep hosts' clocks within a small fraction of
``stale_after``.
"""

from __future__ import annotations

import json
import logging
import os
import random
import time
import uuid
from dataclasses import asdict
from typing import Any, Callable, Iterable

from ..errors import InvalidArgument
from . import _files
from ._config import (FORMAT, Claim, NotAQueue, QueueConfig, QueueError, check_task_id,
                      default_worker_id)
from ._files import Record
from ._inspect import Inspection
from ._recovery import Recovery
from ._shards import (DRAINED, FINISHED, LISTING, RELISTS, SHARDS_DIR, SHARE_AFTER, STATES,
                      ShardPicking,
                      finished_dir, parse_name, parse_pending, pending_name, pending_task_id,
                      shard_dir, shard_of, state_name)
from .locks import LockUnsupported, ShardLocks, fcntl_supported

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

HISTORY_LIMIT = 50
MAX_SEQ = 10**12
"""Submissions a queue takes in its life: ``seq`` is written with 12 digits, so that string
order is submission order (:mod:`._shards`)."""
_GEN_RESET = 1 << 20  # pending.gen is truncated once it reaches 1 MiB
_UNSET: Any = object()


def _lease(rec: Record) -> float | None:
    """The heartbeat a record about to be written carries as its lease mark: a claimed
    record's (see :meth:`TaskQueue._scan_claimed`); ``None`` for any other."""
    c = rec.get("claim")
    if rec.get("state") != "claimed" or not isinstance(c, dict):
        return None
    hb = c.get("heartbeat")
    return float(hb) if isinstance(hb, (int, float)) else None


def _read_bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


class TaskQueue(ShardPicking, Inspection, Recovery):
    """Open the queue at ``root`` (created by :meth:`create`).

    ``clock``: float seconds, shared meaning across hosts (default :func:`time.time`).
    ``worker``: this process's worker id in claims and history (default
    :func:`default_worker_id`); it also picks the handle's home shard. ``lock_timeout``:
    real seconds to wait for a shard lock before
    :class:`~bursarcore.runtime.locks.LockTimeout`. ``sleep``: the lock-file poll pause.
    A handle holds no open file between calls; :meth:`close` (or ``with``) ends it.
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
                cfg_mode = os.fstat(f.fileno()).st_mode
        except FileNotFoundError:
            raise NotAQueue(f"{self.root}: no queue.json (create the queue first)") from None
        except ValueError as exc:
            raise QueueError(f"{cfg_path}: {exc}") from None
        self.config = QueueConfig.from_json(data)
        self.format: int = data["format"]
        self.policy = self.config.policy
        n = self.config.lock_shards
        self._shard_dirs = [shard_dir(self.root, k) for k in range(n)]
        self._fin_dirs = [finished_dir(self.root, k, self.format) for k in range(n)]
        self._dirs = [(d,) if d == f else (d, f) for d, f in zip(self._shard_dirs, self._fin_dirs)]
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
        # a mount that shows every file executable would make every record look
        # lease-marked: then trust no mark (queue.json is created without the bit)
        self._marks = not cfg_mode & _files.LEASE_MARK
        self._home = shard_of(self.worker, n)
        self._drained = DRAINED if self.format >= 4 else RELISTS + 1
        self._crowd = 0
        self._claimed_seen = None
        self._listing = os.path.join(self.root, LISTING)
        self._shared_at = ""
        self._listed_at = float("-inf")
        self._pick_keys = {}  # worker tier -> pending file name -> key (see _candidates)
        self._cands = {}  # worker tier -> [pending.gen stamp, eligible names best last, call]
        self._calls = 0
        self._rng = random.Random()

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
        fmt = FORMAT
        if os.path.exists(cfg_path):
            with open(cfg_path, "rb") as f:
                data = json.loads(f.read())
            existing = QueueConfig.from_json(data)
            fmt = data["format"]
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
        if existing is not None and existing != config:
            raise QueueError(f"{root}: exists with other settings {existing} (wanted {config})")
        for d in ("ids", ".locks", SHARDS_DIR):
            os.makedirs(os.path.join(root, d), exist_ok=True)
        for k in range(config.lock_shards):
            os.makedirs(finished_dir(root, k, fmt), exist_ok=True)
            os.makedirs(shard_dir(root, k), exist_ok=True)
        if existing is None:
            if config.durable:  # the shard directories, and each one's finished/ entry
                for k in range(config.lock_shards):  # (a move into finished/ fsyncs
                    _files.fsync_dir(shard_dir(root, k))  # finished/ only)
                _files.fsync_dir(os.path.join(root, SHARDS_DIR))
            _files.write_json(cfg_path, config.to_json(), durable=config.durable)
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
    def _sdir(self, task_id: str) -> str:
        """The shard directory of ``task_id``."""
        return self._shard_dirs[shard_of(task_id, len(self._shard_dirs))]

    def _spath(self, state: str, task_id: str) -> str:
        """Path of ``task_id`` in ``claimed``, ``done`` or ``failed`` (the last two in its
        shard's finished directory)."""
        k = shard_of(task_id, len(self._shard_dirs))
        d = self._fin_dirs[k] if state in FINISHED else self._shard_dirs[k]
        return os.path.join(d, state_name(state, task_id))

    def _shard(self, task_id: str) -> str:
        """Name of the lock of ``task_id``'s shard; every change of that task holds it."""
        return str(shard_of(task_id, len(self._shard_dirs)))

    def _write(self, path: str, record: Record) -> None:
        """Atomically rewrite ``record`` at ``path``; the :meth:`_move` that follows at once
        syncs the directory."""
        _files.write_json(path, record, durable=self.config.durable, sync_dir=False)

    def _move(self, src: str, dst: str, synced: set[str]) -> None:
        """``rename(src, dst)`` inside one shard (its directory, or from it into its
        finished directory); adds the directory of ``dst`` to ``synced``, which the caller
        fsyncs (:meth:`_sync`) after leaving the shard lock and before returning. That one
        fsync is what makes the move durable: see "Durability" in docs/runtime.md
        (a move *out of* ``finished/`` is :meth:`_unfinish`)."""
        os.rename(src, dst)
        synced.add(os.path.dirname(dst))

    def _sync(self, dirs: Iterable[str]) -> None:
        """fsync ``dirs`` if durable: the moves made in them survive power loss. Done
        outside the shard lock: what a peer sees does not depend on it, only what a
        power loss keeps, and the call has not returned yet."""
        if self.config.durable:
            for d in sorted(dirs):
                _files.fsync_dir(d)

    def _bump(self) -> None:
        """Tell claimers that a task entered pending (they re-list): one appended byte,
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

    def _next_seq(self, n: int) -> int:
        """Reserve ``n`` submission numbers (under the ``seq`` lock, held for this only)."""
        path = os.path.join(self.root, "seq")
        with self._lock.hold("seq"):
            try:
                with open(path) as f:
                    first = int(f.read().strip() or 0)
            except FileNotFoundError:
                first = 0
            if first + n > MAX_SEQ:
                raise QueueError(f"{self.root}: a queue takes {MAX_SEQ:,} submissions in its "
                                 f"life (a pending name's seq has 12 digits); {first:,} were "
                                 f"made and {n:,} more were asked for")
            _files.write_text(path, f"{first + n}\n", durable=self.config.durable)
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
        uniqueness) and the record is renamed into its shard as pending. So claims go on
        during a long submission, and claimers see its first tasks before it ends. A
        marker without a task (a submitter died between the two steps) is found under the
        same lock and the task is put after all.
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
        first: dict[str, tuple[str, Any, int]] = {}
        for it in items:
            first.setdefault(it[0], it)  # the first of each id; a later duplicate is dropped
        items = list(first.values())
        if not items:
            return 0
        now = self.clock()
        seq = self._next_seq(len(items))
        durable = self.config.durable
        synced: set[str] = set()
        added = 0
        for k, (task_id, payload, tier) in enumerate(items):
            marker = os.path.join(self._ids, task_id)
            dst = os.path.join(self._sdir(task_id), pending_name(tier, 0, seq + k, task_id))
            rec = {"format": self.format, "id": task_id, "payload": payload, "seq": seq + k,
                   "base_tier": tier, "tier": tier, "failures": 0, "attempts": 0,
                   "state": "pending", "submitted_at": now, "claim": None, "resume": None,
                   "history": []}
            text = _files.dumps(rec)
            tmp = None
            if not os.path.lexists(marker):  # the common case: write before taking the lock
                tmp = _files.temp_file(dst, text, durable=durable)
            try:
                with self._lock.hold(self._shard(task_id)):
                    try:
                        os.close(os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
                    except FileExistsError:
                        if self._known_locked(task_id):
                            continue
                        log.warning("queue %s: id %s has a marker but no task (a submitter "
                                    "died); putting it", self.root, task_id)
                    if tmp is None:
                        tmp = _files.temp_file(dst, text, durable=durable)
                    os.replace(tmp, dst)
                    tmp = None
            finally:
                if tmp is not None:
                    _files.unlink(tmp)
            synced.add(os.path.dirname(dst))
            added += 1
            if added % 256 == 0:
                self._bump()  # let claimers start on the batch's head
        if added:
            self._sync({self._ids, *synced})
            self._bump()
        if added >= SHARE_AFTER:  # workers starting on the batch read one listing
            at = self.clock()
            stamp, raw = self._list_all()
            self._share(stamp, at, raw)
        return added

    def _known_locked(self, task_id: str) -> bool:
        """Is ``task_id`` in some state? Called under its shard lock, so it cannot move."""
        return any(p is not None and p[1] == task_id
                   for d in self._dirs[shard_of(task_id, len(self._dirs))]
                   for p in map(parse_name, _files.listdir(d)))

    # ------------------------------------------------------------------ work
    def claim(self, worker_tier: int = 0) -> Claim | None:
        """Claim the pending task this tier's worker prefers, or ``None`` if none is eligible.

        Reclaims stale claims (see :meth:`reclaim_stale`) first if ``scan_every`` seconds
        passed since this object last scanned, so a dead worker's task returns to pending
        within ``stale_after + scan_every`` while any worker keeps claiming; and, if that did
        not happen in this call, whenever no pending task is eligible, so a worker never
        returns ``None`` (and exits) while a stale claim it could take back is held. The
        scan reads every claimed record (at most as many as workers) without a lock, and
        takes a task's shard lock only to move it.
        """
        self.policy.check_tier(worker_tier, "worker_tier")
        now = self.clock()
        self._calls += 1
        scanned = now - self._last_scan >= self.config.scan_every
        seen: set[str] | None = None
        if scanned:  # one listing for both: the scan reads the claims it saw (a task it
            # moves to pending bumps the gen: the claim lists again)
            self._candidates(worker_tier, refresh=True, share_since=self._last_scan, now=now)
            paths = self._claimed_seen or []
            self._scan_claimed(now, paths)
            if self._cands[worker_tier][2] < 0:
                # the shared listing, made at _listed_at (within min(scan_every,
                # stale_after) of now): the scan covered the claims that existed then,
                # which include every claim stale now (claimed before its last
                # heartbeat, more than stale_after ago); a claim made since is scanned
                # when this handle's next scan is due, counted from then (never from
                # later than now: the writer's clock may run ahead of this one)
                self._last_scan = min(self._listed_at, now)
                seen = set(paths)
        while True:
            self._claimed_seen = None
            got: Claim | None = self._take_best(worker_tier, now)
            if got is not None or (scanned and seen is None):
                return got
            # the fresh listing that found nothing also listed the claims: scan those
            # (after a scan of the shared listing: those it did not have)
            paths = self._claimed_seen or []
            if seen is not None:
                paths = [p for p in paths if p not in seen]
                seen = None
                if not paths:
                    return None
            scanned = True
            self._scan_claimed(now, paths)

    def _change(self, task_id: str, src: str, edit: Callable[[Record], str | None], *,
                wait: bool = True, prepare: bool = True,
                instead: Callable[[], str | None] | None = None) -> tuple[Record, str] | str:
        """Rewrite the record at ``src`` with ``edit`` and move it to the path ``edit``
        returns (``src`` itself: rewrite in place), under the task's shard lock. Returns
        ``(record, destination)``, or ``"gone"`` (no file at ``src``), ``"raced"`` (the
        file went away while this call prepared its change: a peer was changing it at the
        same time), ``"busy"`` (the lock was held and ``wait=False``) or ``"lost"``
        (``edit`` returned ``None``: the
        record is not the caller's to change; a final verdict, since claim tokens are
        never reused).

        The new record is prepared first, outside the lock: read, edited, written to a
        temp file and (if durable) fsynced. Under the lock the source is read again; if its
        bytes changed meanwhile, it is edited again from what it says now. So the lock is
        held for one read, a comparison and the renames, never for an fsync. That suits
        changes by a claim's holder, which no peer contends for. ``prepare=False`` (claims,
        which peers do contend for) does it all under the lock instead: a peer that finds
        the lock busy moves on to another shard, and no fsync is spent on a name that a
        peer takes meanwhile. With ``prepare=False``, ``instead`` is asked, under the lock,
        for another file of the same shard to change when ``src`` is gone (a claimer that
        waited for the lock takes the shard's best name now rather than none)."""
        lock = self._shard(task_id)
        durable = self.config.durable
        raw = b""
        if prepare:
            try:
                raw = _read_bytes(src)
            except FileNotFoundError:
                return "gone"
        tmp = dst = None
        rec: Record | None = None
        try:
            rec = json.loads(raw) if prepare else None
        except ValueError:
            pass  # judged again under the lock
        try:
            if rec is not None:
                dst = edit(rec)
                if dst is None:
                    return "lost"
                tmp = _files.temp_file(src, _files.dumps(rec), durable=durable,
                                           lease=_lease(rec))
            with self._lock.hold(lock, wait=wait) as held:
                if not held:
                    return "busy"
                try:
                    now_raw = _read_bytes(src)
                except FileNotFoundError:
                    alt = None if prepare or instead is None else instead()
                    if alt is None:
                        return "raced" if prepare else "gone"
                    src = alt
                    try:
                        now_raw = _read_bytes(src)
                    except FileNotFoundError:
                        return "gone"
                if now_raw != raw or rec is None:
                    if tmp is not None:
                        _files.unlink(tmp)
                        tmp = None
                    try:
                        rec = json.loads(now_raw)
                    except ValueError as exc:  # only outside damage: every write is atomic
                        self._quarantine(src, exc)
                        return "gone"
                    dst = edit(rec)
                    if dst is None:
                        return "lost"
                    tmp = _files.temp_file(src, _files.dumps(rec), durable=durable,
                                           lease=_lease(rec))
                assert tmp is not None and dst is not None
                os.replace(tmp, src)
                tmp = None
                if dst != src:
                    os.rename(src, dst)
        finally:
            if tmp is not None:
                _files.unlink(tmp)
        assert rec is not None and dst is not None
        self._sync({os.path.dirname(dst)})  # the new name (docs/runtime.md, "Durability")
        if parse_pending(os.path.basename(dst)) is not None:
            self._bump()
        return rec, dst

    def _try_claim(self, name: str, worker_tier: int, now: float, *, wait: bool,
                   fallback: bool = False) -> Claim | str:
        """One attempt on pending file ``name``: a :class:`Claim`, ``"gone"`` (a peer
        took it since the listing) or ``"busy"`` (its shard lock was held;
        ``wait=False``). ``fallback``: if ``name`` is gone under the lock, claim the
        shard's best name then, if it is of ``name``'s class or a better one."""
        task_id = pending_task_id(name)
        sdir = self._sdir(task_id)
        src = os.path.join(sdir, name)
        if not os.path.lexists(src):
            return "gone"  # no lock needed to know
        token = uuid.uuid4().hex
        chosen = [task_id]

        def instead() -> str | None:  # under the lock: the shard's best name now, if
            alt = self._best_now(shard_of(task_id, len(self._shard_dirs)), worker_tier,
                                 name)  # it is of the class sought (or better)
            if alt is None:
                return None
            chosen[0] = pending_task_id(alt)
            return os.path.join(sdir, alt)

        def edit(rec: Record) -> str:
            dst = os.path.join(sdir, state_name("claimed", chosen[0]))
            rec["attempts"] = rec.get("attempts", 0) + 1
            rec["state"] = "claimed"
            rec["claim"] = {"worker": self.worker, "token": token, "worker_tier": worker_tier,
                            "claimed_at": now, "heartbeat": now}
            self._history(rec, now, "claim", worker_tier=worker_tier)
            return dst

        got = self._change(task_id, src, edit, wait=wait, prepare=False,
                           instead=instead if fallback else None)
        if isinstance(got, str):
            return got
        rec = got[0]
        return Claim(chosen[0], token, self.worker, worker_tier, rec["tier"], rec["payload"],
                     rec["failures"], rec["attempts"], rec.get("resume"), now)

    def _quarantine(self, path: str, exc: Exception) -> None:
        aside = os.path.join(self.root, "corrupt")
        os.makedirs(aside, exist_ok=True)
        os.rename(path, os.path.join(aside, os.path.basename(path)))
        log.error("queue %s: unreadable record %s (%s); moved to corrupt/", self.root, path, exc)

    def _change_own(self, claim: Claim, edit: Callable[[Record], str]) -> tuple[Record, str] | None:
        """:meth:`_change` of ``claim``'s record, if ``claim`` still holds it; ``None``
        (and ``claim.lost`` set) if it does not."""
        token = claim.token

        def own_edit(rec: Record) -> str | None:
            c = rec.get("claim")
            if rec.get("state") != "claimed" or not c or c.get("token") != token:
                return None
            return edit(rec)

        got = self._change(claim.task_id, self._spath("claimed", claim.task_id), own_edit)
        if isinstance(got, str):
            claim.lost = True
            return None
        return got

    def _pending_path(self, rec: Record) -> str:
        """Set ``rec`` up as pending; returns its pending path."""
        rec["state"] = "pending"
        rec["claim"] = None
        rec["tier"] = self.policy.tier_of(rec["base_tier"], rec["failures"])
        return os.path.join(self._sdir(rec["id"]),
                            pending_name(rec["tier"], rec["failures"], rec["seq"], rec["id"]))

    def heartbeat(self, claim: Claim, *, resume: Any = _UNSET) -> bool:
        """Refresh the claim's heartbeat (and optionally its ``resume`` data, e.g. the path
        of the newest checkpoint). ``False`` means the claim was lost: stop the task."""
        if resume is not _UNSET:
            json.dumps(resume)
        now = self.clock()
        path = self._spath("claimed", claim.task_id)

        def edit(rec: Record) -> str:
            rec["claim"]["heartbeat"] = now
            if resume is not _UNSET:
                rec["resume"] = resume
            return path

        if self._change_own(claim, edit) is None:
            return False
        if resume is not _UNSET:
            claim.resume = resume
        return True

    def complete(self, claim: Claim, result: Any = None) -> bool:
        """Record the result (state ``done``); ``False`` (and nothing written) if the claim
        was lost."""
        json.dumps(result)
        now = self.clock()
        dst = self._spath("done", claim.task_id)

        def edit(rec: Record) -> str:
            rec.update(state="done", result=result, completed_at=now, completed_by=self.worker)
            self._history(rec, now, "done")
            return dst

        return self._change_own(claim, edit) is not None

    def fail(self, claim: Claim, reason: str) -> str:
        """Count a failure: ``"retry"`` (back to pending, maybe a tier up), ``"failed"``
        (``max_failures`` reached; state ``failed`` with ``reason``) or ``"lost"``."""
        now = self.clock()

        def edit(rec: Record) -> str:
            rec["failures"] += 1
            self._history(rec, now, "fail", reason=str(reason))
            return self._failure_path(rec, now, str(reason))

        got = self._change_own(claim, edit)
        if got is None:
            return "lost"
        return "failed" if got[0]["state"] == "failed" else "retry"

    def _failure_path(self, rec: Record, now: float, reason: str) -> str:
        """After ``failures`` was incremented: set ``rec`` up to retry (pending) or give up
        (failed); returns its path."""
        if rec["failures"] >= self.config.max_failures:
            rec.update(state="failed", claim=None, reason=reason, failed_at=now)
            return self._spath("failed", rec["id"])
        return self._pending_path(rec)

    def release(self, claim: Claim, reason: str = "released", *, resume: Any = _UNSET) -> bool:
        """Give the task back without counting a failure (preemption, walltime, shutdown);
        ``resume`` is kept for the next claimer. ``False`` if the claim was lost."""
        if resume is not _UNSET:
            json.dumps(resume)
        now = self.clock()

        def edit(rec: Record) -> str:
            if resume is not _UNSET:
                rec["resume"] = resume
            self._history(rec, now, "release", reason=str(reason))
            return self._pending_path(rec)

        return self._change_own(claim, edit) is not None
