"""Local binding: the facility interface over processes on this host (SPEC §12).

No scheduler: a "pilot" is a pretend allocation of ``slots_per_node`` slots on each of
``nodes`` pseudo-hosts, all of them this machine. It starts ``start_delay`` clock seconds
after submission (a queue wait), ends at its walltime or when cancelled, and the host
has ``total_slots`` to hand out (pilots beyond that wait, as in a full cluster). A lease's
work runs as ordinary subprocesses, each in a session of its own so that enforcement can
signal exactly its process group.

This is the embedded default for the simulator, the demos and tests without a scheduler:
on a :class:`~bursarcore.clock.ManualClock` the pool manager drives it in simulated time.
``fail(pilot_id)`` emulates a node failure.

Two execution modes behind the same :meth:`~bursarcore.adapters.Binding.launch`,
``revoke``, ``kill`` and ``enforce``:

* ``execution="process"`` (the default): a lease's work is real subprocesses, each in a
  session of its own, signalled as a process group;
* ``execution="simulated"``: nothing is started. A launch returns :class:`SimHandle` parts
  whose work "runs" on the binding's clock: it ends when its ``duration`` has passed (exit
  0), when :meth:`LocalBinding.finish` says the lease's work is done (the simulator does,
  when an agent releases its lease), or when enforcement kills it (exit 137). The notice
  signal is recorded and, with ``sim_on_notice="exit"``, ends the work at once (a task
  that checkpoints and leaves); with ``"ignore"`` (the default) it runs on until the kill.
  The simulator uses this mode, so a run of thousands of leases spawns no process.

The mode is an attribute: a demo may run its simulated hour simulated and then switch to
``"process"`` to launch real work on the same pilots.
"""

from __future__ import annotations

import itertools
import math
import os
import signal as _signal
import time
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from ..errors import InvalidArgument
from .handles import Handle, ProcessHandle
from .interface import (CANCELLED, FAILED, NODE_BUSY, NODE_FREE, NODE_PARTIAL, PENDING, RUNNING,
                        TIMEOUT, Binding, PilotStatus, SchedulerSupply)

__all__ = ["LocalBinding", "LOCAL_STATES", "SimHandle", "EXECUTION_MODES"]

#: ``LocalBinding(execution=...)``: real subprocesses, or work on the simulated clock
EXECUTION_MODES = ("process", "simulated")

#: the local binding's own states (it has no scheduler) to ours
LOCAL_STATES = {"queued": PENDING, "running": RUNNING, "cancelled": CANCELLED,
                "failed": FAILED, "timeout": TIMEOUT}


@dataclass
class _LocalPilot:
    id: str
    nodes: int
    walltime: float
    submitted: float
    start: float | None = None
    end: float | None = None
    state: str = "queued"
    reason: str | None = None


class SimHandle(Handle):
    """One part of a simulated launch: no process, the work "runs" on the binding's clock.

    It ends (``poll()`` is then its exit code) at ``started + duration`` with 0, at
    :meth:`end` (the simulator: the lease's work is done), on the notice signal when
    ``on_notice="exit"`` (128 + the signal), or on SIGKILL (137). ``received`` lists the
    signals delivered to it, with ``(signal, clock time)``; ``ended_at`` is when it ended.
    """

    def __init__(self, binding: "LocalBinding", lease_id: int, pilot_id: str, host: str,
                 slots: int, argv: Sequence[str], duration: float | None,
                 on_notice: str) -> None:
        super().__init__(lease_id, pilot_id, host, slots, argv)
        self._binding = binding
        self.started = binding.now()
        self.ends_at = None if duration is None else self.started + float(duration)
        self.on_notice = on_notice
        self.received: list[tuple[int, float]] = []
        self.ended_at: float | None = None
        self.env: dict[str, str] = {}     # what the work would have had: the lease's own
        self._code: int | None = None

    def poll(self) -> int | None:
        if self._code is None and self.ends_at is not None \
                and self._binding.now() >= self.ends_at:
            self._code, self.ended_at = 0, self.ends_at
        return self._code

    def wait(self, timeout: float | None = None) -> int | None:
        """Simulated work does not advance by waiting: the clock moves it."""
        return self.poll()

    def end(self, code: int = 0) -> bool:
        """End the work now with ``code`` (shell convention); False if it had ended."""
        if self.poll() is not None:
            return False
        self._code, self.ended_at = int(code), self._binding.now()
        return True

    def deliver(self, sig: int) -> None:
        if self.poll() is not None:
            return
        self.received.append((int(sig), self._binding.now()))
        if sig == _signal.SIGKILL or self.on_notice == "exit":
            self.end(128 + int(sig))


class LocalBinding(Binding):
    """``LocalBinding(slots_per_node=4, total_slots=None, start_delay=0.0,
    execution="process")``.

    ``total_slots`` defaults to ``os.cpu_count()`` for ``dim="cpu"`` (it is only
    bookkeeping: nothing stops a pilot from asking more than the machine has, use it to
    emulate a cluster's size); pilots that do not fit wait, first come first served.
    ``host`` names the pseudo-hosts (``localhost``, or ``localhost-0``... for
    multi-node pilots). ``execution`` is ``"process"`` (real subprocesses) or
    ``"simulated"`` (:class:`SimHandle`: work on the clock; ``sim_duration`` seconds, or
    until :meth:`finish`; ``sim_on_notice`` ``"ignore"`` or ``"exit"``).
    """

    name = "local"
    STATES = LOCAL_STATES

    def __init__(self, *, slots_per_node: int = 4, total_slots: int | None = None,
                 start_delay: float = 0.0, host: str = "localhost",
                 execution: str = "process", sim_duration: float | None = None,
                 sim_on_notice: str = "ignore", **kw: Any) -> None:
        super().__init__(**kw)
        if not isinstance(slots_per_node, int) or slots_per_node < 1:
            raise InvalidArgument("slots_per_node", "must be an integer >= 1", slots_per_node)
        if total_slots is None:
            total_slots = max(slots_per_node, os.cpu_count() or 1)
        if not isinstance(total_slots, int) or total_slots < 1:
            raise InvalidArgument("total_slots", "must be an integer >= 1", total_slots)
        self.slots_per_node = slots_per_node
        self.total_slots = total_slots
        self._dirty = True
        self.start_delay = start_delay
        self.host = host
        self.execution = execution
        if sim_duration is not None and (not isinstance(sim_duration, (int, float))
                                         or not math.isfinite(sim_duration) or sim_duration < 0):
            raise InvalidArgument("sim_duration", "must be None or seconds >= 0", sim_duration)
        if sim_on_notice not in ("ignore", "exit"):
            raise InvalidArgument("sim_on_notice", "must be 'ignore' or 'exit'", sim_on_notice)
        self.sim_duration = sim_duration
        self.sim_on_notice = sim_on_notice
        self._pilots: dict[str, _LocalPilot] = {}
        self._ids = itertools.count(1)
        self._t: float | None = None       # how far _advance has simulated
        self._dirty = True                 # pilots changed since then
        self._horizon = math.inf           # when one next starts or ends by itself
        self._version = 0                  # bumped whenever pilots may have changed
        self._start_cache: dict[tuple, float | None] = {}
        self._host_lists: dict[tuple, tuple[tuple[str, int], ...]] = {}
        if "wallclock" not in kw:
            # epochs are the clock plus a fixed offset, so that times reported as epochs
            # come back to the same clock values (a manual clock stays exact)
            self._offset: float | None = None
            self.wallclock = self._epoch

    @property
    def execution(self) -> str:
        """``"process"`` or ``"simulated"``; may be changed between launches (handles
        already launched keep their kind)."""
        return self._execution

    @execution.setter
    def execution(self, mode: str) -> None:
        if mode not in EXECUTION_MODES:
            raise InvalidArgument("execution", f"must be one of {EXECUTION_MODES}", mode)
        self._execution = mode

    @property
    def start_delay(self) -> float:
        """Clock seconds a pilot waits in the queue (the ``cold`` path's wait when slots
        are free). May be changed at any time: pilots still queued wait the new delay."""
        return self._start_delay

    @start_delay.setter
    def start_delay(self, seconds: float) -> None:
        if not isinstance(seconds, (int, float)) or not math.isfinite(seconds) or seconds < 0:
            raise InvalidArgument("start_delay", "must be a number of seconds >= 0", seconds)
        self._start_delay = float(seconds)
        self._dirty = True

    @property
    def simulated(self) -> bool:
        return self._execution == "simulated"

    def _epoch(self) -> float:
        if self._offset is None:
            self._offset = time.time() - self.now()
        return self.now() + self._offset

    def _hosts(self, p: _LocalPilot) -> tuple[tuple[str, int], ...]:
        key = (self.host, self.slots_per_node, p.nodes)
        hosts = self._host_lists.get(key)         # the same for every pilot of this shape
        if hosts is None:
            if p.nodes == 1:
                hosts = ((self.host, self.slots_per_node),)
            else:
                hosts = tuple((f"{self.host}-{i}", self.slots_per_node)
                              for i in range(p.nodes))
            self._host_lists[key] = hosts
        return hosts

    def _advance(self) -> None:
        """Simulate up to the clock, event by event: pilots end at their walltimes, and
        queued pilots start (first come, first served) as soon as they are past their
        queue wait and their slots are free — at that instant, not when next looked at."""
        now = self.now()
        if not self._dirty and self._t is not None and self._t <= now < self._horizon:
            self._t = now                  # nothing can have happened since the last look
            return
        self._dirty = False
        self._version += 1
        t = now if self._t is None else min(self._t, now)
        while True:
            used = sum(p.nodes * self.slots_per_node for p in self._pilots.values()
                       if p.state == "running")
            for p in self._pilots.values():       # FIFO: nobody jumps the queue
                if p.state != "queued":
                    continue
                need = p.nodes * self.slots_per_node
                if p.submitted + self.start_delay > t or used + need > self.total_slots:
                    break
                used += need
                p.state, p.start, p.end = "running", t, t + p.walltime
            ends = [p.end for p in self._pilots.values()
                    if p.state == "running" and p.end is not None and p.end <= now]
            ready = [p.submitted + self.start_delay for p in self._pilots.values()
                     if p.state == "queued" and t < p.submitted + self.start_delay <= now]
            if not ends and not ready:
                break
            t = min(ends + ready)
            for p in self._pilots.values():
                if p.state == "running" and p.end is not None and p.end <= t:
                    p.state, p.reason = "timeout", "walltime"
                    self._end(p)
        self._t = now
        # the next instant a pilot can start or end by itself (a queued pilot held back
        # by slots starts at an end)
        times = [p.end for p in self._pilots.values() if p.state == "running"
                 and p.end is not None]
        times += [p.submitted + self.start_delay for p in self._pilots.values()
                  if p.state == "queued" and p.submitted + self.start_delay > now]
        self._horizon = min(times) if times else math.inf

    def _end(self, p: _LocalPilot) -> None:
        # no scheduler will clean up after a local pilot: its processes go with it
        for hs in list(self._handles.values()):
            for h in hs:
                if h.pilot_id == p.id and h.poll() is None:
                    if isinstance(h, ProcessHandle):
                        h.send_group(_signal.SIGKILL)
                    elif isinstance(h, SimHandle):
                        h.deliver(_signal.SIGKILL)
                    else:
                        continue
                    h.killed = True

    # ------------------------------------------------------------------ scheduler side
    def submit(self, nodes: int, walltime: float, *, name: str | None = None) -> str:
        if not isinstance(nodes, int) or nodes < 1:
            raise InvalidArgument("nodes", "must be an integer >= 1", nodes)
        pid = f"local{next(self._ids)}"
        self._pilots[pid] = _LocalPilot(pid, nodes, float(walltime), self.now())
        self._dirty = True
        self._advance()
        return pid

    def cancel(self, ids: Sequence[str]) -> None:
        for i in ids:
            p = self._pilots.get(str(i))
            if p is not None and p.state in ("queued", "running"):
                p.state, p.reason = "cancelled", "cancelled"
                self._dirty = True
                self._end(p)
        self._advance()

    def fail(self, pilot_id: str, reason: str = "node failure") -> None:
        """Emulate a node failure: the pilot ends at once, state ``failed``."""
        p = self._pilots[pilot_id]
        if p.state in ("queued", "running"):
            p.state, p.reason = "failed", reason
            self._dirty = True
            self._end(p)

    def status(self, ids: Sequence[str]) -> dict[str, PilotStatus]:
        self._advance()
        out = {}
        for i in ids:
            p = self._pilots.get(str(i))
            if p is None:
                continue
            st = self.STATES[p.state]
            # the pilot's own times are on the clock: report them as epochs
            off = self.wallclock() - self.now()
            out[p.id] = PilotStatus(
                state=st, raw=p.state, hosts=self._hosts(p) if st == RUNNING else (),
                start=None if p.start is None else p.start + off,
                end=None if p.end is None or st != RUNNING else p.end + off,
                exit_code=None, reason=p.reason)
        return out

    def supply(self) -> SchedulerSupply:
        self._advance()
        used = sum(p.nodes * self.slots_per_node for p in self._pilots.values()
                   if p.state == "running")
        queued = [p for p in self._pilots.values() if p.state == "queued"]
        return SchedulerSupply(
            time=self.wallclock(), dim=self.dim, nodes_total=1,
            nodes_free=int(used == 0), nodes_down=0, slots_total=self.total_slots,
            slots_free=max(0, self.total_slots - used), slots_allocated=used,
            pending_jobs=len(queued),
            pending_slots=sum(p.nodes * self.slots_per_node for p in queued))

    def node_state(self) -> str:
        used = self.supply().slots_allocated
        return NODE_FREE if used == 0 else NODE_BUSY if used >= self.total_slots else NODE_PARTIAL

    def expected_start(self, nodes: int, walltime: float,
                       pending: Sequence[str] = ()) -> float | None:
        """Now + ``start_delay`` if the slots are free, else when enough running pilots
        have reached their walltimes (queued pilots ahead counted)."""
        self._advance()
        now = self.now()
        key = (self._version, nodes, tuple(pending))
        if key not in self._start_cache:          # pilots unchanged: the same answer
            if len(self._start_cache) > 64:
                self._start_cache.clear()
            self._start_cache[key] = self._slots_free_at(nodes, set(pending))
        t = self._start_cache[key]
        if t is None:
            return None
        return max(t, now, now + self.start_delay) + (self.wallclock() - now)

    def _slots_free_at(self, nodes: int, pending: set) -> float | None:
        """When ``nodes`` nodes' slots are free (-inf: now), queued pilots ahead counted."""
        need = nodes * self.slots_per_node
        running = sorted((p.end, p.nodes * self.slots_per_node) for p in self._pilots.values()
                         if p.state == "running")
        queued = sum(p.nodes * self.slots_per_node for p in self._pilots.values()
                     if p.state == "queued" and p.id not in pending)
        free = self.total_slots - sum(k for _, k in running) - queued
        t: float | None = -math.inf
        for end, k in running:
            if free >= need:
                break
            free += k
            t = end
        return t if free >= need else None

    # ------------------------------------------------------------------ launch
    def _lease_env(self, env: Mapping[str, str] | None, lid: int, pilot_id: str, host: str,
                   units: int) -> dict[str, str]:
        if not self.simulated:
            return super()._lease_env(env, lid, pilot_id, host, units)
        # nothing is started: only the lease's own variables, not a copy of os.environ
        out = dict(env) if env else {}
        out.update(BURSAR_LEASE_ID=str(lid), BURSAR_SLOTS=str(units), BURSAR_PILOT=pilot_id,
                   BURSAR_HOST=host)
        return out

    def _launch_part(self, lid, k, pilot_id, host, units, argv, env, per_slot, cwd):
        p = self._pilots.get(pilot_id)
        if p is None or p.state != "running":
            raise InvalidArgument("lease", f"its pilot {pilot_id} is not running",
                                  None if p is None else p.state)
        if self.simulated:
            h = SimHandle(self, lid, pilot_id, host, units, argv, self.sim_duration,
                          self.sim_on_notice)
            h.env = env
            return h
        if per_slot:
            # one copy per slot, in one process group so the lease is signalled as one
            argv = ["/bin/sh", "-c",
                    'n=$1; shift; i=0; while [ "$i" -lt "$n" ]; do '
                    'BURSAR_SLOT=$i "$@" & i=$((i+1)); done; wait',
                    "bursar-slots", str(units), *argv]
        out, err = self._outputs(lid, k)
        try:
            proc = self.spawn(argv, env=env, cwd=cwd, stdout=out, stderr=err)
        finally:
            for f in (out, err):
                if hasattr(f, "close"):
                    f.close()
        return ProcessHandle(proc, lid, pilot_id, host, units, argv)

    def _signal_part(self, handle, sig):
        if isinstance(handle, SimHandle):
            handle.deliver(sig)
        else:
            handle.send_group(sig)

    # ------------------------------------------------------------------ simulated work
    def finish(self, lease_id: int, code: int = 0) -> int:
        """The simulated work of a lease is done (its agent released the lease): its
        running :class:`SimHandle` parts end with ``code``. Returns how many ended."""
        n = 0
        for h in self._handles.get(int(lease_id), ()):
            if isinstance(h, SimHandle) and h.end(code):
                n += 1
        return n

    def next_event(self) -> float | None:
        """The next clock time at which a pilot starts or ends by itself (a queue wait
        or a walltime running out), or None: a discrete-event driver ticks the pool
        manager then instead of every second."""
        self._advance()
        return None if math.isinf(self._horizon) else self._horizon
