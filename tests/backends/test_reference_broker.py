"""The reference broker (``bursarcore.reference.ReferenceBroker``): the specification
written as plain Python, checked on its own against the worked numbers of docs/spec.md and
against the compiled broker, operation by operation, on everything a user observes."""

from __future__ import annotations

import doctest
import re
from pathlib import Path
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (RuleBasedStateMachine, initialize, invariant, precondition,
                                 rule)

from bursarcore import Broker, Envelope, Intent, ManualClock, Pool
from bursarcore.broker import BACKENDS, Decision, Lease
from bursarcore.admission.classes import DEFAULT_CLASSES
from bursarcore.errors import InvalidArgument, UnknownCampaign, UnknownLease
from bursarcore.journal.memory import MemoryJournal
from bursarcore.journal.records import FIELDS
from bursarcore.reference import ReferenceBroker


def ref(pool: Pool, **kw: object) -> ReferenceBroker:
    return ReferenceBroker(pool, clock=ManualClock(0.0), **kw)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------
# (a) rules of the specification, with its worked numbers, on the reference alone
# ---------------------------------------------------------------------------------------
def test_spec_examples_on_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every ``>>>`` example of docs/spec.md, run with ``Broker`` being the reference."""
    import bursarcore
    text = (Path(__file__).resolve().parents[2] / "docs" / "spec.md").read_text()
    blocks = re.findall(r"```pycon\n(.*?)```", text, re.S)
    assert blocks
    monkeypatch.setattr(bursarcore, "Broker", ReferenceBroker)
    test = doctest.DocTestParser().get_doctest("\n".join(blocks), {}, "spec.md", "spec.md", 0)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    runner.run(test, clear_globs=False)
    assert isinstance(test.globs["b"], ReferenceBroker)
    assert runner.failures == 0 and runner.tries > 50


def test_isolation_reserve_worked_numbers() -> None:
    """SPEC §4.1: pool 100, g idle with 30 guaranteed: a takes at most 70 firm units, and
    g is still served warm."""
    b = ref(Pool(gpu=100))
    b.register("g", Envelope(credits=1e6, guaranteed={"gpu": 30}))
    b.register("a", Envelope(credits=1e6, sustained={"gpu": 100}))
    d = b.acquire(Intent("a", units={"gpu": (1, 100)}, duration=600))
    assert (d.outcome, d.units, d.path) == ("granted", 70, "warm")
    d = b.acquire(Intent("a", units={"gpu": (1, 100)}, duration=600))
    assert (d.outcome, d.reason) == ("pending", "capacity")
    assert d.retry_after == 600.0             # the next scheduled expiry
    d = b.acquire(Intent("g", units={"gpu": 30}, duration=600))
    assert (d.outcome, d.units, d.path) == ("granted", 30, "warm")


def test_prepaid_storm_worked_numbers() -> None:
    """SPEC §4.2: s = 64, B = 25,000: 64 free of tokens plus 41 paid = 105 GPUs, 400 GPU-s
    left; released after 100 s, 41 · 500 come back."""
    b = ref(Pool(gpu=512))
    b.register("storm", Envelope(credits=50_000, sustained={"gpu": 64}, ceiling={"gpu": 384},
                                 burst={"gpu": 25_000}))
    d = b.acquire(Intent("storm", units={"gpu": (64, 384)}, duration=600))
    assert (d.units, d.path) == (105, "warm")
    assert b.supply("storm").dims["gpu"].tokens == 400.0
    b.clock.advance(100)
    b.release(d.lease.id)
    assert b.supply("storm").dims["gpu"].tokens == 400.0 + 41 * 500


def test_marginal_debit() -> None:
    """SPEC §4.2: at H = 48, s = 64, 32 more for 1,000 s debit (80 − 64) · 1,000."""
    b = ref(Pool(gpu=512))
    b.register("a", Envelope(credits=1e6, sustained={"gpu": 64}, ceiling={"gpu": 384},
                             burst={"gpu": 100_000}))
    assert b.acquire(Intent("a", units={"gpu": 48}, duration=1000)).units == 48
    assert b.acquire(Intent("a", units={"gpu": 32}, duration=1000)).units == 32
    assert b.supply("a").dims["gpu"].tokens == 100_000 - 16_000


def test_refill_capped_at_bucket() -> None:
    """SPEC §4.2: T refills at (s − H) per second while H < s, capped at B."""
    b = ref(Pool(gpu=64))
    b.register("a", Envelope(credits=1e6, sustained={"gpu": 8}, ceiling={"gpu": 64},
                             burst={"gpu": 1000}))
    d = b.acquire(Intent("a", units={"gpu": 10}, duration=100))     # 2 above s: 200 GPU-s
    assert b.supply("a").dims["gpu"].tokens == 800.0
    b.release(d.lease.id)                                           # at once: all back
    assert b.supply("a").dims["gpu"].tokens == 1000.0
    d = b.acquire(Intent("a", units={"gpu": 18}, duration=50))      # 10 above: 500
    b.clock.advance(50)                                             # expired at 50
    assert b.supply("a").dims["gpu"].tokens == 500.0
    b.acquire(Intent("a", units={"gpu": 4}, duration=1000))         # H = 4 < s: +4/s
    b.clock.advance(100)
    assert b.supply("a").dims["gpu"].tokens == 900.0
    b.clock.advance(100)
    assert b.supply("a").dims["gpu"].tokens == 1000.0               # capped


def test_credits_worked_numbers() -> None:
    """SPEC §4.3: interactive ×2: 8 GPUs for an hour cost 16, 12 back after 15 minutes;
    max_spend 10 at 3 per GPU-hour gives 3 GPUs for 9; a budget that cannot cover the
    minimum is refused with credits."""
    b = ref(Pool(gpu=64))
    b.register("i", Envelope(credits=100, service_class="interactive", guaranteed={"gpu": 8}))
    d = b.acquire(Intent("i", units={"gpu": 8}, duration=3600))
    assert (d.cost, b.supply("i").credits) == (16.0, 84.0)
    b.clock.advance(900)
    assert (b.release(d.lease.id).cost, b.supply("i").credits) == (-12.0, 96.0)
    b.register("m", Envelope(credits=100, sustained={"gpu": 8}))
    d = b.acquire(Intent("m", units={"gpu": (1, 8)}, duration=3600, max_spend=10))
    assert (d.units, d.cost) == (3, 9.0)
    b.register("p", Envelope(credits=5, sustained={"gpu": 8}))
    d = b.acquire(Intent("p", units={"gpu": (4, 8)}, duration=3600))
    assert (d.outcome, d.reason) == ("refused", "credits")


def test_free_when_broke() -> None:
    """SPEC §4.3: an opportunistic lease is served free when the budget cannot pay."""
    b = ref(Pool(gpu=64))
    b.register("o", Envelope(credits=1, service_class="opportunistic", sustained={"gpu": 64}))
    d = b.acquire(Intent("o", units={"gpu": 16}, duration=3600))    # 16 · 0.25 = 4 > 1
    assert (d.outcome, d.units, d.cost) == ("granted", 16, 0.0)
    d = b.acquire(Intent("o", units={"gpu": 2}, duration=3600))     # 0.5 <= 1: charged
    assert d.cost == 0.5 and b.supply("o").credits == 0.5


def test_sizing_ceiling_refused_or_pending() -> None:
    """SPEC §4.4: 400 > b can never fit (refused); 90 with 84 left under b pends."""
    b = ref(Pool(gpu=512))
    b.register("a", Envelope(credits=1e6, sustained={"gpu": 64}, ceiling={"gpu": 384},
                             burst={"gpu": 1e6}))
    assert b.acquire(Intent("a", units={"gpu": 300}, duration=60)).units == 300
    d = b.acquire(Intent("a", units={"gpu": (400, 400)}, duration=60))
    assert (d.outcome, d.reason) == ("refused", "ceiling")
    d = b.acquire(Intent("a", units={"gpu": (90, 100)}, duration=60))
    assert (d.outcome, d.reason) == ("pending", "ceiling")
    b.clock.advance(60)                                             # its own lease ends
    ev = b.poll()
    assert [e.kind for e in ev] == ["expired", "granted"]
    assert ev[1].intent_id == d.intent_id and ev[1].units == 100


def test_token_retry_after() -> None:
    """SPEC §4.4: tokens: retry_after is when the refill covers the minimum."""
    b = ref(Pool(gpu=64))
    b.register("a", Envelope(credits=1e6, sustained={"gpu": 4}, ceiling={"gpu": 64},
                             burst={"gpu": 1000}))
    b.acquire(Intent("a", units={"gpu": 2}, duration=500))   # H = 2: refills at 2/s
    first = b.acquire(Intent("a", units={"gpu": 6}, duration=200))
    # excess(6, 2) = 4 · 200 = 800 <= B = 1000 tokens: granted, 200 left
    assert first.granted and b.supply("a").dims["gpu"].tokens == 200.0
    b.release(first.lease.id)                     # all 800 come back
    b.acquire(Intent("a", units={"gpu": 2}, duration=100))   # H = 4 = s: no refill
    d = b.acquire(Intent("a", units={"gpu": 2}, duration=600))  # 2 · 600 > 1000
    assert (d.outcome, d.reason, d.retry_after) == ("pending", "tokens", None)
    b.clock.advance(100)              # H = 2 again: the pending 2 need no tokens
    assert [e.kind for e in b.poll()] == ["expired", "granted"]
    d = b.acquire(Intent("a", units={"gpu": 2}, duration=300))
    assert d.granted                  # H = 6: 2 above s, 600 of 1000 tokens
    d = b.acquire(Intent("a", units={"gpu": 8}, duration=200))
    # H = 6: excess(8, 6) = 8 · 200 = 1600 > B: no refill can ever cover it at this
    # holding, so no retry time is known (it waits for a lease of its own to end)
    assert (d.outcome, d.reason, d.retry_after) == ("pending", "tokens", None)


def test_token_retry_after_when_refill_covers() -> None:
    """SPEC §4.4: the time until the refill covers the minimum."""
    b = ref(Pool(gpu=64))
    b.register("a", Envelope(credits=1e6, sustained={"gpu": 4}, ceiling={"gpu": 64},
                             burst={"gpu": 1000}))
    b.acquire(Intent("a", units={"gpu": 8}, duration=100))       # 4 above s: 400
    b.clock.advance(100)                                         # expired; T = 600
    b.acquire(Intent("a", units={"gpu": 2}, duration=1000))      # H = 2: +2/s
    d = b.acquire(Intent("a", units={"gpu": 6}, duration=200))   # 4 · 200 = 800 > 600
    assert (d.outcome, d.reason, d.retry_after) == ("pending", "tokens", 100.0)
    b.clock.advance(100)
    assert [e.kind for e in b.poll()] == ["expired", "granted"]


def test_pending_cap_worked_numbers() -> None:
    """SPEC §4.4: at the cap one more is refused with pending_limit, retry when the oldest
    waiting intent expires."""
    b = ref(Pool(gpu=64), max_pending=1)
    b.register("a", Envelope(credits=1e6, sustained={"gpu": 64}))
    b.register("c", Envelope(credits=1e6, sustained={"gpu": 64}))
    assert b.acquire(Intent("a", units={"gpu": 64}, duration=600)).outcome == "granted"
    d = b.acquire(Intent("c", units={"gpu": 8}, duration=60, ttl=300))
    assert (d.outcome, d.reason, d.retry_after) == ("pending", "capacity", 600.0)
    b.clock.advance(100)
    d = b.acquire(Intent("c", units={"gpu": 8}, duration=60))
    assert (d.outcome, d.reason, d.retry_after) == ("refused", "pending_limit", 200.0)
    b.clock.advance(200)
    ev = b.poll()
    assert [(e.kind, e.reason) for e in ev] == [("refused", "ttl")]


def test_queue_order_rank_then_deficit() -> None:
    """SPEC §4.5: class rank first; then the larger fair-share deficit."""
    b = ref(Pool(gpu=8))
    b.register("hog", Envelope(credits=1e6, sustained={"gpu": 8}))
    b.register("x", Envelope(credits=1e6, sustained={"gpu": 8}, service_class="interactive"))
    b.register("y", Envelope(credits=1e6, sustained={"gpu": 8}))
    first = b.acquire(Intent("hog", units={"gpu": 8}, duration=100))
    py = b.acquire(Intent("y", units={"gpu": 8}, duration=10))        # agent-burst, rank 2
    ph = b.acquire(Intent("hog", units={"gpu": 8}, duration=10))      # rank 2, used a lot
    px = b.acquire(Intent("x", units={"gpu": 8}, duration=10))        # interactive, rank 1
    assert [d.outcome for d in (py, ph, px)] == ["pending"] * 3
    b.clock.advance(100)
    granted = [e.intent_id for e in b.poll() if e.kind == "granted"]
    assert granted == [px.intent_id]
    b.clock.advance(10)
    granted = [e.intent_id for e in b.poll() if e.kind == "granted"]
    assert granted == [py.intent_id]          # y's deficit is larger than the hog's
    assert first.lease is not None


@pytest.mark.parametrize("make", [Broker, ReferenceBroker])
def test_queue_price_falls_mid_pass(make: Any) -> None:
    """SPEC §4.5, §7: the pass goes in order a1, b1, a2 (equal rank, deficit and tokens:
    arrival). At t = 10 the congestion multiplier is 3 (κ = 22 pending / 8 free), so a1's
    9 credits exceed a's 5.83 left; granting b1 takes b1's 20 units of pending demand out
    (κ = 2 / 7, multiplier 1), so a2, behind it, now costs 3 and is granted, while a1,
    which the pass has passed, waits."""
    b = make(Pool(gpu=10), clock=ManualClock(0.0))
    b.register("x", Envelope(credits=1e6, sustained={"gpu": 8}))
    b.register("a", Envelope(credits=10, sustained={"gpu": 2}))
    b.register("b", Envelope(credits=1e6, sustained={"gpu": 2}))
    b.acquire(Intent("x", units={"gpu": 8}, duration=10))
    b.acquire(Intent("a", units={"gpu": 1}, duration=5000))
    b.acquire(Intent("b", units={"gpu": 1}, duration=5000))
    a1 = b.acquire(Intent("a", units={"gpu": 1}, duration=3600))
    b1 = b.acquire(Intent("b", units={"gpu": (1, 20)}, duration=3600))
    a2 = b.acquire(Intent("a", units={"gpu": 1}, duration=3600))
    assert [d.outcome for d in (a1, b1, a2)] == ["pending"] * 3
    b.clock.advance(10)
    assert [(e.kind, e.intent_id) for e in b.poll()] == [
        ("expired", None), ("granted", b1.intent_id), ("granted", a2.intent_id)]
    assert [p["intent_id"] for p in b.pending()] == [a1.intent_id]


@pytest.mark.parametrize("make", [Broker, ReferenceBroker])
def test_queue_order_tokens_before_arrival(make: Any) -> None:
    """SPEC §4.5: at equal rank and deficit, the campaign with more tokens goes first."""
    b = make(Pool(gpu=8), clock=ManualClock(0.0))
    b.register("x", Envelope(credits=1e6, sustained={"gpu": 8}))
    b.register("poor", Envelope(credits=1e6, sustained={"gpu": 8}, burst={"gpu": 100}))
    b.register("rich", Envelope(credits=1e6, sustained={"gpu": 8}, burst={"gpu": 1000}))
    b.acquire(Intent("x", units={"gpu": 8}, duration=10))
    first = b.acquire(Intent("poor", units={"gpu": 8}, duration=10))
    second = b.acquire(Intent("rich", units={"gpu": 8}, duration=10))
    assert (first.outcome, second.outcome) == ("pending", "pending")
    d = b.deficits()
    assert d["poor"] == d["rich"]
    b.clock.advance(10)
    assert [e.intent_id for e in b.poll() if e.kind == "granted"] == [second.intent_id]


def test_reclaim_preempts_after_grace() -> None:
    """SPEC §4.1, §4.6: a firm request within its guarantee preempts opportunistic leases,
    starts when their grace ends, and the victim is revoked then."""
    b = ref(Pool(gpu=16))
    b.register("g", Envelope(credits=1e6, guaranteed={"gpu": 8}))
    b.register("o", Envelope(credits=1e6, service_class="opportunistic",
                             sustained={"gpu": 16}))
    o = b.acquire(Intent("o", units={"gpu": 16}, duration=3600))
    assert o.units == 16
    q = b.quote("g", [8, 9], [600])         # SPEC §8: the reclaim path, its wait the grace
    assert (q.path.tolist(), q.wait.tolist(), q.reason.tolist()) == (
        [["reclaim"], ["reclaim"]], [[60.0], [60.0]], [[""], ["ceiling"]])
    d = b.acquire(Intent("g", units={"gpu": 8}, duration=600))
    assert (d.outcome, d.path, d.wait, d.lease.state) == ("granted", "reclaim", 60.0,
                                                          "starting")
    ev = b.poll()
    assert [(e.kind, e.lease_id, e.deadline) for e in ev] == [("preempt_notice", o.lease.id,
                                                               60.0)]
    b.clock.advance(60)
    assert [(e.kind, e.lease_id) for e in b.poll()] == [("revoked", o.lease.id),
                                                        ("activated", d.lease.id)]
    lease = b.lease(d.lease.id)
    assert (lease.state, lease.start, lease.expiry) == ("active", 60.0, 660.0)


@pytest.mark.parametrize("make", [Broker, ReferenceBroker])
def test_victim_order(make: Any) -> None:
    """SPEC §4.1: victims go by smallest fair-share deficit, then largest lease, then lease
    id; whole leases are preempted."""
    b = make(Pool(gpu=20), clock=ManualClock(0.0))
    b.register("g", Envelope(credits=1e6, guaranteed={"gpu": 12}))
    for name in ("o1", "o2"):
        b.register(name, Envelope(credits=1e6, service_class="opportunistic",
                                  sustained={"gpu": 20}))
    small = b.acquire(Intent("o1", units={"gpu": 4}, duration=3600)).lease.id
    big = b.acquire(Intent("o1", units={"gpu": 8}, duration=3600)).lease.id
    b.clock.advance(100)                   # o1 has used more: the smaller deficit
    other = b.acquire(Intent("o2", units={"gpu": 8}, duration=3600)).lease.id
    d = b.acquire(Intent("g", units={"gpu": 8}, duration=600))      # none free
    assert (d.path, d.units) == ("reclaim", 8)
    assert [(e.kind, e.lease_id) for e in b.poll()] == [("preempt_notice", big)]
    d = b.acquire(Intent("g", units={"gpu": 4}, duration=600))
    assert (d.path, d.units) == ("reclaim", 4)
    assert [(e.kind, e.lease_id) for e in b.poll()] == [("preempt_notice", small)]
    d = b.acquire(Intent("g", units={"gpu": 1}, duration=600))      # beyond g's 12
    assert d.outcome == "pending"
    assert b.lease(other).state == "active"


def test_renew_reprices_and_refuses_atomically() -> None:
    """SPEC §4.6: renew re-runs §4.2 and §4.3 for the extension; a refusal changes nothing."""
    b = ref(Pool(gpu=64))
    b.register("a", Envelope(credits=10, sustained={"gpu": 4}, ceiling={"gpu": 64},
                             burst={"gpu": 2000}))
    d = b.acquire(Intent("a", units={"gpu": 6}, duration=600))       # 2 · 600 = 1200
    assert b.supply("a").dims["gpu"].tokens == 800.0
    b.clock.advance(100)
    r = b.renew(d.lease.id, 400)        # 2 · (1000 − 100) − 2 · (600 − 100) = 800 more
    assert (r.outcome, b.supply("a").dims["gpu"].tokens) == ("granted", 0.0)
    assert r.lease.expiry == 1000.0
    before = b.supply("a")
    r = b.renew(d.lease.id, 1)          # 2 more unit-seconds than the bucket holds
    assert (r.outcome, r.reason) == ("refused", "tokens")
    assert b.supply("a") == before and b.lease(d.lease.id).expiry == 1000.0
    b.release(d.lease.id)
    d = b.acquire(Intent("a", units={"gpu": 4}, duration=60))   # within s: no tokens
    r = b.renew(d.lease.id, 60, max_spend=0)
    assert (r.outcome, r.reason, r.cost) == ("refused", "credits", 0.2)


def test_renew_prices_the_lease_as_topmost() -> None:
    """SPEC §4.2, §4.6: a renewal re-prices the remaining segment as the top-most holding:
    at H = 6 over s = 4, renewing a 2-unit lease prepays excess(4, 2) = 2 units."""
    b = ref(Pool(gpu=64))
    b.register("a", Envelope(credits=1e6, sustained={"gpu": 4}, ceiling={"gpu": 64},
                             burst={"gpu": 10_000}))
    small = b.acquire(Intent("a", units={"gpu": 2}, duration=100))   # within s: free
    b.acquire(Intent("a", units={"gpu": 4}, duration=1000))          # 2 above s: 2000
    assert b.supply("a").dims["gpu"].tokens == 8000.0
    r = b.renew(small.lease.id, 100)        # 2 · (200 − 0) − 0 · 100 = 400
    assert r.granted and b.supply("a").dims["gpu"].tokens == 7600.0


def test_release_twice_and_unknown_ids() -> None:
    b = ref(Pool(gpu=8))
    b.register("a", Envelope(credits=100, sustained={"gpu": 8}))
    d = b.acquire(Intent("a", units={"gpu": 1}, duration=60))
    assert b.release(d.lease.id).outcome == "released"
    again = b.release(d.lease.id)
    assert (again.outcome, again.reason) == ("refused", "invalid")
    with pytest.raises(UnknownLease):
        b.release(12345)
    with pytest.raises(UnknownCampaign):
        b.acquire(Intent("zz", units={"gpu": 1}, duration=60))
    with pytest.raises(InvalidArgument):
        b.register("g", Envelope(credits=1, guaranteed={"gpu": 9}))


def test_quote_agrees_with_acquire() -> None:
    """SPEC §8: a cell is grantable exactly when acquire would grant it, at that charge."""
    b = ref(Pool(gpu=16))
    b.register("a", Envelope(credits=20, sustained={"gpu": 4}, ceiling={"gpu": 12},
                             burst={"gpu": 3600}))
    q = b.quote("a", [1, 4, 8, 13], [600, 3600])
    assert q.reason.tolist() == [["", ""], ["", ""], ["", "tokens"],
                                 ["ceiling", "ceiling"]]
    assert q.cost[1, 0] == 4 * 600 / 3600 * 3.0
    d = b.acquire(Intent("a", units={"gpu": 8}, duration=600))
    assert d.cost == q.cost[2, 0] and d.granted


def test_flow_worked_numbers() -> None:
    """SPEC §5: g = 2, s = 4, b = 8, B = 20 on a 10/s filesystem: 30 asked, 8 pass."""
    b = ref(Pool(gpu=8, flow={"fs": 10.0}))
    b.register("io", Envelope(credits=100, guaranteed={"fs": 2}, sustained={"fs": 4},
                              ceiling={"fs": 8}, burst={"fs": 20}))
    c = b.consume("io", "fs", 30.0)
    assert (c.allowed, c.reason, c.retry_after) == (8.0, "tokens", 1.0)


def test_admit_batch_is_acquires() -> None:
    """SPEC §4.4: admit_batch decides exactly as the same acquires."""
    a, c = ref(Pool(gpu=16)), ref(Pool(gpu=16))
    for b in (a, c):
        b.register("x", Envelope(credits=100, sustained={"gpu": 16}))
    res = a.admit_batch([0, 0, 0], [[2, 8], [4, 8], [4, 4]], 60.0)
    decs = [c.acquire(Intent("x", units={"gpu": u}, duration=60))
            for u in ((2, 8), (4, 8), (4, 4))]
    assert res.granted.tolist() == [d.units if d.granted else 0 for d in decs]
    assert res.outcome.tolist() == [{"granted": 0, "refused": 1, "pending": 2}[d.outcome]
                                    for d in decs]


def test_lease_row_reuse() -> None:
    """SPEC §4.6: ids are row | generation << 32; a row is reused after reuse_after ended."""
    b = ref(Pool(gpu=8), reuse_after=1)
    b.register("a", Envelope(credits=100, sustained={"gpu": 8}))
    ids = []
    for _ in range(3):
        d = b.acquire(Intent("a", units={"gpu": 1}, duration=60))
        ids.append(d.lease.id)
        b.release(d.lease.id)
    assert ids == [0, 1, 1 << 32]
    assert b.release(0).intent_id == -1           # row 0 holds a later lease now
    with pytest.raises(UnknownLease):
        b.lease(0)


def test_journal_replays_in_the_compiled_broker() -> None:
    """SPEC §9: the reference writes the broker's records, so ``Broker.replay`` of its
    journal re-executes every input and gets the same records back, byte for byte."""
    j = MemoryJournal()
    b = ReferenceBroker(Pool(gpu=16), clock=ManualClock(0.0), journal=j)
    b.register("g", Envelope(credits=100, guaranteed={"gpu": 8}))
    b.register("o", Envelope(credits=math.inf, service_class="opportunistic",
                             sustained={"gpu": 16}, burst={"gpu": math.inf}))
    o = b.acquire(Intent("o", units={"gpu": (4, 16)}, duration=600))
    g = b.acquire(Intent("g", units={"gpu": 8}, duration=300))
    assert (o.units, g.path) == (16, "reclaim")
    p = b.acquire(Intent("g", units={"gpu": 8}, duration=60))
    assert p.outcome == "pending" and p.seq >= 0
    b.clock.advance(61)
    b.renew(g.lease.id, 100)
    b.cancel(p.intent_id)
    b.clock.advance(400)
    b.release(o.lease.id)
    b.poll()
    assert "Granted 8 gpu as lease 1 on the reclaim path" in b.explain(g.seq)
    for again in (Broker.replay(j, resume=False), ReferenceBroker.replay(j, resume=False)):
        assert again.state()["campaigns"] == b.state()["campaigns"]
        assert again.lease(g.lease.id) == b.lease(g.lease.id)


# ---------------------------------------------------------------------------------------
# where the compiled broker once broke the specification: each case pinned on both brokers
# ---------------------------------------------------------------------------------------
def _bucket_too_small(b: Any) -> Any:
    """H = 2 below s = 4 with B = 1,000: 8 more for 200 s need excess(8, 2) · 200 = 1,200
    unit-seconds, more than the bucket can ever hold at this holding (it refills, but only
    up to B), while (8 − s) · 200 = 800 <= B, so the intent pends instead of being refused."""
    b.register("a", Envelope(credits=1e6, sustained={"gpu": 4}, ceiling={"gpu": 64},
                             burst={"gpu": 1000}))
    b.acquire(Intent("a", units={"gpu": 2}, duration=1000))
    return b.acquire(Intent("a", units={"gpu": 8}, duration=200))


def test_reference_token_retry_after_beyond_bucket() -> None:
    d = _bucket_too_small(ref(Pool(gpu=64)))
    assert (d.outcome, d.reason, d.retry_after) == ("pending", "tokens", None)


def test_compiled_token_retry_after_beyond_bucket() -> None:
    b = Broker(Pool(gpu=64), clock=ManualClock(0.0))
    d = _bucket_too_small(b)
    assert (d.outcome, d.reason) == ("pending", "tokens")
    b.clock.advance(d.retry_after or 0.0)
    again = b.acquire(Intent("a", units={"gpu": 8}, duration=200))
    assert again.outcome == "pending"            # the promised time did not help
    assert d.retry_after is None


def _renewed_then_full(b: Any) -> Any:
    """The whole pool held by one lease until 60 s, renewed to 120 s: the next expiry is at
    120 s, and an intent that finds no capacity is told to retry then."""
    b.register("a", Envelope(credits=1e6, sustained={"gpu": 8}, ceiling={"gpu": 16}))
    d = b.acquire(Intent("a", units={"gpu": 8}, duration=60))
    assert b.renew(d.lease.id, 60).granted
    return b.acquire(Intent("a", units={"gpu": 1}, duration=60))


def test_reference_capacity_retry_after_is_next_expiry() -> None:
    d = _renewed_then_full(ref(Pool(gpu=8)))
    assert (d.outcome, d.reason, d.retry_after) == ("pending", "capacity", 120.0)


def test_compiled_capacity_retry_after_stale_expiry() -> None:
    d = _renewed_then_full(Broker(Pool(gpu=8), clock=ManualClock(0.0)))
    assert (d.outcome, d.reason, d.retry_after) == ("pending", "capacity", 120.0)


def _revoked_before_start(b: Any) -> Any:
    """A reclaim grant (active at 60 s, when its victim's grace ends) whose pool leaves at
    10 s: at 60 s it cannot be placed and is revoked (reason capacity)."""
    b.register("g", Envelope(credits=1e6, guaranteed={"gpu": 8}))
    b.register("o", Envelope(credits=1e6, service_class="opportunistic",
                             sustained={"gpu": 16}))
    b.acquire(Intent("o", units={"gpu": 16}, duration=3600))
    d = b.acquire(Intent("g", units={"gpu": 8}, duration=600))
    assert (d.path, d.wait) == ("reclaim", 60.0)
    b.clock.advance(10)
    b.remove_nodes("gpu", ["gpu-node0000", "gpu-node0001"], grace=0)
    b.clock.advance(50)
    assert [(e.kind, e.time, e.reason) for e in b.poll()][-1] == ("revoked", 60.0, "capacity")
    return b.lease(d.lease.id)


def test_reference_revoke_at_of_unstarted_grant() -> None:
    lease = _revoked_before_start(ref(Pool(gpu=16)))
    assert (lease.state, lease.start, lease.revoke_at) == ("revoked", None, 60.0)


def test_compiled_revoke_at_of_unstarted_grant() -> None:
    lease = _revoked_before_start(Broker(Pool(gpu=16), clock=ManualClock(0.0)))
    assert (lease.state, lease.start, lease.revoke_at) == ("revoked", None, 60.0)


# ---------------------------------------------------------------------------------------
# (b) the compiled broker against the reference, operation by operation
# ---------------------------------------------------------------------------------------
DURATIONS = (0.5, 1.0, 10.0, 60.0, 600.0, 3600.0)
CLASSES = [c.name for c in DEFAULT_CLASSES]


def _norm(x: object) -> object:
    """A value with NaNs made comparable and arrays as lists."""
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, float) and math.isnan(x):
        return "nan"
    return x


def _rows(j: MemoryJournal) -> list[tuple[object, ...]]:
    rows = j.rows()
    return [tuple(_norm(r[f].item()) for f in FIELDS) for r in rows]


@settings(max_examples=100, deadline=None, stateful_step_count=30,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
class CompiledAgainstReference(RuleBasedStateMachine):
    """Drives ``Broker`` (its default engine) and ``ReferenceBroker`` with the same
    operations and compares, after each, only what a user observes."""

    @initialize(data=st.data())
    def build(self, data: st.DataObject) -> None:
        ndims = data.draw(st.integers(1, 2), "dims")
        caps = [data.draw(st.integers(1, 24), f"cap{i}") for i in range(ndims)]
        spn = data.draw(st.integers(1, 8), "slots_per_node")
        heads = [data.draw(st.integers(0, max(0, cap // 4))) for cap in caps]
        flow = data.draw(st.booleans(), "flow")
        names = ["gpu", "cpu"][:ndims]
        self.dims = names

        def pool() -> Pool:
            return Pool(slots_per_node=spn, warm_headroom=dict(zip(names, heads)),
                        flow={"fs": 10.0} if flow else None, **dict(zip(names, caps)))  # type: ignore[arg-type]

        price = {"fs": 0.5} if flow and data.draw(st.booleans(), "flow priced") else None
        max_pending = data.draw(st.sampled_from([None, 1, 3, 1024]), "max_pending")
        reuse = data.draw(st.sampled_from([None, 0, 2, 1024]), "reuse_after")
        enforcement = data.draw(st.sampled_from(["prepaid", "prepaid", "instant"]))
        half_life = data.draw(st.sampled_from([600.0, 5.0]), "half_life")
        kw = dict(price=price, max_pending=max_pending, reuse_after=reuse, ttl=300.0,
                  enforcement=enforcement, half_life=half_life)
        self.jc, self.jr = MemoryJournal(), MemoryJournal()
        self.c = Broker(pool(), clock=ManualClock(0.0), journal=self.jc, **kw)  # type: ignore[arg-type]
        self.r = ReferenceBroker(pool(), clock=ManualClock(0.0), journal=self.jr, **kw)  # type: ignore[arg-type]
        self.flow = flow
        self.seen_c: list[object] = []
        self.seen_r: list[object] = []
        if data.draw(st.booleans(), "subscribe"):
            self.c.subscribe(self.seen_c.append)
            self.r.subscribe(self.seen_r.append)
        self.camps: list[str] = []
        left_g = list(caps)
        for i in range(data.draw(st.integers(1, 5), "campaigns")):
            g: dict[str, float] = {}
            s: dict[str, float] = {}
            b: dict[str, float] = {}
            B: dict[str, float] = {}
            for d, name in enumerate(names):
                gv = data.draw(st.integers(0, min(left_g[d], 6)))
                left_g[d] -= gv
                sv = gv + data.draw(st.integers(0, 8))
                bv = sv + data.draw(st.integers(0, 12))
                g[name], s[name], b[name] = gv, sv, bv
                B[name] = data.draw(st.sampled_from([0.0, 50.0, 1000.0, 20000.0, math.inf]))
            if flow:
                g["fs"], s["fs"], b["fs"], B["fs"] = 1.0, 2.0, 4.0, 10.0
            credits = data.draw(st.sampled_from([0.5, 5.0, 50.0, 5000.0, math.inf]))
            cls = data.draw(st.sampled_from(CLASSES))
            env = Envelope(credits=credits, service_class=cls, guaranteed=g, sustained=s,
                           ceiling=b, burst=B)
            name = f"c{i}"
            assert self.c.register(name, env) == self.r.register(name, env)
            self.camps.append(name)
        self.lease_ids: list[int] = []
        self.intent_ids: list[int] = []
        self.new_nodes = 0

    def _same(self, a: object, b: object) -> None:
        assert a == b, f"compiled {a!r}\n  reference {b!r}"

    def _decisions(self, a: object, b: object) -> None:
        self._same(a, b)
        lease = getattr(a, "lease", None)
        if lease is not None:
            self.lease_ids.append(lease.id)
        self.intent_ids.append(getattr(a, "intent_id", -1))

    @rule(data=st.data())
    def acquire(self, data: st.DataObject) -> None:
        camp = data.draw(st.sampled_from(self.camps))
        dim = data.draw(st.sampled_from(self.dims))
        lo = data.draw(st.integers(1, 12))
        hi = lo + data.draw(st.integers(0, 12))
        dur = data.draw(st.sampled_from(DURATIONS))
        cls = data.draw(st.one_of(st.none(), st.sampled_from(CLASSES)))
        spend = data.draw(st.one_of(st.none(), st.sampled_from([0.0, 0.5, 3.0, 40.0])))
        now = self.c.clock.now()
        deadline = data.draw(st.one_of(st.none(), st.sampled_from([-1.0, 0.0, 30.0, 100.0,
                                                                   1000.0]).map(lambda x: now + x)))
        ttl = data.draw(st.one_of(st.none(), st.sampled_from([1.0, 50.0, 600.0])))
        it = Intent(camp, units={dim: (lo, hi)}, duration=dur, service_class=cls,
                    max_spend=spend, deadline=deadline, ttl=ttl)
        self._decisions(self.c.acquire(it), self.r.acquire(it))

    @rule(data=st.data())
    def admit_batch(self, data: st.DataObject) -> None:
        n = data.draw(st.integers(0, 4))
        ci = [data.draw(st.integers(0, len(self.camps) - 1)) for _ in range(n)]
        us = [[lo, lo + data.draw(st.integers(0, 6))]
              for lo in (data.draw(st.integers(1, 8)) for _ in range(n))]
        dur = data.draw(st.sampled_from(DURATIONS))
        a = self.c.admit_batch(np.array(ci, np.int64), np.array(us, np.int64).reshape(n, 2), dur)
        b = self.r.admit_batch(np.array(ci, np.int64), np.array(us, np.int64).reshape(n, 2), dur)
        for f in ("granted", "reason", "lease", "outcome", "intent"):
            self._same(getattr(a, f).tolist(), getattr(b, f).tolist())
        self.lease_ids.extend(x for x in a.lease.tolist() if x >= 0)
        self.intent_ids.extend(a.intent.tolist())

    @precondition(lambda self: self.lease_ids)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        lid = data.draw(st.sampled_from(self.lease_ids))
        self._same(self.c.release(lid), self.r.release(lid))

    @precondition(lambda self: self.lease_ids)
    @rule(data=st.data())
    def renew(self, data: st.DataObject) -> None:
        lid = data.draw(st.sampled_from(self.lease_ids))
        dur = data.draw(st.sampled_from(DURATIONS))
        spend = data.draw(st.one_of(st.none(), st.sampled_from([0.0, 1.0, 100.0])))
        self._same(self.c.renew(lid, dur, spend), self.r.renew(lid, dur, spend))

    @precondition(lambda self: self.intent_ids)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        iid = data.draw(st.sampled_from(self.intent_ids))
        if iid < 0:
            return
        self._same(self.c.cancel(iid), self.r.cancel(iid))

    @rule(dt=st.sampled_from([0.25, 0.5, 1.0, 5.0, 30.0, 59.0, 60.0, 120.0, 600.0, 3000.0]))
    def advance(self, dt: float) -> None:
        self.c.clock.advance(dt)
        self.r.clock.advance(dt)

    @rule(data=st.data())
    def quote(self, data: st.DataObject) -> None:
        camp = data.draw(st.sampled_from(self.camps))
        dim = data.draw(st.sampled_from(self.dims))
        cls = data.draw(st.one_of(st.none(), st.sampled_from(CLASSES)))
        sizes, durs = [1, 2, 5, 9, 20], [1.0, 60.0, 3600.0]
        a = self.c.quote(camp, sizes, durs, dim=dim, service_class=cls)
        b = self.r.quote(camp, sizes, durs, dim=dim, service_class=cls)
        for f in ("sizes", "durations", "cost", "path", "wait", "grantable", "reason"):
            self._same((f, getattr(a, f).tolist()), (f, getattr(b, f).tolist()))

    @precondition(lambda self: self.flow)
    @rule(data=st.data())
    def consume(self, data: st.DataObject) -> None:
        camp = data.draw(st.sampled_from(self.camps))
        amount = data.draw(st.sampled_from([0.0, 0.5, 1.0, 3.0, 12.0]))
        self._same(self.c.consume(camp, "fs", amount), self.r.consume(camp, "fs", amount))

    @rule(data=st.data())
    def add_nodes(self, data: st.DataObject) -> None:
        dim = data.draw(st.sampled_from(self.dims))
        self.new_nodes += 1
        nodes = [(f"extra{self.new_nodes}", data.draw(st.integers(1, 6)))]
        self._same(self.c.add_nodes(dim, nodes), self.r.add_nodes(dim, nodes))

    @rule(data=st.data())
    def remove_nodes(self, data: st.DataObject) -> None:
        dim = data.draw(st.sampled_from(self.dims))
        names = [n for n, _ in self.c.pool.slot_map[dim]]
        self._same(names, [n for n, _ in self.r.pool.slot_map[dim]])
        if not names:
            return
        node = data.draw(st.sampled_from(names))
        grace = data.draw(st.sampled_from([0.0, 5.0, 60.0]))
        self._same(self.c.remove_nodes(dim, [node], grace),
                   self.r.remove_nodes(dim, [node], grace))

    @rule()
    def poll(self) -> None:
        self._same(self.c.poll(), self.r.poll())

    def teardown(self) -> None:
        """SPEC §9, invariant 8: each journal replays in the other broker."""
        if hasattr(self, "c"):
            ReferenceBroker.replay(self.jc, resume=False)
            Broker.replay(self.jr, resume=False)

    @invariant()
    def observed_alike(self) -> None:
        if not hasattr(self, "c"):
            return
        self._same(self.c.leases(), self.r.leases())
        for camp in self.camps:
            self._same(self.c.supply(camp), self.r.supply(camp))
        self._same(self.c.pending(), self.r.pending())
        self._same(self.c.deficits(), self.r.deficits())
        sc, sr = self.c.state(), self.r.state()
        self._same(sc.pop("backend") in ("compiled", "reference"), sr.pop("backend") == "reference")
        self._same(sc, sr)
        self._same(self.c._queued_events(), self.r._events)
        self._same(self.seen_c, self.seen_r)
        a, b = _rows(self.jc), _rows(self.jr)
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                diff = {f: (p, q) for f, p, q in zip(FIELDS, x, y) if p != q}
                raise AssertionError(f"journal record {i} differs: {diff}")
        self._same(len(a), len(b))


TestCompiledAgainstReference = pytest.mark.skipif(
    "compiled" not in BACKENDS, reason="the C core is not built: nothing to compare")(
    CompiledAgainstReference.TestCase)
