"""A reclaim grant's units (SPEC §4.1, §4.6): a firm request within its guarantee that is
granted on the `reclaim` path starts when its victims' grace ends, on their units.

The pool keeps free units for the promised grants by the reclaim timeline: the reserve is
the most, over the activation times τ, that the grants starting by τ need beyond the units
under notice arriving by τ. Summing the units under notice against the promises whatever
their deadlines would let units that arrive after a grant's activation cover it: a warm
grant could then take free units that grant needs, and it would be revoked with `capacity`
at its activation. The cases below are those: a victim that ends before its deadline, and
a later victim with units to spare beyond its own grants.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bursarcore import Broker, Envelope, Intent, ManualClock, Pool
from bursarcore.broker import BACKENDS

INF = math.inf


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_victim_ending_early_keeps_its_units_for_the_grant_that_preempted_it(backend):
    b = Broker(Pool(gpu=12), clock=ManualClock(0.0), backend=backend)
    b.register("o", Envelope(credits=INF, service_class="opportunistic",
                             sustained={"gpu": 12}, ceiling={"gpu": 12}))
    for name in ("a", "c"):
        b.register(name, Envelope(credits=INF, guaranteed={"gpu": 4}, sustained={"gpu": 4},
                                  ceiling={"gpu": 4}))
    assert b.acquire(Intent("o", {"gpu": 4}, duration=30)).granted       # ends at 30
    for _ in range(2):
        assert b.acquire(Intent("o", {"gpu": 4}, duration=1000)).granted
    da = b.acquire(Intent("a", {"gpu": 3}, duration=600))   # preempts the one ending at 30
    assert (da.outcome, da.path, da.wait) == ("granted", "reclaim", 60.0)
    b.clock.advance(10)
    dc = b.acquire(Intent("c", {"gpu": 2}, duration=600))   # preempts another, until 70
    assert (dc.outcome, dc.path, dc.wait) == ("granted", "reclaim", 60.0)
    b.clock.advance(25)                                      # the first victim ended at 30
    p = b.state()["pool"]["gpu"]
    # a needs 3 by 60 and only its victim's units, free since 30, come by then; c needs 2
    # by 70, when the other victim's 4 come: of the 4 free units, 3 are kept for a
    assert (p["occupied"], p["revoking"], p["promised"], p["reserved"], p["free"]) == (
        8, 4, 5, 3, 1)
    late = b.acquire(Intent("o", {"gpu": (1, 12)}, duration=1000))
    assert (late.outcome, late.units, late.path) == ("granted", 1, "warm")
    b.clock.advance(40)                                      # past both activations
    events = [(e.kind, e.campaign, e.reason) for e in b.poll()]
    assert ("revoked", "a", "capacity") not in events
    assert ("activated", "a", None) in events and ("activated", "c", None) in events
    assert {l.campaign: l.state for l in b.leases() if l.campaign in ("a", "c")} == {
        "a": "active", "c": "active"}


@pytest.mark.parametrize("backend", BACKENDS)
def test_units_arriving_after_an_activation_do_not_cover_it(backend):
    b = Broker(Pool(gpu=16), clock=ManualClock(0.0), backend=backend)
    b.register("o", Envelope(credits=INF, service_class="opportunistic",
                             sustained={"gpu": 16}, ceiling={"gpu": 16}))
    for name, g in (("a", 4), ("c", 4), ("d", 1), ("e", 3), ("f", 1)):
        b.register(name, Envelope(credits=INF, guaranteed={"gpu": g}, sustained={"gpu": g},
                                  ceiling={"gpu": g}))
    for n in (6, 6, 4):
        assert b.acquire(Intent("o", {"gpu": n}, duration=1000)).granted
    # a takes 4 of the first victim's 6 (at 60); c the other 2 and 2 of the second's (at
    # 70); d and e the rest of the second's; f preempts the third (at 100) for 1 of its 4
    for t, name, n, wait in ((0, "a", 4, 60), (10, "c", 4, 60), (20, "d", 1, 50),
                             (30, "e", 3, 40), (40, "f", 1, 60)):
        b.clock.set(float(t))
        d = b.acquire(Intent(name, {"gpu": n}, duration=600))
        assert (d.outcome, d.path, d.wait) == ("granted", "reclaim", wait), (name, d)
    b.clock.set(65.0)        # 2 units free since 60 are c's until the second victim's 6 come
    assert b.state()["pool"]["gpu"]["reserved"] == 2
    late = b.acquire(Intent("o", {"gpu": (1, 16)}, duration=1000))
    assert (late.outcome, late.reason) == ("pending", "capacity"), late
    b.clock.set(120.0)
    events = [(e.kind, e.campaign) for e in b.poll() if e.kind in ("activated", "revoked")]
    assert {c for k, c in events if k == "activated"} == {"a", "c", "d", "e", "f"}, events


GUARANTEES = (("a", 4), ("b", 4), ("c", 1), ("d", 3), ("e", 1))
_FILL = st.lists(st.tuples(st.integers(1, 8), st.sampled_from([15.0, 35.0, 80.0, 1000.0])),
                 min_size=1, max_size=6)
_STEPS = st.lists(st.tuples(st.sampled_from([0.0, 1.0, 5.0, 10.0, 20.0, 30.0, 60.0]),
                            st.sampled_from([g[0] for g in GUARANTEES]), st.integers(1, 4),
                            st.sampled_from([20.0, 600.0]), st.booleans()),
                  min_size=1, max_size=25)


def _covered(b, starts):
    """Every promised grant finds its units at its activation: by each activation time τ,
    the free units now and those of the leases under notice by τ cover the grants starting
    by τ (``starts``: lease id -> activation, of the grants whose decision said when)."""
    pool = b.state()["pool"]["gpu"]
    free = pool["capacity"] - pool["occupied"]
    ls = b.leases()
    starting = [(starts[l.id], l.units) for l in ls if l.state == "starting" and l.id in starts]
    revoking = [(l.revoke_at, l.units) for l in ls if l.state == "revoking"]
    for tau, _ in starting:
        need = sum(n for at, n in starting if at <= tau)
        come = sum(n for at, n in revoking if at <= tau)
        assert need <= free + come, (tau, starting, revoking, free)


@pytest.mark.parametrize("backend", BACKENDS)
@given(fill=_FILL, steps=_STEPS)
@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
def test_requests_within_guarantees_start_within_the_grace(backend, fill, steps):
    """SPEC §4.1, §4.6 in a pool an opportunistic backfill keeps full (it takes whatever is
    free after every step; its leases expire, are released and are preempted): a firm
    request within its campaign's guarantee is granted, warm or on the reclaim path; a
    reclaim grant becomes active by its grace and is never revoked for capacity in a pool
    that does not shrink; at every step the units each starting grant needs are covered by
    its activation."""
    grace = 60.0
    b = Broker(Pool(gpu=16), clock=ManualClock(0.0), backend=backend)
    b.register("o", Envelope(credits=INF, service_class="opportunistic",
                             sustained={"gpu": 16}, ceiling={"gpu": 16}))
    for name, g in GUARANTEES:
        b.register(name, Envelope(credits=INF, guaranteed={"gpu": g}, sustained={"gpu": g},
                                  ceiling={"gpu": g}))
    backfill, starts = [], {}
    for n, dur in fill:
        d = b.acquire(Intent("o", {"gpu": (1, n)}, duration=dur))
        if d.lease is not None:
            backfill.append(d.lease.id)
    for dt, name, n, dur, release in steps:
        b.clock.advance(dt)
        now = b.clock.now()
        if release and backfill:
            b.release(backfill.pop(0))
        held = sum(l.units for l in b.leases(name) if l.state in ("active", "starting"))
        d = b.acquire(Intent(name, {"gpu": n}, duration=dur))
        if held + n <= b.envelopes[name].g("gpu"):
            assert d.outcome == "granted", (name, n, d)
        if d.outcome == "granted" and d.path == "reclaim":
            assert d.wait <= grace
            starts[d.lease.id] = now + d.wait
        f = b.acquire(Intent("o", {"gpu": (1, 16)}, duration=45.0))
        if f.lease is not None:
            backfill.append(f.lease.id)
        for e in b.poll():
            assert not (e.kind == "revoked" and e.reason == "capacity"), e
            if e.kind == "activated":
                assert e.time <= starts.pop(e.lease_id, e.time)
        _covered(b, starts)
    b.clock.advance(grace + 1)
    for e in b.poll():
        assert not (e.kind == "revoked" and e.reason == "capacity"), e
