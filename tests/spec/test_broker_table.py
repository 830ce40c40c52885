"""Table tests for the policy engine, hand-computed numbers, one or more per rule of
SPEC §3–§8. Every test runs on every engine backend."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from bursarcore import Broker, Envelope, Intent, ManualClock, Pool, ServiceClass
from bursarcore.errors import InvalidArgument, UnknownCampaign, UnknownLease

INF = math.inf


def mk(eb, gpu=512, **kw):
    return Broker(Pool(gpu=gpu, warm_headroom=kw.pop("warm_headroom", None)),
                  clock=ManualClock(0.0), backend=eb, **kw)


def storm_env(**kw):
    base = dict(credits=50_000, service_class="agent-burst", guaranteed={"gpu": 0},
                sustained={"gpu": 64}, ceiling={"gpu": 384}, burst={"gpu": 25_000})
    base.update(kw)
    return Envelope(**base)


BACKFILL = Envelope(credits=INF, service_class="opportunistic", sustained={"gpu": 512},
                    ceiling={"gpu": 512}, burst={"gpu": INF})


# ---------------------------------------------------------------- §3 registration
@pytest.mark.parametrize("kw, field", [
    (dict(credits=-1), "credits"),
    (dict(credits=float("nan")), "credits"),
    (dict(guaranteed={"gpu": 65}), "sustained[gpu]"),
    (dict(ceiling={"gpu": 32}), "ceiling[gpu]"),
    (dict(burst={"gpu": -5}), "burst[gpu]"),
    (dict(share=0), "share"),
    (dict(sustained={"gpu": 64.5}, ceiling={"gpu": 384}), "sustained[gpu]"),
])
def test_bad_envelope_names_field(eb, kw, field):
    b = mk(eb)
    with pytest.raises(InvalidArgument) as e:
        b.register("x", storm_env(**kw))
    assert e.value.field == field
    assert b.campaigns == []


def test_envelope_none_means_no_entries_and_maps_are_copied():
    src = {"gpu": 8}
    e = Envelope(credits=1, guaranteed=None, sustained=src, ceiling=None, burst=None)
    src["gpu"] = 99                      # the caller's dict is not the envelope's
    assert (e.guaranteed, e.sustained, e.ceiling, e.burst) == ({}, {"gpu": 8}, {}, {})
    assert e.dims() == {"gpu"} and e.b("gpu") == 8


def test_registration_rules(eb):
    b = mk(eb, gpu=100)
    b.register("a", Envelope(credits=10, guaranteed={"gpu": 60}, sustained={"gpu": 60}))
    with pytest.raises(InvalidArgument, match="exceed the pool") as e:
        b.register("b", Envelope(credits=10, guaranteed={"gpu": 41}, sustained={"gpu": 41}))
    assert e.value.field == "guaranteed[gpu]"
    with pytest.raises(InvalidArgument, match="already registered"):
        b.register("a", Envelope(credits=10))
    with pytest.raises(InvalidArgument) as e:
        b.register("c", Envelope(credits=10, service_class="platinum"))
    assert e.value.field == "service_class"
    with pytest.raises(InvalidArgument) as e:
        b.register("c", Envelope(credits=10, sustained={"tpu": 1}))
    assert e.value.field == "sustained[tpu]"
    with pytest.raises(InvalidArgument) as e:         # the mapping that names it
        b.register("c", Envelope(credits=10, ceiling={"cpu": 3}))
    assert e.value.field == "ceiling[cpu]" and "lacks" in e.value.rule
    assert b.campaigns == ["a"]
    assert b.register("b", Envelope(credits=10, guaranteed={"gpu": 40}, sustained={"gpu": 40})) == 1


def test_runtime_registration_and_several_dimensions(eb):
    b = Broker(Pool(gpu=16, node=4), clock=ManualClock(0.0), backend=eb)
    b.register("a", Envelope(credits=100, sustained={"gpu": 8, "node": 2}))
    d = b.acquire(Intent("a", units={"node": 2}, duration=60))
    assert d.granted and d.lease.dim == "node"
    b.clock.advance(5)
    b.register("late", Envelope(credits=100, guaranteed={"gpu": 4}, sustained={"gpu": 4}))
    assert b.acquire(Intent("late", units={"gpu": 4}, duration=60)).granted


# ---------------------------------------------------------------- §4.1 capacity / isolation
def test_firm_grant_leaves_unmet_guarantees(eb):
    # pool 100; b guaranteed 30 and idle: a may take at most 100 - 30 = 70 firm units
    b = mk(eb, gpu=100)
    b.register("a", Envelope(credits=INF, sustained={"gpu": 100}, ceiling={"gpu": 100}))
    b.register("g", Envelope(credits=INF, guaranteed={"gpu": 30}, sustained={"gpu": 30},
                             service_class="interactive"))
    d = b.acquire(Intent("a", units={"gpu": (1, 100)}, duration=60))
    assert d.units == 70 and d.path == "warm"
    assert b.acquire(Intent("a", units={"gpu": 1}, duration=60)).outcome == "pending"
    # the guaranteed campaign is served at once, warm
    d = b.acquire(Intent("g", units={"gpu": 30}, duration=60))
    assert d.granted and d.path == "warm" and d.wait == 0
    s = b.state()["pool"]["gpu"]
    assert s["firm"] == 100 and s["unmet_guarantees"] == 0


def test_within_guarantee_reclaims_opportunistic(eb):
    b = mk(eb)
    b.register("bf", BACKFILL)
    b.register("vic", Envelope(credits=5000, service_class="interactive", guaranteed={"gpu": 32},
                               sustained={"gpu": 32}, ceiling={"gpu": 64}, burst={"gpu": 60_000}))
    bf = b.acquire(Intent("bf", units={"gpu": (1, 512)}, duration=3600))
    assert bf.units == 512 and not bf.lease.firm
    d = b.acquire(Intent("vic", units={"gpu": 32}, duration=60))
    assert d.granted and d.path == "reclaim" and d.wait == 60.0
    assert d.lease.state == "starting"
    ev = b.poll()
    assert [e.kind for e in ev] == ["preempt_notice"] and ev[0].deadline == 60.0
    b.clock.advance(59.999)
    assert b.poll() == []
    b.clock.advance(0.001)
    assert [e.kind for e in b.poll()] == ["revoked", "activated"]
    lease = b.lease(d.lease.id)
    assert lease.state == "active" and lease.start == 60.0 and lease.expiry == 120.0
    assert len(lease.slots) == 32


def test_warm_headroom_only_binds_opportunistic(eb):
    b = mk(eb, gpu=100, warm_headroom={"gpu": 20})
    b.register("bf", BACKFILL)
    b.register("a", Envelope(credits=INF, sustained={"gpu": 100}, ceiling={"gpu": 100}))
    assert b.acquire(Intent("bf", units={"gpu": (1, 100)}, duration=60)).units == 80
    d = b.acquire(Intent("a", units={"gpu": 20}, duration=60))
    assert d.path == "warm" and d.units == 20  # firm grants may use the headroom
    assert b.supply("a").dims["gpu"].free == 0


def test_victims_smallest_deficit_then_largest(eb):
    b = mk(eb, gpu=10)
    b.register("bf1", BACKFILL)
    b.register("bf2", BACKFILL)
    b.register("g", Envelope(credits=INF, guaranteed={"gpu": 4}, sustained={"gpu": 4},
                             service_class="interactive"))
    b.acquire(Intent("bf1", units={"gpu": 2}, duration=600))
    b.clock.advance(100)  # bf1 accumulates usage: its deficit falls below bf2's
    small = b.acquire(Intent("bf2", units={"gpu": 3}, duration=600)).lease.id
    big = b.acquire(Intent("bf2", units={"gpu": 5}, duration=600)).lease.id
    b.poll()
    d = b.acquire(Intent("g", units={"gpu": 4}, duration=60))
    assert d.path == "reclaim"
    ev = [e for e in b.poll() if e.kind == "preempt_notice"]
    first = ev[0].lease_id
    assert b.lease(first).campaign == "bf1"  # smallest deficit first
    assert len(ev) == 2 and ev[1].lease_id == big and small not in [e.lease_id for e in ev]


# ---------------------------------------------------------------- §4.2 prepaid tokens
def test_prepaid_sizing_escrow_and_refund(eb):
    b = mk(eb)
    b.register("storm", storm_env())
    d = b.acquire(Intent("storm", units={"gpu": (64, 384)}, duration=600))
    # 64 within sustained need no tokens; 25,000 GPU-s cover 41 more for 600 s
    assert d.units == 105
    assert b.supply("storm").dims["gpu"].tokens == 25_000 - 41 * 600  # 400
    b.clock.advance(100)
    assert b.supply("storm").dims["gpu"].tokens == 400  # H > s: no refill
    b.release(d.lease.id)
    # unused remainder: 41 units x 500 s
    assert b.supply("storm").dims["gpu"].tokens == 400 + 41 * 500
    b.clock.advance(10)  # H = 0: refill at s = 64/s
    assert b.supply("storm").dims["gpu"].tokens == 400 + 41 * 500 + 640
    b.clock.advance(1000)
    assert b.supply("storm").dims["gpu"].tokens == 25_000


def test_refill_rate_follows_holdings(eb):
    b = mk(eb)
    b.register("s", storm_env(burst={"gpu": 1000}))
    d = b.acquire(Intent("s", units={"gpu": 64 + 1}, duration=1000))  # 1 above s for 1000 s
    assert d.granted and b.supply("s").dims["gpu"].tokens == 0
    b.clock.advance(500)
    b.release(d.lease.id)  # refund 1 unit x 500 s
    assert b.supply("s").dims["gpu"].tokens == 500
    d = b.acquire(Intent("s", units={"gpu": 40}, duration=100))  # H = 40 < s: refill at 24/s
    b.clock.advance(10)
    assert b.supply("s").dims["gpu"].tokens == 500 + 240


def test_instant_enforcement_leaks(eb):
    b = mk(eb, enforcement="instant")
    b.register("storm", storm_env())
    d = b.acquire(Intent("storm", units={"gpu": (64, 384)}, duration=600))
    assert d.units == 384  # only T > 0 is checked at the grant instant
    b.clock.advance(100)
    assert b.supply("storm").dims["gpu"].tokens == 0  # drained at 320/s, floored at 0
    with pytest.raises(InvalidArgument):
        mk(eb, enforcement="lazy")


def test_tokens_refused_at_once_when_bucket_too_small(eb):
    b = mk(eb)
    b.register("storm", storm_env())
    d = b.acquire(Intent("storm", units={"gpu": 200}, duration=600))  # 136·600 > 25,000
    assert d.outcome == "refused" and d.reason == "tokens"


def test_tokens_pending_with_retry_after(eb):
    b = mk(eb)
    b.register("s", storm_env(burst={"gpu": 600}))
    b.acquire(Intent("s", units={"gpu": 65}, duration=600))  # spends all 600 GPU-s
    b.clock.advance(1)
    held = b.acquire(Intent("s", units={"gpu": 1}, duration=60))
    assert held.outcome == "pending" and held.reason == "tokens" and held.retry_after is None
    b2 = mk(eb)
    b2.register("s", storm_env(burst={"gpu": 600}))
    b2.acquire(Intent("s", units={"gpu": 65}, duration=600))
    b2.clock.advance(600)  # lease expired; tokens 600 - 600 = 0, refill 64/s from now
    d = b2.acquire(Intent("s", units={"gpu": 65}, duration=600))
    assert d.outcome == "pending" and d.reason == "tokens"
    assert d.retry_after == pytest.approx(600 / 64, abs=1e-9)


# ---------------------------------------------------------------- §4.3 credits, §7 prices
def test_cost_escrow_and_pro_rata_refund(eb):
    b = mk(eb)
    b.register("i", Envelope(credits=100, service_class="interactive", guaranteed={"gpu": 8},
                             sustained={"gpu": 8}))
    d = b.acquire(Intent("i", units={"gpu": 8}, duration=3600))
    assert d.cost == 16.0  # 8 GPU-h x 2.0
    st = b.state()["campaigns"]["i"]
    assert st["credits_left"] == 84.0 and st["credits_escrowed"] == 16.0
    b.clock.advance(900)
    r = b.release(d.lease.id)
    assert r.cost == -12.0
    st = b.state()["campaigns"]["i"]
    assert (st["credits_left"], st["credits_escrowed"], st["credits_spent"]) == (96.0, 0.0, 4.0)


def test_credits_refused_and_max_spend(eb):
    b = mk(eb)
    b.register("poor", storm_env(credits=1))
    d = b.acquire(Intent("poor", units={"gpu": 64}, duration=3600))
    assert d.outcome == "refused" and d.reason == "credits"
    b.register("rich", storm_env())
    d = b.acquire(Intent("rich", units={"gpu": (1, 64)}, duration=3600, max_spend=10))
    assert d.units == 3 and d.cost == 9.0  # 3 credits/GPU-h at agent-burst


def test_free_when_broke_opportunistic(eb):
    b = mk(eb)
    b.register("broke", Envelope(credits=0, service_class="agent-burst",
                                 sustained={"gpu": 64}, ceiling={"gpu": 64}))
    assert b.acquire(Intent("broke", units={"gpu": 8}, duration=60)).reason == "credits"
    d = b.acquire(Intent("broke", units={"gpu": 8}, duration=60, service_class="opportunistic"))
    assert d.granted and d.cost == 0.0 and not d.lease.firm


def test_congestion_multiplier(eb):
    b = mk(eb, gpu=10)
    b.register("a", Envelope(credits=INF, sustained={"gpu": 100}, ceiling={"gpu": 100}))
    assert b.acquire(Intent("a", units={"gpu": 10}, duration=600)).cost == 10 / 6 * 3
    assert b.supply("a").dims["gpu"].multiplier == 1.0
    assert b.acquire(Intent("a", units={"gpu": 10}, duration=60)).outcome == "pending"
    s = b.supply("a").dims["gpu"]
    assert s.congestion == 10.0 and s.multiplier == 3.0  # 10 units pending / max(1, 0 free)
    assert s.price["agent-burst"] == 9.0 and s.price["opportunistic"] == 0.25


def test_class_table_is_configuration(eb):
    classes = [ServiceClass("gold", 0, 1.0), ServiceClass("scavenger", 1, 0.0,
                                                          congestion_priced=False,
                                                          preemptible=True, grace=5.0)]
    b = Broker(Pool(gpu=8), clock=ManualClock(0.0), classes=classes, backend=eb)
    b.register("x", Envelope(credits=10, service_class="gold", sustained={"gpu": 8}))
    assert b.acquire(Intent("x", units={"gpu": 8}, duration=3600)).cost == 8.0
    with pytest.raises(InvalidArgument):
        ServiceClass("bad", 0, 1.0, preemptible=True, grace=0)


# ---------------------------------------------------------------- §4.4 sizing, §4.5 order, §4.6
def test_ceiling(eb):
    b = mk(eb)
    b.register("s", storm_env(burst={"gpu": INF}))
    assert b.acquire(Intent("s", units={"gpu": 385}, duration=60)).reason == "ceiling"
    assert b.acquire(Intent("s", units={"gpu": (1, 1000)}, duration=60)).units == 384
    d = b.acquire(Intent("s", units={"gpu": 1}, duration=60))
    assert d.outcome == "pending" and d.reason == "ceiling"


def test_pending_served_in_class_order_when_capacity_frees(eb):
    b = mk(eb, gpu=10)
    for name, cls in (("burst", "agent-burst"), ("inter", "interactive"), ("dl", "deadline")):
        b.register(name, Envelope(credits=INF, service_class=cls, sustained={"gpu": 10},
                                  ceiling={"gpu": 10}))
    first = b.acquire(Intent("burst", units={"gpu": 10}, duration=100))
    pb = b.acquire(Intent("burst", units={"gpu": 6}, duration=100))
    pi = b.acquire(Intent("inter", units={"gpu": 6}, duration=100))
    pd = b.acquire(Intent("dl", units={"gpu": 4}, duration=100))
    assert [x.outcome for x in (pb, pi, pd)] == ["pending"] * 3
    b.clock.advance(30)
    b.release(first.lease.id)
    granted = [e.intent_id for e in b.poll() if e.kind == "granted"]
    assert granted == [pd.intent_id, pi.intent_id]  # deadline (rank 0) then interactive
    assert [p["intent_id"] for p in b.pending()] == [pb.intent_id]


def test_pending_ttl_and_deadline(eb):
    b = mk(eb, gpu=10, ttl=100)
    b.register("a", Envelope(credits=INF, sustained={"gpu": 20}, ceiling={"gpu": 20}))
    b.acquire(Intent("a", units={"gpu": 10}, duration=1000))
    p1 = b.acquire(Intent("a", units={"gpu": 5}, duration=10))
    p2 = b.acquire(Intent("a", units={"gpu": 5}, duration=10, deadline=50))
    b.clock.advance(50)
    ev = b.poll()
    assert [(e.kind, e.intent_id, e.reason) for e in ev] == [("refused", p2.intent_id, "deadline")]
    b.clock.advance(50)
    ev = b.poll()
    assert [(e.kind, e.intent_id, e.reason) for e in ev] == [("refused", p1.intent_id, "ttl")]
    assert b.acquire(Intent("a", units={"gpu": 1}, duration=10, deadline=5)).reason == "deadline"


def test_deadline_shorter_than_reclaim_grace_refused(eb):
    b = mk(eb)
    b.register("bf", BACKFILL)
    b.register("v", Envelope(credits=INF, service_class="interactive", guaranteed={"gpu": 32},
                             sustained={"gpu": 32}))
    b.acquire(Intent("bf", units={"gpu": 512}, duration=3600))
    d = b.acquire(Intent("v", units={"gpu": 8}, duration=60, deadline=30))
    assert d.outcome == "refused" and d.reason == "deadline" and d.wait == 60.0
    assert b.poll() == []  # nothing was preempted for a refused intent


def test_cancel(eb):
    b = mk(eb, gpu=4)
    b.register("a", Envelope(credits=INF, sustained={"gpu": 8}, ceiling={"gpu": 8}))
    b.acquire(Intent("a", units={"gpu": 4}, duration=100))
    p = b.acquire(Intent("a", units={"gpu": 4}, duration=100))
    assert b.cancel(p.intent_id) is True and b.cancel(p.intent_id) is False
    with pytest.raises(UnknownLease):
        b.cancel(999)


def test_expiry_renew_release(eb):
    b = mk(eb)
    b.register("s", storm_env())
    d = b.acquire(Intent("s", units={"gpu": 64}, duration=100))
    r = b.renew(d.lease.id, 50)
    assert r.granted and b.lease(d.lease.id).expiry == 150.0
    assert r.cost == pytest.approx(64 * 50 / 3600 * 3, abs=1e-6)
    b.clock.advance(149)
    assert b.poll() == []
    b.clock.advance(1)
    ev = b.poll()
    assert [(e.kind, e.lease_id, e.time) for e in ev] == [("expired", d.lease.id, 150.0)]
    assert b.renew(d.lease.id, 10).reason == "invalid"
    assert b.release(d.lease.id).reason == "invalid"
    assert b.leases() == []


def test_renew_refused_for_tokens_changes_nothing(eb):
    b = mk(eb)
    b.register("s", storm_env(burst={"gpu": 100}))
    d = b.acquire(Intent("s", units={"gpu": 65}, duration=100))  # spends all 100 GPU-s
    before = b.state()
    r = b.renew(d.lease.id, 10)
    assert r.outcome == "refused" and r.reason == "tokens"
    assert b.state() == before


def test_placement_from_slot_map(eb):
    b = Broker(Pool(gpu=8, slots={"gpu": [("nid001", 4), ("nid002", 4)]}),
               clock=ManualClock(0.0), backend=eb)
    b.register("a", Envelope(credits=INF, sustained={"gpu": 8}))
    l1 = b.acquire(Intent("a", units={"gpu": 6}, duration=10)).lease
    l2 = b.acquire(Intent("a", units={"gpu": 2}, duration=20)).lease
    assert l1.placement == (("nid001", 4), ("nid002", 2)) and l2.placement == (("nid002", 2),)
    assert set(l1.slots).isdisjoint(l2.slots)
    b.clock.advance(10)
    l3 = b.acquire(Intent("a", units={"gpu": 6}, duration=10)).lease
    assert sorted(l3.slots) == sorted(l1.slots)


# ---------------------------------------------------------------- §6 fair share
def test_fair_share_deficits(eb):
    b = mk(eb, gpu=100, half_life=600)
    b.register("a", Envelope(credits=INF, guaranteed={"gpu": 30}, sustained={"gpu": 100},
                             ceiling={"gpu": 100}))
    b.register("b", Envelope(credits=INF, guaranteed={"gpu": 10}, sustained={"gpu": 100},
                             ceiling={"gpu": 100}))
    d0 = b.deficits()
    assert d0 == {"a": 0.75, "b": 0.25}  # no usage yet: deficit = share
    b.acquire(Intent("a", units={"gpu": 40}, duration=600))
    b.clock.advance(600)
    d = b.deficits()
    assert d["a"] == pytest.approx(0.75 - 1.0) and d["b"] == pytest.approx(0.25)


# ---------------------------------------------------------------- §8 supply and quote
def test_supply_and_quote(eb):
    b = mk(eb)
    b.register("s", storm_env())
    b.register("bf", BACKFILL)
    b.acquire(Intent("bf", units={"gpu": 100}, duration=600))
    sup = b.supply("s")
    g = sup.dims["gpu"]
    assert (g.free, g.reclaimable, g.tokens, g.bucket, g.held) == (412, 100, 25_000, 25_000, 0)
    assert g.wait == {"warm": 0.0, "reclaim": 60.0, "cold": None}
    assert sup.credits == 50_000
    json.dumps(sup.to_dict())
    q = b.quote("s", [8, 64, 105, 106, 420], [600, 3600])
    assert q.cost.shape == (5, 2)
    assert q.cost[0, 1] == 8 * 3.0
    assert q.path[:, 0].tolist() == ["warm"] * 4 + ["reclaim"]
    assert q.grantable[:, 0].tolist() == [True, True, True, False, False]
    assert q.reason[3, 0] == "tokens" and q.reason[4, 0] == "ceiling"
    d = b.acquire(Intent("s", units={"gpu": 105}, duration=600))
    assert d.cost == q.cost[2, 0]


def test_supply_of_an_unbounded_bucket_is_unlimited_tokens(eb):
    """An unbounded bucket's tokens are unlimited in supply(), also after debits (the
    engine keeps a large sentinel count; state() says None for it)."""
    b = mk(eb)
    b.register("u", Envelope(credits=INF, sustained={"gpu": 4}, ceiling={"gpu": 64},
                             burst={"gpu": INF}))
    b.acquire(Intent("u", units={"gpu": 64}, duration=600))
    g = b.supply("u").dims["gpu"]
    assert (g.tokens, g.bucket, g.held) == (math.inf, math.inf, 64)
    assert b.state()["campaigns"]["u"]["tokens"]["gpu"] is None


# ---------------------------------------------------------------- batch ≡ sequence of acquires
def test_admit_batch_ttl_applies_to_its_pending_items(eb):
    """``admit_batch(..., ttl=)`` is each item's ``Intent.ttl``: an item that goes pending
    is refused with ``ttl`` after that long, not after the broker's default; a bad ttl is
    refused before anything changes."""
    b = mk(eb, gpu=8)
    b.register("a", Envelope(credits=INF, sustained={"gpu": 8}, ceiling={"gpu": 8}))
    with pytest.raises(InvalidArgument, match="ttl"):
        b.admit_batch([0, 0], [8, 8], 100.0, now=0.0, ttl=0)
    assert b.state()["leases"] == [] and b.pending() == []
    res = b.admit_batch([0, 0], [8, 8], 100.0, now=0.0, ttl=30.0)
    assert res.outcome.tolist() == [0, 2]
    b.clock.advance(29)
    assert [e.kind for e in b.poll()] == []
    b.clock.advance(1)
    ev = b.poll()
    assert [(e.kind, e.reason) for e in ev] == [("refused", "ttl")]



def test_admit_batch_equals_acquire_sequence(eb):
    def fresh():
        b = mk(eb, gpu=64)
        for i in range(5):
            b.register(f"c{i}", Envelope(credits=50 if i else INF,
                                         service_class="opportunistic" if i == 4 else "agent-burst",
                                         guaranteed={"gpu": 4}, sustained={"gpu": 8},
                                         ceiling={"gpu": 32}, burst={"gpu": 2000}))
        return b
    rng = np.random.default_rng(3)
    ci = rng.integers(0, 5, 60)
    u = rng.integers(1, 20, 60)
    du = rng.integers(10, 400, 60).astype(float)
    b1 = fresh()
    res = b1.admit_batch(ci, u, du, 0.0)
    b2 = fresh()
    seq = [b2.acquire(Intent(f"c{c}", units={"gpu": int(n)}, duration=float(t)))
           for c, n, t in zip(ci, u, du)]
    assert res.outcome.tolist() == [{"granted": 0, "refused": 1, "pending": 2}[d.outcome]
                                    for d in seq]
    assert res.granted.tolist() == [d.units if d.granted else 0 for d in seq]
    assert res.lease.tolist() == [d.lease.id if d.lease else -1 for d in seq]
    assert b1.state() == b2.state()
    assert set(res.outcome.tolist()) >= {0, 2}


# ---------------------------------------------------------------- bad input
def test_bad_input_changes_nothing(eb):
    b = mk(eb)
    b.register("s", storm_env())
    before = b.state()
    for bad, field in [
        (lambda: Intent("s", units={"gpu": (5, 2)}, duration=1), "units[gpu].min"),
        (lambda: Intent("s", units={"gpu": 1}, duration=0), "duration"),
        (lambda: Intent("s", units={"gpu": 1, "node": 1}, duration=1), "units"),
        (lambda: Intent("s", units={"gpu": 1.5}, duration=1), "units[gpu]"),
        (lambda: Intent("s", units={"gpu": 1}, duration=1, deadline=float("nan")), "deadline"),
        (lambda: b.acquire(Intent("s", units={"tpu": 1}, duration=1)), "units"),
        (lambda: b.acquire(Intent("s", units={"gpu": 1}, duration=1, service_class="x")),
         "service_class"),
        (lambda: b.renew(0, 10), "lease_id"),
        (lambda: b.release(-1), "lease_id"),
        (lambda: b.quote("s", [0], [1]), "sizes"),
        (lambda: b.admit_batch([7], [1], 1.0), "campaign_idx"),
        (lambda: b.admit_batch([0], [1.5], 1.0), "units"),
    ]:
        with pytest.raises(InvalidArgument) as e:
            bad()
        assert e.value.field == field
    with pytest.raises(UnknownCampaign):
        b.acquire(Intent("nobody", units={"gpu": 1}, duration=1))
    assert b.state() == before


def test_a_huge_max_does_not_size_the_slot_arena(eb):
    """An intent may ask up to MAX_UNITS (2**24) units: the broker grants what
    fits and must not grow its slot arena towards the max (that raised MemoryError and
    left the state without its arena)."""
    b = Broker(Pool(gpu=16), clock=ManualClock(0.0), backend=eb)
    b.register("a", Envelope(credits=math.inf, sustained={"gpu": 16}, ceiling={"gpu": 16},
                             burst={"gpu": math.inf}))
    size = b.st.arena.shape[0] if hasattr(b, "st") else None   # the compiled slot arena
    d = b.acquire(Intent("a", units={"gpu": (1, 2**24)}, duration=60))
    assert d.granted and d.units == 16
    res = b.admit_batch([0, 0], np.array([[1, 2**24], [1, 2**24]]), 60.0)
    assert res.granted.tolist() == [0, 0] and res.outcome.tolist() == [2, 2]   # pending
    b.clock.advance(61)                      # the lease expires, the first of them is served
    assert [(e.kind, b.lease(e.lease_id).units) for e in b.poll() if e.kind == "granted"] \
        == [("granted", 16)]
    if size is not None:
        assert b.st.arena.shape[0] == size


# ---------------------------------------------------------------- state without leases
def test_state_without_leases_is_state_less_its_lease_list(eb):
    """``state(leases=False)``: what a metrics scrape reads, the same picture without the
    lease list (whose size grows with the leases, not the campaigns)."""
    b = mk(eb)
    b.register("a", storm_env())
    assert b.acquire(Intent("a", {"gpu": 8}, duration=60.0)).granted
    assert b.acquire(Intent("a", {"gpu": 4}, duration=30.0)).granted
    full, lean = b.state(), b.state(leases=False)
    assert len(full["leases"]) == 2 and lean["leases"] == []
    assert {k: v for k, v in full.items() if k != "leases"} == \
        {k: v for k, v in lean.items() if k != "leases"}
