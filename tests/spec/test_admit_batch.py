"""``Broker.admit_batch`` around its compiled loop: the column helpers (``batchprep``,
compiled against the pure-Python reference), input checks done with min/max reductions
(each rule at its boundary, naming the field, changing nothing), victim tracking of
opportunistic grants, per-item classes, and result arrays that stay the caller's."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bursarcore import Broker, Envelope, Intent, ManualClock, Pool, _backend, batchprep
from bursarcore.errors import InvalidArgument
from invariants import next_intent

INF = math.inf
ext = _backend.compiled("_batchprep")
needs_ext = pytest.mark.skipif(ext is None, reason="compiled _batchprep not built "
                               "(BURSARCORE_NO_EXTENSIONS=1)")
I64 = st.integers(-(2**63), 2**63 - 1)
COLUMN = st.lists(I64, min_size=0, max_size=70).map(lambda x: np.array(x, dtype=np.int64))


# ------------------------------------------------------------------ compiled vs reference
def test_backend_follows_the_build():
    assert batchprep.BACKEND == ("compiled" if ext is not None else "reference")


@needs_ext
@given(COLUMN)
def test_minmax_matches_reference(a):
    if a.size == 0:
        for f in (ext.minmax, batchprep.reference_minmax):
            with pytest.raises(ValueError):
                f(a)
        return
    got = ext.minmax(a)
    assert got == batchprep.reference_minmax(a) == (int(a.min()), int(a.max()))
    assert all(type(x) is int for x in got)


@needs_ext
@given(st.lists(st.tuples(I64, I64), max_size=70), st.integers(0, 2**62))
def test_finish_matches_reference(items, iid0):
    out_n = np.array([x[0] for x in items], dtype=np.int64)
    out_l = np.array([x[1] for x in items], dtype=np.int64)
    n1, n2 = out_n.copy(), out_n.copy()
    o1, i1 = ext.finish(n1, out_l, iid0)
    o2, i2 = batchprep.reference_finish(n2, out_l, iid0)
    for a, b in ((o1, o2), (i1, i2), (n1, n2)):
        assert a.dtype == b.dtype == np.int64 and a.tolist() == b.tolist()
    assert o1.tolist() == [int(x < 0) for x in out_l]
    assert n1.tolist() == [0 if l < 0 else n for n, l in zip(out_n, out_l)]
    assert i1.tolist() == list(range(iid0, iid0 + len(items)))
    assert not np.shares_memory(o1, out_l) and not np.shares_memory(i1, o1)


@pytest.mark.parametrize("f", ["minmax", "finish"])
@pytest.mark.parametrize("impl", ["compiled", "reference"])
def test_helpers_refuse_other_columns(f, impl):
    if impl == "compiled" and ext is None:
        pytest.skip("compiled _batchprep not built")
    fn = getattr(ext, f) if impl == "compiled" else getattr(batchprep, f"reference_{f}")
    good = np.arange(6, dtype=np.int64)
    ro = good.copy()
    ro.flags.writeable = False
    for bad in (good.astype(np.int32), good[::2], good.reshape(2, 3), list(good)):
        with pytest.raises(TypeError):
            fn(bad) if f == "minmax" else fn(bad, good, 0)
    if f == "finish":
        with pytest.raises(TypeError):           # out_n is written
            fn(ro, good, 0)
        with pytest.raises(ValueError):
            fn(good.copy(), good[:5].copy(), 0)


# ------------------------------------------------------------------ input checks
def broker(eb, gpu=64):
    b = Broker(Pool(gpu=gpu), clock=ManualClock(0.0), backend=eb)
    for name in ("a", "b"):
        b.register(name, Envelope(credits=INF, sustained={"gpu": gpu}, ceiling={"gpu": gpu},
                                  burst={"gpu": INF}))
    return b


U64 = np.uint64
BAD = [
    # (campaign_idx, units, durations, kwargs, field, rule in the message)
    ([2], [1], 1.0, {}, "campaign_idx", "out of range"),
    ([-1], [1], 1.0, {}, "campaign_idx", "out of range"),
    (np.array([0, 2], np.int64), [1, 1], 1.0, {}, "campaign_idx", "out of range"),
    (np.array([0, -1], np.int64), [1, 1], 1.0, {}, "campaign_idx", "out of range"),
    (np.array([0, 2**63 + 1], U64), [1, 1], 1.0, {}, "campaign_idx", "out of range"),
    (np.zeros((1, 2), np.int64), [1], 1.0, {}, "campaign_idx", "one-dimensional"),
    ([0.0], [1], 1.0, {}, "campaign_idx", "integers"),
    ([0, 1], [1, 0], 1.0, {}, "units", "1 <= min <= max <= 16,777,216"),
    ([0, 1], [1, -3], 1.0, {}, "units", "1 <= min <= max <= 16,777,216"),
    ([0, 1], [1, 2**24 + 1], 1.0, {}, "units", "1 <= min <= max <= 16,777,216"),
    ([0, 1], np.array([1, 2**64 - 1], U64), 1.0, {}, "units", "1 <= min <= max <= 16,777,216"),
    ([0, 1], np.array([1, 2**63], U64), 1.0, {}, "units", "1 <= min <= max <= 16,777,216"),
    ([0, 1], [[1, 2], [3, 2]], 1.0, {}, "units", "1 <= min <= max <= 16,777,216"),
    ([0, 1], [[1, 2], [-1, 2]], 1.0, {}, "units", "1 <= min <= max <= 16,777,216"),
    ([0, 1], [[0, 0], [1, 2]], 1.0, {}, "units", "1 <= min <= max <= 16,777,216"),
    # a grant of no units is no lease: min >= 1
    ([0, 1], [[0, 4], [1, 2]], 1.0, {}, "units", "(0, 4) at position 0"),
    ([0, 1], [[1, 2], [1, 2**24 + 1]], 1.0, {}, "units", "1 <= min <= max <= 16,777,216"),
    ([0, 1], [1.0, 2.0], 1.0, {}, "units", "integers"),
    ([0, 1], [1, 2, 3], 1.0, {}, "units", "shape"),
    ([0, 1], [1, 1], 0.0, {}, "durations", "one microsecond to ten years"),
    ([0, 1], [1, 1], [1.0, 0.0], {}, "durations", "0.0 at position 1"),
    ([0, 1], [1, 1], [1.0, -2.0], {}, "durations", "-2.0 at position 1"),
    ([0, 1], [1, 1], [1.0, 3.2e8], {}, "durations", "ten years"),
    ([0, 1], [1, 1], True, {}, "durations", "not booleans"),
    ([0, 1], [1, 1], [1.0, 5e-7], {}, "durations", "one microsecond"),
    ([0, 1], [1, 1], None, {}, "durations", "(got None)"),
    ([0, 1], [1, 1], 1.0, {"ttl": 86_401.0}, "ttl", "86,400"),
    ([0, 1], [1, 1], 1.0, {"ttl": True}, "ttl", "must be a number of seconds"),
    ([0, 1], [1, 1], [1.0, float("nan")], {}, "durations", "finite"),
    ([0, 1], [1, 1], 1.0, {"dim": "tpu"}, "dim", "one of"),
    ([0, 1], [1, 1], 1.0, {"service_class": "x"}, "service_class", "one of"),
    ([0, 1], [1, 1], 1.0, {"ttl": 0}, "ttl", "> 0"),
]


@pytest.mark.parametrize("ci, u, du, kw, field, rule", BAD)
def test_bad_batches_name_field_and_rule_and_change_nothing(eb, ci, u, du, kw, field, rule):
    b = broker(eb)
    b.admit_batch([0], [3], 10.0)
    before, nxt = b.state(), next_intent(b)
    with pytest.raises(InvalidArgument) as e:
        b.admit_batch(ci, u, du, **kw)
    assert e.value.field == field and rule in str(e.value)
    assert b.state() == before and next_intent(b) == nxt
    assert b.admit_batch([1], [2], 10.0).outcome.tolist() == [0]


def test_each_rule_at_its_bound_is_accepted(eb):
    b = broker(eb)
    # (not max = 2**24 itself: the batch reserves slots for the sum of the maxima, so the
    # upper bound is checked only from above, in BAD)
    res = b.admit_batch(np.array([0, 1], np.uint8), [[1, 1], [1, 1]], [1e-6, 3.1e8])
    assert res.outcome.tolist() == [0, 0] and res.granted.tolist() == [1, 1]
    res = b.admit_batch(np.array([1], np.int32), np.array([1], np.uint64), 3.1e8)
    assert res.outcome.tolist() == [0]
    empty = b.admit_batch([], np.zeros(0, np.int64), 1.0)
    assert [len(x) for x in empty] == [0] * 5 and all(x.dtype == np.int64 for x in empty)


# ------------------------------------------------------------------ victims and classes
def _reclaim_after_batch(eb, classes, batch_class, guaranteed=8):
    """Campaign 0 of class ``classes[0]`` takes the whole pool in a batch; campaign 1
    (guaranteed the whole pool) then asks for it: it can only have it by reclaim, from
    victims the batch's grants must be among."""
    b = Broker(Pool(gpu=8), clock=ManualClock(0.0), backend=eb)
    for name, cls, g in (("x", classes[0], 0), ("y", classes[1], guaranteed)):
        b.register(name, Envelope(credits=INF, service_class=cls, guaranteed={"gpu": g},
                                  sustained={"gpu": 8}, ceiling={"gpu": 8}, burst={"gpu": INF}))
    res = b.admit_batch([0, 0], [4, 4], 600.0, service_class=batch_class)
    assert res.outcome.tolist() == [0, 0]
    return b, res


@pytest.mark.parametrize("classes, batch_class", [
    (("opportunistic", "interactive"), None),       # the item's class is its campaign's
    (("opportunistic", "opportunistic"), None),     # every campaign of one class
    (("agent-burst", "interactive"), "opportunistic"),   # the class given for the batch
])
def test_opportunistic_batch_grants_are_reclaim_victims(eb, classes, batch_class):
    b, res = _reclaim_after_batch(eb, classes, batch_class)
    assert [l.firm for l in b.leases()] == [False, False]
    d = b.acquire(Intent("y", units={"gpu": 8}, duration=60.0, service_class="interactive"))
    assert (d.outcome, d.path) == ("granted", "reclaim")
    noticed = {e.lease_id for e in b.poll() if e.kind == "preempt_notice"}
    assert noticed == set(res.lease.tolist())


def test_firm_batch_grants_are_not_victims(eb):
    b, res = _reclaim_after_batch(eb, ("agent-burst", "interactive"), None, guaranteed=0)
    assert [l.firm for l in b.leases()] == [True, True]
    assert b.state()["pool"]["gpu"]["reclaimable"] == 0
    d = b.acquire(Intent("y", units={"gpu": 8}, duration=60.0))
    assert d.outcome == "pending"


def test_each_item_gets_its_campaigns_class_as_classes_are_added(eb):
    b = Broker(Pool(gpu=64), clock=ManualClock(0.0), backend=eb)
    env = dict(credits=INF, sustained={"gpu": 64}, ceiling={"gpu": 64}, burst={"gpu": INF})
    b.register("a", Envelope(service_class="interactive", **env))
    b.register("b", Envelope(service_class="interactive", **env))
    first = b.admit_batch([0, 1], [1, 1], 60.0)
    b.register("c", Envelope(service_class="deadline", **env))
    second = b.admit_batch([2, 0, 2, 1], [1, 1, 1, 1], 60.0)
    cls = {l.id: l.service_class for l in b.leases()}
    assert [cls[x] for x in first.lease.tolist()] == ["interactive"] * 2
    assert [cls[x] for x in second.lease.tolist()] == ["deadline", "interactive", "deadline",
                                                       "interactive"]
    third = b.admit_batch([0, 2], [1, 1], 60.0, service_class="agent-burst")
    assert {cls for l in b.leases() if l.id in third.lease.tolist()
            for cls in [l.service_class]} == {"agent-burst"}


# ------------------------------------------------------------------ results are the caller's
def test_results_stay_valid_after_later_batches(eb):
    b = Broker(Pool(gpu=16), clock=ManualClock(0.0), backend=eb, ttl=30.0)
    b.register("a", Envelope(credits=INF, sustained={"gpu": 16}, ceiling={"gpu": 16},
                             burst={"gpu": INF}))
    ci = np.zeros(6, np.int64)
    u = np.array([4, 4, 4, 4, 4, 20], np.int64)
    r1 = b.admit_batch(ci, u, 60.0)
    kept = [x.copy() for x in r1]
    assert r1.outcome.tolist() == [0, 0, 0, 0, 2, 1] and r1.granted.tolist()[4:] == [0, 0]
    r2 = b.admit_batch(ci, u, 60.0)
    r3 = b.admit_batch(ci[:2], u[:2], 60.0, now=31.0)
    for a, k in zip(r1, kept):
        assert a.tolist() == k.tolist() and a.flags.writeable and a.dtype == np.int64
    arrays = list(r1) + list(r2) + list(r3)
    for i, a in enumerate(arrays):
        assert not np.shares_memory(a, ci) and not np.shares_memory(a, u)
        assert all(not np.shares_memory(a, x) for x in arrays[i + 1:])
    r2.outcome[:] = 7                      # the caller's to change
    b.admit_batch(ci, u, 60.0, now=32.0)
    assert r2.outcome.tolist() == [7] * 6
    assert ci.tolist() == [0] * 6 and u.tolist() == [4, 4, 4, 4, 4, 20]


@pytest.mark.parametrize("layout", ["int64", "strided", "big-endian", "int32", "list"])
def test_any_integer_layout_gives_the_same_batch(eb, layout):
    """Columns the one-pass helpers take (contiguous native int64) and the ones they leave
    to numpy decide the same."""
    ci = np.array([0, 1, 1, 0, 1], np.int64)
    u = np.array([3, 1, 2, 5, 4], np.int64)
    conv = {"int64": lambda a: a, "strided": lambda a: np.repeat(a, 2)[::2],
            "big-endian": lambda a: a.astype(">i8"), "int32": lambda a: a.astype(np.int32),
            "list": lambda a: a.tolist()}[layout]
    want = broker(eb, gpu=8).admit_batch(ci, u, 10.0)
    got = broker(eb, gpu=8).admit_batch(conv(ci), conv(u), 10.0)
    assert [x.tolist() for x in got] == [x.tolist() for x in want]
    assert want.outcome.tolist() == [0, 0, 0, 2, 2]


def test_event_callbacks_cannot_rewrite_a_batch_under_way(eb):
    """The columns are checked once; an event callback run by an item the single path
    decides (here a reclaim) and writing the caller's arrays does not reach later items."""
    b, _ = _reclaim_after_batch(eb, ("opportunistic", "interactive"), None)
    ci = np.array([1, 1, 0], np.int64)
    u = np.array([8, 1, 1], np.int64)

    def scribble(ev):
        ci[:] = 7
        u[:] = 0

    b.subscribe(scribble)
    res = b.admit_batch(ci, u, 60.0, service_class="interactive")
    assert ci.tolist() == [7, 7, 7] and u.tolist() == [0, 0, 0]
    assert res.outcome.tolist()[0] == 0 and res.granted.tolist()[0] == 8
    assert [l.campaign for l in b.leases() if l.id in res.lease.tolist()] == ["y"]
    assert res.outcome.tolist()[1:] in ([2, 2], [1, 1], [2, 1], [1, 2])
