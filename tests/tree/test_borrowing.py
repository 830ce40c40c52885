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


def test_a_borrower_borrows_from_its_siblings_only(backend):
    """SPEC §14.8: a borrower's lenders are the other children of its parent (the other
    top-level nodes, for a top-level one), among cousins, nephews, many unrelated
    campaigns and campaigns with no guarantee, registered in between them: what each
    borrower gets is what its true siblings leave idle, each up to its lend limit."""
    b = Broker(Pool(gpu=1000), clock=ManualClock(0.0), backend=backend)
    big = {"sustained": {"gpu": 1000}, "ceiling": {"gpu": 1000}, "burst": {"gpu": INF}}

    def reg(name: str, g: int, **kw) -> None:
        b.register(name, env(g, credits=1e9, **{**big, **kw}))

    def nobody(i: int) -> None:            # an unrelated campaign that lends nothing
        reg(f"z{i}", 0)

    for i in range(5):
        reg(f"f{i}", 20, lend_limit={"gpu": 5 if i == 0 else INF})
        nobody(i)
    reg("p", 340, lend_limit={"gpu": 7})
    reg("q", 300, lend_limit={"gpu": 11})
    reg("p/a", 100, borrow_limit={"gpu": 500})
    reg("q/x", 200, borrow_limit={"gpu": 500})
    for i in range(5, 10):
        nobody(i)
        reg(f"f{i}", 20)
    reg("p/b", 100, lend_limit={"gpu": 30})
    reg("q/y", 100)
    reg("p/b/n", 50)                       # a nephew of p/a's: not its sibling
    reg("q/y/w", 40)
    reg("p/c", 80)
    reg("t", 160, borrow_limit={"gpu": 1000})
    reg("p/d", 60)
    reg("q/z", 0)
    assert ask(b, "p/d", 45, 45).units == 45          # p/d leaves 15 idle
    for name, firm, lent in (("p/a", 100, 30 + 80 + 15),      # p/b (its limit), p/c, p/d
                             ("q/x", 200, 100),               # q/y
                             ("t", 160, 5 + 9 * 20 + 7 + 11)):  # f0..f9, p and q
        d = ask(b, name, firm, firm)                  # its firm room
        assert (d.units, d.path, d.lease.firm) == (firm, "warm", True), name
        d = ask(b, name, 1, 1000)
        assert (d.outcome, d.units, d.path) == ("granted", lent, "borrow"), name
        assert b.state()["campaigns"][name]["borrowed"] == {"gpu": lent}
        e = ask(b, name, 1, 1000)                     # its siblings lend no more
        assert (e.outcome, e.reason) == ("pending", "capacity"), name
        b.cancel(e.intent_id)


def test_the_abi_borrows_from_siblings_only():
    """The C ABI's registration lists a node among its siblings (``bc_engine_add_node``
    under a parent, ``bc_engine_add_campaign`` at the top level): a borrower takes what its
    true siblings leave idle, among cousins and unrelated top-level campaigns."""
    ffi, lib, e = abi_engine(1000)
    idx = ffi.new("int64_t *")

    def add(parent: int, g: int) -> int:
        a = [ffi.new("int64_t[]", [x]) for x in (g, 1000, 1000, MAXV)]
        assert lib.bc_engine_add_node(e, parent, *a, MAXV, 0, idx) == lib.BC_OK
        return idx[0]

    def lend(c: int, borrow: int, limit: int = MAXV + 1) -> None:
        bl, ll = ffi.new("int64_t[]", [borrow]), ffi.new("int64_t[]", [limit])
        assert lib.bc_engine_set_borrowing(e, c, bl, ll) == lib.BC_OK

    dec = ffi.new("bc_decision *")
    intent = iter(range(100))

    def acquire(c: int, lo: int = 1, hi: int = 1000) -> int:
        assert lib.bc_engine_acquire(e, c, 0, 0, lo, hi, 600 * NS, -1, 0, next(intent),
                                     dec) == lib.BC_OK
        assert dec.outcome == lib.BC_GRANTED, (c, lo, hi, dec.outcome, dec.reason)
        return dec.units

    A = add(-1, 300)
    for _ in range(10):                    # flat campaigns, each idle 10
        add(-1, 10)
    B = add(-1, 300)
    A1, B1 = add(A, 100), add(B, 200)
    for _ in range(10):
        add(-1, 10)
    A2, B2 = add(A, 120), add(B, 100)
    add(B2, 60)                            # a nephew of B1's
    add(A, 80)                             # A3
    T = add(-1, 200)
    lend(A1, 1000)
    lend(B1, 1000)
    lend(A2, 0, 50)
    lend(A, 0, 10)
    lend(B, 0, 20)
    lend(T, 1000)
    # each takes its firm room, then borrows
    assert (acquire(A1, 100, 100), acquire(A1)) == (100, 50 + 80)   # A2 (its limit), A3
    assert (acquire(B1, 200, 200), acquire(B1)) == (200, 100)       # B2
    assert (acquire(T, 200, 200), acquire(T)) == (200, 10 + 20 + 20 * 10)  # A, B, the flat
