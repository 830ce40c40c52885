"""The compiled broker against the reference broker, step by step (SPEC §2: same inputs,
same decision, bit for bit), on what a user observes.

A hypothesis state machine drives a ``Broker(backend="compiled")`` and the reference broker
(:class:`bursarcore.reference.ReferenceBroker`, written from the specification) with the
same register / acquire / release / renew / cancel / clock / poll / admit_batch / supply
sequence: equal results (``Decision.to_dict()``, events, batch columns, or the same error),
and equal ``state()`` but for the backend name, after every step. Around it, the arithmetic
edges the machine seldom reaches: the credit cost over its whole domain against the
reference's rule, and token limits whose products leave int64.

Skipped when the compiled engine is not built (``BURSARCORE_NO_EXTENSIONS=1``).
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from bursarcore import Broker, Envelope, Intent, ManualClock, Pool
from bursarcore.admission.state import HOUR_NS, PPM, ROW_BITS
from bursarcore.broker import ENGINES
from bursarcore.errors import BursarError
from bursarcore.reference import rules

cmp = ENGINES.get("compiled")       # the C core through the chosen binding
if cmp is None:     # pragma: no cover - no compiled engine: nothing to compare
    pytest.skip("compiled engine not built", allow_module_level=True)

NS = 1_000_000_000


# -- arithmetic edges -------------------------------------------------------------------------
@given(n=st.integers(0, 1 << 40) | st.sampled_from([0, 1, (1 << 40)]),
       dur=st.integers(1, 1 << 59) | st.sampled_from([1, HOUR_NS, (1 << 59)]),
       pm=st.integers(0, (1 << 63) - 1) | st.sampled_from([0, 1, PPM, (1 << 63) - 1]))
def test_cost_exact_over_the_whole_domain(n, dur, pm):
    """The core's 128-bit credit cost is the specification's exact ceiling (SPEC §4.3)."""
    assert cmp.cost(n, dur, pm) == rules.lease_cost(n, dur, pm)


@given(n=st.integers(-(1 << 40), 1 << 40), dur=st.integers(-(1 << 50), 1 << 50),
       pm=st.integers(-(1 << 40), 1 << 40))
@example(n=614344623119, dur=-251882248313743, pm=1 << 40)   # n·dur·pm beyond -2**127
@example(n=-(1 << 40), dur=1 << 50, pm=1 << 40)
@example(n=-(1 << 40), dur=-(1 << 50), pm=-(1 << 40))
def test_cost_floor_semantics_for_negative_values(n, dur, pm):
    """Refunds price negative spans: the ceiling is Python's, for every sign."""
    assert cmp.cost(n, dur, pm) == rules.lease_cost(n, dur, pm)


@pytest.mark.parametrize("burst", [math.inf, 2 * 10**9, 10**9, 10**3, 0])
@pytest.mark.parametrize("nmax", [1, 3000, 1 << 20])
def test_token_limits_whose_products_leave_int64_agree(burst, nmax):
    """The core tests tokens lazily, ``T >= (m − base)·dur`` in int64, deciding an
    overflowing product by its sign: ten-year leases of up to a million units get the
    decision the reference's exact integers give."""
    out = []
    for be in ("compiled", "reference"):
        b = Broker(Pool(gpu=1 << 20), clock=ManualClock(0.0), backend=be)
        b.register("a", Envelope(credits=math.inf, sustained={"gpu": 0},
                                 ceiling={"gpu": 1 << 20}, burst={"gpu": burst}))
        d = b.acquire(Intent("a", {"gpu": (1, nmax)}, duration=10 * 365 * 86400.0))
        out.append((d.to_dict(), b.state()["campaigns"]["a"]["tokens"]))
    assert out[0] == out[1]


# -- the whole broker ---------------------------------------------------------------------------

CLASS_NAMES = ["deadline", "interactive", "agent-burst", "opportunistic"]


@st.composite
def envelopes(draw, dims):
    g, s, b, B = {}, {}, {}, {}
    for d in dims:
        gd = draw(st.integers(0, 4))
        sd = draw(st.integers(gd, gd + 6))
        g[d], s[d] = gd, sd
        b[d] = draw(st.integers(sd, sd + 24))
        B[d] = draw(st.sampled_from([math.inf, 0, 60.0, 600.0, 3600.0]))
    return Envelope(credits=draw(st.sampled_from([math.inf, 0.0, 0.5, 10.0, 1000.0])),
                    service_class=draw(st.sampled_from(CLASS_NAMES)),
                    guaranteed=g, sustained=s, ceiling=b, burst=B)


def _result(fn, *args, **kw):
    try:
        return "ok", _plain(fn(*args, **kw))
    except BursarError as exc:
        return "raise", (type(exc).__name__, str(exc))


def _plain(x):
    if hasattr(x, "to_dict"):
        return x.to_dict()
    if isinstance(x, tuple) and hasattr(x, "_fields"):            # BatchResult
        return {k: np.asarray(v).tolist() for k, v in x._asdict().items()}
    if isinstance(x, list):
        return [_plain(v) for v in x]
    return x


class BrokerDiff(RuleBasedStateMachine):
    """A compiled and a reference broker, same operations, same answers."""

    @initialize(gpu=st.integers(8, 48), cpu=st.sampled_from([0, 16]),
                head=st.sampled_from([0, 0, 2]), instant=st.sampled_from([False, False, True]),
                reuse=st.sampled_from([0, 0, 2, None, 1024]))
    def setup(self, gpu, cpu, head, instant, reuse):
        dims = {"gpu": gpu} | ({"cpu": cpu} if cpu else {})
        self.dims = list(dims)
        self.bk = []
        for be in ("compiled", "reference"):
            pool = Pool(warm_headroom={"gpu": head}, **dims)
            self.bk.append(Broker(pool, clock=ManualClock(0.0), backend=be,
                                  enforcement="instant" if instant else "prepaid",
                                  reuse_after=reuse))
        self.names: list[str] = []
        self.ids: set[int] = set()       # lease ids granted so far

    def both(self, method, *args, **kw):
        ra = _result(getattr(self.bk[0], method), *args, **kw)
        rb = _result(getattr(self.bk[1], method), *args, **kw)
        assert ra == rb, (method, args, kw, ra, rb)
        self.ids.update(l["id"] for l in self.bk[0].state()["leases"])
        return ra

    @rule(data=st.data())
    def register(self, data):
        name = f"c{len(self.names)}"
        r = self.both("register", name, data.draw(envelopes(self.dims)))
        if r[0] == "ok":
            self.names.append(name)

    @precondition(lambda self: self.names)
    @rule(data=st.data())
    def acquire(self, data):
        name = data.draw(st.sampled_from(self.names + ["nobody"]))
        d = data.draw(st.sampled_from(self.dims))
        hi = data.draw(st.integers(1, 30))
        lo = data.draw(st.integers(1, hi))
        now = self.bk[0].clock.now()
        intent = Intent(name, {d: (lo, hi)}, duration=data.draw(st.sampled_from(
                            [0.5, 5.0, 30.0, 120.0, 900.0])),
                        deadline=data.draw(st.sampled_from([None, None, now, now + 90.0])),
                        max_spend=data.draw(st.sampled_from([None, None, 0.0, 0.5, 50.0])),
                        service_class=data.draw(st.sampled_from([None, None] + CLASS_NAMES)),
                        ttl=data.draw(st.sampled_from([None, 10.0, 100.0])))
        self.both("acquire", intent)

    @precondition(lambda self: self.names)
    @rule(data=st.data())
    def admit_batch(self, data):
        n = data.draw(st.integers(0, 10))
        idx = data.draw(st.lists(st.integers(0, len(self.names) - 1), min_size=n, max_size=n))
        hi = data.draw(st.lists(st.integers(1, 12), min_size=n, max_size=n))
        pair = data.draw(st.booleans())
        u = np.array([[h // 2, h] for h in hi] if pair else hi, dtype=np.int64).reshape(
            (n, 2) if pair else (n,))
        dur = data.draw(st.sampled_from([1.0, 20.0, 300.0]))
        cls = data.draw(st.sampled_from([None] + CLASS_NAMES))
        self.both("admit_batch", np.array(idx, dtype=np.int64), u, dur, service_class=cls,
                  dim=data.draw(st.sampled_from(self.dims)))

    def some_lease(self, data):
        """A lease id this pair issued, or (rows reused) another generation of its row:
        an earlier one, ended and stale, or one not issued yet; None before the first
        grant."""
        if not self.ids:
            return None
        lid = data.draw(st.sampled_from(sorted(self.ids)))
        g = (lid >> ROW_BITS) + data.draw(st.integers(-2, 1))
        return (lid & ((1 << ROW_BITS) - 1)) | (max(0, g) << ROW_BITS)

    @rule(data=st.data())
    def release(self, data):
        lid = self.some_lease(data)
        if lid is not None:
            self.both("release", lid)

    @rule(data=st.data())
    def renew(self, data):
        lid = self.some_lease(data)
        if lid is not None:
            self.both("renew", lid,
                      data.draw(st.sampled_from([1.0, 30.0, 600.0])),
                      data.draw(st.sampled_from([None, None, 0.1, 100.0])))

    @rule(data=st.data())
    def cancel(self, data):
        self.both("cancel", data.draw(st.integers(0, 60)))

    @rule(dt=st.sampled_from([0.0, 0.25, 1.0, 5.0, 30.0, 61.0, 200.0, 1000.0]))
    def clock(self, dt):
        for b in self.bk:
            b.clock.advance(dt)
        self.both("poll")

    @precondition(lambda self: self.names)
    @rule(data=st.data())
    def supply(self, data):
        self.both("supply", data.draw(st.sampled_from(self.names)))

    @invariant()
    def same_everything(self):
        if not hasattr(self, "bk"):
            return
        sa, sb = (b.state() for b in self.bk)
        assert sa.pop("backend") == "compiled" and sb.pop("backend") == "reference"
        assert sa == sb


TestBrokerDiff = BrokerDiff.TestCase
TestBrokerDiff.settings = settings(stateful_step_count=30,
                                   suppress_health_check=[HealthCheck.too_slow,
                                                          HealthCheck.filter_too_much])



@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_decide_keys_equals_decide_row_by_row(data):
    """``decide_keys`` (the pending pass's probe) returns the first row a single decide
    grants, and leaves the state as that run of decides leaves it."""

    b = Broker(Pool(gpu=16, cpu=4), clock=ManualClock(0.0))
    for i in range(3):
        b.register(f"c{i}", Envelope(credits=data.draw(st.sampled_from([math.inf, 0.01, 5.0])),
                                     guaranteed={"gpu": 2}, sustained={"gpu": 4},
                                     ceiling={"gpu": 8, "cpu": 4}, burst={"gpu": 120}))
    for _ in range(data.draw(st.integers(0, 6))):
        b.acquire(Intent(f"c{data.draw(st.integers(0, 2))}",
                         units={"gpu": data.draw(st.integers(1, 8))}, duration=60))
    rows = np.array(data.draw(st.lists(st.tuples(
        st.integers(0, 2), st.integers(0, 1), st.integers(0, 3), st.integers(1, 12),
        st.sampled_from([NS, 60 * NS, 3600 * NS]), st.sampled_from([-1, 0, 10**6])),
        min_size=0, max_size=6)), dtype=np.int64).reshape(-1, 6)
    t = 10 * NS
    sa = copy.deepcopy(b.st)
    oa = np.zeros(len(rows), np.int64)
    ra = cmp.decide_keys(sa, rows, t, oa)
    sc = copy.deepcopy(b.st)                 # one by one: the first key a single decide grants
    first = -1
    for j, (c, d, k, m, dur, spend) in enumerate(rows.tolist()):
        if cmp.decide(sc, c, d, k, m, m, dur, spend, t)[0] >= m:
            first = j
            break
    assert ra == first
    for f in ("T", "tlast", "left"):
        assert np.array_equal(getattr(sa, f), getattr(sc, f)), f
