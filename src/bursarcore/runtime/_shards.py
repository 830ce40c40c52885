"""Shard directories of the task queue and how a claimer picks a pending task.

Format 3 layout: each task lives in one shard directory, ``<root>/shards/<k>/`` with
``k = crc32(task id) % lock_shards``, the same number as its shard lock. Its state is the
first letter of its file name::

    p.<tier>.<failures>.<seq>.<id>.json    pending (the name carries the claim order)
    c.<id>.json                            claimed
    d.<id>.json                            done
    f.<id>.json                            failed

A state change is a ``rename`` inside one directory: it takes only that directory's lock
in the kernel (a rename between two directories also takes the filesystem-wide rename
lock), it contends only with changes of the same shard, which hold the same shard lock
anyway, and a durable change fsyncs one directory.

Picking: a handle lists the shard directories and keeps the eligible pending names sorted
by preference (per worker tier), re-listing when ``pending.gen`` changed (a task was
added) or its list ran out. Alone, a claimer takes names in exact preference order. Once
it met a busy shard lock (a peer mid-change in that shard) it is in a crowd for the next
:data:`CROWD_CLAIMS` claims: it then takes, among the best names of the same preference
class (tier distance and failure count, so tiers and freshness keep their order; at most
``max(SPREAD, lock_shards)`` names), the one whose shard comes first from its *home* shard
(``crc32(worker id) % lock_shards``) onwards. Workers with different homes thus go to
different shards instead of chasing one name, and submission order is kept to within
about one name per concurrent claimer.
"""

from __future__ import annotations

import os
import random
import zlib
from typing import Any, Callable

from ._files import listdir
from .tiers import TierPolicy

STATES = ("pending", "claimed", "done", "failed")
PREFIX = {"pending": "p", "claimed": "c", "done": "d", "failed": "f"}
STATE_OF = {v: k for k, v in PREFIX.items()}
SHARDS_DIR = "shards"

SPREAD = 8
"""A claimer in a crowd chooses among at least this many of its best names."""
CROWD_CLAIMS = 64
"""Claims a handle stays in crowd mode after it last met a busy shard lock."""
MAX_PASSED = 4
"""Busy names a claim passes over before it waits for the best of them. Waiting sleeps;
trying ever more names keeps a crowd of claimers runnable, and on a machine with far fewer
cores than workers the kernel then preempts the holders of the directory locks that every
rename needs."""


def shard_of(task_id: str, shards: int) -> int:
    return zlib.crc32(task_id.encode()) % shards


def shard_dir(root: str, k: int) -> str:
    return os.path.join(root, SHARDS_DIR, str(k))


def pending_name(tier: int, failures: int, seq: int, task_id: str) -> str:
    return f"p.{tier}.{failures}.{seq:012d}.{task_id}.json"


def state_name(state: str, task_id: str) -> str:
    """File name of a task in ``claimed``, ``done`` or ``failed``."""
    return f"{PREFIX[state]}.{task_id}.json"


def parse_pending(name: str) -> tuple[int, int, int, str] | None:
    """``(tier, failures, seq, task_id)`` of a pending file name, else ``None``."""
    if not name.startswith("p.") or not name.endswith(".json"):
        return None
    parts = name[2:-5].split(".")
    if len(parts) != 4:
        return None
    try:
        return int(parts[0]), int(parts[1]), int(parts[2]), parts[3]
    except ValueError:
        return None


def parse_name(name: str) -> tuple[str, str] | None:
    """``(state, task_id)`` of a record's file name in a shard directory, else ``None``
    (temp files, markers, anything else)."""
    if len(name) < 8 or name[1] != "." or not name.endswith(".json"):
        return None
    state = STATE_OF.get(name[0])
    if state is None:
        return None
    if state == "pending":
        p = parse_pending(name)
        return None if p is None else (state, p[3])
    task_id = name[2:-5]
    return None if not task_id or "." in task_id else (state, task_id)


NOT_ELIGIBLE = (float("inf"),)
"""Preference key of a pending name a worker may not claim: above every real key."""


class PickKeys(dict[str, tuple[float, ...]]):
    """Pending file name -> ``(*preference key, shard)`` for one worker tier, parsed on
    first lookup (the shard breaks no tie: ``seq`` is unique)."""

    def __init__(self, policy: TierPolicy, worker_tier: int, shards: int) -> None:
        super().__init__()
        self.policy = policy
        self.worker_tier = worker_tier
        self.shards = shards

    def __missing__(self, name: str) -> tuple[float, ...]:
        p = parse_pending(name)
        pol, w = self.policy, self.worker_tier
        if p is None or not pol.eligible(w, p[0]):
            key: tuple[float, ...] = NOT_ELIGIBLE
        else:
            key = (*pol.preference(w, p[0], p[1], p[2]), shard_of(p[3], self.shards))
        self[name] = key
        return key


class ShardPicking:
    """The claimer's choice of pending names (mixed into :class:`~.queue.TaskQueue`)."""

    policy: TierPolicy
    _shard_dirs: list[str]
    _gen: str
    _home: int
    _crowd: int
    _rng: random.Random
    _pick_keys: dict[int, PickKeys]
    _cands: dict[int, list[Any]]
    _try_claim: Callable[..., Any]

    def _pending_names(self) -> list[str]:
        return [n for d in self._shard_dirs for n in listdir(d) if n.startswith("p.")]

    def _candidates(self, worker_tier: int, refresh: bool = False) -> list[str]:
        """Eligible pending names for ``worker_tier``, best last (so ``pop()`` is next).

        Re-lists the shards when ``pending.gen`` changed since the last listing (a task
        was added), when the list ran out, or on ``refresh``; otherwise the list from the
        last listing, from which names already taken are dropped as they are met. Each
        name is parsed once per object and worker tier (:class:`PickKeys`); keys of names
        no longer listed are dropped once they outnumber the listing.
        """
        try:
            st = os.stat(self._gen)
            stamp: Any = (st.st_size, st.st_mtime_ns, st.st_ino)
        except FileNotFoundError:
            stamp = None
        ent = self._cands.get(worker_tier)
        if ent is not None and ent[1] and ent[0] == stamp and not refresh:
            return ent[1]  # type: ignore[no-any-return]
        names = self._pending_names()
        keys = self._pick_keys.get(worker_tier)
        if keys is None or len(keys) > 2 * len(names) + 1024:
            keys = self._pick_keys[worker_tier] = PickKeys(self.policy, worker_tier,
                                                           len(self._shard_dirs))
        order = sorted(names, key=keys.__getitem__)
        cands = [n for n in reversed(order) if keys[n] is not NOT_ELIGIBLE]
        self._cands[worker_tier] = [stamp, cands]
        return cands

    def _pick(self, worker_tier: int) -> tuple[str, str] | None:
        """``(name, task_id)`` of the pending file a lone claimer of this tier would try
        first (the smallest preference key among eligible names still present), or
        ``None``. Takes nothing."""
        for refresh in (False, True):
            cands = self._candidates(worker_tier, refresh)
            while cands:
                name = cands[-1]
                k = int(self._pick_keys[worker_tier][name][-1])
                if os.path.lexists(os.path.join(self._shard_dirs[k], name)):
                    return name, name[2:-5].split(".")[3]
                cands.pop()
        return None

    def _choice(self, cands: list[str], worker_tier: int) -> int:
        """Index in ``cands`` of the name to try next: the best, or in a crowd the one of
        the best class whose shard is nearest from home onwards (module docstring)."""
        last = len(cands) - 1
        if self._crowd <= 0 or last < 1:
            return last
        keys = self._pick_keys[worker_tier]
        n = len(self._shard_dirs)
        best = keys[cands[last]]
        pick, dist = last, n
        for i in range(last, max(-1, last - max(SPREAD, n)), -1):
            k = keys[cands[i]]
            if k[0] != best[0] or k[1] != best[1]:
                break
            d = (int(k[-1]) - self._home) % n
            if d < dist:
                pick, dist = i, d
                if d == 0:
                    break
        return pick

    def _take_best(self, worker_tier: int, now: float) -> Any:
        """Try eligible names (see the module docstring): a :class:`~.queue.Claim`, or
        ``None`` only after a fresh listing offered nothing that could be taken. After
        :data:`MAX_PASSED` busy names it waits, asleep, for the best of those."""
        for refresh in (False, True):
            cands = self._candidates(worker_tier, refresh)
            while cands:
                busy: list[str] = []
                while cands and len(busy) < MAX_PASSED:
                    name = cands.pop(self._choice(cands, worker_tier))
                    got = self._try_claim(name, worker_tier, now, wait=False)
                    if isinstance(got, str):
                        if got == "busy":
                            busy.append(name)
                            self._crowd = CROWD_CLAIMS
                        continue
                    self._restore(cands, busy, worker_tier)
                    self._crowd -= 1
                    return got
                busy.sort(key=self._pick_keys[worker_tier].__getitem__)
                for k, name in enumerate(busy):
                    got = self._try_claim(name, worker_tier, now, wait=True)
                    if not isinstance(got, str):
                        self._restore(cands, busy[k + 1:], worker_tier)
                        self._crowd -= 1
                        return got
        return None

    def _restore(self, cands: list[str], names: list[str], worker_tier: int) -> None:
        """Put names passed over (busy, not taken) back among ``cands``, best last."""
        if names:
            cands.extend(names)
            cands.sort(key=self._pick_keys[worker_tier].__getitem__, reverse=True)
