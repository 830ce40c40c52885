"""Conversion at the API edge (SPEC §2): float seconds and units to int ns and fixed point.

Every backend must see the same integers for the same floats, so the scalar (Python), the
array (numpy) and the compiled inline conversions are checked against each other.
"""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bursarcore import units
from bursarcore.errors import InvalidArgument

MAX_S = units.MAX_NS / units.NS      # 4611686018.427388 s
MAX_U = units.MAX_FIXED / units.SCALE  # 4611686018427.388 units


def test_constants():
    assert units.NS == 10**9 and units.SCALE == 10**6
    assert units.MAX_NS == units.MAX_FIXED == 2**62
    # a value of either bound fits int64 with room for one more; the difference of two
    # times can reach 2**63, which the kernels take in 128 bits (see test_buckets_table)
    assert units.MAX_NS + units.MAX_FIXED == 2**63


@pytest.mark.parametrize("seconds,ns", [
    (0.0, 0), (-0.0, 0), (1.5, 1_500_000_000), (-2.0, -2_000_000_000), (1e-9, 1), (3, 3 * 10**9),
    (1 / 3, 333_333_333), (2 / 3, 666_666_667), (np.float32(0.5), 500_000_000),
    (np.int64(7), 7 * 10**9), (Fraction(1, 4), 250_000_000),
    # round half to even on the IEEE product: these products are exactly k + 0.5
    (5e-10, 0), (1.5e-9, 2), (2.5e-9, 2), (3.5e-9, 4), (-2.5e-9, -2),
    (MAX_S, units.MAX_NS), (-MAX_S, -units.MAX_NS),
])
def test_to_ns(seconds, ns):
    got = units.to_ns(seconds)
    assert type(got) is int and got == ns


@pytest.mark.parametrize("amount,fixed", [
    (0.0, 0), (-0.0, 0), (0.3, 300_000), (1e-6, 1), (2, 2_000_000), (12.345678, 12_345_678),
    (np.float64(0.25), 250_000), (Fraction(3, 8), 375_000),
    (5e-7, 0), (1.5e-6, 2), (2.5e-6, 2), (3.5e-6, 4),
    (MAX_U, units.MAX_FIXED),
])
def test_to_fixed(amount, fixed):
    got = units.to_fixed(amount)
    assert type(got) is int and got == fixed


@pytest.mark.parametrize("value,rule", [
    (math.nan, "finite"), (math.inf, "finite"), (-math.inf, "finite"),
    (math.nextafter(MAX_S, math.inf), "within"), (-math.nextafter(MAX_S, math.inf), "within"),
    (10**400, "within"), (-(10**400), "within"), (Fraction(10**400, 3), "within"),
    ("1", "real"), (None, "real"), (Decimal("1"), "real"), (1j, "real"), ([1.0], "real"),
    (True, "real"), (np.bool_(False), "real"),
])
def test_to_ns_refuses(value, rule):
    with pytest.raises(InvalidArgument) as e:
        units.to_ns(value, "deadline")
    assert e.value.field == "deadline" and rule in e.value.rule


def test_to_ns_allow_negative():
    assert units.to_ns(-1.0) == -10**9
    with pytest.raises(InvalidArgument) as e:
        units.to_ns(-1.0, "duration", allow_negative=False)
    assert e.value.field == "duration" and e.value.rule == "must be >= 0"
    assert units.to_ns(0.0, allow_negative=False) == 0
    assert units.to_ns(-0.0, allow_negative=False) == 0


@pytest.mark.parametrize("value,rule", [
    (math.nan, "finite"), (math.inf, "finite"), (-math.inf, "finite"), (-1e-9, ">= 0"),
    (-1, ">= 0"), (math.nextafter(MAX_U, math.inf), "<="), (1e13, "<="), (10**400, "<="),
    (-(10**400), ">= 0"), ("0.5", "real"), (None, "real"), (Decimal("0.5"), "real"),
])
def test_to_fixed_refuses(value, rule):
    with pytest.raises(InvalidArgument) as e:
        units.to_fixed(value, "credits")
    assert e.value.field == "credits" and rule in e.value.rule


def test_ns_array():
    a = units.ns_array([0.0, 1.5, -2.5e-9, 2.5e-9])
    assert a.dtype == np.int64 and a.tolist() == [0, 1_500_000_000, -2, 2]
    b = units.ns_array(0.25, n=3)  # a scalar broadcasts to n
    assert b.dtype == np.int64 and b.tolist() == [250_000_000] * 3
    assert units.ns_array(np.array([1, 2], dtype=np.int32), n=2).tolist() == [10**9, 2 * 10**9]
    assert units.ns_array([], n=0).shape == (0,)
    assert units.ns_array(1.0, n=0).shape == (0,)


@pytest.mark.parametrize("values,n,rule", [
    ([1.0, math.nan], None, "finite"), ([math.inf], 1, "finite"), ([5e9], None, "within"),
    ([1.0, 2.0], 3, "shape (3,)"), ([[1.0]], None, "one-dimensional"), ([[1.0]], 1, "shape"),
    (1.0, None, "one-dimensional"), (["1"], None, "numeric"), ([None], None, "numeric"),
    ([10**400], None, "numeric"),
])
def test_ns_array_refuses(values, n, rule):
    with pytest.raises(InvalidArgument) as e:
        units.ns_array(values, "when", n)
    assert e.value.field == "when" and rule in e.value.rule


def test_array_errors_name_the_position():
    with pytest.raises(InvalidArgument) as e:
        units.fixed_array([1.0, 2.0, -3.0], "amounts")
    assert "at position 2" in str(e.value.value)
    with pytest.raises(InvalidArgument) as e:
        units.ns_array([0.0, math.nan], "now")
    assert "at position 1" in str(e.value.value)


def test_fixed_array():
    a = units.fixed_array([0.3, 1e-6, 2.5e-6, 0])
    assert a.dtype == np.int64 and a.tolist() == [300_000, 1, 2, 0]
    assert units.fixed_array(2, n=2).tolist() == [2_000_000] * 2
    with pytest.raises(InvalidArgument, match="not booleans"):
        units.fixed_array(np.array([True, False]))


@pytest.mark.parametrize("values,n,rule", [
    ([1.0, -1.0], None, ">= 0"), ([1e13], None, "<="), ([math.nan], None, "finite"),
    ([1.0], 2, "shape (2,)"), (["a"], None, "numeric"),
])
def test_fixed_array_refuses(values, n, rule):
    with pytest.raises(InvalidArgument) as e:
        units.fixed_array(values, "amounts", n)
    assert e.value.field == "amounts" and rule in e.value.rule


def test_index_array():
    a = units.index_array([2, 0, 1], 3)
    assert a.dtype == np.int64 and a.flags.c_contiguous and a.tolist() == [2, 0, 1]
    strided = np.arange(10, dtype=np.int32)[::3]
    b = units.index_array(strided, 10)
    assert b.dtype == np.int64 and b.flags.c_contiguous and b.tolist() == [0, 3, 6, 9]
    assert units.index_array([], 0).dtype == np.int64
    assert units.index_array(np.array([], dtype=float), 5).shape == (0,)
    assert units.index_array(np.array([4], dtype=np.uint8), 5).tolist() == [4]


@pytest.mark.parametrize("values,size,rule", [
    ([0, 3], 3, "out of range"), ([-1], 3, "out of range"), ([0], 0, "out of range"),
    (np.array([2**64 - 1], dtype=np.uint64), 3, "out of range"), ([2**70], 3, "integers"),
    ([0.0], 3, "integers"), ([True], 3, "integers"), (0, 3, "one-dimensional"),
    ([[0]], 3, "one-dimensional"),
])
def test_index_array_refuses(values, size, rule):
    with pytest.raises(InvalidArgument) as e:
        units.index_array(values, size, "idx")
    assert e.value.field == "idx" and rule in e.value.rule


def test_back_to_float():
    assert units.from_ns(1_500_000_000) == 1.5
    assert units.from_fixed(300_000) == 0.3
    assert units.from_fixed(units.to_fixed(12.345678)) == 12.345678


# -- every conversion path gives the same integers -----------------------------------------
seconds = st.floats(-MAX_S, MAX_S) | st.floats(-10, 10) | st.integers(-10**6, 10**6).map(
    lambda k: k * 0.5e-9)
amounts = st.floats(0, MAX_U) | st.floats(0, 10) | st.integers(0, 10**6).map(lambda k: k * 0.5e-6)


@given(x=seconds)
def test_scalar_and_array_ns_agree(x):
    assert units.ns_array([x])[0] == units.to_ns(x)
    assert units.ns_array(x, n=1)[0] == units.to_ns(x)


@given(x=amounts)
def test_scalar_and_array_fixed_agree(x):
    assert units.fixed_array([x])[0] == units.to_fixed(x)


@given(x=seconds)
def test_backend_reads_time_like_units(TB, x):
    # the compiled backend converts a Python float inline (llrint); it must match to_ns
    b = TB([1], [1], now=x)
    assert b.state["last"][0] == units.to_ns(x)
    c = TB([1], [1], now=-MAX_S)
    c.try_debit(0, 0, x)
    assert c.state["last"][0] == units.to_ns(x)
    assert c.state["watermark"] == units.to_ns(x)


@given(x=amounts)
def test_backend_reads_amounts_like_units(TB, x):
    b = TB([], [])
    b.append(x, x, tokens=x)
    s = b.state
    assert s["capacity"][0] == s["rate"][0] == s["tokens"][0] == units.to_fixed(x)
    c = TB([MAX_U], [0], tokens=[MAX_U])
    c.try_debit(0, x, 0.0)
    assert c.state["tokens"][0] == units.MAX_FIXED - units.to_fixed(x)
