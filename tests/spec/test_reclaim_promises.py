"""A reclaim grant's units (SPEC §4.1, §4.6): a firm request within its guarantee that is
granted on the `reclaim` path starts when its victims' grace ends, on their units.

The pool counts the units under notice (`revoking`) against the promised reclaim grants as
one sum, whatever their deadlines; that is sound while each victim's units arrive at its
deadline. A victim that ends before (it expires, or its holder releases it) leaves its units
*kept* for the grants that preempted it until that deadline: no warm grant takes them, so a
reclaim grant that counted on them still finds them at its activation.

Known defect, kept as a strict expected failure until the reserve is fixed: the one sum
lets units under notice that arrive *after* a promised grant's activation cover it. When a
grant counted on units already free (left over from an earlier victim) and a later victim
has units to spare beyond its own grants, the sum reserves too few of the free ones, a warm
grant takes them, and the earlier grant is revoked with `capacity` at its activation. The
reserve must be the largest, over the activation times τ, of what the grants starting by τ
need beyond the units under notice arriving by τ.
"""

from __future__ import annotations

import math

import pytest

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
    assert (p["occupied"], p["revoking"], p["kept"], p["promised"], p["free"]) == (
        8, 4, 4, 5, 0)                                       # its 4 units kept until 60
    late = b.acquire(Intent("o", {"gpu": (1, 12)}, duration=1000))
    assert (late.outcome, late.reason) == ("pending", "capacity")
    b.clock.advance(40)                                      # past both activations
    events = [(e.kind, e.campaign, e.reason) for e in b.poll()]
    assert ("revoked", "a", "capacity") not in events
    assert ("activated", "a", None) in events and ("activated", "c", None) in events
    assert {l.campaign: l.state for l in b.leases() if l.campaign in ("a", "c")} == {
        "a": "active", "c": "active"}


@pytest.mark.xfail(strict=True, reason="units under notice that arrive after a promised "
                   "grant's activation are counted as covering it (see the module's docstring)")
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
    late = b.acquire(Intent("o", {"gpu": (1, 16)}, duration=1000))
    assert late.outcome != "granted", late
    b.clock.set(120.0)
    events = [(e.kind, e.campaign) for e in b.poll() if e.kind in ("activated", "revoked")]
    assert {c for k, c in events if k == "activated"} == {"a", "c", "d", "e", "f"}, events
