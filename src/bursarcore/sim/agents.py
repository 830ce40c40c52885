"""Agent behaviours: each negotiates with the broker only through its public calls.

* :class:`Storm` (the adversary) demands its ceiling every second in a window and spams
  inference;
* :class:`Interactive` makes small, guaranteed, latency-sensitive requests;
* :class:`Naive` requests what its queue wants when it wants it, runs tasks first-come
  first-served, and is blind to supply, prices and I/O: it puts a task on GPUs first and
  only then reads its inputs, so its GPUs wait on a throttled filesystem;
* :class:`Adaptive` reads supply and quotes: it ranks tasks by value per unit of the
  scarce resource (per GB when its I/O is throttled, per GPU-second otherwise), defers
  tasks whose value per credit at the current congestion price is too low, stages a task's
  inputs *before* asking for its GPUs (so it never holds GPUs it cannot feed), renews
  leases it still needs and releases idle ones;
* :class:`Backfill` fills idle GPUs above a headroom with opportunistic leases and is
  preempted with the class's grace;
* :class:`Probe` asks for exactly ``size`` GPUs now and then (sweep (a)'s standardized
  time-to-capacity probe);
* :class:`Waker` is idle, then at ``start`` asks for its guarantee (or ``units``) and keeps
  it: a lender that wakes up and wants back what it was promised.

Agents act at times they choose (``sim.at``) and hear about their leases through hooks the
ledger calls (``lease_active``, ``lease_ended``, ``lease_starting``, ``intent_granted``,
``intent_refused``, ``preempt_notice``).
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

import numpy as np

from .flowstream import FlowStream
from .scenario import CampaignSpec
from .tasks import TaskSet

__all__ = ["Agent", "Storm", "Interactive", "Naive", "Adaptive", "Backfill", "Probe", "Waker",
           "FlowStream", "make_agent", "AGENT_CLASSES"]

# task states
FUTURE, QUEUED, THINKING, STAGING, READY, RUNNING, DONE = range(7)


class Agent:
    kind = "agent"
    watch = False   # sample its tokens every sample (storms)

    def __init__(self, sim: Any, spec: CampaignSpec, index: int, rng: np.random.Generator):
        self.sim = sim
        self.spec = spec
        self.name = spec.name
        self.index = index
        self.rng = rng
        self.p = spec.behaviour
        self.env = spec.envelope
        self.cls = spec.service_class
        d = sim.dim
        self.g, self.s, self.b = int(self.env.g(d)), int(self.env.s(d)), int(self.env.b(d))
        self.held = 0
        self.leases: dict[int, list] = {}        # lid -> [units, expiry]
        self.starting: dict[int, int] = {}       # lid -> units
        self.pending_iid: int | None = None
        self.pending_units = 0
        self.flow: dict[str, list[list[float]]] = {}   # dim -> [times, asked, allowed]
        self.lapsing: set[int] = set()           # leases it will let expire
        self._poked = False

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        pass

    def finish(self, t: float) -> None:
        pass

    def poke(self, t: float) -> None:
        """Run :meth:`react` once at ``t`` (after the events of this instant)."""
        if not self._poked:
            self._poked = True
            self.sim.at(t, self._react)

    def _react(self, t: float) -> None:
        self._poked = False
        self.react(t)

    def react(self, t: float) -> None:
        pass

    # -- hooks (called by the ledger) ----------------------------------------------------------
    def lease_starting(self, lid: int, n: int, t: float) -> None:
        self.starting[lid] = n

    def lease_active(self, lid: int, n: int, expiry: float | None, t: float) -> None:
        self.starting.pop(lid, None)
        self.leases[lid] = [n, expiry]
        self.held += n
        self.poke(t)

    def lease_ended(self, lid: int, n: int, t: float, how: str) -> None:
        self.starting.pop(lid, None)
        self.lapsing.discard(lid)
        if lid in self.leases:
            self.leases.pop(lid)
            self.held -= n
        self.poke(t)

    def lease_renewed(self, lid: int, expiry: float | None) -> None:
        if lid in self.leases:
            self.leases[lid][1] = expiry

    def intent_granted(self, iid: int, lid: int, t: float) -> None:
        if iid == self.pending_iid:
            self.pending_iid, self.pending_units = None, 0

    def intent_refused(self, iid: int, reason: str | None, t: float) -> None:
        if iid == self.pending_iid:
            self.pending_iid, self.pending_units = None, 0
        self.poke(t)

    def preempt_notice(self, lid: int, deadline: float | None, t: float) -> None:
        pass

    # -- helpers -------------------------------------------------------------------------------------
    @property
    def starting_units(self) -> int:
        return sum(self.starting.values())

    def acquire(self, units: int | tuple[int, int], duration: float, **kw: Any):
        d = self.sim.acquire(self, units, duration, **kw)
        if d.outcome == "pending":
            self.pending_iid = d.intent_id
            self.pending_units = units[1] if isinstance(units, tuple) else units
        return d

    def consume(self, dim: str, amount: float):
        c = self.sim.consume(self, dim, amount)
        log = self.flow.get(dim)
        if log is None:
            log = self.flow[dim] = [[], [], []]
        log[0].append(self.sim.now)
        log[1].append(amount)
        log[2].append(c.allowed)
        return c

    def has_flow(self, dim: str) -> bool:
        return dim in self.sim.sc.pool.flow and self.env.b(dim) > 0

    def summary(self) -> dict:
        return {}


# ----------------------------------------------------------------------------------------- storm
class Storm(Agent):
    """Demands its ceiling from ``start`` to ``end``, every ``every`` s, in ``lease``-second
    leases (pending at most ``every`` s); asks ``inference`` tokens every second."""

    kind = "storm"
    watch = True

    def start(self) -> None:
        p = self.p
        self.sim.at(p["start"], self._tick)
        if p["inference"] > 0 and self.has_flow("inference"):
            t0 = p["start"] if p["inference_start"] < 0 else p["inference_start"]
            self.sim.at(t0, self._spam)

    def _tick(self, t: float) -> None:
        p = self.p
        if t >= p["end"]:
            for lid in list(self.leases) + list(self.starting):
                self.sim.release(lid)
            if self.pending_iid is not None:
                self.sim.cancel(self.pending_iid)
                self.pending_iid = None
            return
        # keep what it holds: renew leases about to expire (refused once tokens run out)
        soon = t + p["every"] + 1e-9
        for lid, (n, expiry) in list(self.leases.items()):
            if expiry is not None and t < expiry <= soon and lid not in self.lapsing:
                if not self.sim.renew(lid, p["lease"]).granted:
                    self.lapsing.add(lid)
        have = self.held + self.starting_units
        if have < self.b and self.pending_iid is None:
            self.acquire((1, self.b - have), p["lease"], ttl=p["every"])
        self.sim.at(t + p["every"], self._tick)

    def _spam(self, t: float) -> None:
        if t >= self.p["end"]:
            return
        self.consume("inference", self.p["inference"])
        self.sim.at(t + 1.0, self._spam)


# ----------------------------------------------------------------------------------- interactive
class Interactive(Agent):
    """Poisson requests of ``units`` GPUs for ``duration`` s, within what is left of the
    guarantee (so each is a request the broker must serve within the grace)."""

    kind = "interactive"

    def start(self) -> None:
        self.skipped = 0
        self.sim.at(self.p["start"] + self.rng.exponential(self.p["mean_interval"]), self._arrive)

    def _arrive(self, t: float) -> None:
        p = self.p
        lo, hi = p["units"]
        n = int(self.rng.integers(lo, hi + 1))
        dur = float(self.rng.uniform(*p["duration"]))
        room = self.g - self.held - self.starting_units - self.pending_units
        n = min(n, room)
        if n >= 1:
            self.acquire(n, round(dur, 3), within_guarantee=True)
        else:
            self.skipped += 1
        self.sim.at(t + self.rng.exponential(p["mean_interval"]), self._arrive)

    def summary(self) -> dict:
        return {"skipped_full": self.skipped}


# -------------------------------------------------------------------------------------- backfill
class Backfill(Agent):
    """Every ``every`` s, takes the free GPUs above ``headroom`` with opportunistic leases."""

    kind = "backfill"

    def start(self) -> None:
        self.notices = 0
        self.sim.at(0.0, self._tick)

    def _tick(self, t: float) -> None:
        free = self.sim.supply(self).dims[self.sim.dim].free
        room = min(free - self.p["headroom"], self.b - self.held - self.starting_units)
        if room >= 1 and self.pending_iid is None:
            self.acquire((1, int(room)), self.p["lease"], ttl=self.p["every"])
        self.sim.at(t + self.p["every"], self._tick)

    def preempt_notice(self, lid: int, deadline: float | None, t: float) -> None:
        self.notices += 1

    def summary(self) -> dict:
        return {"preempt_notices": self.notices}


# ----------------------------------------------------------------------------------------- probe
class Probe(Agent):
    """Asks for exactly ``size`` GPUs every ``every`` s (one at a time), holds them ``hold`` s."""

    kind = "probe"

    def start(self) -> None:
        self.sim.at(self.p["start"], self._tick)

    def _tick(self, t: float) -> None:
        p = self.p
        if self.pending_iid is None and not self.starting and not self.leases:
            n = int(p["size"])
            self.acquire((n, n), p["hold"], ttl=p["ttl"])
        self.sim.at(t + p["every"], self._tick)


# ----------------------------------------------------------------------------------------- waker
class Waker(Agent):
    """Idle until ``start``; then asks for ``units`` GPUs (0: its guarantee) in one firm
    request of ``lease``-second leases, and keeps them — renewing each lease a second
    before it expires, asking again for whatever it lost — until ``end`` (0: the run's end).
    Its first request is the one whose wait the report shows."""

    kind = "waker"

    def start(self) -> None:
        self.units = int(self.p["units"] or self.g)
        self.first_request: int | None = None     # the ledger's index of its first request
        self.renewals = self.renewals_refused = 0
        self.sim.at(self.p["start"], self._ask)

    @property
    def _end(self) -> float:
        return self.p["end"] or math.inf

    def _ask(self, t: float) -> None:
        if t >= self._end or self.pending_iid is not None:
            return
        n = self.units - self.held - self.starting_units
        if n < 1:
            return
        self.acquire(n, self.p["lease"], within_guarantee=n + self.held +
                     self.starting_units <= self.g)
        if self.first_request is None:
            self.first_request = len(self.sim.ledger.requests) - 1

    def lease_active(self, lid: int, n: int, expiry: float | None, t: float) -> None:
        super().lease_active(lid, n, expiry, t)
        self._renew_at(lid, expiry)

    def _renew_at(self, lid: int, expiry: float | None) -> None:
        if expiry is not None and expiry - 1.0 < self._end:
            self.sim.at(max(self.sim.now, expiry - 1.0), self._renew, lid)

    def _renew(self, t: float, lid: int) -> None:
        if lid not in self.leases:
            return
        if t >= self._end:
            self.sim.release(lid)
            return
        self.renewals += 1
        d = self.sim.renew(lid, self.p["lease"])
        if d.granted:
            self._renew_at(lid, self.leases[lid][1])
        else:
            self.renewals_refused += 1

    def lease_ended(self, lid: int, n: int, t: float, how: str) -> None:
        super().lease_ended(lid, n, t, how)
        if how != "released":
            self.sim.at(t, self._ask)         # lost (revoked, expired): ask again

    def intent_refused(self, iid: int, reason: str | None, t: float) -> None:
        super().intent_refused(iid, reason, t)
        self.sim.at(t, self._ask)

    def summary(self) -> dict:
        return {"units": self.units, "renewals": self.renewals,
                "renewals_refused": self.renewals_refused}


# ---------------------------------------------------------------------------------- science
class ScienceAgent(Agent):
    """Tasks: arrive → (inference) → (staging I/O) → compute on GPUs → value.

    GPU accounting is aggregate: ``busy`` GPUs are assigned to tasks out of ``held``; a
    lease that ends while its GPUs are busy kills the most recently started tasks (their
    compute progress is lost; their staged inputs stay)."""

    def __init__(self, sim: Any, spec: CampaignSpec, index: int, rng: np.random.Generator):
        super().__init__(sim, spec, index, rng)
        self.ts: TaskSet = sim.taskset(self.p["taskset"])
        n = len(self.ts)
        self.state = np.zeros(n, dtype=np.int8)
        self.rem_tok = self.ts.tokens.astype(float).copy()
        self.rem_io = self.ts.io.astype(float).copy()
        self.gen = np.zeros(n, dtype=np.int64)
        self.t_run = np.zeros(n)
        self.na = 0
        self.busy = 0           # GPUs assigned to tasks
        self.run_gpus = 0       # GPUs of running tasks
        self.assigned: dict[int, None] = {}     # tasks holding GPUs, in assignment order
        self.science = 0.0
        self.completed = 0
        self.killed = 0
        self.lost_gpu_s = 0.0
        self._lt: list[float] = [0.0]
        self._lb: list[int] = [0]
        self._lr: list[int] = [0]
        self.inf = (FlowStream(self, "inference", self.rem_tok, THINKING, self._thought)
                    if self.has_flow("inference") else None)
        self.io = (FlowStream(self, "fs", self.rem_io, STAGING, self._staged)
                   if self.has_flow("fs") else None)

    # -- bookkeeping ----------------------------------------------------------------------------
    def _log(self, t: float) -> None:
        if self._lt[-1] == t:
            self._lb[-1], self._lr[-1] = self.busy, self.run_gpus
        else:
            self._lt.append(t)
            self._lb.append(self.busy)
            self._lr.append(self.run_gpus)

    def series(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return np.array(self._lt), np.array(self._lb), np.array(self._lr)

    def _absorb(self, t: float) -> list[int]:
        arr = self.ts.arrival
        j = int(np.searchsorted(arr, t, side="right"))
        new = list(range(self.na, j))
        if new:
            self.state[self.na:j] = QUEUED
            self.na = j
        return new

    # -- the pipeline ------------------------------------------------------------------------------
    def _think(self, t: float, task: int) -> None:
        self.state[task] = THINKING
        if self.inf is not None:
            self.inf.add(t, task)
        else:
            self._thought(t, task)

    def _thought(self, t: float, task: int) -> None:
        self.state[task] = STAGING
        if self.io is not None:
            self.io.add(t, task)
        else:
            self._staged(t, task)

    def _staged(self, t: float, task: int) -> None:
        raise NotImplementedError

    def _run(self, t: float, task: int) -> None:
        """Start computing (the task's GPUs are already in ``busy``)."""
        self.state[task] = RUNNING
        self.run_gpus += int(self.ts.gpus[task])
        self.t_run[task] = t
        self._log(t)
        self.sim.at(t + float(self.ts.seconds[task]), self._complete, task, int(self.gen[task]))

    def _complete(self, t: float, task: int, gen: int) -> None:
        if gen != self.gen[task] or self.state[task] != RUNNING:
            return
        g = int(self.ts.gpus[task])
        self.state[task] = DONE
        self.busy -= g
        self.run_gpus -= g
        self.assigned.pop(task, None)
        self.science += float(self.ts.value[task])
        self.completed += 1
        self._log(t)
        self.poke(t)

    def _shed(self, t: float) -> None:
        """Busy GPUs above holdings: kill tasks, newest first (waiting ones before running)."""
        if self.busy <= self.held:
            return
        order = list(reversed(self.assigned))
        waiting = [k for k in order if self.state[k] != RUNNING]
        running = [k for k in order if self.state[k] == RUNNING]
        for task in waiting + running:
            if self.busy <= self.held:
                break
            self._kill(t, task)
        self._log(t)

    def _kill(self, t: float, task: int) -> None:
        g = int(self.ts.gpus[task])
        st = self.state[task]
        self.busy -= g
        self.assigned.pop(task, None)
        if st == RUNNING:
            self.run_gpus -= g
            self.gen[task] += 1
            self.killed += 1
            self.lost_gpu_s += g * (t - self.t_run[task])
        elif st == THINKING and self.inf is not None:
            self.inf.drop(task)
        elif st == STAGING and self.io is not None:
            self.io.drop(task)
        self._requeue(task)

    def _requeue(self, task: int) -> None:
        raise NotImplementedError

    def lease_ended(self, lid: int, n: int, t: float, how: str) -> None:
        super().lease_ended(lid, n, t, how)
        self._shed(t)

    def summary(self) -> dict:
        io_asked = io_allowed = 0.0
        if "fs" in self.flow:
            io_asked, io_allowed = float(np.sum(self.flow["fs"][1])), float(np.sum(self.flow["fs"][2]))
        return {"science": self.science, "completed": self.completed, "killed": self.killed,
                "lost_gpu_seconds": self.lost_gpu_s, "tasks": len(self.ts),
                "io_asked": io_asked, "io_allowed": io_allowed,
                "io_calls": self.io.calls if self.io else 0,
                "io_throttled_calls": self.io.throttled if self.io else 0}


class Naive(ScienceAgent):
    """First come, first served; asks for GPUs for all it has queued, up to its ceiling, in
    fixed leases it never renews nor releases early; gives a task its GPUs before reading
    its inputs, whatever the filesystem can deliver."""

    kind = "naive"

    def start(self) -> None:
        self.queue: deque[int] = deque()
        self.queued_gpus = 0
        self.retry_at = 0.0
        self._next_arrival(0.0)

    def _next_arrival(self, t: float) -> None:
        if self.na < len(self.ts):
            self.sim.at(float(self.ts.arrival[self.na]), self._arrivals)

    def _arrivals(self, t: float) -> None:
        for task in self._absorb(t):
            self.queue.append(task)
            self.queued_gpus += int(self.ts.gpus[task])
        self._next_arrival(t)
        self.react(t)

    def react(self, t: float) -> None:
        gp = self.ts.gpus
        free = self.held - self.busy
        changed = False
        while self.queue and free >= gp[self.queue[0]]:
            task = self.queue.popleft()
            g = int(gp[task])
            self.queued_gpus -= g
            free -= g
            self.busy += g
            self.assigned[task] = None
            changed = True
            if self.rem_io[task] <= 0 and self.rem_tok[task] <= 0:
                self._run(t, task)
            else:
                self._think(t, task)
        if changed:
            self._log(t)
        want = min(self.b, self.busy + self.queued_gpus)
        have = self.held + self.starting_units
        if want > have and self.pending_iid is None and t >= self.retry_at:
            mx = want - have
            d = self.acquire((min(int(self.p["min_units"]), mx), mx), self.p["lease"])
            if d.outcome == "refused":
                self.retry_at = t + (d.retry_after if d.retry_after else 30.0)

    def _staged(self, t: float, task: int) -> None:
        self._run(t, task)

    def _requeue(self, task: int) -> None:
        self.state[task] = QUEUED
        self.queue.appendleft(task)
        self.queued_gpus += int(self.ts.gpus[task])


class Adaptive(ScienceAgent):
    """Reads supply and quotes every ``plan_every`` s; see the module docstring."""

    kind = "adaptive"

    def start(self) -> None:
        sim = self.sim
        self.ready: list[int] = []
        self.pipe_gpus = 0           # GPUs of tasks thinking/staging/ready
        self.last_acquire = -1e9
        self.idle_since: float | None = None
        sup = sim.supply(self)
        d = sup.dims[sim.dim]
        self.base_price_s = d.price[self.cls] / d.multiplier / 3600.0   # at multiplier 1
        self.inf_price = sim.broker.price.get("inference", 0.0) if self.inf is not None else 0.0
        ts = self.ts
        cost0 = ts.gpu_seconds * self.base_price_s + ts.tokens * self.inf_price
        self.vpc = ts.value / np.maximum(cost0, 1e-12)          # value per credit at m = 1
        self.theta = float(np.quantile(self.vpc, self.p["value_quantile"]))
        self.io_floor = self.env.s("fs") if self.io is not None else math.inf
        self.plans = 0
        self.deferred_peak = 0
        sim.at(0.0, self._plan)

    # -- planning ---------------------------------------------------------------------------------
    def _plan(self, t: float) -> None:
        sim = self.sim
        self.plans += 1
        self._absorb(t)
        sup = sim.supply(self)
        d = sup.dims[sim.dim]
        m = d.multiplier
        self._select(t, m, d.tokens)
        self._manage(t)
        self._start_ready(t)
        self._grow(t, force=True)
        nxt = t + self.p["plan_every"]
        if nxt <= sim.duration:
            sim.at(nxt, self._plan)

    def _select(self, t: float, m: float, tokens: float) -> None:
        """Bring the best affordable tasks into the pipeline, within its I/O and GPU budgets."""
        ts = self.ts
        cand = np.flatnonzero(self.state[: self.na] == QUEUED)
        if cand.size == 0:
            return
        ok = self.vpc[cand] >= self.theta * m              # worth it at today's price
        self.deferred_peak = max(self.deferred_peak, int((~ok).sum()))
        cand = cand[ok]
        if cand.size == 0:
            return
        io_scarce = self.io is not None and self.io.throttle_ratio() > 0.05
        if io_scarce:
            score = ts.value[cand] / np.maximum(ts.io[cand], 1e-9)
        else:
            score = ts.value[cand] / ts.gpu_seconds[cand]
        order = cand[np.argsort(-score, kind="stable")]
        prefetch = self.p["prefetch"]
        # an unbounded bucket (tokens inf) never limits the target
        burst = tokens / max(self.p["lease"], 1.0)
        gpu_target = self.b if not math.isfinite(burst) else min(self.b, self.s + int(burst))
        gpu_room = max(0, int(1.25 * gpu_target) - self.busy - self.pipe_gpus)
        if self.io is not None:
            rate = max(self.io_floor, self.io.rate(t))
            io_room = rate * prefetch - self.io.total
        else:
            io_room = math.inf
        gp, io = ts.gpus, self.rem_io
        for task in order:
            g = int(gp[task])
            if g > gpu_room:
                continue
            need = float(io[task])
            if need > io_room and self.pipe_gpus + self.busy > 0:
                continue
            gpu_room -= g
            io_room -= need
            self.pipe_gpus += g
            self._think(t, int(task))
            if gpu_room <= 0:
                break

    def _staged(self, t: float, task: int) -> None:
        self.state[task] = READY
        self.ready.append(task)
        self.poke(t)

    def react(self, t: float) -> None:
        self._start_ready(t)
        self._grow(t)

    def usable(self) -> int:
        """GPUs held on leases it will keep (not those it lets lapse)."""
        return self.held - sum(self.leases[l][0] for l in self.lapsing if l in self.leases)

    def _start_ready(self, t: float) -> None:
        if not self.ready:
            return
        free = self.usable() - self.busy
        if free <= 0:
            return
        ts = self.ts
        self.ready.sort(key=lambda k: -ts.value[k] / ts.gpu_seconds[k])
        keep = []
        for task in self.ready:
            g = int(ts.gpus[task])
            if g <= free:
                free -= g
                self.busy += g
                self.pipe_gpus -= g
                self.assigned[task] = None
                self._run(t, task)
            else:
                keep.append(task)
        self.ready = keep

    def _ready_gpus(self) -> int:
        gp = self.ts.gpus
        return int(sum(int(gp[k]) for k in self.ready))

    def _grow(self, t: float, force: bool = False) -> None:
        """Ask for GPUs for staged tasks only (never for work it cannot feed)."""
        if self.pending_iid is not None or not self.ready:
            return
        if not force and t - self.last_acquire < 5.0:
            return
        want = min(self.b, self.busy + self._ready_gpus())
        need = want - self.usable() - self.starting_units
        gmin = int(min(self.ts.gpus[k] for k in self.ready))
        if need < gmin:
            return
        self.last_acquire = t
        sizes = sorted({need, max(gmin, need // 2), max(gmin, need // 4), gmin}, reverse=True)
        q = self.sim.quote(self, np.array(sizes, dtype=np.int64), [self.p["lease"]])
        pick = 0
        for i, n in enumerate(sizes):
            if q.grantable[i, 0] and q.path[i, 0] == "warm":
                pick = n
                break
        if pick == 0:
            for i, n in enumerate(sizes):
                if q.grantable[i, 0]:
                    pick = n
                    break
        if pick == 0:
            return
        self.acquire((gmin, pick), self.p["lease"], ttl=self.p["plan_every"])

    def _manage(self, t: float) -> None:
        """Renew leases still needed before they expire; release GPUs it cannot use."""
        horizon = t + self.p["plan_every"] + 1.0
        needed = self.busy + self._ready_gpus()
        spare = self.usable() - needed
        for lid, (n, expiry) in sorted(self.leases.items(), key=lambda kv: kv[1][1] or 0):
            if expiry is None or expiry > horizon or lid in self.lapsing:
                continue
            if spare >= n:
                spare -= n          # let it lapse
                self.lapsing.add(lid)
                continue
            if expiry > t and not self.sim.renew(lid, self.p["lease"]).granted:
                self.lapsing.add(lid)
                spare -= n
        idle = self.usable() - self.busy - self._ready_gpus()
        if idle <= 0:
            self.idle_since = None
            return
        if self.idle_since is None:
            self.idle_since = t
            return
        if t - self.idle_since < self.p["idle_grace"]:
            return
        for lid, (n, _) in sorted(self.leases.items(), key=lambda kv: -kv[1][0]):
            if n <= idle and lid not in self.lapsing:
                idle -= n
                self.sim.release(lid)
        self.idle_since = None

    def _requeue(self, task: int) -> None:
        if self.rem_io[task] <= 0 and self.rem_tok[task] <= 0:
            self.state[task] = READY
            self.ready.append(task)
            self.pipe_gpus += int(self.ts.gpus[task])
        else:
            self.state[task] = QUEUED

    def summary(self) -> dict:
        out = super().summary()
        out.update({"plans": self.plans, "deferred_peak": self.deferred_peak,
                    "value_per_credit_floor": self.theta})
        return out


AGENT_CLASSES = {"storm": Storm, "interactive": Interactive, "naive": Naive,
                 "adaptive": Adaptive, "backfill": Backfill, "probe": Probe, "waker": Waker}


def make_agent(sim: Any, spec: CampaignSpec, index: int, rng: np.random.Generator) -> Agent:
    return AGENT_CLASSES[spec.agent](sim, spec, index, rng)
