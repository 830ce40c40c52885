"""Borrowing (SPEC §14.8): a node past its firm room takes, on revocable leases, what its
siblings leave idle of their guarantees, up to its borrow limit and their lend limits; a
lender asking within its guarantee gets it back within the borrow grace. Every test runs
on the backend the suite runs on (compiled, cffi or reference)."""

from __future__ import annotations

import math

import pytest

from bursarcore import Broker, Envelope, Intent, ManualClock, Pool
from bursarcore.errors import InvalidArgument
from bursarcore.journal.memory import MemoryJournal
from abi_engine import MAXV, NS, abi_engine

pytestmark = pytest.mark.tree

INF = math.inf


def env(g: int = 0, **kw) -> Envelope:
    kw.setdefault("credits", 1e6)
    return Envelope(guaranteed={"gpu": g}, **kw)


def spec_broker(journal=None, **opts) -> Broker:
    """SPEC §14.8's worked numbers: `bio` holds its 40, `astro/b` idles its 30 (lends 15)."""
    b = Broker(Pool(gpu=100), clock=ManualClock(0.0), journal=journal, **opts)
    b.register("astro", env(60, sustained={"gpu": 100}))
    b.register("astro/a", env(30, ceiling={"gpu": 100}, burst={"gpu": INF},
                              borrow_limit={"gpu": 20}))
    b.register("astro/b", env(30, lend_limit={"gpu": 15}))
    b.register("bio", env(40))
    assert b.acquire(Intent("bio", units={"gpu": 40}, duration=600)).units == 40
    return b


def ask(b: Broker, name: str, lo: int, hi: int, dur: float = 600.0, cls: str | None = None):
    return b.acquire(Intent(name, units={"gpu": (lo, hi)}, duration=dur, service_class=cls))


def test_a_borrower_takes_a_siblings_idle_guarantee_up_to_the_lend_limit():
    b = spec_broker()
    d = ask(b, "astro/a", 1, 100)
    assert (d.units, d.path, d.lease.firm) == (30, "warm", True)   # its firm room first
    d = ask(b, "astro/a", 1, 100)
    assert (d.outcome, d.units, d.path, d.lease.firm) == ("granted", 15, "borrow", False)
    assert d.cost > 0                                  # priced as its class is
    camps = b.state()["campaigns"]
    assert camps["astro/a"]["borrowed"] == {"gpu": 15}
    assert camps["astro/a"]["firm_held"] == {"gpu": 30}            # not firm
    assert camps["astro"]["held"] == {"gpu": 45}                   # in every level's holding
    pool = b.state()["pool"]["gpu"]
    assert pool["firm"] == 70 and pool["unmet_guarantees"] == 30   # astro/b's stays reserved
    e = ask(b, "astro/a", 1, 100)                      # astro/b lends no more than 15
    assert (e.outcome, e.reason) == ("pending", "capacity")


def test_the_lender_gets_its_guarantee_back_within_the_borrow_grace():
    b = spec_broker(borrow_grace=45.0)
    ask(b, "astro/a", 1, 100)
    lent = ask(b, "astro/a", 1, 100)
    assert lent.path == "borrow"
    w = ask(b, "astro/b", 30, 30)
    assert (w.outcome, w.path, w.wait) == ("granted", "reclaim", 45.0)
    assert b.lease(lent.lease.id).state == "revoking"
    assert b.lease(lent.lease.id).revoke_at == 45.0
    b.clock.advance(45)
    camps = b.state()["campaigns"]
    assert b.lease(lent.lease.id).state == "revoked"
    assert b.lease(w.lease.id).state == "active"
    assert camps["astro/a"]["borrowed"] == {"gpu": 0} and camps["astro/b"]["held"] == {"gpu": 30}


def test_opportunistic_leases_are_preempted_before_borrowed_ones():
    b = Broker(Pool(gpu=100), clock=ManualClock(0.0))
    b.register("a", env(40, sustained={"gpu": 100}, borrow_limit={"gpu": 30}))
    b.register("b", env(40))
    b.register("x", env(0, sustained={"gpu": 100}))
    assert ask(b, "a", 40, 40).path == "warm"
    lent = ask(b, "a", 30, 30)
    assert lent.path == "borrow"
    opp = ask(b, "x", 10, 10, cls="opportunistic")      # the 20 unpromised, less headroom
    assert opp.outcome == "granted"
    w = ask(b, "b", 30, 30)                              # 20 free: one victim is enough
    assert w.path == "reclaim"
    assert b.lease(opp.lease.id).state == "revoking"
    assert b.lease(lent.lease.id).state == "active"


def test_flat_campaigns_borrow_from_each_other():
    """Top-level nodes are siblings: a flat broker borrows as a Kueue cohort does."""
    b = Broker(Pool(gpu=100), clock=ManualClock(0.0))
    b.register("a", env(50, sustained={"gpu": 100}, borrow_limit={"gpu": 40}))
    b.register("b", env(50))
    assert ask(b, "a", 50, 100).units == 50
    d = ask(b, "a", 1, 100)
    assert (d.units, d.path) == (40, "borrow")
    assert ask(b, "b", 50, 50).path == "reclaim"


def test_no_borrow_limit_no_borrowing():
    """The default envelope borrows nothing: the firm decision stands, as before §14.8."""
    b = Broker(Pool(gpu=100), clock=ManualClock(0.0))
    b.register("a", env(50, sustained={"gpu": 100}))
    b.register("b", env(50))
    ask(b, "a", 50, 50)
    assert ask(b, "a", 1, 100).reason == "capacity"


def test_a_lend_limit_of_zero_lends_nothing_and_cousins_are_not_siblings():
    b = Broker(Pool(gpu=100), clock=ManualClock(0.0))
    b.register("p", env(50, sustained={"gpu": 100}))
    b.register("p/a", env(25, sustained={"gpu": 100}, borrow_limit={"gpu": 50}))
    b.register("p/b", env(25, lend_limit={"gpu": 0}))
    b.register("q", env(50))
    b.register("q/c", env(50))                           # idle, but a cousin of p/a
    assert ask(b, "p/a", 1, 100).units == 25
    d = ask(b, "p/a", 1, 100)
    assert (d.outcome, d.reason) == ("pending", "capacity")


def test_the_firm_room_wins_when_borrowing_gives_no_more():
    """A borrowed lease is at most what the borrow limit leaves: a larger firm room is taken
    firm."""
    b = Broker(Pool(gpu=100), clock=ManualClock(0.0))
    b.register("a", env(40, sustained={"gpu": 100}, borrow_limit={"gpu": 10}))
    b.register("b", env(40))
    d = ask(b, "a", 1, 100)
    assert (d.units, d.path, d.lease.firm) == (60, "warm", True)


def test_borrowing_is_journaled_replayed_and_explained():
    j = MemoryJournal()
    b = spec_broker(journal=j)
    ask(b, "astro/a", 1, 100)
    d = ask(b, "astro/a", 1, 100)
    ask(b, "astro/b", 30, 30)
    b.clock.advance(100)
    rec = b.journal.record(d.seq)
    assert rec["path"] == 3 and rec["units"] == 15 and rec["lim_capacity"] == 0
    text = b.explain(d.seq)
    assert "borrow path" in text and "firm room allowed 0" in text
    again = type(b).replay(j, clock=ManualClock(b.clock.now()), resume=False)
    assert again.state() == b.state()


def test_a_batch_hands_a_borrowing_item_to_the_single_path():
    b = spec_broker()
    ask(b, "astro/a", 30, 30)
    n = 16                                  # long enough for the compiled loop
    a, ab = b.campaign_index("astro/a"), b.campaign_index("astro/b")
    camps = [ab] * (n - 1) + [a]
    units = [[1, 1]] * (n - 1) + [[1, 100]]
    res = b.admit_batch(camps, units, 600.0)
    assert res.granted.tolist() == [1] * (n - 1) + [15]
    assert b.lease(int(res.lease[-1])).firm is False
    assert b.lease(int(res.lease[0])).firm is True
    assert b.state()["campaigns"]["astro/a"]["borrowed"] == {"gpu": 15}


@pytest.mark.parametrize("field, kw, rule", [
    ("borrow_limit[gpu]", {"borrow_limit": {"gpu": -1}}, ">= 0"),
    ("lend_limit[gpu]", {"lend_limit": {"gpu": -2}}, ">= 0"),
    ("borrow_limit[gpu]", {"borrow_limit": {"gpu": 1.5}}, "whole"),
    ("borrow_limit[fs]", {"borrow_limit": {"fs": 1}}, "held dimension"),
])
def test_bad_limits_name_the_field_and_change_nothing(field, kw, rule):
    b = Broker(Pool(gpu=10, flow={"fs": 1.0}), clock=ManualClock(0.0))
    with pytest.raises(InvalidArgument) as e:
        b.register("a", env(1, **kw))
    assert e.value.field == field
    assert "a" not in b.state()["campaigns"]


def test_borrow_grace_must_be_positive():
    with pytest.raises(InvalidArgument) as e:
        Broker(Pool(gpu=10), borrow_grace=0.0)
    assert e.value.field == "borrow_grace"


def test_the_abi_sets_borrowing():
    """``bc_engine_set_borrowing``: a flat C-ABI broker borrows as the Python one does."""
    ffi, lib, e = abi_engine(100)
    idx = ffi.new("int64_t *")
    for g in (50, 50):
        a = [ffi.new("int64_t[]", [x]) for x in (g, 100, 100, MAXV)]
        assert lib.bc_engine_add_campaign(e, *a, MAXV, 0, idx) == lib.BC_OK
    bl, ll = ffi.new("int64_t[]", [40]), ffi.new("int64_t[]", [MAXV + 1])
    assert lib.bc_engine_set_borrowing(e, 0, bl, ll) == lib.BC_OK
    assert lib.bc_engine_set_borrowing(e, 2, bl, ll) == lib.BC_EINDEX
    assert lib.bc_engine_set_borrowing(e, 0, ffi.new("int64_t[]", [-1]), ll) == lib.BC_ERANGE
    dec = ffi.new("bc_decision *")
    assert lib.bc_engine_acquire(e, 0, 0, 0, 50, 50, 600 * NS, -1, 0, 0, dec) == lib.BC_OK
    assert (dec.outcome, dec.units) == (lib.BC_GRANTED, 50)
    assert lib.bc_engine_acquire(e, 0, 0, 0, 1, 100, 600 * NS, -1, 0, 1, dec) == lib.BC_OK
    assert (dec.outcome, dec.units) == (lib.BC_GRANTED, 40)       # borrowed from the other
    # the lender's own 50 are within its guarantee: 10 free, the borrowed 40 reachable by
    # a reclaim, which the policy layer runs (deferred), never a refusal for capacity
    assert lib.bc_engine_acquire(e, 1, 0, 0, 50, 50, 600 * NS, -1, 0, 2, dec) == lib.BC_OK
    assert dec.outcome == lib.BC_DEFERRED


def test_a_flat_campaign_given_a_borrow_limit_by_a_change_borrows():
    """SPEC §14.8, §14.9: a borrow limit given later binds the next decisions."""
    b = Broker(Pool(gpu=100), clock=ManualClock(0.0))
    b.register("a", env(50, sustained={"gpu": 100}))
    b.register("b", env(50))
    assert ask(b, "a", 50, 50).units == 50
    assert ask(b, "a", 1, 100).reason == "capacity"
    b.change("a", env(50, sustained={"gpu": 100}, borrow_limit={"gpu": 20}))
    d = ask(b, "a", 1, 100)
    assert (d.units, d.path) == (20, "borrow")
    assert b.state()["campaigns"]["a"]["held"] == {"gpu": 70}
