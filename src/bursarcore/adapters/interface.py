"""The binding interface (SPEC §12): the scheduler-independent state tables, the records a
binding reports, and :class:`Binding`, the abstract adapter every scheduler implements.

A *binding* is a thin adapter over one scheduler, in the manner of Parsl's providers:

* one module per scheduler (:mod:`.slurm`, :mod:`.pbs`, :mod:`.local`);
* a table from the scheduler's states to ours (:data:`PILOT_STATES`); a state missing
  from the table is logged once and mapped to ``"unknown"`` (:func:`map_state`);
* every scheduler command goes through one overridable method, :meth:`Binding.execute`,
  and every launched process through :meth:`Binding.spawn` — tests replace these two to
  feed recorded output, and the same code drives the real scheduler;
* a command that fails raises :class:`~bursarcore.errors.CommandError` (re-exported here)
  carrying the command and its stderr.

A binding knows the scheduler; it knows nothing of the broker: the
:class:`~bursarcore.adapters.PoolManager` joins the two. What a binding launches for a
lease is tracked by the handles of :mod:`.handles`.

Naming. A pool node is ``"<pilot id>/<host>"``: one host can carry several pilots (a
single-node test cluster, or partial-node pilots) and the broker needs unique node names;
the name also tells :meth:`Binding.launch` which allocation to run a lease's work in.

Time. The binding reads the broker's clock (``clock.now()``, seconds) for everything it
decides — rate limits, caches, grace deadlines — so tests run on a
:class:`~bursarcore.clock.ManualClock`; scheduler timestamps (epoch seconds) are turned into
that clock with the injectable ``wallclock`` (``time.time`` by default).
"""

from __future__ import annotations

import abc
import logging
import math
import os
import signal as _signal
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

from ..clock import MonotonicClock
from ..errors import CommandError, InvalidArgument
from .handles import Handle, LeaseHandle, ProcessHandle

__all__ = [
    "PENDING", "HELD", "RUNNING", "SUSPENDED", "ENDING", "COMPLETED", "CANCELLED", "FAILED",
    "TIMEOUT", "UNKNOWN", "PILOT_STATES", "TERMINAL", "NODE_FREE", "NODE_PARTIAL",
    "NODE_BUSY", "NODE_DOWN", "NODE_UNKNOWN", "NODE_STATES", "CommandError", "map_state",
    "PilotStatus", "Pilot", "SchedulerSupply", "Binding", "node_name", "split_node",
    "run_command",
]

log = logging.getLogger("bursarcore.adapters")

# --------------------------------------------------------------------------- our states
PENDING = "pending"        # queued, waiting for its start time, being configured
HELD = "held"              # held by user/admin/scheduler; will not start on its own
RUNNING = "running"        # allocated and usable: its slots are in the pool
SUSPENDED = "suspended"    # allocated but stopped: its slots leave the pool until resumed
ENDING = "ending"          # the scheduler is tearing it down (completing, exiting)
COMPLETED = "completed"    # ended by itself, exit 0
CANCELLED = "cancelled"    # ended by a cancel (ours or an operator's)
FAILED = "failed"          # ended badly: non-zero exit, node failure, boot failure, OOM
TIMEOUT = "timeout"        # hit its walltime (expected for a pilot, not a failure)
UNKNOWN = "unknown"        # a state missing from the binding's table (logged)
PILOT_STATES = (PENDING, HELD, RUNNING, SUSPENDED, ENDING, COMPLETED, CANCELLED, FAILED,
                TIMEOUT, UNKNOWN)
TERMINAL = frozenset({COMPLETED, CANCELLED, FAILED, TIMEOUT})

# node states, for supply
NODE_FREE = "free"         # usable, nothing allocated
NODE_PARTIAL = "partial"   # usable, partly allocated
NODE_BUSY = "busy"         # usable, fully allocated
NODE_DOWN = "down"         # not usable: down, drained, offline, failed, in maintenance
NODE_UNKNOWN = "unknown"
NODE_STATES = (NODE_FREE, NODE_PARTIAL, NODE_BUSY, NODE_DOWN, NODE_UNKNOWN)

_warned: set[tuple[str, str, str]] = set()
_warned_lock = threading.Lock()


def map_state(table: Mapping[str, str], raw: Any, *, scheduler: str, what: str = "job") -> str:
    """``table[raw]``; a state the table lacks is logged (once per scheduler and state)
    as a warning on ``bursarcore.adapters`` and mapped to ``"unknown"``."""
    key = str(raw)
    state = table.get(key)
    if state is not None:
        return state
    with _warned_lock:
        first = (scheduler, what, key) not in _warned
        _warned.add((scheduler, what, key))
    if first:
        log.warning("%s: %s state %r is not in the state table; mapped to %r",
                    scheduler, what, key, UNKNOWN)
    return UNKNOWN if what == "job" else NODE_UNKNOWN


def node_name(pilot_id: str, host: str) -> str:
    """The pool node for ``host`` of pilot ``pilot_id``: ``"<pilot>/<host>"``."""
    return f"{pilot_id}/{host}"


def split_node(name: str) -> tuple[str, str]:
    """``"<pilot>/<host>"`` -> ``(pilot, host)``."""
    pilot, sep, host = name.partition("/")
    if not sep or not pilot or not host:
        raise InvalidArgument("node", "is not a pilot node '<pilot>/<host>'", name)
    return pilot, host


# --------------------------------------------------------------------------- commands
def run_command(argv: Sequence[str], *, input: str | None = None,
                env: Mapping[str, str] | None = None,
                timeout: float | None = None) -> subprocess.CompletedProcess:
    """Run one command (text in and out) and return its ``CompletedProcess``. ``env`` adds
    to the current environment. Raises :class:`CommandError` with the command and its
    stderr when it exits non-zero, times out or cannot start."""
    full_env = None
    if env:
        full_env = dict(os.environ)
        full_env.update(env)
    try:
        cp = subprocess.run(list(argv), input=input, capture_output=True, text=True,
                            env=full_env, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        raise CommandError(argv, None, f"timed out after {e.timeout} s; {err}") from None
    except OSError as e:
        raise CommandError(argv, None, str(e)) from None
    if cp.returncode != 0:
        raise CommandError(argv, cp.returncode, cp.stderr, cp.stdout)
    return cp


# --------------------------------------------------------------------------- records
@dataclass(frozen=True)
class PilotStatus:
    """What the scheduler says of one pilot. ``hosts`` lists ``(host, slots)`` of the
    binding's dimension once it runs; ``start``/``end`` are epoch seconds (``end`` is the
    expected end while running: start + walltime); ``exit_code`` in shell convention."""

    state: str
    raw: str
    hosts: tuple[tuple[str, int], ...] = ()
    start: float | None = None
    end: float | None = None
    exit_code: int | None = None
    reason: str | None = None


@dataclass
class Pilot:
    """A pilot allocation the pool manager submitted (times on the broker's clock)."""

    id: str
    nodes: int
    walltime: float
    submitted_at: float
    state: str = PENDING
    raw_state: str = ""
    hosts: tuple[tuple[str, int], ...] = ()
    started_at: float | None = None
    ends_at: float | None = None
    ended_at: float | None = None
    exit_code: int | None = None
    reason: str | None = None
    in_pool: tuple[str, ...] = ()       # pool node names currently added to the broker
    draining: bool = False               # removed ahead of its walltime
    cancel_requested: bool = False
    cancel_at: float | None = None       # drained with a grace: cancelled once it runs out
    idle_since: float | None = None
    seen: bool = False                   # the scheduler has listed it at least once

    @property
    def slots(self) -> int:
        return sum(k for _, k in self.hosts)

    @property
    def node_names(self) -> list[str]:
        return [node_name(self.id, h) for h, _ in self.hosts]

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL


@dataclass(frozen=True)
class SchedulerSupply:
    """Supply as the scheduler sees it, for the binding's dimension (``cpu`` or ``gpu``)
    and partition/queue: nodes and slots free/allocated, the queue's pending demand, and
    the expected start of a new pilot (epoch seconds, None when unknown)."""

    time: float
    dim: str
    nodes_total: int
    nodes_free: int
    nodes_down: int
    slots_total: int
    slots_free: int
    slots_allocated: int
    pending_jobs: int
    pending_slots: int | None
    expected_start: float | None = None

    def to_dict(self) -> dict:
        return dict(self.__dict__)


# --------------------------------------------------------------------------- binding
class Binding(abc.ABC):
    """The interface every facility binding implements (SPEC §12).

    Scheduler side — ``submit``, ``status``, ``cancel``, ``supply``, ``expected_start``;
    machine side — ``launch`` (a lease's work on exactly its placement, inside the pilot),
    ``revoke`` (signal now, kill at the deadline), ``kill`` and ``enforce`` (the kills that
    are due). ``execute`` and ``spawn`` are the seams.

    Options common to all: ``dim`` — the pool dimension the pilots provide (``"cpu"`` or
    ``"gpu"``); ``min_interval`` — no query command (status, supply, start estimates) runs
    more often than this, in clock seconds: within it the cached answer (or the cached
    error) is returned; ``command_timeout`` — real seconds a command may take;
    ``log_dir`` — where launched processes write ``lease-<id>.<k>.out/.err`` (default: the
    output is discarded); ``notice_signal`` — what a revoked lease's processes get first
    (SIGTERM); ``kill_check`` — real seconds after a kill before the launcher itself is
    killed if it has not gone.
    """

    name = "base"
    STATES: Mapping[str, str] = {}
    NODE_STATE_TABLE: Mapping[str, str] = {}

    def __init__(self, *, dim: str = "cpu", clock: Any = None,
                 wallclock: Callable[[], float] = time.time, min_interval: float = 5.0,
                 command_timeout: float = 60.0, log_dir: str | os.PathLike | None = None,
                 notice_signal: int = _signal.SIGTERM, kill_check: float = 10.0) -> None:
        if dim not in ("cpu", "gpu"):
            raise InvalidArgument("dim", "must be 'cpu' or 'gpu'", dim)
        for f, v in (("min_interval", min_interval), ("command_timeout", command_timeout),
                     ("kill_check", kill_check)):
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise InvalidArgument(f, "must be a finite number of seconds >= 0", v)
        self.dim = dim
        self.clock = clock
        self.wallclock = wallclock
        self.min_interval = float(min_interval)
        self.command_timeout = float(command_timeout)
        self.log_dir = None if log_dir is None else os.fspath(log_dir)
        self.notice_signal = int(notice_signal)
        self.kill_check = float(kill_check)
        self._cache: dict[str, tuple[float, Any, BaseException | None]] = {}
        self._handles: dict[int, list[Handle]] = {}
        self._kill_at: dict[int, float] = {}
        self._killed_at: dict[int, float] = {}   # lease -> real time of our kill
        self._kills: list[int] = []              # leases killed since the last enforce()
        self.commands_run = 0

    # ------------------------------------------------------------------ the seams
    def execute(self, argv: Sequence[str], *, input: str | None = None,
                env: Mapping[str, str] | None = None,
                timeout: float | None = None) -> subprocess.CompletedProcess:
        """Run one scheduler command and return its ``CompletedProcess`` (text). Raises
        :class:`CommandError` with the command and its stderr when it exits non-zero,
        times out or cannot start. Override to feed recorded output."""
        self.commands_run += 1
        return run_command(argv, input=input, env=env, timeout=timeout or self.command_timeout)

    def spawn(self, argv: Sequence[str], *, env: Mapping[str, str], cwd: str | None = None,
              stdout: Any = subprocess.DEVNULL, stderr: Any = subprocess.DEVNULL) -> Any:
        """Start one launched process (its own session, so its group can be signalled)
        and return the ``Popen``. Override to record launches instead."""
        try:
            return subprocess.Popen(list(argv), env=dict(env), cwd=cwd, stdout=stdout,
                                    stderr=stderr, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        except OSError as e:
            raise CommandError(argv, None, str(e)) from None

    # ------------------------------------------------------------------ time and caching
    def now(self) -> float:
        if self.clock is None:
            self.clock = MonotonicClock()
        return float(self.clock.now())

    def to_clock(self, epoch: float | None) -> float | None:
        """Scheduler epoch seconds -> the binding's clock."""
        if epoch is None:
            return None
        return self.now() + (float(epoch) - self.wallclock())

    def query(self, key: str, fn: Callable[[], Any]) -> Any:
        """``fn()``, at most once per ``min_interval`` per ``key``: within the interval
        the cached value is returned, or the cached error raised again."""
        now = self.now()
        hit = self._cache.get(key)
        if hit is not None and now - hit[0] < self.min_interval:
            if hit[2] is not None:
                raise hit[2]
            return hit[1]
        try:
            value = fn()
        except CommandError as e:
            self._cache[key] = (now, None, e)
            raise
        self._cache[key] = (now, value, None)
        return value

    def invalidate(self, *keys: str) -> None:
        """Forget cached answers (all, or those named): the next query runs."""
        if not keys:
            self._cache.clear()
        for k in keys:
            self._cache.pop(k, None)

    # ------------------------------------------------------------------ scheduler side
    @abc.abstractmethod
    def submit(self, nodes: int, walltime: float, *, name: str | None = None) -> str:
        """Submit one pilot of ``nodes`` nodes for ``walltime`` seconds; its id."""

    @abc.abstractmethod
    def status(self, ids: Sequence[str]) -> dict[str, PilotStatus]:
        """Status of the pilots the scheduler still lists (cached); absent ids are gone."""

    @abc.abstractmethod
    def cancel(self, ids: Sequence[str]) -> None:
        """Cancel pilots."""

    @abc.abstractmethod
    def supply(self) -> SchedulerSupply:
        """Free/allocated nodes and slots, pending demand (cached)."""

    @abc.abstractmethod
    def expected_start(self, nodes: int, walltime: float,
                       pending: Sequence[str] = ()) -> float | None:
        """Expected start (epoch seconds) of a new pilot of this shape: the earliest
        estimate among ``pending`` pilots, else the scheduler's estimate for a new one.
        None when unknown (cached)."""

    # ------------------------------------------------------------------ machine side
    def launch(self, lease: Any, argv: Sequence[str], env: Mapping[str, str] | None = None,
               *, per_slot: bool = False, cwd: str | None = None) -> LeaseHandle:
        """Run ``argv`` for ``lease`` on exactly the hosts and slots of its placement,
        inside the pilot allocations those hosts belong to, with ``env`` added to the
        environment (plus ``BURSAR_LEASE_ID``, ``BURSAR_SLOTS``, ``BURSAR_PILOT``).
        One process per host with all its slots, or with ``per_slot`` one per slot.
        ``lease`` is a :class:`~bursarcore.broker.Lease` (or anything with ``id``,
        ``state`` and ``placement``); it must be active or revoking."""
        if isinstance(argv, (str, bytes)) or not argv:
            raise InvalidArgument("argv", "must be a non-empty list of strings", argv)
        state = getattr(lease, "state", None)
        placement = tuple(getattr(lease, "placement", ()) or ())
        if state not in ("active", "revoking") or not placement:
            raise InvalidArgument("lease", "must be active (a lease that is starting has "
                                  "no placement yet; an ended one has none left)",
                                  getattr(lease, "id", lease))
        lid = int(lease.id)
        parts = []
        try:
            for k, (node, units) in enumerate(placement):
                pilot_id, host = split_node(node)
                full_env = self._lease_env(env, lid, pilot_id, host, int(units))
                parts.append(self._launch_part(lid, k, pilot_id, host, int(units),
                                               list(argv), full_env, per_slot, cwd))
        except BaseException:
            for p in parts:  # all or nothing: never leave half a lease running
                self._kill_part(p)
            raise
        self._handles.setdefault(lid, []).extend(parts)
        return LeaseHandle(lid, parts)

    def _lease_env(self, env: Mapping[str, str] | None, lid: int, pilot_id: str, host: str,
                   units: int) -> dict[str, str]:
        base = {k: v for k, v in os.environ.items() if not self._strip_env(k)}
        if env:
            for k, v in env.items():
                if not isinstance(k, str) or not isinstance(v, str):
                    raise InvalidArgument("env", "must map strings to strings", (k, v))
            base.update(env)
        base.update(BURSAR_LEASE_ID=str(lid), BURSAR_SLOTS=str(units),
                    BURSAR_PILOT=pilot_id, BURSAR_HOST=host)
        return base

    def _strip_env(self, key: str) -> bool:
        """Variables of the broker's own environment not passed to launched work."""
        return False

    def _outputs(self, lid: int, k: int) -> tuple[Any, Any]:
        if self.log_dir is None:
            return subprocess.DEVNULL, subprocess.DEVNULL
        os.makedirs(self.log_dir, exist_ok=True)
        base = os.path.join(self.log_dir, f"lease-{lid}.{k}")
        return open(base + ".out", "ab"), open(base + ".err", "ab")

    @abc.abstractmethod
    def _launch_part(self, lid: int, k: int, pilot_id: str, host: str, units: int,
                     argv: list[str], env: dict[str, str], per_slot: bool,
                     cwd: str | None) -> Handle:
        """Start the lease's work on one host of one pilot."""

    @abc.abstractmethod
    def _signal_part(self, handle: Handle, sig: int) -> None:
        """Deliver ``sig`` to exactly this part's processes (never the pilot's others)."""

    def _kill_part(self, handle: Handle) -> None:
        self._signal_part(handle, _signal.SIGKILL)

    def handles(self, lease_id: int) -> list[Handle]:
        return list(self._handles.get(int(lease_id), ()))

    def revoke(self, lease_id: int, deadline: float, sig: int | None = None) -> int:
        """Enforce a revocation: send the lease's running processes ``sig`` (the notice
        signal, SIGTERM by default) now, and kill them at ``deadline`` (clock seconds;
        :meth:`enforce` does it). Returns how many parts were signalled."""
        lid = int(lease_id)
        sig = self.notice_signal if sig is None else int(sig)
        n = 0
        for h in self._handles.get(lid, ()):
            self._mark(h)
            if h.poll() is None and not h.killed:
                try:
                    self._signal_part(h, sig)
                    h.signalled.append(sig)
                    n += 1
                except CommandError as e:  # the kill at the deadline still follows
                    log.warning("%s: signalling lease %d failed: %s", self.name, lid, e)
        if self._handles.get(lid):
            prev = self._kill_at.get(lid)
            self._kill_at[lid] = float(deadline) if prev is None else min(prev, float(deadline))
        return n

    def kill(self, lease_id: int) -> int:
        """Kill the lease's processes now. Returns how many parts were killed."""
        lid = int(lease_id)
        self._kill_at.pop(lid, None)
        n = 0
        for h in self._handles.get(lid, ()):
            self._mark(h)
            if h.poll() is None and not h.killed:
                try:
                    self._kill_part(h)
                except CommandError as e:
                    log.warning("%s: killing lease %d failed: %s", self.name, lid, e)
                h.killed = True
                n += 1
        if n:
            self._killed_at[lid] = time.monotonic()
            self._kills.append(lid)
        return n

    @staticmethod
    def _mark(h: Handle) -> None:
        # a part still running, or one that already died of its pilot's end (the
        # scheduler signalled it first), ends as "revoked"; one that exited 0 completed
        if h.poll() != 0:
            h.revoked = True

    def enforce(self) -> list[int]:
        """Kill the leases whose grace has run out; reap finished handles; make sure a
        killed lease's launcher goes too. Returns the leases killed since the last call
        (here, or by :meth:`kill` when the broker's ``revoked`` event came first)."""
        now = self.now()
        for lid in sorted(l for l, t in self._kill_at.items() if t <= now):
            self.kill(lid)
        done, self._kills = sorted(set(self._kills)), []
        for lid, t in list(self._killed_at.items()):
            hs = self._handles.get(lid, ())
            if all(h.poll() is not None for h in hs):
                del self._killed_at[lid]
            elif time.monotonic() - t > self.kill_check:
                for h in hs:
                    if h.poll() is None and isinstance(h, ProcessHandle):
                        h.send_group(_signal.SIGKILL)
        return done

    def next_deadline(self) -> float | None:
        """The earliest pending kill (clock seconds), or None: when :meth:`enforce` next
        has something to do (a discrete-event driver calls it then)."""
        return min(self._kill_at.values()) if self._kill_at else None

    def forget(self, keep: Iterable[int]) -> None:
        """Drop the handles of finished leases not in ``keep`` (the live ones), once all
        their processes have ended and no kill is pending. A lease's handles are kept
        while it lives, so that a revocation still finds (and marks) them."""
        keep = set(int(x) for x in keep)
        for lid in [l for l, hs in self._handles.items()
                    if l not in keep and l not in self._kill_at and l not in self._killed_at
                    and all(h.poll() is not None for h in hs)]:
            del self._handles[lid]

    def drop_pilot(self, pilot_id: str) -> None:
        """Forget the handles of a pilot that ended (its processes went with it)."""
        for lid, hs in list(self._handles.items()):
            keep = [h for h in hs if h.pilot_id != pilot_id or h.poll() is None]
            if keep:
                self._handles[lid] = keep
            else:
                self._handles.pop(lid, None)
