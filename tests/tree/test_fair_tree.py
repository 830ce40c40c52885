"""SPEC §14.6: fair share as a tree. Level deficits among siblings over subtree usage, and
the Fair Tree order for the pending queue and for victims, with the spec's numbers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bursarcore import Broker, Envelope, Intent, ManualClock, Pool
from bursarcore.admission.fairshare import fair_tree_keys, level_deficits

pytestmark = pytest.mark.tree


def env(share: float = 1.0, cls: str = "agent-burst") -> Envelope:
    return Envelope(credits=1e9, share=share, service_class=cls, sustained={"gpu": 10},
                    ceiling={"gpu": 10}, burst={"gpu": math.inf})


def busy_tree(astro_b: str = "astro/b") -> Broker:
    """astro/a has used the pool for 100 s, bio 4 GPUs for 50 s, astro/b nothing; x holds
    the whole pool now, and astro/b and bio wait for it."""
    b = Broker(Pool(gpu=10), clock=ManualClock(0.0), half_life=86400.0)
    for name in ("astro", "astro/a", astro_b, "bio", "x"):
        b.register(name, env())
    b.acquire(Intent("astro/a", units={"gpu": 10}, duration=100))
    b.clock.advance(100)
    b.acquire(Intent("bio", units={"gpu": 4}, duration=50))
    b.clock.advance(50)
    assert b.acquire(Intent("x", units={"gpu": 10}, duration=10)).outcome == "granted"
    for name in (astro_b, "bio"):
        assert b.acquire(Intent(name, units={"gpu": 10}, duration=60)).outcome == "pending"
    return b


def test_level_deficits_compare_siblings_over_subtree_usage():
    b = busy_tree()
    d = b.deficits()
    ua, ub, ux = 1000.0, 200.0, 0.0          # unit-seconds by t = 150 (no decay to speak of)
    top = ua + ub + ux
    assert d["astro"] == pytest.approx(1 / 3 - ua / top, abs=1e-3)
    assert d["bio"] == pytest.approx(1 / 3 - ub / top, abs=1e-3)
    assert d["x"] == pytest.approx(1 / 3, abs=1e-3)
    # astro's children share what astro used: a all of it, b none
    assert d["astro/a"] == pytest.approx(0.5 - 1.0, abs=1e-3)
    assert d["astro/b"] == pytest.approx(0.5, abs=1e-3)
    assert b.state()["campaigns"]["astro/b"]["deficit"] == d["astro/b"]


def test_the_queue_serves_the_project_that_used_less_first():
    """Flat, astro/b (no usage) has the largest deficit and is served first; as a node of
    astro, which used five times what bio did, it waits behind bio."""
    b = busy_tree()
    b.clock.advance(10)                       # x's lease ends: one pass of the queue
    assert b.state()["campaigns"]["bio"]["held"]["gpu"] == 10
    assert [p["campaign"] for p in b.pending()] == ["astro/b"]
    flat = busy_tree(astro_b="astro_b")
    flat.clock.advance(10)
    assert flat.state()["campaigns"]["astro_b"]["held"]["gpu"] == 10
    assert [p["campaign"] for p in flat.pending()] == ["bio"]


def test_victims_are_taken_from_the_last_in_the_fair_tree_order():
    """Opportunistic leases of astro/b (flat: the most deserving) and bio: the reclaim
    preempts astro/b's first, as astro used more than bio."""
    b = Broker(Pool(gpu=10), clock=ManualClock(0.0), half_life=86400.0)
    for name in ("astro", "astro/a", "astro/b", "bio"):
        b.register(name, env())
    b.acquire(Intent("astro/a", units={"gpu": 10}, duration=100))
    b.clock.advance(100)
    b.acquire(Intent("bio", units={"gpu": 4}, duration=50))
    b.clock.advance(50)
    opp = "opportunistic"
    lb = b.acquire(Intent("astro/b", units={"gpu": 5}, duration=600, service_class=opp))
    lbio = b.acquire(Intent("bio", units={"gpu": 5}, duration=600, service_class=opp))
    assert lb.outcome == lbio.outcome == "granted"
    b.register("g", Envelope(credits=1e9, guaranteed={"gpu": 5}))
    d = b.acquire(Intent("g", units={"gpu": 5}, duration=600))
    assert (d.outcome, d.path) == ("granted", "reclaim")
    assert b.lease(lb.lease.id).state == "revoking"
    assert b.lease(lbio.lease.id).state == "active"


def test_a_flat_set_keeps_its_deficits_and_order():
    share, usage = np.array([1.0, 2.0, 1.0]), np.array([30.0, 10.0, 0.0])
    lam = level_deficits(share, usage, [-1, -1, -1])
    np.testing.assert_allclose(lam, share / 4 - usage / 40)
    assert (np.argsort(-fair_tree_keys(lam, [-1, -1, -1]), kind="stable")
            == np.argsort(-lam, kind="stable")).all()


def test_the_fair_tree_order_by_hand():
    # 0 astro (1: astro/a, 2: astro/b), 3 bio, 4: astro/a/x
    parent = [-1, 0, 0, -1, 1]
    lam = np.array([-0.2, 0.1, 0.3, 0.2, 0.0])
    keys = fair_tree_keys(lam, parent)
    order = sorted(range(5), key=lambda v: -keys[v])
    # bio's project first; within astro: astro itself, then b (0.3) before a (0.1), and
    # a's child right after a
    assert order == [3, 0, 2, 1, 4]
    nan = fair_tree_keys(np.array([math.nan, 0.0]), [-1, -1])
    assert nan[1] > nan[0]
