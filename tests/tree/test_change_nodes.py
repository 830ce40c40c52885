"""SPEC §14.9: changing a node's envelope, as a journaled decision, on every backend: a
refused change names its field and changes nothing; a raise and a lowering of a guarantee
move the pool's unmet guarantees and the parent's reserve; replay reproduces the state."""

from __future__ import annotations

import math

import pytest

from bursarcore import Broker, Envelope, Intent, ManualClock, Pool
from bursarcore.errors import InvalidArgument, UnknownCampaign
from bursarcore.journal.memory import MemoryJournal
from treegen import env

pytestmark = pytest.mark.tree

INF = math.inf


def astro_bio(journal: MemoryJournal | None = None) -> Broker:
    """SPEC §14.3's numbers: pool 100; astro 60 = astro/a 40 + astro/b 20; bio 30; astro/a
    holds 50 firmly (10 above its guarantee, within astro's)."""
    b = Broker(Pool(gpu=100), clock=ManualClock(0.0), journal=journal)
    b.register("astro", env(60, 100))
    b.register("astro/a", env(40, 40, 100, INF))
    b.register("astro/b", env(20))
    b.register("bio", env(30))
    assert b.acquire(Intent("astro/a", units={"gpu": (50, 50)}, duration=600)).granted
    return b


def unmet(b: Broker) -> int:
    return b.state()["pool"]["gpu"]["unmet_guarantees"]


def g_of(b: Broker, name: str) -> float:
    return b.state()["campaigns"][name]["envelope"]["guaranteed"]["gpu"]


@pytest.mark.parametrize("name, envelope, field, rule", [
    ("astro/b", env(25), "guaranteed[gpu]", "the children of 'astro' would be guaranteed 65"),
    ("astro", env(50, 100), "guaranteed[gpu]", "the children of 'astro' are guaranteed 60"),
    ("bio", env(41), "guaranteed[gpu]", "sum of guarantees 101 would exceed the pool"),
    ("bio", env(30, credits=INF), "credits", "cannot change between unlimited and finite"),
    ("astro/a", env(40, 40, 100, INF, credits=1), "credits", "below 0"),
    ("bio", env(30, cls="nope"), "service_class", "must be one of"),
])
def test_a_refused_change_names_its_field_and_changes_nothing(name, envelope, field, rule):
    b = astro_bio()
    before = b.state()
    with pytest.raises(InvalidArgument) as e:
        b.change(name, envelope)
    assert e.value.field == field and rule in str(e.value)
    assert b.state() == before


def test_an_unknown_node_cannot_change():
    b = astro_bio()
    with pytest.raises(UnknownCampaign):
        b.change("astro/c", env(1))


def test_a_raise_must_fit_the_reserve_now():
    """astro/a holds 50 firm, 10 above its guarantee and beyond astro's free 0: R_astro =
    max(60, 50 + 20) = 70 and Σ_top R = 70 + 30 = 100. bio may not rise to 40 (Σ_top g
    would be 100, but the holdings above guarantees leave no room); once astro/b falls to 5
    (R_astro = max(60, 55) = 60), it may."""
    b = astro_bio()
    assert unmet(b) == 50               # Σ_top R 100 − F 50
    before = b.state()
    with pytest.raises(InvalidArgument, match=r"^guaranteed\[gpu\]: firm holdings above"):
        b.change("bio", env(40))
    assert b.state() == before
    b.change("astro/b", env(5))
    assert unmet(b) == 40               # Σ_top R 90 − F 50
    b.change("bio", env(40))
    assert unmet(b) == 50 and g_of(b, "bio") == 40


def test_a_raise_refused_by_the_reserve_names_the_guarantee():
    """astro/a holds 90 firm (50 above its guarantee): Σ_top R = 90 + 10 = 100. Lowering
    bio to 0 frees room; raising it back beyond what the holdings leave is refused."""
    b = Broker(Pool(gpu=100), clock=ManualClock(0.0))
    b.register("astro", env(60, 100, 100))
    b.register("astro/a", env(40, 100, 100, INF))
    b.register("bio", env(10, 100))
    b.change("bio", env(0, 100))
    assert b.acquire(Intent("astro/a", units={"gpu": (95, 95)}, duration=600)).granted
    before = b.state()
    with pytest.raises(InvalidArgument, match=r"^guaranteed\[gpu\]: firm holdings above"):
        b.change("bio", env(10, 100))
    assert b.state() == before
    b.change("bio", env(5, 100))
    assert g_of(b, "bio") == 5


def test_a_raise_and_a_lowering_move_the_parents_reserve():
    """astro 60 = astro/a 40 (holding 50 firm: R_a = 50) + astro/b 20: R_astro =
    max(60, 70) = 70. The pool's unmet guarantees are Σ_top R − F."""
    b = astro_bio()
    assert unmet(b) == 50               # (70 + 30) − 50
    b.change("astro/b", env(5))         # R_astro = max(60, 55) = 60
    assert unmet(b) == 40
    b.change("astro", env(65, 100))     # R_astro = 65
    assert unmet(b) == 45
    b.change("astro", env(55, 100))     # R_astro = max(55, 55) = 55
    assert unmet(b) == 35


def test_a_change_frees_a_guarantee_for_a_new_sibling():
    b = astro_bio()
    with pytest.raises(InvalidArgument):
        b.register("astro/c", env(10))
    b.change("astro/b", env(10))
    assert b.register("astro/c", env(10)) == 4


def test_a_smaller_bucket_clips_the_tokens():
    b = astro_bio()
    b.change("bio", env(30, 30, 30, 1000))
    assert b.supply("bio").dims["gpu"].tokens == 0.0
    b.clock.advance(10_000)
    assert b.supply("bio").dims["gpu"].tokens == 1000.0
    b.change("bio", env(30, 30, 30, 100))
    assert b.supply("bio").dims["gpu"].tokens == 100.0


def test_a_budget_change_moves_the_credits_left():
    b = astro_bio()
    left = b.state()["campaigns"]["astro/a"]["credits_left"]
    b.change("astro/a", env(40, 40, 100, INF, credits=2e6))
    assert b.state()["campaigns"]["astro/a"]["credits_left"] == left + 1e6


def test_live_leases_keep_running_and_the_new_ceiling_binds_later():
    b = astro_bio()
    b.change("astro/a", env(40, 40, 40, INF))
    assert b.state()["campaigns"]["astro/a"]["held"]["gpu"] == 50
    assert not b.acquire(Intent("astro/a", units={"gpu": (1, 1)}, duration=60)).granted


def test_replay_reproduces_the_state_after_changes():
    j = MemoryJournal()
    b = astro_bio(j)
    b.clock.advance(5)
    b.change("astro/b", env(10, 10, 20, 100, credits=500))
    b.change("bio", env(30, 40, 50, INF))
    b.clock.advance(5)
    b.change("astro", env(70, 100))
    assert b.acquire(Intent("bio", units={"gpu": (5, 40)}, duration=60)).granted
    ops = [j.record(i)["op"] for i in range(len(j))]
    assert ops.count("change") == 3
    assert "changed to credits" in b.explain(ops.index("change"))
    assert Broker.replay(j).state() == b.state()


# -- removing a node ---------------------------------------------------------------------------
@pytest.mark.parametrize("name, rule", [
    ("astro", "has children"),
    ("astro/a", "has live leases"),
])
def test_a_refused_removal_names_the_node_and_changes_nothing(name, rule):
    b = astro_bio()
    before = b.state()
    with pytest.raises(InvalidArgument) as e:
        b.remove(name)
    assert e.value.field == "name" and rule in str(e.value)
    assert b.state() == before


def test_a_node_with_pending_intents_cannot_be_removed():
    b = astro_bio()
    b.change("bio", env(30, 60, 60))
    d = b.acquire(Intent("bio", units={"gpu": (40, 40)}, duration=60, ttl=600))
    assert d.outcome == "pending"
    with pytest.raises(InvalidArgument, match="^name: has pending intents"):
        b.remove("bio")
    b.cancel(d.intent_id)
    b.remove("bio")


def test_removing_a_leaf_frees_its_guarantee_for_a_new_sibling():
    b = astro_bio()
    with pytest.raises(InvalidArgument):
        b.register("astro/c", env(20))
    u = unmet(b)
    b.remove("astro/b")                 # R_astro = max(60, 50) = 60: Σ_top R 90
    assert unmet(b) == u - 10
    assert "astro/b" not in b.state()["campaigns"] and "astro/b" not in b.campaigns
    assert "astro/b" not in b.deficits()
    assert b.register("astro/c", env(20)) == 4      # an index is never reused
    assert unmet(b) == u


def test_a_removed_name_is_unknown_and_may_be_registered_again():
    b = astro_bio()
    b.remove("bio")
    with pytest.raises(UnknownCampaign):
        b.acquire(Intent("bio", units={"gpu": (1, 1)}, duration=60))
    with pytest.raises(UnknownCampaign):
        b.supply("bio")
    with pytest.raises(UnknownCampaign):
        b.remove("bio")
    with pytest.raises(UnknownCampaign):
        b.change("bio", env(1))
    assert b.register("bio", env(25)) == 4
    assert b.state()["campaigns"]["bio"]["envelope"]["guaranteed"]["gpu"] == 25


def test_a_parent_whose_children_are_removed_may_be_removed():
    b = astro_bio()
    b.remove("astro/b")
    with pytest.raises(InvalidArgument, match="^name: has children"):
        b.remove("astro")
    lease = b.leases("astro/a")[0]
    b.release(lease.id)
    b.remove("astro/a")
    b.remove("astro")
    assert b.campaigns == ["bio"]
    assert unmet(b) == 30
    assert b.register("astro", env(70)) == 4


def test_replay_reproduces_the_state_after_removals():
    j = MemoryJournal()
    b = astro_bio(j)
    b.clock.advance(5)
    b.remove("astro/b")
    b.register("astro/b", env(15, 20, 30, 100))
    b.change("astro/b", env(10, 20, 30, 100))
    b.clock.advance(5)
    b.remove("bio")
    assert b.acquire(Intent("astro/b", units={"gpu": (5, 20)}, duration=60)).granted
    ops = [j.record(i)["op"] for i in range(len(j))]
    assert ops.count("remove") == 2
    assert "was removed" in b.explain(ops.index("remove"))
    r = Broker.replay(j)
    assert r.state() == b.state() and r.campaigns == b.campaigns


def test_siblings_share_sums_do_not_count_a_removed_node():
    """SPEC §14.6: astro/a and astro/b share astro's part equally until astro/b is removed;
    then astro/a has it all (no usage yet: its level deficit is its share's fraction)."""
    b = Broker(Pool(gpu=100), clock=ManualClock(0.0))
    b.register("astro", env(60))
    b.register("astro/a", Envelope(credits=1e6, guaranteed={"gpu": 10}, share=1.0))
    b.register("astro/b", Envelope(credits=1e6, guaranteed={"gpu": 10}, share=1.0))
    assert b.deficits()["astro/a"] == 0.5
    b.remove("astro/b")
    assert b.deficits() == {"astro": 1.0, "astro/a": 1.0}


def test_a_batch_may_not_name_a_removed_node():
    b = astro_bio()
    b.remove("bio")
    before = b.state()
    with pytest.raises(InvalidArgument) as e:
        b.admit_batch([2, 3], [1, 1], 60.0)
    assert e.value.field == "campaign_idx" and "removed" in str(e.value)
    assert b.state() == before


def test_a_flow_dimensions_figures_stay_as_registered():
    """SPEC §14.9: the flow engine fixes a flow dimension's figures at registration."""
    b = Broker(Pool(gpu=10, flow={"fs": 5.0}), clock=ManualClock(0.0))
    b.register("a", Envelope(credits=10, guaranteed={"gpu": 1, "fs": 1.0},
                             sustained={"fs": 2.0}, burst={"fs": 4.0}))
    before = b.state()
    with pytest.raises(InvalidArgument) as e:
        b.change("a", Envelope(credits=10, guaranteed={"gpu": 2, "fs": 1.0},
                               sustained={"fs": 2.0}, burst={"fs": 8.0}))
    assert e.value.field == "burst[fs]" and "fixed at registration" in e.value.rule
    assert b.state() == before
    b.change("a", Envelope(credits=10, guaranteed={"gpu": 2, "fs": 1.0},
                           sustained={"fs": 2.0}, burst={"fs": 4.0}))
    assert b.envelopes["a"].guaranteed["gpu"] == 2
