"""The lease store reuses the rows of ended leases (docs/policy.md, "Memory").

A lease id is ``row | generation << 32``; an ended row waits in a FIFO until
``reuse_after`` later leases have ended, then the next grant takes it with its generation
moved on. These tests check, in every backend: a long churn keeps the store bounded, a stale
id (an ended lease whose row holds a later lease) is refused as an ended lease is, a stale
policy event does not touch the row's new lease, replay reproduces the ids, and snapshots
(pickles) carry the queue -- old ones still load.
"""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest

from bursarcore import Broker, Envelope, Intent, ManualClock, Pool
from bursarcore.admission.classes import DEFAULT_CLASSES, ServiceClass
from bursarcore.admission.state import _L_FIELDS, ROW_BITS, ROW_MASK, EngineState
from bursarcore.broker import BACKENDS, ENGINES
from bursarcore.errors import UnknownLease
from bursarcore.journal import records as J
from bursarcore.journal.memory import MemoryJournal

INF = float("inf")
COMPILED = [b for b in BACKENDS if b != "reference"]   # the engine's lease records


def _env(g=0, s=64, b=64, cls=None):
    kw = {} if cls is None else {"service_class": cls}
    return Envelope(credits=INF, guaranteed={"gpu": g}, sustained={"gpu": s},
                    ceiling={"gpu": b}, burst={"gpu": INF}, **kw)


def _churn(b, clk, steps, per_step, dur=1.0, release_every=0):
    """``per_step`` one-GPU leases per simulated second, each ``dur`` s long: at most
    ``per_step`` are live at once. Returns every lease id granted."""
    ids = []
    ci = np.zeros(per_step, dtype=np.int64)
    one = np.ones(per_step, dtype=np.int64)
    for i in range(steps):
        clk.set(float(i))
        r = b.admit_batch(ci, one, dur)
        assert (r.outcome == 0).all()
        ids.extend(r.lease.tolist())
        if release_every and i % release_every == 0:
            b.release(int(r.lease[0]))
        b.poll()
    return ids


@pytest.mark.parametrize("backend,reuse_after",
                         [(b, r) for b in BACKENDS for r in (0, 1024)
                          if b != "reference" or r == 1024])     # (the reference is slow)
def test_long_churn_keeps_the_store_bounded(backend, reuse_after):
    """100,000 short leases, at most 100 live: the lease arrays stay small."""
    clk = ManualClock(0.0)
    b = Broker(Pool(gpu=128), clk, backend=backend, reuse_after=reuse_after)
    b.register("a", _env(s=128, b=128))
    ids = _churn(b, clk, 1000, 100, release_every=7)
    assert len(ids) == len(set(ids)) == 100_000          # every id unique
    assert max(i >> ROW_BITS for i in ids) > 0            # rows were reused
    if hasattr(b, "st"):                                  # the compiled engine's records
        st = b.st
        assert st.nleases <= 100 + reuse_after + 100      # live + waiting + one batch
        assert st.camp.shape[0] <= 2048 and st.freeq.shape[0] == st.camp.shape[0]
        assert st.heap_t.shape[0] <= 4096
    assert len(b.leases()) == 100


def test_churn_is_the_same_in_both_backends():
    if "compiled" not in ENGINES:
        pytest.skip("compiled engine not built")
    out = []
    for be in ("compiled", "reference"):
        clk = ManualClock(0.0)
        b = Broker(Pool(gpu=64), clk, backend=be, reuse_after=3)
        b.register("a", _env())
        ids = _churn(b, clk, 300, 20, dur=2.5, release_every=3)
        state = b.state()
        del state["backend"]
        out.append((ids, state))
    (ia, sa), (ib, sb) = out
    assert ia == ib and sa == sb                 # the same ids, rows reused alike


def test_ids_of_a_store_that_never_reuses_are_unchanged(backend):
    clk = ManualClock(0.0)
    b = Broker(Pool(gpu=64), clk, backend=backend, reuse_after=None)
    b.register("a", _env())
    ids = _churn(b, clk, 30, 10)
    assert ids == list(range(300))
    if hasattr(b, "st"):
        assert b.st.lfree.tolist() == [0, 0, -1]


def _release_and_reuse(backend):
    clk = ManualClock(0.0)
    b = Broker(Pool(gpu=8), clk, backend=backend, reuse_after=0, journal=MemoryJournal())
    b.register("a", _env())
    first = b.acquire(Intent("a", {"gpu": 2}, 60.0)).lease.id
    clk.set(1.0)
    assert b.release(first).outcome == "released"
    clk.set(2.0)
    again = b.acquire(Intent("a", {"gpu": 3}, 60.0)).lease.id
    return b, clk, first, again


def test_a_stale_id_is_refused_as_an_ended_lease(backend):
    b, clk, first, again = _release_and_reuse(backend)
    assert again & ROW_MASK == first & ROW_MASK and again == first | 1 << ROW_BITS
    # an ended lease whose row is still its own: refused "invalid", with its record
    other = b.acquire(Intent("a", {"gpu": 1}, 60.0)).lease.id
    b.release(other)
    ended_rel, ended_ren = b.release(other), b.renew(other, 10.0)
    assert (ended_rel.outcome, ended_rel.reason) == ("refused", "invalid")
    assert (ended_ren.outcome, ended_ren.reason) == ("refused", "invalid")
    assert b.lease(other).state == "released"
    # the stale id: the same outcome and reason, but its campaign and record are gone
    for dec in (b.release(first), b.renew(first, 10.0)):
        assert (dec.outcome, dec.reason, dec.lease, dec.campaign, dec.intent_id) == \
            ("refused", "invalid", None, "", -1)
    with pytest.raises(UnknownLease, match="reused"):
        b.lease(first)
    # ... and it did not touch the row's new lease
    live = b.lease(again)
    assert (live.state, live.units, live.expiry) == ("active", 3, 62.0)
    assert b.state()["pool"]["gpu"]["occupied"] == 3
    # a generation never issued, and a row never used, are unknown
    for bad in (first | 2 << ROW_BITS, 5000, -1, 1 << 62):
        with pytest.raises(UnknownLease):
            b.release(bad)
        with pytest.raises(UnknownLease):
            b.lease(bad)
    # the journal replays, stale records included
    rb = Broker.replay(b.journal, backend=backend, resume=False)
    assert rb.lease(again).units == 3


def test_a_stale_activation_event_does_not_activate_the_rows_new_lease(backend):
    """A reclaim grant released before its activation leaves its activation event in the
    broker's queue; its row, reused by a later reclaim grant, must not be activated by it
    (the pool still holds that grant's victim: it would overfill)."""
    classes = list(DEFAULT_CLASSES) + [ServiceClass("opp-long", 4, 0.25, False, True, 120.0,
                                                    True)]
    clk = ManualClock(0.0)
    b = Broker(Pool(gpu=4), clk, backend=backend, classes=classes, reuse_after=0)
    b.register("o", _env(g=0, s=4, b=4, cls="opportunistic"))
    b.register("f", _env(g=4, s=4, b=4, cls="interactive"))
    o1 = b.acquire(Intent("o", {"gpu": 2}, 3600.0)).lease.id
    o2 = b.acquire(Intent("o", {"gpu": 2}, 3600.0, service_class="opp-long")).lease.id
    s1 = b.acquire(Intent("f", {"gpu": 2}, 600.0))
    assert s1.path == "reclaim" and s1.wait == 60.0          # o1 preempted (grace 60)
    clk.set(1.0)
    assert b.release(s1.lease.id).outcome == "released"
    clk.set(2.0)
    s2 = b.acquire(Intent("f", {"gpu": 4}, 600.0))          # o2 preempted too (grace 120)
    assert s2.path == "reclaim" and s2.lease.id & ROW_MASK == s1.lease.id & ROW_MASK
    clk.set(61.0)
    b.poll()
    assert b.lease(s2.lease.id).state == "starting"         # not at s1's activation (60)
    assert b.lease(o2).state == "revoking" and b.lease(o1).state == "revoked"
    clk.set(123.0)
    kinds = [(e.kind, e.lease_id) for e in b.poll()]
    assert ("activated", s2.lease.id) in kinds
    assert b.lease(s2.lease.id).state == "active"
    assert b.state()["pool"]["gpu"]["occupied"] == 4


def test_replay_reproduces_ids_after_reuse(backend):
    clk = ManualClock(0.0)
    j = MemoryJournal()
    b = Broker(Pool(gpu=32), clk, backend=backend, reuse_after=2, journal=j)
    b.register("a", _env())
    ids = _churn(b, clk, 60, 8, dur=1.5, release_every=2)
    for k in range(10):
        clk.set(60.0 + k)
        d = b.acquire(Intent("a", {"gpu": 1}, 0.5))
        ids.append(d.lease.id)
        b.renew(d.lease.id, 0.25)
        b.release(ids[k])                                    # stale by now
    assert max(i >> ROW_BITS for i in ids) > 0
    for be in BACKENDS:                                      # in every backend
        rb = Broker.replay(j, backend=be, resume=False)
        assert [l.id for l in rb.leases()] == [l.id for l in b.leases()]
        if hasattr(rb, "st") and hasattr(b, "st"):
            assert np.array_equal(rb.st.gen, b.st.gen)
            assert np.array_equal(rb.st.lfree, b.st.lfree)
    granted = j.rows()
    granted = granted[(granted["op"] == J.OP["acquire"]) & (granted["outcome"] == 1)]
    assert granted["lease"].tolist() == [i for i in ids if i >= 0]


def test_a_journal_without_reuse_after_replays_without_reuse(backend):
    """Journals written before rows were reused have no ``reuse_after`` in their config
    record: they replay with every row used once, so their lease ids come back."""
    clk = ManualClock(0.0)
    j = MemoryJournal()
    b = Broker(Pool(gpu=32), clk, backend=backend, reuse_after=None, journal=j)
    b.register("a", _env())
    _churn(b, clk, 20, 8)
    cfg = json.loads(j.payloads()[0])
    assert cfg.pop("reuse_after") is None
    j.payloads()[0] = json.dumps(cfg, sort_keys=True)
    rb = Broker.replay(j, backend=backend, resume=False)
    assert rb.reuse_after is None
    assert [l.id for l in rb.leases()] == [l.id for l in b.leases()]
    assert max(l.id for l in rb.leases()) == 159             # every row used once


@pytest.mark.parametrize("backend", COMPILED)
def test_pickles_carry_the_queue_and_old_ones_load(backend):
    clk = ManualClock(0.0)
    b = Broker(Pool(gpu=16), clk, backend=backend, reuse_after=1)
    b.register("a", _env())
    _churn(b, clk, 10, 4, dur=1.5)
    st = pickle.loads(pickle.dumps(b.st))
    for f in ("gen", "freeq", "lfree"):
        assert np.array_equal(getattr(st, f), getattr(b.st, f))
    # a snapshot from before rows were reused: no generations, no queue
    old = EngineState.__new__(EngineState)
    d = dict(b.st.__getstate__())
    lrow = d.pop("lrow")                  # (and before leases were records: a column each)
    d.update({f: lrow[:, j].copy() for j, f in enumerate(_L_FIELDS)})
    for f in ("gen", "freeq", "lfree"):
        d.pop(f)
    old.__setstate__(d)
    assert old.gen.shape == old.camp.shape == old.freeq.shape
    assert old.lfree.tolist() == [0, 0, 1024]
    k = ENGINES[backend]
    old.grow_leases(1, 4)
    lid = k.grant(old, 0, 0, 2, 1, 10**9, 0, int(clk.now() * 1e9), False, 99)
    assert lid == old.nleases - 1                            # a new row, generation 0
    k.end_lease(old, lid, int(clk.now() * 1e9) + 1, 3)
    assert old.lfree.tolist() == [0, 1, 1024]                # queued for reuse
