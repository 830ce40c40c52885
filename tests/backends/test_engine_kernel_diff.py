"""The compiled admission kernel against the reference, step by step (SPEC §2: same inputs,
same decision, bit for bit).

Two levels, both hypothesis state machines that apply every operation to a pair and compare
after each step:

* **kernel** — two :class:`EngineState` built from one random configuration (dimensions,
  a class table with a preemptible class, campaigns with g <= s <= b, unlimited and finite
  bursts and budgets, instant or prepaid enforcement); one is driven through
  :mod:`bursarcore.reference.engine`, the other through ``bursarcore._engine``. Every
  return value must be equal (and an int where the reference returns one), every ``out``
  buffer equal, and every attribute of the two states equal — arrays by dtype, shape and
  content, so growth (heap, leases, arena) must happen at the same moments. An operation
  the arrays cannot hold must raise the same exception type in both.
* **broker** — two :class:`Broker` on :class:`ManualClock`, ``backend="compiled"`` and
  ``"reference"``, driven by the same register / acquire / release / renew / cancel /
  clock / poll / admit_batch / supply sequence: equal ``Decision.to_dict()``, equal events,
  equal ``state()`` (but for the backend name) and equal engine arrays after every step.

Skipped when the compiled engine is not built (``BURSARCORE_NO_EXTENSIONS=1``).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from bursarcore.admission.state import (ACTIVE, EXPIRED, HOUR_NS, MAXV, PPM, RELEASED,
                                        REVOKED, REVOKING, ROW_BITS, ROW_MASK, STARTING,
                                        EngineState)
from bursarcore.reference import engine as ref

from kernel_pairs import (NS, build, campaigns, cmp, configs, durations, run, same_state,
                          same_value, steps)

if cmp is None:
    pytest.skip("compiled engine not built (BURSARCORE_NO_EXTENSIONS or no build)",
                allow_module_level=True)

STEP_COUNT = 40

# -- the kernel-level machine ----------------------------------------------------------------


class KernelDiff(RuleBasedStateMachine):
    """Reference and compiled kernels on twin states."""

    @initialize(cfg=configs())
    def setup(self, cfg):
        self.cfg = cfg
        self.a = build(cfg)      # reference
        self.b = build(cfg)      # compiled
        self.t = cfg["t0"]
        self.intent = 0

    # helpers
    def both(self, name, *args, outs=None):
        """Call ``name`` on both; ``outs`` makes one fresh output buffer per side."""
        oa = [o() for o in outs] if outs else []
        ob = [o() for o in outs] if outs else []
        ra = run(getattr(ref, name), self.a, *args, *oa)
        rb = run(getattr(cmp, name), self.b, *args, *ob)
        assert ra[0] == rb[0], (name, args, ra, rb)
        if ra[0] == "ok":
            same_value(ra[1], rb[1], name)
            if name in ("admit", "renew", "advance"):
                event(f"{name} -> {ra[1] if name != 'renew' else ra[1][0]}")
        else:
            assert ra[1] is rb[1], (name, args, ra, rb)
            event(f"{name} raised {ra[1].__name__}")
        for x, y in zip(oa, ob):
            assert np.array_equal(x, y), (name, x, y)
        return ra, oa

    def tick(self, data):
        self.t += data.draw(steps)
        return self.t

    def pick(self, data, states=None, firm=None):
        """The id of a lease (row | generation << 32) in one of ``states``, or None."""
        n = self.a.nleases
        ids = [self.a.lease_id(i) for i in range(n)
               if (states is None or int(self.a.state[i]) in states)
               and (firm is None or int(self.a.firm[i]) == firm)]
        return data.draw(st.sampled_from(ids)) if ids else None

    def intent_args(self, data):
        s = self.a
        c = data.draw(st.integers(0, s.C - 1))
        d = data.draw(st.integers(0, s.D - 1))
        k = data.draw(st.integers(0, s.cls.shape[0] - 1))
        nmax = data.draw(st.integers(1, int(s.cap[d]) + 3))
        nmin = data.draw(st.integers(0, nmax))
        dur = data.draw(durations)
        return c, d, k, nmin, nmax, dur

    def reserve(self, leases, slots):
        for s in (self.a, self.b):
            s.grow_leases(leases, slots)

    # rules
    @rule(data=st.data())
    def admit(self, data):
        c, d, k, nmin, nmax, dur = self.intent_args(data)
        spend = data.draw(st.sampled_from([-1, -1, 0, 10**5, 10**9]))
        t = self.tick(data)
        self.reserve(1, nmax)
        self.intent += 1
        self.both("admit", c, d, k, nmin, nmax, dur, spend, t, self.intent,
                  outs=[lambda: np.zeros(4, np.int64)])

    @rule(data=st.data(), m=st.integers(1, 12))
    def admit_batch(self, data, m):
        rows = [self.intent_args(data) for _ in range(m)]
        cols = [np.array([r[i] for r in rows], dtype=np.int64) for i in range(6)]
        camps, dims, ks, nmins, nmaxs, durs = cols
        t = self.tick(data)
        self.reserve(m, int(nmaxs.sum()))
        outs = {x: (np.zeros(m, np.int64), np.zeros(m, np.int64), np.full(m, -1, np.int64))
                for x in "ab"}
        j = 0
        while j < m:
            ra = run(ref.admit_batch, self.a, camps, ks, dims, nmins, nmaxs, durs, t,
                     self.intent, *outs["a"], j)
            rb = run(cmp.admit_batch, self.b, camps, ks, dims, nmins, nmaxs, durs, t,
                     self.intent, *outs["b"], j)
            assert ra == rb, (ra, rb)
            event(f"admit_batch -> {ra[1] if ra[0] == 'ok' else ra}")
            for x, y in zip(outs["a"], outs["b"]):
                assert np.array_equal(x, y)
            if ra[0] != "ok":
                break
            j = ra[1] + 1            # a broker decides the SLOW item itself; skip it
        self.intent += m

    @rule(data=st.data())
    def decide(self, data):
        c, d, k, nmin, nmax, dur = self.intent_args(data)
        spend = data.draw(st.sampled_from([-1, 0, 10**6]))
        self.both("decide", c, d, k, nmin, nmax, dur, spend, self.tick(data))

    @rule(data=st.data())
    def grant(self, data):
        c, d, k, nmin, nmax, dur = self.intent_args(data)
        t = self.tick(data)
        r, _ = self.both("decide", c, d, k, nmin, nmax, dur, -1, t)
        if r[0] != "ok":
            return
        n, _, path, pm, _ = r[1]
        if n < max(nmin, 1):
            n = data.draw(st.integers(1, nmax))   # a grant the rules would not size: allowed
        starting = path == ref.RECLAIM or data.draw(st.booleans())
        self.reserve(1, n)
        self.intent += 1
        self.both("grant", c, d, k, n, dur, pm, t, starting, self.intent)

    @rule(data=st.data())
    def activate(self, data):
        lid = self.pick(data, (STARTING,))
        if lid is not None:
            t = self.tick(data)
            self.reserve(1, int(self.a.units[lid & ROW_MASK]))
            self.both("activate", lid, t)

    @rule(data=st.data())
    def preempt(self, data):
        lid = self.pick(data, (ACTIVE,), firm=0)
        if lid is not None:
            grace = data.draw(st.sampled_from([NS, 60 * NS]))
            self.both("preempt", lid, self.tick(data), grace)

    @rule(data=st.data())
    def end_lease(self, data):
        lid = self.pick(data, (STARTING, ACTIVE, REVOKING))
        if lid is not None:
            new = data.draw(st.sampled_from([RELEASED, REVOKED, EXPIRED]))
            self.both("end_lease", lid, self.tick(data), new)

    @rule(data=st.data())
    def renew(self, data):
        lid = self.pick(data, (ACTIVE,))
        if lid is not None:
            ext = data.draw(durations)
            spend = data.draw(st.sampled_from([-1, -1, 0, 10**6, 10**9]))
            self.both("renew", lid, ext, self.tick(data), spend)

    @rule(data=st.data(), width=st.integers(0, 5))
    def advance(self, data, width):
        t = self.tick(data)
        self.both("ring_advance", t)
        self.both("advance", t, outs=[lambda: np.zeros(width, np.int64)])

    @rule(data=st.data())
    def settle(self, data):
        c = data.draw(st.integers(0, self.a.C - 1))
        d = data.draw(st.integers(0, self.a.D - 1))
        self.both("settle", c, d, self.tick(data))

    @rule(data=st.data())
    def queries(self, data):
        s = self.a
        c = data.draw(st.integers(0, s.C - 1))
        d = data.draw(st.integers(0, s.D - 1))
        k = data.draw(st.integers(0, s.cls.shape[0] - 1))
        self.both("free_now", d)
        self.both("unmet", c, d)
        self.both("congestion_ppm", d)
        self.both("congestion_mult", d)
        self.both("price_pm", d, k)
        self.both("next_expiry")
        nmin = data.draw(st.integers(0, int(s.cap[d]) + 3))
        dur = data.draw(durations)
        pm = data.draw(st.sampled_from([0, 1, PPM, 12 * PPM]))
        self.both("never", c, d, k, nmin, dur, pm)

    @rule(data=st.data())
    def pending_demand(self, data):
        """The broker adds priced pending demand to ``pend`` (congestion, §7)."""
        d = data.draw(st.integers(0, self.a.D - 1))
        x = data.draw(st.integers(0, 40))
        for s in (self.a, self.b):
            s.pend[d] += x

    @rule(data=st.data())
    def heap_ops(self, data):
        if data.draw(st.booleans()):
            lid = self.pick(data, (ACTIVE, REVOKING))
            if lid is not None:
                self.both("heap_push", int(self.a.t_end[lid & ROW_MASK]), lid)
        else:
            self.both("heap_pop")

    @rule(data=st.data())
    def grow(self, data):
        """Reallocate under the compiled kernel's cached view (its version must move)."""
        what = data.draw(st.sampled_from(["leases", "heap", "campaign"]))
        if what == "leases":
            self.reserve(data.draw(st.integers(1, 3000)), data.draw(st.integers(0, 20000)))
        elif what == "heap":
            for s in (self.a, self.b):
                s.grow_heap()
        else:
            g, sd, b, B, budget = data.draw(campaigns(self.cfg["cap"]))
            if all(int(self.a.g[: self.a.C, d].sum()) + g[d] <= self.cfg["cap"][d]
                   for d in range(self.a.D)):
                for s in (self.a, self.b):
                    s.add_campaign(g, sd, b, B, budget, self.t)

    @invariant()
    def states_equal(self):
        if hasattr(self, "a"):
            same_state(self.a, self.b)


TestKernelDiff = KernelDiff.TestCase
TestKernelDiff.settings = settings(stateful_step_count=STEP_COUNT,
                                   suppress_health_check=[HealthCheck.too_slow,
                                                          HealthCheck.filter_too_much])


# -- arithmetic edges -------------------------------------------------------------------------
@given(n=st.integers(0, 1 << 40) | st.sampled_from([0, 1, (1 << 40)]),
       dur=st.integers(1, 1 << 59) | st.sampled_from([1, HOUR_NS, (1 << 59)]),
       pm=st.integers(0, (1 << 63) - 1) | st.sampled_from([0, 1, PPM, (1 << 63) - 1]))
def test_cost_exact_over_the_whole_domain(n, dur, pm):
    assert cmp.cost(n, dur, pm) == ref.cost(n, dur, pm)


@given(n=st.integers(-(1 << 40), 1 << 40), dur=st.integers(-(1 << 50), 1 << 50),
       pm=st.integers(-(1 << 40), 1 << 40))
@example(n=614344623119, dur=-251882248313743, pm=1 << 40)   # n·dur·pm beyond -2**127
@example(n=-(1 << 40), dur=1 << 50, pm=1 << 40)
@example(n=-(1 << 40), dur=-(1 << 50), pm=-(1 << 40))
def test_cost_floor_semantics_for_negative_values(n, dur, pm):
    assert cmp.cost(n, dur, pm) == ref.cost(n, dur, pm)


def _twin(instant=False):
    cfg = dict(D=1, cap=[8], headroom=[0], classes=[(0, 4 * PPM, 1, 0, 0, 0),
                                                    (1, 250_000, 0, 1, 60 * NS, 1)],
               price=[PPM], thr=[500_000, PPM, 2 * PPM], mult=[PPM, 1_500_000, 2_250_000, 3 * PPM],
               bins=60, instant=instant, t0=0, camps=[([1], [2], [8], [MAXV], 10**17)])
    return build(cfg), build(cfg)


def test_huge_credit_limit_is_returned_exactly():
    a, b = _twin()
    ra = ref.decide(a, 0, 0, 0, 1, 1, 1, -1, 0)
    rb = cmp.decide(b, 0, 0, 0, 1, 1, 1, -1, 0)
    assert ra == rb and ra[4][3] > (1 << 63)     # left·HOUR // (1 ns · pm) leaves int64
    same_state(a, b)


@settings(max_examples=400)
@given(T=st.integers(0, 10**16) | st.sampled_from([0, 1, MAXV]),
       left=st.integers(0, 10**13) | st.sampled_from([0, 1, MAXV - 1, MAXV]),
       spend=st.sampled_from([-1, 0, 1]) | st.integers(0, 10**13),
       held=st.integers(0, 8), nmin=st.integers(0, 9), extra=st.integers(0, 9),
       dur=durations, k=st.integers(0, 1), price=st.sampled_from([0, 1, PPM, 10**9]))
def test_admit_fast_path_matches_decide_on_every_limit(T, left, spend, held, nmin, extra, dur,
                                                       k, price):
    """admit computes the token and credit limits lazily: same n, reason, path."""
    a, b = _twin()
    for s in (a, b):
        s.price[0] = price
        s.T[0, 0], s.left[0] = T, left
        s.H[0, 0] = held
    nmax = max(1, nmin + extra)
    oa, ob = np.zeros(4, np.int64), np.zeros(4, np.int64)
    ra = run(ref.admit, a, 0, 0, k, nmin, nmax, dur, spend, 0, 1, oa)
    rb = run(cmp.admit, b, 0, 0, k, nmin, nmax, dur, spend, 0, 1, ob)
    assert ra == rb and np.array_equal(oa, ob), (ra, rb, oa, ob)
    same_state(a, b)
    same_value(ref.decide(a, 0, 0, k, nmin, nmax, dur, spend, 0),
               cmp.decide(b, 0, 0, k, nmin, nmax, dur, spend, 0), "decide")


def test_heap_grows_when_the_reference_grows_it():
    a, b = _twin()
    for s in (a, b):
        s.grow_leases(5000, 0)
    for i in range(3000):
        ref.heap_push(a, 10**12 - i, i % 7)
        cmp.heap_push(b, 10**12 - i, i % 7)
    same_state(a, b)
    for _ in range(3000):
        ref.heap_pop(a)
        cmp.heap_pop(b)
    same_state(a, b)
    with pytest.raises(IndexError):
        ref.heap_pop(a)
    with pytest.raises(IndexError):
        cmp.heap_pop(b)
    same_state(a, b)


def test_full_lease_store_raises_before_any_change():
    a, b = _twin()
    for s in (a, b):
        s.scal[2] = s.camp.shape[0]          # pretend the store is full
    for mod, s in ((ref, a), (cmp, b)):
        with pytest.raises(IndexError):
            mod.grant(s, 0, 0, 0, 1, NS, PPM, 5 * NS, False, 1)
    same_state(a, b)
    assert int(a.tlast[0, 0]) == 0               # not even settled


def test_zero_duration_raises_like_the_reference():
    a, b = _twin()
    for mod, s in ((ref, a), (cmp, b)):
        with pytest.raises(ZeroDivisionError):
            mod.decide(s, 0, 0, 0, 1, 1, 0, -1, NS)
    same_state(a, b)


def test_wrong_out_buffers_still_work():
    a, b = _twin()
    out_a, out_b = [0] * 4, [0] * 4
    assert ref.admit(a, 0, 0, 0, 1, 2, NS, -1, 0, 1, out_a) == \
        cmp.admit(b, 0, 0, 0, 1, 2, NS, -1, 0, 1, out_b)
    assert out_a == out_b
    ea, eb = [0] * 2, [0] * 2
    assert ref.advance(a, 10 * NS, ea) == cmp.advance(b, 10 * NS, eb) == 1
    assert ea == eb
    same_state(a, b)


# -- the whole broker ---------------------------------------------------------------------------
from bursarcore import Broker, Envelope, Intent, ManualClock, Pool  # noqa: E402
from bursarcore.errors import BursarError  # noqa: E402

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

    def both(self, method, *args, **kw):
        ra = _result(getattr(self.bk[0], method), *args, **kw)
        rb = _result(getattr(self.bk[1], method), *args, **kw)
        assert ra == rb, (method, args, kw, ra, rb)
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
        """A lease id this pair issued: its row's current lease, or (rows reused) an
        earlier one, ended and stale; None before the first grant."""
        s = self.bk[1].st
        if not s.nleases:
            return None
        r = data.draw(st.integers(0, s.nleases - 1))
        g = int(s.gen[r])
        return r | (data.draw(st.integers(max(0, g - 2), g)) << ROW_BITS)

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
        n = self.bk[1]._next_intent
        if n:
            self.both("cancel", data.draw(st.integers(0, n - 1)))

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
        assert [e.to_dict() for e in self.bk[0]._queued_events()] == \
            [e.to_dict() for e in self.bk[1]._queued_events()]
        same_state(self.bk[0].st, self.bk[1].st)


TestBrokerDiff = BrokerDiff.TestCase
TestBrokerDiff.settings = settings(stateful_step_count=30,
                                   suppress_health_check=[HealthCheck.too_slow,
                                                          HealthCheck.filter_too_much])


@pytest.mark.parametrize("T", [MAXV, 10**18, 5 * 10**18, 10**12, 0])
@pytest.mark.parametrize("nmax", [1, 3000, 1 << 20])
def test_lazy_token_limit_when_the_product_overflows_int64(T, nmax):
    """``admit``'s lazy token test ``T >= (m − base)·dur`` runs in int64 and decides an
    overflowing product by its sign: the same outcome as the reference's exact integers,
    with ten-year leases and up to a million units."""
    def one(k):
        s = EngineState(capacity=[1 << 40], headroom=[0], slot_counts=[1 << 12],
                        classes=[(0, PPM, 0, 0, 0, 0)], price=[PPM], cong_thresholds=[PPM],
                        cong_mult=[PPM, PPM], window_ns=60 * NS, bins=6, instant=False)
        s.add_campaign([0], [0], [1 << 40], [MAXV], MAXV, 0)
        s.T[0, 0] = T
        s.grow_leases(4, 1 << 12)
        out = np.zeros(4, dtype=np.int64)
        r = k.admit(s, 0, 0, 0, 1, nmax, 10 * 365 * 86400 * NS, -1, 0, 0, out)
        return r, out.tolist(), s.T.tolist()

    assert one(cmp) == one(ref)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_decide_keys_equals_decide_row_by_row(data):
    """``decide_keys`` (the pending pass's probe) returns what deciding its rows one by one
    returns, writes the same reasons and leaves the same state, compiled and reference."""
    import copy

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
    sa, sb = copy.deepcopy(b.st), copy.deepcopy(b.st)
    oa, ob = np.zeros(len(rows), np.int64), np.zeros(len(rows), np.int64)
    ra = cmp.decide_keys(sa, rows, t, oa)
    rb = ref.decide_keys(sb, rows, t, ob)
    assert ra == rb and np.array_equal(oa, ob)
    same_state(sa, sb, "decide_keys")
    sc = copy.deepcopy(b.st)                 # one by one: the first key a single decide grants
    first = -1
    for j, (c, d, k, m, dur, spend) in enumerate(rows.tolist()):
        if ref.decide(sc, c, d, k, m, m, dur, spend, t)[0] >= m:
            first = j
            break
    assert ra == first
