"""Every public entry point against extreme and odd numbers, on every backend.

Each call is made on one broker per backend, built alike: the backends must raise the same
error (class and message) or reach the same decision and state; an error is always an
:class:`InvalidArgument` (never an OverflowError, TypeError or MemoryError from inside) and
leaves the state as it was.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bursarcore import Broker, Envelope, Intent, ManualClock, Pool
from bursarcore.broker import BACKENDS, ENGINES
from bursarcore.errors import InvalidArgument
from bursarcore.journal.memory import MemoryJournal

BASES = [0, -0.0, 5e-324, 2.2250738585072014e-308, 1e-6, 0.5, 1, 3, 7.0, 60, 2**24,
         2**24 + 1, 2**31, 2**53, 2**53 + 1, 2**62, 2**63, 2**64, 1e12, 1.0000001e12, 1e15,
         1e19, 1e308, -1, -1e-300, math.inf, -math.inf, math.nan, True, False]
DTYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
          np.float16, np.float32, np.float64, np.longdouble, np.bool_]


def _as(dtype, v):
    try:
        with np.errstate(all="ignore"):
            x = dtype(v)
    except (OverflowError, ValueError, TypeError):
        return None
    return x


ODD = st.one_of(
    st.sampled_from(BASES),
    st.builds(_as, st.sampled_from(DTYPES), st.sampled_from(BASES)).filter(
        lambda x: x is not None),
    st.sampled_from([None, "1", [1], (1, 2)]),
)


def build(eb):
    b = Broker(Pool(gpu=64, flow={"fs": 10.0}), clock=ManualClock(100.0), backend=eb,
               journal=MemoryJournal(), price={"fs": 0.01})
    b.register("a", Envelope(credits=1000, sustained={"gpu": 16, "fs": 2.0},
                             ceiling={"gpu": 32, "fs": 5.0}, burst={"gpu": 5000, "fs": 20.0}))
    b.register("g", Envelope(credits=math.inf, service_class="interactive",
                             guaranteed={"gpu": 8}, sustained={"gpu": 8}, ceiling={"gpu": 16}))
    b.acquire(Intent("a", {"gpu": 4}, 60))
    return b


def canon(x):
    """A comparable picture of a result (numpy arrays and dataclasses as lists/dicts)."""
    if hasattr(x, "to_dict"):
        return canon(x.to_dict())
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, tuple):
        return [canon(v) for v in x]
    if isinstance(x, list):
        return [canon(v) for v in x]
    if isinstance(x, dict):
        return {k: canon(v) for k, v in x.items()}
    if isinstance(x, float) and math.isnan(x):
        return "nan"
    return x


CALLS = {
    "acquire.units": lambda b, v: b.acquire(Intent("a", {"gpu": v}, 60)),
    "acquire.min": lambda b, v: b.acquire(Intent("a", {"gpu": (v, 8)}, 60)),
    "acquire.duration": lambda b, v: b.acquire(Intent("a", {"gpu": 2}, v)),
    "acquire.deadline": lambda b, v: b.acquire(Intent("a", {"gpu": 40}, 60, deadline=v)),
    "acquire.max_spend": lambda b, v: b.acquire(Intent("a", {"gpu": 2}, 60, max_spend=v)),
    "acquire.ttl": lambda b, v: b.acquire(Intent("a", {"gpu": 40}, 60, ttl=v)),
    "renew.duration": lambda b, v: b.renew(b.leases()[0].id, v),
    "renew.max_spend": lambda b, v: b.renew(b.leases()[0].id, 10, max_spend=v),
    "release.id": lambda b, v: b.release(v),
    "cancel.id": lambda b, v: b.cancel(v),
    "lease.id": lambda b, v: b.lease(v),
    "quote.size": lambda b, v: b.quote("a", [v], [60]),
    "quote.duration": lambda b, v: b.quote("a", [2], [v]),
    "admit_batch.units": lambda b, v: b.admit_batch([0], [v], 60.0),
    "admit_batch.durations": lambda b, v: b.admit_batch([0], [2], v),
    "admit_batch.duration_col": lambda b, v: b.admit_batch([0, 1], [2, 1], [60.0, v]),
    "admit_batch.ttl": lambda b, v: b.admit_batch([0], [40], 60.0, ttl=v),
    "admit_batch.idx": lambda b, v: b.admit_batch([v], [1], 60.0),
    "consume.amount": lambda b, v: b.consume("a", "fs", v),
    "consume_batch.amounts": lambda b, v: b.consume_batch([0], ["fs"], [v]),
    "register.credits": lambda b, v: b.register("n", Envelope(credits=v)),
    "register.ceiling": lambda b, v: b.register("n", Envelope(credits=1, ceiling={"gpu": v})),
    "register.burst": lambda b, v: b.register("n", Envelope(credits=1, burst={"gpu": v})),
    "register.flow": lambda b, v: b.register("n", Envelope(credits=1, sustained={"fs": v})),
    "register.share": lambda b, v: b.register("n", Envelope(credits=1, share=v)),
    "add_nodes.slots": lambda b, v: b.add_nodes("gpu", [("extra", v)]),
    "clock.advance": lambda b, v: (b.clock.advance(v), b.poll())[1],
    "pool.capacity": lambda b, v: Broker(Pool(gpu=v), backend=b.backend).state()["pool"],
}


def attempt(b, name, v):
    before = b.state()
    try:
        return ("ok", canon(CALLS[name](b, v)))
    except InvalidArgument as e:
        assert b.state() == before, f"{name}({v!r}) raised and changed the state"
        return ("invalid", type(e).__name__, e.field, str(e))


@pytest.mark.skipif(len(BACKENDS) < 2, reason="one backend (extensions off): nothing to compare")
@settings(max_examples=300, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(name=st.sampled_from(sorted(CALLS)), v=ODD)
def test_backends_answer_odd_numbers_alike(name, v):
    answers = [attempt(build(eb), name, v) for eb in BACKENDS]
    assert all(a == answers[0] for a in answers), (name, v, answers)


@pytest.mark.parametrize("name", sorted(CALLS))
@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(v=ODD)
def test_odd_numbers_are_decided_or_refused_by_name(eb, name, v):
    """Whatever the number, the answer is a decision or an InvalidArgument that changes
    nothing (``attempt`` checks), never another exception; and the broker keeps working
    and replays."""
    b = build(eb)
    attempt(b, name, v)
    assert b.acquire(Intent("g", {"gpu": 1}, 10)).granted
    Broker.replay(b.journal, backend=eb, clock=ManualClock(b.clock.now()))
