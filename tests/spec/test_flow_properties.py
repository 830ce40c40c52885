"""Flow engine properties: compiled against reference step by step, and SPEC §11 invariant 9.

``FlowMachine`` (a hypothesis ``RuleBasedStateMachine``) applies the same operation to two
engines and requires the same result, bit for bit, and the same ``state`` after every
step; invalid operations (generated on purpose now and then) must raise the same exception
type with the same ``field`` in both and change nothing. With the compiled backend absent
(``BURSARCORE_NO_EXTENSIONS=1``) the pair is (reference, the reference rebuilt from its
``state`` before every step), which still checks that ``state`` captures everything.

Then invariant 9 and the rate bounds, on every backend, over generated workloads:

* isolation: a campaign consuming within its guaranteed rate is never throttled, whatever
  the other campaigns do (including campaigns added at run time);
* facility: over any window [t0, t1] the dimension passes at most
  capacity·(t1 − t0) + Σ guaranteed sizes + the facility size;
* sustained / peak: a campaign passes at most max(g·window, B) + s·(t1 − t0), and at most
  b·window + b·(t1 − t0), over any window (plus one fixed-point step per call of
  rounding: refills floor separately per bucket).
"""

from __future__ import annotations

import math
import pickle
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from bursarcore import units
from bursarcore.errors import InvalidArgument
from bursarcore.flow import FLOW_BACKENDS, ReferenceFlowEngine

NS = units.NS
U = units.SCALE
PAIRED = "compiled" in FLOW_BACKENDS
FIRST = FLOW_BACKENDS["compiled"] if PAIRED else ReferenceFlowEngine
SECOND = ReferenceFlowEngine
DIMS = ("fs", "inference", "net")

BAD = st.sampled_from([math.nan, math.inf, -math.inf, -1.0, -1, 1e13, "1", None])
rates = st.sampled_from([0.0, 1e-6, 0.5, 1.0, 2.0, 7.5, 100.0, 1e6]) | st.floats(0, 50)
sizes = st.sampled_from([0.0, 1e-6, 0.5, 3.0, 100.0, 1e9, math.inf]) | st.floats(0, 50)
steps = (st.integers(0, 10) | st.integers(0, NS // 10) | st.integers(0, 5 * NS)
         | st.sampled_from([10**15, 10**18]))


def maybe_bad(good):
    return st.one_of(good, good, good, good, good, good, BAD)


def bits(x):
    if isinstance(x, np.ndarray):
        return (x.dtype.str, x.shape, x.tobytes())
    if isinstance(x, tuple):
        return tuple(bits(v) for v in x)
    if isinstance(x, dict):
        return {k: bits(v) for k, v in x.items()}
    if type(x) is float:
        return ("float", struct.pack("<d", x))
    return (type(x).__name__, x)


def same_state(a: dict, b: dict) -> None:
    assert set(a) == set(b) == {"dims", "window", "watermark", "capacity", "facility",
                                "campaigns"}
    assert a["dims"] == b["dims"]
    for k in ("window", "watermark"):
        assert type(a[k]) is int and a[k] == b[k], k
    for k in ("capacity", "facility", "campaigns"):
        assert a[k].dtype == np.int64 and b[k].dtype == np.int64, k
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def outcome(f, fe):
    try:
        return "ok", f(fe)
    except InvalidArgument as e:
        return "error", (type(e), e.field)


class FlowMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.a = self.b = None
        self.now_ns = 0

    def both(self, f):
        if not PAIRED:
            self.b = SECOND.from_state(self.a.state)
        before = self.a.state
        ra, rb = outcome(f, self.a), outcome(f, self.b)
        assert ra[0] == rb[0], (ra, rb)
        if ra[0] == "error":
            assert ra[1] == rb[1], (ra, rb)
            same_state(before, self.a.state)
        else:
            assert bits(ra[1]) == bits(rb[1]), (ra, rb)
        same_state(self.a.state, self.b.state)
        self.now_ns = max(self.now_ns, self.a.state["watermark"])
        return ra

    def when(self, data):
        kind = data.draw(st.sampled_from(["now"] * 4 + ["ahead", "int", "behind", "bad"]))
        if kind == "ahead":
            self.now_ns = min(units.MAX_NS, self.now_ns + data.draw(steps))
        if kind in ("now", "ahead"):
            return self.now_ns / NS
        if kind == "int":
            return int(math.ceil(self.now_ns / NS))
        if kind == "behind":
            return (self.now_ns - data.draw(st.integers(1, NS))) / NS
        return data.draw(BAD)

    def campaign(self, data):
        n = len(self.a)
        good = st.integers(0, max(n - 1, 0))
        return data.draw(st.one_of(good, good, good, good, good,
                                   st.sampled_from([-1, n, 10**30, 1.0, "0", None])))

    def dim(self, data):
        nd = len(self.a.dims)
        good = st.sampled_from(self.a.dims) | st.integers(0, nd - 1)
        return data.draw(st.one_of(good, good, good, good,
                                   st.sampled_from(["gpu", nd, -1, 0.0, None])))

    def amount(self, data):
        return data.draw(maybe_bad(st.sampled_from([0.0, 1e-6, 0.5, 1.0, 3.0, 16.0, 1e4])
                                   | st.floats(0, 40) | st.integers(0, 20)))

    @initialize(data=st.data(), nd=st.integers(1, 3), window=st.sampled_from([1.0, 0.25, 2.0]),
                start=st.sampled_from([0.0, -100.0, 3.5]))
    def construct(self, data, nd, window, start):
        caps = {d: data.draw(st.sampled_from([0.0, 10.0, 28.0, 5000.0]) | st.floats(0, 100))
                for d in DIMS[:nd]}
        self.a = FIRST(caps, window=window, now=start)
        self.b = SECOND(caps, window=window, now=start)
        self.now_ns = units.to_ns(start)
        same_state(self.a.state, self.b.state)

    @rule(data=st.data())
    def construct_bad(self, data):
        caps = data.draw(st.sampled_from([{}, {"fs": math.nan}, {"fs": -1.0}, {"": 1.0},
                                          [("fs", 1.0)], {"fs": 1e12}]))
        window = data.draw(st.sampled_from([1.0, 0.0, -1.0, math.nan, 1e9]))
        ra = outcome(lambda cls: cls(caps, window=window), FIRST)
        rb = outcome(lambda cls: cls(caps, window=window), SECOND)
        assert ra[0] == rb[0] and (ra[0] == "ok" or ra[1] == rb[1]), (ra, rb)

    @rule(data=st.data())
    def add_campaign(self, data):
        dims = self.a.dims
        free = self.a.capacity - self.a.guaranteed_sum
        env = {}
        for key in ("guaranteed", "sustained", "ceiling", "burst"):
            m = {}
            for k, d in enumerate(dims):
                if data.draw(st.integers(0, 3)) == 0:
                    continue
                if key == "guaranteed":
                    m[d] = data.draw(maybe_bad(st.sampled_from([0.0, float(free[k])])
                                               | st.floats(0, max(float(free[k]), 0) * 1.2)))
                elif key == "burst":
                    m[d] = data.draw(maybe_bad(sizes))
                else:
                    m[d] = data.draw(maybe_bad(rates))
            if data.draw(st.integers(0, 12)) == 0:
                m = data.draw(st.sampled_from([{"gpu": 1.0}, [1.0], 3]))
            env[key] = m or None
        now = data.draw(st.none() | st.just(self.now_ns / NS) | st.just("when"))
        if now == "when":
            now = self.when(data)
        self.both(lambda fe: fe.add_campaign(now=now, **env))

    @precondition(lambda self: len(self.a) > 0)
    @rule(data=st.data())
    def consume(self, data):
        c, d, amount, now = self.campaign(data), self.dim(data), self.amount(data), self.when(data)
        self.both(lambda fe: fe.consume(c, d, amount, now))

    @precondition(lambda self: len(self.a) > 0)
    @rule(data=st.data())
    def consume_batch(self, data):
        n, nd, k = len(self.a), len(self.a.dims), data.draw(st.integers(0, 8))
        camps = data.draw(st.lists(st.integers(0, n - 1), min_size=k, max_size=k))
        dims = data.draw(st.sampled_from(["list", "name", "index"]))
        dims = (data.draw(st.lists(st.integers(0, nd - 1), min_size=k, max_size=k))
                if dims == "list" else self.a.dims[-1] if dims == "name" else 0)
        amounts = data.draw(st.floats(0, 20) | st.lists(
            st.floats(0, 20) | st.sampled_from([0.0, 1e-6, 3.0]), min_size=k, max_size=k))
        if data.draw(st.integers(0, 5)) == 0:
            offs = data.draw(st.lists(st.integers(0, 2 * NS), min_size=k, max_size=k))
            now = [(self.now_ns + o) / NS for o in sorted(offs)]
        else:
            now = self.when(data)
        if data.draw(st.booleans()):  # numpy arrays take the compiled fast path
            camps = np.array(camps, dtype=np.int64)
            amounts = np.asarray(amounts, dtype=np.float64)
            if data.draw(st.integers(0, 5)) == 0:  # a bad value or a wrong length in it
                amounts = data.draw(st.sampled_from([
                    np.append(np.atleast_1d(amounts), 1.0), np.full(k, math.nan),
                    np.full(k, -1.0), np.full(k, 1e13), np.full(2 * k + 1, 1.0)[::2]]))
        if data.draw(st.integers(0, 8)) == 0:  # one bad argument
            which = data.draw(st.sampled_from(["camps", "dims", "amounts", "now"]))
            bad = data.draw(st.sampled_from([[math.nan] * k + [math.nan], [-1] * (k + 1),
                                             [n] * (k + 1), "x", [[0]], [1e9] * (k + 1)]))
            camps, dims, amounts, now = [bad if which == w else v for w, v in
                                         zip(("camps", "dims", "amounts", "now"),
                                             (camps, dims, amounts, now))]
        self.both(lambda fe: fe.consume_batch(camps, dims, amounts, now))

    @precondition(lambda self: len(self.a) > 0)
    @rule(data=st.data())
    def consume_then_retry(self, data):
        """After a throttled call, the rest passes at now + retry_after, not 1 ns earlier."""
        c, d = data.draw(st.integers(0, len(self.a) - 1)), data.draw(st.integers(0, 2))
        d = min(d, len(self.a.dims) - 1)
        amount = data.draw(st.sampled_from([1.0, 5.0, 30.0]) | st.floats(0, 60))
        kind, result = self.both(lambda fe: fe.consume(c, d, amount, self.now_ns / NS))
        if kind == "error":  # now_ns / 1e9 rounded below the watermark (huge times)
            return
        allowed, retry = result
        if retry in (0.0, math.inf):
            return
        q = units.to_ns(retry)
        t = self.now_ns + q
        if t > units.MAX_NS or units.to_ns(t / NS) != t or units.to_ns((t - 1) / NS) != t - 1:
            return
        rest = units.to_fixed(amount) - units.to_fixed(allowed)
        for fe in (self.a, self.b):
            # at t one call for the rest gets the target (the rest, or all that can pass at
            # once); 1 ns earlier it would get less (reference.flow.wait is the smallest)
            got, _ = type(fe).from_state(fe.state).consume(c, d, rest / U, t / NS)
            early, _ = type(fe).from_state(fe.state).consume(c, d, rest / U, (t - 1) / NS)
            assert units.to_fixed(early) < units.to_fixed(got), (early, got)

    @precondition(lambda self: len(self.a) > 0)
    @rule(data=st.data())
    def consume_fixed(self, data):
        n, k = len(self.a), data.draw(st.integers(1, 6))
        camps = np.array(data.draw(st.lists(st.integers(0, n - 1), min_size=k, max_size=k)),
                         dtype=np.int64)
        dims = np.array([data.draw(st.integers(0, len(self.a.dims) - 1))], dtype=np.int64)
        amts = np.array(data.draw(st.lists(st.integers(0, 30 * U), min_size=k, max_size=k)),
                        dtype=np.int64)
        now = np.array([self.now_ns], dtype=np.int64)
        self.both(lambda fe: fe.consume_fixed(camps, dims, amts, now))

    @rule(data=st.data())
    def tokens(self, data):
        now = self.when(data)
        self.both(lambda fe: fe.tokens(now))

    @rule(dt=steps)
    def advance(self, dt):
        self.now_ns = min(units.MAX_NS, self.now_ns + dt)

    @rule(protocol=st.integers(0, pickle.HIGHEST_PROTOCOL))
    def pickle_round_trip(self, protocol):
        a = pickle.loads(pickle.dumps(self.a, protocol=protocol))
        b = pickle.loads(pickle.dumps(self.b, protocol=protocol))
        assert type(a) is type(self.a) and type(b) is type(self.b)
        same_state(a.state, self.a.state)
        self.a, self.b = a, b

    @precondition(lambda self: PAIRED)
    @rule()
    def swap_state_across_backends(self):
        a, b = FIRST.from_state(self.b.state), SECOND.from_state(self.a.state)
        same_state(a.state, b.state)
        self.a, self.b = a, b

    @invariant()
    def buckets_are_sane(self):
        if self.a is None:
            return
        s = self.a.state
        same_state(s, self.b.state)
        camp, fac = s["campaigns"], s["facility"]
        for off in (0, 4, 8):
            size, tok, rem = camp[..., off], camp[..., off + 2], camp[..., off + 3]
            assert (tok >= 0).all() and (tok <= size).all()
            assert (rem >= 0).all() and (rem < NS).all() and (rem[tok == size] == 0).all()
        assert (fac[:, 2] >= 0).all() and (fac[:, 2] <= fac[:, 0]).all()
        gsum = camp[..., 1].sum(axis=0) if len(camp) else 0
        np.testing.assert_array_equal(fac[:, 1], s["capacity"] - gsum)
        assert (camp[..., 1] <= camp[..., 5]).all() and (camp[..., 5] <= camp[..., 9]).all()


FlowMachine.TestCase.settings = settings(settings(), max_examples=40, stateful_step_count=25)
TestFlowAgainstReference = FlowMachine.TestCase


# -- SPEC §11 invariant 9 and the rate bounds ------------------------------------------------

@st.composite
def workloads(draw):
    """An engine description and a schedule: (dt_ns, who, amount_fixed) steps, where who is
    "protected" (within its guarantee), an index of another campaign, or "add"."""
    cap = draw(st.sampled_from([10.0, 28.0, 100.0]))
    window = draw(st.sampled_from([1.0, 0.5, 2.0]))
    g = draw(st.sampled_from([0.5, 1.0, 2.0, 5.0]))
    others = []
    for _ in range(draw(st.integers(1, 4))):
        og = draw(st.sampled_from([0.0, 0.0, 0.5, 1.0]))
        os_ = og + draw(st.sampled_from([0.0, 1.0, 5.0, 20.0]))
        ob = os_ + draw(st.sampled_from([0.0, 2.0, 30.0]))
        ob_b = draw(st.sampled_from([0.0, 2.0, 10.0, 200.0]))
        others.append((og, os_, ob, ob_b))
    ps = g + draw(st.sampled_from([0.0, 1.0, 4.0]))
    prot = (g, ps, ps + draw(st.sampled_from([0.0, 3.0])), draw(st.sampled_from([0.0, 5.0])))
    n = draw(st.integers(5, 60))
    steps_ = []
    for _ in range(n):
        dt = draw(st.sampled_from([0, 1, 1000, NS // 100, NS // 10, NS // 3, NS, 3 * NS]))
        who = draw(st.sampled_from(["protected", "protected", "add"]
                                   + list(range(len(others))) * 2))
        frac = draw(st.sampled_from([0.0, 0.3, 1.0]) | st.floats(0, 1))
        big = draw(st.sampled_from([0.0, 0.5, 3.0, 20.0, 500.0]) | st.floats(0, 50))
        steps_.append((dt, who, frac, big))
    return cap, window, prot, others, steps_


def run_workload(cls, cap, window, prot, others, steps_):
    """Drive one engine; return the log of (t, campaign, allowed_fixed) and the envelopes."""
    fe = cls({"fs": cap}, window=window, now=0.0)
    env = []

    def add(g, s, b, B, t):
        if fe.guaranteed_sum[0] + g > fe.capacity[0]:
            g = 0.0
        c = fe.add_campaign(guaranteed={"fs": g}, sustained={"fs": max(s, g)},
                            ceiling={"fs": max(b, s, g)}, burst={"fs": B}, now=t / NS)
        env.append(fe.state["campaigns"][c, 0])
        return c

    p = add(*prot, 0)
    ids = [add(*o, 0) for o in others]
    g_fp, g_size = env[p][1], env[p][0]
    t, last_p, log = 0, None, []
    for dt, who, frac, big in steps_:
        t += dt
        if who == "add":
            ids.append(add(0.5, 1.0, 4.0, 2.0, t))
            continue
        if who == "protected":
            # within the guaranteed rate: at most what a (g, g*window) bucket refilled since
            # the protected campaign's last request, never more than its size
            quota = min(g_size, g_fp * (t - last_p) // NS) if last_p is not None else g_size
            amount = int(frac * quota)
            got, retry = fe.consume(p, "fs", amount / U, t / NS)
            assert units.to_fixed(got) == amount and retry == 0.0, "guarantee throttled"
            last_p = t
            log.append((t, p, amount))
        else:
            c = ids[who]
            got, _ = fe.consume(c, "fs", big, t / NS)
            log.append((t, c, units.to_fixed(got)))
    return fe, env, log


def check_bounds(fe, env, log, cap, window):
    cap_fp = units.to_fixed(cap)
    st_ = fe.state
    sizes = sum(int(e[0]) for e in env) + int(cap_fp * units.to_ns(window) // NS)
    times = sorted({x[0] for x in log})
    for i, t0 in enumerate(times):
        for t1 in times[i:]:
            total = sum(a for t, _, a in log if t0 <= t <= t1)
            assert total * NS <= cap_fp * (t1 - t0) + sizes * NS, (t0, t1, total)
            for c, e in enumerate(env):
                mine = [a for t, cc, a in log if cc == c and t0 <= t <= t1]
                if not mine:
                    continue
                tot, calls = sum(mine), len(mine)
                g_size, s_rate, B, p_size, p_rate = (int(e[0]), int(e[5]), int(e[4]),
                                                     int(e[8]), int(e[9]))
                assert tot * NS <= (max(g_size, B) + calls) * NS + s_rate * (t1 - t0), \
                    ("sustained", c, t0, t1, tot)
                assert tot * NS <= (p_size + calls) * NS + p_rate * (t1 - t0), \
                    ("peak", c, t0, t1, tot)
    assert st_["facility"][0, 2] >= 0


@pytest.mark.parametrize("backend", sorted(FLOW_BACKENDS))
@settings(max_examples=60)
@given(w=workloads())
def test_invariant_9_isolation_and_bounds(backend, w):
    cap, window, prot, others, steps_ = w
    fe, env, log = run_workload(FLOW_BACKENDS[backend], *w)
    check_bounds(fe, env, log, cap, window)


@pytest.mark.skipif(not PAIRED, reason="compiled extension unavailable")
@settings(max_examples=40)
@given(w=workloads())
def test_workloads_decide_identically(w):
    a = run_workload(FLOW_BACKENDS["compiled"], *w)
    b = run_workload(FLOW_BACKENDS["reference"], *w)
    assert a[2] == b[2]
    same_state(a[0].state, b[0].state)
