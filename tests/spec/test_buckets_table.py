"""Token buckets, table tests with numbers worked by hand (every backend).

Integers in comments are the kernel's: tokens in micro-units (1 unit = 1_000_000), time in
ns, the refill remainder in micro-unit-nanoseconds (SPEC §2). Hypothesis then generalises
the exact-refill, time_until and batch cases.
"""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

from bursarcore import _backend, units
from bursarcore.errors import TimeWentBackwards
from bursarcore.buckets import BACKENDS, ReferenceTokenBuckets, TokenBuckets

U = units.SCALE  # micro-units per unit
S = units.NS     # ns per second


def same_state(a: dict, b: dict) -> None:
    assert set(a) == set(b) == {"capacity", "rate", "tokens", "remainder", "last", "watermark"}
    assert type(a["watermark"]) is int and a["watermark"] == b["watermark"]
    for key in ("capacity", "rate", "tokens", "remainder", "last"):
        assert a[key].dtype == np.int64 and b[key].dtype == np.int64, key
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def copy(b):
    return type(b).from_state(b.state)


# -- module surface --------------------------------------------------------------------------
def test_backends_and_default_class():
    assert "reference" in BACKENDS
    assert BACKENDS["reference"] is ReferenceTokenBuckets
    # the default is the one BURSARCORE_BACKEND asks for, else the fastest present
    assert (_backend.REQUESTED or list(BACKENDS)[0]) == TokenBuckets.backend
    for name, cls in BACKENDS.items():
        assert cls.backend == name


# -- construction ----------------------------------------------------------------------------
def test_construct_starts_full(TB):
    b = TB([10, 5], [1, 0.5])
    assert len(b) == 2
    np.testing.assert_array_equal(b.capacity, [10.0, 5.0])
    np.testing.assert_array_equal(b.rate, [1.0, 0.5])
    np.testing.assert_array_equal(b.tokens(0.0), [10.0, 5.0])
    s = b.state
    np.testing.assert_array_equal(s["capacity"], [10 * U, 5 * U])
    np.testing.assert_array_equal(s["rate"], [1 * U, U // 2])
    np.testing.assert_array_equal(s["tokens"], [10 * U, 5 * U])
    np.testing.assert_array_equal(s["remainder"], [0, 0])
    np.testing.assert_array_equal(s["last"], [0, 0])
    assert s["watermark"] == 0


def test_construct_tokens_now_and_scalars(TB):
    b = TB([10, 4], 2.0, tokens=[3, 4], now=2.5)  # scalar rate broadcasts
    s = b.state
    np.testing.assert_array_equal(s["rate"], [2 * U, 2 * U])
    np.testing.assert_array_equal(s["tokens"], [3 * U, 4 * U])
    np.testing.assert_array_equal(s["last"], [2_500_000_000] * 2)
    assert s["watermark"] == 2_500_000_000
    np.testing.assert_array_equal(b.tokens(3.0), [4.0, 4.0])  # 3 + 2*0.5
    one = TB(7, 1)  # scalar capacity: one bucket
    assert len(one) == 1 and one.tokens(0.0).tolist() == [7.0]
    neg = TB([1], [1], tokens=[0], now=-2.0)  # time may start before 0
    assert neg.tokens(-1.5).tolist() == [0.5]


def test_construct_empty_then_append(TB):
    b = TB([], [])
    assert len(b) == 0
    assert b.tokens(0.0).shape == (0,)
    assert b.try_debit_batch([], [], 0.0).shape == (0,)
    assert b.append(3, 1) == 0
    assert b.tokens(1.0).tolist() == [3.0]


# -- try_debit ---------------------------------------------------------------------------------
def test_try_debit_table(TB):
    b = TB([10], [1])
    assert b.try_debit(0, 4, 0.0) is True          # 10 -> 6
    assert b.try_debit(0, 7, 0.0) is False         # 6 < 7: refused, nothing taken
    assert b.tokens(0.0).tolist() == [6.0]
    assert b.try_debit(0, 0, 0.0) is True          # zero always passes
    assert b.tokens(1.5).tolist() == [7.5]         # +1.5 s at 1/s
    assert b.try_debit(0, 7.5, 1.5) is True        # exactly all of it
    assert b.state["tokens"].tolist() == [0]
    assert b.try_debit(0, 1e-6, 1.5) is False      # not one micro-unit left
    assert b.try_debit(0, 1e-6, 1.500001) is True  # 1 µs at 1/s refills exactly 1 micro-unit
    assert b.tokens(100.0).tolist() == [10.0]      # capped at capacity
    s = b.state
    assert s["last"].tolist() == [1_500_001_000] and s["watermark"] == 1_500_001_000


def test_try_debit_refused_still_settles(TB):
    b = TB([10], [1], tokens=[0])
    assert b.try_debit(0, 5, 2.0) is False
    s = b.state
    assert s["tokens"].tolist() == [2 * U] and s["last"].tolist() == [2 * S]


def test_try_debit_accepts_ints_and_numpy_scalars(TB):
    b = TB([10], [1])
    assert b.try_debit(np.int64(0), np.float64(2.5), np.float32(1.0)) is True
    assert b.try_debit(0, 1, 2) is True            # ints for amount and now
    assert b.tokens(2).tolist() == [7.5]           # 10 - 2.5, then +1 (1 s) - 1


# -- try_debit_batch ---------------------------------------------------------------------------
def test_batch_scalar_now_sequential(TB):
    b = TB([10, 4], [1, 1])
    got = b.try_debit_batch([0, 0, 0, 1, 1], [4, 4, 4, 3, 3], 0.0)
    assert got.dtype == np.bool_
    assert got.tolist() == [True, True, False, True, False]  # each sees those before it
    assert b.tokens(0.0).tolist() == [2.0, 1.0]


def test_batch_scalar_amount_array_now(TB):
    b = TB([10, 4], [1, 1])
    # bucket 0 at t=0 and t=3, bucket 1 at t=1: not sorted overall, but per bucket it is
    got = b.try_debit_batch([0, 0, 1], 5, [0.0, 3.0, 1.0])
    assert got.tolist() == [True, True, False]     # 10->5; 5+3=8->3; 4 < 5
    assert b.state["last"].tolist() == [3 * S, 1 * S]
    assert b.state["watermark"] == 3 * S
    assert b.tokens(3.0).tolist() == [3.0, 4.0]


def test_batch_refill_between_requests(TB):
    b = TB([2], [1], tokens=[0])
    got = b.try_debit_batch(np.array([0, 0, 0], dtype=np.int32), [1, 1, 1], [0.0, 1.0, 1.5])
    assert got.tolist() == [False, True, False]    # 0; 1->0; 0.5 < 1
    assert b.tokens(2.0).tolist() == [1.0]


def test_batch_equals_single_calls(TB):
    idx = [2, 0, 1, 0, 2, 2, 1]
    amt = [0.5, 3, 1.25, 3, 0.5, 0.5, 4]
    now = [0.1, 0.2, 0.2, 0.9, 1.0, 1.0, 2.0]
    a = TB([1, 5, 1.5], [0.3, 2, 0.25], tokens=[0.2, 5, 1.0])
    c = copy(a)
    got = a.try_debit_batch(idx, amt, now)
    singles = [c.try_debit(i, x, t) for i, x, t in zip(idx, amt, now)]
    assert got.tolist() == singles
    same_state(a.state, c.state)


def test_batch_empty(TB):
    b = TB([1], [1])
    before = b.state
    out = b.try_debit_batch(np.array([], dtype=np.int64), np.array([]), 5.0)
    assert out.shape == (0,) and out.dtype == np.bool_
    same_state(before, b.state)


def test_debit_fixed(TB):
    b = TB([10, 10], [1, 1])
    out = b.debit_fixed(np.array([0, 1, 0], dtype=np.int64),
                        np.array([6 * U, 1, 6 * U], dtype=np.int64),
                        np.array([S], dtype=np.int64))  # one instant for the whole batch
    assert out.tolist() == [True, True, False]
    assert b.state["tokens"].tolist() == [4 * U, 10 * U - 1]
    assert b.state["watermark"] == S


# -- refund ----------------------------------------------------------------------------------
def test_refund_capped_and_returned(TB):
    b = TB([10], [0], tokens=[3])
    assert b.refund(0, 4, 0.0) == 4.0              # 3 -> 7
    assert b.refund(0, 5, 0.0) == 3.0              # only 3 fit
    assert b.tokens(0.0).tolist() == [10.0]
    assert b.refund(0, 1, 0.0) == 0.0              # full: nothing credited
    assert b.refund(0, 0, 0.0) == 0.0


def test_refund_settles_first(TB):
    b = TB([10], [1], tokens=[5])
    assert b.refund(0, 4, 2.0) == 3.0              # settles to 7 first, then 3 fit
    assert b.state["last"].tolist() == [2 * S]


def test_refund_to_full_clears_remainder(TB):
    b = TB([1], [0.3], tokens=[0])
    b.try_debit(0, 0, 1 / 3)                       # 300000 * 333333333 ns
    s = b.state
    assert s["tokens"].tolist() == [99_999] and s["remainder"].tolist() == [999_900_000]
    assert b.refund(0, 2, 1 / 3) == 0.900001       # 1_000_000 - 99_999 micro-units fit
    s = b.state
    assert s["tokens"].tolist() == [U] and s["remainder"].tolist() == [0]


def test_refund_partial_keeps_remainder(TB):
    b = TB([1], [0.3], tokens=[0])
    b.try_debit(0, 0, 1 / 3)
    assert b.refund(0, 0.5, 1 / 3) == 0.5
    assert b.state["remainder"].tolist() == [999_900_000]


# -- tokens (peek) ---------------------------------------------------------------------------
def test_tokens_peek_does_not_mutate(TB):
    b = TB([10, 1], [1, 0.3], tokens=[2, 0], now=1.0)
    before = b.state
    assert b.tokens(5.0).tolist() == [6.0, 1.0]
    assert b.tokens(2.0).tolist() == [3.0, 0.3]
    same_state(before, b.state)
    assert b.tokens(1.5).tolist() == [2.5, 0.15]   # the peek at 5 s did not move time
    assert b.try_debit(0, 3, 2.0) is True          # still allowed at an earlier instant


# -- set_rate --------------------------------------------------------------------------------
def test_set_rate_settles_at_old_rate(TB):
    b = TB([100], [1], tokens=[0])
    b.set_rate(0, 10, 5.0)
    assert b.state["tokens"].tolist() == [5 * U]   # 5 s at the old 1/s
    assert b.state["rate"].tolist() == [10 * U]
    assert b.tokens(6.0).tolist() == [15.0]        # then 10/s
    b.set_rate(0, 0, 6.0)
    assert b.tokens(1000.0).tolist() == [15.0]     # rate 0 freezes the bucket
    np.testing.assert_array_equal(b.rate, [0.0])


def test_set_rate_zero_keeps_remainder(TB):
    b = TB([1], [0.3], tokens=[0])
    b.set_rate(0, 0, 1 / 3)
    s = b.state
    assert s["tokens"].tolist() == [99_999] and s["remainder"].tolist() == [999_900_000]
    b.set_rate(0, 0.3, 10.0)                       # frozen from 1/3 s to 10 s
    assert b.state["tokens"].tolist() == [99_999]
    # then 1 ns at 0.3/s adds 300_000 to the kept 999_900_000: one more micro-unit
    b.try_debit(0, 0, 10.000000001)
    s = b.state
    assert s["tokens"].tolist() == [100_000] and s["remainder"].tolist() == [200_000]


# -- time_until ------------------------------------------------------------------------------
def test_time_until_table(TB):
    b = TB([10, 10, 1], [2, 0, 0.3], tokens=[0, 4, 0])
    before = b.state
    assert b.time_until(0, 3, 0.0) == 1.5
    assert b.time_until(0, 10, 0.0) == 5.0         # exactly the capacity
    assert b.time_until(0, 10.000001, 0.0) == math.inf  # more than it can ever hold
    assert b.time_until(0, 0, 0.0) == 0.0
    assert b.time_until(0, 3, 1.5) == 0.0          # available now
    assert b.time_until(1, 4, 0.0) == 0.0          # rate 0 but enough already
    assert b.time_until(1, 5, 0.0) == math.inf     # rate 0 and not enough
    # 0.3/s: 1 unit needs ceil(1e6 * 1e9 / 300000) = 3_333_333_334 ns
    assert b.time_until(2, 1, 0.0) == 3.333333334
    assert b.time_until(2, 1, 3.0) == 0.333333334  # 0.9 held, 0.1 more
    same_state(before, b.state)                    # time_until never mutates


def test_time_until_counts_the_remainder(TB):
    b = TB([1], [0.3], tokens=[0])
    b.try_debit(0, 0, 1 / 3)                       # 99_999 µ, remainder 999_900_000
    # need (100_000 - 99_999) * 1e9 - 999_900_000 = 100_000; / 300_000/s -> 1 ns
    assert b.time_until(0, 0.1, 1 / 3) == 1e-9


def test_time_until_then_debit_at_ns_level(TB):
    b = TB([1], [0.3], tokens=[0])
    q = units.to_ns(b.time_until(0, 1, 0.0))
    assert q == 3_333_333_334
    early, exact = copy(b), copy(b)
    assert early.try_debit(0, 1, (q - 1) / S) is False
    assert exact.try_debit(0, 1, q / S) is True


def test_time_until_large_values_exact(TB):
    # a 4e12-unit bucket at 333.333333 units/s: ceil(1e18 * 1e9 / 333333333) ns is beyond
    # 2**53, so the float must be the correctly rounded int quotient (the reference's)
    b = TB([4e12], [333.333333], tokens=[0])
    assert b.time_until(0, 1e12, 0.0) == ((10**27 + 333333332) // 333333333) / 10**9
    # a wait beyond 2**62 ns (146 years) is reported as never, as for a zero rate
    slow = TB([4e12], [0.000007], tokens=[0])
    assert slow.time_until(0, 1e12, 0.0) == math.inf               # 1.4e26 ns
    assert slow.time_until(0, 1e-3, 0.0) == ((10**3 * 10**9 + 6) // 7) / 10**9  # small
    # the edge: a wait of exactly 2**62 ns is reported, one more ns is not
    edge = TB.from_state({"capacity": [2**62], "rate": [10**9], "tokens": [0],
                          "remainder": [0], "last": [0], "watermark": 0})
    assert edge.time_until(0, units.from_fixed(2**62), 0.0) == 2**62 / 10**9
    edge2 = TB.from_state({"capacity": [2**62], "rate": [10**9 - 1], "tokens": [0],
                           "remainder": [0], "last": [0], "watermark": 0})
    assert edge2.time_until(0, units.from_fixed(2**62), 0.0) == math.inf
    # rate 1 µ/s, 1_065_019_671 µ short, remainder 571_262_044: the wait is
    # q = 1_065_019_671 * 1e9 - 571_262_044 ns, which a C double cannot hold
    q = 1_065_019_670_428_737_956
    r = TB.from_state({"capacity": [2 * 10**9], "rate": [1], "tokens": [0],
                       "remainder": [571_262_044], "last": [0], "watermark": 0})
    got = r.time_until(0, 1065.019671, 0.0)
    assert got == q / 10**9
    assert got != float(q) / 1e9


def test_refund_large_credit_exact(TB):
    # credited = 2_258_848_920_572_997_260 µ is not a double; the result is int / int
    q = 2_258_848_920_572_997_260
    b = TB.from_state({"capacity": [q], "rate": [0], "tokens": [0], "remainder": [0],
                       "last": [0], "watermark": 0})
    got = b.refund(0, 4e12, 0.0)
    assert got == q / U
    assert got != float(q) / 1e6                   # what C double arithmetic would give


# -- append ----------------------------------------------------------------------------------
def test_append_grows_without_losing_state(TB):
    b = TB([1, 2], [0.3, 1], tokens=[0, 2])
    b.try_debit(0, 0, 1 / 3)                       # leaves a remainder in bucket 0
    b.try_debit(1, 1.5, 1 / 3)
    snapshot = b.state
    for k in range(2, 60):                         # well past the first allocation (16 rows)
        assert b.append(k, k / 10, tokens=k / 2) == k
        assert len(b) == k + 1
        s = b.state
        for key in ("capacity", "rate", "tokens", "remainder", "last"):
            np.testing.assert_array_equal(s[key][:2], snapshot[key], err_msg=key)
    s = b.state
    np.testing.assert_array_equal(s["capacity"][2:], [k * U for k in range(2, 60)])
    np.testing.assert_array_equal(s["rate"][2:], [k * U // 10 for k in range(2, 60)])
    np.testing.assert_array_equal(s["tokens"][2:], [k * U // 2 for k in range(2, 60)])
    np.testing.assert_array_equal(s["last"][2:], [333_333_333] * 58)  # now=None: watermark
    # bucket 59: 29.5 held, then 666_666_667 ns at 5.9/s add 3_933_333 µ (remainder 335_300_000)
    assert b.try_debit(59, 29.5, 1.0) is True
    assert b.try_debit(59, 3.933334, 1.0) is False
    assert b.try_debit(59, 3.933333, 1.0) is True
    assert b.state["remainder"][59] == 335_300_000


def test_append_explicit_now_and_default_full(TB):
    b = TB([1], [1])
    b.try_debit(0, 1, 4.0)
    assert b.append(5, 1) == 1                     # full, last = watermark (4 s)
    assert b.append(5, 1, tokens=0, now=6.0) == 2
    s = b.state
    assert s["tokens"].tolist() == [0, 5 * U, 0]
    assert s["last"].tolist() == [4 * S, 4 * S, 6 * S]
    assert s["watermark"] == 6 * S
    assert b.tokens(7.0).tolist() == [1.0, 5.0, 1.0]


def test_append_before_the_watermark_is_refused_and_changes_nothing(TB):
    b = TB([1], [1])
    b.try_debit(0, 1, 4.0)
    before = b.state
    with pytest.raises(TimeWentBackwards, match="now"):
        b.append(5, 1, now=3.5)
    after = b.state
    assert len(b) == 1
    for key in ("capacity", "tokens", "last"):
        assert after[key].tolist() == before[key].tolist()
    assert b.append(5, 1, now=4.0) == 1            # at the watermark is fine


# -- state and pickling ------------------------------------------------------------------------
def _worked(TB):
    b = TB([10, 1, 4e12], [1, 0.3, 4e12], tokens=[2, 0, 0], now=-1.0)
    b.try_debit_batch([0, 1, 2], [1, 0, 1e12], [0.5, -2 / 3, 0.25])
    b.set_rate(0, 2.5, 1.0)
    b.append(3, 0.7, tokens=1)
    return b


def test_state_round_trip(TB):
    b = _worked(TB)
    s = b.state
    c = TB.from_state(s)
    assert type(c) is TB and len(c) == len(b)
    same_state(s, c.state)
    assert c.try_debit(1, 0.2, 2.0) == b.try_debit(1, 0.2, 2.0)
    same_state(b.state, c.state)


def test_state_is_a_copy(TB):
    b = _worked(TB)
    s = b.state
    s["tokens"][:] = 0
    s["capacity"][:] = 0
    assert b.state["tokens"].tolist() != [0, 0, 0, 0]
    c = TB.from_state(b.state)
    c.try_debit(0, 1, 5.0)
    assert b.state["last"][0] != c.state["last"][0]  # the copy is independent


def test_state_accepts_lists_and_other_int_dtypes(TB):
    b = TB.from_state({"capacity": [10 * U], "rate": np.array([U], dtype=np.int32),
                       "tokens": np.array([U], dtype=np.uint32), "remainder": [5],
                       "last": [S], "watermark": np.int64(2 * S)})
    assert b.tokens(2.0).tolist() == [2.0]
    assert b.state["watermark"] == 2 * S


def test_state_layout_is_shared_by_every_backend(TB):
    s = _worked(TB).state
    for other in BACKENDS.values():
        same_state(s, _worked(other).state)
        same_state(s, other.from_state(s).state)


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_pickle_round_trip(TB, protocol):
    b = _worked(TB)
    c = pickle.loads(pickle.dumps(b, protocol=protocol))
    assert type(c) is TB
    same_state(b.state, c.state)
    assert c.try_debit_batch([0, 3], [1, 1], 3.0).tolist() == \
        b.try_debit_batch([0, 3], [1, 1], 3.0).tolist()
    same_state(b.state, c.state)


# -- exact refill ----------------------------------------------------------------------------
def test_exact_refill_thirds(TB):
    a, c = TB([10], [0.3], tokens=[0]), TB([10], [0.3], tokens=[0])
    a.try_debit(0, 0, 1 / 3)                       # 333_333_333 ns
    assert a.state["tokens"].tolist() == [99_999]
    assert a.state["remainder"].tolist() == [999_900_000]
    a.try_debit(0, 0, 2 / 3)                       # 666_666_667 ns
    c.try_debit(0, 0, 2 / 3)
    # 300_000 * 666_666_667 = 200_000_000_100_000: 200_000 µ and 100_000 left over
    assert c.state["tokens"].tolist() == [200_000]
    assert c.state["remainder"].tolist() == [100_000]
    same_state(a.state, c.state)


def test_exact_refill_sub_step(TB):
    # 1 micro-unit per second: half a second is half a step, kept rather than lost
    a = TB([1], [1e-6], tokens=[0])
    a.try_debit(0, 0, 0.5)
    assert a.state["tokens"].tolist() == [0] and a.state["remainder"].tolist() == [S // 2]
    a.try_debit(0, 0, 1.0)
    assert a.state["tokens"].tolist() == [1] and a.state["remainder"].tolist() == [0]
    assert a.tokens(1.0).tolist() == [1e-6]


def test_fractional_rate(TB):
    b = TB([1], [0.3], tokens=[0])
    assert b.tokens(3.0).tolist() == [0.9]         # 300_000 * 3e9 / 1e9 = 900_000 µ exactly
    assert b.tokens(10.0).tolist() == [1.0]        # capped
    assert b.tokens(1e-9).tolist() == [0.0]        # 300_000 µ·ns: not yet a micro-unit
    assert b.tokens(4e-6).tolist() == [1e-6]       # 1.2e9 µ·ns: one micro-unit


def test_big_numbers_take_the_wide_path(TB):
    # rate * dt beyond int64: 4e18 µ/s * 5e9 ns; the bucket still fills exactly
    b = TB([4e12], [4e12], tokens=[0])
    assert b.tokens(0.5).tolist() == [2e12]
    assert b.try_debit(0, 4e12, 5.0) is True
    # extreme times: from -2**62 ns to +2**62 ns is 2**63 ns, one past int64
    lo, hi = -units.MAX_NS / S, units.MAX_NS / S
    e = TB([1], [1], tokens=[0], now=lo)
    assert e.try_debit(0, 1, hi) is True
    assert e.state["last"].tolist() == [units.MAX_NS]


# -- generalised -----------------------------------------------------------------------------
rates = st.sampled_from([1e-6, 0.3, 1.0, 2.5, 7.0, 1e3, 1e9]) | st.floats(1e-6, 1e3)
capacities = st.sampled_from([1e-6, 1.0, 10.0, 1e6]) | st.floats(1e-6, 1e4)
steps = st.lists(st.integers(0, 3 * S), min_size=1, max_size=6)


@given(cap=capacities, rate=rates, frac=st.floats(0, 1), steps=steps)
def test_settling_in_steps_equals_settling_once(TB, cap, rate, frac, steps):
    a = TB([cap], [rate], tokens=[cap * frac])
    c = copy(a)
    t = 0
    for dt in steps:
        t += dt
        a.set_rate(0, rate, t / S)                 # set_rate to the same rate only settles
    c.try_debit(0, 0, t / S)
    same_state(a.state, c.state)


@given(cap=capacities, rate=rates, frac=st.floats(0, 1), want=st.floats(0, 1.2),
       t0=st.integers(0, 10 * S))
@example(cap=1e6, rate=1e-6, frac=0.0, want=1.0, t0=0)  # 10**21 ns: never
@example(cap=1e6, rate=1e3, frac=0.0, want=1.0, t0=7)   # 10**12 ns: reported
def test_time_until_is_exact_to_the_ns(TB, cap, rate, frac, want, t0):
    b = TB([cap], [rate], tokens=[cap * frac])
    b.try_debit(0, 0, t0 / S)                      # leave a remainder
    amount = cap * want
    wait = b.time_until(0, amount, t0 / S)
    if math.isinf(wait):
        # never: more than the bucket holds, or (SPEC §15) an exact wait beyond 2**62 ns
        s = {k: int(v[0]) for k, v in b.state.items() if k != "watermark"}
        assert s["last"] == t0                     # settled at t0 by the debit of 0
        a = units.to_fixed(amount)
        if a <= s["capacity"] and s["rate"] > 0:
            exact = -(-((a - s["tokens"]) * S - s["remainder"]) // s["rate"])
            assert exact > units.MAX_NS
        return
    assume(wait < 1e6)                             # ns-exact float times below this
    q = units.to_ns(wait)
    assert units.to_ns((t0 + q) / S) == t0 + q
    assert copy(b).try_debit(0, amount, (t0 + q) / S) is True
    if q > 0:
        assert units.to_ns((t0 + q - 1) / S) == t0 + q - 1
        assert copy(b).try_debit(0, amount, (t0 + q - 1) / S) is False


@given(data=st.data(), n=st.integers(1, 4))
def test_batch_equals_singles_generalised(TB, data, n):
    caps = data.draw(st.lists(capacities, min_size=n, max_size=n))
    rts = data.draw(st.lists(rates, min_size=n, max_size=n))
    a = TB(caps, rts, tokens=[0.5 * c for c in caps])
    c = copy(a)
    k = data.draw(st.integers(0, 12))
    idx = data.draw(st.lists(st.integers(0, n - 1), min_size=k, max_size=k))
    amt = data.draw(st.lists(st.floats(0, 20), min_size=k, max_size=k))
    # per-bucket non-decreasing times, interleaved across buckets
    t = {}
    now = []
    for i in idx:
        t[i] = t.get(i, 0) + data.draw(st.integers(0, S))
        now.append(t[i] / S)
    got = a.try_debit_batch(idx, amt, now)
    assert got.tolist() == [c.try_debit(i, x, w) for i, x, w in zip(idx, amt, now)]
    same_state(a.state, c.state)


def test_batch_survives_a_concurrent_append(TB):
    # A batch must not run with the rows unlocked: an append() in another thread that
    # grows the table would move them, and the batch's debits would land in freed memory.
    import threading

    n = 1_000_000 if TB.backend != "reference" else 20_000
    idx = np.zeros(n, dtype=np.int64)
    amt = np.ones(n, dtype=np.int64)               # one micro-unit each
    ts = np.arange(n, dtype=np.int64)              # one ns apart
    for _ in range(3):
        b = TB([1e6], [1.0])
        start = threading.Barrier(2)

        def grow(b=b, start=start):
            start.wait()
            for _ in range(500):
                b.append(1, 1)

        t = threading.Thread(target=grow)
        t.start()
        start.wait()
        out = b.debit_fixed(idx, amt, ts)
        t.join()
        assert out.all()
        s = b.state
        assert len(b) == 501
        assert s["last"][0] == n - 1 and s["watermark"] == n - 1
        # full 1e12 µ, less n debits of 1 µ, plus (n - 1) ns of refill at 1 µ per 1000 ns
        assert s["tokens"][0] == 10**12 - n + (n - 1) // 1000
