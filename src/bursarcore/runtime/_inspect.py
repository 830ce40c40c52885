"""Read-only views of the task queue: counts, records, results, the invariant check
(mixed into :class:`~bursarcore.runtime.queue.TaskQueue`)."""

from __future__ import annotations

import os
from typing import Any, Callable, Iterator

from . import _files
from ._config import check_task_id
from ._files import Record, read_json
from ._shards import FINISHED, FINISHED_DIR, STATES, parse_name, parse_pending, shard_of


class Inspection:
    """Counts, lookups and :meth:`check`; none of them changes anything."""

    root: str
    _shard_dirs: list[str]
    _dirs: list[tuple[str, ...]]
    """Per shard: its directory, and its finished directory if that is another one."""
    _lock: Any
    _sdir: Callable[[str], str]
    _spath: Callable[[str, str], str]
    _shard: Callable[[str], str]

    def _records(self) -> Iterator[tuple[str, str, str, str]]:
        """``(directory, file name, state, task id)`` of every record, shard by shard."""
        for dirs in self._dirs:
            for d in dirs:
                for name in _files.listdir(d):
                    p = parse_name(name)
                    if p is not None:
                        yield d, name, p[0], p[1]

    def counts(self) -> dict[str, int]:
        """Number of tasks per state (directory listings only; no lock, no reads)."""
        out = {s: 0 for s in STATES}
        for _, _, state, _ in self._records():
            out[state] += 1
        return out

    def counts_by_tier(self) -> dict[str, dict[int, int]]:
        """Tasks per state and tier. Pending comes from file names; the other states read
        every record, so this costs one read per task."""
        out: dict[str, dict[int, int]] = {s: {} for s in STATES}
        for d, name, state, _ in self._records():
            if state == "pending":
                t = (parse_pending(name) or (0,))[0]
            else:
                try:
                    t = read_json(os.path.join(d, name)).get("tier", 0)
                except (OSError, ValueError):
                    continue
            out[state][t] = out[state].get(t, 0) + 1
        return out

    def get(self, task_id: str) -> tuple[str, Record] | None:
        """``(state, record)`` of a task, or ``None`` if unknown."""
        check_task_id(task_id)
        for s in ("claimed", "done", "failed"):
            try:
                return s, read_json(self._spath(s, task_id))
            except FileNotFoundError:
                pass
        d = self._sdir(task_id)
        for name in _files.listdir(d):
            p = parse_pending(name)
            if p and p[3] == task_id:
                try:
                    return "pending", read_json(os.path.join(d, name))
                except FileNotFoundError:
                    return self.get(task_id)  # moved while we looked
        return None

    def claims(self) -> Iterator[Record]:
        """The record of every claimed task (read without locks: a snapshot, each record
        as it was when read)."""
        for d, name, state, _ in self._records():
            if state == "claimed":
                try:
                    yield read_json(os.path.join(d, name))
                except (FileNotFoundError, ValueError):
                    continue

    def results(self) -> Iterator[tuple[str, Any]]:
        """``(task_id, result)`` for every task in ``done``, in id order."""
        done = sorted((t, d, name) for d, name, s, t in self._records() if s == "done")
        for task_id, d, name in done:
            yield task_id, read_json(os.path.join(d, name)).get("result")

    def check(self) -> list[str]:
        """Invariant check: each task id in exactly one state, in its own shard, records
        agree with their names. Returns problems; empty means consistent. A record a
        crashed worker left half-moved in ``claimed`` is reported until the next stale scan
        (:meth:`reclaim_stale`) finishes the move.

        One pass over the shard directories without locks finds suspects (an id seen in
        two states, a record that disagrees or cannot be read); each suspect is then
        judged again under its shard lock, where it cannot move, so a task merely in
        flight between two listings is not reported while peers keep working."""
        problems: list[str] = []
        where: dict[str, list[str]] = {}
        suspects: set[str] = set()
        n = len(self._shard_dirs)
        for k, dirs in enumerate(self._dirs):
            for d in dirs:
                for name in _files.listdir(d):
                    if name.startswith(".") or (len(dirs) > 1 and d == dirs[0]
                                                and name == FINISHED_DIR):
                        continue
                    p = parse_name(name)
                    if p is None:
                        problems.append(f"{self._rel(d, name)}: bad name")
                        continue
                    state, task_id = p
                    if shard_of(task_id, n) != k:
                        problems.append(f"{self._rel(d, name)}: not in its shard "
                                        f"({shard_of(task_id, n)})")
                        continue
                    where.setdefault(task_id, []).append(state)
                    if self._record_problem(dirs, d, name, state, task_id) is not None:
                        suspects.add(task_id)
        suspects.update(t for t, w in where.items() if len(w) > 1)
        for task_id in sorted(suspects):
            k = shard_of(task_id, n)
            dirs = self._dirs[k]
            with self._lock.hold(self._shard(task_id)):
                places = sorted(((p[0], d, name) for d in dirs for name in _files.listdir(d)
                                 if (p := parse_name(name)) is not None and p[1] == task_id),
                                key=lambda sdn: STATES.index(sdn[0]))
                for s, d, name in places:
                    why = self._record_problem(dirs, d, name, s, task_id)
                    if why is not None:
                        problems.append(why)
                if len(places) > 1:
                    problems.append(f"{task_id}: in {[s for s, _, _ in places]}")
        return problems

    def _rel(self, d: str, name: str) -> str:
        return os.path.relpath(os.path.join(d, name), self.root).replace(os.sep, "/")

    def _record_problem(self, dirs: tuple[str, ...], d: str, name: str, state: str,
                        task_id: str) -> str | None:
        if len(dirs) > 1 and (d == dirs[-1]) != (state in FINISHED):
            return f"{self._rel(d, name)}: a {state} record in the wrong directory"
        try:
            rec = read_json(os.path.join(d, name))
        except (OSError, ValueError) as exc:
            return f"{self._rel(d, name)}: {exc}"
        # a claim that died between rewriting a pending file and moving it leaves state
        # "claimed" on a pending name: an ordinary pending task, so not a problem
        ok = rec.get("state") == state or (state == "pending" and rec.get("state") == "claimed")
        if not ok or rec.get("id") != task_id:
            return f"{self._rel(d, name)}: record says {rec.get('state')}/{rec.get('id')}"
        return None


__all__ = ["Inspection"]
