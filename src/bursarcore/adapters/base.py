"""Facility bindings: the interface, pilots, handles, status tables and the pool manager
(SPEC §12).

A *binding* is a thin adapter over one scheduler, in the manner of Parsl's providers:

* one module per scheduler (:mod:`.slurm`, :mod:`.pbs`, :mod:`.local`);
* a table from the scheduler's states to ours (:data:`PILOT_STATES`); a state missing
  from the table is logged once and mapped to ``"unknown"`` (:func:`map_state`);
* every scheduler command goes through one overridable method, :meth:`Binding.execute`,
  and every launched process through :meth:`Binding.spawn` — tests replace these two to
  feed recorded output, and the same code drives the real scheduler;
* a command that fails raises :class:`~bursarcore.errors.CommandError` (re-exported here)
  carrying the command and its stderr.

A binding knows the scheduler; it knows nothing of the broker. The :class:`PoolManager`
joins the two: it turns running pilot allocations into pool capacity
(``Broker.add_nodes``), takes them out again when they end (``Broker.remove_nodes``, which
revokes the leases on them with notice), keeps the warm pool between a minimum and a
maximum size from pending demand and congestion without flooding the scheduler (a token
bucket on submissions and a cap on pilots in flight), and enforces the broker's
revocations on the machine (signal, then kill after the grace).

Naming. A pool node is ``"<pilot id>/<host>"``: one host can carry several pilots (a
single-node test cluster, or partial-node pilots) and the broker needs unique node names;
the name also tells :meth:`Binding.launch` which allocation to run a lease's work in.

Time. The binding and the manager read the broker's clock (``clock.now()``, seconds) for
everything they decide — rate limits, caches, grace deadlines — so tests run on a
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
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence, cast

from ..buckets import TokenBuckets
from ..clock import MonotonicClock
from ..errors import CommandError, InvalidArgument

__all__ = [
    "PENDING", "HELD", "RUNNING", "SUSPENDED", "ENDING", "COMPLETED", "CANCELLED", "FAILED",
    "TIMEOUT", "UNKNOWN", "PILOT_STATES", "TERMINAL", "NODE_FREE", "NODE_PARTIAL",
    "NODE_BUSY", "NODE_DOWN", "NODE_UNKNOWN", "NODE_STATES", "CommandError", "map_state",
    "PilotStatus", "Pilot", "SchedulerSupply", "Handle", "ProcessHandle", "LeaseHandle",
    "Binding", "PoolManager", "Provision", "TickReport", "node_name", "split_node",
    "exit_code_of", "COLD_WAIT_MODES", "run_command",
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


def exit_code_of(returncode: int | None) -> int | None:
    """A Popen return code in shell convention: a death by signal N becomes 128 + N."""
    if returncode is None:
        return None
    return 128 - returncode if returncode < 0 else returncode


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


# --------------------------------------------------------------------------- handles
class Handle(abc.ABC):
    """One launched process group of a lease: on one host of one pilot."""

    def __init__(self, lease_id: int, pilot_id: str, host: str, slots: int,
                 argv: Sequence[str]) -> None:
        self.lease_id = lease_id
        self.pilot_id = pilot_id
        self.host = host
        self.slots = slots
        self.argv = list(argv)
        self.signalled: list[int] = []   # signals our enforcement delivered
        self.killed = False
        self.revoked = False             # its lease was revoked while it ran

    @abc.abstractmethod
    def poll(self) -> int | None:
        """The exit code (shell convention) once ended, else None."""

    @abc.abstractmethod
    def wait(self, timeout: float | None = None) -> int | None:
        """Wait (real time, bounded by ``timeout``) for the end; the exit code or None."""

    @property
    def exit_code(self) -> int | None:
        return self.poll()

    @property
    def status(self) -> str:
        """``running``, ``completed`` (exit 0), ``failed`` (non-zero exit) or ``revoked``
        (its lease was revoked while it ran: ended by our signal or kill, or by its
        pilot's end)."""
        rc = self.poll()
        if rc is None:
            return "running"
        if self.signalled or self.killed or self.revoked:
            return "revoked"
        return "completed" if rc == 0 else "failed"

    def __repr__(self) -> str:
        return (f"<{type(self).__name__} lease={self.lease_id} pilot={self.pilot_id} "
                f"host={self.host} slots={self.slots} status={self.status}>")


class ProcessHandle(Handle):
    """A handle over a local process (``Popen``), its own session and process group."""

    def __init__(self, proc: Any, lease_id: int, pilot_id: str, host: str, slots: int,
                 argv: Sequence[str]) -> None:
        super().__init__(lease_id, pilot_id, host, slots, argv)
        self.proc = proc

    @property
    def pid(self) -> int:
        return self.proc.pid

    def poll(self) -> int | None:
        return exit_code_of(self.proc.poll())

    def wait(self, timeout: float | None = None) -> int | None:
        try:
            return exit_code_of(self.proc.wait(timeout=timeout))
        except subprocess.TimeoutExpired:
            return None

    def send_group(self, sig: int) -> bool:
        """Signal the process group (the process started a session of its own). A
        stand-in process (a test's) may provide ``signal_group(sig)`` instead."""
        if self.proc.poll() is not None:
            return False
        own = getattr(self.proc, "signal_group", None)
        if own is not None:
            own(sig)
            return True
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            return False
        except PermissionError:  # pragma: no cover - not our group
            self.proc.send_signal(sig)
        return True


class LeaseHandle:
    """Everything launched for one lease (one part per host of its placement)."""

    def __init__(self, lease_id: int, parts: Sequence[Handle]) -> None:
        self.lease_id = lease_id
        self.parts = list(parts)

    @property
    def exit_code(self) -> int | None:
        """None while any part runs; then the largest part exit code."""
        codes = [p.poll() for p in self.parts]
        done = [c for c in codes if c is not None]
        if len(done) < len(codes):
            return None
        return max(done) if done else 0

    @property
    def status(self) -> str:
        """``running`` while any part runs; then ``revoked`` if any part was ended by
        enforcement, ``failed`` if any exited non-zero, else ``completed``."""
        states = [p.status for p in self.parts]
        if "running" in states:
            return "running"
        for s in ("revoked", "failed"):
            if s in states:
                return s
        return "completed"

    def wait(self, timeout: float | None = None) -> int | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        for p in self.parts:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if p.wait(left) is None:
                return None
        return self.exit_code

    def __repr__(self) -> str:
        return f"<LeaseHandle lease={self.lease_id} parts={len(self.parts)} status={self.status}>"


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


# --------------------------------------------------------------------------- manager
#: ``PoolManager(cold_wait=...)``: how the binding's start estimate becomes the broker's
#: ``cold_wait``
COLD_WAIT_MODES = ("if_unset", "replace", "off")

@dataclass(frozen=True)
class Provision:
    """The answer to :meth:`PoolManager.provision`: ``submitted`` with the pilot, or
    ``throttled`` with the reason (``rate`` or ``in_flight``) and, for the rate limit, the
    seconds until a submission is allowed."""

    outcome: str
    pilot: Pilot | None = None
    reason: str | None = None
    retry_after: float | None = None


@dataclass
class TickReport:
    """What one :meth:`PoolManager.tick` did."""

    time: float
    joined: list[str] = field(default_factory=list)      # pilots whose slots joined the pool
    left: list[str] = field(default_factory=list)        # pilots whose slots left it
    drained: list[str] = field(default_factory=list)     # removed ahead of their walltime
    ended: list[str] = field(default_factory=list)       # reached a terminal state
    submitted: list[str] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    throttled: int = 0
    revoked: list[int] = field(default_factory=list)     # leases revoked by the pool shrinking
    killed: list[int] = field(default_factory=list)      # leases whose grace ran out
    errors: list[str] = field(default_factory=list)


class PoolManager:
    """Keeps a broker's pool of dimension ``dim`` backed by pilot allocations.

    ``PoolManager(broker, binding, nodes_per_pilot=1, walltime=3600, min_pilots=1,
    max_pilots=8, max_in_flight=2, submit_rate=1/60, submit_burst=2)``; call
    :meth:`tick` periodically from the thread that owns the broker (the broker is not
    thread-safe; its event callbacks run inside broker calls).

    Each tick:

    1. reads pilot states (one cached scheduler query); a pilot that starts running joins
       the pool (``add_nodes``: one node ``<pilot>/<host>`` per host, its slots of ``dim``);
       one that stops running leaves it (``remove_nodes``, grace 0 — its processes are
       gone); a running pilot within ``drain_lead`` seconds of its walltime is *drained*:
       removed with grace up to ``drain_margin`` seconds before its end, so its leases get a
       ``preempt_notice`` and their processes a signal before the scheduler kills them;
    2. advances the broker (expiries, revocations due) and kills leases whose grace ran out;
    3. autoscales (``autoscale=True``): wants ``ceil((pending capacity demand - free) /
       slots per pilot)`` more pilots than are in flight, at least one more when
       congestion ≥ ``congestion_high`` and none is in flight; stays within
       [``min_pilots``, ``max_pilots``] (pilots running and not drained, plus in flight);
       never has more than ``max_in_flight`` pilots queued; each submission takes a token
       from a bucket of ``submit_burst`` refilled at ``submit_rate`` per second. Scales in
       when nothing is pending and congestion < ``congestion_low``: a pilot with no lease
       for ``idle_time`` seconds is cancelled, down to ``min_pilots``.

    Revocations are enforced from the broker's events (``subscribe``): a
    ``preempt_notice`` signals the lease's processes and schedules the kill at its
    deadline; ``revoked`` kills at once; ``expired`` signals and kills after
    ``expiry_grace``.

    ``state_every`` (seconds, default 0: every tick) bounds how often a tick reads the
    broker's whole state (``Broker.state()``, which lists every live lease): for idle
    tracking, forgetting finished handles, and demand-driven scaling. A tick between reads
    still follows the pilots, drains, enforces the kills due and keeps at least
    ``min_pilots`` — all a fixed-size pool (``min_pilots == max_pilots``) needs; a
    discrete-event driver that ticks at many instants (the simulator) sets it.

    The manager also becomes the broker's ``cold_wait`` (the expected
    start of a new pilot): ``cold_wait="if_unset"`` (default) unless the broker already
    has one, ``"replace"`` always, ``"off"`` never; :meth:`attach_cold_wait` and
    :meth:`detach_cold_wait` change it later.
    """

    def __init__(self, broker: Any, binding: Binding, *, dim: str | None = None,
                 nodes_per_pilot: int = 1, walltime: float = 3600.0, min_pilots: int = 0,
                 max_pilots: int = 1, max_in_flight: int = 1, submit_rate: float = 1 / 60,
                 submit_burst: float = 2.0, slots_per_pilot: int | None = None,
                 drain_lead: float | None = None, drain_margin: float = 5.0,
                 idle_time: float = 120.0, congestion_high: float = 0.9,
                 congestion_low: float = 0.5, expiry_grace: float = 5.0,
                 autoscale: bool = True, attach: bool = True,
                 pilot_name: str = "bursar-pilot", cold_wait: str = "if_unset",
                 state_every: float = 0.0) -> None:
        self.broker = broker
        self.binding = binding
        self.dim = binding.dim if dim is None else dim
        if self.dim not in broker.dims:
            raise InvalidArgument("dim", f"must be one of the broker's dimensions {broker.dims}",
                                  self.dim)
        if binding.clock is None:
            binding.clock = broker.clock
        elif binding.clock is not broker.clock:
            raise InvalidArgument("binding.clock", "must be the broker's clock", binding.clock)
        self.clock = broker.clock
        for f, v, lo in (("nodes_per_pilot", nodes_per_pilot, 1), ("min_pilots", min_pilots, 0),
                         ("max_pilots", max_pilots, 0), ("max_in_flight", max_in_flight, 1)):
            if not isinstance(v, int) or isinstance(v, bool) or v < lo:
                raise InvalidArgument(f, f"must be an integer >= {lo}", v)
        if min_pilots > max_pilots:
            raise InvalidArgument("min_pilots", "must be <= max_pilots", min_pilots)
        for f, x in (("walltime", walltime), ("submit_rate", submit_rate),
                     ("submit_burst", submit_burst)):
            if not isinstance(x, (int, float)) or not math.isfinite(x) or x <= 0:
                raise InvalidArgument(f, "must be a finite number > 0", x)
        if submit_burst < 1:
            raise InvalidArgument("submit_burst", "must be >= 1 (one submission)", submit_burst)
        self.nodes_per_pilot = nodes_per_pilot
        self.walltime = float(walltime)
        self.min_pilots, self.max_pilots, self.max_in_flight = min_pilots, max_pilots, max_in_flight
        self.slots_per_pilot = slots_per_pilot
        self.drain_lead = min(300.0, 0.1 * self.walltime) if drain_lead is None else float(drain_lead)
        self.drain_margin = float(drain_margin)
        self.idle_time = float(idle_time)
        self.congestion_high, self.congestion_low = float(congestion_high), float(congestion_low)
        self.expiry_grace = float(expiry_grace)
        if not isinstance(state_every, (int, float)) or not state_every >= 0:
            raise InvalidArgument("state_every", "must be a number of seconds >= 0", state_every)
        self.state_every = float(state_every)
        self._state_at: float | None = None
        self.autoscale = autoscale
        self.pilot_name = pilot_name
        self.pilots: dict[str, Pilot] = {}
        self._queued: dict[str, None] = {}   # pilots pending or held, in submission order
        self._cold_memo: tuple[float, int, float | None] | None = None
        self._bucket = TokenBuckets([float(submit_burst)], [float(submit_rate)],
                                    now=self.clock.now())
        self.submissions: list[tuple[float, str]] = []   # (clock time, pilot id)
        if cold_wait not in COLD_WAIT_MODES:
            raise InvalidArgument("cold_wait", f"must be one of {COLD_WAIT_MODES}", cold_wait)
        if attach:
            broker.subscribe(self._on_event)
            if cold_wait != "off":
                self.attach_cold_wait(replace=cold_wait == "replace")

    def attach_cold_wait(self, replace: bool = True) -> bool:
        """Make the binding's start estimate the broker's ``cold`` path
        (``broker.cold_wait = self.cold_wait``). With ``replace=False`` a ``cold_wait``
        the broker already has is kept. Returns whether it is now the manager's."""
        if replace or getattr(self.broker, "cold_wait", None) is None:
            self.broker.cold_wait = self.cold_wait
        return self.broker.cold_wait == self.cold_wait

    def detach_cold_wait(self) -> None:
        """Stop answering the broker's ``cold`` path (if this manager does)."""
        if getattr(self.broker, "cold_wait", None) == self.cold_wait:
            self.broker.cold_wait = None

    # ------------------------------------------------------------------ events
    def _on_event(self, ev: Any) -> None:
        if ev.lease_id is None or ev.lease_id not in self.binding._handles:
            return                        # nothing of this lease was launched
        if ev.kind == "preempt_notice":
            self.binding.revoke(ev.lease_id, ev.deadline if ev.deadline is not None else ev.time)
        elif ev.kind == "revoked":
            self.binding.kill(ev.lease_id)
        elif ev.kind == "expired":
            self.binding.revoke(ev.lease_id, ev.time + self.expiry_grace)

    # ------------------------------------------------------------------ public
    def provision(self, nodes: int | None = None, walltime: float | None = None, *,
                  force: bool = False) -> Provision:
        """Submit one pilot now (``nodes`` and ``walltime`` default to the manager's).
        Subject to the in-flight cap and the submission rate limit unless ``force``."""
        nodes = self.nodes_per_pilot if nodes is None else nodes
        walltime = self.walltime if walltime is None else walltime
        if not isinstance(nodes, int) or nodes < 1:
            raise InvalidArgument("nodes", "must be an integer >= 1", nodes)
        if not isinstance(walltime, (int, float)) or not math.isfinite(walltime) or walltime <= 0:
            raise InvalidArgument("walltime", "must be a finite number of seconds > 0", walltime)
        now = self.clock.now()
        if not force:
            if len(self._in_flight()) >= self.max_in_flight:
                return Provision("throttled", reason="in_flight")
            if not self._bucket.try_debit(0, 1.0, now):
                return Provision("throttled", reason="rate",
                                 retry_after=float(self._bucket.time_until(0, 1.0, now)))
        pid = self.binding.submit(nodes, float(walltime), name=self.pilot_name)
        p = Pilot(id=pid, nodes=nodes, walltime=float(walltime), submitted_at=now)
        self.pilots[pid] = p
        self._cold_memo = None
        self._queued[pid] = None
        self.submissions.append((now, pid))
        log.info("%s: submitted pilot %s (%d node(s), %.0f s)", self.binding.name, pid,
                 nodes, walltime)
        return Provision("submitted", pilot=p)

    def cancel(self, pilot_id: str, grace: float = 0.0) -> None:
        """Take a pilot out of the pool (its leases revoked with ``grace``) and cancel it."""
        p = self.pilots[pilot_id]
        if p.in_pool:
            self._remove(p, grace)
        self._cold_memo = None
        if not p.terminal and not p.cancel_requested:
            self.binding.cancel([p.id])
            p.cancel_requested = True

    def drain(self, pilot_id: str, grace: float = 0.0) -> list[int]:
        """Take a pilot out of the pool gracefully: its leases get a ``preempt_notice``
        ``grace`` seconds ahead (their processes the notice signal now, the kill at the
        deadline), and the pilot itself is cancelled at the first :meth:`tick` after the
        grace. (:meth:`cancel` cancels the allocation at once, which takes the processes
        with it whatever the grace.) A drained pilot no longer counts towards
        ``min_pilots``, so a replacement may be submitted meanwhile. Returns the leases
        revoked."""
        if not isinstance(grace, (int, float)) or not math.isfinite(grace) or grace < 0:
            raise InvalidArgument("grace", "must be a finite number of seconds >= 0", grace)
        p = self.pilots[pilot_id]
        revoked = self._remove(p, float(grace)) if p.in_pool else []
        self._cold_memo = None
        if not p.terminal:
            p.draining = True
            p.cancel_at = self.clock.now() + float(grace)
        return revoked

    def next_event(self, kills: bool = True) -> float | None:
        """The next clock time at which :meth:`tick` has something to do by itself — a
        pilot to drain before its walltime, a drained pilot to cancel, a pilot the binding
        will start or end (``binding.next_event()``, where it has one), and with ``kills``
        a kill the binding owes (``binding.next_deadline()``; a driver may instead call
        ``binding.enforce()`` then) — or None. A discrete-event driver (the simulator)
        ticks then, plus now and then for autoscaling, instead of every second."""
        times = []
        for p in self.pilots.values():
            if p.in_pool and not p.draining and p.ends_at is not None:
                times.append(p.ends_at - self.drain_lead)
            if p.cancel_at is not None and not p.cancel_requested and not p.terminal:
                times.append(p.cancel_at)
        fns = [getattr(self.binding, "next_event", None)]
        if kills:
            fns.append(self.binding.next_deadline)
        for f in fns:
            t = f() if f is not None else None
            if t is not None:
                times.append(t)
        return min(times) if times else None

    def shutdown(self, grace: float = 0.0) -> None:
        """Stop autoscaling and cancel every live pilot (leases on them revoked with
        ``grace``)."""
        self.autoscale = False
        for p in list(self.pilots.values()):
            if not p.terminal:
                self.cancel(p.id, grace)

    def launch(self, lease: Any, argv: Sequence[str], env: Mapping[str, str] | None = None,
               **kw: Any) -> LeaseHandle:
        """:meth:`Binding.launch` for a lease (or lease id) of the broker."""
        if isinstance(lease, int):
            lease = self.broker.lease(lease)
        return self.binding.launch(lease, argv, env, **kw)

    def live(self) -> list[Pilot]:
        return [p for p in self.pilots.values() if not p.terminal]

    def cold_wait(self, dim: str) -> float | None:
        """Expected seconds until a new pilot would start (the broker's ``cold`` path)."""
        if dim != self.dim:
            return None
        now = self.clock.now()
        memo = self._cold_memo        # supply() and quote() may ask many times an instant
        if memo is not None and memo[0] == now and memo[1] == len(self._queued):
            return memo[2]
        wait = self._cold_wait()
        self._cold_memo = (now, len(self._queued), wait)
        return wait

    def _cold_wait(self) -> float | None:
        pending = list(self._queued)
        try:
            t = self.binding.expected_start(self.nodes_per_pilot, self.walltime, pending)
        except CommandError as e:
            log.warning("%s: start estimate unavailable: %s", self.binding.name, e)
            return None
        if t is None:
            return None
        return max(0.0, float(t) - self.binding.wallclock())

    # ------------------------------------------------------------------ the loop
    def tick(self) -> TickReport:
        """One round: pilot states, pool membership, drains, enforcement, autoscaling."""
        now = self.clock.now()
        rep = TickReport(time=now)
        self._cold_memo = None
        live = [p for p in self.pilots.values() if not p.terminal]
        if live:
            try:
                st = self.binding.status([p.id for p in live])
            except CommandError as e:
                log.warning("%s: status unavailable: %s", self.binding.name, e)
                rep.errors.append(str(e))
                st = None
            if st is not None:
                for p in live:
                    self._update(p, st.get(p.id), now, rep)
        for p in self.pilots.values():
            if p.in_pool and not p.draining and p.ends_at is not None \
                    and p.ends_at - now <= self.drain_lead:
                grace = max(0.0, p.ends_at - self.drain_margin - now)
                rep.revoked.extend(self._remove(p, grace))
                p.draining = True
                rep.drained.append(p.id)
        state = None
        if self.state_every <= 0 or self._state_at is None \
                or now - self._state_at >= self.state_every:
            state = self.broker.state()      # advances the broker: events due now fire
            self._state_at = now
        rep.killed.extend(self.binding.enforce())
        for p in self.pilots.values():
            if p.cancel_at is not None and p.cancel_at <= now and not p.cancel_requested \
                    and not p.terminal:
                self.binding.cancel([p.id])
                p.cancel_requested = True
                rep.cancelled.append(p.id)
        if state is not None:
            self.binding.forget(l["id"] for l in state["leases"])
            self._track_idle(state, now)
        if self.autoscale:
            self._scale(state, now, rep)
        return rep

    def _in_flight(self) -> list[Pilot]:
        return [p for p in self.pilots.values()
                if p.state in (PENDING, HELD, UNKNOWN) and not p.terminal and not p.cancel_requested]

    def _update(self, p: Pilot, s: PilotStatus | None, now: float, rep: TickReport) -> None:
        if s is None:
            # the scheduler no longer lists it (purged) or not yet (a submission race)
            if p.seen or now - p.submitted_at > max(60.0, 3 * self.binding.min_interval):
                s = PilotStatus(state=CANCELLED if p.cancel_requested else
                                (COMPLETED if p.seen else FAILED),
                                raw="(not listed)", reason="no longer listed by the scheduler")
            else:
                return
        p.seen = p.seen or s.raw != "(not listed)"
        p.raw_state = s.raw
        p.state = s.state
        if p.state in (PENDING, HELD):
            self._queued[p.id] = None
        else:
            self._queued.pop(p.id, None)
        if s.hosts and s.hosts != p.hosts:
            p.hosts = tuple((str(h), int(k)) for h, k in s.hosts if int(k) > 0)
        if s.exit_code is not None:
            p.exit_code = s.exit_code
        if s.reason:
            p.reason = s.reason
        if p.state == RUNNING:
            if p.started_at is None:
                p.started_at = self.binding.to_clock(s.start) if s.start else now
                if not p.hosts:
                    log.warning("%s: pilot %s runs but reports no %s slots; it cannot join "
                                "the pool", self.binding.name, p.id, self.dim)
            if s.end is not None:
                p.ends_at = self.binding.to_clock(s.end)
            elif p.ends_at is None:
                assert p.started_at is not None   # (set just above)
                p.ends_at = p.started_at + p.walltime
            if not p.in_pool and not p.draining and not p.cancel_requested and p.hosts:
                names = self.broker.add_nodes(self.dim, [(node_name(p.id, h), k)
                                                         for h, k in p.hosts])
                p.in_pool = tuple(node_name(p.id, h) for h, _ in p.hosts)
                p.idle_since = now
                if self.slots_per_pilot is None or p.nodes == self.nodes_per_pilot:
                    self.slots_per_pilot = p.slots
                rep.joined.append(p.id)
                log.info("%s: pilot %s joined the pool: %s (%d slot ids)", self.binding.name,
                         p.id, p.hosts, len(names))
        elif p.in_pool:
            rep.revoked.extend(self._remove(p, 0.0))
            rep.left.append(p.id)
            log.info("%s: pilot %s left the pool (%s)", self.binding.name, p.id, p.raw_state)
        if p.terminal:
            p.ended_at = now
            rep.ended.append(p.id)
            self.binding.drop_pilot(p.id)

    def _remove(self, p: Pilot, grace: float) -> list[int]:
        names = list(p.in_pool)
        p.in_pool = ()
        if not names:
            return []
        return self.broker.remove_nodes(self.dim, names, grace=grace)

    def _track_idle(self, state: dict, now: float) -> None:
        busy = {node.partition("/")[0] for l in state["leases"] if l["dim"] == self.dim
                for node, _ in l["placement"]}
        for p in self.pilots.values():
            if not p.in_pool or p.id in busy:
                p.idle_since = None
            elif p.idle_since is None:
                p.idle_since = now

    def _scale(self, state: dict | None, now: float, rep: TickReport) -> None:
        running = [p for p in self.pilots.values()
                   if p.state == RUNNING and not p.draining and not p.cancel_requested]
        flight = self._in_flight()
        demand, kappa, want = None, 0.0, 0
        if state is not None:                # else: between reads, keep the floor only
            pool = state["pool"][self.dim]
            demand = sum(int(x["min"]) for x in self.broker.pending()
                         if x["dim"] == self.dim and x["reason"] == "capacity")
            kappa = float(pool["congestion"])
            spp = max(1, self.slots_per_pilot or self.nodes_per_pilot)
            want = math.ceil(max(0, demand - int(pool["free"])) / spp) - len(flight)
            if kappa >= self.congestion_high and not flight:
                want = max(want, 1)
        total = len(running) + len(flight)
        target = min(self.max_pilots, max(self.min_pilots, total + max(0, want)))
        for _ in range(max(0, target - total)):
            try:
                r = self.provision()
            except CommandError as e:        # e.g. sbatch refused (account, QOS, limits)
                log.warning("%s: submitting a pilot failed: %s", self.binding.name, e)
                rep.errors.append(str(e))
                break
            if r.outcome != "submitted":
                rep.throttled += 1
                break
            assert r.pilot is not None            # a submission names its pilot
            rep.submitted.append(r.pilot.id)
        if demand == 0 and kappa < self.congestion_low and total > self.min_pilots:
            surplus = total - self.min_pilots
            idle = sorted((p for p in running if p.idle_since is not None
                           and now - p.idle_since >= self.idle_time),
                          key=lambda p: cast(float, p.idle_since))     # (not None: above)
            for p in idle[:surplus]:
                self.cancel(p.id)
                rep.cancelled.append(p.id)
