"""The simulation loop: discrete events over the real :class:`~bursarcore.Broker`.

Why discrete-event (not a fixed step): the broker already keeps exact time (int64 ns) and
runs its own events — expiries, the end of a preemption grace, activations, pending
intents' TTLs — whenever it is called at a later time. A fixed step would call every agent
every step whether or not anything changed, and would round every grant latency up to the
step. Here each agent schedules its own next action (a task arrival, the ``retry_after`` a
throttled consumption gave it, a planning tick); the loop jumps the :class:`ManualClock`
to the earliest one; and every time the broker announced (a lease's expiry, a preemption
deadline, a pending intent's TTL) is a wake-up too, so events are seen at the instant they
happen and latencies are exact (a warm grant is 0 s, a reclaim exactly the grace).
Flow dimensions keep their natural 1 s granularity because a throttled consumer waits the
``retry_after`` the broker returns. The same seed gives the same event sequence, the same
broker calls and therefore the same journal, byte for byte.

The pool is a facility's, as in a deployment (SPEC §12): the broker starts empty and pilot
allocations of the local binding (``LocalBinding(execution="simulated")``), kept by a
:class:`~bursarcore.adapters.PoolManager`, join it with ``add_nodes`` at t = 0 (and whenever
a replacement starts); leases are placed on the pilots' hosts and slots; every active
lease's work is launched through the binding (simulated: no process, the work runs on the
clock) and revocations and expiries are enforced through it (notice signal, kill at the
deadline); a pilot that ends — a failure from ``[[facility.failures]]``, or its walltime —
shrinks the pool and its leases are revoked with notice. The manager runs at its own events
(the binding's pilot starts and ends, drains) and every ``facility.tick`` seconds.

The :class:`Ledger` sees every decision and every event and keeps, per campaign, the units
held by active (and revoking) leases as an exact step function of time, the grant latency
of every request (request → lease active), refusals and preemptions. Metrics are integrals
of those step functions, not samples.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from ..admission.classes import DEFAULT_CLASSES
from ..admission.envelope import Intent, Pool
from ..admission.state import REUSE_AFTER
from ..broker import Broker, Decision, Event, Lease
from ..clock import ManualClock
from ..journal import MemoryJournal
from ..units import NS, to_ns
from .scenario import Scenario

if TYPE_CHECKING:
    from .metrics import SimResult

__all__ = ["Simulation", "Ledger", "Request", "run_scenario"]


@dataclass
class Request:
    """One intent as the ledger saw it: when it was made and when its lease became active."""

    campaign: int
    t: float
    units: int = 0
    t_active: float | None = None
    outcome: str = "pending"       # granted / pending / refused
    reason: str | None = None
    path: str | None = None
    within_guarantee: bool = False
    answer: str | None = None      # the broker's first answer (granted / pending / refused)
    answer_reason: str | None = None   # and its reason, before a pending intent was decided

    @property
    def latency_ns(self) -> int | None:
        """Request → active in the engine's nanoseconds: both times as the broker saw them
        (an agent may act at a float time between two nanoseconds; the broker rounds it)."""
        return None if self.t_active is None else to_ns(self.t_active) - to_ns(self.t)

    @property
    def latency(self) -> float | None:
        """:attr:`latency_ns` in seconds: a reclaim's latency is exactly the grace, not the
        grace plus the rounding error of subtracting two float times."""
        ns = self.latency_ns
        return None if ns is None else ns / NS


class Ledger:
    """Holdings, latencies and lease lifecycles, from decisions and events (exact times)."""

    def __init__(self, sim: "Simulation", ncamp: int) -> None:
        self.sim = sim
        self.leases: dict[int, list] = {}        # lid -> [camp, units, t_active, expiry, firm]
        self.starting: dict[int, tuple[int, int]] = {}   # lid -> (camp, request index)
        self.pending: dict[int, int] = {}        # intent id -> request index
        self.requests: list[Request] = []
        self.held = np.zeros(ncamp, dtype=np.int64)
        self._ct: list[float] = []               # occupancy changes: time, campaign, delta
        self._cc: list[int] = []
        self._cd: list[int] = []
        self._firm: list[bool] = []
        self.preemptions = np.zeros(ncamp, dtype=np.int64)
        self.borrowed: set[int] = set()          # borrowed leases' ids (SPEC §14.8)
        self.borrowed_units = np.zeros(ncamp, dtype=np.int64)   # granted borrowed, in all
        self.borrowed_preempted = np.zeros(ncamp, dtype=np.int64)
        self.refusals: dict[tuple[int, str], int] = {}
        self.renewals_refused: dict[tuple[int, str], int] = {}

    # -- from the broker's answers ----------------------------------------------------------
    def on_decision(self, c: int, t: float, d: Decision, units: int,
                    within_guarantee: bool = False) -> int:
        r = Request(c, t, units, within_guarantee=within_guarantee)
        ri = len(self.requests)
        self.requests.append(r)
        r.outcome, r.reason, r.path = d.outcome, d.reason, d.path
        r.answer, r.answer_reason = d.outcome, d.reason
        if d.outcome == "granted":
            lease = d.lease
            assert lease is not None          # a grant carries its lease
            r.units = d.units
            if d.path == "borrow":
                self.borrowed.add(lease.id)
                self.borrowed_units[c] += d.units
            if lease.state == "active":
                r.t_active = t
                self._activate(lease.id, c, d.units, t, lease.expiry, lease.firm, lease)
            else:
                self.starting[lease.id] = (c, ri)
                self.sim.agent_of(c).lease_starting(lease.id, d.units, t)
                self.sim.wake(t + d.wait)
        elif d.outcome == "pending":
            self.pending[d.intent_id] = ri
        else:
            key = (c, d.reason or "?")
            self.refusals[key] = self.refusals.get(key, 0) + 1
        return ri

    def on_batch(self, ci: np.ndarray, t: float, res: Any, durations: np.ndarray,
                 firm: bool, maybe_starting: bool) -> None:
        """admit_batch results: grants are active at t unless a reclaim happened."""
        for j in np.flatnonzero(res.outcome == 0):
            lid, c, n = int(res.lease[j]), int(ci[j]), int(res.granted[j])
            if maybe_starting and self.sim.broker.lease(lid).state != "active":
                self.requests.append(Request(c, t, n, outcome="granted", path="reclaim"))
                self.starting[lid] = (c, len(self.requests) - 1)
                self.sim.agent_of(c).lease_starting(lid, n, t)
                continue
            self._activate(lid, c, n, t, t + float(durations[j]), firm)
        for j in np.flatnonzero(res.outcome == 2):
            self.requests.append(Request(int(ci[j]), t, int(res.granted[j])))
            self.pending[int(res.intent[j])] = len(self.requests) - 1

    def on_release(self, lid: int, t: float) -> None:
        if lid in self.leases:
            self._end(lid, t, "released")
        elif lid in self.starting:
            c, _ = self.starting.pop(lid)
            self.sim.agent_of(c).lease_ended(lid, 0, t, "released")

    def on_renew(self, lid: int, d: Decision) -> None:
        if not d.granted and lid in self.leases:
            key = (self.leases[lid][0], d.reason or "?")
            self.renewals_refused[key] = self.renewals_refused.get(key, 0) + 1
        if d.granted and lid in self.leases and d.lease is not None:
            rec = self.leases[lid]
            rec[3] = d.lease.expiry
            self.sim.wake(d.lease.expiry)
            self.sim.agent_of(rec[0]).lease_renewed(lid, d.lease.expiry)

    # -- from poll() --------------------------------------------------------------------------
    def on_event(self, e: Event, lease: Lease | None) -> None:
        """One broker event. ``lease``: for ``granted`` and ``activated``, the broker's
        snapshot of the event's lease taken when the event happened. By the time the event
        is handled the lease may have ended and, rows being reused (docs/policy.md,
        "Memory"), its id may no longer be readable."""
        ri: int | None                        # a request's index (None: not yet recorded)
        k = e.kind
        if k == "expired" or k == "revoked" or k == "released":
            lid = e.lease_id
            assert lid is not None            # (every lease event names its lease)
            if lid in self.leases:
                self._end(lid, e.time, k)
            elif lid in self.starting:           # a reclaim grant that could not be placed
                c, _ = self.starting.pop(lid)
                self.sim.agent_of(c).lease_ended(lid, 0, e.time, k)
        elif k == "activated":
            lid = e.lease_id
            assert lid is not None and lease is not None   # (read by _on_event)
            if lid in self.starting:
                c, ri = self.starting.pop(lid)
                self.requests[ri].t_active = e.time
                self._activate(lid, c, lease.units, e.time, lease.expiry, lease.firm, lease)
        elif k == "granted":
            assert e.lease_id is not None and e.intent_id is not None and lease is not None
            ri = self.pending.pop(e.intent_id, None)
            c = self.sim.index[e.campaign]
            if ri is None:
                self.requests.append(Request(c, e.time, lease.units))
                ri = len(self.requests) - 1
            r = self.requests[ri]
            r.outcome, r.units = "granted", lease.units
            self.sim.agent_of(c).intent_granted(e.intent_id, e.lease_id, e.time)
            if lease.state == "active":
                r.t_active, r.path = e.time, "warm"
                self._activate(e.lease_id, c, lease.units, e.time, lease.expiry, lease.firm,
                               lease)
            else:
                r.path = "reclaim"
                self.starting[e.lease_id] = (c, ri)
                self.sim.agent_of(c).lease_starting(e.lease_id, lease.units, e.time)
        elif k == "refused":
            assert e.intent_id is not None    # (a refusal names its intent)
            ri = self.pending.pop(e.intent_id, None)
            c = self.sim.index[e.campaign]
            if ri is not None:
                self.requests[ri].outcome = "refused"
                self.requests[ri].reason = e.reason
            key = (c, e.reason or "?")
            self.refusals[key] = self.refusals.get(key, 0) + 1
            self.sim.agent_of(c).intent_refused(e.intent_id, e.reason, e.time)
        elif k == "preempt_notice":
            c = self.sim.index[e.campaign]
            self.preemptions[c] += 1
            if e.lease_id in self.borrowed:
                self.borrowed_preempted[c] += 1
            if e.deadline is not None:
                self.sim.wake(e.deadline)
            self.sim.agent_of(c).preempt_notice(e.lease_id, e.deadline, e.time)

    # -- internals --------------------------------------------------------------------------------
    def _activate(self, lid: int, c: int, n: int, t: float, expiry: float | None, firm: bool,
                  lease: Any = None) -> None:
        self.leases[lid] = [c, n, t, expiry, firm]
        self.held[c] += n
        self._ct.append(t)
        self._cc.append(c)
        self._cd.append(n)
        self._firm.append(firm)
        if expiry is not None:
            self.sim.wake(expiry)
        self.sim.launch(lid, c, lease)
        self.sim.agent_of(c).lease_active(lid, n, expiry, t)

    def _end(self, lid: int, t: float, how: str) -> None:
        c, n, _, _, firm = self.leases.pop(lid)
        self.held[c] -= n
        self._ct.append(t)
        self._cc.append(c)
        self._cd.append(-n)
        self._firm.append(firm)
        if how == "released":
            self.sim.work_done(lid)
        self.sim.agent_of(c).lease_ended(lid, n, t, how)

    def changes(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        return (np.asarray(self._ct, float), np.asarray(self._cc, np.int64),
                np.asarray(self._cd, np.int64), np.asarray(self._firm, bool))


class _Null:
    """Stands in for an agent that has no hooks (population members have a group)."""

    def __getattr__(self, name: str) -> Callable[..., None]:
        return lambda *a, **k: None


@dataclass
class Timing:
    wall: float = 0.0
    engine: float = 0.0       # inside broker calls
    agents: float = 0.0       # everything else (agent logic, ledger, loop)
    calls: int = 0


class Simulation:
    """One run of a :class:`Scenario` against a fresh broker.

    ``Simulation(scenario, backend=None, journal=None)`` builds the broker (the scenario's
    pool, classes with its grace, prices, TTL, enforcement), registers every campaign and
    population and makes their agents; :meth:`run` plays the scenario to its end and returns
    a :class:`~bursarcore.sim.metrics.SimResult`.
    """

    # the broker's operations, timed (set by _instrument)
    _b_acquire: Callable[..., Decision]
    _b_release: Callable[..., Decision]
    _b_renew: Callable[..., Decision]
    _b_cancel: Callable[..., bool]
    _b_poll: Callable[..., Any]
    _b_supply: Callable[..., Any]
    _b_quote: Callable[..., Any]
    _b_consume: Callable[..., Any]
    _b_consume_batch: Callable[..., Any]
    _b_admit_batch: Callable[..., Any]
    _b_lease: Callable[..., Lease]
    _b_state: Callable[..., dict[str, Any]]

    def __init__(self, scenario: Scenario, *, backend: str | None = None,
                 journal: bool | None = None, use_numba: bool | None = None,
                 duration: float | None = None, reuse_after: int | None = REUSE_AFTER) -> None:
        from .agents import make_agent
        from .population import PopulationGroup

        sc = scenario
        self.sc = sc
        self.duration = float(duration if duration is not None else sc.duration)
        self.clock = ManualClock(0.0)
        want_journal = sc.broker["journal"] if journal is None else journal
        self.journal = MemoryJournal() if want_journal else None
        classes = tuple(dataclasses.replace(c, grace=sc.broker["grace"]) if c.preemptible else c
                        for c in DEFAULT_CLASSES)
        self.classes = {c.name: c for c in classes}
        self.dim = sc.pool.dims[0]
        self.capacity = sc.pool.capacity[self.dim]
        # the first dimension starts empty: the facility's pilots fill it (add_nodes)
        pool = sc.pool.to_dict()
        pool["capacity"][self.dim] = 0
        pool["slots"][self.dim] = []
        self.broker = Broker(Pool.from_dict(pool), self.clock, classes=classes,
                             price=sc.broker["price"], ttl=sc.broker["ttl"],
                             half_life=sc.broker["half_life"],
                             enforcement=sc.broker["enforcement"],
                             backend=backend or sc.broker["backend"], journal=self.journal,
                             reuse_after=reuse_after, borrow_grace=sc.broker["grace"])
        self._instrument()
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable, tuple]] = []
        self._seq = 0
        self._wakes: set[float] = set()
        self._need_poll = False
        self._last_call = -1.0
        self._inbox: list[tuple[Event, Any]] = []
        self._ending: set[int] = set()       # leases whose end is in the inbox
        self.broker.subscribe(self._on_event)
        self._setup_facility()
        self.names: list[str] = []
        self.index: dict[str, int] = {}
        self.agents: list[Any] = []          # one per campaign index (or the group's stand-in)
        self.named_agents: list[Any] = []    # agents of [[campaigns]]
        self.groups: list[PopulationGroup] = []
        ss = np.random.SeedSequence([sc.seed & ((1 << 63) - 1), 0xB5A2])
        children = ss.spawn(len(sc.campaigns) + len(sc.populations) + 1)
        self.rng = np.random.default_rng(children[-1])
        for node in sc.nodes:                # a tree's interior nodes (SPEC §14), parents first
            self._register(node.name, node.envelope)
            self.agents.append(_Null())
        for spec, child in zip(sc.campaigns, children):
            c = self._register(spec.name, spec.envelope)
            agent = make_agent(self, spec, c, np.random.default_rng(child))
            self.agents.append(agent)
            self.named_agents.append(agent)
        self.first_population = len(self.names)   # campaign indices from here: populations
        for pspec, child in zip(sc.populations, children[len(sc.campaigns):]):
            first = len(self.names)
            for k in range(pspec.count):
                self._register(f"{pspec.name}-{k:05d}", pspec.envelope)
                self.agents.append(_Null())
            group = PopulationGroup(self, pspec, first, np.random.default_rng(child),
                                    use_numba=use_numba)
            self.groups.append(group)
            for k in range(pspec.count):
                self.agents[first + k] = group.member(k)
        self.ledger = Ledger(self, len(self.names))
        self.samples: dict[str, list] = {"t": [], "free": [], "reclaimable": [],
                                         "congestion": [], "multiplier": []}
        self.tokens: dict[str, list[tuple[float, float]]] = {a.name: [] for a in self.named_agents}
        self.credits_left: dict[str, list[tuple[float, float]]] = {a.name: [] for a in self.named_agents}
        self.timing = Timing()
        self.decision_counts = {"acquire": 0, "release": 0, "renew": 0, "cancel": 0,
                                "consume": 0}
        self.result: SimResult | None = None

    # -- the facility: the local binding's pilots feed the pool (SPEC §12) ----------------------
    def _setup_facility(self) -> None:
        """The binding, the pool manager and the warm pool at t = 0 (before any campaign
        registers: guarantees are checked against the capacity the pilots brought)."""
        from ..adapters import LocalBinding, PoolManager

        f = dict(self.sc.facility or {})
        if not f:                                   # a Scenario built by hand
            from .scenario import _Ctx, _facility
            f = _facility(_Ctx("<scenario>"), None, self.capacity, self.duration)
        staggered = bool(f["walltime"])
        f["walltime"] = f["walltime"] or self.duration + 3600.0
        self.facility = f
        P = f["pilots"]
        self.binding = LocalBinding(
            dim="gpu" if self.dim == "gpu" else "cpu", slots_per_node=f["slots_per_node"],
            total_slots=self.capacity, start_delay=0.0, execution="simulated",
            sim_on_notice=f["on_notice"], clock=self.clock, wallclock=self.clock.now,
            min_interval=0.0)
        self.pool_manager = PoolManager(
            self.broker, self.binding, dim=self.dim, nodes_per_pilot=f["nodes_per_pilot"],
            walltime=f["walltime"], min_pilots=P, max_pilots=P, max_in_flight=P,
            submit_rate=f["submit_rate"], submit_burst=float(P),
            drain_lead=None if f["drain_lead"] < 0 else f["drain_lead"],
            drain_margin=f["drain_margin"], idle_time=math.inf, state_every=math.inf)
        self.fac: dict[str, Any] = {
            "submitted": 0, "joined": 0, "left": 0, "drained": 0, "cancelled": 0,
            "failed": 0, "ended": {}, "revoked": set(), "killed": set(),
            "capacity": [(0.0, 0)], "ticks": 0}
        self.work: dict[int, Any] = {}          # lease id -> LeaseHandle (simulated)
        self._pool_times: set[float] = set()
        self._enforce_times: set[float] = set()
        # the warm pool at t = 0. With a walltime given, the first pilots' walltimes are
        # staggered over [walltime/2, walltime], as in a facility that has been running for
        # a while (pilots submitted together would all end together); replacements get the
        # full walltime
        for i in range(P):
            w = f["walltime"] * (0.5 + 0.5 * (i + 1) / P) if staggered else f["walltime"]
            self.pool_manager.provision(walltime=w, force=True)
            self.fac["submitted"] += 1
        self._fac_note(self.pool_manager.tick())    # its pilots run: they join the pool
        got = self.fac["capacity"][-1][1]
        if got != self.capacity:                    # pragma: no cover - a scenario bug
            raise RuntimeError(f"the facility provided {got} {self.dim}, not {self.capacity}")
        self.binding.start_delay = f["start_delay"]   # later pilots wait in the queue

    def _fac_note(self, rep: Any) -> None:
        fac = self.fac
        fac["ticks"] += 1
        fac["submitted"] += len(rep.submitted)
        fac["joined"] += len(rep.joined)
        fac["left"] += len(rep.left)
        fac["drained"] += len(rep.drained)
        fac["cancelled"] += len(rep.cancelled)
        fac["revoked"].update(rep.revoked)
        fac["killed"].update(rep.killed)
        for pid in rep.ended:
            st = self.pool_manager.pilots[pid].state
            fac["ended"][st] = fac["ended"].get(st, 0) + 1
        cap = sum(p.slots for p in self.pool_manager.pilots.values() if p.in_pool)
        if cap != fac["capacity"][-1][1]:
            fac["capacity"].append((self.now, cap))

    def _pool_round(self, t: float, periodic: bool = False) -> None:
        """One pool manager round (pilot states, pool membership, drains, enforcement,
        replacements); then the next one is scheduled at the manager's next event."""
        if not periodic:
            self._pool_times.discard(t)
        self._fac_note(self.pool_manager.tick())
        if periodic:
            # the manager does not read the broker's whole state (a fixed-size pool needs
            # none): the simulator knows the live leases, and lets the binding forget the
            # handles of the others
            self.binding.forget(list(self.ledger.leases) + list(self.ledger.starting))
        if periodic and t + self.facility["tick"] <= self.duration:
            self.at(t + self.facility["tick"], self._pool_round, True)
        self._schedule_pool()

    def _schedule_pool(self) -> None:
        nxt = self.pool_manager.next_event(kills=False)
        if nxt is not None and nxt <= self.duration and nxt not in self._pool_times:
            self._pool_times.add(nxt)
            self.at(nxt, self._pool_round)
        self._schedule_enforce()

    def _schedule_enforce(self) -> None:
        nxt = self.binding.next_deadline()
        if nxt is not None and nxt <= self.duration and nxt not in self._enforce_times:
            self._enforce_times.add(nxt)
            self.at(nxt, self._enforce)

    def _enforce(self, t: float) -> None:
        """Kills the binding owes (an expired lease's grace ran out)."""
        self._enforce_times.discard(t)
        self.fac["killed"].update(self.binding.enforce())
        self._schedule_enforce()

    def _fail(self, t: float, n: int) -> None:
        """A node failure takes the ``n`` busiest pilots (most units leased; the first
        submitted on ties): they end at once and the manager's next round removes them."""
        pm = self.pool_manager
        busy: dict[str, int] = {}
        for lease in self.broker.leases():
            for node, k in lease.placement or ():
                pid = node.partition("/")[0]
                busy[pid] = busy.get(pid, 0) + int(k)
        live = [p for p in pm.pilots.values() if p.in_pool]
        live.sort(key=lambda p: -busy.get(p.id, 0))
        for p in live[:n]:
            self.binding.fail(p.id)
            self.fac["failed"] += 1
        self._pool_round(t)

    def launch(self, lid: int, c: int, lease: Any = None) -> None:
        """Launch an active lease's (simulated) work on its placement, through the binding
        (``lease``: the broker's snapshot of it, when the caller has one)."""
        if not self.facility["launch"] or (c >= self.first_population
                                           and not self.facility["launch_populations"]):
            return
        if lid in self._ending:
            # it ended in the same broker call that started it: nothing to run, and the
            # binding, which heard the end before the work existed, would never stop it
            return
        if lease is None or lease.state != "active":
            lease = self._b_lease(lid)
        if lease.dim != self.dim:
            return
        self.work[lid] = self.binding.launch(lease, ["sim-work", self.names[c]])

    def work_done(self, lid: int) -> None:
        """The agent released the lease: its work ended by itself."""
        if lid in self.work:
            self.binding.finish(lid)

    def facility_summary(self) -> dict:
        fac, f = self.fac, self.facility
        parts = [h for lh in self.work.values() for h in lh.parts]
        status: dict[str, int] = {}
        for lh in self.work.values():
            status[lh.status] = status.get(lh.status, 0) + 1
        caps = [c for _, c in fac["capacity"]]
        return {
            "binding": "local", "execution": "simulated",
            "pilots": f["pilots"], "nodes_per_pilot": f["nodes_per_pilot"],
            "slots_per_node": f["slots_per_node"], "walltime": f["walltime"],
            "start_delay": f["start_delay"], "failures": list(f["failures"]),
            "pilots_submitted": fac["submitted"], "pilots_joined": fac["joined"],
            "pilots_left": fac["left"], "pilots_drained": fac["drained"],
            "pilots_failed": fac["failed"], "pilots_ended": dict(sorted(fac["ended"].items())),
            "leases_revoked_by_pool": len(fac["revoked"]),
            "work_launched": len(self.work), "work_parts": len(parts),
            "work_signalled": sum(any(h.signalled for h in lh.parts)
                                  for lh in self.work.values()),
            "work_killed": len(fac["killed"]),
            "work_status": dict(sorted(status.items())),
            "capacity_min": min(caps[1:]) if len(caps) > 1 else 0,
            "capacity_changes": [[t, c] for t, c in fac["capacity"]],
            "manager_rounds": fac["ticks"],
        }

    # -- broker calls (timed; the journal sees every one) ---------------------------------------
    def _instrument(self) -> None:
        """Wrap the broker's public calls to time the engine's share of the run."""
        b = self.broker
        timing_box: list[Timing] = []
        self._timing_box = timing_box

        def timed(fn: Callable) -> Callable:
            def call(*a: Any, **k: Any) -> Any:
                t0 = time.perf_counter()
                try:
                    return fn(*a, **k)
                finally:
                    tm = self.timing
                    tm.engine += time.perf_counter() - t0
                    tm.calls += 1
                    self._last_call = self.now
            return call

        for name in ("acquire", "release", "renew", "cancel", "poll", "supply", "quote",
                     "consume", "consume_batch", "admit_batch", "lease", "state"):
            setattr(self, "_b_" + name, timed(getattr(b, name)))

    def _register(self, name: str, envelope: Any) -> int:
        c = self.broker.register(name, envelope)
        self.names.append(name)
        self.index[name] = c
        return c

    def agent_of(self, c: int) -> Any:
        return self.agents[c]

    def taskset(self, name: str) -> Any:
        """The task set ``name``, drawn once from the scenario seed (agents share it)."""
        from .tasks import make_taskset

        cache = self.__dict__.setdefault("_tasksets", {})
        if name not in cache:
            cache[name] = make_taskset(self.sc.tasksets[name].params, self.sc.seed)
        return cache[name]

    def acquire(self, agent: Any, units: int | tuple[int, int], duration: float, *,
                ttl: float | None = None, service_class: str | None = None,
                max_spend: float | None = None, within_guarantee: bool = False) -> Decision:
        d = self._b_acquire(Intent(agent.name, {self.dim: units}, duration, ttl=ttl,
                                   service_class=service_class, max_spend=max_spend))
        self.decision_counts["acquire"] += 1
        hi = units[1] if isinstance(units, tuple) else units
        self.ledger.on_decision(agent.index, self.now, d, hi, within_guarantee)
        if d.outcome == "pending":
            self.wake(self.now + (ttl if ttl is not None else self.sc.broker["ttl"]))
        return d

    def release(self, lid: int) -> Decision:
        d = self._b_release(lid)
        self.decision_counts["release"] += 1
        self.ledger.on_release(lid, self.now)
        return d

    def renew(self, lid: int, duration: float) -> Decision:
        d = self._b_renew(lid, duration)
        self.decision_counts["renew"] += 1
        self.ledger.on_renew(lid, d)
        return d

    def cancel(self, intent_id: int) -> bool:
        ok = self._b_cancel(intent_id)
        if ok:
            self.decision_counts["cancel"] += 1
            self.ledger.pending.pop(intent_id, None)
        return ok

    def supply(self, agent: Any) -> Any:
        return self._b_supply(agent.name)

    def quote(self, agent: Any, sizes: Any, durations: Any) -> Any:
        return self._b_quote(agent.name, sizes, durations)

    def consume(self, agent: Any, dim: str, amount: float) -> Any:
        self.decision_counts["consume"] += 1
        return self._b_consume(agent.name, dim, amount)

    # -- the loop ----------------------------------------------------------------------------------
    def at(self, t: float, fn: Callable, *args: Any) -> None:
        """Run ``fn(t, *args)`` at simulated time ``t`` (never before now)."""
        self._seq += 1
        heapq.heappush(self._heap, (max(t, self.now), self._seq, fn, args))

    def wake(self, t: float | None) -> None:
        """Look at the broker at ``t`` (a time it announced: expiry, deadline, TTL)."""
        if t is None or t > self.duration or t in self._wakes:
            return
        self._wakes.add(t)
        self.at(t, self._on_wake)

    def _on_wake(self, t: float) -> None:
        self._wakes.discard(t)
        self._need_poll = True

    def _poll(self) -> None:
        """Bring the broker to now (its events arrive through the subscription)."""
        self._b_poll()
        self._drain()

    def _on_event(self, e: Event) -> None:
        """The broker's subscriber: queue the event, with what the ledger will need of its
        lease read now. One broker call (a poll across several event times) can grant a
        lease, end it and give its row to a later grant before :meth:`_drain` runs, and
        ``lease(id)`` of such a lease raises ``UnknownLease``."""
        k = e.kind
        lease = None
        if k == "granted" or k == "activated":
            assert e.lease_id is not None
            lease = self.broker.lease(e.lease_id)
        elif k == "expired" or k == "revoked" or k == "released":
            assert e.lease_id is not None
            self._ending.add(e.lease_id)
        self._inbox.append((e, lease))

    def _drain(self) -> None:
        inbox = self._inbox
        while inbox:
            batch = inbox[:]
            inbox.clear()
            for e, lease in batch:
                self.ledger.on_event(e, lease)
                if e.kind == "expired" or e.kind == "revoked" or e.kind == "released":
                    self._ending.discard(e.lease_id)
            self._schedule_enforce()      # an expiry's kill is due after its grace

    def _sample(self, t: float) -> None:
        """Pool signals every ``sample_every`` s (from the first campaign's supply); the
        tokens and credits of watched campaigns (storms) every sample, of the others every
        sixth."""
        k = int(round(t / self.sc.sample_every))
        pool_done = False
        for i, a in enumerate(self.named_agents):
            if not (i == 0 or a.watch or k % 6 == 0):
                continue
            sp = self.supply(a)
            dims = sp.dims[self.dim]
            if not pool_done:
                self._pool_sample(t, dims)
                pool_done = True
            if math.isfinite(dims.bucket):
                self.tokens[a.name].append((t, dims.tokens))
            self.credits_left[a.name].append((t, sp.credits))
        if not pool_done and self.names:
                self._pool_sample(t, self._b_supply(self.names[0]).dims[self.dim])
        nxt = t + self.sc.sample_every
        if nxt <= self.duration + 1e-9:
            self.at(nxt, self._sample)

    def _pool_sample(self, t: float, dims: Any) -> None:
        s = self.samples
        s["t"].append(t)
        s["free"].append(dims.free)
        s["reclaimable"].append(dims.reclaimable)
        s["congestion"].append(dims.congestion)
        s["multiplier"].append(dims.multiplier)

    def run(self) -> Any:
        """Play the scenario to its end; returns a :class:`~bursarcore.sim.metrics.SimResult`."""
        from .metrics import collect

        wall0 = time.perf_counter()
        self.at(0.0, self._sample)
        if self.facility["tick"] <= self.duration:
            self.at(self.facility["tick"], self._pool_round, True)
        self._schedule_pool()
        for fl in self.facility["failures"]:
            self.at(fl["at"], self._fail, fl["pilots"])
        for a in self.named_agents:
            a.start()
        for g in self.groups:
            g.start()
        heap = self._heap
        horizon = self.duration
        while heap and heap[0][0] <= horizon:
            t = heap[0][0]
            if t > self.now:
                self.clock.set(t)
                self.now = t
            if t in self._wakes:        # the broker's own events first, then the agents
                self._wakes.discard(t)
                self._poll()
            while True:
                while heap and heap[0][0] <= t:
                    _, _, fn, args = heapq.heappop(heap)
                    fn(t, *args)
                    if self._inbox:
                        self._drain()
                if self._need_poll and self._last_call < t:
                    self._poll()
                    continue
                self._need_poll = False
                break
        if self.now < horizon:
            self.clock.set(horizon)
            self.now = horizon
        self._poll()
        for a in self.named_agents:
            a.finish(horizon)
        for g in self.groups:
            g.finish(horizon)
        # the run ends: release what is still held, so credits are those of the window
        for lid in sorted(set(self.ledger.leases) | set(self.ledger.starting)):
            self.release(lid)
        self._poll()
        self.state = self._b_state()
        self.timing.wall = time.perf_counter() - wall0
        self.timing.agents = self.timing.wall - self.timing.engine
        self.result = collect(self)
        return self.result


def run_scenario(scenario: Scenario | str | None = None, **kwargs: Any) -> Any:
    """Load (if given a name or path) and run a scenario; returns its SimResult."""
    from .scenario import load_scenario

    sc = scenario if isinstance(scenario, Scenario) else load_scenario(scenario)
    return Simulation(sc, **kwargs).run()
