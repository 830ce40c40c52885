"""The pending queue's pass by keys against the pass intent by intent (SPEC §4.4, §4.5).

``Broker._serve_pending`` serves the queue key by key (K = campaign, dim, class, duration,
max_spend), skips a key's intents after its first failure unless a smaller nmin follows,
and stores the skipped intents' reasons once per key. With ``PendingQueue.by_key = False`` every
pass goes intent by intent (the order of §4.5 by a sort over all intents, each reason
written on its intent): the two must reach the same decisions, events, ``state()``
(pending reasons included) and journal records, step for step.

The workloads keep deep queues of one key with mixed nmin, deadlines, several durations
of one campaign (keys that tie on rank, deficit and tokens, merged by arrival), campaigns
with equal deficits, reclaim grants whose plan misses a deadline, cancels, releases and
TTL expiries, on every backend.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from bursarcore import Broker, Envelope, Intent, ManualClock, Pool
from bursarcore.broker import BACKENDS

# the compiled broker's pass by woken keys and its pass intent by intent (internals)
COMPILED = [b for b in BACKENDS if b != "reference"]
from bursarcore.journal import MemoryJournal
from invariants import set_pass_by_key

INF = float("inf")


def _broker(backend, by_key, journal):
    b = Broker(Pool(gpu=24, cpu=8), clock=ManualClock(0.0), backend=backend, ttl=40.0,
               journal=MemoryJournal(chunk=16) if journal else None)
    set_pass_by_key(b, by_key)
    b.register("a", Envelope(credits=INF, guaranteed={"gpu": 2}, sustained={"gpu": 4},
                             ceiling={"gpu": 10}, burst={"gpu": 60}))
    b.register("b", Envelope(credits=INF, guaranteed={"gpu": 2}, sustained={"gpu": 4},
                             ceiling={"gpu": 10}, burst={"gpu": 60}))
    b.register("c", Envelope(credits=3.0, sustained={"gpu": 6, "cpu": 4},
                             ceiling={"gpu": 12, "cpu": 8}, burst={"gpu": INF}))
    b.register("o", Envelope(credits=INF, service_class="opportunistic",
                             sustained={"gpu": 24}, ceiling={"gpu": 24}))
    return b


def _ops(seed, n):
    """A reproducible operation list: retry bursts of one key, mixed nmin, deadlines."""
    r = random.Random(seed)
    out = []
    for _ in range(n):
        x = r.random()
        if x < 0.55:
            camp = r.choice("aabbco")
            burst = r.choice([1, 1, 3, 12])
            lo = r.choice([1, 2, 2, 3, 5])
            hi = lo + r.choice([0, 0, 2])
            dur = r.choice([5.0, 5.0, 20.0])
            spend = r.choice([None, None, None, 0.02])
            cls = r.choice([None, None, None, "deadline", "opportunistic"])
            dim = "cpu" if camp == "c" and r.random() < 0.3 else "gpu"
            for _ in range(burst):
                dl = r.choice([None, None, None, 2.0, 8.0, 30.0])
                out.append(("acquire", camp, dim, (max(1, lo - r.choice([0, 0, 0, 1])), hi),
                            dur, dl, spend, cls))
        elif x < 0.72:
            out.append(("clock", r.choice([0.0, 0.01, 0.3, 1.0, 2.5, 7.0, 25.0])))
        elif x < 0.82:
            out.append(("release", r.random()))
        elif x < 0.88:
            out.append(("cancel", r.random()))
        elif x < 0.94:
            out.append(("state",))
        else:
            out.append(("poll",))
    return out


def _observed(b):
    """``state()`` without the name of the backend that produced it."""
    s = b.state()
    del s["backend"]
    return s


def _run(b, ops):
    """Apply ``ops`` to ``b``; yield a comparable result per step."""
    clock = b.clock
    leases, intents = [], []
    for op in ops:
        kind = op[0]
        if kind == "acquire":
            _, camp, dim, (lo, hi), dur, dl, spend, cls = op
            now = clock.now()
            dec = b.acquire(Intent(camp, {dim: (lo, hi)}, duration=dur,
                                   deadline=None if dl is None else now + dl,
                                   max_spend=spend, service_class=cls))
            if dec.lease is not None:
                leases.append(dec.lease.id)
            if dec.outcome == "pending":
                intents.append(dec.intent_id)
            yield dec.to_dict()
        elif kind == "clock":
            clock.advance(op[1])
            yield b.deficits()
        elif kind == "tick":                 # the clock moves; the next call serves
            clock.advance(op[1])
            yield None
        elif kind == "release":
            yield b.release(leases[int(op[1] * len(leases))]).to_dict() if leases else None
        elif kind == "cancel":
            yield b.cancel(intents[int(op[1] * len(intents))]) if intents else None
        elif kind == "state":
            yield _observed(b)
        else:
            evs = b.poll()
            leases.extend(e.lease_id for e in evs if e.kind == "granted")
            yield [(e.kind, e.time, e.campaign, e.lease_id, e.intent_id, e.reason, e.units)
                   for e in evs]
    yield _observed(b)
    yield b.poll()


@pytest.mark.parametrize("backend", COMPILED)
@pytest.mark.parametrize("seed", range(6))
def test_pass_by_key_equals_pass_by_intent(backend, seed):
    """The compiled broker's pass by woken keys, its pass intent by intent and the
    reference broker's (the specification's queue, decided over every intent) agree."""
    journal = seed % 2 == 0
    ops = _ops(seed, 700)
    keyed, plain = _broker(backend, True, journal), _broker(backend, False, journal)
    spec = _broker("reference", True, journal)
    deep = 0
    for i, (x, y, z) in enumerate(zip(_run(keyed, ops), _run(plain, ops), _run(spec, ops))):
        assert x == y == z, f"step {i}: {ops[i] if i < len(ops) else 'end'}"
        deep = max(deep, len(keyed._queue.intents))
    assert deep >= 20                      # the queue did get deep
    if journal:
        a, b = keyed.journal.rows(), plain.journal.rows()
        assert a.shape == b.shape and a.tobytes() == b.tobytes()
        assert spec.journal.rows().tobytes() == a.tobytes()
        # the journal of a run with state() reads among the operations replays
        Broker.replay(keyed.journal, backend=backend, resume=False)
    assert keyed._queue.passes == plain._queue.passes


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_key_mixed_nmin_reasons_via_state(backend):
    """Many intents of one key: a failure at nmin m skips the later intents with nmin >= m
    (reason of that failure, kept on the key), a later smaller nmin is still tried, and
    the reasons read through state() are the ones the intent-by-intent pass writes."""
    for by_key in (True, False):
        b = Broker(Pool(gpu=10), clock=ManualClock(0.0), backend=backend, ttl=100.0)
        set_pass_by_key(b, by_key)
        b.register("a", Envelope(credits=INF, sustained={"gpu": 10}, ceiling={"gpu": 10}))
        b.register("x", Envelope(credits=INF, sustained={"gpu": 10}, ceiling={"gpu": 10}))
        hog = b.acquire(Intent("x", {"gpu": 10}, duration=10.0))
        assert hog.granted
        ids = []
        for nmin, dl in [(4, None), (6, None), (2, 50.0), (4, None), (1, 5.0), (3, None),
                         (6, 8.0), (1, None), (2, None)]:
            d = b.acquire(Intent("a", {"gpu": (nmin, nmin)}, duration=30.0, deadline=dl))
            assert d.outcome == "pending" and d.reason == "capacity"
            ids.append(d.intent_id)
        b.clock.advance(1.0)              # a pass with nothing grantable
        assert [p["reason"] for p in b.state()["pending"]] == ["capacity"] * 9
        b.clock.advance(4.5)              # the (1, deadline 5) intent expires
        assert len(b.state()["pending"]) == 8
        b.release(hog.lease.id)           # 10 free: 4, 6 granted; then 2 fails? no: 0 left
        got = {p["intent_id"]: (p["min"], p["reason"]) for p in b.state()["pending"]}
        granted = [e.intent_id for e in b.poll() if e.kind == "granted"]
        assert granted == [ids[0], ids[1]]
        assert set(got) == set(ids) - {ids[0], ids[1], ids[4]}
        assert all(r == "ceiling" for _, r in got.values())
        if by_key:
            keyed = got
        else:
            assert got == keyed


@pytest.mark.skipif(not COMPILED, reason="counts the compiled engine's decide calls")
def test_pass_cost_does_not_grow_with_queue_depth():
    """A deep queue of one key that cannot be served: a pass at a later time decides
    nothing (the keys wait on their ceiling, which only their own lease ends can raise);
    reading the reasons decides once per key."""
    b = Broker(Pool(gpu=8), clock=ManualClock(0.0), backend=BACKENDS[0], ttl=1e4,
               max_pending=None)
    b.register("a", Envelope(credits=INF, sustained={"gpu": 4}, ceiling={"gpu": 4}))
    b.register("b", Envelope(credits=INF, sustained={"gpu": 4}, ceiling={"gpu": 4}))
    for c in "ab":
        assert b.acquire(Intent(c, {"gpu": 4}, duration=1e3)).granted
        for _ in range(3000):
            assert b.acquire(Intent(c, {"gpu": 2}, duration=5.0)).outcome == "pending"
    calls = []
    kern = b._k
    decide, decide_keys = kern.decide, kern.decide_keys

    class Counting:              # counts the intents decided, one by one or as key rows
        def __getattr__(self, name):
            return getattr(kern, name)

        @staticmethod
        def decide(*args):
            calls.append(args)
            return decide(*args)

        @staticmethod
        def decide_keys(st, rows, t, out):
            calls.extend(rows.tolist())
            return decide_keys(st, rows, t, out)

    b._k = Counting()
    b.clock.advance(1.0)
    b.deficits()
    assert calls == [] and b._queue.passes == 1
    assert {p["reason"] for p in b.pending()} == {"ceiling"}
    assert len(calls) == 2
    assert np.all(np.array([p["min"] for p in b.pending()]) == 2)


class _Always(Broker):
    """Every pass taken by the broker's method (no shortcut when no wake-up is due)."""

    def _wake_due(self, t):
        return True


@pytest.mark.parametrize("backend", COMPILED)
@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("hooked", [True, False])
def test_no_wake_due_means_an_empty_pass(backend, seed, hooked):
    """When ``_wake_due`` says no key's wake-up is due, the pass would only count itself:
    ``FastAcquire`` (compiled, or its reference) then does just that. A run equals one
    whose every pass goes through ``_serve_pending``, step for step and record for record.
    ``hooked``: every pass checked — with no wake-up due, ``_serve_pending`` changes no
    state, no journal record and no key's watch; else as it runs, where the fast path
    counts most passes itself."""
    ops = _ops(100 + seed, 700)
    if not hooked:                           # acquires that move the clock
        ops = [x for op in ops for x in
               ([("tick", 0.003), op] if op[0] == "acquire" else
                [("tick", op[1])] if op[0] == "clock" else [op])]
    lazy = _broker(backend, True, True)
    always = _Always(Pool(gpu=24, cpu=8), clock=ManualClock(0.0), backend=backend, ttl=40.0,
                     journal=MemoryJournal(chunk=16))
    for name, env in lazy.envelopes.items():
        always.register(name, env)
    seen = {"empty": 0, "python": 0}
    serve = lazy._serve_pending

    def checked(t):
        seen["python"] += 1
        if not lazy._queue.intents or lazy._wake_due(t):
            return serve(t)
        seen["empty"] += 1
        before = (lazy.st.T.copy(), len(lazy.journal), lazy._queue.wlive, lazy._queue.wseq,
                  dict(lazy._queue.woken), lazy._cur.deficit_last.copy())
        serve(t)
        after = (lazy.st.T.copy(), len(lazy.journal), lazy._queue.wlive, lazy._queue.wseq,
                 dict(lazy._queue.woken), lazy._cur.deficit_last.copy())
        assert np.array_equal(before[0], after[0]) and before[1:5] == after[1:5]
        assert np.array_equal(before[5], after[5], equal_nan=True)

    if hooked:
        lazy._serve_pending = checked      # (FastAcquire calls the instance's)
    for i, (x, y) in enumerate(zip(_run(lazy, ops), _run(always, ops))):
        assert x == y, f"step {i}: {ops[i] if i < len(ops) else 'end'}"
    a, b = lazy.journal.rows(), always.journal.rows()
    assert a.shape == b.shape and a.tobytes() == b.tobytes()
    assert lazy._queue.passes == always._queue.passes
    if hooked:
        assert seen["empty"] > 20, seen
    elif lazy._fast is not None:
        assert lazy._queue.passes > seen["python"] + 20, (lazy._queue.passes, seen)  # FastAcquire counted
