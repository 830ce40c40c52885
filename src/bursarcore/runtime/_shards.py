"""Shard directories of the task queue and how a claimer picks a pending task.

Format 4 layout: each task lives in one shard, ``<root>/shards/<k>/`` with
``k = crc32(task id) % lock_shards``, the same number as its shard lock; pending and
claimed in the shard directory, done and failed in its ``finished/`` subdirectory. Its
state is the first letter of its file name::

    p.<tier>.<failures>.<seq>.<id>.json    pending (the name carries the claim order)
    c.<id>.json                            claimed
    finished/d.<id>.json                   done
    finished/f.<id>.json                   failed

A claim, heartbeat, release or retry is a ``rename`` inside one directory: it takes only
that directory's lock in the kernel (a rename between two directories also takes the
filesystem-wide rename lock), it contends only with changes of the same shard, which hold
the same shard lock anyway, and a durable change fsyncs one directory. Moves into and out
of ``finished/`` (completion, final failure, requeue) cross to the subdirectory, so that a
claimer's listing of a shard holds what is left to do, never what was done. Format 3
queues keep finished records in the shard directory (:func:`finished_dir`).

Picking: a handle lists the shard directories and keeps, per shard, the eligible pending
names sorted by preference for each worker tier: the listing is sorted as strings (in C),
which puts each class (one tier, one failure count: the ``p.<tier>.<failures>.`` prefix)
in one run and, since ``seq`` is written with 12 digits (a queue takes 10**12 tasks), each
run in submission order; the runs are then ordered by the tier policy. So no name is
parsed to be listed; a name is parsed (once per handle and tier, :class:`PickKeys`) only
when it comes to the head of its shard's list, and a malformed one is dropped there. The
handle re-lists every shard when ``pending.gen`` changed (a task was added) or its lists
ran out (unless it listed them in this claim); it drops a name found taken by a peer, and
re-lists that shard alone (a small listing) when a second name there is found taken in
one claim. Instead of listing every shard itself, a handle takes the shared listing
(:data:`LISTING`) when it was made at the current ``pending.gen``
(:meth:`ShardPicking._candidates`).

Alone, a claimer takes the best head of all shards: exact preference order. Once it met a
busy shard lock, or two names taken from one shard (both mean peers claiming at the same
time), it is in a crowd for the next :data:`CROWD_CLAIMS` claims: it then takes the best
name of its *home* shard (``crc32(worker id) % lock_shards``) if that shard has one of the
best class (tier distance and failure count, so tiers and freshness keep their order),
else of the next shard onwards that has (stealing). In a crowd, a shard is re-listed
before a claim's first try there (peers drain every shard, and one small listing costs
less than following the names they took), a name found taken is followed by the next name
of the same shard, and a claimer that finds its name taken under the shard lock (or that
waited for the lock) takes the shard's best name at that moment if it is of the class it
sought or a better one (:meth:`ShardPicking._best_now`). A claim re-lists at most
:data:`RELISTS` shards (so a name that is "gone" at every try, such as a dangling link,
cannot keep it going), and (format 4) once :data:`DRAINED` of its re-listings found a shard
empty it lists every shard at once instead (the queue is running dry). Workers with
different homes thus work in different shards, each in submission order, instead of
chasing one name; between shards, a crowd does not keep submission order.
"""

from __future__ import annotations

import os
import random
import zlib
from bisect import bisect_left
from typing import Any, Callable

from ._files import listdir, write_text
from .tiers import TierPolicy

STATES = ("pending", "claimed", "done", "failed")
PREFIX = {"pending": "p", "claimed": "c", "done": "d", "failed": "f"}
STATE_OF = {v: k for k, v in PREFIX.items()}
SHARDS_DIR = "shards"
FINISHED_DIR = "finished"
"""Subdirectory of a shard directory that holds its ``done`` and ``failed`` records
(format 4), so that a claimer's listing of the shard holds pending and claimed ones only."""
FINISHED = ("done", "failed")

CROWD_CLAIMS = 64
"""Claims a handle stays in crowd mode after it last met a busy shard lock."""
RELISTS = 144
"""Shard listings one claim makes at most, beyond a listing of every shard (twice the
default shard count, and some): then it only drops names."""
DRAINED = 8
"""Shards a claim re-lists one by one and finds without an eligible name before it lists
every shard at once instead (a queue running dry: the full listing, which a claim that
finds nothing makes anyway, then replaces the remaining shard-by-shard listings). Format 4
only: in format 3 a full listing holds every finished record too, and costs more than the
listings it would replace."""
LISTING = "pending.list"
"""The shared listing, in the queue's root: the pending and claimed names of every shard as
one full listing found them, headed by the ``pending.gen`` stamp read before it and the
clock time it was made. A handle that finds it made at the current stamp takes it instead
of listing every directory (:meth:`ShardPicking._candidates`), so a crowd of workers that
start at once, or that all see a task added, reads one file instead of each listing every
shard. A hint: whatever it says, a name is claimed only after it is found under its shard
lock."""
LISTING_MAGIC = "bursar-listing-1"
SHARE_AFTER = 64
"""``put_many`` writes the shared listing after adding at least this many tasks."""
MAX_PASSED = 16
"""Busy shards a claim passes over (one non-blocking lock attempt each) before it waits
for the best of them. Waiting sleeps; trying ever more shards keeps a crowd of claimers
runnable, which on a machine with far fewer cores than workers preempts the holders."""


def shard_of(task_id: str, shards: int) -> int:
    return zlib.crc32(task_id.encode()) % shards


def shard_dir(root: str, k: int) -> str:
    return os.path.join(root, SHARDS_DIR, str(k))


def finished_dir(root: str, k: int, fmt: int) -> str:
    """Directory of shard ``k``'s finished records: its ``finished/`` subdirectory (format
    4), or the shard directory itself (format 3)."""
    return os.path.join(shard_dir(root, k), FINISHED_DIR) if fmt >= 4 else shard_dir(root, k)


def pending_name(tier: int, failures: int, seq: int, task_id: str) -> str:
    return f"p.{tier}.{failures}.{seq:012d}.{task_id}.json"


def state_name(state: str, task_id: str) -> str:
    """File name of a task in ``claimed``, ``done`` or ``failed``."""
    return f"{PREFIX[state]}.{task_id}.json"


def parse_pending(name: str) -> tuple[int, int, int, str] | None:
    """``(tier, failures, seq, task_id)`` of a pending file name, else ``None``: only a
    name :func:`pending_name` writes (no sign, no extra zero, 12-digit ``seq``) is one."""
    if not name.startswith("p.") or not name.endswith(".json"):
        return None
    parts = name[2:-5].split(".")
    if len(parts) != 4 or not parts[3]:
        return None
    try:
        tier, failures, seq = int(parts[0]), int(parts[1]), int(parts[2])
    except ValueError:
        return None
    if pending_name(tier, failures, seq, parts[3]) != name:
        return None
    return tier, failures, seq, parts[3]


def pending_task_id(name: str) -> str:
    """The task id of a pending file name already known to be one (no checks)."""
    return name[2:-5].split(".")[3]


def class_of(name: str) -> tuple[int, int, str] | None:
    """``(tier, failures, prefix)`` of a name that starts ``p.<tier>.<failures>.`` (the
    prefix), written as :func:`pending_name` writes them, else ``None``. The rest of the
    name is judged when it is parsed (:func:`parse_pending`)."""
    a = name.find(".", 2)
    b = name.find(".", a + 1) if a > 2 else -1
    if b < 0:
        return None
    t, f = name[2:a], name[a + 1:b]
    try:
        tier, failures = int(t), int(f)
    except ValueError:
        return None
    if str(tier) != t or str(failures) != f:
        return None
    return tier, failures, name[:b + 1]


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


Key = tuple[tuple[float, ...], int]
"""``(class preference, seq)``: see :meth:`~.tiers.TierPolicy.class_preference`."""


NOT_ELIGIBLE: Key = ((float("inf"),), 0)
"""Preference key of a name that is not a well-formed pending record name: above every
real key."""


class PickKeys(dict[str, Key]):
    """Pending file name -> ``(class preference, seq)`` for one worker tier, parsed on
    first lookup (:data:`NOT_ELIGIBLE` for a malformed name or an ineligible tier)."""

    def __init__(self, policy: TierPolicy, worker_tier: int) -> None:
        super().__init__()
        self.policy = policy
        self.worker_tier = worker_tier

    def __missing__(self, name: str) -> Key:
        p = parse_pending(name)
        pol, w = self.policy, self.worker_tier
        if p is None or not pol.eligible(w, p[0]):
            key: Key = NOT_ELIGIBLE
        else:
            key = (pol.class_preference(w, p[0], p[1]), p[2])
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
    _calls: int
    """Claims this handle made (a listing remembers the claim that made it)."""
    _drained: int
    """:data:`DRAINED`, or (format 3) more re-listings than a claim makes: never."""
    _claimed_seen: list[str] | None
    """Claimed records seen by the last full listing (for the stale scan that follows a
    claim which found nothing)."""
    _try_claim: Callable[..., Any]
    config: Any
    clock: Callable[[], float]
    _listing: str
    _shared_at: str
    """The ``pending.gen`` stamp of the shared listing this handle last wrote or took
    (``""``: none)."""
    _listed_at: float

    def _pending_names(self) -> list[str]:
        return [n for d in self._shard_dirs for n in listdir(d) if n.startswith("p.")]

    def _keys(self, worker_tier: int, listed: int) -> PickKeys:
        keys = self._pick_keys.get(worker_tier)
        if keys is None or len(keys) > 2 * listed + 1024:  # drop names no longer listed
            keys = self._pick_keys[worker_tier] = PickKeys(self.policy, worker_tier)
        return keys

    def _eligible(self, names: list[str], worker_tier: int) -> list[str]:
        """The eligible pending names of one shard's listing (``names``, sorted), best
        last: cut into its class runs (module docstring), the runs in the tier policy's
        order. Names of a run are not parsed here."""
        lo = bisect_left(names, "p.")
        hi = bisect_left(names, "p/", lo)
        pol = self.policy
        runs = []
        i = lo
        while i < hi:
            cls = class_of(names[i])
            if cls is None:
                i += 1
                continue
            tier, failures, prefix = cls
            j = bisect_left(names, prefix[:-1] + "/", i + 1, hi)  # "/" follows "."
            if pol.eligible(worker_tier, tier):
                runs.append((pol.class_preference(worker_tier, tier, failures), i, j))
            i = j
        if len(runs) == 1:  # (the common case: one class in the shard)
            out = names[runs[0][1]:runs[0][2]]
            out.reverse()
            return out
        runs.sort(reverse=True)  # worst class first
        out = []
        for _, i, j in runs:
            run = names[i:j]
            run.reverse()
            out += run
        return out

    def _stamp(self) -> str:
        """The state of ``pending.gen`` (size, modification time, inode): it changes
        whenever a task enters pending."""
        try:
            st = os.stat(self._gen)
        except FileNotFoundError:
            return "-"
        return f"{st.st_size}:{st.st_mtime_ns}:{st.st_ino}"

    def _list_all(self) -> tuple[str, list[list[str]]]:
        """``(stamp, listing)``: every shard directory's names, sorted, with the stamp of
        ``pending.gen`` read *before* listing (so a task added since has changed it)."""
        stamp = self._stamp()
        return stamp, [sorted(listdir(d)) for d in self._shard_dirs]

    def _share(self, stamp: str, at: float, raw: list[list[str]]) -> None:
        """Write the shared listing (:data:`LISTING`) from a full listing made at clock
        time ``at`` (or later) with ``stamp``, unless ``pending.gen`` moved on meanwhile
        (it would be out of date at once). Its pending and claimed names only; a hint,
        written atomically, never fsynced."""
        if self._stamp() != stamp:
            return
        lines = [f"{LISTING_MAGIC} {stamp} {at!r} {len(raw)}"]
        for names in raw:
            line = "/".join(names[bisect_left(names, "c."):bisect_left(names, "c/")]
                            + names[bisect_left(names, "p."):bisect_left(names, "p/")])
            if "\n" in line:  # (a stray name; no name the queue writes has one)
                line = "/".join(n for n in line.split("/") if "\n" not in n)
            lines.append(line)
        try:
            write_text(self._listing, "\n".join(lines), durable=False)
        except OSError:
            return  # a hint: claimers list the directories themselves
        self._shared_at = stamp

    def _shared(self, stamp: str) -> tuple[float, list[list[str]]] | None:
        """``(at, listing)`` from the shared listing if it was made at ``stamp`` (no task
        entered pending since: every pending name is in it, and names it lists may have
        been taken since), else ``None``."""
        try:
            with open(self._listing, "rb") as f:
                text = f.read().decode()
        except (OSError, UnicodeDecodeError):
            return None
        lines = text.split("\n")
        head = lines[0].split(" ")
        n = len(self._shard_dirs)
        if (len(head) != 4 or head[0] != LISTING_MAGIC or head[1] != stamp
                or head[3] != str(n) or len(lines) != n + 1):
            return None
        try:
            at = float(head[2])
        except ValueError:
            return None
        return at, [line.split("/") if line else [] for line in lines[1:]]

    def _candidates(self, worker_tier: int, refresh: bool = False,
                    share_since: float | None = None, now: float | None = None
                    ) -> list[list[str]]:
        """Per shard, the eligible pending names for ``worker_tier``, best last.

        Re-lists every shard when ``pending.gen`` changed since the last listing (a task
        was added), when every list ran out (unless listed in this claim), or on
        ``refresh``; otherwise the lists from the last listing, from which names already
        taken are dropped as they are met.

        Instead of listing every directory, a handle takes the shared listing
        (:data:`LISTING`) when it was made at the current ``pending.gen``: when that
        changed (not ``refresh``), or on ``refresh`` with ``share_since`` if the shared
        listing was made after ``share_since`` and less than ``min(scan_every,
        stale_after)`` before ``now`` (the periodic scan of a claim: see
        :meth:`~.queue.TaskQueue.claim`). Lists taken over count as listed before this
        claim (a claim returns ``None`` only after listing the directories itself).
        ``self._listed_at`` is the clock time of the listing the lists come from (``now``
        for a listing of the directories).
        """
        stamp = self._stamp()
        ent = self._cands.get(worker_tier)
        if (ent is not None and ent[0] == stamp and not refresh
                and (ent[2] == self._calls or any(ent[1]))):
            return ent[1]
        calls = self._calls
        got = None
        cfg = self.config
        if (refresh and stamp == self._shared_at) or (ent is not None and ent[0] == stamp
                                                      and not refresh):
            pass  # the shared listing is no newer than this handle's own
        elif share_since is not None or not refresh:
            got = self._shared(stamp)
            if got is not None and share_since is not None and not (
                    share_since < got[0] and (now if now is not None else self.clock())
                    - got[0] < min(cfg.scan_every, cfg.stale_after)):
                got = None
        if got is not None:
            self._listed_at, raw = got
            self._shared_at = stamp
            calls = -1
        else:
            at = now if now is not None else self.clock()
            stamp, raw = self._list_all()
            self._listed_at = at
            if stamp != self._shared_at:
                self._share(stamp, at, raw)
        self._claimed_seen = [os.path.join(d, n) for d, names in zip(self._shard_dirs, raw)
                              for n in names[bisect_left(names, "c."):bisect_left(names, "c/")]
                              if n.endswith(".json")]
        shards = [self._eligible(names, worker_tier) for names in raw]
        self._keys(worker_tier, sum(map(len, shards)))
        self._cands[worker_tier] = [stamp, shards, calls]
        return shards

    def _relist(self, worker_tier: int, shards: list[list[str]], k: int) -> None:
        """Refresh shard ``k``'s list from its directory (one small listing)."""
        shards[k] = self._eligible(sorted(listdir(self._shard_dirs[k])), worker_tier)

    def _best_now(self, k: int, worker_tier: int, sought: str) -> str | None:
        """Under shard ``k``'s lock, after the name ``sought`` was found taken: re-list
        the shard and return its best name if that is of ``sought``'s class or better
        (else ``None``). The handle's list of the shard is the new listing."""
        keys = self._pick_keys[worker_tier]
        shards = self._cands[worker_tier][1]
        self._relist(worker_tier, shards, k)
        lst = shards[k]
        n = len(self._shard_dirs)
        while (key := self._head(lst, keys)) is not NOT_ELIGIBLE:
            if shard_of(pending_task_id(lst[-1]), n) == k:
                return lst[-1] if key[0] <= keys[sought][0] else None
            lst.pop()  # a record in another shard's directory (outside damage): not one
        return None

    @staticmethod
    def _head(lst: list[str], keys: PickKeys) -> Key:
        """Key of the best name of one shard's list, dropping malformed names from its
        end; :data:`NOT_ELIGIBLE` once the list is empty."""
        while lst:
            key = keys[lst[-1]]
            if key is not NOT_ELIGIBLE:
                return key
            lst.pop()
        return NOT_ELIGIBLE

    def _best(self, worker_tier: int, shards: list[list[str]],
              skip: list[int]) -> tuple[int, Key]:
        """The shard whose head is best of all but ``skip`` (``-1`` if none), and that key."""
        keys = self._pick_keys[worker_tier]
        best_k, best = -1, NOT_ELIGIBLE
        for k, lst in enumerate(shards):
            if lst and k not in skip:
                key = keys[lst[-1]]
                if key is NOT_ELIGIBLE:  # (the common case without a call)
                    key = self._head(lst, keys)
                if key < best:
                    best_k, best = k, key
        return best_k, best

    def _choice(self, worker_tier: int, shards: list[list[str]], skip: list[int]) -> int:
        """The shard to take from next (``-1``: none): the one with the best head, or in
        a crowd, the first from home onwards whose head is of the best class (module
        docstring)."""
        k, best = self._best(worker_tier, shards, skip)
        if self._crowd <= 0 or k < 0:
            return k
        keys = self._pick_keys[worker_tier]
        n = len(shards)
        home = self._home
        for j in (*range(home, n), *range(home)):
            lst = shards[j]
            if lst and j not in skip and keys[lst[-1]][0] == best[0]:
                return j
        return k

    def _pick(self, worker_tier: int) -> tuple[str, str] | None:
        """``(name, task_id)`` of the pending file a lone claimer of this tier would try
        first (the smallest preference key among eligible names still present), or
        ``None``. Takes nothing."""
        for refresh in (False, True):
            shards = self._candidates(worker_tier, refresh)
            while True:
                k, _ = self._best(worker_tier, shards, [])
                if k < 0:
                    break
                name = shards[k][-1]
                if os.path.lexists(os.path.join(self._shard_dirs[k], name)):
                    return name, pending_task_id(name)
                shards[k].pop()
        return None

    def _take_best(self, worker_tier: int, now: float) -> Any:
        """Try eligible names (see the module docstring): a :class:`~.queue.Claim`, or
        ``None`` only after a listing made in this call offered nothing that could be
        taken.

        A name found taken is dropped; a second one in one call from the same shard
        re-lists that shard (one small listing), so a claimer whose listing went stale
        while it waited for a processor follows at most two stale names per shard. In a
        crowd, the next name of the shard where a name was found taken is tried next if
        it is of the same class. A busy shard is passed over for the rest of the call;
        after :data:`MAX_PASSED` busy ones the claimer waits, asleep, for the best of
        those (holders keep a shard lock for a few system calls only)."""
        shards = self._candidates(worker_tier)
        fresh = self._cands[worker_tier][2] == self._calls
        keys = self._pick_keys[worker_tier]
        busy: list[int] = []
        gone_in: set[int] = set()
        listed: set[int] = set()  # shards re-listed in this call
        budget = RELISTS
        drained = 0  # shards re-listed one by one in this call and found without a name
        cls: Any = None  # in a crowd, after a name found taken: its class
        k = -1
        while True:
            wait = False
            if cls is not None:  # the next name of the shard where one was found taken
                lst = shards[k]
                if self._head(lst, keys)[0] != cls:
                    k = -1
                cls = None
            else:
                k = -1
            if k < 0 and len(busy) < MAX_PASSED:
                k = self._choice(worker_tier, shards, busy)
            if k < 0:
                if busy:
                    k = min(busy, key=lambda b: self._head(shards[b], keys))
                    busy.remove(k)
                    wait = True
                elif fresh:
                    return None
                else:
                    shards = self._candidates(worker_tier, refresh=True)
                    keys = self._pick_keys[worker_tier]
                    fresh = True
                    gone_in.clear()
                    continue
            if not shards[k]:
                continue
            if self._crowd > 0 and k not in listed and not fresh and budget > 0:
                # in a crowd, peers drain every shard: look at this one as it is now
                listed.add(k)
                budget -= 1
                self._relist(worker_tier, shards, k)
                if wait:
                    busy.append(k)
                drained += not shards[k]
                if drained >= self._drained:  # the queue runs dry: list every shard at once
                    shards = self._candidates(worker_tier, refresh=True)
                    keys = self._pick_keys[worker_tier]
                    fresh = True
                    gone_in.clear()
                    busy.clear()
                continue
            name = shards[k][-1]
            fallback = (wait or self._crowd > 0) and budget > 0
            budget -= fallback
            got = self._try_claim(name, worker_tier, now, wait=wait, fallback=fallback)
            if got == "busy":
                busy.append(k)
                self._crowd = CROWD_CLAIMS
            elif got == "gone":
                lst = shards[k]
                if lst and lst[-1] == name:  # (a claim that waited may have re-listed it)
                    lst.pop()
                if k in gone_in and budget > 0:  # a second name taken from this shard:
                    budget -= 1  # peers drain it, look again
                    self._relist(worker_tier, shards, k)
                    listed.add(k)
                    self._crowd = CROWD_CLAIMS
                    drained += not shards[k]
                    if drained >= self._drained and not fresh:  # as above
                        shards = self._candidates(worker_tier, refresh=True)
                        keys = self._pick_keys[worker_tier]
                        fresh = True
                        gone_in.clear()
                        busy.clear()
                        cls = None
                        continue
                else:
                    gone_in.add(k)
                if self._crowd > 0:
                    cls = keys[name][0]
            else:
                lst = shards[k]
                if lst and pending_task_id(lst[-1]) == got.task_id:
                    lst.pop()
                self._crowd -= 1
                return got
