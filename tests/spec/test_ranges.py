"""Every number crosses one edge with a range the engine can hold (SPEC §2).

Each case is a reproduction of an input that once crashed the broker (an OverflowError from
inside the engine, after state had changed), passed validation and exhausted memory, or left
backends disagreeing; each runs on every backend.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from bursarcore import Broker, Envelope, Intent, ManualClock, Pool
from bursarcore import units
from bursarcore.admission.classes import ServiceClass
from bursarcore.admission.state import MAXV
from bursarcore.errors import InvalidArgument
from bursarcore.journal.memory import MemoryJournal
from invariants import next_intent

YEAR = 365 * 86400.0


def mk(eb, journal=True, **pool):
    b = Broker(Pool(**(pool or {"gpu": 8})), clock=ManualClock(10.0), backend=eb,
               journal=MemoryJournal() if journal else None)
    b.register("a", Envelope(credits=100, sustained={"gpu": 8}, ceiling={"gpu": 8}))
    return b


def picture(b):
    """state() without the name of the backend that made it."""
    return {k: v for k, v in b.state().items() if k != "backend"}


def frozen(b):
    return b.state(), next_intent(b), len(b.journal) if b.journal is not None else 0


# ------------------------------------------------------------------ refused at the edge
def test_a_max_spend_beyond_the_credit_range_is_refused_before_anything_changes(eb):
    b = mk(eb)
    before = frozen(b)
    with pytest.raises(InvalidArgument) as e:
        b.acquire(Intent("a", {"gpu": 1}, 60, max_spend=9.3e12))
    assert e.value.field == "max_spend" and "1,000,000,000,000" in e.value.rule
    assert frozen(b) == before                       # no intent id taken, nothing journaled
    assert b.acquire(Intent("a", {"gpu": 1}, 60, max_spend=units.MAX_CREDITS)).granted
    Broker.replay(b.journal, backend=eb, clock=ManualClock(b.clock.now()))


def test_renew_applies_the_same_bounds_as_acquire(eb):
    b = mk(eb)
    lid = b.acquire(Intent("a", {"gpu": 1}, 60)).lease.id
    before = frozen(b)
    for kw, field in (({"duration": True}, "duration"), ({"duration": 0.0}, "duration"),
                      ({"duration": 4e8}, "duration"), ({"duration": 1.0, "max_spend": 9.3e12},
                                                        "max_spend"),
                      ({"duration": 1.0, "max_spend": False}, "max_spend")):
        with pytest.raises(InvalidArgument) as e:
            b.renew(lid, **kw)
        assert e.value.field == field
    assert frozen(b) == before
    assert b.renew(lid, 1.5).granted


def test_held_numbers_beyond_the_unit_range_name_their_field(eb):
    b = mk(eb)
    before = frozen(b)
    with pytest.raises(InvalidArgument) as e:
        Envelope(credits=1, ceiling={"gpu": 1e19})
    assert e.value.field == "ceiling[gpu]"
    with pytest.raises(InvalidArgument) as e:       # a held ceiling: whole units, at most 2**24
        b.register("x", Envelope(credits=1, ceiling={"gpu": 2**24 + 1}))
    assert e.value.field == "ceiling[gpu]" and "16,777,216" in e.value.rule
    with pytest.raises(InvalidArgument) as e:
        b.register("x", Envelope(credits=1, ceiling={"gpu": 8.5}))
    assert e.value.field == "ceiling[gpu]" and "(got 8.5)" in str(e.value)
    with pytest.raises(InvalidArgument) as e:       # the mapping that names the unknown dim
        b.register("x", Envelope(credits=1, ceiling={"cpu": 3}))
    assert e.value.field == "ceiling[cpu]"
    with pytest.raises(InvalidArgument) as e:
        Envelope(credits=2e12)
    assert e.value.field == "credits"
    assert frozen(b) == before


def test_a_pool_beyond_the_unit_range_is_refused_without_allocating():
    with pytest.raises(InvalidArgument) as e:
        Pool(gpu=2**40)
    assert e.value.field == "pool[gpu]"
    with pytest.raises(InvalidArgument):
        Pool(gpu=8, slots_per_node=2**40)
    with pytest.raises(InvalidArgument):
        Pool(gpu=8, slots={"gpu": [("n0", 2**40)]})


def test_the_manual_clock_stays_inside_the_engine_time_range():
    clk = ManualClock(0.0)
    for bad in (2**1024, float("inf"), float("nan"), True, units.MAX_SECONDS * 2):
        with pytest.raises(InvalidArgument):
            clk.advance(bad)
    with pytest.raises(InvalidArgument):
        ManualClock(10**400)
    clk.advance(units.MAX_SECONDS - 1)
    with pytest.raises(InvalidArgument, match="engine's range"):
        clk.advance(2.0)
    assert clk.now() == units.MAX_SECONDS - 1


def test_broker_options_are_bounded():
    for kw, field in (({"ttl": 86_401.0}, "ttl"), ({"ttl": True}, "ttl"),
                      ({"half_life": 1e300}, "half_life"), ({"price": {"gpu": 1e4}}, "price[gpu]"),
                      ({"price": {"gpu": np.float64("nan")}}, "price[gpu]")):
        with pytest.raises(InvalidArgument) as e:
            Broker(Pool(gpu=8), **kw)
        assert e.value.field == field
    with pytest.raises(InvalidArgument) as e:
        ServiceClass("x", 0, 1e3)
    assert e.value.field == "x.multiplier"


def test_an_intent_needs_at_least_one_unit_and_bounded_fields():
    for kw, field in (({"units": {"gpu": (0, 4)}}, "units[gpu].min"),
                      ({"units": {"gpu": 0}}, "units[gpu]"),
                      ({"units": {"gpu": (1, 2**24 + 1)}}, "units[gpu].max"),
                      ({"units": {"gpu": True}}, "units[gpu]"),
                      ({"ttl": 86_401.0}, "ttl"), ({"deadline": 1e10}, "deadline"),
                      ({"deadline": True}, "deadline"), ({"duration": 5e-7}, "duration")):
        args = {"units": {"gpu": 1}, "duration": 60.0, **kw}
        with pytest.raises(InvalidArgument) as e:
            Intent("a", **args)
        assert e.value.field == field, kw


def test_quote_refuses_what_acquire_refuses(eb):
    b = mk(eb)
    before = frozen(b)
    for sizes, durations, field in (([2**63], [60.0], "sizes"), (np.array([2**63], np.uint64),
                                                                 [60.0], "sizes"),
                                    ([1], [], "durations"), ([], [1.0], "sizes"),
                                    ([1], [True], "durations"), ([1], [4e8], "durations"),
                                    ([2**24 + 1], [1.0], "sizes")):
        with pytest.raises(InvalidArgument) as e:
            b.quote("a", sizes, durations)
        assert e.value.field == field, (sizes, durations)
    assert frozen(b) == before


def test_numpy_scalars_are_numbers_everywhere_and_register_journals_them(eb):
    """A numpy scalar is accepted wherever a number is; the campaign it registers is
    journaled as plain numbers and replays (a numpy int64 left in the record would not be
    JSON serialisable, so the campaign would live in memory but be missing from the
    journal)."""
    b = mk(eb)
    b.register("n", Envelope(credits=np.int64(10), sustained={"gpu": np.int32(2)},
                             ceiling={"gpu": np.float32(4.0)}, burst={"gpu": np.float64(100)},
                             share=np.uint8(3)))
    b.register("f", Envelope(credits=Fraction(7, 2), share=Fraction(1, 3)))
    d = b.acquire(Intent("n", {"gpu": (np.int64(1), np.int16(3))}, np.float32(30.0),
                         max_spend=np.float64(5.0), ttl=np.int64(60)))
    assert d.granted and d.units == 3
    assert b.renew(d.lease.id, np.float64(10.0)).granted
    r = Broker.replay(b.journal, backend=eb, clock=ManualClock(b.clock.now()))
    assert r.state() == b.state() and r.campaigns == ["a", "n", "f"]


# ------------------------------------------------------------------ extremes, every backend
def _extreme(eb):
    b = Broker(Pool(gpu=10**6), clock=ManualClock(0.0), backend=eb, journal=MemoryJournal(),
               price={"gpu": units.MAX_PRICE},
               classes=[ServiceClass("top", 0, units.MAX_MULTIPLIER)])
    b.register("rich", Envelope(credits=units.MAX_CREDITS, service_class="top",
                                sustained={"gpu": 10**6}, ceiling={"gpu": 10**6}))
    b.register("inf", Envelope(credits=math.inf, service_class="top",
                               sustained={"gpu": 10**6}, ceiling={"gpu": 10**6},
                               burst={"gpu": math.inf}))
    return b


def test_extremes_agree_across_backends_and_replay():
    """10^6 units held for ten years at the highest price, a budget of 10^12 credits and
    an unlimited one: no counter overflows or wraps a balance, the backends agree on every
    figure, and the journal replays."""
    from bursarcore.broker import BACKENDS
    out = []
    for eb in BACKENDS:
        b = _extreme(eb)
        # the cost of 10^6 GPUs for ten years at 1e5 credits per GPU-hour (8.8e15 credits)
        # is beyond any budget: the grant is sized to what the budget (or, unlimited, the
        # escrow's range) can pay
        d1 = b.acquire(Intent("rich", {"gpu": (1, 10**6)}, 10 * YEAR))
        d2 = b.acquire(Intent("inf", {"gpu": (1, 10**6)}, 10 * YEAR))
        assert d1.granted and d2.granted
        assert d1.cost <= units.MAX_CREDITS and d2.cost <= MAXV / 1e6
        b.clock.advance(10 * YEAR)
        ev = b.poll()
        st = b.state()
        assert [e.kind for e in ev] == ["expired", "expired"]
        assert st["campaigns"]["rich"]["credits_left"] >= 0
        assert all(math.isfinite(v) for v in b.deficits().values())
        r = Broker.replay(b.journal, backend=eb, clock=ManualClock(b.clock.now()))
        assert r.state() == st
        out.append((picture(b), [d1.to_dict(), d2.to_dict()], b.deficits()))
    assert all(o == out[0] for o in out)


def test_a_large_holding_for_a_day_accumulates_alike_in_every_backend():
    """100,000 units held for 26 h: ∫H dt (unit-ns) passes 2**63. The counters wrap the
    same way in every backend (the reference once raised OverflowError, the compiled
    engine wrapped), and fair share, which does not use them, stays exact."""
    from bursarcore.broker import BACKENDS
    seen = []
    for eb in BACKENDS:
        b = Broker(Pool(gpu=200_000), clock=ManualClock(0.0), backend=eb)
        b.register("big", Envelope(credits=math.inf, sustained={"gpu": 150_000},
                                   ceiling={"gpu": 150_000}))
        b.register("small", Envelope(credits=math.inf, sustained={"gpu": 10}))
        assert b.acquire(Intent("big", {"gpu": 100_000}, 26 * 3600.0)).granted
        b.clock.advance(26 * 3600.0)
        b.poll()
        b.acquire(Intent("small", {"gpu": 1}, 1.0))
        seen.append((picture(b), b.deficits()))
    assert all(s == seen[0] for s in seen)
    assert 100_000 * 26 * 3600 * 10**9 > 2**63


def test_a_renewal_cannot_move_a_lease_past_the_time_range(eb):
    b = mk(eb)
    b.register("u", Envelope(credits=math.inf, sustained={"gpu": 1}))
    lid = b.acquire(Intent("u", {"gpu": 1}, 10 * YEAR)).lease.id
    before = None                # (a lease of ten years, renewed by ten years at a time)
    for _ in range(20):
        try:
            before = frozen(b)
            b.renew(lid, 10 * YEAR)
        except InvalidArgument as e:
            assert e.field == "duration" and "time range" in e.rule
            assert frozen(b) == before
            break
    else:
        raise AssertionError("a lease was renewed past 2**62 ns")


# ------------------------------------------------------------------ replay at one instant
def test_a_deadline_that_lapses_at_a_poll_at_the_same_instant_replays(eb):
    """An intent that goes pending with its deadline at that very instant is refused by a
    poll at the same instant, which writes no input record; the replay must reach the
    same records (it wrote an extra advance record and diverged)."""
    clk = ManualClock(10.0)
    b = Broker(Pool(gpu=8), clock=clk, journal=MemoryJournal(), backend=eb)
    for n in "ab":
        b.register(n, Envelope(credits=100, sustained={"gpu": 8}, ceiling={"gpu": 8}))
    b.acquire(Intent("a", {"gpu": 8}, 5))
    assert b.acquire(Intent("b", {"gpu": 4}, 5, deadline=clk.now())).outcome == "pending"
    assert [(e.kind, e.reason) for e in b.poll()] == [("refused", "deadline")]
    clk.advance(0.001)
    b.acquire(Intent("a", {"gpu": 1}, 1))
    r = Broker.replay(b.journal, clock=ManualClock(clk.now()), backend=eb)
    assert r.state() == b.state()


def test_nodes_added_while_leases_are_held_take_their_slots_back(eb):
    """The free-slot stack is wide enough for every slot of the dimension, held ones too:
    adding a node while leases are held, then ending those leases, once overfilled it
    (IndexError inside an operation)."""
    b = Broker(Pool(gpu=16), clock=ManualClock(0.0), backend=eb, journal=MemoryJournal())
    b.register("a", Envelope(credits=math.inf, sustained={"gpu": 24}, ceiling={"gpu": 24}))
    leases = [b.acquire(Intent("a", {"gpu": 1}, 10)).lease.id for _ in range(5)]
    b.add_nodes("gpu", [("extra", 8)])
    b.clock.advance(11)
    assert [e.kind for e in b.poll()] == ["expired"] * 5
    assert b.acquire(Intent("a", {"gpu": 24}, 10)).granted
    assert len(set(b.leases()[0].slots)) == 24 and all(b.lease(l).state == "expired"
                                                     for l in leases)
    Broker.replay(b.journal, backend=eb, clock=ManualClock(b.clock.now()))
