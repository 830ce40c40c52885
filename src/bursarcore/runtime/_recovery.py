"""The task queue's recovery (mixed into :class:`~bursarcore.runtime.queue.TaskQueue`):
the stale scan, which takes back the claims of workers that stopped heartbeating and
finishes the moves that a crashed worker left half done, and the requeue of failed tasks.

Each record is acted on under its shard lock, after being read again there, so a
heartbeat that came in meanwhile is honoured and no task is moved by two peers; nothing
is counted twice, whatever crash left the record where it is (docs/runtime.md, "Crash
consistency" and "Durability").
"""

from __future__ import annotations

import logging
import os
from typing import Any, Callable, Iterable

from . import _files
from ._config import check_task_id
from ._files import Record, read_json
from ._shards import FINISHED, parse_name

log = logging.getLogger("bursarcore.runtime.queue")


class Recovery:
    """Stale reclaim and requeue; every move under the task's shard lock, every directory
    it changed fsynced (if durable) before the call returns."""

    root: str
    clock: Callable[[], float]
    config: Any
    format: int
    _shard_dirs: list[str]
    _fin_dirs: list[str]
    _lock: Any
    _marks: bool
    """Whether a claimed record's lease mark is trusted on this mount."""
    _last_scan: float
    _spath: Callable[[str, str], str]
    _shard: Callable[[str], str]
    _write: Callable[[str, Record], None]
    _move: Callable[[str, str, set[str]], None]
    _sync: Callable[[Iterable[str]], None]
    _bump: Callable[[], None]
    _history: Callable[..., None]
    _pending_path: Callable[[Record], str]
    _failure_path: Callable[[Record, float, str], str]
    _quarantine: Callable[[str, Exception], None]

    def reclaim_stale(self) -> list[str]:
        """Move claims whose heartbeat is older than ``stale_after`` back to pending (or to
        ``failed``), and finish moves that a crashed worker left half done. Returns the
        ids of the stale claims taken."""
        return self._scan_claimed(self.clock())

    def _claimed_paths(self) -> list[str]:
        return [os.path.join(d, n) for d in self._shard_dirs for n in _files.listdir(d)
                if n.startswith("c.") and n.endswith(".json")]

    def _scan_claimed(self, now: float, paths: list[str] | None = None) -> list[str]:
        """Read every claimed record (of ``paths``, if a listing just taken gave them)
        without a lock; for one that is stale, half moved or unreadable, take its shard
        lock, read it again and act on what it says then (a heartbeat may have come in
        between)."""
        self._last_scan = now
        taken: list[str] = []
        synced: set[str] = set()
        marks = self._marks
        stale_after = self.config.stale_after
        for path in self._claimed_paths() if paths is None else paths:
            if marks:  # a lease-marked record still in its lease needs no read
                try:
                    hb = _files.lease_of(os.stat(path))
                except FileNotFoundError:
                    continue
                if hb is not None and now - hb <= stale_after:
                    continue
            try:
                rec = read_json(path)
            except FileNotFoundError:
                continue
            except ValueError:
                rec = None
            if rec is not None and not self._needs_action(rec, now):
                continue
            with self._lock.hold(self._shard(os.path.basename(path)[2:-5])):
                self._act_on_claimed(path, now, taken, synced)
        self._sync(synced)
        return taken

    def _needs_action(self, rec: Record, now: float) -> bool:
        if rec.get("state") != "claimed" or not rec.get("claim"):
            return True
        return bool(now - rec["claim"].get("heartbeat", float("-inf")) > self.config.stale_after)

    def _act_on_claimed(self, path: str, now: float, taken: list[str], synced: set[str]) -> None:
        """One claimed record, under its shard lock (see :meth:`_scan_claimed`)."""
        try:
            rec = read_json(path)
        except FileNotFoundError:
            return
        except ValueError as exc:
            self._quarantine(path, exc)
            return
        task_id = os.path.basename(path)[2:-5]
        state = rec.get("state")
        if self.format >= 4 and self._finished_exists(task_id):
            # a move into finished/ whose source directory was not yet on disk when the
            # power went (docs/runtime.md, "Durability"): the finished record is the
            # task's state
            _files.unlink(path)
            synced.add(os.path.dirname(path))
            log.warning("queue %s: dropped %s, left behind by a move into finished/ cut "
                        "short by a crash", self.root, os.path.basename(path))
        elif state in ("done", "failed"):  # the writer died between rewrite and rename
            self._move(path, self._spath(state, task_id), synced)
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

    def _finished_exists(self, task_id: str) -> bool:
        return any(os.path.lexists(self._spath(s, task_id)) for s in FINISHED)

    def _unfinish(self, path: str, rec: Record, synced: set[str]) -> None:
        """Under the shard lock: move the finished record at ``path`` (rewritten as
        pending) back to its shard as pending, in two steps so that a crash never leaves
        it both finished and pending (docs/runtime.md, "Durability"): to ``c.<id>.json`` first
        (a record that says ``pending`` on a claimed name, which a stale scan moves on),
        that name made durable, then the removal from ``finished/``, then the move to its
        pending name."""
        dst = self._pending_path(rec)
        mid = self._spath("claimed", rec["id"])
        self._write(path, rec)
        os.rename(path, mid)
        if self.config.durable:
            _files.fsync_dir(os.path.dirname(mid))  # 1: the claimed name is on disk,
            _files.fsync_dir(os.path.dirname(path))  # 2: then the finished one is gone
        self._move(mid, dst, synced)  # 3 (after the lock): the pending name
        self._bump()

    def requeue_failed(self, task_ids: Iterable[str] | None = None) -> list[str]:
        """Move failed tasks (all, or ``task_ids``) back to pending with their failure count
        reset; each keeps the tier it had reached as its new base tier."""
        if task_ids is not None:
            ids = [check_task_id(t) for t in task_ids]
        else:
            ids = sorted(p[1] for d in self._fin_dirs for p in map(parse_name, _files.listdir(d))
                         if p is not None and p[0] == "failed")
        moved = []
        synced: set[str] = set()
        now = self.clock()
        for task_id in ids:
            path = self._spath("failed", task_id)
            with self._lock.hold(self._shard(task_id)):
                try:
                    rec = read_json(path)
                except FileNotFoundError:
                    continue
                rec["base_tier"] = rec.get("tier", rec["base_tier"])
                rec["failures"] = 0
                rec.pop("reason", None)
                rec.pop("failed_at", None)
                self._history(rec, now, "requeue")
                if self.format >= 4:
                    self._unfinish(path, rec, synced)
                else:  # (format 3: one directory, whose fsync covers the move)
                    self._to_pending(path, rec, synced)
            moved.append(rec["id"])
        self._sync(synced)
        return moved

    def _to_pending(self, src: str, rec: Record, synced: set[str]) -> None:
        """Under the shard lock: rewrite ``src`` as a pending record, then move it to its
        pending name."""
        dst = self._pending_path(rec)
        self._write(src, rec)
        self._move(src, dst, synced)
        self._bump()

    def _route_failure(self, src: str, rec: Record, now: float, reason: str,
                       synced: set[str]) -> str:
        """Under the shard lock, after ``failures`` was incremented: retry (pending) or
        give up (failed)."""
        dst = self._failure_path(rec, now, reason)
        self._write(src, rec)
        self._move(src, dst, synced)
        if rec["state"] == "failed":
            return "failed"
        self._bump()
        return "retry"
