"""``Broker.acquire``'s fast path against the broker's general path and the reference
broker (SPEC §2, §11.7).

A hypothesis state machine drives, with the same operations, three brokers:

* ``reference`` — the reference broker, written from the specification;
* ``general`` — the compiled backend with its fast path off (when built);
* ``compiled`` — the compiled backend with ``_acquire.FastAcquire`` (when built).

The broker also expires leases through ``FastAcquire.expire`` (no subscriber), so every
clock move and poll compares that too.

Each example runs without a journal, with a :class:`MemoryJournal` or with a
:class:`SQLiteJournal` (group commit, or ``durable=True``): the fast paths then write the
journal records themselves, and the journals must be equal byte for byte (compared record
by record after every step, the first difference named), every decision's ``seq`` must be
durable when ``acquire`` returns on a durable broker, and ``Broker.replay`` of each journal
must rebuild a byte-identical journal.

After every step: equal decisions (field by field, with equal Python types), equal events,
equal ``state()`` (and, between the two compiled brokers, equal engine arrays). The intents
mix the fast path's plain values with the inputs it hands back to the general path (unknown
campaigns, numpy ints, bad values, deadlines, pending queues, subscribers), so both
branches run. Without extensions (``BURSARCORE_NO_EXTENSIONS=1``) only the reference is
left, and the machine checks its journals replay.
"""

from __future__ import annotations

import math
import shutil
import tempfile

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from bursarcore import Broker, Envelope, Intent, ManualClock, Pool
from bursarcore.broker import BACKENDS
from bursarcore.errors import BursarError
from bursarcore.journal import MemoryJournal, SQLiteJournal
from bursarcore.journal.records import FIELDS, to_dict

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

    def events(self, ev, take):
        return self.fast.events(ev, take)


def _journal(jkind, tmp, i):
    if isinstance(jkind, type):
        return jkind()
    if jkind == "memory":
        return MemoryJournal(chunk=16)
    if jkind in ("sqlite", "sqlite-durable"):
        return SQLiteJournal(f"{tmp}/j{i}.db", batch=7, create=True)
    return None


def _brokers(pool_kw, instant, jkind=None, tmp=None):
    out = []
    kinds = ["reference"] + (["general", "compiled"] if "compiled" in BACKENDS else [])
    for i, kind in enumerate(kinds):
        be = "reference" if kind == "reference" else "compiled"
        pool = Pool(**pool_kw)
        b = Broker(pool, clock=ManualClock(0.0), backend=be,
                   enforcement="instant" if instant else "prepaid", ttl=50.0,
                   journal=_journal(jkind, tmp, i), durable=jkind == "sqlite-durable")
        if kind == "general":
            b._fast = None
        elif kind == "compiled" and b._fast is not None:   # (cffi has no fast path)
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


def same_journals(kinds, bk):
    """The brokers' journals hold the same records, byte for byte (the first record that
    differs is named, field by field)."""
    if bk[0].journal is None:
        return
    rows = [b.journal.rows() for b in bk]
    pls = [b.journal.payloads() for b in bk]
    for kind, r, pl in zip(kinds[1:], rows[1:], pls[1:]):
        assert r.shape == rows[0].shape, (kind, r.shape, rows[0].shape)
        if r.tobytes() != rows[0].tobytes():
            a = rows[0].view(np.uint8).reshape(r.shape[0], -1)
            m = r.view(np.uint8).reshape(r.shape[0], -1)
            i = int(np.flatnonzero((a != m).any(axis=1))[0])
            want, got = to_dict(rows[0][i]), to_dict(r[i])
            diff = {f: (got[f], want[f]) for f in FIELDS if got[f] != want[f]}
            raise AssertionError((kind, "record", i, want["op"], diff))
        assert pl == pls[0], kind


class FastDiff(RuleBasedStateMachine):
    @initialize(gpu=st.integers(8, 64), head=st.sampled_from([0, 0, 2]),
                nodes=st.sampled_from([1, 4]), instant=st.sampled_from([False, False, True]),
                jkind=st.sampled_from([None, "memory", "memory", "sqlite", "sqlite-durable"]))
    def setup(self, gpu, head, nodes, instant, jkind):
        per = -(-gpu // nodes)
        slots = [(f"n{j}", min(per, gpu - j * per)) for j in range(nodes) if gpu - j * per > 0]
        self.tmp = tempfile.mkdtemp() if jkind else None
        self.kinds, self.bk = _brokers({"gpu": gpu, "warm_headroom": {"gpu": head},
                                        "slots": {"gpu": slots}}, instant, jkind, self.tmp)
        self.names: list[str] = []
        self.seen: list[list] = [[] for _ in self.bk]
        self.subscribed = False

    def all(self, method, *args):
        res = [_result(getattr(b, method), *args) for b in self.bk]
        for kind, r in zip(self.kinds[1:], res[1:]):
            assert r == res[0], (method, args, kind, r, res[0])
        for b in self.bk:
            # a durable broker acknowledges a decision only once its record is durable
            if b.durable and res[0][0] == "ok" and method == "acquire":
                assert b.journal.durable_seq == len(b.journal) - 1
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
        lo = data.draw(st.integers(1, hi))
        units = data.draw(st.sampled_from([hi, (lo, hi), [lo, hi], np.int64(hi), float(hi)]))
        now = self.bk[0].clock.now()
        dur = data.draw(st.sampled_from([0.5, 5.0, 30.0, 120, 900.0, np.float64(7.0)]))
        intent = Intent(name, {"gpu": units}, duration=dur,
                        deadline=data.draw(st.sampled_from([None, None, now, now + 90.0,
                                                            now - 1.0, int(now) + 5, -1e-9])),
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
        # ids of live, ended and never-granted leases alike (errors must agree too)
        self.all("release", data.draw(st.integers(0, 40)))

    @rule(data=st.data())
    def renew(self, data):
        self.all("renew", data.draw(st.integers(0, 40)), data.draw(st.sampled_from([1.0, 30.0])))

    @rule(data=st.data())
    def cancel(self, data):
        self.all("cancel", data.draw(st.integers(0, 60)))

    @rule()
    def subscribe(self):
        if not self.subscribed:
            self.subscribed = True
            for i, b in enumerate(self.bk):
                b.subscribe(self.seen[i].append)

    @rule(dt=st.sampled_from([0.0, 0.25, 1.0, 5.0, 30.0, 61.0, 200.0]))
    def clock(self, dt):
        for b in self.bk:
            b.clock.advance(dt)

    @rule()
    def poll(self):
        self.all("poll")

    def same_states(self):
        states = [b.state() for b in self.bk]
        for s in states:
            s.pop("backend")
        for kind, s in zip(self.kinds[1:], states[1:]):
            assert s == states[0], kind

    @invariant()
    def same_everything(self):
        if not hasattr(self, "bk"):
            return
        if self.bk[0].journal is None:
            self.same_states()
        else:
            # state() settles every token bucket without a record, so a journal whose
            # broker answered state() between decisions does not replay (the general
            # path's as well): with a journal, compare what state() shows without it (the
            # queue, the journal, the compiled arrays below) and call it at the end
            pend = [_typed(b.pending()) for b in self.bk]
            for kind, p in zip(self.kinds[1:], pend[1:]):
                assert p == pend[0], kind
        seen = [_typed(s) for s in self.seen]
        assert all(s == seen[0] for s in seen[1:])
        same_journals(self.kinds, self.bk)
        compiled = [b for b in self.bk if hasattr(b, "st")]
        a = compiled[0].st if compiled else None
        for b in compiled[1:]:
            for k, x in vars(a).items():
                if k == "binding_view":
                    continue
                y = getattr(b.st, k)
                if isinstance(x, np.ndarray):
                    assert x.dtype == y.dtype and np.array_equal(x, y), k
                else:
                    assert x == y, k

    def teardown(self):
        try:
            # the fast paths answered some calls (else this tests nothing but the fallback)
            if hasattr(self, "bk"):
                hits = [b._fast.hits for b in self.bk if getattr(b, "_fast", None) is not None]
                assert len(set(hits)) <= 1, hits
                # each journal replays (both backends) to the same records, byte for byte
                for b in self.bk:
                    if b.journal is None:
                        continue
                    b.poll()
                    want = b.journal.rows().tobytes()
                    for be in BACKENDS:
                        r = Broker.replay(b.journal, backend=be, resume=False)
                        assert r.journal.rows().tobytes() == want, be
                if self.bk[0].journal is not None:
                    self.same_states()
        finally:
            for b in getattr(self, "bk", []):
                if isinstance(b.journal, SQLiteJournal):
                    b.journal.close()
            if getattr(self, "tmp", None):
                shutil.rmtree(self.tmp, ignore_errors=True)


TestFastDiff = FastDiff.TestCase
TestFastDiff.settings = settings(stateful_step_count=30, max_examples=100, deadline=None,
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
        if getattr(b, "_fast", None) is not None:
            assert b._fast.hits == 2
            assert b._fast.fast.acquire(Intent("nobody", {"gpu": 1}, duration=1.0)) is None
    decs = []
    for b in bk:
        # a numpy count is a plain int inside the Intent (checked at its edge): the
        # shortcut answers it like any other
        numpy_count = Intent("a", {"gpu": np.int64(1)}, duration=1.0)
        assert type(numpy_count.units["gpu"]) is int
        decs.append(_typed(b.acquire(numpy_count)))
        if getattr(b, "_fast", None) is not None:
            assert b._fast.hits == 3
    assert all(d == decs[0] for d in decs) and "granted" in str(decs[0]["outcome"])
    decs = []
    for b in bk:
        b.clock.advance(1.0)
        decs.append(_typed(b.acquire(Intent("a", {"gpu": 2}, duration=5.0))))
    assert all(d == decs[0] for d in decs)


def test_fast_path_with_a_journal():
    """With a journal the fast path still answers, writes the general path's records (seq
    in the decision), and a journal whose ``add`` is overridden takes the general path."""
    class Custom(MemoryJournal):
        def add(self, fields, payload=None):
            return super().add(fields, payload)

    tmp = tempfile.mkdtemp()
    try:
        for jkind in ("memory", "sqlite-durable", Custom):
            kinds, bk = _brokers({"gpu": 16}, False, jkind, tempfile.mkdtemp(dir=tmp))
            for b in bk:
                b.register("a", Envelope(credits=math.inf, sustained={"gpu": 8},
                                         ceiling={"gpu": 8}, burst={"gpu": math.inf}))
                b.clock.advance(1.0)
                d1 = b.acquire(Intent("a", {"gpu": 2}, duration=5.0))
                b.clock.advance(10.0)
                d2 = b.acquire(Intent("a", {"gpu": (1, 3)}, duration=5.0))
                assert d1.granted and d2.granted and 0 <= d1.seq < d2.seq
                assert b.journal.record(d2.seq)["op"] == "acquire"
                assert b.journal.record(d2.seq - 1)["op"] == "expire"
                if b.durable:
                    assert b.journal.durable_seq == d2.seq
                if getattr(b, "_fast", None) is not None:
                    assert b._fast.hits == (0 if jkind is Custom else 2)
            same_journals(kinds, bk)
            for b in bk:
                if isinstance(b.journal, SQLiteJournal):
                    b.journal.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
