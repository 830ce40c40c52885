"""The pending queue's wake-ups and the per-campaign cap (SPEC §4.4, §4.5).

A pass decides only the keys (campaign, dim, class, duration, max_spend) that can have
become grantable since they last failed; every other key is filed under a limit that
fails it, with the watch that says when that limit may have risen (its campaign's lease
ends, a token wake time, a dimension's free / reachable / firm-room units, a fall of the
congestion multiplier). A missed wake-up shows as an intent that the pass intent by intent
(``PendingQueue.by_key = False``, the specification) grants and the keyed pass does not: the
random runs below compare the two on decisions, events, ``pending()`` (reasons included)
and journals, with many distinct keys and the cap, on every backend; and again with nodes
of a tree of envelopes (SPEC §14) among the campaigns, whose keys watch the lease ends of
their whole tree.
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bursarcore import Broker, Envelope, Intent, ManualClock, Pool
from bursarcore.broker import BACKENDS, MAX_PENDING

# the compiled broker's pass by woken keys and its pass intent by intent (internals)
COMPILED = [b for b in BACKENDS if b != "reference"]
from bursarcore.errors import InvalidArgument
from bursarcore.journal import MemoryJournal
from invariants import set_pass_by_key

INF = math.inf
CLASSES = [None, None, "deadline", "interactive", "agent-burst", "opportunistic"]
DURS = [1.0, 2.0, 3.0, 5.0, 7.5, 11.0, 13.0, 20.0, 30.0, 45.0, 60.0, 90.0]


def _broker(backend, by_key, cap, journal=True, tree=False):
    b = Broker(Pool(gpu=16, cpu=6, warm_headroom={"gpu": 2}), clock=ManualClock(0.0),
               backend=backend, ttl=60.0, max_pending=cap,
               journal=MemoryJournal(chunk=16) if journal else None)
    set_pass_by_key(b, by_key)
    # tokens that bind and refill; credits that bind; guarantees; opportunistic holders
    b.register("a", Envelope(credits=INF, guaranteed={"gpu": 3}, sustained={"gpu": 3},
                             ceiling={"gpu": 10}, burst={"gpu": 40}))
    b.register("b", Envelope(credits=6.0, sustained={"gpu": 8, "cpu": 3},
                             ceiling={"gpu": 12, "cpu": 6}, burst={"gpu": INF, "cpu": INF}))
    b.register("c", Envelope(credits=INF, sustained={"gpu": 1}, ceiling={"gpu": 6},
                             burst={"gpu": 12}))
    b.register("g", Envelope(credits=INF, guaranteed={"gpu": 6, "cpu": 2},
                             sustained={"gpu": 6, "cpu": 2}, ceiling={"gpu": 9, "cpu": 4},
                             burst={"gpu": INF, "cpu": INF}))
    b.register("o", Envelope(credits=INF, service_class="opportunistic",
                             sustained={"gpu": 16, "cpu": 6}, ceiling={"gpu": 16, "cpu": 6}))
    if tree:
        # every level binds: t's bucket and ceiling, t/x's, a shared budget in t/y
        b.register("t", Envelope(credits=INF, guaranteed={"gpu": 4, "cpu": 1},
                                 sustained={"gpu": 5, "cpu": 2}, ceiling={"gpu": 9, "cpu": 4},
                                 burst={"gpu": 30, "cpu": INF}))
        b.register("t/x", Envelope(credits=INF, guaranteed={"gpu": 2, "cpu": 1},
                                   sustained={"gpu": 3, "cpu": 2}, ceiling={"gpu": 8, "cpu": 3},
                                   burst={"gpu": 20, "cpu": INF}))
        b.register("t/y", Envelope(credits=5.0, guaranteed={"gpu": 1},
                                   sustained={"gpu": 2, "cpu": 1}, ceiling={"gpu": 6, "cpu": 2},
                                   burst={"gpu": INF, "cpu": INF}))
        b.register("t/x/z", Envelope(credits=INF, guaranteed={"gpu": 1},
                                     sustained={"gpu": 2, "cpu": 1},
                                     ceiling={"gpu": 6, "cpu": 2}, burst={"gpu": 8, "cpu": 4}))
    return b


FLAT_NAMES = list("aabbcggo")
TREE_NAMES = ["a", "b", "g", "o", "t", "t/x", "t/x", "t/y", "t/x/z", "t/x/z"]


def _acquires(names):
    return st.tuples(st.just("acquire"), st.sampled_from(names),
                     st.sampled_from(["gpu", "gpu", "gpu", "cpu"]),
                     st.integers(1, 6), st.integers(0, 3), st.sampled_from(DURS),
                     st.sampled_from([None, None, None, 0.5, 3.0]),
                     st.sampled_from(CLASSES), st.sampled_from([None, None, 4.0, 40.0]),
                     st.integers(1, 4))


_acquire = _acquires(FLAT_NAMES)
_other = st.one_of(
    st.tuples(st.just("clock"), st.sampled_from([0.0, 0.001, 0.3, 0.999, 1.0, 2.5, 7.0, 30.0,
                                                 61.0])),
    st.tuples(st.just("release"), st.floats(0, 0.999)),
    st.tuples(st.just("cancel"), st.floats(0, 0.999)),
    st.tuples(st.just("renew"), st.floats(0, 0.999), st.sampled_from([1.0, 10.0])),
    st.tuples(st.just("pending"), st.sampled_from([None, "a", "b", "c", "g", "o"])),
    st.tuples(st.just("poll"),),
)
OPS = st.lists(st.one_of(_acquire, _acquire, _other), min_size=10, max_size=90)
_tree_acquire = _acquires(TREE_NAMES)
TREE_OPS = st.lists(st.one_of(_tree_acquire, _tree_acquire, _other), min_size=10,
                    max_size=90)


def _observed(b):
    """``state()`` without the name of the backend that produced it."""
    s = b.state()
    del s["backend"]
    return s


def _run(b, ops):
    """Apply ``ops`` to ``b``; yield a comparable result per step (pending() after each)."""
    clock = b.clock
    leases, intents, nodes = [], [], 0
    for op in ops:
        kind = op[0]
        out = None
        if kind == "acquire":
            _, camp, dim, lo, extra, dur, spend, cls, dl, burst = op
            if camp == "o":
                cls = None
            for _ in range(burst):
                dec = b.acquire(Intent(camp, {dim: (lo, lo + extra)}, duration=dur,
                                       deadline=None if dl is None else clock.now() + dl,
                                       max_spend=spend, service_class=cls))
                if dec.lease is not None:
                    leases.append(dec.lease.id)
                if dec.outcome == "pending":
                    intents.append(dec.intent_id)
                out = dec.to_dict()
        elif kind == "clock":
            clock.advance(op[1])
            out = b.deficits()
        elif kind == "release" and leases:
            out = b.release(leases[int(op[1] * len(leases))]).to_dict()
        elif kind == "renew" and leases:
            out = b.renew(leases[int(op[1] * len(leases))], op[2]).to_dict()
        elif kind == "cancel" and intents:
            out = b.cancel(intents[int(op[1] * len(intents))])
        elif kind == "pending":
            out = b.pending(op[1])
        elif kind == "nodes":
            nodes += 1
            out = b.add_nodes(op[1], [(f"x{nodes}", 1)])
        elif kind == "poll":
            evs = b.poll()
            leases.extend(e.lease_id for e in evs if e.kind == "granted")
            out = [e.to_dict() for e in evs]
        yield out, b.pending()
    yield _observed(b), b.poll()


def _compare(backend, ops, cap, tree=False):
    """The compiled broker's keyed pass, its pass intent by intent and the reference
    broker agree on everything observable, journals byte for byte."""
    keyed = _broker(backend, True, cap, tree=tree)
    plain = _broker(backend, False, cap, tree=tree)
    spec = _broker("reference", True, cap, tree=tree)
    for i, (x, y, z) in enumerate(zip(_run(keyed, ops), _run(plain, ops), _run(spec, ops))):
        assert x == y == z, f"step {i}: {ops[i] if i < len(ops) else 'end'}"
    a, b = keyed.journal.rows(), plain.journal.rows()
    assert a.shape == b.shape and a.tobytes() == b.tobytes()
    assert spec.journal.rows().tobytes() == a.tobytes()
    assert keyed._queue.passes == plain._queue.passes
    Broker.replay(keyed.journal, backend=backend, resume=False)
    return keyed


@pytest.mark.parametrize("backend", COMPILED)
@given(ops=OPS, cap=st.sampled_from([None, 2, 5]))
@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
def test_keyed_pass_equals_pass_by_intent(backend, ops, cap):
    _compare(backend, ops, cap)


@pytest.mark.parametrize("backend", COMPILED)
@given(ops=TREE_OPS, cap=st.sampled_from([None, 3]))
@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
def test_keyed_pass_equals_pass_by_intent_in_a_tree(backend, ops, cap):
    _compare(backend, ops, cap, tree=True)


def _long_ops(seed, n, names=FLAT_NAMES):
    r = random.Random(seed)
    out = []
    for _ in range(n):
        x = r.random()
        if x < 0.6:
            out.append(("acquire", r.choice(names), r.choice(["gpu", "gpu", "cpu"]),
                        r.randint(1, 6), r.randint(0, 3), r.choice(DURS),
                        r.choice([None, None, 0.5, 3.0]), r.choice(CLASSES),
                        r.choice([None, None, 4.0, 40.0]), r.choice([1, 1, 2, 6])))
        elif x < 0.78:
            out.append(("clock", r.choice([0.0, 0.001, 0.3, 1.0, 2.5, 7.0, 30.0, 61.0])))
        elif x < 0.88:
            out.append(("release", r.random()))
        elif x < 0.92:
            out.append(("cancel", r.random()))
        elif x < 0.96:
            out.append(("renew", r.random(), r.choice([1.0, 10.0])))
        else:
            out.append(("poll",))
    return out


@pytest.mark.parametrize("backend", COMPILED)
@pytest.mark.parametrize("seed", range(4))
def test_keyed_pass_equals_pass_by_intent_long_runs(backend, seed):
    """Long runs: deep queues of many distinct keys, every kind of watch filed and fired."""
    b = _compare(backend, _long_ops(seed, 900), [None, 40][seed % 2])
    assert b._queue.wseq > 200                     # keys were filed, many times over


@pytest.mark.parametrize("backend", COMPILED)
@pytest.mark.parametrize("seed", range(4))
def test_keyed_pass_equals_pass_by_intent_long_runs_in_a_tree(backend, seed):
    b = _compare(backend, _long_ops(seed, 900, TREE_NAMES), [None, 40][seed % 2], tree=True)
    assert b._queue.wseq > 200


@pytest.mark.parametrize("backend", BACKENDS)
def test_price_falling_within_a_pass_grants_later_keys(backend):
    """A grant in a pass lowers pending priced demand, so the congestion multiplier can
    fall within the pass: a key that failed on credits at its start and comes later in
    the order is granted in that same pass, as the pass intent by intent grants it."""
    got = []
    for by_key in (True, False):
        b = Broker(Pool(gpu=10), clock=ManualClock(0.0), backend=backend)
        set_pass_by_key(b, by_key)
        b.register("h", Envelope(credits=INF, sustained={"gpu": 10}, ceiling={"gpu": 10}))
        b.register("k", Envelope(credits=2.5, sustained={"gpu": 10}, ceiling={"gpu": 10},
                                 burst={"gpu": INF}))
        b.register("y", Envelope(credits=INF, sustained={"gpu": 2}, ceiling={"gpu": 2},
                                 burst={"gpu": INF}))
        assert b.acquire(Intent("h", {"gpu": 10}, duration=5.0)).granted
        # k: 1 GPU-hour as interactive (2.0): 2 credits at multiplier 1, 3 at 1.5
        dk = b.acquire(Intent("k", {"gpu": 1}, duration=3600.0, service_class="interactive"))
        dy = b.acquire(Intent("y", {"gpu": (2, 8)}, duration=60.0, service_class="deadline"))
        assert dk.outcome == dy.outcome == "pending"
        b.clock.advance(5.0)               # h expires: 10 free, pending demand 9: k fails
        evs = [(e.kind, e.campaign, e.time) for e in b.poll() if e.kind == "granted"]
        got.append(evs)
        assert evs == [("granted", "y", 5.0), ("granted", "k", 5.0)]
        assert b.pending() == []
    assert got[0] == got[1]


def _count_decisions(b):
    """From now on, the campaign of every key or intent ``b``'s engine decides, in a list
    (the compiled broker's kernels wrapped)."""
    calls = []
    kern = b._k

    class Counting:
        def __getattr__(self, name):
            return getattr(kern, name)

        @staticmethod
        def decide(*args):
            calls.append(args[1])
            return kern.decide(*args)

        @staticmethod
        def decide_keys(st, rows, t, out):
            calls.extend(rows[:, 0].tolist())
            return kern.decide_keys(st, rows, t, out)

    b._k = Counting()
    return calls


@pytest.mark.parametrize("backend", COMPILED)
def test_a_pass_decides_no_key_that_cannot_have_changed(backend):
    """Many distinct keys waiting on their ceiling, on tokens that do not refill, on
    capacity short of their size: passes at later times decide none of them (an acquire
    does not pay for the queue); a lease end of their campaign, the refill time of a
    token-bound key and freed capacity wake exactly the keys they concern."""
    b = Broker(Pool(gpu=64), clock=ManualClock(0.0), backend=backend, ttl=86_400.0,
               max_pending=None)
    b.register("ceil", Envelope(credits=INF, sustained={"gpu": 4}, ceiling={"gpu": 4},
                                burst={"gpu": INF}))
    b.register("tok", Envelope(credits=INF, sustained={"gpu": 1}, ceiling={"gpu": 64},
                               burst={"gpu": 1000}))
    b.register("big", Envelope(credits=INF, sustained={"gpu": 64}, ceiling={"gpu": 64},
                               burst={"gpu": INF}))
    b.register("m", Envelope(credits=INF, sustained={"gpu": 64}, ceiling={"gpu": 64},
                             burst={"gpu": INF}))
    held = b.acquire(Intent("ceil", {"gpu": 4}, duration=1e4))
    assert held.granted
    for k in range(300):
        assert b.acquire(Intent("ceil", {"gpu": 1}, duration=1 + k * 0.001)).reason == "ceiling"
    # tok holds 2 > sustained 1 (100 unit-seconds left): nothing refills while it holds them
    assert b.acquire(Intent("tok", {"gpu": 2}, duration=900.0)).granted
    for k in range(300):
        d = b.acquire(Intent("tok", {"gpu": 30}, duration=10 + k * 0.001))
        assert d.outcome == "pending" and d.reason == "tokens", d
    # big waits on capacity: 58 free now, it wants 61
    for k in range(300):
        d = b.acquire(Intent("big", {"gpu": 61}, duration=1 + k * 0.001))
        assert d.outcome == "pending" and d.reason == "capacity", d
    calls = _count_decisions(b)
    P = b._queue.passes
    for _ in range(200):
        b.clock.advance(0.01)
        assert b.acquire(Intent("m", {"gpu": 1}, duration=0.005)).granted   # expire as we go
    assert b._queue.passes >= P + 200
    c = {n: b.campaign_index(n) for n in ("ceil", "tok", "big", "m")}
    assert [x for x in calls if x != c["m"]] == []
    # tok's lease ending wakes tok's keys only (60 free then: big's keys wait on); they
    # fail on tokens again, now refilling, and wait for their refill time
    b.clock.set(900.0)
    b.deficits()
    assert set(calls) - {c["m"]} == {c["tok"]}
    calls.clear()
    b.clock.advance(0.01)
    b.deficits()
    assert set(calls) <= {c["m"]}
    b.clock.set(1090.0)                    # the first of tok's refill times: 900 + 29 * 10 - 100
    b.deficits()
    assert c["tok"] in calls and c["big"] not in calls
    assert len(b.pending("tok")) == 299     # one granted; the rest wait on tokens
    # ceil's own release wakes ceil's keys, four of which are granted (34 free after:
    # still short of big's 61)
    calls.clear()
    b.release(held.lease.id)
    assert c["ceil"] in calls and c["big"] not in calls
    assert len(b.pending("ceil")) == 296 and len(b.pending("big")) == 300
    assert {p["reason"] for p in b.pending("ceil")} == {"ceiling"}
    assert {p["reason"] for p in b.pending("big")} == {"capacity"}


@pytest.mark.parametrize("backend", BACKENDS)
def test_pending_limit_per_campaign(backend):
    """An intent that would go pending beyond the campaign's cap is refused with
    ``pending_limit`` and a retry_after (until its oldest waiting intent expires): in
    acquire and admit_batch alike, journaled and replayed; other campaigns are not held
    back; a slot frees when an intent leaves the queue."""
    j = MemoryJournal()
    b = Broker(Pool(gpu=8), clock=ManualClock(0.0), backend=backend, max_pending=3, ttl=100.0,
               journal=j)
    assert MAX_PENDING == 1024
    b.register("a", Envelope(credits=INF, sustained={"gpu": 4}, ceiling={"gpu": 4}, burst={"gpu": INF}))
    b.register("z", Envelope(credits=INF, sustained={"gpu": 4}, ceiling={"gpu": 4}, burst={"gpu": INF}))
    assert b.acquire(Intent("a", {"gpu": 4}, duration=1e3)).granted
    assert b.acquire(Intent("z", {"gpu": 4}, duration=1e3)).granted
    ids = []
    for k in range(3):
        b.clock.advance(1.0)
        d = b.acquire(Intent("a", {"gpu": 1}, duration=10.0 + k, ttl=50.0 + k))
        assert d.outcome == "pending" and d.reason == "ceiling"
        ids.append(d.intent_id)
    b.clock.advance(1.0)                     # t = 4; the oldest expires at 1 + 50
    d = b.acquire(Intent("a", {"gpu": 1}, duration=10.0))
    assert (d.outcome, d.reason, d.retry_after) == ("refused", "pending_limit", 47.0)
    assert j.record(d.seq)["reason"] == "pending_limit"
    assert "max_pending" in b.explain(d.seq)
    r = b.admit_batch([0, 1, 0], [1, 1, 1], 10.0)
    assert r.outcome.tolist() == [1, 2, 1]
    assert r.reason.tolist() == [10, 4, 10]
    assert b.cancel(ids[1])
    assert b.acquire(Intent("a", {"gpu": 1}, duration=10.0)).outcome == "pending"
    assert len(b.pending("a")) == 3 and len(b.pending("z")) == 1
    b2 = Broker.replay(j, backend=backend, resume=False)
    assert b2.max_pending == 3 and b2.pending() == b.pending()
    # no cap
    free = Broker(Pool(gpu=8), clock=ManualClock(0.0), backend=backend, max_pending=None)
    free.register("a", Envelope(credits=INF, sustained={"gpu": 4}, ceiling={"gpu": 4}, burst={"gpu": INF}))
    assert free.acquire(Intent("a", {"gpu": 4}, duration=1e3)).granted
    r = free.admit_batch(np.zeros(1500, dtype=np.int64), np.ones(1500, dtype=np.int64), 5.0)
    assert (r.outcome == 2).all() and len(free.pending("a")) == 1500
    # the default cap
    dflt = Broker(Pool(gpu=8), clock=ManualClock(0.0), backend=backend)
    dflt.register("a", Envelope(credits=INF, sustained={"gpu": 4}, ceiling={"gpu": 4}, burst={"gpu": INF}))
    assert dflt.acquire(Intent("a", {"gpu": 4}, duration=1e3)).granted
    r = dflt.admit_batch(np.zeros(1030, dtype=np.int64), np.ones(1030, dtype=np.int64), 5.0)
    assert (r.outcome[:1024] == 2).all() and (r.outcome[1024:] == 1).all()
    assert (r.reason[1024:] == 10).all()
    # a cap of 0: nothing waits
    none = Broker(Pool(gpu=8), clock=ManualClock(0.0), backend=backend, max_pending=0)
    none.register("a", Envelope(credits=INF, sustained={"gpu": 4}, ceiling={"gpu": 4}, burst={"gpu": INF}))
    assert none.acquire(Intent("a", {"gpu": 4}, duration=1e3)).granted
    d = none.acquire(Intent("a", {"gpu": 1}, duration=1.0))
    assert (d.outcome, d.reason, d.retry_after) == ("refused", "pending_limit", None)


@pytest.mark.parametrize("bad", [-1, 1.5, True, "10"])
def test_max_pending_is_validated(bad):
    with pytest.raises(InvalidArgument, match="max_pending"):
        Broker(Pool(gpu=8), max_pending=bad)


class _Spy(dict):
    """A dict that fails any walk over it (pending(campaign) must not need one)."""

    def values(self):
        raise AssertionError("walked every pending intent")

    def __iter__(self):
        raise AssertionError("walked every pending intent")


@pytest.mark.skipif(not COMPILED, reason="the compiled broker's index of pending intents")
def test_pending_of_one_campaign_reads_its_own_index():
    b = Broker(Pool(gpu=8), clock=ManualClock(0.0), backend=COMPILED[0], max_pending=None)
    for n in ("a", "z"):
        b.register(n, Envelope(credits=INF, sustained={"gpu": 4}, ceiling={"gpu": 4}, burst={"gpu": INF}))
        assert b.acquire(Intent(n, {"gpu": 4}, duration=1e3)).granted
    for k in range(50):
        b.acquire(Intent("z", {"gpu": 1}, duration=1.0 + k))
    mine = [b.acquire(Intent("a", {"gpu": 1}, duration=2.0)).intent_id for _ in range(3)]
    everything = b.pending()
    b._queue.intents = _Spy(b._queue.intents)
    got = b.pending("a")
    assert [p["intent_id"] for p in got] == mine
    assert got == [p for p in everything if p["campaign"] == "a"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_renewal_that_refunds_tokens_wakes_its_campaign(backend):
    """Renewing a lease re-prices its prepaid segment from now, as the top-most holding:
    after the campaign's other lease ended, that can refund tokens, and a key of the
    campaign waiting on tokens (with nothing refilling) can go through at the next pass,
    as the pass intent by intent finds."""
    got = []
    for by_key in (True, False):
        b = Broker(Pool(gpu=16), clock=ManualClock(0.0), backend=backend)
        set_pass_by_key(b, by_key)
        b.register("c", Envelope(credits=INF, sustained={"gpu": 2}, ceiling={"gpu": 16},
                                 burst={"gpu": 100}))
        la = b.acquire(Intent("c", {"gpu": 2}, duration=1e3))
        lb = b.acquire(Intent("c", {"gpu": 2}, duration=40.0))     # 80 unit-seconds
        assert la.granted and lb.granted
        k = b.acquire(Intent("c", {"gpu": 3}, duration=10.0))       # needs 30, 20 left
        assert (k.outcome, k.reason) == ("pending", "tokens")
        b.clock.advance(10.0)
        b.release(la.lease.id)          # holding 2 = sustained: nothing refills; still short
        assert b.pending()[0]["reason"] == "tokens"
        assert b.renew(lb.lease.id, 1.0).granted                    # 60 unit-seconds back
        b.clock.advance(0.001)
        evs = [(e.kind, e.intent_id) for e in b.poll() if e.kind == "granted"]
        assert evs == [("granted", k.intent_id)]
        got.append(evs)
    assert got[0] == got[1]


@pytest.mark.parametrize("backend", COMPILED)
def test_a_tree_nodes_keys_wake_on_its_trees_lease_ends_only(backend):
    """SPEC §14.2: a node's limits rise only when a lease of its tree ends (an ancestor's
    load falls, a bucket or budget is refunded), with time, or with the pool's figures. Keys
    of nodes waiting on their parent's ceiling are not decided by passes that another
    campaign's acquires and expiries run; a lease end of a sibling in their tree wakes them
    (and is the room they were waiting for), one in another tree does not."""
    b = Broker(Pool(gpu=64), clock=ManualClock(0.0), backend=backend, ttl=86_400.0,
               max_pending=None)
    top = Envelope(credits=INF, sustained={"gpu": 8}, ceiling={"gpu": 8}, burst={"gpu": INF})
    leaf = Envelope(credits=INF, sustained={"gpu": 8}, ceiling={"gpu": 8}, burst={"gpu": INF})
    for p in ("p", "q"):
        b.register(p, top)
        b.register(f"{p}/x", leaf)
        b.register(f"{p}/y", leaf)
    b.register("m", Envelope(credits=INF, sustained={"gpu": 8}, ceiling={"gpu": 8},
                             burst={"gpu": INF}))
    held = {p: b.acquire(Intent(f"{p}/x", {"gpu": 8}, duration=1e4)) for p in ("p", "q")}
    assert all(d.granted for d in held.values())
    for k in range(100):                       # p's and q's ceilings are full
        for p in ("p", "q"):
            d = b.acquire(Intent(f"{p}/y", {"gpu": 1}, duration=1 + k * 0.001))
            assert (d.outcome, d.reason) == ("pending", "ceiling"), d
    calls = _count_decisions(b)
    for _ in range(200):
        b.clock.advance(0.01)
        assert b.acquire(Intent("m", {"gpu": 1}, duration=0.005)).granted   # expire as we go
    c = {n: b.campaign_index(n) for n in ("p/y", "q/y", "m")}
    assert [x for x in calls if x != c["m"]] == []
    b.release(held["p"].lease.id)             # p's ceiling has room again: p/y's keys only
    assert c["p/y"] in calls and c["q/y"] not in calls
    assert len(b.pending("p/y")) == 92 and len(b.pending("q/y")) == 100
