"""How ``_acquire.FastAcquire`` reaches the broker, and the slotted :class:`Intent` it reads.

The fast path reads the intent's slots and reaches the broker only through its port: the
cursor's fields (one copy, shared with the broker's Python steps), the clock asked on every
call, and the broker's steps as bound (a subclass's own are honoured); and it lets the lease
store grow in place. ``tests/backends/test_acquire_paths_agree.py`` checks the decisions,
journals and state against the general path.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import pickle
import weakref

import pytest

from bursarcore import Broker, Envelope, Intent, ManualClock, Pool
from bursarcore import clock as clock_mod
from bursarcore.admission import state as state_mod
from bursarcore.broker import BACKENDS

compiled = pytest.mark.skipif(
    "compiled" not in BACKENDS or Broker(Pool(gpu=1), backend="compiled")._fast is None,
    reason="no compiled FastAcquire (not built, or the cffi binding)")


def _broker(backend="compiled", **kw):
    b = Broker(Pool(gpu=4096), clock=ManualClock(1.0), backend=backend, **kw)
    b.register("a", Envelope(credits=math.inf, sustained={"gpu": 4096}, ceiling={"gpu": 4096},
                             burst={"gpu": math.inf}))
    return b


class Counting:
    def __init__(self, fast):
        self.fast, self.hits = fast, 0

    def acquire(self, intent):
        r = self.fast.acquire(intent)
        self.hits += r is not None
        return r

    def expire(self, t):
        return self.fast.expire(t)

    def events(self, ev, take):
        return self.fast.events(ev, take)


# -- Intent ------------------------------------------------------------------------------
def test_intent_is_slotted_and_keeps_its_behaviour():
    i = Intent("a", {"gpu": (1, 3)}, duration=5.0, ttl=3.0)
    assert not hasattr(i, "__dict__")
    assert i == Intent("a", {"gpu": (1, 3)}, duration=5.0, ttl=3.0)
    assert repr(i) == ("Intent(campaign='a', units={'gpu': (1, 3)}, duration=5.0, "
                       "deadline=None, max_spend=None, service_class=None, ttl=3.0)")
    assert (i.dim, i.bounds) == ("gpu", (1, 3))
    with pytest.raises(dataclasses.FrozenInstanceError):
        i.campaign = "b"  # type: ignore[misc]
    assert weakref.ref(i)() is i
    for proto in range(pickle.HIGHEST_PROTOCOL + 1):
        assert pickle.loads(pickle.dumps(i, proto)) == i
    assert copy.copy(i) == i and copy.deepcopy(i) == i
    assert dataclasses.replace(i, ttl=4.0).ttl == 4.0


def test_intent_unpickles_the_state_of_an_unslotted_intent():
    """An intent pickled before Intent had slots carries its ``__dict__`` as the state."""
    i = Intent.__new__(Intent)
    i.__setstate__({"campaign": "a", "units": {"gpu": 2}, "duration": 5.0, "deadline": None,
                    "max_spend": None, "service_class": None, "ttl": None})
    assert i == Intent("a", {"gpu": 2}, duration=5.0)


# -- the cursor, the clock, the port ----------------------------------------------------
@compiled
def test_the_clock_is_asked_on_every_call_whatever_it_is(monkeypatch):
    b = _broker()
    b._fast = Counting(b._fast)
    assert b.acquire(Intent("a", {"gpu": 1}, duration=5.0)).lease.granted_at == 1.0
    monkeypatch.setattr(clock_mod.ManualClock, "now", lambda self: 1.5)
    assert b.acquire(Intent("a", {"gpu": 1}, duration=5.0)).lease.granted_at == 1.5
    monkeypatch.undo()
    b.clock.advance(1.0)
    assert b.acquire(Intent("a", {"gpu": 1}, duration=5.0)).lease.granted_at == 2.0
    b.clock.now = lambda: 2.5                      # an instance's own now
    assert b.acquire(Intent("a", {"gpu": 1}, duration=5.0)).lease.granted_at == 2.5
    del b.clock.now
    b.clock = ManualClock(10.0)                    # another clock
    assert b.acquire(Intent("a", {"gpu": 1}, duration=5.0)).lease.granted_at == 10.0
    assert b._fast.hits == 5


@compiled
def test_the_broker_and_the_fast_path_share_one_cursor():
    """What the fast path writes (time, intent ids, queued expiries) is what the broker's
    Python steps read, and the other way round: there is one copy, the cursor's."""
    b = _broker()
    b._fast = Counting(b._fast)
    b.ttl = 7.0                                    # a public attribute, kept in the cursor
    assert b._cur.ttl == 7.0
    d = b.acquire(Intent("a", {"gpu": 1}, duration=0.5))
    assert (d.intent_id, b._cur.next_intent, b._cur.t) == (0, 1, 1_000_000_000)
    assert b.cancel(0) is False                    # the general path, between two fast ones
    b._cur.next_intent = 40                        # as the general path would move it
    b.clock.advance(1.0)
    d = b.acquire(Intent("a", {"gpu": 1}, duration=0.5))
    assert d.intent_id == 40 and b._cur.next_intent == 41 and b._cur.t == 2_000_000_000
    assert [e.kind for e in b.poll()] == ["expired"]   # queued by the fast path, polled here
    assert b._fast.hits == 2


@compiled
def test_a_broker_subclass_overriding_a_step_is_honoured():
    """The fast path calls the broker's steps as bound in its port, so a subclass's own
    ``_retry_after`` answers; a subclass's own pending-queue pass is never skipped."""
    class Hinting(Broker):
        def _retry_after(self, c, d, nmin, dur, reason):
            return 99.0

        def _serve_pending(self, t):
            self.served = getattr(self, "served", 0) + 1
            super()._serve_pending(t)

    b = Hinting(Pool(gpu=8), clock=ManualClock(0.0), backend="compiled")
    b.register("a", Envelope(credits=math.inf, sustained={"gpu": 1}, ceiling={"gpu": 8},
                             burst={"gpu": 1}))
    b.register("b", Envelope(credits=math.inf, sustained={"gpu": 8}, ceiling={"gpu": 8},
                             burst={"gpu": math.inf}))
    assert b.acquire(Intent("b", {"gpu": 8}, duration=50.0)).granted
    assert b.acquire(Intent("b", {"gpu": 1}, duration=5.0, ttl=5.0)).outcome == "pending"
    b.clock.advance(0.1)
    d = b._fast.acquire(Intent("a", {"gpu": 4}, duration=50.0))
    assert d is not None and d.reason == "tokens" and d.retry_after == 99.0
    assert b.served >= 1


# -- the lease store grows in place ------------------------------------------------------
@pytest.mark.parametrize("backend", ["compiled"])
def test_lease_store_grows_in_place_under_acquire(monkeypatch, backend):
    """The fast path holds no view of the state across ``_reserve``, so ``_resize`` can
    ``ndarray.resize`` the lease records' buffer (it copies one anything else references)."""
    if backend not in BACKENDS:
        pytest.skip("compiled engine not built")
    copied = []
    orig = state_mod.EngineState._resize

    def owner(self, name):                       # lrow is a view of its buffer
        a = self.__dict__.get(name)
        return id(a.base if name == "lrow" else a)

    def resize(self, name, new, keep):
        before = owner(self, name)               # (a reference would itself force a copy)
        orig(self, name, new, keep)
        if owner(self, name) != before and name not in ("heap_t", "heap_id"):
            copied.append(name)

    monkeypatch.setattr(state_mod.EngineState, "_resize", resize)
    b = _broker(backend)
    for _ in range(3000):       # (leases that outlive the loop: rows of ended ones are reused)
        assert b.acquire(Intent("a", {"gpu": 1}, duration=60.0)).granted
        b.clock.advance(0.001)
    assert b.st.camp.shape[0] >= 3000
    assert copied == []
