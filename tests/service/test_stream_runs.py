"""Runs of intents on the decision stream: a slice's consecutive intents that one
``Broker._acquire_many`` decides (the compiled batch loop) answer exactly as one
``acquire`` per intent does.

Two services are built alike; the same stream-shaped messages go through a session's
``_decide`` on both, one deciding runs of intents together and the other one operation per
message (the stream without it). Every answer (decision dicts, seqs and
errors included), the journal's bytes, the broker's state and the event log must be equal,
slice after slice, with time moving between slices (expiries, pending grants, TTLs). On
the reference backend (``BURSARCORE_NO_EXTENSIONS=1``) there is no such call and
both sides take the single path.
"""

from __future__ import annotations

import copy
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bursarcore import Envelope, Intent, ManualClock, Pool
from bursarcore.admission.envelope import intent_inputs
from bursarcore.broker import Broker
from bursarcore.journal import MemoryJournal
from bursarcore.service.stream import RUN, StreamSession, _array, _decode_array
from bursarcore.service.testing import InProcessService
from service_classes import CLASSES

pytest.importorskip("msgpack")

T0 = 1.7e9
CONFIG = {
    "pool": {"gpu": 24, "flow": {"fs": 10.0}},
    "classes": copy.deepcopy(CLASSES),
    "ttl": 60.0,
    "campaigns": {
        "alpha": {"credits": 400, "service_class": "agent-burst",
                  "guaranteed": {"gpu": 6, "fs": 1}, "sustained": {"gpu": 6, "fs": 2},
                  "ceiling": {"gpu": 16, "fs": 4}, "burst": {"gpu": 4000, "fs": 10}},
        "beta": {"credits": 10000, "service_class": "interactive",
                 "guaranteed": {"gpu": 8, "fs": 1}, "sustained": {"gpu": 16, "fs": 2},
                 "ceiling": {"gpu": 20, "fs": 4}, "burst": {"gpu": 20000, "fs": 10}},
        "gamma": {"credits": None, "service_class": "opportunistic",
                  "sustained": {"gpu": 24}, "ceiling": {"gpu": 24}, "burst": {"gpu": None}},
    },
}
CAMPAIGNS = ("alpha", "beta", "gamma")
CLASSES = (None, None, None, "interactive", "agent-burst", "opportunistic")


class Side:
    """One service and an operator's stream session over it (no socket: the session's
    ``_decide`` is called directly and its queued answers decoded)."""

    def __init__(self, runs: bool) -> None:
        self.svc = InProcessService(copy.deepcopy(CONFIG), start=T0)
        ctx = copy.copy(self.svc.app.state.streams)
        # runs wherever the broker has them, whether or not they pay on this binding
        ctx.acquire_many = getattr(self.svc.broker, "_acquire_many", None) if runs else None
        self.ran = 0
        if ctx.acquire_many is not None:
            many = ctx.acquire_many

            def counted(intents):
                self.ran += 1
                return many(intents)

            ctx = copy.copy(ctx)
            ctx.acquire_many = counted
        p = self.svc.store.authenticate(self.svc.tokens["operator"])
        self.session = StreamSession(None, ctx, p, None, -1, False)

    def decide(self, messages: list[dict]) -> list[dict]:
        s = self.session
        s.out.clear()
        s._decide(copy.deepcopy(messages), True)
        return [d for c in s.out for d in _decode_array(_array([c.body], c.n, True), True)]

    def advance(self, dt: float) -> None:
        self.svc.clock.advance(dt)
        with self.svc.service.lock:
            self.svc.broker.poll()

    def picture(self) -> tuple:
        b = self.svc.broker
        return (b.journal.rows().tobytes(), b.state(), b.pending(),
                list(self.svc.service._events))


def _message(draw, i: int, leases: list[int]) -> dict:
    kind = draw(st.sampled_from(["acquire"] * 8 + ["release", "consume", "bad"]))
    m: dict = {"id": i, "op": kind, "campaign": draw(st.sampled_from(CAMPAIGNS))}
    if kind == "release":
        m["lease"] = draw(st.sampled_from(leases)) if leases else 0
        return m
    if kind == "consume":
        m.update(dim="fs", amount=draw(st.sampled_from([0.5, 3.0])))
        return m
    if kind == "bad":
        m.update(op="acquire", max=draw(st.sampled_from([0, "x"])), duration=10)
        return m
    hi = draw(st.sampled_from([1, 2, 3, 5, 8, 12, 14, 20, 30]))
    m["max"] = hi
    if draw(st.booleans()):
        m["min"] = draw(st.integers(1, hi))
    m["duration"] = draw(st.sampled_from([0.5, 5.0, 40.0, 300.0, 3000.0]))
    cls = draw(st.sampled_from(CLASSES))
    if cls is not None:
        m["service_class"] = cls
    extra = draw(st.sampled_from([None] * 6 + ["ttl", "deadline", "past", "max_spend"]))
    if extra == "ttl":
        m["ttl"] = draw(st.sampled_from([1.0, 30.0]))
    elif extra == "deadline":
        m["deadline"] = T0 + 1e5
    elif extra == "past":
        m["deadline"] = T0 - 1.0
    elif extra == "max_spend":
        m["max_spend"] = draw(st.sampled_from([0.001, 50.0]))
    return m


def _script(data) -> list[tuple[float, list[int]]]:
    """Slices of message numbers, each after a move of the clock."""
    out = []
    n = 0
    for _ in range(data.draw(st.integers(1, 6))):
        k = data.draw(st.integers(1, 40))
        out.append((data.draw(st.sampled_from([0.0, 0.0, 0.7, 2.0, 45.0, 400.0])),
                    list(range(n, n + k))))
        n += k
    return out


def _run(script, data) -> tuple[Side, Side]:
    a, b = Side(runs=True), Side(runs=False)
    leases: list[int] = []
    for dt, slots in script:
        if dt:
            a.advance(dt)
            b.advance(dt)
        msgs = [_message(data.draw, i, leases) for i in slots]
        got, want = a.decide(msgs), b.decide(msgs)
        assert got == want
        for d in got:
            lease = (d.get("decision") or {}).get("lease")
            if lease:
                leases.append(lease["id"])
        assert a.picture() == b.picture()
    return a, b


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_runs_answer_as_one_acquire_per_intent(data):
    _run(_script(data), data)


def test_every_outcome_goes_through_a_run():
    """A fixed script whose runs meet warm grants, reclaims, pending intents and
    refusals, in mixed classes and campaigns, as time moves."""
    a, b = Side(runs=True), Side(runs=False)
    seen = set()
    msgs = [{"id": i, "op": "acquire", "campaign": "gamma", "max": 6, "duration": 300.0}
            for i in range(4)]
    msgs += [{"id": 10 + i, "op": "acquire", "campaign": c, "min": lo, "max": hi,
              "duration": du, **({"service_class": k} if k else {})}
             for i, (c, lo, hi, du, k) in enumerate([
                 ("alpha", 16, 16, 3000.0, None), ("alpha", 1, 4, 40.0, None),
                 ("beta", 12, 12, 5.0, "interactive"), ("alpha", 17, 17, 300.0, None),
                 ("alpha", 14, 14, 300.0, "opportunistic"), ("beta", 20, 20, 300.0, None),
                 ("gamma", 2, 2, 5.0, None), ("alpha", 6, 6, 300.0, None),
                 ("beta", 1, 1, 5.0, "agent-burst"), ("alpha", 1, 1, 300.0, None),
                 ("beta", 8, 8, 40.0, None)])]
    msgs += [{"id": 30 + i, "op": "acquire", "campaign": "alpha", "max": 9,
              "duration": 300.0} for i in range(6)]
    for dt in (0.0, 0.7, 2.0, 45.0, 400.0):
        if dt:
            a.advance(dt)
            b.advance(dt)
        got, want = a.decide(msgs), b.decide(msgs)
        assert got == want
        for d in got:
            dec = d["decision"]
            seen.add((dec["outcome"], dec["path"] or dec["reason"]))
        assert a.picture() == b.picture()
    if a.session.ctx.acquire_many is not None:
        assert a.ran >= 5
    assert {("granted", "warm"), ("granted", "reclaim"), ("refused", "tokens"),
            ("refused", "ceiling"), ("refused", "capacity"), ("pending", "capacity")} <= seen


class _Grants:
    """A broker's FastAcquire with its ``grants`` counted: the segments it built."""

    def __init__(self, fast) -> None:
        self.fast, self.built, self.declined = fast, 0, 0

    def __getattr__(self, name):
        return getattr(self.fast, name)

    def grants(self, decs, iid0, j0, j, *rest):
        got = self.fast.grants(decs, iid0, j0, j, *rest)
        if got == j:
            self.built += j - j0
        else:
            assert got == j0
            self.declined += 1
        return got


def test_a_runs_grants_are_built_by_the_compiled_path():
    """With the Cython binding a segment of warm grants gets its decisions and leases from
    ``FastAcquire.grants`` and a segment holding a refusal from the broker's builders:
    both answer as one acquire each."""
    a, b = Side(runs=True), Side(runs=False)
    fast = getattr(a.svc.broker, "_fast", None)
    if fast is None or a.session.ctx.acquire_many is None:
        pytest.skip("FastAcquire is the Cython binding's")
    counted = a.svc.broker._fast = _Grants(fast)
    grants = [{"id": i, "op": "acquire", "campaign": CAMPAIGNS[i % 2], "max": 1,
               "duration": 40.0} for i in range(6)]
    mixed = [{"id": 20 + i, "op": "acquire", "campaign": c, "max": m, "duration": 300.0}
             for i, (c, m) in enumerate([("alpha", 1), ("beta", 2), ("alpha", 17),
                                         ("beta", 1)])]
    for msgs in (grants, mixed, grants):
        got, want = a.decide(msgs), b.decide(msgs)
        assert got == want
        assert a.picture() == b.picture()
        outcomes = [(d["decision"]["outcome"], d["decision"]["reason"]) for d in got]
        assert outcomes == ([("granted", None)] * 6 if msgs is grants else
                            [("granted", None)] * 2 + [("refused", "ceiling"), ("granted", None)])
    assert counted.built == 12 and counted.declined == 1


def test_compiled_inputs_are_intent_inputs():
    """``FastAcquire.inputs`` (a run's intents, read in compiled code) reads a plain intent
    as ``intent_inputs`` does, and leaves every other to it."""
    b = InProcessService(copy.deepcopy(CONFIG), start=T0).broker
    fast = getattr(b, "_fast", None)
    if fast is None:
        pytest.skip("FastAcquire is the Cython binding's")
    plain = [Intent(c, units={"gpu": u}, duration=du, service_class=k, ttl=ttl)
             for c in CAMPAIGNS for u in (1, (2, 5)) for du in (0.5, 300, 3000.0)
             for k in CLASSES[2:] for ttl in (None, 1.0, 30)]
    for x in plain:
        assert fast.inputs(x) == intent_inputs(b, x), x
    others = [Intent("alpha", units={"gpu": 1}, duration=5.0, deadline=T0 + 10),
              Intent("alpha", units={"gpu": 1}, duration=5.0, max_spend=1.0),
              Intent("nobody", units={"gpu": 1}, duration=5.0),
              Intent("alpha", units={"fs": 1}, duration=5.0), "an intent"]
    assert [fast.inputs(x) for x in others] == [None] * len(others)


# ------------------------------------------------------------------ the broker's own call
def _broker(eb: str) -> Broker:
    b = Broker(Pool(gpu=32), clock=ManualClock(0.0), backend=eb, journal=MemoryJournal())
    for i in range(4):
        b.register(f"c{i}", Envelope(credits=60 if i % 2 else math.inf,
                                     service_class="opportunistic" if i == 3 else "agent-burst",
                                     guaranteed={"gpu": 6}, sustained={"gpu": 8},
                                     ceiling={"gpu": 48 if i == 0 else 24},
                                     burst={"gpu": 3000}))
    return b


INTENTS = st.lists(st.builds(
    lambda c, lo, hi, du, k, ttl: Intent(f"c{c}", units={"gpu": (min(lo, hi), hi)},
                                         duration=du, service_class=k, ttl=ttl),
    st.integers(0, 3), st.integers(1, 12), st.sampled_from([1, 2, 5, 9, 12, 30, 40]),
    st.sampled_from([0.5, 10.0, 200.0, 1000.0]), st.sampled_from([None, None, "interactive",
                                                          "opportunistic"]),
    st.sampled_from([None, None, 5.0])), min_size=0, max_size=30)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0.0, 0.6, 20.0]), INTENTS), min_size=1,
                max_size=5))
def test_acquire_many_is_a_sequence_of_acquires(steps):
    from bursarcore.broker import ENGINES
    if "compiled" not in ENGINES:
        pytest.skip("_acquire_many is the compiled broker's")
    a, b = _broker("compiled"), _broker("compiled")
    for dt, intents in steps:
        a.clock.advance(dt)
        b.clock.advance(dt)
        got = [d.to_dict() for d in a._acquire_many(intents)]
        want = [b.acquire(x).to_dict() for x in intents]
        assert got == want
        assert a.journal.rows().tobytes() == b.journal.rows().tobytes()
        assert a.state() == b.state() and a.pending() == b.pending()
        assert [e.__dict__ if hasattr(e, "__dict__") else e for e in a.poll()] == \
            [e.__dict__ if hasattr(e, "__dict__") else e for e in b.poll()]
    assert RUN >= 2


def test_a_refusals_retry_after_is_the_state_at_the_refusal():
    """A refusal followed, in the same run, by grants that move what its retry_after
    reads (the next expiry; the campaign's bucket) answers as the acquire did then."""
    from bursarcore.broker import ENGINES
    if "compiled" not in ENGINES:
        pytest.skip("_acquire_many is the compiled broker's")
    a, b = _broker("compiled"), _broker("compiled")
    xs = [Intent("c1", units={"gpu": 3}, duration=200.0),
          Intent("c0", units={"gpu": 40}, duration=10.0),      # capacity, never
          Intent("c0", units={"gpu": (1, 2)}, duration=0.5),   # an earlier expiry
          Intent("c2", units={"gpu": 12}, duration=1000.0),    # tokens, never
          Intent("c2", units={"gpu": 7}, duration=0.5),        # c2 holds more
          Intent("c0", units={"gpu": 40}, duration=10.0)]
    got = [d.to_dict() for d in a._acquire_many(xs)]
    want = [b.acquire(x).to_dict() for x in xs]
    assert got == want
    assert [(d["outcome"], d["reason"]) for d in got] == [
        ("granted", None), ("refused", "capacity"), ("granted", None), ("refused", "tokens"),
        ("granted", None), ("refused", "capacity")]
    assert got[1]["retry_after"] == 200.0 and got[5]["retry_after"] == 0.5
    assert a.journal.rows().tobytes() == b.journal.rows().tobytes()
    assert a.state() == b.state()


def _intents(n: int, first: int = 0) -> list[dict]:
    return [{"id": first + i, "op": "acquire", "campaign": CAMPAIGNS[i % 2], "max": 1,
             "duration": 60.0} for i in range(n)]


def test_a_run_refused_before_deciding_is_decided_one_intent_at_a_time():
    a, b = Side(runs=True), Side(runs=False)
    if a.session.ctx.acquire_many is None:
        pytest.skip("no runs on this backend")
    tries = []

    def broken(intents):
        tries.append(len(intents))
        raise RuntimeError("before any decision")

    a.session.ctx.acquire_many = broken
    msgs = _intents(6)
    assert a.decide(msgs) == b.decide(msgs)
    assert tries == [6] and not a.session.failed
    assert a.picture() == b.picture()


def test_a_run_that_fails_after_journaling_stops_the_service():
    a = Side(runs=True)
    many = a.session.ctx.acquire_many
    if many is None:
        pytest.skip("no runs on this backend")

    def broken(intents):
        many(intents[:2])
        raise RuntimeError("after two decisions")

    a.session.ctx.acquire_many = broken
    got = a.decide([*_intents(5), {"id": 99, "op": "consume", "campaign": "alpha",
                                   "dim": "fs", "amount": 1.0}])
    assert [(d["id"], d["type"], d["status"]) for d in got] == \
        [(i, "error", 503) for i in range(5)]
    assert a.session.failed and a.svc.service.failed is not None


def test_the_stream_takes_runs_where_the_broker_has_them():
    svc = InProcessService(copy.deepcopy(CONFIG), start=T0)
    b = svc.broker
    many = svc.app.state.streams.acquire_many
    if not hasattr(b, "_acquire_many"):
        assert many is None
    else:
        assert many == b._acquire_many
