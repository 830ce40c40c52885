"""Local binding: the facility interface over processes on this host (SPEC §12).

No scheduler: a "pilot" is a pretend allocation of ``slots_per_node`` slots on each of
``nodes`` pseudo-hosts, all of them this machine. It starts ``start_delay`` clock seconds
after submission (a queue wait), ends at its walltime or when cancelled, and the host
has ``total_slots`` to hand out (pilots beyond that wait, as in a full cluster). A lease's
work runs as ordinary subprocesses, each in a session of its own so that enforcement can
signal exactly its process group.

This is the embedded default for the simulator, the demos and tests without a scheduler:
on a :class:`~bursarcore.clock.ManualClock` the pool manager drives it in simulated time,
and no process need ever be launched. ``fail(pilot_id)`` emulates a node failure.
"""

from __future__ import annotations

import itertools
import os
import time
import signal as _signal
from dataclasses import dataclass
from typing import Any, Sequence

from ..errors import InvalidArgument
from .base import (CANCELLED, FAILED, PENDING, RUNNING, TIMEOUT, Binding, NODE_BUSY, NODE_FREE,
                   NODE_PARTIAL, PilotStatus, ProcessHandle, SchedulerSupply)

__all__ = ["LocalBinding", "LOCAL_STATES"]

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


class LocalBinding(Binding):
    """``LocalBinding(slots_per_node=4, total_slots=None, start_delay=0.0)``.

    ``total_slots`` defaults to ``os.cpu_count()`` for ``dim="cpu"`` (it is only
    bookkeeping: nothing stops a pilot from asking more than the machine has, use it to
    emulate a cluster's size); pilots that do not fit wait, first come first served.
    ``host`` names the pseudo-hosts (``localhost``, or ``localhost-0``... for
    multi-node pilots).
    """

    name = "local"
    STATES = LOCAL_STATES

    def __init__(self, *, slots_per_node: int = 4, total_slots: int | None = None,
                 start_delay: float = 0.0, host: str = "localhost", **kw: Any) -> None:
        super().__init__(**kw)
        if not isinstance(slots_per_node, int) or slots_per_node < 1:
            raise InvalidArgument("slots_per_node", "must be an integer >= 1", slots_per_node)
        if total_slots is None:
            total_slots = max(slots_per_node, os.cpu_count() or 1)
        if not isinstance(total_slots, int) or total_slots < 1:
            raise InvalidArgument("total_slots", "must be an integer >= 1", total_slots)
        if not isinstance(start_delay, (int, float)) or start_delay < 0:
            raise InvalidArgument("start_delay", "must be a number of seconds >= 0", start_delay)
        self.slots_per_node = slots_per_node
        self.total_slots = total_slots
        self.start_delay = float(start_delay)
        self.host = host
        self._pilots: dict[str, _LocalPilot] = {}
        self._ids = itertools.count(1)
        self._t = None                     # how far _advance has simulated
        if "wallclock" not in kw:
            # epochs are the clock plus a fixed offset, so that times reported as epochs
            # come back to the same clock values (a manual clock stays exact)
            self._offset: float | None = None
            self.wallclock = self._epoch

    def _epoch(self) -> float:
        if self._offset is None:
            self._offset = time.time() - self.now()
        return self.now() + self._offset

    def _hosts(self, p: _LocalPilot) -> tuple[tuple[str, int], ...]:
        if p.nodes == 1:
            return ((self.host, self.slots_per_node),)
        return tuple((f"{self.host}-{i}", self.slots_per_node) for i in range(p.nodes))

    def _advance(self) -> None:
        """Simulate up to the clock, event by event: pilots end at their walltimes, and
        queued pilots start (first come, first served) as soon as they are past their
        queue wait and their slots are free — at that instant, not when next looked at."""
        now = self.now()
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

    def _end(self, p: _LocalPilot) -> None:
        # no scheduler will clean up after a local pilot: its processes go with it
        for hs in list(self._handles.values()):
            for h in hs:
                if h.pilot_id == p.id and h.poll() is None and isinstance(h, ProcessHandle):
                    h.send_group(_signal.SIGKILL)
                    h.killed = True

    # ------------------------------------------------------------------ scheduler side
    def submit(self, nodes: int, walltime: float, *, name: str | None = None) -> str:
        if not isinstance(nodes, int) or nodes < 1:
            raise InvalidArgument("nodes", "must be an integer >= 1", nodes)
        pid = f"local{next(self._ids)}"
        self._pilots[pid] = _LocalPilot(pid, nodes, float(walltime), self.now())
        self._advance()
        return pid

    def cancel(self, ids: Sequence[str]) -> None:
        for i in ids:
            p = self._pilots.get(str(i))
            if p is not None and p.state in ("queued", "running"):
                p.state, p.reason = "cancelled", "cancelled"
                self._end(p)
        self._advance()

    def fail(self, pilot_id: str, reason: str = "node failure") -> None:
        """Emulate a node failure: the pilot ends at once, state ``failed``."""
        p = self._pilots[pilot_id]
        if p.state in ("queued", "running"):
            p.state, p.reason = "failed", reason
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
        need = nodes * self.slots_per_node
        running = sorted((p.end, p.nodes * self.slots_per_node) for p in self._pilots.values()
                         if p.state == "running")
        queued = sum(p.nodes * self.slots_per_node for p in self._pilots.values()
                     if p.state == "queued" and p.id not in set(pending))
        free = self.total_slots - sum(k for _, k in running) - queued
        t = now
        for end, k in running:
            if free >= need:
                break
            free += k
            t = end
        if free < need:
            return None
        return max(t, now + self.start_delay) + (self.wallclock() - now)

    # ------------------------------------------------------------------ launch
    def _launch_part(self, lid, k, pilot_id, host, units, argv, env, per_slot, cwd):
        p = self._pilots.get(pilot_id)
        if p is None or p.state != "running":
            raise InvalidArgument("lease", f"its pilot {pilot_id} is not running",
                                  None if p is None else p.state)
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
        handle.send_group(sig)
