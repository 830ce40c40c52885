"""SPEC §14, rule by rule, with its worked numbers: names as paths, nested guarantees, every
level's ceiling, bucket and budget, the reserve rule and what it guarantees, replay."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bursarcore import Broker, Intent, ManualClock, Pool
from bursarcore.errors import InvalidArgument
from bursarcore.journal.memory import MemoryJournal
from treegen import env

pytestmark = pytest.mark.tree

INF = math.inf


def broker(cap: int = 100, **kw) -> Broker:
    return Broker(Pool(gpu=cap), clock=ManualClock(0.0), **kw)


def ask(b: Broker, name: str, lo: int, hi: int | None = None, dur: float = 600.0,
        cls: str | None = None):
    return b.acquire(Intent(name, units={"gpu": (lo, lo if hi is None else hi)},
                            duration=dur, service_class=cls))


def astro_bio(**kw) -> Broker:
    """The worked numbers of SPEC §14.3: pool 100; astro 60 = astro/a 40 + astro/b 20;
    bio 30."""
    b = broker(100, **kw)
    b.register("astro", env(60, 100))
    b.register("astro/a", env(40, 40, 100, INF))
    b.register("astro/b", env(20))
    b.register("bio", env(30))
    return b


def tokens(b: Broker, name: str) -> float:
    return b.supply(name).dims["gpu"].tokens


def held(b: Broker, name: str) -> int:
    return b.state()["campaigns"][name]["held"]["gpu"]


# -- §14.1 names and registration -------------------------------------------------------------
def test_a_path_needs_its_parent_registered_first():
    b = broker()
    with pytest.raises(InvalidArgument, match=r"^name: its parent 'astro' must be registered"):
        b.register("astro/a", env())
    b.register("astro", env(10))
    assert b.register("astro/a", env(5)) == 1
    assert b.register("astro/a/agent-7", env(5)) == 2
    with pytest.raises(InvalidArgument, match=r"^name: its parent 'astro/b'"):
        b.register("astro/b/agent-1", env())
    assert b.campaigns == ["astro", "astro/a", "astro/a/agent-7"]


@pytest.mark.parametrize("name", ["/a", "a/", "a//b", "/"])
def test_a_path_segment_may_not_be_empty(name):
    b = broker()
    b.register("a", env())
    with pytest.raises(InvalidArgument, match=r"^name: must be a path of non-empty segments"):
        b.register(name, env())


def test_a_path_has_at_most_eight_levels():
    """SPEC §14.1: a lease records what each level of its path prepaid, so a path has at
    most 8 levels (``BC_TREE_DEPTH``); a ninth is refused naming ``name``, changing
    nothing."""
    b = broker()
    path = "l1"
    b.register(path, env(0, 4))
    for i in range(2, 9):
        path += f"/l{i}"
        b.register(path, env(0, 4))
    before = b.state()
    with pytest.raises(InvalidArgument, match=r"^name: a tree of envelopes has at most 8 "
                                              r"levels, and this path has 9"):
        b.register(path + "/l9", env(0, 4))
    assert b.state() == before
    d = b.acquire(Intent(path, units={"gpu": 1}, duration=60))      # the eighth level
    assert d.outcome == "granted"


def test_guarantees_nest_and_a_refusal_changes_nothing():
    b = astro_bio()
    with pytest.raises(InvalidArgument, match=r"^guaranteed\[gpu\]: the children of 'astro' "
                                              r"would be guaranteed 70 in all, more than its "
                                              r"own guarantee 60"):
        b.register("astro/c", env(10))
    assert "astro/c" not in b.campaigns
    b.register("astro/c", env(0))                    # no guarantee: always fits
    # a grandchild's guarantee is carved out of its parent's, not its grandparent's
    with pytest.raises(InvalidArgument, match=r"^guaranteed\[gpu\]: the children of 'astro/b'"):
        b.register("astro/b/x", env(21))
    b.register("astro/b/x", env(20))
    # the top level: Σ g ≤ capacity, as SPEC §3
    with pytest.raises(InvalidArgument, match=r"^guaranteed\[gpu\]: sum of guarantees 101"):
        b.register("chem", env(11))
    b.register("chem", env(10))


def test_a_new_guarantee_must_fit_the_reserve_rule_now():
    """A child's guarantee raises its parent's commitment as a firm grant would: refused
    while firm holdings above guarantees leave no room (SPEC §14.1)."""
    b = broker(100)
    b.register("astro", env(60, 100))
    b.register("astro/a", env(40, 40, 100, INF))
    b.register("bio", env(30))
    # astro/a's limit: 100 − (60 + 30) + slack_a 40 + slack_astro 20 = 70
    assert ask(b, "astro/a", 1, 100).units == 70
    with pytest.raises(InvalidArgument, match=r"^guaranteed\[gpu\]: firm holdings above "
                                              r"guarantees leave no room"):
        b.register("astro/b", env(20))
    b.register("astro/b", env(0))


def test_a_child_may_name_larger_limits_than_its_parent_and_the_parents_bind():
    b = broker(100)
    b.register("p", env(0, 10, 20, 0, credits=1))
    b.register("p/c", env(0, 80, 90, INF, credits=INF))
    d = ask(b, "p/c", 1, 90, dur=3600)
    # ceiling 20, tokens 10 (p's bucket is empty of excess), credits 1 / 3 per GPU-hour
    assert d.outcome == "refused" and d.reason == "credits"
    b2 = broker(100)
    b2.register("p", env(0, 10, 20, 0, credits=1e6))
    b2.register("p/c", env(0, 80, 90, INF, credits=INF))
    assert ask(b2, "p/c", 1, 90).units == 10                    # p's s with no bucket


def test_flat_names_are_todays_campaigns():
    """No '/': every node is top-level and nothing of SPEC §14 applies beyond SPEC §3–§4."""
    b = broker(100)
    b.register("g", env(30))
    b.register("a", env(0, 100))
    assert ask(b, "a", 1, 100).units == 70
    assert ask(b, "g", 30).path == "warm"


# -- §14.2 every level binds ------------------------------------------------------------------
def test_every_ceiling_on_the_path_binds():
    b = broker(100)
    b.register("p", env(0, 10, 12, INF))
    b.register("p/c", env(0, 50, 50, INF))
    b.register("p/d", env(0, 50, 50, INF))
    assert ask(b, "p/c", 1, 50).units == 12
    d = ask(b, "p/d", 1, 50)
    assert (d.outcome, d.reason) == ("pending", "ceiling")
    # a minimum above an ancestor's ceiling can never be met
    d = ask(b, "p/d", 13, 13)
    assert (d.outcome, d.reason) == ("refused", "ceiling")


def test_the_parents_bucket_pays_for_its_subtree_and_is_refunded():
    """SPEC §14.2's worked numbers: lab sustains 8 with a 3,600 GPU-s bucket; lab/x,
    sustaining 64, asks for 64 for 600 s and gets 8 + 3,600 / 600 = 14."""
    b = broker(64)
    b.register("lab", env(0, 8, 64, 3600))
    b.register("lab/x", env(0, 64))
    d = ask(b, "lab/x", 1, 64)
    assert (d.units, d.path) == (14, "warm")
    assert tokens(b, "lab") == 0.0 and tokens(b, "lab/x") == 0.0   # lab/x: B = 0, no excess
    assert held(b, "lab") == 14 and held(b, "lab/x") == 14
    b.clock.advance(100)
    b.release(d.lease.id)
    assert tokens(b, "lab") == 3000.0                                # 6 · 500 back
    assert held(b, "lab") == 0
    # the parent refills at its own s less its subtree's holding
    b.clock.advance(10)
    assert tokens(b, "lab") == 3080.0
    e = ask(b, "lab/x", 4)
    assert e.units == 4
    b.clock.advance(10)
    assert tokens(b, "lab") == 3120.0                                # (8 − 4) · 10


def test_each_node_prepays_at_its_own_sustained_rate_and_holding():
    """excess(n, H_v) at each node: the child pays above its s, the parent above its own,
    at its own subtree holding."""
    b = broker(100)
    b.register("p", env(0, 20, 100, 100_000))
    b.register("p/c", env(0, 10, 100, 100_000))
    b.register("p/d", env(0, 100))
    assert ask(b, "p/d", 15, dur=100).units == 15                 # p: 15 ≤ 20, no tokens
    assert ask(b, "p/c", 12, dur=100).units == 12
    # p/c: 12 − 10 = 2 above s; p: H 15 → 27, 7 above s
    assert tokens(b, "p/c") == 100_000 - 2 * 100
    assert tokens(b, "p") == 100_000 - 7 * 100


def test_a_token_wait_is_the_longest_refill_on_the_path():
    b = broker(100)
    b.register("p", env(0, 10, 100, 1000))
    b.register("p/c", env(0, 12, 100, 1000))
    assert ask(b, "p/c", 15, dur=100).units == 15      # p/c pays 300, p pays 500
    b.clock.advance(100)                                 # expired: nothing unused comes back
    b.poll()
    assert (tokens(b, "p"), tokens(b, "p/c")) == (500.0, 700.0)
    assert ask(b, "p/c", 5, dur=1000).units == 5         # within both s: no tokens
    # 12 more for 100 s: p/c needs (17 − 12) · 100 = 500 (it has 700); p needs
    # (17 − 10) · 100 = 700, has 500 and refills at 10 − 5 = 5/s: 40 s
    e = ask(b, "p/c", 12, dur=100)
    assert (e.outcome, e.reason, e.retry_after) == ("pending", "tokens", 40.0)
    b.clock.advance(40)
    assert [x.kind for x in b.poll()] == ["granted"]


def test_a_renewal_is_repriced_at_every_node():
    b = broker(100)
    b.register("p", env(0, 10, 100, 10_000))
    b.register("p/c", env(0, 40, 100, 0))
    d = ask(b, "p/c", 20, dur=100)
    assert tokens(b, "p") == 10_000 - 10 * 100
    r = b.renew(d.lease.id, 50)
    assert r.outcome == "granted"
    assert tokens(b, "p") == 10_000 - 10 * 150
    r = b.renew(d.lease.id, 1000)                     # 10 · 1,150 > what p holds
    assert (r.outcome, r.reason) == ("refused", "tokens")
    assert tokens(b, "p") == 10_000 - 10 * 150        # a refused renewal changes nothing


def test_every_budget_on_the_path_pays_and_is_refunded():
    """SPEC §14.2: ops has 6 credits, ops/bot none of its own: 2 GPUs for an hour at 3
    credits per GPU-hour."""
    b = broker(64)
    b.register("ops", env(0, 8, credits=6))
    b.register("ops/bot", env(0, 8, credits=INF))
    b.register("ops/rich", env(0, 8, credits=100))
    d = ask(b, "ops/bot", 1, 8, dur=3600)
    assert (d.units, d.cost) == (2, 6.0)
    assert b.supply("ops").credits == 0.0 and b.supply("ops/bot").credits == INF
    e = ask(b, "ops/rich", 1, 8, dur=3600)        # its own 100 do not help: ops is spent
    assert (e.outcome, e.reason) == ("pending", "credits")     # until ops's escrow returns
    b.cancel(e.intent_id)
    e = ask(b, "ops/rich", 3, dur=3600)           # 9 credits: more than ops could ever have
    assert (e.outcome, e.reason) == ("refused", "credits")
    b.clock.advance(1800)
    b.release(d.lease.id)
    assert b.supply("ops").credits == 3.0
    s = b.state()["campaigns"]
    assert s["ops"]["credits_spent"] == 3.0 and s["ops"]["credits_escrowed"] == 0.0
    assert s["ops/bot"]["credits_spent"] == 3.0 and s["ops/bot"]["credits_refunded"] == 3.0


def test_a_class_free_when_broke_runs_free_when_an_ancestor_is_broke():
    b = broker(64)
    b.register("ops", env(0, 8, 64, INF, credits=0))
    b.register("ops/bot", env(0, 8, 64, INF, credits=100))
    d = ask(b, "ops/bot", 8, dur=3600, cls="opportunistic")
    assert (d.outcome, d.cost) == ("granted", 0.0)
    assert b.supply("ops/bot").credits == 100.0
    d = ask(b, "ops/bot", 1, dur=3600)
    assert (d.outcome, d.reason) == ("refused", "credits")


def test_opportunistic_leases_use_the_reserve_but_bind_every_level():
    b = broker(100)
    b.register("g", env(60))
    b.register("bf", env(0, 0, 80, INF, credits=INF, cls="opportunistic"))
    b.register("bf/a", env(0, 100, 100, INF, credits=INF, cls="opportunistic"))
    d = ask(b, "bf/a", 1, 100)
    assert (d.outcome, d.units) == ("granted", 80)          # bf's ceiling, not the reserve
    assert held(b, "bf") == 80
    # g's guarantee, lent to bf/a, comes back on the reclaim path
    d = ask(b, "g", 60)
    assert (d.outcome, d.path) == ("granted", "reclaim")


def test_interior_nodes_hold_leases_of_their_own():
    b = astro_bio()
    # astro's own slack is 60 − (40 + 20) = 0: its guarantee is all its children's
    d = ask(b, "astro", 1, 100)
    assert (d.outcome, d.units) == ("granted", 10)          # the 10 no one is promised
    assert held(b, "astro") == 10 and held(b, "astro/a") == 0
    assert ask(b, "astro/a", 40).units == 40 and ask(b, "astro/b", 20).units == 20
    assert ask(b, "bio", 30).units == 30


def test_expiry_gives_back_along_the_path():
    b = broker(100)
    b.register("p", env(0, 10, 100, 10_000))
    b.register("p/c", env(0, 100))
    ask(b, "p/c", 30, dur=60)
    assert held(b, "p") == 30 and tokens(b, "p") == 10_000 - 20 * 60
    b.clock.advance(61)
    ev = b.poll()
    assert [e.kind for e in ev] == ["expired"]
    assert held(b, "p") == 0 and held(b, "p/c") == 0
    assert tokens(b, "p") == 10_000 - 20 * 60 + 10       # nothing unused; 1 s of refill


# -- §14.3 the reserve rule -------------------------------------------------------------------
def test_a_storm_above_its_guarantee_leaves_its_sibling_and_cousins_whole():
    """SPEC §14.3's worked numbers."""
    b = astro_bio()
    d = ask(b, "astro/a", 1, 100)
    assert (d.outcome, d.units) == ("granted", 50)            # 100 − 90 + 40 + 0
    assert ask(b, "astro/a", 1, 100).reason == "capacity"
    assert ask(b, "astro", 5).reason == "capacity"             # slack_astro = 0
    p = b.state()["pool"]["gpu"]
    assert (p["firm"], p["unmet_guarantees"], p["free"]) == (50, 50, 50)
    d = ask(b, "astro/b", 20)
    assert (d.outcome, d.units, d.path) == ("granted", 20, "warm")
    d = ask(b, "bio", 30)
    assert (d.outcome, d.units, d.path) == ("granted", 30, "warm")


def test_a_storm_on_revocable_leases_is_reclaimed_for_a_guarantee():
    b = broker(100)
    b.register("astro", env(60, 120))              # s covers its children's ceilings
    b.register("astro/a", env(40, 40, 100, INF))
    b.register("astro/b", env(20))
    b.register("bio", env(30))
    d = ask(b, "astro/a", 1, 100, cls="opportunistic")
    assert d.units == 100                                   # opportunistic: all free units
    d = ask(b, "astro/b", 20)
    assert (d.outcome, d.path, d.wait) == ("granted", "reclaim", 60.0)
    d = ask(b, "bio", 30)
    assert (d.outcome, d.path) == ("granted", "reclaim")


def test_a_siblings_storm_cannot_take_an_ancestors_ceiling_from_a_guarantee():
    """SPEC §14.3's worked numbers for the ceiling: astro's ceiling of 100 binds its load
    K = max(g_a, K_a) + max(g_b, K_b), so astro/b's 20 stay reserved in it while astro/a
    storms, firm and opportunistic, to the limit."""
    b = astro_bio()
    assert ask(b, "astro/a", 1, 100).units == 50                # capacity: 100 − 90 + 40
    d = ask(b, "astro/a", 1, 100, cls="opportunistic")
    # astro: 100 − (50 + 20) = 30 more (its bucket, empty, allows the same 30)
    assert (d.outcome, d.units) == ("granted", 30)
    d = ask(b, "astro/a", 1, 100, cls="opportunistic")
    assert (d.outcome, d.reason) == ("pending", "ceiling")      # K_astro = 80 + 20 = b
    b.cancel(d.intent_id)
    assert ask(b, "bio", 1, 30, cls="opportunistic").units == 20   # the pool is full
    assert held(b, "astro") == 80
    d = ask(b, "astro/b", 20)
    assert (d.outcome, d.units, d.path, d.wait) == ("granted", 20, "reclaim", 60.0)
    assert held(b, "astro") == 100               # and its load stays 80 + max(20, 20) = 100


def test_a_siblings_storm_cannot_spend_an_ancestors_bucket_from_a_guarantee():
    """An ancestor's bucket prepays the rise of its load: a child's grant within its own
    guarantee does not raise it, so it needs no tokens above, however many its siblings
    have spent."""
    b = broker(100)
    b.register("astro", env(60, 60, 100, 6000))
    b.register("astro/a", env(40, 40, 100, INF))
    b.register("astro/b", env(20))
    # K_astro = 40 + 20 = 60 = s: astro/a's 40 need no tokens, 6,000 / 600 = 10 more
    d = ask(b, "astro/a", 1, 100)
    assert (d.units, tokens(b, "astro")) == (50, 0.0)
    e = ask(b, "astro/a", 1, 100)
    assert (e.outcome, e.reason, e.retry_after) == ("pending", "tokens", None)
    b.cancel(e.intent_id)
    e = ask(b, "astro/b", 20)
    assert (e.outcome, e.units, e.path) == ("granted", 20, "warm")
    assert tokens(b, "astro") == 0.0                             # astro/b paid nothing above
    # released after 100 s, astro/a's prepaid rise of astro's load comes back: 10 · 500
    b.clock.advance(100)
    b.release(d.lease.id)
    assert tokens(b, "astro") == 5000.0
    # astro's load is now 0 + max(40, 0) + max(20, 20) = 60 = s: no refill
    b.clock.advance(100)
    assert tokens(b, "astro") == 5000.0


def test_a_parent_refills_at_what_its_childrens_guarantees_leave_of_its_rate():
    """Reserved guarantees are load: an idle child with g = 4 leaves its parent of s = 8
    a refill of 4 per second."""
    b = broker(64)
    b.register("lab", env(4, 8, 64, 3600))
    b.register("lab/x", env(4, 4, 64, 0))
    b.register("lab/y", env(0, 64))
    d = ask(b, "lab/y", 1, 64)               # K_lab: 4 + 0 → 4 + n; 8 − 4 + 3,600 / 600
    assert (d.units, tokens(b, "lab")) == (10, 0.0)
    b.clock.advance(100)
    b.release(d.lease.id)
    assert tokens(b, "lab") == 6 * 500
    b.clock.advance(10)
    assert tokens(b, "lab") == 6 * 500 + 4 * 10


def test_a_new_guarantee_may_not_raise_a_load_above_a_sustained_rate():
    """SPEC §14.1: a new child's guarantee enters its ancestors' loads at once, and no
    tokens pay for it: refused where it would lift a load above s."""
    b = broker(64)
    b.register("lab", env(8, 8, 64, 3600))
    b.register("lab/x", env(0, 64))
    assert ask(b, "lab/x", 6, dur=600).units == 6                 # K_lab = 6
    with pytest.raises(InvalidArgument, match=r"^guaranteed\[gpu\]: it would raise a load "
                                              r"on its parent's path above"):
        b.register("lab/y", env(4))
    assert "lab/y" not in b.campaigns
    b.register("lab/y", env(2))                                   # K_lab = 8 = s
    b.clock.advance(600)
    b.poll()
    b.register("lab/z", env(4))                                   # K_lab = 2 + 4 = 6


def test_a_grant_within_guarantee_raises_no_ancestors_load():
    """SPEC §14.3: K_c + n ≤ g_c leaves every ancestor's load (and commitment) as it was:
    a full ancestor still admits it, and an ancestor asking for more does not get it."""
    b = broker(100)
    b.register("p", env(30, 30, 30, 0))
    b.register("p/a", env(10, 10, 30, INF))
    b.register("p/b", env(20, 20, 20, 0))
    assert ask(b, "p/a", 1, 30).units == 10                   # p: 10 + 20 = 30 = b = s
    assert ask(b, "p", 1).reason == "ceiling"
    for n in (5, 7, 8):                                       # 20 in all: within p/b's g
        assert ask(b, "p/b", n).outcome == "granted"
    assert ask(b, "p/b", 1).reason == "ceiling"               # p/b's own ceiling, 20


def test_a_leafs_guarantee_holds_even_when_its_ancestors_are_above_theirs():
    """The guarantee is c's slack: for a leaf, g − firm held, whatever its ancestors hold
    (their commitments include it in full)."""
    b = broker(100)
    b.register("p", env(50, 100))
    b.register("p/a", env(30, 30, 100, INF))
    b.register("p/b", env(20))
    b.register("q", env(50, 100))
    # p/a: 100 − 100 + 30 + 0: only its own guarantee (the pool is all promised)
    assert ask(b, "p/a", 1, 100).units == 30
    assert ask(b, "p", 1, 100).reason == "capacity"
    assert ask(b, "p/b", 20).units == 20
    assert ask(b, "q", 50).units == 50


def test_an_interior_nodes_guarantee_is_its_slack_not_its_subtree_room():
    """g_v − firm held in v's subtree is not what v is guaranteed: its children's unmet
    guarantees come first (SPEC §14.3)."""
    b = astro_bio()
    assert ask(b, "astro/a", 50).units == 50
    assert ask(b, "bio", 30).units == 30
    # astro's subtree holds 50 of its 60, but astro/b's 20 is inside astro's commitment
    assert ask(b, "astro", 5).reason == "capacity"
    assert ask(b, "astro/b", 20).path == "warm"


def test_never_the_tree_bound():
    """SPEC §4.4, §14.3: refused at once above capacity − Σ_top g + Σ_path (g_v − Σ_ch g_ch)."""
    b = broker(100)
    b.register("p", env(60, 100))
    b.register("p/a", env(40, 40, 100, INF))
    b.register("q", env(30, 100))
    # p/a could at most have 100 − 90 + 40 + (60 − 40) = 70
    d = ask(b, "p/a", 71)
    assert (d.outcome, d.reason) == ("refused", "capacity")
    d = ask(b, "p/a", 70)
    assert (d.outcome, d.units) == ("granted", 70)


# -- replay -----------------------------------------------------------------------------------
def test_a_tree_journal_replays_to_the_same_state():
    j = MemoryJournal()
    b = astro_bio(journal=j)
    b.register("astro/b/agent-1", env(10, 10, 30, 3000))
    ask(b, "astro/a", 1, 100)
    ask(b, "astro/b/agent-1", 1, 30, dur=100)
    ask(b, "bio", 1, 30, cls="opportunistic")
    b.clock.advance(30)
    lid = b.leases("astro/b/agent-1")[0].id
    b.renew(lid, 60)
    b.clock.advance(200)
    b.poll()
    again = type(b).replay(j, clock=ManualClock(b.clock.now()), resume=False)
    assert again.state() == b.state()
    assert again.campaigns == b.campaigns


# -- the incremental form of the reserve rule -------------------------------------------------
@st.composite
def trees(draw):
    """A random tree of guarantees and firm holdings: (parents, g, firm_own)."""
    n = draw(st.integers(1, 12))
    parents: list[int | None] = [None]
    for i in range(1, n):
        parents.append(draw(st.none() | st.integers(0, i - 1)))
    g = [0] * n
    for i in reversed(range(n)):
        kids = sum(g[j] for j in range(n) if parents[j] == i)
        g[i] = kids + draw(st.integers(0, 10))
    own = [draw(st.integers(0, 30)) for _ in range(n)]
    return parents, g, own


def _commit(parents, g, own):
    R = [0] * len(g)
    for i in reversed(range(len(g))):
        R[i] = max(g[i], own[i] + sum(R[j] for j in range(len(g)) if parents[j] == i))
    return R


@given(trees(), st.data())
@settings(max_examples=200)
def test_a_grant_raises_the_pools_commitment_by_what_the_paths_slack_cannot_absorb(t, data):
    """SPEC §14.3: a firm grant of n to c raises Σ_top R by max(0, n − Σ_path slack_v),
    the O(depth) form the compiled core is to implement, against the definition."""
    parents, g, own = t
    n_nodes = len(g)
    c = data.draw(st.integers(0, n_nodes - 1))
    n = data.draw(st.integers(0, 60))
    R = _commit(parents, g, own)
    slack = [R[i] - own[i] - sum(R[j] for j in range(n_nodes) if parents[j] == i)
             for i in range(n_nodes)]
    assert min(slack) >= 0
    path, v = [], c
    while v is not None:
        path.append(v)
        v = parents[v]
    top = sum(R[i] for i in range(n_nodes) if parents[i] is None)
    own2 = list(own)
    own2[c] += n
    R2 = _commit(parents, g, own2)
    top2 = sum(R2[i] for i in range(n_nodes) if parents[i] is None)
    assert top2 - top == max(0, n - sum(slack[v] for v in path))


def _loads(parents, g, own):
    K = [0] * len(g)
    for i in reversed(range(len(g))):
        K[i] = own[i] + sum(max(g[j], K[j]) for j in range(len(g)) if parents[j] == i)
    return K


@given(trees(), st.data())
@settings(max_examples=200)
def test_a_grant_raises_each_load_on_the_path_by_what_the_guarantees_below_cannot_absorb(t, data):
    """SPEC §14.2: a grant of n to c raises K_v at each node v of c's path by
    max(0, n − E_v), E_v = Σ over the path's nodes u below v of max(0, g_u − K_u), and
    leaves every other load as it was; the O(depth) form against the definition. Within
    c's guarantee (K_c + n ≤ g_c) no ancestor's load or commitment moves."""
    parents, g, own = t
    n_nodes = len(g)
    c = data.draw(st.integers(0, n_nodes - 1))
    n = data.draw(st.integers(0, 60))
    K = _loads(parents, g, own)
    path, v = [], c
    while v is not None:
        path.append(v)
        v = parents[v]
    own2 = list(own)
    own2[c] += n
    K2 = _loads(parents, g, own2)
    E = 0
    for v in path:
        assert K2[v] - K[v] == max(0, n - E)
        E += max(0, g[v] - K[v])
    assert all(K2[v] == K[v] for v in range(n_nodes) if v not in path)
    if K[c] + n <= g[c]:
        assert all(K2[v] == K[v] for v in path[1:])
        R, R2 = _commit(parents, g, own), _commit(parents, g, own2)
        assert all(R2[v] == R[v] for v in path[1:])
