"""What ``_acquire.FastAcquire`` reads without Python's attribute machinery, and the slotted
:class:`Intent` it reads from.

The fast path reads the intent's slots, the broker's instance dict and a ManualClock's
``_t`` directly (see the ``FastAcquire`` docstring); these tests pin down that each shortcut
gives way whenever the plain read would not be what the general path reads, and that the
lease store then grows in place. ``tests/backends/test_acquire_paths_agree.py`` checks the decisions,
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


# -- the broker's attributes, the clock --------------------------------------------------
@compiled
def test_manual_clock_read_directly_unless_now_is_replaced(monkeypatch):
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
def test_a_broker_subclass_with_a_property_takes_the_general_path():
    """The broker's dict is the attribute only when the class defines no descriptor."""
    class Odd(Broker):
        @property
        def ttl(self):
            return 30.0

        @ttl.setter
        def ttl(self, v):
            pass

    b = Odd(Pool(gpu=64), clock=ManualClock(0.0), backend="compiled")
    b.register("a", Envelope(credits=math.inf, sustained={"gpu": 64}, ceiling={"gpu": 64},
                             burst={"gpu": math.inf}))
    assert b._fast.acquire(Intent("a", {"gpu": 1}, duration=5.0)) is None
    assert b._fast.expire(0) == -1
    assert b.acquire(Intent("a", {"gpu": 1}, duration=5.0)).granted


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
