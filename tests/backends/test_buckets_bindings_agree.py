"""Each binding of the C core's token buckets against the reference, step by step
(PyRoaringBitMap's habit).

A hypothesis ``RuleBasedStateMachine`` applies the same operation to two objects and
requires the same result, bit for bit, and the same ``state`` after every step; an
invalid operation (which it generates on purpose now and then) must raise the same
exception type with the same ``field`` in both, and change nothing. Invariants: tokens in
[0, capacity], remainder in [0, 1e9) and 0 for a full bucket, no update after the watermark.

For each compiled backend present (the core bound by Cython, and by cffi) the pair is
(that backend, reference), each with its own history. On the pure-Python path the pair is (reference, a fresh reference rebuilt from the
first one's ``state`` before every step), so the machine still checks that ``state``
captures everything an operation depends on, and that the reference is deterministic.
"""

from __future__ import annotations

import math
import pickle
import struct

import numpy as np
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from bursarcore import units
from bursarcore.buckets import BACKENDS, ReferenceTokenBuckets
from bursarcore.errors import InvalidArgument

NS = units.NS
MAX_S = units.MAX_NS / NS
COMPILED = [name for name in BACKENDS if name != "reference"]
SECOND = ReferenceTokenBuckets

# -- value strategies: mostly valid, sometimes deliberately not -------------------------------
BAD_NUMBERS = st.sampled_from([math.nan, math.inf, -math.inf, -1.0, -1, 1e13, 10**400, "1",
                               None])


def magnitudes(lo: int, hi: int) -> st.SearchStrategy:
    """m * 10**e for e in [lo, hi], capped at the largest amount (4.6e12 units)."""
    return st.builds(lambda m, e: min(m * 10.0**e, 4.6e12), st.floats(1, 10),
                     st.integers(lo, hi))


# magnitudes spread from micro-units to the 4.6e12-unit limit, so the 128-bit and the
# beyond-2**53 paths of the kernels get exercised, not only everyday numbers; the extra
# large capacities and small rates give waits and credits beyond 2**53
capacities = (st.sampled_from([0.0, 1e-6, 1.0, 2.5, 10.0, 1e6, 4e12])
              | st.floats(0, 1e3) | st.integers(0, 50) | magnitudes(-6, 12)
              | magnitudes(9, 12))
rates = (st.sampled_from([0.0, 1e-6, 0.3, 1.0, 2.5, 7.0, 1e3, 1e9, 4e12])
         | st.floats(0, 1e2) | st.integers(0, 10) | magnitudes(-6, 12) | magnitudes(-6, -2))
fractions = st.sampled_from([0.0, 0.5, 1.0]) | st.floats(0, 1)
# ns steps: tiny, sub-second, seconds, and occasional huge leaps (to MAX_NS at most)
steps = (st.integers(0, 10) | st.integers(0, NS) | st.integers(0, 100 * NS)
         | st.sampled_from([10**15, 10**17, 2 * 10**18, 2 * units.MAX_NS]))


def maybe_bad(good: st.SearchStrategy) -> st.SearchStrategy:
    """``good`` mostly, sometimes a bad number."""
    return st.one_of(good, good, good, good, good, good, good, good, good, BAD_NUMBERS)


def choose(data, **weights: int) -> str:
    """A key drawn with the given weights; shrinking moves towards the first.

    Hypothesis favours the ends of an integer range, so both ends mean the first key (the
    common case) rather than letting the last key (often the bad one) win too often.
    """
    total = sum(weights.values())
    r = data.draw(st.integers(0, total)) % total
    for key, w in weights.items():
        if r < w:
            return key
        r -= w
    raise AssertionError


def bits(x: object) -> object:
    """A value's exact identity: floats by their bytes (so 0.0 != -0.0, nan == nan)."""
    if isinstance(x, np.ndarray):
        return (x.dtype.str, x.shape, x.tobytes())
    if type(x) is float:
        return ("float", struct.pack("<d", x))
    return (type(x).__name__, x)


def same_state(a: dict, b: dict) -> None:
    assert set(a) == set(b)
    assert type(a["watermark"]) is int and a["watermark"] == b["watermark"]
    for key in ("capacity", "rate", "tokens", "remainder", "last"):
        assert a[key].dtype == np.int64 and b[key].dtype == np.int64
        if not np.array_equal(a[key], b[key]):  # cheap check first: it runs every step
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def outcome(f, tb):
    try:
        return "ok", f(tb)
    except InvalidArgument as e:
        return "error", (type(e), e.field)
    # anything else (TypeError, OverflowError, ...) is a bug and propagates


class BucketsMachine(RuleBasedStateMachine):
    """Drives FIRST and SECOND with the same operations."""

    FIRST: type = ReferenceTokenBuckets
    PAIRED = False

    def __init__(self) -> None:
        super().__init__()
        self.a = self.b = None
        self.now_ns = 0

    # -- plumbing -----------------------------------------------------------------------------
    def both(self, name, f):
        if not self.PAIRED:  # the second object is the first one rebuilt from its state
            self.b = SECOND.from_state(self.a.state)
        before = self.a.state
        ra, rb = outcome(f, self.a), outcome(f, self.b)
        after = self.a.state
        assert ra[0] == rb[0], (ra, rb)
        event(f"{name}: {ra[0]}" + (f" ({ra[1][0].__name__}, {ra[1][1]})"
                                          if ra[0] == "error" else ""))
        if ra[0] == "error":
            assert ra[1] == rb[1], (ra, rb)
            same_state(before, after)  # refused before any change
        else:
            assert bits(ra[1]) == bits(rb[1]), (ra, rb)
        same_state(after, self.b.state)
        # keep the clock at or after every update, so most later steps are valid
        self.now_ns = max(self.now_ns, after["watermark"])
        return ra

    def n(self) -> int:
        return len(self.a)

    def when(self, data):
        """``now`` for an operation: usually the clock, sometimes behind it, sometimes bad."""
        kind = choose(data, now=10, ahead=4, int=1, np=1, behind=1, bad=1)
        if kind == "ahead":
            self.now_ns = min(units.MAX_NS, self.now_ns + data.draw(steps))
        if kind in ("now", "ahead"):
            return self.now_ns / NS
        if kind == "int":  # whole seconds: may lie behind some bucket's last update
            return int(math.ceil(self.now_ns / NS)) if data.draw(st.booleans()) else \
                int(self.now_ns // NS)
        if kind == "np":
            return np.float64(self.now_ns / NS)
        if kind == "behind":
            return (self.now_ns - data.draw(st.integers(1, 2 * NS))) / NS
        return data.draw(BAD_NUMBERS | st.sampled_from([5e9, -5e9]))

    def index(self, data):
        n = self.n()
        if n and choose(data, good=19, bad=1) == "good":
            return data.draw(st.integers(0, n - 1))
        return data.draw(st.sampled_from([-1, n, n + 5, 10**30, 1.0, "0", None, np.int64(n)]))

    def amount(self, data, i, allow_bad=True):
        if isinstance(i, int) and 0 <= i < self.n():
            cap = float(self.a.capacity[i])
            held = self.a.state["tokens"][i] / units.SCALE  # as of the bucket's last update
        else:
            cap, held = 10.0, 5.0
        kind = choose(data, part=4, short=4, small=2, edge=2, whole=1, bad=int(allow_bad))
        if kind == "part":
            return data.draw(fractions) * cap
        if kind == "short":  # more than held, at most the capacity: a finite wait
            return held + data.draw(fractions) * (cap - held)
        if kind == "small":
            return data.draw(st.floats(0, 20))
        if kind == "edge":
            return data.draw(st.sampled_from([0.0, 1e-6, cap, cap + 1e-6, held, held + 1e-6]))
        if kind == "whole":
            return data.draw(st.integers(0, 5))
        return data.draw(BAD_NUMBERS)

    # -- construction -------------------------------------------------------------------------
    @initialize(data=st.data(), n=st.sampled_from([1, 2, 3, 4, 5, 0]),
                start=st.sampled_from([0, -MAX_S, -1000.0]) | st.floats(-10, 10))
    def construct(self, data, n, start):
        caps = data.draw(st.lists(capacities, min_size=n, max_size=n))
        rts = data.draw(st.lists(rates, min_size=n, max_size=n))
        fr = data.draw(st.none() | st.lists(fractions, min_size=n, max_size=n))
        toks = None if fr is None else [c * f for c, f in zip(caps, fr)]
        self.a = self.FIRST(caps, rts, tokens=toks, now=start)
        self.b = SECOND(caps, rts, tokens=toks, now=start)
        self.now_ns = units.to_ns(start)
        same_state(self.a.state, self.b.state)

    @rule(data=st.data())
    def construct_again(self, data):
        """A new pair from arguments that are sometimes invalid (then both must refuse)."""
        n = data.draw(st.integers(0, 4))
        caps = data.draw(st.lists(maybe_bad(capacities), min_size=n, max_size=n))
        rts = data.draw(st.lists(maybe_bad(rates), min_size=n, max_size=n)
                        | maybe_bad(rates) | st.just([1.0] * (n + 1)))
        toks = data.draw(st.none() | st.lists(maybe_bad(capacities), min_size=n, max_size=n))
        start = data.draw(maybe_bad(st.floats(-10, 10)))
        ra = outcome(lambda cls: cls(caps, rts, tokens=toks, now=start), self.FIRST)
        rb = outcome(lambda cls: cls(caps, rts, tokens=toks, now=start), SECOND)
        assert ra[0] == rb[0], (ra, rb)
        if ra[0] == "error":
            assert ra[1] == rb[1], (ra, rb)
            return
        self.a, self.b = ra[1], rb[1]
        same_state(self.a.state, self.b.state)
        self.now_ns = self.a.state["watermark"]

    # -- operations ---------------------------------------------------------------------------
    @rule(data=st.data())
    def try_debit(self, data):
        i = self.index(data)
        amount, now = self.amount(data, i), self.when(data)
        self.both("try_debit", lambda tb: tb.try_debit(i, amount, now))

    @rule(data=st.data())
    def try_debit_batch(self, data):
        n, k = self.n(), data.draw(st.integers(0, 8))
        idx = data.draw(st.lists(st.integers(0, max(n - 1, 0)), min_size=k, max_size=k))
        if choose(data, good=9, bad=1) == "bad":  # out of range or not integers
            idx = data.draw(st.sampled_from([
                idx + [n], idx + [-1], [float(x) for x in idx] + [0.5],
                np.array(idx + [2**63], dtype=np.uint64), 0]))
        m = len(idx) if isinstance(idx, (list, np.ndarray)) else 1
        kind = choose(data, scalar=3, list=5, whole=1, bad_item=1, bad=1, length=1)
        if kind == "scalar":
            amounts = data.draw(st.floats(0, 10))
        elif kind == "list":
            amounts = [self.amount(data, i, allow_bad=False) if isinstance(i, int) else 1.0
                       for i in (idx if isinstance(idx, list) else [0] * m)]
        elif kind == "whole":
            amounts = data.draw(st.integers(0, 3))
        elif kind == "bad_item":
            amounts = data.draw(st.lists(maybe_bad(st.floats(0, 10)), min_size=m, max_size=m))
        elif kind == "bad":
            amounts = data.draw(BAD_NUMBERS)
        else:
            amounts = [1.0] * (m + 1)
        shape = choose(data, scalar=4, sorted=2, per_bucket=2, any=1, bad=1)
        if shape == "scalar":
            now = self.when(data)
        elif shape == "bad":
            now = data.draw(st.sampled_from([[math.nan] * m, [0.0] * (m + 1), [5e9] * m,
                                             [-math.inf] * m]))
        else:
            base = self.now_ns - data.draw(st.sampled_from([0, 0, NS]))
            offs = data.draw(st.lists(st.integers(0, 3 * NS), min_size=m, max_size=m))
            if shape == "sorted":
                offs = sorted(offs)
            elif shape == "per_bucket" and isinstance(idx, list):
                per = {}
                for j, i in enumerate(idx):  # non-decreasing within each bucket
                    per[i] = max(per.get(i, 0), offs[j])
                    offs[j] = per[i]
            now = [(base + o) / NS for o in offs]
        self.both("try_debit_batch", lambda tb: tb.try_debit_batch(idx, amounts, now))

    @rule(data=st.data())
    def refund(self, data, i=None, now=None):
        i = self.index(data) if i is None else i
        amount = self.amount(data, i)
        now = self.when(data) if now is None else now
        self.both("refund", lambda tb: tb.refund(i, amount, now))

    @rule(data=st.data())
    def set_rate(self, data):
        i = self.index(data)
        rate, now = data.draw(maybe_bad(rates)), self.when(data)
        self.both("set_rate", lambda tb: tb.set_rate(i, rate, now))

    @rule(data=st.data())
    def time_until(self, data, i=None, now=None):
        i = self.index(data) if i is None else i
        amount = self.amount(data, i)
        now = self.when(data) if now is None else now
        kind, wait = self.both("time_until", lambda tb: tb.time_until(i, amount, now))
        if kind == "ok":
            event("time_until: " + ("inf" if wait == math.inf else ">= 2**53 ns"
                                    if wait >= 2**53 / NS else "0" if wait == 0 else "finite"))
        if kind == "ok" and 0 < wait < 1e6:
            # debiting at now + wait succeeds, one ns earlier fails (on copies), where the
            # float seconds can name those ns exactly
            t, q = units.to_ns(now), units.to_ns(wait)
            if abs(t) + q > 2**50 or units.to_ns((t + q) / NS) != t + q \
                    or units.to_ns((t + q - 1) / NS) != t + q - 1:
                return
            for tb in (self.a, self.b):
                assert type(tb).from_state(tb.state).try_debit(i, amount, (t + q) / NS)
                assert not type(tb).from_state(tb.state).try_debit(i, amount, (t + q - 1) / NS)

    @rule(data=st.data())
    def drain_then_wait(self, data):
        """Empty a bucket at the clock, then ask how long until part of it is back, or refund
        part of it (an empty bucket gives finite waits and large credits)."""
        n = self.n()
        t = self.now_ns / NS
        if not n or units.to_ns(t) < self.a.state["watermark"]:
            return
        i = data.draw(st.integers(0, n - 1))
        held = float(self.a.tokens(t)[i])
        self.both("try_debit", lambda tb: tb.try_debit(i, held, t))
        if data.draw(st.booleans()):
            self.time_until(data, i=i, now=t)
        else:
            self.refund(data, i=i, now=t)

    @rule(data=st.data())
    def tokens(self, data):
        now = self.when(data)
        self.both("tokens", lambda tb: tb.tokens(now))

    @rule(data=st.data())
    def append(self, data):
        cap = data.draw(maybe_bad(capacities))
        rate = data.draw(maybe_bad(rates))
        scale = float(cap) if type(cap) in (int, float) and 0 <= cap <= 1e13 else 1.0
        tokens = data.draw(st.none() | fractions.map(lambda f: f * scale) | BAD_NUMBERS)
        now = data.draw(st.none() | st.just(self.now_ns / NS) | maybe_bad(st.floats(-5, 5)))
        self.both("append", lambda tb: tb.append(cap, rate, tokens=tokens, now=now))

    @rule(dt=steps)
    def advance(self, dt):
        self.now_ns = min(units.MAX_NS, self.now_ns + dt)

    @rule(protocol=st.integers(0, pickle.HIGHEST_PROTOCOL))
    def pickle_round_trip(self, protocol):
        a = pickle.loads(pickle.dumps(self.a, protocol=protocol))
        b = pickle.loads(pickle.dumps(self.b, protocol=protocol))
        assert type(a) is type(self.a) and type(b) is type(self.b)
        same_state(a.state, self.a.state)
        same_state(b.state, self.b.state)
        self.a, self.b = a, b

    @precondition(lambda self: self.PAIRED)
    @rule()
    def swap_state_across_backends(self):
        """Each backend rebuilt from the other's state."""
        a, b = self.FIRST.from_state(self.b.state), SECOND.from_state(self.a.state)
        same_state(a.state, b.state)
        self.a, self.b = a, b

    # -- invariants ---------------------------------------------------------------------------
    @invariant()
    def buckets_are_sane(self):
        s = self.a.state
        cap, tok, rem, last = s["capacity"], s["tokens"], s["remainder"], s["last"]
        assert (tok >= 0).all() and (tok <= cap).all()
        assert (cap >= 0).all() and (cap <= units.MAX_FIXED).all()
        assert (rem >= 0).all() and (rem < NS).all()
        assert (rem[tok == cap] == 0).all()  # a full bucket holds no remainder
        assert (last <= s["watermark"]).all()
        same_state(s, self.b.state)
        assert bits(self.a.capacity) == bits(self.b.capacity)
        assert bits(self.a.rate) == bits(self.b.rate)
        assert len(self.a) == len(self.b) == cap.shape[0]
        # peek at the clock (when the float names an instant at or after the watermark)
        t = max(self.now_ns, s["watermark"]) / NS
        if units.to_ns(t) >= s["watermark"]:
            peek = self.a.tokens(t)
            assert bits(peek) == bits(self.b.tokens(t))
            assert (peek >= 0).all() and (peek <= self.a.capacity).all()


def _machine(name: str) -> type:
    """The machine pairing backend ``name`` with the reference (or, with no compiled
    backend, the reference with itself rebuilt from its state)."""
    cls = type(f"BucketsMachine_{name}", (BucketsMachine,),
               {"FIRST": BACKENDS[name], "PAIRED": name != "reference"})
    # twice the profile's examples: this one test stands in for many table rows
    cls.TestCase.settings = settings(settings(), stateful_step_count=40,
                                     max_examples=2 * settings().max_examples)
    return cls.TestCase


for _name in COMPILED or ["reference"]:
    globals()[f"TestBucketsAgainstReference_{_name}"] = _machine(_name)
