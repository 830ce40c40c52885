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

Picking: a handle lists the shard directories and keeps, per shard, the eligible pending
names sorted by preference (per worker tier); it re-lists every shard when ``pending.gen``
changed (a task was added) or its lists ran out; it drops a name found taken by a peer,
and re-lists that shard alone (a small listing) when the next name there is taken too.
Alone, a claimer takes the best head of all shards: exact preference order. Once it met
a busy shard lock, or two names in a row taken from one shard (both mean peers claiming
at the same time), it is in a crowd for the next :data:`CROWD_CLAIMS` claims: it then
takes the best name of its *home* shard (``crc32(worker id) % lock_shards``) if that
shard has one of the best class (tier distance and failure count, so tiers and freshness
keep their order), else of the next shard onwards that has (stealing). Workers with
different homes thus work in different shards, each in submission order, instead of
chasing one name; between shards, a crowd does not keep submission order.
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

CROWD_CLAIMS = 64
"""Claims a handle stays in crowd mode after it last met a busy shard lock."""
MAX_PASSED = 16
"""Busy shards a claim passes over (one non-blocking lock attempt each) before it waits
for the best of them. Waiting sleeps; trying ever more shards keeps a crowd of claimers
runnable, which on a machine with far fewer cores than workers preempts the holders."""


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
    _claimed_seen: list[str] | None
    """Claimed records seen by the last full listing (for the stale scan that follows a
    claim which found nothing)."""
    _try_claim: Callable[..., Any]

    def _pending_names(self) -> list[str]:
        return [n for d in self._shard_dirs for n in listdir(d) if n.startswith("p.")]

    def _keys(self, worker_tier: int, listed: int) -> PickKeys:
        keys = self._pick_keys.get(worker_tier)
        if keys is None or len(keys) > 2 * listed + 1024:  # drop names no longer listed
            keys = self._pick_keys[worker_tier] = PickKeys(self.policy, worker_tier,
                                                           len(self._shard_dirs))
        return keys

    def _eligible(self, names: list[str], keys: PickKeys) -> list[str]:
        """Eligible names, best last (ties, between names that are not records, go to
        the first listed)."""
        order = sorted(names, key=keys.__getitem__)
        return [n for n in reversed(order) if keys[n] is not NOT_ELIGIBLE]

    def _candidates(self, worker_tier: int, refresh: bool = False) -> list[list[str]]:
        """Per shard, the eligible pending names for ``worker_tier``, best last.

        Re-lists every shard when ``pending.gen`` changed since the last listing (a task
        was added), when every list ran out, or on ``refresh``; otherwise the lists from
        the last listing, from which names already taken are dropped as they are met.
        Each name is parsed once per object and worker tier
        (:class:`PickKeys`); keys of names no longer listed are dropped once they
        outnumber the listing.
        """
        try:
            st = os.stat(self._gen)
            stamp: Any = (st.st_size, st.st_mtime_ns, st.st_ino)
        except FileNotFoundError:
            stamp = None
        ent = self._cands.get(worker_tier)
        if ent is not None and ent[0] == stamp and not refresh and any(ent[1]):
            return ent[1]
        raw = [listdir(d) for d in self._shard_dirs]
        listed = [[n for n in names if n.startswith("p.")] for names in raw]
        self._claimed_seen = [os.path.join(d, n) for d, names in zip(self._shard_dirs, raw)
                              for n in names if n.startswith("c.") and n.endswith(".json")]
        keys = self._keys(worker_tier, sum(map(len, listed)))
        shards = [self._eligible(names, keys) for names in listed]
        self._cands[worker_tier] = [stamp, shards]
        return shards

    def _relist(self, worker_tier: int, shards: list[list[str]], k: int) -> None:
        """Refresh shard ``k``'s list from its directory (one small listing)."""
        names = [n for n in listdir(self._shard_dirs[k]) if n.startswith("p.")]
        shards[k] = self._eligible(names, self._pick_keys[worker_tier])

    def _heads(self, worker_tier: int, shards: list[list[str]],
               skip: set[int]) -> list[tuple[tuple[float, ...], int]]:
        keys = self._pick_keys[worker_tier]
        return sorted((keys[lst[-1]], k) for k, lst in enumerate(shards) if lst and k not in skip)

    def _choice(self, heads: list[tuple[tuple[float, ...], int]]) -> int:
        """The shard to take from next: the one with the best head, or in a crowd, among
        the shards whose head is of the best class, the first from home onwards (module
        docstring)."""
        if self._crowd <= 0 or len(heads) < 2:
            return heads[0][1]
        best = heads[0][0]
        n = len(self._shard_dirs)
        return min((k for key, k in heads if key[0] == best[0] and key[1] == best[1]),
                   key=lambda k: (k - self._home) % n)

    def _pick(self, worker_tier: int) -> tuple[str, str] | None:
        """``(name, task_id)`` of the pending file a lone claimer of this tier would try
        first (the smallest preference key among eligible names still present), or
        ``None``. Takes nothing."""
        for refresh in (False, True):
            shards = self._candidates(worker_tier, refresh)
            while True:
                heads = self._heads(worker_tier, shards, set())
                if not heads:
                    break
                k = heads[0][1]
                name = shards[k][-1]
                if os.path.lexists(os.path.join(self._shard_dirs[k], name)):
                    return name, name[2:-5].split(".")[3]
                shards[k].pop()
        return None

    def _take_best(self, worker_tier: int, now: float) -> Any:
        """Try eligible names (see the module docstring): a :class:`~.queue.Claim`, or
        ``None`` only after a fresh listing offered nothing that could be taken.

        A name found taken is dropped; a second one in a row from the same shard re-lists
        that shard. A busy shard is passed over for the rest of the call; after :data:`MAX_PASSED` busy ones the claimer waits, asleep, for the
        best of those (holders keep a shard lock for a few system calls only)."""
        for refresh in (False, True):
            shards = self._candidates(worker_tier, refresh)
            busy: list[int] = []
            gone_in = -1
            while True:
                heads = self._heads(worker_tier, shards, set(busy)) if len(busy) < MAX_PASSED else []
                if not heads:
                    if not busy:
                        break
                    k = min(busy, key=lambda b: self._pick_keys[worker_tier][shards[b][-1]]
                            if shards[b] else NOT_ELIGIBLE)
                    busy.remove(k)
                    wait = True
                else:
                    k = self._choice(heads)
                    wait = False
                if not shards[k]:
                    continue
                name = shards[k][-1]
                got = self._try_claim(name, worker_tier, now, wait=wait)
                if got == "busy":
                    busy.append(k)
                    self._crowd = CROWD_CLAIMS
                elif got == "gone":
                    shards[k].pop()
                    if gone_in == k:  # a second name in a row taken from this shard:
                        self._relist(worker_tier, shards, k)  # peers drain it, look again
                        self._crowd = CROWD_CLAIMS
                    gone_in = k
                else:
                    shards[k].pop()
                    self._crowd -= 1
                    return got
        return None
