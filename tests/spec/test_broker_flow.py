"""Flow dimensions through the broker (SPEC §5): consume, credits per unit, journal, replay."""

import math

import numpy as np
import pytest

from bursarcore import Broker, Envelope, Intent, ManualClock, Pool
from bursarcore.errors import InvalidArgument
from bursarcore.journal import MemoryJournal

from invariants import check_invariants


def broker(eb, journal=None):
    b = Broker(Pool(gpu=64, flow={"fs": 28.0, "inference": 5000.0}), clock=ManualClock(0.0),
               backend=eb, price={"inference": 0.001}, journal=journal)
    b.register("sci", Envelope(credits=100, guaranteed={"gpu": 8, "fs": 2},
                               sustained={"gpu": 16, "fs": 6, "inference": 500},
                               ceiling={"gpu": 32, "fs": 16, "inference": 2000},
                               burst={"gpu": 1000, "fs": 3600, "inference": 100_000}))
    b.register("storm", Envelope(credits=1, sustained={"gpu": 8, "inference": 50},
                                 ceiling={"gpu": 32, "inference": 500},
                                 burst={"gpu": 100, "inference": 5000}))
    return b


def test_consume_buckets_and_reasons(eb):
    b = broker(eb)
    c = b.consume("sci", "fs", 20)
    assert (c.allowed, c.reason) == (16.0, "tokens")  # the peak bucket: 16 GB/s x 1 s
    assert c.retry_after > 0
    assert b.consume("storm", "fs", 1).allowed == 0.0  # no fs envelope: no access
    # storm's inference: 500/s peak, and 1 credit buys 1,000 tokens at 0.001 credits each
    c = b.consume("storm", "inference", 2000)
    assert (c.allowed, c.cost, c.reason) == (500.0, 0.5, "tokens")
    b.clock.advance(1)
    c = b.consume("storm", "inference", 2000)
    assert c.allowed == 500.0 and c.cost == 0.5
    b.clock.advance(1)
    c = b.consume("storm", "inference", 100)
    assert (c.allowed, c.reason, c.retry_after) == (0.0, "credits", math.inf)
    assert b.state()["campaigns"]["storm"]["credits_left"] == 0.0
    check_invariants(b)


def test_guaranteed_flow_never_throttled(eb):
    b = broker(eb)
    for _ in range(30):
        b.consume("storm", "inference", 10_000)  # hammer the facility bucket
        assert b.consume("sci", "fs", 2.0).allowed == 2.0
        b.clock.advance(1)


def test_consume_batch_equals_sequence_and_replays(eb):
    amounts = np.array([5.0, 30.0, 1.0, 7.5, 40.0, 0.25])
    camps = np.array([0, 0, 1, 0, 0, 1])
    b1, b2 = broker(eb), broker(eb)
    a1, r1 = b1.consume_batch(camps, "fs", amounts)
    seq = [b2.consume(["sci", "storm"][c], "fs", float(x)) for c, x in zip(camps, amounts)]
    assert a1.tolist() == [s.allowed for s in seq]
    assert r1.tolist() == [s.retry_after for s in seq]
    j = MemoryJournal()
    b = broker(eb, j)
    b.consume_batch(camps, ["inference"] * 6, amounts * 100)
    b.clock.advance(3)
    b.consume("sci", "fs", 3)
    b.acquire(Intent("sci", units={"gpu": 8}, duration=60))
    r = Broker.replay(j, backend=eb)
    assert r.state() == b.state()
    assert r.flow.state.keys() == b.flow.state.keys()
    assert all(np.array_equal(np.asarray(r.flow.state[k]), np.asarray(b.flow.state[k]))
               for k in b.flow.state)


def test_consume_batch_journals_as_the_sequence_does(eb):
    """Unpriced, with a journal: the batch's records are the sequence's, record for record
    (allowed, throttled by tokens and by the facility's capacity, refused), and replay."""
    amounts = np.array([5.0, 30.0, 1.0, 7.5, 40.0, 0.25, 400.0, 0.0, 2.0])
    camps = np.array([0, 0, 1, 0, 0, 1, 1, 0, 1])
    j1, j2 = MemoryJournal(), MemoryJournal()
    b1, b2 = broker(eb, j1), broker(eb, j2)
    for step in range(3):
        if step:
            b1.clock.advance(0.5)
            b2.clock.advance(0.5)
        a1, r1 = b1.consume_batch(camps, "fs", amounts * (step + 1))
        seq = [b2.consume(["sci", "storm"][c], "fs", float(x) * (step + 1))
               for c, x in zip(camps, amounts)]
        assert a1.tolist() == [s.allowed for s in seq]
        assert r1.tolist() == [s.retry_after for s in seq]
    recs1, recs2 = list(j1), list(j2)
    assert len(recs1) == len(recs2) and recs1 == recs2
    assert {r["reason"] for r in recs1 if r["op"] == "consume"} >= {"", "tokens"}
    assert Broker.replay(j1, backend=eb).state() == b1.state()


def test_flow_validation(eb):
    b = broker(eb)
    with pytest.raises(InvalidArgument) as e:
        b.consume("sci", "gpu", 1)
    assert e.value.field == "dim"
    with pytest.raises(InvalidArgument) as e:
        b.consume("sci", "fs", -1)
    assert e.value.field == "amount"
    with pytest.raises(InvalidArgument) as e:
        b.register("greedy", Envelope(credits=1, guaranteed={"fs": 27}, sustained={"fs": 27}))
    assert e.value.field == "guaranteed[fs]"
    assert b.campaigns == ["sci", "storm"]
    with pytest.raises(InvalidArgument):
        Pool(gpu=8, flow={"gpu": 3})
