"""SPEC §3–§8 rules: one focused table test per rule the other table tests leave uncovered.

Each test names its rule in the docstring and uses hand-computed numbers; every test runs
on every engine backend (``BACKENDS`` from :mod:`bursarcore.broker`: compiled and
reference, or reference only with ``BURSARCORE_NO_EXTENSIONS=1``), so the same expected
numbers also pin the backends to each other. Time moves only through ``ManualClock``.

The map from every rule to its covering test is docs/spec-coverage.md; rules the existing
table tests (``test_broker_table.py``, ``test_flow_table.py``, ``test_broker_flow.py``) and
state machines (``test_invariants.py``) already pin are not repeated here.

The last section pins fair share's decay by age, which an average decay per tick gets wrong.
"""

from __future__ import annotations

import math

import pytest

from bursarcore import Broker, Envelope, Intent, ManualClock, Pool, ServiceClass
from bursarcore.admission.classes import Congestion
from bursarcore.broker import BACKENDS

INF = math.inf


def mk(eb, gpu=10, **kw):
    return Broker(Pool(gpu=gpu, warm_headroom=kw.pop("warm_headroom", None)),
                  clock=ManualClock(0.0), backend=eb, **kw)


def env(g=0, s=10, b=None, B=0, credits=INF, cls="agent-burst", share=None):
    return Envelope(credits=credits, service_class=cls, guaranteed={"gpu": g},
                    sustained={"gpu": s}, ceiling={"gpu": s if b is None else b},
                    burst={"gpu": B}, share=share)


def backfill(cap):
    return env(s=cap, B=INF, cls="opportunistic")


def kinds(events, kind):
    return [e for e in events if e.kind == kind]


# ---------------------------------------------------------------- §3 envelope
def test_share_defaults_to_guarantee_or_one_and_can_be_set(eb):
    """§3 share: default g on the primary held dimension, 1 when all g are 0; an explicit
    share overrides. Shares 30, 1, 9 of 40: deficits with no usage are 0.75, 0.025, 0.225."""
    b = mk(eb, gpu=100)
    b.register("a", env(g=30, s=30))
    b.register("z", env(g=0, s=10))
    b.register("x", env(g=10, s=10, share=9))
    d = b.deficits()
    assert d == pytest.approx({"a": 0.75, "z": 0.025, "x": 0.225}, abs=1e-12)


# ---------------------------------------------------------------- §4.1 capacity / isolation
def test_reclaim_preempts_only_what_free_units_lack(eb):
    """§4.1: a firm grant that finds too few free units preempts opportunistic leases for
    the *rest* (reclaim path), and becomes active when their grace ends.

    Pool 10; bf1 holds 2 since t=0, bf2 holds 5 since t=100; 3 free. Campaign a (no
    guarantee: a firm grant beyond it) asks 5 at t=100: 2 are missing. bf1 has the
    smaller deficit (200 unit-s of usage), so only its 2-unit lease is preempted;
    bf2's lease stays active."""
    b = mk(eb, gpu=10)
    b.register("bf1", backfill(10))
    b.register("bf2", backfill(10))
    b.register("a", env(s=10))
    l1 = b.acquire(Intent("bf1", units={"gpu": 2}, duration=1000)).lease.id
    b.clock.advance(100)
    l2 = b.acquire(Intent("bf2", units={"gpu": 5}, duration=1000)).lease.id
    d = b.acquire(Intent("a", units={"gpu": 5}, duration=100))
    assert (d.outcome, d.units, d.path, d.wait) == ("granted", 5, "reclaim", 60.0)
    assert d.lease.state == "starting"
    notices = kinds(b.poll(), "preempt_notice")
    assert [(e.lease_id, e.deadline) for e in notices] == [(l1, 160.0)]
    b.clock.advance(60)
    ev = b.poll()
    assert [(e.kind, e.lease_id) for e in ev] == [("revoked", l1), ("activated", d.lease.id)]
    assert b.lease(l2).state == "active"
    assert b.lease(d.lease.id).expiry == 260.0


def test_preemption_uses_the_class_grace(eb):
    """§4.1/§4.6: opportunistic leases are revocable with *their class's* grace period:
    a custom preemptible class with grace 5 s gives a 5 s notice, and the reclaim grant
    becomes active (and its wait is) 5 s later."""
    classes = [ServiceClass("gold", 0, 1.0),
               ServiceClass("scavenger", 1, 0.0, congestion_priced=False, preemptible=True,
                            grace=5.0)]
    b = Broker(Pool(gpu=8), clock=ManualClock(0.0), classes=classes, backend=eb)
    b.register("x", env(g=8, s=8, cls="gold"))
    b.register("y", env(s=8, B=INF, cls="scavenger"))
    victim = b.acquire(Intent("y", units={"gpu": 8}, duration=600)).lease
    assert not victim.firm
    d = b.acquire(Intent("x", units={"gpu": 8}, duration=60))
    assert (d.path, d.wait) == ("reclaim", 5.0)
    assert [(e.kind, e.deadline) for e in b.poll()] == [("preempt_notice", 5.0)]
    assert b.lease(victim.id).state == "revoking" and b.lease(victim.id).revoke_at == 5.0
    assert b.supply("x").dims["gpu"].wait["reclaim"] == 5.0
    b.clock.advance(5)
    assert [e.kind for e in b.poll()] == ["revoked", "activated"]
    assert b.lease(d.lease.id).start == 5.0


# ---------------------------------------------------------------- §4.2 prepaid tokens
def test_prepaid_debit_is_marginal_on_current_holding(eb):
    """§4.2: a grant of n at holding H debits (max(0, H+n−s) − max(0, H−s))·d at grant;
    early release refunds that lease's unused debit; then refill runs at (s − H).

    s = 64, B = 25,000 GPU-s, each lease 100 s:
    40 at H=0 → 0; 40 at H=40 → 16·100; 10 at H=80 → 10·100: T = 22,400.
    Release the second at t=50: +16·50 → 23,200; H = 50 < s: +14/s → 23,340 at t=60."""
    b = mk(eb, gpu=512)
    b.register("s", env(s=64, b=384, B=25_000))

    def tokens():
        return b.supply("s").dims["gpu"].tokens

    b.acquire(Intent("s", units={"gpu": 40}, duration=100))
    assert tokens() == 25_000
    second = b.acquire(Intent("s", units={"gpu": 40}, duration=100)).lease.id
    assert tokens() == 25_000 - 16 * 100
    b.acquire(Intent("s", units={"gpu": 10}, duration=100))
    assert tokens() == 22_400
    b.clock.advance(50)
    assert tokens() == 22_400                 # H = 90 > s: no refill
    b.release(second)
    assert tokens() == 22_400 + 16 * 50
    b.clock.advance(10)
    assert tokens() == 23_200 + (64 - 50) * 10


# ---------------------------------------------------------------- §4.3 credits
def test_revocation_refunds_credits_pro_rata(eb):
    """§4.3: escrowed credits are refunded pro rata on *revocation* too.
    8 GPUs opportunistic for 1 h at 0.25 → 2.0 credits; preempted at t=1,740 (grace 60 s),
    revoked at 1,800: half the term unused, 1.0 credit back, 1.0 spent."""
    b = mk(eb, gpu=8)
    b.register("o", env(s=8, credits=100, cls="opportunistic"))
    b.register("g", env(g=8, s=8, cls="interactive"))
    lease = b.acquire(Intent("o", units={"gpu": 8}, duration=3600)).lease
    assert lease.cost == 2.0
    assert b.state()["campaigns"]["o"]["credits_left"] == 98.0
    b.clock.advance(1740)
    assert b.acquire(Intent("g", units={"gpu": 8}, duration=60)).path == "reclaim"
    b.clock.advance(60)
    assert [e.kind for e in b.poll()] == ["preempt_notice", "revoked", "activated"]
    assert b.lease(lease.id).state == "revoked"
    st = b.state()["campaigns"]["o"]
    assert (st["credits_left"], st["credits_escrowed"], st["credits_spent"],
            st["credits_refunded"]) == (99.0, 0.0, 1.0, 1.0)


def test_refund_uses_the_price_escrowed_at_grant(eb):
    """§4.3: the cost is escrowed at grant *at the price of that moment*; a later change
    of the congestion multiplier does not touch it. 4 GPU-h agent-burst at κ = 0 costs
    12; congestion then rises to κ = 8 (multiplier 3.0); released at t=30 the lease gets
    back 12 · 3,570/3,600 = 11.9, not a refund at the new price."""
    b = mk(eb, gpu=10)
    b.register("a", env(s=10, credits=1000))
    b.register("c", env(s=20))
    lease = b.acquire(Intent("a", units={"gpu": 4}, duration=3600)).lease
    assert lease.cost == 12.0
    assert b.acquire(Intent("c", units={"gpu": (1, 14)}, duration=3600)).units == 6
    assert b.supply("a").dims["gpu"].multiplier == 3.0   # shortfall 8 / max(1, 0 free)
    b.clock.advance(30)
    r = b.release(lease.id)
    assert r.cost == -11.9
    assert b.state()["campaigns"]["a"]["credits_left"] == pytest.approx(1000 - 12 + 11.9,
                                                                      abs=1e-9)


def test_unit_price_is_configuration(eb):
    """§4.3: held-dimension unit prices are configurable (default 1 credit per GPU-hour).
    At 2.5 credits per GPU-hour, 8 GPUs for an hour as interactive (×2.0) cost 40."""
    b = mk(eb, gpu=16, price={"gpu": 2.5})
    b.register("i", env(g=8, s=8, credits=100, cls="interactive"))
    assert b.supply("i").dims["gpu"].price["interactive"] == 5.0
    d = b.acquire(Intent("i", units={"gpu": 8}, duration=3600))
    assert d.cost == 40.0 and b.state()["campaigns"]["i"]["credits_left"] == 60.0


# ---------------------------------------------------------------- §4.4 sizing and reasons
def test_pending_ttl_defaults_to_900_seconds(eb):
    """§4.4: an intent that cannot be met now waits in the queue until the request TTL,
    default 900 s, then is refused with reason ``ttl``."""
    b = mk(eb, gpu=10)
    b.register("a", env(s=20))
    b.acquire(Intent("a", units={"gpu": 10}, duration=2000))
    p = b.acquire(Intent("a", units={"gpu": 5}, duration=10))
    assert p.outcome == "pending" and b.pending()[0]["expires"] == 900.0
    b.clock.advance(899.999)
    assert b.poll() == [] and len(b.pending()) == 1
    b.clock.advance(0.001)
    assert [(e.kind, e.intent_id, e.reason, e.time) for e in b.poll()] == [
        ("refused", p.intent_id, "ttl", 900.0)]
    assert b.pending() == []


def test_capacity_pending_retry_after_is_next_expiry(eb):
    """§4.4: a refusal or wait carries ``retry_after`` where one is known; for capacity,
    the time until the next lease expiry. Pool full until t=100, asked at t=30: 70 s."""
    b = mk(eb, gpu=10)
    b.register("a", env(s=10))
    b.register("b", env(s=10))
    b.acquire(Intent("a", units={"gpu": 10}, duration=100))
    b.clock.advance(30)
    d = b.acquire(Intent("b", units={"gpu": 5}, duration=10))
    assert (d.outcome, d.reason, d.retry_after) == ("pending", "capacity", 70.0)


def test_min_above_ceiling_is_refused_at_once(eb):
    """§4.4: an intent that can never be met — min above the ceiling b — is refused at
    once with reason ``ceiling``; it does not wait in the queue."""
    b = mk(eb, gpu=512)
    b.register("s", env(s=64, b=384, B=INF))
    for units in (385, (385, 400)):
        d = b.acquire(Intent("s", units={"gpu": units}, duration=60))
        assert (d.outcome, d.reason) == ("refused", "ceiling"), units
    assert b.pending() == []


# ---------------------------------------------------------------- §4.5 pending order
def test_pending_order_deficit_before_arrival(eb):
    """§4.5/§6: pending intents of one class are served by fair-share deficit, largest
    first, before arrival. A held 4 GPUs for 50 s (usage), B nothing; A's intent arrived
    first, yet when the pool frees at t=100 B's is served and A's (6 > 4 left) waits."""
    b = mk(eb, gpu=10)
    for name in ("A", "B", "X"):
        b.register(name, env(s=10))
    b.acquire(Intent("A", units={"gpu": 4}, duration=50))
    b.acquire(Intent("X", units={"gpu": 6}, duration=100))
    b.clock.advance(50)
    b.acquire(Intent("X", units={"gpu": 4}, duration=50))
    b.clock.advance(10)
    pa = b.acquire(Intent("A", units={"gpu": 6}, duration=10))
    pb = b.acquire(Intent("B", units={"gpu": 6}, duration=10))
    assert pa.outcome == pb.outcome == "pending"
    d = b.deficits()
    assert d["B"] > d["A"]
    b.clock.advance(40)
    assert [e.intent_id for e in kinds(b.poll(), "granted")] == [pb.intent_id]
    assert [p["intent_id"] for p in b.pending()] == [pa.intent_id]


def test_pending_order_tokens_before_arrival(eb):
    """§4.5: at equal class rank and deficit, the campaign with more tokens goes first
    (B's bucket 1,000 GPU-s > A's 100), before arrival (A's intent came first)."""
    b = mk(eb, gpu=10)
    b.register("A", env(s=10, B=100))
    b.register("B", env(s=10, B=1000))
    b.register("X", env(s=10))
    b.acquire(Intent("X", units={"gpu": 10}, duration=100))
    b.clock.advance(10)
    pa = b.acquire(Intent("A", units={"gpu": 6}, duration=10))
    b.clock.advance(10)
    pb = b.acquire(Intent("B", units={"gpu": 6}, duration=10))
    assert b.deficits()["A"] == b.deficits()["B"]
    b.clock.advance(80)
    assert [e.intent_id for e in kinds(b.poll(), "granted")] == [pb.intent_id]
    assert [p["intent_id"] for p in b.pending()] == [pa.intent_id]


def test_pending_order_arrival_breaks_ties(eb):
    """§4.5: at equal rank, deficit and tokens, the earlier arrival is served first."""
    b = mk(eb, gpu=10)
    for name in ("A", "B", "X"):
        b.register(name, env(s=10, B=100))
    b.acquire(Intent("X", units={"gpu": 10}, duration=100))
    b.clock.advance(10)
    pb = b.acquire(Intent("B", units={"gpu": 6}, duration=10))
    b.clock.advance(10)
    pa = b.acquire(Intent("A", units={"gpu": 6}, duration=10))
    b.clock.advance(80)
    assert [e.intent_id for e in kinds(b.poll(), "granted")] == [pb.intent_id]
    assert [p["intent_id"] for p in b.pending()] == [pa.intent_id]


# ---------------------------------------------------------------- §4.6 lifecycle
def test_renew_debits_tokens_and_credits_for_the_extension(eb):
    """§4.6: ``renew`` re-runs §4.2 and §4.3 for the extension. s = 64, B = 1,000 GPU-s:
    65 GPUs for 100 s debit 1·100 → T = 900 and cost ⌈65·100/3600·3⌉ = 5.416667 credits.
    Renewed by 100 s at t=40: T −= 1·(200−40) − 1·(100−40) = 100 → 800; another
    5.416667 credits escrowed; the lease now expires at 200."""
    b = mk(eb, gpu=512)
    b.register("s", env(s=64, b=384, B=1000, credits=100))
    lease = b.acquire(Intent("s", units={"gpu": 65}, duration=100)).lease
    assert lease.cost == 5.416667 and b.supply("s").dims["gpu"].tokens == 900
    b.clock.advance(40)
    r = b.renew(lease.id, 100)
    assert (r.outcome, r.cost) == ("granted", 5.416667)
    assert b.supply("s").dims["gpu"].tokens == 800
    st = b.state()["campaigns"]["s"]
    assert st["credits_left"] == 89.166666 and st["credits_escrowed"] == 10.833334
    assert b.lease(lease.id).expiry == 200.0
    b.clock.advance(60)
    assert b.poll() == []
    b.clock.advance(100)
    assert [(e.kind, e.time) for e in b.poll()] == [("expired", 200.0)]


def test_renew_refused_for_credits_changes_nothing(eb):
    """§4.6/§4.3: a renewal the credits cannot cover is refused with reason ``credits``,
    atomically: 6 credits pay the first 5.416667 but not another 5.416667."""
    b = mk(eb, gpu=512)
    b.register("s", env(s=64, b=384, B=1000, credits=6))
    lease = b.acquire(Intent("s", units={"gpu": 65}, duration=100)).lease
    b.clock.advance(40)
    before = b.state()
    r = b.renew(lease.id, 100)
    assert (r.outcome, r.reason) == ("refused", "credits")
    assert b.state() == before
    assert b.lease(lease.id).expiry == 100.0


def test_renew_only_extends_active_leases(eb):
    """§4.6: ``renew`` extends an *active* lease; a revoking one (under preemption
    notice) or a starting one (waiting for its victims) is refused ``invalid`` and
    keeps its deadlines."""
    b = mk(eb, gpu=8)
    b.register("bf", backfill(8))
    b.register("g", env(g=8, s=8, cls="interactive"))
    victim = b.acquire(Intent("bf", units={"gpu": 8}, duration=600)).lease.id
    starting = b.acquire(Intent("g", units={"gpu": 8}, duration=60)).lease.id
    assert (b.lease(victim).state, b.lease(starting).state) == ("revoking", "starting")
    for lid in (victim, starting):
        r = b.renew(lid, 1000)
        assert (r.outcome, r.reason) == ("refused", "invalid"), lid
    assert b.lease(victim).revoke_at == 60.0 and b.lease(victim).expiry == 600.0
    b.clock.advance(60)
    assert [e.kind for e in b.poll()] == ["preempt_notice", "revoked", "activated"]
    assert b.lease(starting).expiry == 120.0


# ---------------------------------------------------------------- §7 classes and congestion
DEFAULT_PRICE = {"deadline": 4.0, "interactive": 2.0, "agent-burst": 3.0, "opportunistic": 0.25}


def test_default_class_table(eb):
    """§7 default table: multipliers 4.0 / 2.0 / 3.0 / 0.25 (1 GPU-hour each at κ = 0);
    only opportunistic is preemptible; ranks 0–3 order the queue, opportunistic last."""
    b = mk(eb, gpu=4)
    b.register("c", env(s=4, b=8))
    assert b.supply("c").dims["gpu"].price == DEFAULT_PRICE
    for cls, price in DEFAULT_PRICE.items():
        d = b.acquire(Intent("c", units={"gpu": 1}, duration=3600, service_class=cls))
        assert d.cost == price and d.lease.firm == (cls != "opportunistic"), cls
    b.clock.advance(3600)
    b.acquire(Intent("c", units={"gpu": 4}, duration=100))
    ids = {cls: b.acquire(Intent("c", units={"gpu": 4}, duration=10, service_class=cls)).intent_id
           for cls in ("opportunistic", "agent-burst", "interactive", "deadline")}
    served = []
    for _ in range(4):
        b.clock.advance(100 if not served else 10)
        served += [e.intent_id for e in kinds(b.poll(), "granted")]
    assert served == [ids[c] for c in ("deadline", "interactive", "agent-burst", "opportunistic")]


@pytest.mark.parametrize("shortfall, kappa, mult", [
    (1, 0.25, 1.0), (2, 0.5, 1.5), (3, 0.75, 1.5), (4, 1.0, 2.25), (7, 1.75, 2.25),
    (8, 2.0, 3.0), (12, 3.0, 3.0)])
def test_congestion_multiplier_steps(eb, shortfall, kappa, mult):
    """§7: multiplier 1.0 (κ < 0.5), 1.5 (< 1), 2.25 (< 2), 3.0 otherwise, applied to the
    congestion-priced classes only. Pool 10: a holds 4; c asks 6 + S and gets the 6 left
    (shortfall S, unmet priced demand); a releases, so κ = S / 4 free."""
    b = mk(eb, gpu=10)
    b.register("a", env(s=10))
    b.register("c", env(s=20))
    la = b.acquire(Intent("a", units={"gpu": 4}, duration=3600)).lease.id
    assert b.acquire(Intent("c", units={"gpu": (1, 6 + shortfall)}, duration=3600)).units == 6
    b.release(la)
    g = b.supply("a").dims["gpu"]
    assert (g.free, g.congestion, g.multiplier) == (4, kappa, mult)
    assert g.price == {c: (p if c == "opportunistic" else p * mult)
                       for c, p in DEFAULT_PRICE.items()}
    assert b.acquire(Intent("a", units={"gpu": 1}, duration=3600)).cost == 3.0 * mult


def test_congestion_window_trails_60_seconds(eb):
    """§7: κ counts unmet priced demand over a trailing window, default 60 s: the
    shortfall of 2 at t=0 (κ = 2/4 → 1.5) still counts at t=59, not at t=61."""
    b = mk(eb, gpu=10)
    b.register("a", env(s=10))
    b.register("c", env(s=20))
    la = b.acquire(Intent("a", units={"gpu": 4}, duration=3600)).lease.id
    b.acquire(Intent("c", units={"gpu": (1, 8)}, duration=3600))
    b.release(la)
    b.clock.advance(59)
    g = b.supply("a").dims["gpu"]
    assert (g.congestion, g.multiplier) == (0.5, 1.5)
    b.clock.advance(2)
    g = b.supply("a").dims["gpu"]
    assert (g.congestion, g.multiplier) == (0.0, 1.0)


def test_opportunistic_demand_excluded_from_congestion(eb):
    """§7: opportunistic demand is excluded from κ — neither an opportunistic intent cut
    short by capacity nor one left pending raises the multiplier."""
    b = mk(eb, gpu=10)
    b.register("a", env(s=10))
    b.register("o", backfill(20))
    b.acquire(Intent("a", units={"gpu": 4}, duration=3600))
    assert b.acquire(Intent("o", units={"gpu": (1, 14)}, duration=3600)).units == 6
    p = b.acquire(Intent("o", units={"gpu": 5}, duration=60))
    assert p.outcome == "pending"
    g = b.supply("a").dims["gpu"]
    assert (g.free, g.congestion, g.multiplier) == (0, 0.0, 1.0)


def test_congestion_thresholds_are_configuration(eb):
    """§7: the thresholds and multipliers are configuration. With thresholds 0.1/0.2/0.3
    and multipliers 1/2/4/8, κ = 1/4 falls in the third band: ×4, agent-burst 12."""
    cg = Congestion(thresholds=(0.1, 0.2, 0.3), multipliers=(1.0, 2.0, 4.0, 8.0))
    b = mk(eb, gpu=10, congestion=cg)
    b.register("a", env(s=10))
    b.register("c", env(s=20))
    la = b.acquire(Intent("a", units={"gpu": 4}, duration=3600)).lease.id
    b.acquire(Intent("c", units={"gpu": (1, 7)}, duration=3600))
    b.release(la)
    g = b.supply("a").dims["gpu"]
    assert (g.congestion, g.multiplier, g.price["agent-burst"]) == (0.25, 4.0, 12.0)


def test_a_zero_first_threshold_prices_even_an_idle_pool(eb):
    """§7: κ < thresholds[0] picks multipliers[0]; with thresholds[0] = 0, κ = 0 is not
    below it, so an idle pool already charges the second band (×2: agent-burst 6 per
    GPU-hour, 2 GPUs for an hour cost 12). The kernels' shortcut for zero demand must
    not apply here."""
    cg = Congestion(thresholds=(0.0, 1.0, 2.0), multipliers=(1.0, 2.0, 4.0, 8.0))
    b = mk(eb, gpu=10, congestion=cg)
    b.register("a", env(s=10))
    g = b.supply("a").dims["gpu"]
    assert (g.congestion, g.multiplier, g.price["agent-burst"]) == (0.0, 2.0, 6.0)
    assert b.acquire(Intent("a", units={"gpu": 2}, duration=3600)).cost == 12.0
    b2 = mk(eb, gpu=10)                      # default thresholds (0.5, ...): ×1 when idle
    b2.register("a", env(s=10))
    assert b2.acquire(Intent("a", units={"gpu": 2}, duration=3600)).cost == 6.0


# ---------------------------------------------------------------- §8 supply signals
def test_quote_wait_per_grant_path(eb):
    """§8: ``quote`` answers path and expected wait per what-if: warm 0, reclaim = the
    grace (60 s), cold = the facility binding's estimate (here 42 s; inf without one).
    Pool 512, backfill holds 100: ≤ 412 warm, ≤ 512 reclaim, above that cold."""
    for cold, want in ((lambda dim: 42.0, 42.0), (None, INF)):
        b = Broker(Pool(gpu=512), clock=ManualClock(0.0), backend=eb, cold_wait=cold)
        b.register("s", env(s=64, b=1000, B=INF))
        b.register("bf", backfill(512))
        b.acquire(Intent("bf", units={"gpu": 100}, duration=600))
        q = b.quote("s", [8, 412, 413, 512, 513], [600])
        assert q.path[:, 0].tolist() == ["warm", "warm", "reclaim", "reclaim", "cold"]
        assert q.wait[:, 0].tolist() == [0.0, 0.0, 60.0, 60.0, want]
        assert q.grantable[:, 0].tolist() == [True, True, True, True, False]
        assert q.reason[4, 0] == "capacity"


def test_supply_counts_revoking_units_not_yet_promised_as_reclaimable(eb):
    """§8: ``supply`` reports reclaimable units — opportunistic leases, and units already
    under preemption notice that no reclaim grant has claimed. Pool 10, backfill holds
    8, a asks 5 (3 missing): the whole 8-unit lease is preempted, 5 are promised to a,
    so 2 are free and 3 reclaimable; c's 5 ride on the same notice (wait until t=60,
    no new preemption) and 6 would need the cold path."""
    b = mk(eb, gpu=10)
    b.register("bf", backfill(10))
    b.register("a", env(s=10))
    b.register("c", env(s=10))
    b.acquire(Intent("bf", units={"gpu": 8}, duration=600))
    assert b.acquire(Intent("a", units={"gpu": 5}, duration=100)).path == "reclaim"
    g = b.supply("c").dims["gpu"]
    assert (g.free, g.reclaimable) == (2, 3)
    q = b.quote("c", [2, 5, 6], [100])
    assert q.path[:, 0].tolist() == ["warm", "reclaim", "cold"]
    b.poll()
    b.clock.advance(10)
    d = b.acquire(Intent("c", units={"gpu": 5}, duration=100))
    assert (d.path, d.wait) == ("reclaim", 50.0)
    assert kinds(b.poll(), "preempt_notice") == []


# ================================================================ decay by age
# Usage is folded at every change of holdings, so each unit-second decays by its own age;
# decaying it per tick, evenly within a tick's interval, breaks the rule below.

def test_fair_share_usage_decays_with_age(eb):
    """§6: usage decays exponentially (half-life default 600 s). a held 10 GPUs over [0, 600),
    b held 10 over [600, 1200). At t = 1200 a's usage is 10·∫ e^(−λ(1200−t)) dt over
    [0, 600) = (10/λ)(1/2 − 1/4) and b's (10/λ)(1 − 1/2): a has half b's usage, so with
    equal shares deficit_a = 1/2 − 1/3 = 1/6 and deficit_b = 1/2 − 2/3 = −1/6.

    One average decay factor for every unit-second held since the last fair-share tick,
    whatever its age (ticks coming only with queue sorts and victim choices), would give
    both 0.0 here."""
    b = mk(eb, gpu=100)
    b.register("a", env(g=10, s=100))
    b.register("b", env(g=10, s=100))
    b.acquire(Intent("a", units={"gpu": 10}, duration=600))
    b.clock.advance(600)
    b.acquire(Intent("b", units={"gpu": 10}, duration=600))
    b.clock.advance(600)
    d = b.deficits()
    assert d["a"] == pytest.approx(1 / 6, abs=1e-3)
    assert d["b"] == pytest.approx(-1 / 6, abs=1e-3)


def test_fair_share_decay_across_an_epoch_move(eb):
    """§6 with a 1 s half-life: the fold's epoch moves forward when a holding changes more
    than 256 half-lives after it (b's grant at 257 s), rescaling every campaign, and the
    usages stay exact: a held 10 over [0, 258), b 10 over [257, 259). At 259 usage_a =
    (10/λ)(2^−1 − 2^−259) and usage_b = (10/λ)(1 − 2^−2): with equal shares deficit_a =
    1/2 − 0.5/1.25 = 0.1 and deficit_b = −0.1. The journal replays to the same broker."""
    from bursarcore.journal import MemoryJournal

    j = MemoryJournal()
    b = mk(eb, gpu=100, half_life=1.0, journal=j)
    b.register("a", env(g=10, s=100))
    b.register("b", env(g=10, s=100))
    b.acquire(Intent("a", units={"gpu": 10}, duration=258))
    b.clock.advance(257)
    b.acquire(Intent("b", units={"gpu": 10}, duration=2))
    if hasattr(b, "st"):                               # the compiled engine's epoch
        assert int(b.st.fs_par[1]) == 257 * 10**9      # moved to b's grant
    b.clock.advance(2)
    d = b.deficits()
    assert d["a"] == pytest.approx(0.1, abs=1e-12) and d["b"] == pytest.approx(-0.1, abs=1e-12)
    r = Broker.replay(j, backend=eb)
    assert r.deficits() == d


def test_fair_share_fold_is_bit_identical_across_backends():
    """The fold is the same IEEE double operations in every backend, epoch moves included:
    the deficits after every step and the journal's deficit fields agree bit for bit when
    both backends are built."""
    import numpy as np

    from bursarcore.journal import MemoryJournal

    def run(backend):
        b = mk(backend, gpu=100, half_life=1.0, journal=MemoryJournal())
        for n in "abc":
            b.register(n, env(g=5, s=100))
        rng = np.random.default_rng(5)
        seen = []
        for _ in range(200):
            b.clock.advance(float(rng.integers(1, 40)) / 7)
            who = "abc"[int(rng.integers(0, 3))]
            b.acquire(Intent(who, units={"gpu": int(rng.integers(1, 30))},
                             duration=float(rng.integers(1, 90)) / 3))
            seen.append(b.deficits())
        if hasattr(b, "st"):
            assert int(b.st.fs_par[1]) > 0                 # the epoch moved at least once
        return seen, b.journal.rows()["deficit"].tobytes()

    runs = [run(backend) for backend in BACKENDS]
    for other in runs[1:]:
        assert other == runs[0]
