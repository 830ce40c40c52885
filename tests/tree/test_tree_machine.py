"""SPEC §14 over random trees of envelopes: a hypothesis state machine with adversarial
leaves storming at their ceilings (firm and opportunistic), idle nodes waking to ask within
their guarantee, releases, renewals, cancellations and the clock running through expiries,
revocations and activations. After every step, read off what a user sees (``state()``, the
leases, the envelopes), never the broker's own sums:

* capacity: placed units ≤ capacity, and Σ_top R ≤ capacity with R recomputed here from
  the live firm leases and the guarantees (and equal to the pool's firm + unmet figures);
* every node: its subtree's holding (and firm holding) as reported; its load K, recomputed
  here from the live leases and the guarantees, ≥ that holding and ≤ its ceiling; tokens
  in [0, B]; credits left ≥ 0, escrow = the cost of its subtree's live leases, and left +
  escrow + spent = budget;
* isolation at every level: a firm request of n with K_c + n ≤ g_c is never refused nor
  left pending for capacity, ceiling or tokens at any level, is active within the grace,
  and is granted outright when no budget on c's path could bind; a firm request of
  n ≤ slack_c is never refused nor left pending for capacity;

* borrowing (SPEC §14.8): a node's borrowed leases (not firm, of a firm class) hold no more
  than its borrow limit, a borrowed grant is revocable, and every revocation falls due
  within the grace (a lender waking within its guarantee is served within it, above);

and at the end: the prepaid bound per node (the unit-seconds of its load above its s ≤ B +
its refill), determinism (the same operations give the same results and state) and replay
of the journal (the same state).
"""

from __future__ import annotations

import math
import os

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (RuleBasedStateMachine, initialize, invariant, precondition,
                                 rule, run_state_machine_as_test)

from bursarcore import Broker, Intent, ManualClock, Pool
from bursarcore.journal.memory import MemoryJournal
from invariants import LeaseOps, apply_lease_op
from treegen import CAP, Node, trees

pytestmark = pytest.mark.tree

INF = math.inf
GRACE = 60.0
LIVE = ("starting", "active", "revoking")
PLACED = ("active", "revoking")


def build(nodes: list[Node], journal: MemoryJournal | None = None) -> Broker:
    b = Broker(Pool(gpu=CAP, warm_headroom={"gpu": 4}), clock=ManualClock(0.0), ttl=120.0,
               journal=journal)
    for x in nodes:
        b.register(x.name, x.env)
    return b


def apply(b: Broker, nodes: list[Node], op: tuple, released: dict) -> object:
    kind = op[0]
    if kind == "acquire":
        _, i, lo, hi, dur, cls = op
        return b.acquire(Intent(nodes[i].name, units={"gpu": (lo, hi)}, duration=dur,
                                service_class=cls)).to_dict()
    r = apply_lease_op(b, op, released)
    if r is not NotImplemented:
        return r
    raise AssertionError(kind)


def loads(children: list[list[int]], g: list[int], own: list[int]) -> list[int]:
    """K_v = own_v + Σ_ch max(g_ch, K_ch) (SPEC §14.2); children come after parents."""
    K = [0] * len(g)
    for i in reversed(range(len(g))):
        K[i] = own[i] + sum(max(g[j], K[j]) for j in children[i])
    return K


class Figures:
    """The tree's figures, recomputed from what a user reads."""

    def __init__(self, b: Broker, nodes: list[Node]) -> None:
        self.state = b.state()
        self.leases = self.state["leases"]
        n = len(nodes)
        self.children = [[j for j in range(n) if nodes[j].parent == i] for i in range(n)]
        self.path = []
        for i in range(n):
            p, v = [], i
            while v is not None:
                p.append(v)
                v = nodes[v].parent
            self.path.append(p)
        index = {x.name: i for i, x in enumerate(nodes)}
        self.own = [0] * n
        self.own_firm = [0] * n
        self.borrowed = [0] * n      # SPEC §14.8: not firm, of a firm class
        self.cost = [0.0] * n
        for l in self.leases:
            if l["state"] in LIVE:
                i = index[l["campaign"]]
                self.own[i] += l["units"]
                self.own_firm[i] += l["units"] if l["firm"] else 0
                if not l["firm"] and l["service_class"] != "opportunistic":
                    self.borrowed[i] += l["units"]
        self.sub = [0] * n
        self.sub_firm = [0] * n
        for i in range(n):
            for v in self.path[i]:
                self.sub[v] += self.own[i]
                self.sub_firm[v] += self.own_firm[i]
        g = self.g = [int(x.env.g("gpu")) for x in nodes]
        self.K = loads(self.children, g, self.own)
        self.R = [0] * n
        for i in reversed(range(n)):       # children come after their parents
            self.R[i] = max(g[i], self.own_firm[i] + sum(self.R[j] for j in self.children[i]))
        self.slack = [self.R[i] - self.own_firm[i] - sum(self.R[j] for j in self.children[i])
                      for i in range(n)]
        self.top = sum(self.R[i] for i in range(n) if nodes[i].parent is None)


class TreeMachine(LeaseOps, RuleBasedStateMachine):

    @initialize(nodes=trees())
    def setup(self, nodes):
        self.nodes = nodes
        self.journal = MemoryJournal()
        self.b = build(nodes, self.journal)
        self.ops: list[tuple] = []
        self.log: list = []
        self.released: dict[int, float] = {}

    def _do(self, op):
        self.ops.append(op)
        out = apply(self.b, self.nodes, op, self.released)
        self.log.append(out)
        return out

    # -- operations ----------------------------------------------------------------------
    @rule(k=st.integers(0, 1000), opp=st.booleans(),
          dur=st.sampled_from([5.0, 60.0, 300.0, 900.0]))
    def storm(self, k, opp, dur):
        """An adversarial node asks for everything its ceiling allows."""
        storms = [i for i, x in enumerate(self.nodes) if x.storm] or [0]
        i = storms[k % len(storms)]
        b = int(self.nodes[i].env.b("gpu"))
        if b >= 1:
            self._do(("acquire", i, 1, b, dur, "opportunistic" if opp else None))

    @rule(k=st.integers(0, 1000), lo=st.integers(1, 24), span=st.integers(0, 24),
          dur=st.sampled_from([1.0, 30.0, 600.0]), opp=st.booleans())
    def acquire(self, k, lo, span, dur, opp):
        i = k % len(self.nodes)
        self._do(("acquire", i, lo, lo + span, dur, "opportunistic" if opp else None))

    @rule(k=st.integers(0, 1000), frac=st.floats(0.0, 1.0),
          dur=st.sampled_from([10.0, 60.0, 600.0]))
    def wake_within_guarantee(self, k, frac, dur):
        """SPEC §14.3: a firm request within the node's guarantee, K_c + n ≤ g_c (K
        recomputed here), is refused or left pending for nothing but a budget, at any
        level, whatever its siblings and cousins hold: granted warm or on the reclaim
        path within the grace, and granted outright when every budget on its path is
        ample."""
        i = k % len(self.nodes)
        f = Figures(self.b, self.nodes)
        u = f.g[i] - f.K[i]
        if u < 1:
            return
        n = max(1, min(u, round(u * frac)))
        assert n <= f.slack[i]                     # K_c + n ≤ g_c implies n ≤ slack_c
        ample = self._budgets_ample(f, i, n, dur)
        d = self._do(("acquire", i, n, n, dur, "interactive"))
        if d["outcome"] == "granted":
            assert d["wait"] <= GRACE, d
        else:
            assert d["reason"] == "credits", (self.nodes[i].name, n, u, d)
        if ample:
            assert d["outcome"] == "granted", (self.nodes[i].name, n, d)

    @rule(k=st.integers(0, 1000), frac=st.floats(0.0, 1.0),
          dur=st.sampled_from([10.0, 60.0, 600.0]))
    def wake_within_slack(self, k, frac, dur):
        """SPEC §14.3: a firm request of n ≤ slack_c (recomputed here) is never refused
        nor left pending for capacity (its ancestors' ceilings and buckets may still hold
        it when it is above its guarantee's load)."""
        i = k % len(self.nodes)
        f = Figures(self.b, self.nodes)
        u = f.slack[i]
        if u < 1:
            return
        n = max(1, min(u, round(u * frac)))
        d = self._do(("acquire", i, n, n, dur, "interactive"))
        assert d["reason"] != "capacity", (self.nodes[i].name, n, u, d)
        if d["outcome"] == "granted":
            assert d["wait"] <= GRACE, d

    def _budgets_ample(self, f: Figures, i: int, n: int, dur: float) -> bool:
        """Every budget on i's path has ample credits for n (the interactive class at the
        highest congestion multiplier)."""
        worst = n * dur / 3600 * 2.0 * 3.0
        camps = f.state["campaigns"]
        for v in f.path[i]:
            left = camps[self.nodes[v].name]["credits_left"]
            if left is not None and left < worst + 1:
                return False
        return True

    @rule(k=st.integers(0, 1000), dur=st.sampled_from([30.0, 600.0]))
    def borrow(self, k, dur):
        """SPEC §14.8: a borrower asks, firm, for twice what its borrow limit allows: a
        borrowed grant is revocable, of at most what the limit leaves, and is taken only
        where it gives more than the firm room would."""
        borrowers = [i for i, x in enumerate(self.nodes) if x.env.borrow("gpu") > 0]
        if not borrowers:
            return
        i = borrowers[k % len(borrowers)]
        f = Figures(self.b, self.nodes)
        left = int(self.nodes[i].env.borrow("gpu")) - f.borrowed[i]
        d = self._do(("acquire", i, 1, 2 * int(self.nodes[i].env.borrow("gpu")), dur,
                      "interactive"))
        if d["path"] == "borrow":
            assert not d["lease"]["firm"] and d["units"] <= left, (d, left)

    @rule(dt=st.sampled_from([0.0, 0.5, 5.0, 30.0, 60.0, 61.0, 300.0, 1000.0]))
    def advance(self, dt):
        self._do(("advance", dt))

    # -- after every step ----------------------------------------------------------------
    @precondition(lambda self: hasattr(self, "b"))
    @invariant()
    def every_level_holds(self):
        f = Figures(self.b, self.nodes)
        pool = f.state["pool"]["gpu"]
        placed = sum(l["units"] for l in f.leases if l["state"] in PLACED)
        assert placed == pool["occupied"] <= pool["capacity"]
        # the reserve rule, recomputed: Σ_top R ≤ capacity (SPEC §14.3)
        assert f.top <= pool["capacity"], (f.top, pool)
        assert pool["firm"] + pool["unmet_guarantees"] == f.top
        assert min(f.slack) >= 0
        # revocations, borrowed units' included, fall due within the grace (SPEC §6, §14.8)
        now = self.b.clock.now()
        for l in f.leases:
            if l["state"] == "revoking":
                assert l["revoke_at"] - now <= GRACE, l
        for i, x in enumerate(self.nodes):
            c = f.state["campaigns"][x.name]
            env = x.env
            assert c["held"]["gpu"] == f.sub[i]
            assert c["firm_held"]["gpu"] == f.sub_firm[i]
            assert f.borrowed[i] <= env.borrow("gpu")                        # SPEC §14.8
            assert f.sub[i] <= f.K[i] <= env.b("gpu")                         # ceiling
            T = c["tokens"]["gpu"]
            assert T is None or 0 <= T <= env.B("gpu")                        # bucket
            # credits over the subtree: escrow = its live leases' cost; conservation
            sub = {self.nodes[j].name for j in range(len(self.nodes)) if i in f.path[j]}
            cost = sum(l["cost"] for l in f.leases if l["state"] in LIVE
                       and l["campaign"] in sub)
            assert abs(c["credits_escrowed"] - cost) <= 1e-6 * (1 + len(f.leases))
            if not math.isinf(env.credits):
                assert c["credits_left"] >= 0
                total = c["credits_left"] + c["credits_escrowed"] + c["credits_spent"]
                assert abs(total - env.credits) <= 1e-5

    def teardown(self):
        if not hasattr(self, "b"):
            return
        self._prepaid_bound()
        # determinism: the same operations, the same results and state
        again = build(self.nodes, MemoryJournal())
        rel: dict[int, float] = {}
        assert [apply(again, self.nodes, op, rel) for op in self.ops] == self.log
        assert again.state() == self.b.state()
        # replay: the journal rebuilds the same broker (its own records checked on the way)
        replayed = type(self.b).replay(self.journal, clock=ManualClock(self.b.clock.now()),
                                       resume=False)
        assert replayed.state() == self.b.state()

    def _prepaid_bound(self):
        """SPEC §4.2 per node (§14.2): the unit-seconds of its load K above its s, with K
        recomputed here from the placed leases and the guarantees, ≤ B + what its bucket
        refilled."""
        now = self.b.clock.now()
        state = self.b.state()
        ids = {d["lease"]["id"] for d in self.log
               if isinstance(d, dict) and d.get("lease") is not None}
        index = {x.name: i for i, x in enumerate(self.nodes)}
        n = len(self.nodes)
        children = [[j for j in range(n) if self.nodes[j].parent == i] for i in range(n)]
        g = [int(x.env.g("gpu")) for x in self.nodes]
        s = [x.env.s("gpu") for x in self.nodes]
        edges: dict[float, list[int]] = {}
        for l in (self.b.lease(i) for i in sorted(ids)):
            if l.start is None:
                continue
            end = {"released": self.released.get(l.id), "expired": l.expiry,
                   "revoked": l.revoke_at}.get(l.state, min(now, l.expiry))
            if end is None or end <= l.start:
                continue
            for t, du in ((l.start, l.units), (end, -l.units)):
                edges.setdefault(t, [0] * n)[index[l.campaign]] += du
        own, t0 = [0] * n, 0.0
        above = [0.0] * n
        for t in sorted(edges):
            K = loads(children, g, own)
            for v in range(n):
                above[v] += max(0, K[v] - s[v]) * (t - t0)
            own = [a + b for a, b in zip(own, edges[t])]
            t0 = t
        for v, x in enumerate(self.nodes):
            B = x.env.B("gpu")
            minted = state["campaigns"][x.name]["tokens_refilled"]["gpu"]
            if math.isinf(B) or minted is None:
                continue
            assert above[v] <= B + minted + 1e-6, (x.name, above[v], B, minted)


def test_tree_state_machine():
    thorough = os.environ.get("HYPOTHESIS_PROFILE") == "thorough"
    run_state_machine_as_test(TreeMachine, settings=settings(
        max_examples=500 if thorough else 100, stateful_step_count=60 if thorough else 50,
        deadline=None, derandomize=True, suppress_health_check=list(HealthCheck)))
