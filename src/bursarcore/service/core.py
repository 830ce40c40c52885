"""The service's engine room: one :class:`~bursarcore.Broker` behind a lock, a durable
journal with group commit across concurrent requests, a ticker that moves broker time, and
the event log behind long-poll and server-sent events (SPEC §8, §9, §12).

Concurrency model. Every broker operation runs on the event-loop thread, synchronously,
inside :meth:`BrokerService.call` (operations take microseconds; the broker is not
thread-safe, and a :class:`LockedBroker` lock guards it against any other thread). After
the operation, the request waits until every journal record appended so far is durable
(``seq <= durable_seq``) and only then answers: an acknowledged decision — an HTTP 2xx —
is never lost. The committer takes the buffered records *between* operations (so the file
always ends on an operation boundary), writes and fsyncs them in a worker thread while
new operations go on, and wakes every request whose records that commit covered: one
fsync acknowledges as many concurrent requests as arrived during the previous one.

Time. Broker time in the service is Unix time in seconds (:class:`WallClock`, never
running backwards), so a lease's ``expiry`` and an intent's ``deadline`` are wall-clock
instants and a restart after downtime expires what ran out meanwhile.

Restart. An existing SQLite journal is replayed (:meth:`Broker.replay`): leases, balances,
the pending queue and fair-share state come back as they were, and the broker goes on
appending to the same file.
"""

from __future__ import annotations

import asyncio
import collections
import difflib
import json
import logging
import math
import os
import sqlite3
import time
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from ..admission import Congestion, Envelope, Pool, ServiceClass
from ..broker import Broker
from ..errors import BursarError, InvalidArgument, UnknownLease
from ..journal import MemoryJournal, SQLiteJournal
from ..journal import records as J
from .locked import LockedBroker

__all__ = ["BrokerService", "WallClock", "GroupCommitJournal", "build_broker",
           "envelope_from_json", "DEMO_CONFIG", "EVENT_OPS", "ServiceUnavailable",
           "OperationFailed", "JOURNAL_ERRORS"]

log = logging.getLogger("bursarcore.service")

# derived journal records that are events, and the Event.kind each one is
EVENT_OPS = {"expire": "expired", "revoke": "revoked", "activate": "activated",
             "preempt": "preempt_notice", "grant": "granted", "refuse": "refused"}
_EVENT_CODES = np.array([J.OP[o] for o in EVENT_OPS], dtype=np.int8)
_KIND_OF_CODE = {J.OP[o]: k for o, k in EVENT_OPS.items()}


class ServiceUnavailable(RuntimeError):
    """The journal could not be written: the service refuses to acknowledge anything."""


class OperationFailed(RuntimeError):
    """A broker operation raised an unexpected exception before it journaled anything:
    this request fails (HTTP 500); the service goes on."""

    def __init__(self, operation: str) -> None:
        super().__init__(f"internal error in {operation}; nothing was journaled")
        self.operation = operation


#: exceptions of the journal's storage: a broker operation or tick that raises one of
#: these stops the service (fail stop), whatever it was doing
JOURNAL_ERRORS: tuple[type[BaseException], ...] = (sqlite3.Error, OSError)


class WallClock:
    """Unix time in seconds that never runs backwards (a stepped system clock is held at
    the last reading until it catches up)."""

    def __init__(self, floor: float = 0.0) -> None:
        self._last = float(floor)
        self.pinned: float | None = None   # while set, now() answers it (replay)

    def now(self) -> float:
        if self.pinned is not None:
            return self.pinned
        t = time.time()
        if t < self._last:
            return self._last
        self._last = t
        return t

    def __repr__(self) -> str:
        return f"WallClock(last={self._last!r})"


class GroupCommitJournal(SQLiteJournal):
    """The SQLite journal for group commit: operations never commit on their own; the
    service calls :meth:`~SQLiteJournal.take` under the broker lock, between operations,
    and :meth:`~SQLiteJournal.commit` outside it, in its writer thread."""

    def __init__(self, path: str | os.PathLike, synchronous: str = "FULL", *,
                 create: bool = False) -> None:
        super().__init__(path, batch=1 << 62, synchronous=synchronous, create=create)

    def end_op(self, sync: bool = False) -> None:
        if sync:
            self.flush()


# ---------------------------------------------------------------------------- config
DEMO_CONFIG: dict[str, Any] = {
    # SPEC §10, the prototype's default scenario
    "pool": {"gpu": 512, "flow": {"fs": 28.0, "inference": 5000.0}},
    "campaigns": {
        "victim": {"credits": 5000, "service_class": "interactive",
                   "guaranteed": {"gpu": 32}, "sustained": {"gpu": 32},
                   "ceiling": {"gpu": 64}, "burst": {"gpu": 60000}},
        "adaptive-sci": {"credits": 20000, "service_class": "agent-burst",
                         "guaranteed": {"gpu": 64, "fs": 0, "inference": 0},
                         "sustained": {"gpu": 128, "fs": 6, "inference": 500},
                         "ceiling": {"gpu": 384, "fs": 16, "inference": 2000},
                         "burst": {"gpu": 300000, "fs": 3600, "inference": 100000}},
        "naive-sci": {"credits": 20000, "service_class": "agent-burst",
                      "guaranteed": {"gpu": 64, "fs": 0, "inference": 0},
                      "sustained": {"gpu": 128, "fs": 6, "inference": 500},
                      "ceiling": {"gpu": 384, "fs": 16, "inference": 2000},
                      "burst": {"gpu": 300000, "fs": 3600, "inference": 100000}},
        "storm": {"credits": 8000, "service_class": "agent-burst",
                  "guaranteed": {"gpu": 16, "inference": 0},
                  "sustained": {"gpu": 64, "inference": 50},
                  "ceiling": {"gpu": 384, "inference": 500},
                  "burst": {"gpu": 150000, "inference": 5000}},
        "backfill": {"credits": None, "service_class": "opportunistic",
                     "guaranteed": {"gpu": 0}, "sustained": {"gpu": 512},
                     "ceiling": {"gpu": 512}, "burst": {"gpu": None}},
    },
}

_POOL_OPTIONS = ("flow", "slots", "slots_per_node", "warm_headroom")
_BROKER_KEYS = {"pool", "classes", "congestion", "price", "ttl", "half_life", "enforcement",
                "borrow_grace",
                "campaigns"}


def envelope_from_json(env: Mapping[str, Any], field: str = "envelope") -> Envelope:
    """An :class:`Envelope` from JSON, where ``null`` credits, burst or lend limit mean
    unlimited."""
    if not isinstance(env, Mapping):
        raise InvalidArgument(field, "must be an object", env)
    d = dict(env)
    unknown = set(d) - {"credits", "service_class", "guaranteed", "sustained", "ceiling",
                        "burst", "share", "borrow_limit", "lend_limit"}
    if unknown:
        raise InvalidArgument(f"{field}.{sorted(unknown)[0]}", "is not an envelope field")
    for f in ("borrow_limit", "lend_limit", "share"):     # (a model's defaults: as if absent)
        if d.get(f) in ({}, None):
            d.pop(f, None)
    return Envelope.from_dict(d)


def build_broker(config: Mapping[str, Any], clock: Any, journal: Any = None, *,
                 backend: str | None = None) -> Broker:
    """A fresh broker from a JSON configuration (see ``docs/service.md``)."""
    if not isinstance(config, Mapping):
        raise InvalidArgument("config", "must be an object", type(config).__name__)
    unknown = set(config) - _BROKER_KEYS
    if unknown:
        raise InvalidArgument(f"config.{sorted(unknown)[0]}", f"must be one of {sorted(_BROKER_KEYS)}")
    raw_pool = config.get("pool") or {"gpu": 64}
    if not isinstance(raw_pool, Mapping):
        raise InvalidArgument("config.pool", "must be an object", type(raw_pool).__name__)
    pool_cfg = dict(raw_pool)
    kw: dict[str, Any] = {}
    for k in _POOL_OPTIONS:
        if k in pool_cfg:
            kw[k] = pool_cfg.pop(k)
    for k, v in pool_cfg.items():
        # every other key is a held dimension's capacity: a key that looks like an option
        # (a misspelling would silently become a dimension) or a value that is not a
        # number is refused
        near = difflib.get_close_matches(k, _POOL_OPTIONS, n=1, cutoff=0.8)
        if near:
            raise InvalidArgument(f"config.pool.{k}", f"is not a pool option (did you mean "
                                  f"{near[0]!r}?) nor a usable dimension name", v)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise InvalidArgument(f"config.pool.{k}", "a held dimension's capacity must be a "
                                  f"number; the pool's options are {list(_POOL_OPTIONS)}", v)
    if config.get("campaigns") is not None and not isinstance(config["campaigns"], Mapping):
        raise InvalidArgument("config.campaigns", "must be an object: name -> envelope",
                              type(config["campaigns"]).__name__)
    if isinstance(kw.get("slots"), Mapping):
        kw["slots"] = {d: [tuple(x) for x in v] for d, v in kw["slots"].items()}
    pool = Pool(**kw, **pool_cfg)
    classes = None
    if config.get("classes") is not None:
        classes = [ServiceClass(**c) for c in config["classes"]]
    congestion = None
    if config.get("congestion") is not None:
        cg = dict(config["congestion"])
        for k in ("thresholds", "multipliers"):
            if k in cg:
                cg[k] = tuple(cg[k])
        congestion = Congestion(**cg)
    opts = {k: config[k] for k in ("price", "ttl", "half_life", "enforcement", "borrow_grace")
            if k in config}
    return Broker(pool, clock, classes=classes, congestion=congestion, backend=backend,
                  journal=journal, **opts)


# ---------------------------------------------------------------------------- events
def _event_from_row(r: np.void, names: list[str]) -> dict[str, Any]:
    op = int(r["op"])
    kind = _KIND_OF_CODE[op]
    c = int(r["campaign"])
    lease = int(r["lease"])
    reason = int(r["reason"])
    deadline = int(r["deadline"])
    return {"seq": int(r["seq"]), "kind": kind, "time": int(r["t"]) / 1e9,
            "campaign": names[c] if 0 <= c < len(names) else str(c),
            "lease_id": lease if lease >= 0 else None,
            "intent_id": int(r["intent"]) if kind in ("granted", "refused") else None,
            "deadline": deadline / 1e9 if kind == "preempt_notice" else None,
            "reason": J.REASONS[reason] if 0 < reason < len(J.REASONS) else None,
            "units": int(r["units"])}


class BrokerService:
    """One broker served over HTTP: see the module docstring.

    Build it with :meth:`open` (SQLite journal at ``journal_path``, replayed if it exists;
    a memory journal when ``journal_path`` is None — for tests, nothing survives), then
    ``await start()`` inside the event loop and ``await stop()`` at the end.
    """

    #: exceptions an operation may raise without harm (bad input, refused access); any
    #: other is a failure of the operation or of the journal (see :meth:`call`)
    expected_errors: tuple[type[BaseException], ...] = (BursarError,)
    #: longest wait for a journal commit before a request answers 503 (seconds; None: no
    #: bound)
    commit_timeout: float | None = 30.0

    @property
    def _group(self) -> GroupCommitJournal:
        """The journal, for the paths taken only when it commits in groups (``_grouped``)."""
        assert isinstance(self.journal, GroupCommitJournal)
        return self.journal

    def __init__(self, broker: Broker, *, tick: float = 0.5, event_log: int = 10_000) -> None:
        if broker.journal is None:
            raise InvalidArgument("broker", "the service needs a journaled broker")
        self.broker = broker
        self.locked = LockedBroker(broker)
        self.lock = self.locked.lock
        self.journal = broker.journal
        self.tick = float(tick)
        self._grouped = isinstance(self.journal, GroupCommitJournal)
        self._max_events = max(16, int(event_log))
        self._events: collections.deque[dict[str, Any]] = collections.deque()
        self._log_start = 0           # every event with seq >= this is in _events
        self._scanned = 0             # the journal's records before this are in _events
        self._scan_events(len(self.journal) - 1)
        self._durable = self.journal.durable_seq if self._grouped else len(self.journal) - 1
        self._waiters: list[tuple[int, asyncio.Future, float | None]] = []
        self._watchdog: asyncio.TimerHandle | None = None
        self._kick: asyncio.Event | None = None
        self._new_events: asyncio.Event | None = None
        self._tasks: list[asyncio.Task] = []
        self.failed: BaseException | None = None
        self.started_at = time.time()
        self.commits = 0
        #: called after each commit group with (seconds, records): the metrics
        self.commit_observer: Callable[[float, int], None] | None = None

    # ------------------------------------------------------------------ construction
    @classmethod
    def open(cls, config: Mapping[str, Any] | None = None, journal_path: str | None = None, *,
             create: bool = False, synchronous: str = "FULL", backend: str | None = None,
             tick: float = 0.5, clock: Any = None) -> "BrokerService":
        """Open the broker on the SQLite journal at ``journal_path`` (replaying it), or
        with ``create=True`` make a new journal there and a new broker from ``config``
        (see :class:`~bursarcore.journal.SQLiteJournal`: a missing, empty, locked or
        short journal raises :class:`~bursarcore.errors.JournalUnavailable`, a damaged
        one :class:`~bursarcore.errors.JournalCorrupt`). ``config`` is the JSON
        configuration; on a replayed journal its pool and classes are ignored (the
        journal's own config record rules) and only campaigns not yet registered (nor
        removed by the journal) are added. Without ``journal_path`` the journal is in memory."""
        config = dict(config or {})
        if journal_path is not None:
            journal: Any = GroupCommitJournal(journal_path, synchronous=synchronous,
                                              create=create)
        else:
            journal = MemoryJournal()
        try:
            return cls._build(config, journal, journal_path, backend=backend, tick=tick,
                              clock=clock)
        except BaseException:
            if isinstance(journal, SQLiteJournal):
                journal.take()                # nothing of a failed start is committed
                journal.close()
            raise

    @classmethod
    def _build(cls, config: dict[str, Any], journal: Any, journal_path: str | None, *,
               backend: str | None, tick: float, clock: Any) -> "BrokerService":
        if len(journal):
            rows = journal.rows()
            clk = clock if clock is not None else WallClock(floor=float(rows[-1]["t"]) / 1e9)
            if isinstance(clk, WallClock):
                # the rebuilt broker must start at the journal's first instant (its flow
                # buckets are seeded from the clock), then run on wall time
                clk.pinned = float(rows[0]["t"]) / 1e9
            try:
                broker = Broker.replay(journal, backend=backend, clock=clk)
            finally:
                if isinstance(clk, WallClock):
                    clk.pinned = None
            log.info("replayed %d journal records from %s", len(journal), journal_path)
        else:
            clk = clock if clock is not None else WallClock()
            broker = build_broker(config, clk, journal, backend=backend)
        svc = cls(broker, tick=tick)
        # a node the journal removed (SPEC §14.9) is not brought back by the configuration
        removed: set[str] = set()
        if len(journal):
            pl, rows = journal.payloads(), journal.rows()
            for i in np.flatnonzero(rows["op"] == J.OP["remove"]).tolist():
                removed.add(json.loads(pl[int(rows["seq"][i])])["name"])
        for name, env in (config.get("campaigns") or {}).items():
            if name not in broker.campaigns and name not in removed:
                broker.register(name, envelope_from_json(env, f"campaigns.{name}"))
        svc.flush()
        return svc

    def flush(self) -> int:
        """Commit everything now (outside the event loop: startup, shutdown)."""
        with self.lock:
            self.broker.sync()
        self._durable = self._durable_now()
        return self._durable

    def _durable_now(self) -> int:
        if self._grouped:
            return self.journal.durable_seq
        return len(self.journal) - 1

    @property
    def durable_seq(self) -> int:
        return self._durable

    @property
    def running(self) -> bool:
        """Whether :meth:`start` ran (the committer and the event log's wake-ups)."""
        return self._new_events is not None

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        self._kick = asyncio.Event()
        self._new_events = asyncio.Event()
        self._tasks = [asyncio.create_task(self._committer(), name="bursar-committer")]
        if self.tick > 0:
            self._tasks.append(asyncio.create_task(self._ticker(), name="bursar-ticker"))

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            try:
                await t
            except (asyncio.CancelledError, Exception):
                pass
        self._tasks = []
        if self.failed is None:
            self.flush()
        elif self._grouped:
            try:
                self._group.take()       # what followed the failure is never committed
            except Exception:  # noqa: BLE001 - the buffer may be what cannot be encoded
                pass
        for _, fut, _ in self._waiters:
            if not fut.done():
                fut.set_exception(ServiceUnavailable("the service is shutting down"))
        self._waiters = []
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        try:
            self.journal.close()
        except Exception:  # noqa: BLE001 - closing a failed journal must not mask shutdown
            log.exception("closing the journal")

    # ------------------------------------------------------------------ operations
    async def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run one broker operation under the lock, then wait until everything it (and
        anything before it) journaled is durable. Exceptions propagate after the wait.

        Failure policy. Bad input (:attr:`expected_errors`) changes nothing and is
        re-raised. Any other exception is one of two kinds:

        * a **journal failure** — an I/O error from the journal (``sqlite3.Error``,
          ``OSError``), or the operation had already journaled records when it failed
          (the journal would end mid-operation): the service **fails stop**, acknowledges
          nothing more and keeps the durable journal as it is; a restart replays it;
        * anything else — the broker raised before journaling anything, and the broker
          validates before it changes state: :class:`OperationFailed` (HTTP 500) for this
          request only, logged with its traceback; the service goes on serving.
        """
        result, err, target = self.apply(fn, *args, **kwargs)
        await self.wait_durable(target)
        if err is not None:
            raise err
        return result

    def apply(self, fn: Callable[..., Any], *args: Any,
              **kwargs: Any) -> tuple[Any, BaseException | None, int]:
        """The first half of :meth:`call`, for callers that pipeline (the decision stream):
        run one broker operation under the lock, with :meth:`call`'s failure policy, and
        return ``(result, error, seq)`` — the expected error it raised (bad input, nothing
        changed) or None, and the journal seq to pass to :meth:`wait_durable` before the
        result may be acknowledged. An unexpected error raises here, as in :meth:`call`."""
        if self.failed is not None:
            raise ServiceUnavailable("the journal cannot be written; not accepting operations")
        err: BaseException | None = None
        result = None
        with self.lock:
            before = len(self.journal)
            try:
                result = fn(*args, **kwargs)
            except self.expected_errors as e:   # bad input: nothing changed
                err = e
            except Exception as e:
                self._unexpected(e, before, getattr(fn, "__name__", repr(fn)))
            target = len(self.journal) - 1
        return result, err, target

    def _unexpected(self, e: Exception, journal_before: int, what: str) -> None:
        """Classify an unexpected exception of an operation (see :meth:`call`); raises."""
        if isinstance(e, JOURNAL_ERRORS) or len(self.journal) != journal_before:
            self._fail(e)
            raise ServiceUnavailable("the journal cannot be written; the service stopped "
                                     "acknowledging operations and must be restarted") from e
        log.error("broker operation %s failed; this request fails, nothing was journaled",
                  what, exc_info=e)
        raise OperationFailed(what) from e

    def _fail(self, e: BaseException) -> None:
        if self.failed is None:
            log.critical("journal failure; refusing further operations: %r", e, exc_info=e)
            self.failed = e
        if self._grouped:
            try:
                self._group.take()           # never commit what followed the failure
            except Exception:  # noqa: BLE001 - the buffer may be what cannot be encoded
                pass
        for _, fut, _ in self._waiters:
            if not fut.done():
                fut.set_exception(ServiceUnavailable("the journal cannot be written"))
        self._waiters = []

    def query(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """A read that appends nothing (no durability wait needed)."""
        with self.lock:
            return fn(*args, **kwargs)

    async def wait_durable(self, seq: int) -> None:
        """Wait until ``seq`` is durable: at most :attr:`commit_timeout` seconds, then
        :class:`ServiceUnavailable` (not acknowledged: the operation may or may not
        become durable, as with a crash)."""
        if seq <= self._durable:
            return
        if not self._grouped:
            self._durable = self._durable_now()
            self._notify_events()
            return
        if self.failed is not None:
            raise ServiceUnavailable("the journal cannot be written")
        if not self._tasks or self._tasks[0].done():
            raise ServiceUnavailable("the journal committer is not running")
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        # one timer for every waiter (see _expire), not one per request: the deadline
        # rides with the waiter
        deadline = None if self.commit_timeout is None else loop.time() + self.commit_timeout
        self._waiters.append((seq, fut, deadline))
        assert self._kick is not None, "BrokerService.start() was not awaited"
        self._kick.set()
        if deadline is not None and self._watchdog is None:
            self._watchdog = loop.call_at(deadline, self._expire)
        await fut

    def _expire(self) -> None:
        """The commit timeout: every waiter past its deadline answers 503; the timer is
        set again for the earliest deadline left."""
        self._watchdog = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        late = 0
        nxt: float | None = None
        for _, fut, deadline in self._waiters:
            if fut.done() or deadline is None:
                continue
            if deadline <= now:
                fut.set_exception(ServiceUnavailable(
                    f"the journal did not commit within {self.commit_timeout:g} s; not "
                    f"acknowledged"))
                late += 1
            elif nxt is None or deadline < nxt:
                nxt = deadline
        if late:
            log.error("journal commit took over %g s; answering 503 to %d request(s)",
                      self.commit_timeout, late)
            self._waiters = [w for w in self._waiters if not w[1].done()]
        if nxt is not None:
            self._watchdog = loop.call_at(nxt, self._expire)

    async def _committer(self) -> None:
        """Commit loop; any exception in it (taking the batch, writing it) fails stop —
        never a silent end that would leave requests waiting for a commit."""
        try:
            await self._commit_loop()
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # noqa: BLE001 - disk full, I/O error, a bad record
            log.error("journal write failed; the service stops acknowledging: %r", e,
                      exc_info=e)
            with self.lock:
                self._fail(e)

    async def _commit_loop(self) -> None:
        assert self._kick is not None
        while True:
            await self._kick.wait()
            self._kick.clear()
            if self.failed is not None:
                return
            with self.lock:
                buf = self._group.take()
            if buf:
                t0 = time.perf_counter()
                await asyncio.to_thread(self._group.commit, buf)
                self.commits += 1
                if self.commit_observer is not None:
                    self.commit_observer(time.perf_counter() - t0, len(buf))
            self._durable = self.journal.durable_seq
            keep = []
            durable = self._durable
            for w in self._waiters:
                fut = w[1]
                if fut.done():
                    continue                    # timed out, or its request went away
                if w[0] <= durable:
                    fut.set_result(None)
                else:
                    keep.append(w)
            self._waiters = keep
            if keep:
                self._kick.set()
            self._notify_events()

    async def _ticker(self) -> None:
        """Move broker time every :attr:`tick` seconds. The failure policy of
        :meth:`call`: a journal failure stops the service; another exception is logged
        (with its traceback once, until a tick succeeds again) and the ticks go on."""
        quiet = False
        while True:
            await asyncio.sleep(self.tick)
            if self.failed is not None:
                return
            with self.lock:
                before = len(self.journal)
                try:
                    self.broker.poll()
                except Exception as e:  # noqa: BLE001 - classified below
                    if isinstance(e, JOURNAL_ERRORS) or len(self.journal) != before:
                        self._fail(e)
                        return
                    if not quiet:
                        log.error("clock tick failed; nothing was journaled", exc_info=e)
                    quiet = True
                    continue
                quiet = False
                grew = len(self.journal) != before
            if grew:
                if self._grouped:
                    assert self._kick is not None
                    self._kick.set()
                else:
                    self._durable = self._durable_now()
                    self._notify_events()

    # ------------------------------------------------------------------ events
    def _scan_events(self, hi: int) -> None:
        """Take the events of the journal's records up to seq ``hi`` into the log (the
        newest ``event_log`` of them): each event is the record the broker journaled for it
        (derived records: expiries, revocations, notices, activations, pending grants and
        refusals), so the log needs no callback inside broker operations, and the broker's
        compiled expiry path runs."""
        if hi < self._scanned:
            return
        with self.lock:
            rows = self.journal.rows()[self._scanned: hi + 1]
            names = list(self.journal.names)
        self._scanned = hi + 1
        idx = np.flatnonzero(np.isin(rows["op"], _EVENT_CODES))
        dropped = idx.size > self._max_events
        if dropped:                               # only the newest fit in the log
            idx = idx[-self._max_events:]
            self._events.clear()
        self._events.extend(_event_from_row(rows[i], names) for i in idx.tolist())
        while len(self._events) > self._max_events:
            self._events.popleft()
            dropped = True
        if dropped:
            self._log_start = self._events[0]["seq"]

    def _notify_events(self) -> None:
        if self._new_events is not None:
            self._new_events.set()
            self._new_events = asyncio.Event()

    def events_since(self, campaign: str | None, after: int, limit: int) -> list[dict[str, Any]]:
        """Durable events with seq > ``after`` (of one campaign, or all), oldest first."""
        hi = self._durable
        self._scan_events(hi)
        if after + 1 < self._log_start:
            rows = self.journal.rows()[max(after + 1, 0): hi + 1]
            m = np.isin(rows["op"], _EVENT_CODES)
            if campaign is not None:
                names = self.journal.names
                c = names.index(campaign) if campaign in names else -2
                m &= rows["campaign"] == c
            names = list(self.journal.names)
            return [_event_from_row(rows[i], names) for i in np.flatnonzero(m)[:limit]]
        out: list[dict[str, Any]] = []
        for e in reversed(self._events):
            if e["seq"] <= after:
                break
            if e["seq"] <= hi and (campaign is None or e["campaign"] == campaign):
                out.append(e)
        out.reverse()
        return out[:limit]

    async def wait_events(self, campaign: str | None, after: int, limit: int,
                          timeout: float) -> list[dict[str, Any]]:
        """Long-poll: the events after ``after``, waiting up to ``timeout`` s for one."""
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            evs = self.events_since(campaign, after, limit)
            left = deadline - time.monotonic()
            if evs or left <= 0 or self._new_events is None:
                return evs
            try:
                await asyncio.wait_for(self._new_events.wait(), timeout=left)
            except asyncio.TimeoutError:
                return self.events_since(campaign, after, limit)

    def latest_seq(self) -> int:
        return self._durable

    # ------------------------------------------------------------------ journal reads
    def journal_records(self, campaign: str | None, *, after: int = -1, t0: float | None = None,
                        t1: float | None = None, ops: Iterable[str] | None = None,
                        outcome: str | None = None, reason: str | None = None,
                        limit: int = 100) -> list[dict[str, Any]]:
        """Durable records matching every filter, seq > ``after``, oldest first."""
        with self.lock:
            rows = self.journal.rows()[max(after + 1, 0): self._durable + 1]
            names = list(self.journal.names)
            payloads = self.journal.payloads()
        m = np.ones(rows.shape[0], dtype=bool)
        if campaign is not None:
            m &= rows["campaign"] == (names.index(campaign) if campaign in names else -2)
        if t0 is not None:
            m &= rows["t"] >= round(t0 * 1e9)
        if t1 is not None:
            m &= rows["t"] <= round(t1 * 1e9)
        if ops:
            m &= np.isin(rows["op"], [J.OP[o] for o in ops])
        if outcome is not None:
            m &= rows["outcome"] == J.OUTCOMES.index(outcome)
        if reason is not None:
            m &= rows["reason"] == J.REASONS.index(reason)
        out = []
        for i in np.flatnonzero(m)[:limit]:
            out.append(self.record_dict(rows[i], payloads.get(int(rows[i]["seq"])), names))
        return out

    def record_dict(self, row: Any, payload: str | None, names: list[str]) -> dict[str, Any]:
        b = self.broker
        d = J.to_dict(row, payload, names, b.dims + list(b.flow_dims),
                      [c.name for c in b.classes])
        # the campaign by name (its registration index would say how many came before)
        d["campaign"] = d.pop("campaign_name", None)
        return json_safe(d)

    def record(self, seq: int) -> tuple[dict[str, Any], str] | None:
        """A durable record and its explanation, or None."""
        if not 0 <= seq <= self._durable:
            return None
        with self.lock:
            rows = self.journal.rows()
            rec = self.record_dict(rows[seq], self.journal.payloads().get(seq),
                                   list(self.journal.names))
            text = self.broker.explain(seq)
        return rec, text

    def ticket(self, campaign: str, intent_id: int) -> dict[str, Any] | None:
        """What became of an intent of ``campaign``: pending / granted / refused /
        cancelled, from the pending queue and the journal; None if it is not theirs."""
        with self.lock:
            for p in self.broker.pending(campaign):
                if p["intent_id"] == intent_id:
                    return {"intent_id": intent_id, "campaign": campaign, "status": "pending",
                            "reason": p["reason"], "lease": None, "expires": p["expires"]}
            rows = self.journal.rows()[: self._durable + 1]
            names = self.journal.names
            c = names.index(campaign) if campaign in names else -2
            ops = np.array([J.OP[o] for o in ("acquire", "grant", "refuse", "cancel")], np.int8)
            m = (rows["intent"] == intent_id) & (rows["campaign"] == c) & np.isin(rows["op"], ops)
            idx = np.flatnonzero(m)
            if idx.size == 0:
                return None
            r = rows[idx[-1]]
            op, outcome = J.OPS[int(r["op"])], J.OUTCOMES[int(r["outcome"])]
            reason = J.REASONS[int(r["reason"])] or None
            lease = None
            if op == "grant" or (op == "acquire" and outcome == "granted"):
                status = "granted"
                try:
                    lease = self.broker.lease(int(r["lease"]))
                except UnknownLease:   # ended long ago, its record reused (policy.md, Memory)
                    lease = None
            elif op == "cancel":
                status = "cancelled"
            elif op == "acquire" and outcome == "pending":
                status = "pending"  # left the queue; its answer is not durable yet
            else:
                status = "refused"
            return {"intent_id": intent_id, "campaign": campaign, "status": status,
                    "reason": reason, "lease": lease, "expires": None}


def json_safe(x: Any) -> Any:
    """Replace non-finite floats by None, recursively (JSON has no inf or NaN)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    if isinstance(x, np.generic):
        return json_safe(x.item())
    return x
