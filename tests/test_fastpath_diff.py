"""``Broker.acquire``'s fast path against the broker's general path (SPEC §2, §11.7).

A hypothesis state machine drives, with the same operations, brokers that differ only in
how ``acquire`` runs:

* ``general`` — reference backend, the general path (the specification);
* ``ref-fast`` — reference backend with :class:`bursarcore.reference.fastpath.FastAcquire`;
* ``compiled`` — the compiled backend with its own ``_engine.FastAcquire`` (when built);
* ``cmp-reffast`` — the compiled backend with the reference ``FastAcquire`` (when built).

The broker also expires leases through ``FastAcquire.expire`` (no journal, no subscriber),
so every clock move and poll compares that too.

After every step: equal decisions (field by field, with equal Python types), equal events,
equal ``state()`` and equal engine arrays. The intents mix the fast path's plain values
with the inputs it hands back to the general path (unknown campaigns, numpy ints, bad
values, deadlines, pending queues, subscribers), so both branches run. Runs with and
without extensions (``BURSARCORE_NO_EXTENSIONS=1`` leaves the first two).
"""

from __future__ import annotations

import math

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from bursarcore import Broker, Envelope, Intent, ManualClock, Pool
from bursarcore.broker import ENGINES, Decision, Event, Lease
from bursarcore.errors import BursarError
from bursarcore.reference.fastpath import FastAcquire as RefFast

CLASS_NAMES = ["deadline", "interactive", "agent-burst", "opportunistic"]


class Counting:
    """Wraps a FastAcquire and counts the calls it answered (not None)."""

    def __init__(self, fast):
        self.fast, self.hits, self.calls = fast, 0, 0

    def acquire(self, intent):
        self.calls += 1
        r = self.fast.acquire(intent)
        self.hits += r is not None
        return r

    def expire(self, t):
        return self.fast.expire(t)


def _brokers(pool_kw, instant):
    out = []
    kinds = ["general", "ref-fast"] + (["compiled", "cmp-reffast"] if "compiled" in ENGINES
                                         else [])
    for kind in kinds:
        be = "compiled" if kind in ("compiled", "cmp-reffast") else "reference"
        pool = Pool(**pool_kw)
        b = Broker(pool, clock=ManualClock(0.0), backend=be,
                   enforcement="instant" if instant else "prepaid", ttl=50.0)
        if kind == "general":
            b._fast = None
        elif kind in ("ref-fast", "cmp-reffast"):
            b._fast = Counting(RefFast(b, Decision, Lease, Event, Intent))
        else:
            b._fast = Counting(b._fast)
        out.append(b)
    return kinds, out


def _typed(x):
    """A value with the Python types of every part spelled out (1 != 1.0 != True here)."""
    if hasattr(x, "to_dict"):
        x = x.to_dict()
    if isinstance(x, dict):
        return {k: _typed(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [type(x).__name__] + [_typed(v) for v in x]
    if isinstance(x, float) and math.isnan(x):
        return ("nan",)
    return (type(x).__name__, x)


def _result(fn, *args):
    try:
        return "ok", _typed(fn(*args))
    except BursarError as exc:
        return "raise", (type(exc).__name__, str(exc))


@st.composite
def envelopes(draw):
    g = draw(st.integers(0, 3))
    s = draw(st.integers(g, g + 6))
    return Envelope(credits=draw(st.sampled_from([math.inf, 0.0, 0.5, 10.0, 1000.0])),
                    service_class=draw(st.sampled_from(CLASS_NAMES)),
                    guaranteed={"gpu": g}, sustained={"gpu": s},
                    ceiling={"gpu": draw(st.integers(s, s + 20))},
                    burst={"gpu": draw(st.sampled_from([math.inf, 0, 60.0, 600.0]))})


class FastDiff(RuleBasedStateMachine):
    @initialize(gpu=st.integers(8, 64), head=st.sampled_from([0, 0, 2]),
                nodes=st.sampled_from([1, 4]), instant=st.sampled_from([False, False, True]))
    def setup(self, gpu, head, nodes, instant):
        per = -(-gpu // nodes)
        slots = [(f"n{j}", min(per, gpu - j * per)) for j in range(nodes) if gpu - j * per > 0]
        self.kinds, self.bk = _brokers({"gpu": gpu, "warm_headroom": {"gpu": head},
                                        "slots": {"gpu": slots}}, instant)
        self.names: list[str] = []
        self.seen: list[list] = [[] for _ in self.bk]

    def all(self, method, *args):
        res = [_result(getattr(b, method), *args) for b in self.bk]
        for kind, r in zip(self.kinds[1:], res[1:]):
            assert r == res[0], (method, args, kind, r, res[0])
        return res[0]

    @rule(data=st.data())
    def register(self, data):
        name = f"c{len(self.names)}"
        if self.all("register", name, data.draw(envelopes()))[0] == "ok":
            self.names.append(name)

    @precondition(lambda self: self.names)
    @rule(data=st.data())
    def acquire(self, data):
        name = data.draw(st.sampled_from(self.names + ["nobody"]))
        hi = data.draw(st.integers(1, 24))
        lo = data.draw(st.integers(0, hi))
        units = data.draw(st.sampled_from([hi, (lo, hi), [lo, hi], np.int64(hi), float(hi)]))
        now = self.bk[0].clock.now()
        dur = data.draw(st.sampled_from([0.5, 5.0, 30.0, 120, 900.0, np.float64(7.0)]))
        intent = Intent(name, {"gpu": units}, duration=dur,
                        deadline=data.draw(st.sampled_from([None, None, now, now + 90.0,
                                                            now - 1.0, int(now) + 5])),
                        max_spend=data.draw(st.sampled_from([None, None, 0.0, 0.5, 50.0, 3])),
                        service_class=data.draw(st.sampled_from([None, None] + CLASS_NAMES)),
                        ttl=data.draw(st.sampled_from([None, None, 10.0, 100, 0.25])))
        self.all("acquire", intent)

    @precondition(lambda self: self.names)
    @rule(data=st.data())
    def many(self, data):
        """A run of plain intents at one instant or spread over a little time."""
        step = data.draw(st.sampled_from([0.0, 0.01, 0.5, 3.0]))
        for _ in range(data.draw(st.integers(1, 12))):
            name = data.draw(st.sampled_from(self.names))
            n = data.draw(st.integers(1, 6))
            for b in self.bk:
                b.clock.advance(step)
            self.all("acquire", Intent(name, {"gpu": n}, duration=data.draw(
                st.sampled_from([1.0, 2.5, 10.0]))))

    @rule(data=st.data())
    def release(self, data):
        n = self.bk[0].st.nleases
        if n:
            self.all("release", data.draw(st.integers(0, n - 1)))

    @rule(data=st.data())
    def renew(self, data):
        n = self.bk[0].st.nleases
        if n:
            self.all("renew", data.draw(st.integers(0, n - 1)),
                     data.draw(st.sampled_from([1.0, 30.0])))

    @rule(data=st.data())
    def cancel(self, data):
        n = self.bk[0]._next_intent
        if n:
            self.all("cancel", data.draw(st.integers(0, n - 1)))

    @rule()
    def subscribe(self):
        for i, b in enumerate(self.bk):
            if not b._subscribers:
                b.subscribe(self.seen[i].append)

    @rule(dt=st.sampled_from([0.0, 0.25, 1.0, 5.0, 30.0, 61.0, 200.0]))
    def clock(self, dt):
        for b in self.bk:
            b.clock.advance(dt)

    @rule()
    def poll(self):
        self.all("poll")

    @invariant()
    def same_everything(self):
        if not hasattr(self, "bk"):
            return
        states = [b.state() for b in self.bk]
        for s in states:
            s.pop("backend")
        for kind, s in zip(self.kinds[1:], states[1:]):
            assert s == states[0], kind
        ev = [_typed(b._events) for b in self.bk]
        for kind, e in zip(self.kinds[1:], ev[1:]):
            assert e == ev[0], kind
        seen = [_typed(s) for s in self.seen]
        assert all(s == seen[0] for s in seen[1:])
        a = self.bk[0].st
        for b in self.bk[1:]:
            for k, x in vars(a).items():
                if k == "_cctx":
                    continue
                y = getattr(b.st, k)
                if isinstance(x, np.ndarray):
                    assert x.dtype == y.dtype and np.array_equal(x, y), k
                else:
                    assert x == y, k

    def teardown(self):
        # the fast paths answered some calls (else this tests nothing but the fallback)
        if hasattr(self, "bk"):
            hits = [b._fast.hits for b in self.bk if b._fast is not None]
            assert len(set(hits)) <= 1, hits


TestFastDiff = FastDiff.TestCase
TestFastDiff.settings = settings(stateful_step_count=30, max_examples=60,
                                 suppress_health_check=[HealthCheck.too_slow,
                                                        HealthCheck.filter_too_much])


def test_fast_path_answers_plain_intents():
    """The shortcut is taken for the common case, and refuses (None) what it must not do."""
    kinds, bk = _brokers({"gpu": 16}, False)
    for b in bk:
        b.register("a", Envelope(credits=math.inf, sustained={"gpu": 8}, ceiling={"gpu": 8},
                                 burst={"gpu": math.inf}))
    for b in bk:
        d = b.acquire(Intent("a", {"gpu": 2}, duration=5.0))
        assert d.granted and d.lease.units == 2
        b.clock.advance(10.0)
        d = b.acquire(Intent("a", {"gpu": (1, 3)}, duration=5.0))
        assert d.granted
        assert [e.kind for e in b.poll()] == ["expired"]
        if b._fast is not None:
            assert b._fast.hits == 2
            assert b._fast.fast.acquire(Intent("nobody", {"gpu": 1}, duration=1.0)) is None
            assert b._fast.fast.acquire(Intent("a", {"gpu": np.int64(1)}, duration=1.0)) is None
    decs = []
    for b in bk:
        b.clock.advance(1.0)
        decs.append(_typed(b.acquire(Intent("a", {"gpu": 2}, duration=5.0))))
    assert all(d == decs[0] for d in decs)
