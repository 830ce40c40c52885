"""The pool manager (SPEC §12): joins a facility :class:`~bursarcore.adapters.Binding` to a broker.

:class:`PoolManager` turns running pilot allocations into pool capacity
(``Broker.add_nodes``), takes them out again when they end (``Broker.remove_nodes``, which
revokes the leases on them with notice), keeps the warm pool between a minimum and a
maximum size from pending demand and congestion without flooding the scheduler (a token
bucket on submissions and a cap on pilots in flight), and enforces the broker's
revocations on the machine (signal, then kill after the grace).

Time. The manager reads the broker's clock (``clock.now()``, seconds) for everything it
decides, so tests run on a :class:`~bursarcore.clock.ManualClock`; the binding is given the
same clock.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence, cast

from ..buckets import TokenBuckets
from ..errors import CommandError, InvalidArgument
from .handles import LeaseHandle
from .interface import (CANCELLED, COMPLETED, FAILED, HELD, PENDING, RUNNING, UNKNOWN, Binding,
                        Pilot, PilotStatus, node_name)

__all__ = ["PoolManager", "Provision", "TickReport", "COLD_WAIT_MODES"]

log = logging.getLogger("bursarcore.adapters")


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
