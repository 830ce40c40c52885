"""SPEC §11 invariants 1–7 as hypothesis state machines with adversarial campaigns,
checked after every step, on every engine backend."""

from __future__ import annotations

import math
import os

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (RuleBasedStateMachine, initialize, invariant, rule,
                                 run_state_machine_as_test)

from bursarcore import Broker, Envelope, Intent, ManualClock, Pool
from bursarcore.admission.state import MAXV, STARTING
from bursarcore.broker import BACKENDS

from invariants import LeaseOps, apply_lease_op, check_invariants

INF = math.inf
NS = 1_000_000_000
GRACE = 60.0

CAMPAIGNS = {
    # an adversary storming its ceiling, on a tiny budget of tokens and credits
    "storm": Envelope(credits=200, service_class="agent-burst", guaranteed={"gpu": 0},
                      sustained={"gpu": 8}, ceiling={"gpu": 48}, burst={"gpu": 2000}),
    # small, guaranteed, latency-sensitive
    "inter": Envelope(credits=100, service_class="interactive", guaranteed={"gpu": 8},
                      sustained={"gpu": 8}, ceiling={"gpu": 16}, burst={"gpu": 500}),
    "dl": Envelope(credits=INF, service_class="deadline", guaranteed={"gpu": 16},
                   sustained={"gpu": 16}, ceiling={"gpu": 32}, burst={"gpu": 1000}),
    "bf": Envelope(credits=INF, service_class="opportunistic", sustained={"gpu": 64},
                   ceiling={"gpu": 64}, burst={"gpu": INF}),
}
NAMES = list(CAMPAIGNS)


def new_broker(backend: str, enforcement: str = "prepaid", reuse_after: int | None = 1024
               ) -> Broker:
    b = Broker(Pool(gpu=64, warm_headroom={"gpu": 2}), clock=ManualClock(0.0), backend=backend,
               ttl=120.0, enforcement=enforcement, reuse_after=reuse_after)
    for name, env in CAMPAIGNS.items():
        b.register(name, env)
    return b


class BrokerMachine(LeaseOps, RuleBasedStateMachine):
    backend = "reference"
    reuse_after: int | None = 1024

    @initialize()
    def setup(self):
        self.b = new_broker(self.backend, reuse_after=self.reuse_after)
        self.ops: list[tuple] = []
        self.log: list = []
        self.released: dict[int, float] = {}

    # -- operations ------------------------------------------------------------------
    def _do(self, op):
        self.ops.append(op)
        out = apply(self.b, op, self.released)
        self.log.append(out)
        return out

    @rule(c=st.sampled_from(NAMES), lo=st.integers(1, 48), span=st.integers(0, 48),
          dur=st.sampled_from([1.0, 5.0, 30.0, 60.0, 300.0, 900.0]),
          opp=st.booleans(), deadline=st.sampled_from([None, 0.5, 30.0, 90.0]))
    def acquire(self, c, lo, span, dur, opp, deadline):
        cls = "opportunistic" if opp and c != "bf" else None
        self._do(("acquire", c, lo, lo + span, dur, cls, deadline))

    @rule(dt=st.sampled_from([0.0, 0.25, 1.0, 7.0, 30.0, 60.0, 61.0, 300.0]))
    def advance(self, dt):
        self._do(("advance", dt))

    @rule(items=st.lists(st.tuples(st.integers(0, 3), st.integers(1, 24),
                                   st.sampled_from([5.0, 60.0, 600.0])), min_size=1, max_size=6))
    def batch(self, items):
        self._do(("batch", tuple(items)))

    @rule(c=st.sampled_from(["inter", "dl"]))
    def guarantee_probe(self, c):
        """Invariant 2: a request within the unmet guarantee is never refused (or left
        pending) for capacity, and is active within the preemption grace."""
        st_ = self.b.state()["campaigns"][c]
        n = int(CAMPAIGNS[c].g("gpu")) - st_["firm_held"]["gpu"]
        if n <= 0:
            return
        d = self._do(("acquire", c, n, n, 30.0, None, None))
        assert d["reason"] != "capacity", d
        if d["outcome"] == "granted":
            assert d["wait"] <= GRACE

    # -- invariants ------------------------------------------------------------------
    @invariant()
    def running_sums_and_bounds(self):
        if not hasattr(self, "b"):
            return
        check_invariants(self.b)

    def teardown(self):
        if not hasattr(self, "b"):
            return
        check_prepaid_bound(self.b, self.released)
        # invariant 7: the same operations give the same decisions and state
        again = new_broker(self.backend, reuse_after=self.reuse_after)
        rel: dict[int, float] = {}
        assert [apply(again, op, rel) for op in self.ops] == self.log
        assert again.state() == self.b.state()


def apply(b: Broker, op: tuple, released: dict):
    kind = op[0]
    if kind == "acquire":
        _, c, lo, hi, dur, cls, deadline = op
        dl = None if deadline is None else b.clock.now() + deadline
        return b.acquire(Intent(c, units={"gpu": (lo, hi)}, duration=dur, service_class=cls,
                                deadline=dl)).to_dict()
    r = apply_lease_op(b, op, released)
    if r is not NotImplemented:
        return r
    if kind == "batch":
        items = op[1]
        r = b.admit_batch([i[0] for i in items], [i[1] for i in items], [i[2] for i in items])
        return [x.tolist() for x in r]
    raise AssertionError(kind)


def check_prepaid_bound(b: Broker, released: dict) -> None:
    """Invariant 3: above-sustained unit-seconds actually held ≤ B + refills. Read off the
    compiled engine's mint ledger; the reference broker is held to it by deciding as the
    compiled one does (the differential suites)."""
    if not hasattr(b, "st"):
        return
    st = b.st
    now = b.clock.now()
    for c, name in enumerate(b.campaigns):
        B = int(st.Bcap[c, 0])
        if B >= MAXV or st.scal[1]:
            continue
        edges = []
        for l in range(st.nleases):
            if int(st.camp[l]) != c or int(st.t_start[l]) == 0 and int(st.state[l]) == STARTING:
                continue
            lease = b.lease(st.lease_id(l))
            if lease.start is None:
                continue
            end = {"released": released.get(lease.id), "expired": lease.expiry,
                   "revoked": lease.revoke_at}.get(lease.state, min(now, lease.expiry))
            if end is None or end <= lease.start:
                continue
            edges += [(lease.start, lease.units), (end, -lease.units)]
        edges.sort()
        s = int(st.s[c, 0])
        H, t0, above = 0, 0.0, 0.0
        for t, du in edges:
            above += max(0, H - s) * (t - t0)
            H, t0 = H + du, t
        minted = int(st.tok_minted[c, 0]) / NS
        assert above <= B / NS + minted + 1e-6, (name, above, B / NS, minted)


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_invariants_state_machine(backend):
    M = type(f"BrokerMachine_{backend}", (BrokerMachine,), {"backend": backend})
    thorough = os.environ.get("HYPOTHESIS_PROFILE") == "thorough"
    run_state_machine_as_test(M, settings=settings(
        max_examples=400 if thorough else 30, stateful_step_count=60 if thorough else 40, deadline=None, derandomize=True,
        suppress_health_check=list(HealthCheck)))


def test_invariants_state_machine_reusing_rows_at_once(backend):
    """The same, with every ended lease's row reused by the next grant (the prepaid bound
    then sees only the leases whose rows were not reused: the running sums are checked in
    full)."""
    M = type(f"BrokerMachineReuse_{backend}", (BrokerMachine,),
             {"backend": backend, "reuse_after": 0})
    run_state_machine_as_test(M, settings=settings(
        max_examples=30, stateful_step_count=40, deadline=None, derandomize=True,
        suppress_health_check=list(HealthCheck)))


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_storm_at_ceiling_is_held_to_prepaid_rate(backend):
    """A storm demanding its ceiling for 1,800 s holds on average ≈ s + B/window
    (SPEC §10: 64 + 150,000/1,800 ≈ 147) and never more than B above s."""
    b = Broker(Pool(gpu=512), clock=ManualClock(0.0), backend=backend)
    b.register("storm", Envelope(credits=1e6, service_class="agent-burst",
                                 guaranteed={"gpu": 16}, sustained={"gpu": 64},
                                 ceiling={"gpu": 384}, burst={"gpu": 150_000}))
    held = []
    for _ in range(1800):
        h = b.supply("storm").dims["gpu"].held
        if h < 384:
            b.acquire(Intent("storm", units={"gpu": (1, 384 - h)}, duration=60))
        held.append(b.supply("storm").dims["gpu"].held)
        b.clock.advance(1)
    avg = sum(held) / len(held)
    assert 64 < avg < 384
    assert abs(avg - (64 + 150_000 / 1800)) < 15
    above = sum(max(0, h - 64) for h in held)
    assert above <= 150_000 + 1e-6


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_reclaim_grant_released_before_activation_never_started(backend):
    """A starting lease released during its victims' grace held nothing, so it must not
    count as extraction (invariant 3); the state machine's shortest case of it."""
    b = new_broker(backend)
    released: dict[int, float] = {}
    for op in [("advance", 120.0), ("acquire", "bf", 1, 40, 1.0, None, None),
               ("acquire", "storm", 1, 25, 1.0, None, None)]:
        apply(b, op, released)
    starting = [l for l in b.leases() if l.state == "starting"]
    assert len(starting) == 1
    apply(b, ("release", starting[0].id), released)
    lease = b.lease(starting[0].id)
    assert lease.state == "released" and lease.start is None and lease.expiry is None
    check_invariants(b)
    check_prepaid_bound(b, released)
