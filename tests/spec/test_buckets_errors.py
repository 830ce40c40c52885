"""Bad input to token buckets: every path raises InvalidArgument naming the field, and
nothing changes (every backend)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from bursarcore import units
from bursarcore.errors import BursarError, InvalidArgument, TimeWentBackwards

NAN, INF = float("nan"), float("inf")
BIG = 10**400                      # an int no float can hold
HUGE = 1e13                        # above MAX_FIXED / SCALE (4.6e12 units)
LATE = 5e9                         # above MAX_NS / NS (4.6e9 s)


def same_state(a: dict, b: dict) -> None:
    assert set(a) == set(b)
    assert a["watermark"] == b["watermark"]
    for key in ("capacity", "rate", "tokens", "remainder", "last"):
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def worked(TB):
    """Three buckets last updated at 2 s, 0 s and 1 s (watermark 2 s)."""
    b = TB([10, 5, 1], [1, 0.5, 0.3], tokens=[4, 5, 0])
    b.try_debit(0, 1, 2.0)
    b.try_debit(2, 0, 1.0)
    return b


def check(exc_info, field, kind=InvalidArgument):
    e = exc_info.value
    assert type(e) is kind
    assert isinstance(e, InvalidArgument) and isinstance(e, ValueError)
    assert isinstance(e, BursarError)
    assert e.field == field
    assert str(e).startswith(f"{field}: ")
    back = pickle.loads(pickle.dumps(e))  # field and rule survive a process boundary
    assert (type(back), back.field, back.rule) == (type(e), e.field, e.rule)


# (id, operation on the worked buckets, field, exception type)
OPS = [
    # try_debit: amount
    ("debit-amount-nan", lambda b: b.try_debit(0, NAN, 3.0), "amount", InvalidArgument),
    ("debit-amount-inf", lambda b: b.try_debit(0, INF, 3.0), "amount", InvalidArgument),
    ("debit-amount-minf", lambda b: b.try_debit(0, -INF, 3.0), "amount", InvalidArgument),
    ("debit-amount-neg", lambda b: b.try_debit(0, -1.0, 3.0), "amount", InvalidArgument),
    ("debit-amount-neg-int", lambda b: b.try_debit(0, -1, 3.0), "amount", InvalidArgument),
    ("debit-amount-huge", lambda b: b.try_debit(0, HUGE, 3.0), "amount", InvalidArgument),
    ("debit-amount-bigint", lambda b: b.try_debit(0, BIG, 3.0), "amount", InvalidArgument),
    ("debit-amount-neg-bigint", lambda b: b.try_debit(0, -BIG, 3.0), "amount",
     InvalidArgument),
    ("debit-amount-str", lambda b: b.try_debit(0, "1", 3.0), "amount", InvalidArgument),
    ("debit-amount-none", lambda b: b.try_debit(0, None, 3.0), "amount", InvalidArgument),
    ("debit-amount-np-nan", lambda b: b.try_debit(0, np.float64("nan"), 3.0), "amount",
     InvalidArgument),
    # try_debit: now
    ("debit-now-nan", lambda b: b.try_debit(0, 1, NAN), "now", InvalidArgument),
    ("debit-now-inf", lambda b: b.try_debit(0, 1, INF), "now", InvalidArgument),
    ("debit-now-minf", lambda b: b.try_debit(0, 1, -INF), "now", InvalidArgument),
    ("debit-now-late", lambda b: b.try_debit(0, 1, LATE), "now", InvalidArgument),
    ("debit-now-early", lambda b: b.try_debit(0, 1, -LATE), "now", InvalidArgument),
    ("debit-now-bigint", lambda b: b.try_debit(0, 1, BIG), "now", InvalidArgument),
    ("debit-now-str", lambda b: b.try_debit(0, 1, "3"), "now", InvalidArgument),
    ("debit-now-none", lambda b: b.try_debit(0, 1, None), "now", InvalidArgument),
    ("debit-backwards", lambda b: b.try_debit(0, 1, 1.5), "now", TimeWentBackwards),
    ("debit-backwards-1ns", lambda b: b.try_debit(0, 1, 1.999999999), "now",
     TimeWentBackwards),
    ("debit-backwards-int", lambda b: b.try_debit(2, 1, 0), "now", TimeWentBackwards),
    # try_debit: index
    ("debit-i-neg", lambda b: b.try_debit(-1, 1, 3.0), "i", InvalidArgument),
    ("debit-i-n", lambda b: b.try_debit(3, 1, 3.0), "i", InvalidArgument),
    ("debit-i-huge", lambda b: b.try_debit(10**30, 1, 3.0), "i", InvalidArgument),
    ("debit-i-neg-huge", lambda b: b.try_debit(-(10**30), 1, 3.0), "i", InvalidArgument),
    ("debit-i-np-n", lambda b: b.try_debit(np.int64(3), 1, 3.0), "i", InvalidArgument),
    ("debit-i-float", lambda b: b.try_debit(1.0, 1, 3.0), "i", InvalidArgument),
    ("debit-i-npfloat", lambda b: b.try_debit(np.float64(0), 1, 3.0), "i", InvalidArgument),
    ("debit-i-str", lambda b: b.try_debit("0", 1, 3.0), "i", InvalidArgument),
    ("debit-i-none", lambda b: b.try_debit(None, 1, 3.0), "i", InvalidArgument),
    # refund
    ("refund-amount-nan", lambda b: b.refund(1, NAN, 3.0), "amount", InvalidArgument),
    ("refund-amount-neg", lambda b: b.refund(1, -0.5, 3.0), "amount", InvalidArgument),
    ("refund-amount-huge", lambda b: b.refund(1, HUGE, 3.0), "amount", InvalidArgument),
    ("refund-now-inf", lambda b: b.refund(1, 1, INF), "now", InvalidArgument),
    ("refund-i-n", lambda b: b.refund(3, 1, 3.0), "i", InvalidArgument),
    ("refund-backwards", lambda b: b.refund(0, 1, 1.0), "now", TimeWentBackwards),
    # set_rate
    ("rate-nan", lambda b: b.set_rate(0, NAN, 3.0), "rate", InvalidArgument),
    ("rate-inf", lambda b: b.set_rate(0, INF, 3.0), "rate", InvalidArgument),
    ("rate-neg", lambda b: b.set_rate(0, -1, 3.0), "rate", InvalidArgument),
    ("rate-huge", lambda b: b.set_rate(0, HUGE, 3.0), "rate", InvalidArgument),
    ("rate-bigint", lambda b: b.set_rate(0, BIG, 3.0), "rate", InvalidArgument),
    ("rate-now-nan", lambda b: b.set_rate(0, 1, NAN), "now", InvalidArgument),
    ("rate-i-neg", lambda b: b.set_rate(-1, 1, 3.0), "i", InvalidArgument),
    ("rate-backwards", lambda b: b.set_rate(2, 1, 0.5), "now", TimeWentBackwards),
    # time_until
    ("wait-amount-nan", lambda b: b.time_until(0, NAN, 3.0), "amount", InvalidArgument),
    ("wait-amount-neg", lambda b: b.time_until(0, -1, 3.0), "amount", InvalidArgument),
    ("wait-amount-inf", lambda b: b.time_until(0, INF, 3.0), "amount", InvalidArgument),
    ("wait-now-nan", lambda b: b.time_until(0, 1, NAN), "now", InvalidArgument),
    ("wait-i-n", lambda b: b.time_until(3, 1, 3.0), "i", InvalidArgument),
    ("wait-i-float", lambda b: b.time_until(0.5, 1, 3.0), "i", InvalidArgument),
    ("wait-backwards", lambda b: b.time_until(0, 1, 1.0), "now", TimeWentBackwards),
    # tokens
    ("peek-nan", lambda b: b.tokens(NAN), "now", InvalidArgument),
    ("peek-inf", lambda b: b.tokens(INF), "now", InvalidArgument),
    ("peek-late", lambda b: b.tokens(LATE), "now", InvalidArgument),
    ("peek-str", lambda b: b.tokens("x"), "now", InvalidArgument),
    ("peek-backwards", lambda b: b.tokens(1.5), "now", TimeWentBackwards),
    # try_debit_batch: idx
    ("batch-idx-neg", lambda b: b.try_debit_batch([0, -1], 1, 3.0), "idx", InvalidArgument),
    ("batch-idx-n", lambda b: b.try_debit_batch([0, 3], 1, 3.0), "idx", InvalidArgument),
    ("batch-idx-u64", lambda b: b.try_debit_batch(np.array([2**63], dtype=np.uint64), 1, 3.0),
     "idx", InvalidArgument),
    ("batch-idx-bigint", lambda b: b.try_debit_batch([2**70], 1, 3.0), "idx", InvalidArgument),
    ("batch-idx-float", lambda b: b.try_debit_batch([0.0, 1.0], 1, 3.0), "idx",
     InvalidArgument),
    ("batch-idx-bool", lambda b: b.try_debit_batch([True], 1, 3.0), "idx", InvalidArgument),
    ("batch-idx-scalar", lambda b: b.try_debit_batch(0, 1, 3.0), "idx", InvalidArgument),
    ("batch-idx-2d", lambda b: b.try_debit_batch([[0, 1]], 1, 3.0), "idx", InvalidArgument),
    ("batch-idx-str", lambda b: b.try_debit_batch(["0"], 1, 3.0), "idx", InvalidArgument),
    # try_debit_batch: amounts
    ("batch-amounts-len", lambda b: b.try_debit_batch([0, 1], [1, 1, 1], 3.0), "amounts",
     InvalidArgument),
    ("batch-amounts-len1", lambda b: b.try_debit_batch([0, 1], [1], 3.0), "amounts",
     InvalidArgument),
    ("batch-amounts-2d", lambda b: b.try_debit_batch([0, 1], [[1, 1]], 3.0), "amounts",
     InvalidArgument),
    ("batch-amounts-nan", lambda b: b.try_debit_batch([0, 1], [1, NAN], 3.0), "amounts",
     InvalidArgument),
    ("batch-amounts-inf", lambda b: b.try_debit_batch([0, 1], INF, 3.0), "amounts",
     InvalidArgument),
    ("batch-amounts-neg", lambda b: b.try_debit_batch([0, 1], [1, -1e-6], 3.0), "amounts",
     InvalidArgument),
    ("batch-amounts-huge", lambda b: b.try_debit_batch([0, 1], [HUGE, 1], 3.0), "amounts",
     InvalidArgument),
    ("batch-amounts-bigint", lambda b: b.try_debit_batch([0], [BIG], 3.0), "amounts",
     InvalidArgument),
    ("batch-amounts-str", lambda b: b.try_debit_batch([0], ["1"], 3.0), "amounts",
     InvalidArgument),
    # try_debit_batch: now
    ("batch-now-len", lambda b: b.try_debit_batch([0, 1], 1, [3.0]), "now", InvalidArgument),
    ("batch-now-nan", lambda b: b.try_debit_batch([0, 1], 1, [3.0, NAN]), "now",
     InvalidArgument),
    ("batch-now-minf", lambda b: b.try_debit_batch([0, 1], 1, -INF), "now", InvalidArgument),
    ("batch-now-late", lambda b: b.try_debit_batch([0, 1], 1, [3.0, LATE]), "now",
     InvalidArgument),
    ("batch-now-str", lambda b: b.try_debit_batch([0], 1, "3"), "now", InvalidArgument),
    # try_debit_batch: time going backwards
    ("batch-before-last", lambda b: b.try_debit_batch([1, 0], 1, [3.0, 1.0]), "now",
     TimeWentBackwards),
    ("batch-scalar-before-last", lambda b: b.try_debit_batch([1, 0], 1, 1.0), "now",
     TimeWentBackwards),
    ("batch-non-monotone", lambda b: b.try_debit_batch([0, 1, 0], 1, [3.0, 3.0, 2.5]), "now",
     TimeWentBackwards),
    ("batch-valid-then-backwards",
     lambda b: b.try_debit_batch([1, 1, 0, 2], [1, 1, 1, 1], [0.5, 0.6, 2.0, 0.5]), "now",
     TimeWentBackwards),
    ("batch-non-monotone-late",  # the slow path after a clean start
     lambda b: b.try_debit_batch([2, 2, 2], 0, [4.0, 5.0, 4.999999999]), "now",
     TimeWentBackwards),
    # debit_fixed (lengths only)
    ("fixed-len", lambda b: b.debit_fixed(np.array([0, 1], dtype=np.int64),
                                          np.array([1], dtype=np.int64),
                                          np.array([3 * units.NS], dtype=np.int64)),
     "amounts", InvalidArgument),
    ("fixed-now-len", lambda b: b.debit_fixed(np.array([0, 1, 2], dtype=np.int64),
                                              np.array([1, 1, 1], dtype=np.int64),
                                              np.array([3, 4], dtype=np.int64)),
     "amounts", InvalidArgument),
    # append
    ("append-cap-nan", lambda b: b.append(NAN, 1), "capacity", InvalidArgument),
    ("append-cap-neg", lambda b: b.append(-1, 1), "capacity", InvalidArgument),
    ("append-cap-huge", lambda b: b.append(HUGE, 1), "capacity", InvalidArgument),
    ("append-rate-neg", lambda b: b.append(1, -1), "rate", InvalidArgument),
    ("append-rate-inf", lambda b: b.append(1, INF), "rate", InvalidArgument),
    ("append-tokens-over", lambda b: b.append(1, 1, tokens=1.000001), "tokens",
     InvalidArgument),
    ("append-tokens-neg", lambda b: b.append(1, 1, tokens=-1), "tokens", InvalidArgument),
    ("append-now-nan", lambda b: b.append(1, 1, now=NAN), "now", InvalidArgument),
    ("append-now-late", lambda b: b.append(1, 1, now=LATE), "now", InvalidArgument),
]


@pytest.mark.parametrize("op,field,kind", [c[1:] for c in OPS], ids=[c[0] for c in OPS])
def test_bad_operation_changes_nothing(TB, op, field, kind):
    b = worked(TB)
    before = b.state
    n = len(b)
    with pytest.raises(InvalidArgument) as exc_info:
        op(b)
    check(exc_info, field, kind)
    same_state(before, b.state)
    assert len(b) == n
    # and the object still works afterwards
    assert b.try_debit(1, 0.5, 3.0) is True


def test_backwards_is_per_bucket(TB):
    b = worked(TB)
    # bucket 1 was last updated at 0 s, so 1.5 s is fine for it, though 2 s has been seen
    assert b.try_debit(1, 1, 1.5) is True
    # a batch in bucket order is fine even when it is not globally sorted
    assert b.try_debit_batch([0, 1, 2], 0, [2.0, 1.5, 1.0]).tolist() == [True] * 3


# (id, constructor args, field)
CTORS = [
    ("cap-nan", ([NAN], [1]), {}, "capacity"),
    ("cap-inf", ([1, INF], [1, 1]), {}, "capacity"),
    ("cap-neg", ([-1], [1]), {}, "capacity"),
    ("cap-huge", ([HUGE], [1]), {}, "capacity"),
    ("cap-bigint", ([BIG], [1]), {}, "capacity"),
    ("cap-str", (["1"], [1]), {}, "capacity"),
    ("cap-2d", ([[1, 2]], [1, 1]), {}, "capacity"),
    ("rate-nan", ([1], [NAN]), {}, "rate"),
    ("rate-minf", ([1], [-INF]), {}, "rate"),
    ("rate-neg", ([1], [-1]), {}, "rate"),
    ("rate-huge", ([1], HUGE), {}, "rate"),
    ("rate-len", ([1, 2], [1, 1, 1]), {}, "rate"),
    ("tokens-over", ([1, 2], [1, 1]), {"tokens": [1, 2.000001]}, "tokens"),
    ("tokens-neg", ([1], [1]), {"tokens": [-1]}, "tokens"),
    ("tokens-nan", ([1], [1]), {"tokens": NAN}, "tokens"),
    ("tokens-len", ([1, 2], [1, 1]), {"tokens": [1]}, "tokens"),
    ("now-nan", ([1], [1]), {"now": NAN}, "now"),
    ("now-inf", ([1], [1]), {"now": INF}, "now"),
    ("now-late", ([1], [1]), {"now": LATE}, "now"),
    ("now-bigint", ([1], [1]), {"now": -BIG}, "now"),
    ("now-str", ([1], [1]), {"now": "0"}, "now"),
]


@pytest.mark.parametrize("args,kwargs,field", [c[1:] for c in CTORS], ids=[c[0] for c in CTORS])
def test_bad_construction(TB, args, kwargs, field):
    with pytest.raises(InvalidArgument) as exc_info:
        TB(*args, **kwargs)
    check(exc_info, field)


def good_state():
    return {"capacity": np.array([10, 5]) * units.SCALE, "rate": np.array([1, 0]) * units.SCALE,
            "tokens": np.array([4, 5]) * units.SCALE, "remainder": np.array([7, 0]),
            "last": np.array([2, 0]) * units.NS, "watermark": 2 * units.NS}


def _with(**changes):
    s = good_state()
    for key, value in changes.items():
        if value is KeyError:
            del s[key]
        else:
            s[key] = value
    return s


STATES = [
    ("not-dict", [1, 2, 3], "state"),
    ("none", None, "state"),
    *[(f"missing-{k}", _with(**{k: KeyError}), f"state.{k}")
      for k in ("capacity", "rate", "tokens", "remainder", "last", "watermark")],
    ("float-dtype", _with(tokens=np.array([4.0, 5.0]) * units.SCALE), "state.tokens"),
    ("bool-dtype", _with(remainder=np.array([False, False])), "state.remainder"),
    ("object-dtype", _with(capacity=[2**70, 1]), "state.capacity"),
    ("2d", _with(rate=np.zeros((2, 1), dtype=np.int64)), "state.rate"),
    ("scalar", _with(last=np.int64(0)), "state.last"),
    ("lengths", _with(remainder=np.array([0])), "state"),
    ("cap-neg", _with(capacity=np.array([-1, 5 * units.SCALE])), "state.capacity"),
    ("cap-over", _with(capacity=np.array([units.MAX_FIXED + 1, 5 * units.SCALE])),
     "state.capacity"),
    ("cap-u64", _with(capacity=np.array([2**63, 5], dtype=np.uint64)), "state.capacity"),
    ("rate-neg", _with(rate=np.array([1, -1])), "state.rate"),
    ("rate-over", _with(rate=np.array([1, units.MAX_FIXED + 1])), "state.rate"),
    ("tokens-over", _with(tokens=np.array([10 * units.SCALE + 1, 0])), "state.tokens"),
    ("tokens-neg", _with(tokens=np.array([-1, 0])), "state.tokens"),
    ("rem-neg", _with(remainder=np.array([-1, 0])), "state.remainder"),
    ("rem-ns", _with(remainder=np.array([units.NS, 0])), "state.remainder"),
    ("rem-when-full", _with(remainder=np.array([0, 1])), "state.remainder"),
    ("last-after-wm", _with(last=np.array([3 * units.NS, 0])), "state.watermark"),
    ("last-range", _with(last=np.array([-units.MAX_NS - 1, 0])), "state.last"),
    ("last-u64", _with(last=np.array([2**64 - 1, 0], dtype=np.uint64)), "state.last"),
    ("wm-float", _with(watermark=2e9), "state.watermark"),
    ("wm-str", _with(watermark="2000000000"), "state.watermark"),
    ("wm-none", _with(watermark=None), "state.watermark"),
    ("wm-huge", _with(watermark=2**70), "state.watermark"),
    ("wm-low", _with(watermark=-(2**63)), "state.watermark"),
]


@pytest.mark.parametrize("state,field", [c[1:] for c in STATES], ids=[c[0] for c in STATES])
def test_bad_state(TB, state, field):
    with pytest.raises(InvalidArgument) as exc_info:
        TB.from_state(state)
    check(exc_info, field)


def test_good_state_is_good(TB):
    b = TB.from_state(good_state())
    same_state(b.state, good_state())


def test_error_message_survives_unprintable_values():
    e = InvalidArgument("amount", "must be <= 4.6e12", 10**5000)  # int repr limit
    assert str(e).startswith("amount: must be <= 4.6e12 (got ")
    long = InvalidArgument("x", "rule", "y" * 1000)
    assert len(str(long)) < 300


# -- the errors module ---------------------------------------------------------------------------
def test_error_hierarchy():
    from bursarcore.errors import JournalCorrupt, UnknownCampaign, UnknownLease

    for cls in (InvalidArgument, TimeWentBackwards, UnknownCampaign, UnknownLease):
        assert issubclass(cls, BursarError) and issubclass(cls, ValueError)
    assert issubclass(TimeWentBackwards, InvalidArgument)
    for cls in (UnknownCampaign, UnknownLease):
        assert issubclass(cls, KeyError)
        e = cls("campaign", "is not registered", "storm")
        assert str(e) == "campaign: is not registered (got 'storm')"  # not KeyError-quoted
    assert issubclass(JournalCorrupt, BursarError) and not issubclass(JournalCorrupt, ValueError)


@pytest.mark.parametrize("make", [
    lambda: InvalidArgument("amount", "must be >= 0", -1.0),
    lambda: TimeWentBackwards("now", "must be >= 2.0", 1.0),
    lambda: __import__("bursarcore.errors").errors.UnknownCampaign("campaign", "unknown", "x"),
    lambda: __import__("bursarcore.errors").errors.UnknownLease("lease", "unknown", 7),
])
def test_invalid_argument_pickles(make):
    e = make()
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is type(e)
    assert (back.field, back.rule, back.value) == (e.field, e.rule, e.value)
    assert str(back) == str(e)


def test_journal_corrupt_pickles():
    from bursarcore.errors import JournalCorrupt

    e = JournalCorrupt(42, "bad checksum")
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is JournalCorrupt
    assert (back.record, back.problem, str(back)) == (42, "bad checksum", str(e))
