"""The pending queue's pass by keys against the pass intent by intent (SPEC §4.4, §4.5).

``Broker._serve_pending`` serves the queue key by key (K = campaign, dim, class, duration,
max_spend), skips a key's intents after its first failure unless a smaller nmin follows,
and stores the skipped intents' reasons once per key. With ``_queue_by_key = False`` every
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
from bursarcore.broker import ENGINES
from bursarcore.journal import MemoryJournal

INF = float("inf")


def _broker(backend, by_key, journal):
    b = Broker(Pool(gpu=24, cpu=8), clock=ManualClock(0.0), backend=backend, ttl=40.0,
               journal=MemoryJournal(chunk=16) if journal else None)
    b._queue_by_key = by_key
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
            yield b.state()
        else:
            evs = b.poll()
            leases.extend(e.lease_id for e in evs if e.kind == "granted")
            yield [(e.kind, e.time, e.campaign, e.lease_id, e.intent_id, e.reason, e.units)
                   for e in evs]
    yield b.state()
    yield b.poll()


@pytest.mark.parametrize("backend", sorted(ENGINES))
@pytest.mark.parametrize("seed", range(6))
def test_pass_by_key_equals_pass_by_intent(backend, seed):
    journal = seed % 2 == 0
    ops = _ops(seed, 700)
    keyed, plain = _broker(backend, True, journal), _broker(backend, False, journal)
    deep = 0
    for i, (x, y) in enumerate(zip(_run(keyed, ops), _run(plain, ops))):
        assert x == y, f"step {i}: {ops[i] if i < len(ops) else 'end'}"
        deep = max(deep, len(keyed._pending))
    assert deep >= 20                      # the queue did get deep
    if journal:
        a, b = keyed.journal.rows(), plain.journal.rows()
        assert a.shape == b.shape and a.tobytes() == b.tobytes()
        # the journal of a run with state() reads among the operations replays
        Broker.replay(keyed.journal, backend=backend, resume=False)
    assert keyed._pass == plain._pass


@pytest.mark.parametrize("backend", sorted(ENGINES))
def test_one_key_mixed_nmin_reasons_via_state(backend):
    """Many intents of one key: a failure at nmin m skips the later intents with nmin >= m
    (reason of that failure, kept on the key), a later smaller nmin is still tried, and
    the reasons read through state() are the ones the intent-by-intent pass writes."""
    for by_key in (True, False):
        b = Broker(Pool(gpu=10), clock=ManualClock(0.0), backend=backend, ttl=100.0)
        b._queue_by_key = by_key
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


def test_pass_cost_does_not_grow_with_queue_depth():
    """A deep queue of one key that cannot be served: a pass decides once per key."""
    b = Broker(Pool(gpu=8), clock=ManualClock(0.0), backend=sorted(ENGINES)[0], ttl=1e4)
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
    assert 0 < len(calls) <= 4
    assert {p["reason"] for p in b.pending()} == {"ceiling"}
    assert np.all(np.array([p["min"] for p in b.pending()]) == 2)


class _Eager(Broker):
    """The probe's reasons stored on the keys at once (as before the record was kept)."""

    def _nothing_grantable(self, t, P, exact):
        found = super()._nothing_grantable(t, P, exact)
        self._store_probe()
        return found


@pytest.mark.parametrize("backend", sorted(ENGINES))
@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("hooked", [True, False])
def test_probe_rows_and_record(backend, seed, hooked):
    """The probe's key rows are kept between probes and its reasons wait in one record
    until something reads key stamps (none reads them while it waits): the rows it decides are always those of the queue's
    keys now (in their order), a probe never writes into the reasons of the record it may
    not replace (one that finds something grantable leaves it as it was), and the run
    equals one that stores every probe's reasons at once. ``hooked``: the broker's probe,
    checked at every call; else as it runs, where ``FastAcquire`` probes in C (the same
    writes) when the rows are kept, the record checked and stored after every step."""
    ops = _ops(100 + seed, 700)
    if not hooked:                           # acquires that move the clock
        ops = [x for op in ops for x in
               ([("tick", 0.003), op] if op[0] == "acquire" else
                [("tick", op[1])] if op[0] == "clock" else [op])]
    lazy = _broker(backend, True, True)
    eager = _Eager(Pool(gpu=24, cpu=8), clock=ManualClock(0.0), backend=backend, ttl=40.0,
                   journal=MemoryJournal(chunk=16))
    for name, env in lazy.envelopes.items():
        eager.register(name, env)
    kern = lazy._k
    seen = {"probes": 0, "kept": 0, "reads": 0, "python": 0}

    class Checking:
        def __getattr__(self, name):
            return getattr(kern, name)

        @staticmethod
        def decide_keys(st, rows, t, out):
            fresh = [[q.c, q.d, q.k, q.nmins[0], q.dur, q.spend]
                     for q in lazy._pkeys.values()]
            assert rows.tolist() == fresh
            rec = lazy._probe
            before = None if rec is None else rec[2][:len(rec[1])].copy()
            assert rec is None or rec[2] is not out
            j = kern.decide_keys(st, rows, t, out)
            seen["probes"] += 1
            if rec is not None and j >= 0:
                seen["kept"] += 1
                assert lazy._probe is rec and np.array_equal(rec[2][:len(rec[1])], before)
            return j

    def reason_of(p):                      # key stamps are read only with no record
        assert lazy._probe is None
        seen["reads"] += 1
        return Broker._reason_of(p)

    serve = lazy._serve_pending

    def counted(t):
        seen["python"] += 1
        return serve(t)

    if hooked:
        lazy._k = Checking()
        lazy._reason_of = reason_of
    else:
        lazy._serve_pending = counted          # (FastAcquire calls the instance's)
    def marks(b):
        return ([(q.stamp, q.seg_at, q.seg_why) for q in b._pkeys.values()],
                [(p.reason, p.rstamp) for p in b._pending.values()])

    for i, (x, y) in enumerate(zip(_run(lazy, ops), _run(eager, ops))):
        assert x == y, f"step {i}: {ops[i] if i < len(ops) else 'end'}"
        if not hooked:
            # the next probe (C or broker) writes the buffer the record does not hold,
            # and the record, stored now, gives the keys what storing at once gave
            rec = lazy._probe
            assert rec is None or rec[2] is not lazy._pbufs[lazy._pflip], i
            lazy._store_probe()
            assert marks(lazy) == marks(eager), i
    a, b = lazy.journal.rows(), eager.journal.rows()
    assert a.shape == b.shape and a.tobytes() == b.tobytes()
    assert lazy._pass == eager._pass
    lazy._store_probe()
    assert ([(q.stamp, q.seg_at, q.seg_why) for q in lazy._pkeys.values()]
            == [(q.stamp, q.seg_at, q.seg_why) for q in eager._pkeys.values()])
    if hooked:
        assert seen["probes"] > 50 and seen["kept"] > 0 and seen["reads"] > 0
    elif lazy._fast is not None:
        assert lazy._pass > seen["python"] + 20, (lazy._pass, seen)  # FastAcquire probed
