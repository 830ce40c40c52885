"""Growing the lease store is all or nothing: a MemoryError while its records and the
expiry heap's two arrays grow one by one leaves every array as it was (same lengths, same
values), so the state stays usable and the kernels' shape checks still pass. And growth
keeps the records, in place or by copying, on a 64-byte boundary."""

from __future__ import annotations

import numpy as np
import pytest

from bursarcore import Broker, Envelope, Intent, ManualClock, Pool
from bursarcore.admission import state as state_mod
from bursarcore.admission.state import _L_FIELDS, L_WIDTH, EngineState
from bursarcore.broker import BACKENDS

# the compiled engine's state records (the reference broker keeps named records instead)
if "compiled" not in BACKENDS:  # pragma: no cover - a build without the C core
    pytest.skip("the compiled engine's state records", allow_module_level=True)

GROWN = _L_FIELDS + ("lrow", "heap_t", "heap_id", "freeq", "lfree", "scal")


def snapshot(s: EngineState) -> dict[str, np.ndarray]:
    return {f: getattr(s, f).copy() for f in GROWN}


@pytest.mark.parametrize("backend", ["compiled"])
@pytest.mark.parametrize("fail_at", range(1, 4))     # lrow, heap_t, heap_id
def test_a_memory_error_part_way_through_growth_changes_nothing(monkeypatch, backend, fail_at):
    b = Broker(Pool(gpu=64), clock=ManualClock(0.0), backend=backend, reuse_after=0)
    b.register("a", Envelope(credits=1e9, sustained={"gpu": 64}, ceiling={"gpu": 64}))
    st = b.st
    # fill the store to its last row, with one ended row waiting in the FIFO
    L = st.camp.shape[0]
    lids = [b.acquire(Intent("a", units={"gpu": 1}, duration=60)).lease.id for _ in range(3)]
    b.release(lids[0])
    st.scal[2] = L                          # the high-water mark at the end of the store
    before = snapshot(st)
    calls = {"n": 0}
    real = state_mod.EngineState._resize

    def resize(self, name, new, keep):
        if new > getattr(self, name).shape[0]:      # a growth, not the shrink back
            calls["n"] += 1
            if calls["n"] == fail_at:
                raise MemoryError(f"no room for {name}")
        return real(self, name, new, keep)

    monkeypatch.setattr(state_mod.EngineState, "_resize", resize)
    with pytest.raises(MemoryError):
        st.grow_leases(L + 1)              # more than the reusable row: the store must grow
    monkeypatch.setattr(state_mod.EngineState, "_resize", real)
    after = snapshot(st)
    for f in GROWN:
        assert after[f].shape == before[f].shape, f
        assert np.array_equal(after[f], before[f]), f
    st.scal[2] = 3                          # the real high-water mark: the broker works on
    assert b.acquire(Intent("a", units={"gpu": 1}, duration=60)).granted
    st.grow_leases(L + 1)                  # and a growth that succeeds lengthens them all
    assert {getattr(st, f).shape[0] for f in _L_FIELDS} == {st.camp.shape[0]} != {L}


@pytest.mark.parametrize("how", ["in place", "held elsewhere", "off the boundary"])
def test_growth_keeps_the_records(how):
    b = Broker(Pool(gpu=4096), clock=ManualClock(0.0), backend="compiled")
    b.register("a", Envelope(credits=1e9, sustained={"gpu": 4096}, ceiling={"gpu": 4096}))
    st = b.st
    for i in range(1500):                   # past the first 1024 rows: one growth already
        b.acquire(Intent("a", units={"gpu": 1}, duration=60 + i))
    L, n = st.lrow.shape[0], st.nleases
    if how == "off the boundary":           # records 8 bytes past the boundary _aligned picks
        buf = np.zeros(L * L_WIDTH + 16, dtype=np.int64)
        off = (-(buf.ctypes.data % 64) // 8) % 8 + 1
        buf[off:off + L * L_WIDTH] = st.lrow.ravel()
        st._set_leases(buf, L, off)         # (as a realloc that moved the boundary leaves it)
        del buf                             # (the state's views are then all that hold it)
    before = st.lrow[:n].copy()
    held = st.t_end if how == "held elsewhere" else None   # a view: no resize in place
    st.grow_leases(L + 1)
    assert st.lrow.shape[0] == 2 * L > n
    assert np.array_equal(st.lrow[:n], before) and not st.lrow[n:].any()
    assert st.lrow.ctypes.data % 64 == 0
    for j, f in enumerate(_L_FIELDS):
        assert np.shares_memory(getattr(st, f), st.lrow) and getattr(st, f).shape == (2 * L,)
    if held is not None:
        assert np.array_equal(held[:n], before[:, _L_FIELDS.index("t_end")])
    d = b.acquire(Intent("a", units={"gpu": 1}, duration=5))
    assert d.granted and st.t_end[d.lease.id] == 5 * 10**9


class _NoRoom(np.ndarray):
    """A records buffer whose realloc fails (a MemoryError from ``ndarray.resize``)."""

    def resize(self, *a, **k):
        raise MemoryError("no room to grow the records")


def test_a_failed_growth_leaves_records_that_sit_off_the_boundary_where_they_are():
    b = Broker(Pool(gpu=64), clock=ManualClock(0.0), backend="compiled")
    b.register("a", Envelope(credits=1e9, sustained={"gpu": 64}, ceiling={"gpu": 64}))
    st = b.st
    for i in range(10):
        b.acquire(Intent("a", units={"gpu": 1}, duration=60 + i))
    L, n = st.lrow.shape[0], st.nleases
    buf = np.zeros(L * L_WIDTH + 16, dtype=np.int64).view(_NoRoom)
    at = (-(buf.ctypes.data % 64) // 8) % 8 + 1          # one value past the boundary
    buf[at:at + L * L_WIDTH] = st.lrow.ravel()
    st._set_leases(buf, L, at)
    before = np.array(st.lrow)
    del buf
    st.scal[2] = L                          # full: the next growth must resize the records
    with pytest.raises(MemoryError):
        st.grow_leases(1)
    assert st.lrow.shape == (L, L_WIDTH) and np.array_equal(np.array(st.lrow), before)
    assert st.t_end[n - 1] == 69 * 10**9 and np.shares_memory(st.t_end, st.lrow)


def test_a_field_view_cannot_be_resized_apart_from_its_records():
    st = Broker(Pool(gpu=4), clock=ManualClock(0.0), backend="compiled").st
    for name in ("t_end", "T", "left", "fs_S"):
        with pytest.raises(ValueError, match=f"EngineState.{name} is a view"):
            st._resize(name, 10**4, 0)
