"""Flow engine, table tests with numbers worked by hand (every backend), SPEC §5.

The running example: ``fs`` has capacity 28 units/s, window 1 s. Campaign A: g=2, s=6,
b=16, B=3600, so buckets G (rate 2, size 2), S (rate 6, size 3600), P (rate 16, size 16).
Campaign B: g=1. The facility bucket F then refills at 28 − 3 = 25 units/s, size 25.
Units the guaranteed bucket serves are charged to S and P as far as they hold tokens.
"""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest

from bursarcore import units
from bursarcore.errors import InvalidArgument, TimeWentBackwards
from bursarcore.flow import (BOUND_NAMES, FLOW_BACKENDS, NEVER, FlowEngine,
                             ReferenceFlowEngine)

U = units.SCALE
NS = units.NS


@pytest.fixture(params=sorted(FLOW_BACKENDS))
def FE(request):  # noqa: N802 - a class
    return FLOW_BACKENDS[request.param]


def copy(fe):
    return type(fe).from_state(fe.state)


def example(FE):  # noqa: N803
    fe = FE({"fs": 28.0, "inference": 5000.0}, window=1.0, now=0.0)
    a = fe.add_campaign(guaranteed={"fs": 2}, sustained={"fs": 6}, ceiling={"fs": 16},
                        burst={"fs": 3600}, now=0.0)
    b = fe.add_campaign(guaranteed={"fs": 1}, sustained={"fs": 1}, ceiling={"fs": 1},
                        burst={"fs": 0.5}, now=0.0)
    return fe, a, b


def test_surface():
    assert "reference" in FLOW_BACKENDS and FLOW_BACKENDS["reference"] is ReferenceFlowEngine
    assert FlowEngine is FLOW_BACKENDS.get("compiled", ReferenceFlowEngine)
    assert BOUND_NAMES == ("none", "sustained", "peak", "facility")


def test_construction_and_full_buckets(FE):
    fe, a, b = example(FE)
    assert (a, b, len(fe)) == (0, 1, 2)
    assert fe.dims == ("fs", "inference") and fe.dim_index("inference") == 1
    assert fe.window == 1.0
    np.testing.assert_array_equal(fe.capacity, [28.0, 5000.0])
    np.testing.assert_array_equal(fe.guaranteed_sum, [3.0, 0.0])
    tk = fe.tokens(0.0)
    np.testing.assert_array_equal(tk["guaranteed"], [[2, 0], [1, 0]])
    np.testing.assert_array_equal(tk["sustained"], [[3600, 0], [0.5, 0]])
    np.testing.assert_array_equal(tk["peak"], [[16, 0], [1, 0]])
    np.testing.assert_array_equal(tk["facility"], [25, 5000])


def test_each_bucket_binding_in_turn(FE):
    fe, a, b = example(FE)
    # G gives 2 (charged to S: 3598, P: 14); the rest 8 passes S, P and F (S 3590, P 6)
    assert fe.consume(a, "fs", 10.0, 0.0) == (10.0, 0.0)
    # peak binds: P holds 6. Rest 4: P refills at 16/s, so 0.25 s
    assert fe.consume(a, "fs", 10.0, 0.0) == (6.0, 0.25)
    tk = fe.tokens(0.0)
    assert (tk["guaranteed"][a, 0], tk["sustained"][a, 0], tk["peak"][a, 0]) == (0, 3584, 0)
    assert tk["facility"][0] == 11
    # at 0.5 s: G 1, P 8, F 11 + 12.5; 1 from G (P -> 7), 7 more; the rest 2 needs P: 1/8 s
    assert fe.consume(a, 0, 10.0, 0.5) == (8.0, 0.125)
    # sustained binds: B's S holds 0.5 and G's 1 unit drains it; rest 2, but at most
    # max(G size 1, min(S size 0.5, ...)) = 1 can ever pass at once: G refills it in 1 s
    assert fe.consume(b, "fs", 3.0, 0.5) == (1.0, 1.0)
    # no access on a dimension the campaign did not name
    assert fe.consume(a, "inference", 1.0, 0.5) == (0.0, math.inf)
    assert fe.consume(a, "inference", 0.0, 0.5) == (0.0, 0.0)


def test_facility_binds_and_guaranteed_passes_while_it_is_empty(FE):
    fe = FE({"fs": 10.0}, now=0.0)
    prot = fe.add_campaign(guaranteed={"fs": 2}, sustained={"fs": 20}, burst={"fs": 100})
    # F: rate 10 - 2 = 8, size 8
    hog = fe.add_campaign(sustained={"fs": 50}, ceiling={"fs": 50}, burst={"fs": 1000})
    other = fe.add_campaign(sustained={"fs": 50}, ceiling={"fs": 50}, burst={"fs": 1000})
    assert fe.consume(hog, "fs", 100.0, 0.0) == (8.0, 1.0)          # F empty: 8 more in 1 s
    assert fe.consume(other, "fs", 4.0, 0.0) == (0.0, 0.5)          # facility binds
    assert fe.tokens(0.0)["facility"][0] == 0
    # the guaranteed campaign is not throttled: its G serves it
    assert fe.consume(prot, "fs", 2.0, 0.0) == (2.0, 0.0)
    assert fe.consume(prot, "fs", 1.0, 0.5) == (1.0, 0.0)           # G refilled 1
    assert fe.consume(hog, "fs", 100.0, 0.5) == (4.0, 1.0)          # F refilled 4
    # above its guarantee it needs the facility like anyone: G has 0 left, F has 0
    _, _, bound = fe.consume_fixed(np.array([prot]), np.array([0]), np.array([U]),
                                   np.array([NS // 2]))
    assert BOUND_NAMES[bound[0]] == "facility"


def test_sustained_binding_and_retry(FE):
    fe = FE({"fs": 100.0})
    c = fe.add_campaign(sustained={"fs": 1}, ceiling={"fs": 10}, burst={"fs": 2})
    allowed, retry, bound = fe.consume_fixed(np.array([c]), np.array([0]),
                                             np.array([5 * U]), np.array([0]))
    # S holds 2; the rest 3 is more than S can ever hold (2): 2 pass after 2 s at 1/s
    assert (allowed[0], retry[0], BOUND_NAMES[bound[0]]) == (2 * U, 2 * NS, "sustained")
    assert fe.consume(c, "fs", 5.0, 1.0) == (1.0, 2.0)   # S back to 1; 2 at once in 2 s
    assert fe.consume(c, "fs", 0.5, 1.25) == (0.25, 0.25)


def test_partial_allowance_and_fractional_retry(FE):
    fe = FE({"fs": 3.0})
    c = fe.add_campaign(sustained={"fs": 3}, burst={"fs": 1})       # b defaults to s=3
    assert fe.consume(c, "fs", 0.4, 0.0) == (0.4, 0.0)
    # S holds 0.6; rest 0.4 refills at 3/s: 0.4/3 s = 133_333_334 ns (rounded up)
    allowed, retry = fe.consume(c, "fs", 1.0, 0.0)
    assert allowed == 0.6 and retry == 133_333_334 / NS
    late = copy(fe)
    assert late.consume(c, "fs", 0.4, retry) == (0.4, 0.0)
    early = copy(fe)
    assert early.consume(c, "fs", 0.4, retry - 1e-9)[0] < 0.4


def test_refill_is_exact_and_capped(FE):
    fe = FE({"fs": 10.0}, window=2.0)
    c = fe.add_campaign(guaranteed={"fs": 3}, sustained={"fs": 3}, burst={"fs": 8})
    assert fe.consume(c, "fs", 6.0, 0.0) == (6.0, 0.0)      # G 0 (of 6), S 2, P 0
    # settled at 333_333_333 and 666_666_667 ns: 999_999.999 + 1_000_000.001 micro-units;
    # the remainder carries, so at 1 s G holds exactly 3 units, as if never settled
    fe.consume(c, "fs", 0.0, 333_333_333 / NS)
    assert fe.state["campaigns"][c, 0, 2] == 999_999
    assert fe.state["campaigns"][c, 0, 3] == 999_000_000   # 3e6 * 333_333_333 % 1e9
    fe.consume(c, "fs", 0.0, 666_666_667 / NS)
    tk = fe.tokens(1.0)
    assert (tk["guaranteed"][c, 0], tk["sustained"][c, 0], tk["peak"][c, 0]) == (3, 5, 3)
    tk = fe.tokens(100.0)                                             # capped at the sizes
    assert (tk["guaranteed"][c, 0], tk["sustained"][c, 0], tk["peak"][c, 0]) == (6, 8, 6)
    assert fe.state["campaigns"][c, 0, 2] == 2_000_000   # tokens() is a peek: nothing settled


def test_window_sizes_buckets(FE):
    fe = FE({"fs": 10.0}, window=2.5)
    c = fe.add_campaign(guaranteed={"fs": 2}, sustained={"fs": 4}, ceiling={"fs": 6},
                        burst={"fs": 1})
    tk = fe.tokens(0.0)
    assert (tk["guaranteed"][c, 0], tk["sustained"][c, 0], tk["peak"][c, 0],
            tk["facility"][0]) == (5, 1, 15, 20)


def test_campaign_added_at_run_time_shrinks_facility(FE):
    fe = FE({"fs": 10.0}, now=0.0)
    hog = fe.add_campaign(sustained={"fs": 10}, burst={"fs": 100})
    assert fe.consume(hog, "fs", 10.0, 0.0) == (10.0, 0.0)          # F 0
    # at 0.6 s F earned 6 at the old rate; then its rate is 10 - 4 = 6 and its size 6
    fe.add_campaign(guaranteed={"fs": 4}, now=0.6)
    np.testing.assert_array_equal(fe.guaranteed_sum, [4.0])
    s = fe.state["facility"][0]
    assert (s[0], s[1], s[2]) == (6 * U, 6 * U, 6 * U)
    fe.add_campaign(guaranteed={"fs": 3}, now=0.6)                   # rate 3, size 3: clipped
    s = fe.state["facility"][0]
    assert (s[0], s[1], s[2], s[3]) == (3 * U, 3 * U, 3 * U, 0)
    assert fe.consume(hog, "fs", 4.0, 1.6) == (3.0, 333_333_334 / NS)   # ceil(1e9 / 3) ns


def test_unlimited_burst(FE):
    fe = FE({"fs": 1e6})
    c = fe.add_campaign(sustained={"fs": 1}, ceiling={"fs": 1e6}, burst={"fs": math.inf})
    assert fe.consume(c, "fs", 5e5, 0.0) == (5e5, 0.0)
    assert fe.tokens(0.0)["sustained"][c, 0] == units.MAX_FIXED / U - 5e5


def test_batch_is_sequential_and_equals_single_calls(FE):
    fe, a, b = example(FE)
    camps = [a, b, a, a, b, a]
    dims = [0, 0, 0, 1, 0, 0]
    amounts = [10.0, 3.0, 10.0, 1.0, 0.2, 40.0]
    now = [0.0, 0.0, 0.0, 0.1, 0.5, 0.5]
    single = copy(fe)
    expect = [single.consume(c, d, x, t) for c, d, x, t in zip(camps, dims, amounts, now)]
    allowed, retry = fe.consume_batch(camps, dims, amounts, now)
    assert list(zip(allowed.tolist(), retry.tolist())) == expect
    assert allowed.dtype == retry.dtype == np.float64
    np.testing.assert_array_equal(fe.state["campaigns"], single.state["campaigns"])
    # numpy arrays (the compiled one-pass conversion), strided ones, -0.0
    again = copy(fe)
    amounts = np.array([0.5, -0.0, 2.25, 1e-6, 7.0, 1.0, 9.0, 3.0])
    r1 = fe.consume_batch(np.array(camps[:4]), 0, amounts[::2], 0.6)
    r2 = again.consume_batch(camps[:4], 0, amounts[::2].tolist(), 0.6)
    assert [x.tolist() for x in r1] == [x.tolist() for x in r2]
    # scalars broadcast; a dimension by name
    allowed, retry = fe.consume_batch([a, a], "fs", 1.0, 2.0)
    assert allowed.tolist() == [1.0, 1.0]
    empty = fe.consume_batch([], 0, [], 2.0)
    assert empty[0].shape == empty[1].shape == (0,)


def test_consume_fixed_matches_float_api(FE):
    fe, a, b = example(FE)
    other = copy(fe)
    allowed, retry, bound = fe.consume_fixed(
        np.array([a, a, b, a], dtype=np.int64), np.array([0], dtype=np.int64),
        np.array([10 * U, 10 * U, 3 * U, U], dtype=np.int64), np.array([0], dtype=np.int64))
    assert allowed.tolist() == [10 * U, 6 * U, U, 0]
    assert retry.tolist() == [0, NS // 4, NS, NS // 16]
    assert [BOUND_NAMES[x] for x in bound] == ["none", "peak", "sustained", "peak"]
    f_allowed, f_retry = other.consume_batch([a, a, b, a], 0, [10, 10, 3, 1], 0.0)
    np.testing.assert_array_equal(f_allowed, allowed / U)
    np.testing.assert_array_equal(f_retry, retry / NS)
    _, never, _ = fe.consume_fixed(np.array([a]), np.array([1]), np.array([U]), np.array([0]))
    assert never[0] == NEVER


# -- bad input: an InvalidArgument naming the field, and no state change -----------------------

BAD_CAMPAIGNS = [
    (dict(guaranteed={"fs": 30}), "guaranteed[fs]"),          # 3 + 30 > 28
    (dict(guaranteed={"fs": 3}, sustained={"fs": 2}), "sustained[fs]"),
    (dict(sustained={"fs": 5}, ceiling={"fs": 4}), "ceiling[fs]"),
    (dict(guaranteed={"gpu": 1}), "guaranteed[gpu]"),
    (dict(burst={"fs": math.nan}), "burst[fs]"),
    (dict(burst={"fs": -1}), "burst[fs]"),
    (dict(guaranteed={"fs": "2"}), "guaranteed[fs]"),
    (dict(sustained={"inference": math.inf}), "sustained[inference]"),
    (dict(ceiling=[1.0]), "ceiling"),
    (dict(ceiling={"fs": 2e12}), "ceiling[fs]"),     # a peak bucket of 2e12 x window 4 s
]


@pytest.mark.parametrize("kwargs,field", BAD_CAMPAIGNS)
def test_add_campaign_refuses_bad_envelopes(FE, kwargs, field):
    fe = FE({"fs": 28.0, "inference": 5000.0}, window=4.0)
    fe.add_campaign(guaranteed={"fs": 3})
    before = fe.state
    with pytest.raises(InvalidArgument) as e:
        fe.add_campaign(now=0.0, **kwargs)
    assert e.value.field == field
    assert isinstance(e.value, ValueError)
    np.testing.assert_array_equal(fe.state["facility"], before["facility"])
    assert len(fe) == 1


def test_guarantees_may_fill_the_capacity_exactly(FE):
    fe = FE({"fs": 10.0})
    fe.add_campaign(guaranteed={"fs": 4})
    c = fe.add_campaign(guaranteed={"fs": 6}, sustained={"fs": 8}, burst={"fs": 100})
    assert fe.tokens(0.0)["facility"][0] == 0
    assert fe.consume(c, "fs", 20.0, 0.0) == (6.0, 1.0)  # nothing above g: G refills 6 in 1 s


@pytest.mark.parametrize("args,field,exc", [
    ((5, "fs", 1.0, 0.0), "campaign", InvalidArgument),
    ((-1, "fs", 1.0, 0.0), "campaign", InvalidArgument),
    ((0.0, "fs", 1.0, 0.0), "campaign", InvalidArgument),
    ((0, "gpu", 1.0, 0.0), "dim", InvalidArgument),
    ((0, 2, 1.0, 0.0), "dim", InvalidArgument),
    ((0, "fs", math.nan, 0.0), "amount", InvalidArgument),
    ((0, "fs", -1.0, 0.0), "amount", InvalidArgument),
    ((0, "fs", None, 0.0), "amount", InvalidArgument),
    ((0, "fs", 1.0, math.nan), "now", InvalidArgument),
    ((0, "fs", 1.0, -1.0), "now", TimeWentBackwards),
])
def test_consume_refuses_bad_input(FE, args, field, exc):
    fe, a, b = example(FE)
    before = fe.state
    with pytest.raises(exc) as e:
        fe.consume(*args)
    assert e.value.field == field
    np.testing.assert_array_equal(fe.state["campaigns"], before["campaigns"])
    np.testing.assert_array_equal(fe.state["facility"], before["facility"])


@pytest.mark.parametrize("args,field,exc", [
    (([0, 7], 0, 1.0, 0.0), "campaigns", InvalidArgument),
    (([0, 1], [0, 5], 1.0, 0.0), "dims", InvalidArgument),
    (([0, 1], [0], 1.0, 0.0), "dims", InvalidArgument),
    (([0, 1], "gpu", 1.0, 0.0), "dims", InvalidArgument),
    (([0, 1], 0, [1.0, math.nan], 0.0), "amounts", InvalidArgument),
    (([0, 1], 0, [1.0, -2.0], 0.0), "amounts", InvalidArgument),
    ((np.array([0, 1]), 0, np.ones(3), 0.0), "amounts", InvalidArgument),
    ((np.array([0, 1]), 0, np.ones(1), 0.0), "amounts", InvalidArgument),
    ((np.array([0, 1]), 0, np.array([1.0, np.nan]), 0.0), "amounts", InvalidArgument),
    ((np.array([0, 1]), 0, np.array([1.0, np.inf]), 0.0), "amounts", InvalidArgument),
    ((np.array([0, 1]), 0, np.array([-0.5, 1.0]), 0.0), "amounts", InvalidArgument),
    ((np.array([0, 9]), 0, np.array([1.0, np.nan]), 0.0), "campaigns", InvalidArgument),
    (([0, 1], 0, 1.0, [1.0, 0.5]), "now", TimeWentBackwards),
    (([0, 1], 0, 1.0, -1.0), "now", TimeWentBackwards),
    (([0, 1], 0, 1.0, [0.0]), "now", InvalidArgument),
])
def test_batch_refuses_bad_input_before_any_change(FE, args, field, exc):
    fe, a, b = example(FE)
    fe.consume(a, "fs", 1.0, 0.0)
    before = fe.state
    with pytest.raises(exc) as e:
        fe.consume_batch(*args)
    assert e.value.field == field
    np.testing.assert_array_equal(fe.state["campaigns"], before["campaigns"])


@pytest.mark.parametrize("capacity,window,field", [
    ({}, 1.0, "capacity"),
    ({"fs": -1}, 1.0, "capacity[fs]"),
    ({"fs": math.nan}, 1.0, "capacity[fs]"),
    ({"": 1.0}, 1.0, "capacity"),
    ({"fs": 1.0}, 0.0, "window"),
    ({"fs": 1.0}, -1.0, "window"),
    ({"fs": 1e12}, 1e4, "capacity[fs]"),
])
def test_construction_refuses_bad_input(FE, capacity, window, field):
    with pytest.raises(InvalidArgument) as e:
        FE(capacity, window=window)
    assert e.value.field == field


def test_time_never_goes_backwards(FE):
    fe, a, b = example(FE)
    fe.consume(a, "fs", 1.0, 5.0)
    for call in (lambda: fe.consume(b, "fs", 1.0, 4.0), lambda: fe.tokens(4.9),
                 lambda: fe.add_campaign(now=1.0)):
        with pytest.raises(TimeWentBackwards):
            call()


# -- state -----------------------------------------------------------------------------------

def test_state_round_trip_and_pickle(FE):
    fe, a, b = example(FE)
    fe.consume(a, "fs", 20.0, 0.3)
    for make in (copy, lambda x: pickle.loads(pickle.dumps(x))):
        other, again = make(fe), copy(fe)
        assert type(other) is type(fe)
        s, o = fe.state, other.state
        assert s["dims"] == o["dims"] and s["watermark"] == o["watermark"]
        np.testing.assert_array_equal(s["campaigns"], o["campaigns"])
        np.testing.assert_array_equal(s["facility"], o["facility"])
        assert other.consume(a, "fs", 5.0, 1.0) == again.consume(a, "fs", 5.0, 1.0)
    for name, cls in FLOW_BACKENDS.items():   # any backend reads any backend's state
        assert cls.from_state(fe.state).consume(b, "fs", 1.0, 1.0) == \
            copy(fe).consume(b, "fs", 1.0, 1.0)


@pytest.mark.parametrize("mutate,field", [
    (lambda s: s.pop("window"), "state.window"),
    (lambda s: s.update(dims=()), "state.dims"),
    (lambda s: s["campaigns"].__setitem__((0, 0, 2), 3 * U), "state.campaigns.guaranteed"),
    (lambda s: s["facility"].__setitem__((0, 1), 1), "state.facility"),
    (lambda s: s["campaigns"].__setitem__((0, 0, 12), 10**12), "state"),
    (lambda s: s.update(capacity=np.zeros(3, dtype=np.int64)), "state.capacity"),
])
def test_from_state_refuses_inconsistent_state(FE, mutate, field):
    fe, a, b = example(FE)
    s = fe.state
    mutate(s)
    with pytest.raises(InvalidArgument) as e:
        FE.from_state(s)
    assert e.value.field == field
