"""Campaign state as records (``EngineState.cdrow`` / ``crow``), every field a column view.

The compiled engine reads a campaign's fields from its records (``_engine.CdRow`` /
``CRow``); Python code and the reference read and write the same numbers through the field
views (``st.T[c, d]``, ``st.left[c]``). These tests check that the two stay one: growth,
writes through a view, pickles (snapshots) new and old, and a malformed record array.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from bursarcore import Broker, Envelope, Intent, ManualClock, Pool
from bursarcore.admission import state as S
from bursarcore.broker import BACKENDS, ENGINES

BACKENDS = [b for b in sorted(BACKENDS) if b != "reference"]   # the compiled engine's records
FIELDS = S._CD_FIELDS + S._C_FIELDS + S._CF_FIELDS


def _broker(backend, n=40):
    b = Broker(Pool(gpu=8 * n), clock=ManualClock(0.0), backend=backend)
    for i in range(n):       # 40 campaigns: the records grow 16 -> 32 -> 64
        b.register(f"c{i}", Envelope(credits=1_000 + i, service_class="agent-burst",
                                     guaranteed={"gpu": i % 3}, sustained={"gpu": 4},
                                     ceiling={"gpu": 8}, burst={"gpu": 100 + i}))
    return b


def _views_of_records(st):
    for f in S._CD_FIELDS:
        a = getattr(st, f)
        assert a.shape == (st._calloc, st.D) and np.shares_memory(a, st.cdrow), f
    for f in S._C_FIELDS + S._CF_FIELDS:
        a = getattr(st, f)
        assert a.shape == (st._calloc,) and np.shares_memory(a, st.crow), f
    assert st.fs_S.dtype == st.fs_G.dtype == np.float64
    assert st.cdrow.ctypes.data % 64 == 0 and st.crow.ctypes.data % 64 == 0
    assert st.cdrow.shape[2] == S.CD_WIDTH and st.crow.shape[1] == S.C_WIDTH


@pytest.mark.parametrize("backend", BACKENDS)
def test_growth_keeps_every_field_and_its_view(backend):
    b = _broker(backend)
    st = b.st
    _views_of_records(st)
    assert st._calloc == 64 and st.C == 40
    for c in range(40):
        assert st.b[c, 0] == 8 * 10**0 and st.g[c, 0] == c % 3
        assert st.budget[c] == st.left[c] == (1_000 + c) * S.CREDIT
        assert st.Bcap[c, 0] == st.T[c, 0] == (100 + c) * 10**9
    assert not st.cdrow[40:].any() and not st.crow[40:].any()   # records past C are zero


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_write_through_a_view_is_what_the_engine_reads(backend):
    b = _broker(backend)
    b.st.T[7, 0] = 0                 # campaign c7 has no tokens left
    b.st.left[9] = 0                 # and c9 no credits
    # 5 GPUs for 10 s needs 10 GPU-s of tokens (each campaign has >= 100) and some credits
    got = {c: b.acquire(Intent(c, {"gpu": 5}, duration=10.0)) for c in ("c7", "c9", "c8")}
    assert got["c7"].outcome != "granted" and got["c7"].reason == "tokens"
    assert got["c9"].outcome != "granted" and got["c9"].reason == "credits"
    assert got["c8"].outcome == "granted"
    assert b.st.H[8, 0] == 5 and b.st.crow[8, S._C_FIELDS.index("escrow")] > 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_pickles_new_and_old_load_as_records(backend):
    b = _broker(backend)
    for c in range(0, 40, 3):
        b.acquire(Intent(f"c{c}", {"gpu": (1, 6)}, duration=30.0))
    b.clock.advance(5)
    b.poll()
    st = b.st
    new = pickle.loads(pickle.dumps(st))
    d = dict(st.__getstate__())
    assert not set(FIELDS) & set(d)           # only the records are pickled
    old_d = {k: v for k, v in d.items() if k not in ("cdrow", "crow")}
    for f in FIELDS:                          # a snapshot from before: a array per field
        old_d[f] = np.array(getattr(st, f))
    old = S.EngineState.__new__(S.EngineState)
    old.__setstate__(pickle.loads(pickle.dumps(old_d)))    # (no array shared with st)
    for back in (new, old):
        _views_of_records(back)
        assert back.C == st.C and back._calloc == st._calloc
        for f in FIELDS:
            assert np.array_equal(getattr(back, f), getattr(st, f)), f
    # the engine decides on a loaded state as on the original
    k = ENGINES[backend]
    t = 6 * 10**9
    for s2 in (st, new, old):
        s2.grow_leases(1, 8)
    ids = [k.grant(s2, 4, 0, 2, 3, 10**10, 0, t, False, 1) for s2 in (st, new, old)]
    assert ids[0] == ids[1] == ids[2]
    for f in FIELDS:
        assert np.array_equal(getattr(new, f), getattr(st, f)), f
        assert np.array_equal(getattr(old, f), getattr(st, f)), f


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_sibling_lists_are_pickled_and_rebuilt_for_an_old_pickle(backend):
    """The lists a borrower's siblings are read from (SPEC §14.8: ``sib``, kept by
    registration) travel in a pickle, grow with the records, and are rebuilt from ``up``
    for a pickle without them, as registration built them."""
    b = Broker(Pool(gpu=100), clock=ManualClock(0.0), backend=backend)
    for i in range(20):                    # past the first 16 records: the lists grow
        name = f"n{i}" if i < 4 else f"n{0 if i % 3 == 1 else 3}/n{i}"
        b.register(name, Envelope(credits=1e6, guaranteed={"gpu": 1 if i < 4 else 0},
                                  sustained={"gpu": 10}, borrow_limit={"gpu": i % 2}))
    st = b.st
    assert st.sib.shape == (st._calloc + 1, S.SIB_WIDTH) and st._calloc > 16
    d = dict(st.__getstate__())
    assert np.array_equal(pickle.loads(pickle.dumps(st)).sib, st.sib)
    del d["sib"]                              # a snapshot from before the lists were kept
    old = S.EngineState.__new__(S.EngineState)
    old.__setstate__(pickle.loads(pickle.dumps(d)))
    assert np.array_equal(old.sib, st.sib)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_sum_of_guarantees_is_kept_by_registration(backend):
    """``gsum`` (Σ_c g[c, d], what the "never" check of the capacity rule reads as the
    others' guarantees) is kept by registration, not summed by the engine: equal to the
    column sum after every registration, in a pickle, and rebuilt from ``g`` for a pickle
    without it; a request the others' guarantees leave no room for is refused as never."""
    b = Broker(Pool(gpu=10), clock=ManualClock(0.0), backend=backend)
    st = b.st
    for i, g in enumerate((3, 0, 4)):
        b.register(f"c{i}", Envelope(credits=1e6, service_class="interactive",
                                     guaranteed={"gpu": g}, sustained={"gpu": 10},
                                     ceiling={"gpu": 10}, burst={"gpu": 1e6}))
        assert np.array_equal(st.gsum, st.g[:st.C].sum(axis=0))
    assert st.gsum.tolist() == [7]
    d = dict(st.__getstate__())
    assert np.array_equal(pickle.loads(pickle.dumps(st)).gsum, [7])
    del d["gsum"]                             # a snapshot from before gsum was kept
    old = S.EngineState.__new__(S.EngineState)
    old.__setstate__(pickle.loads(pickle.dumps(d)))
    assert old.gsum.tolist() == [7]
    # c1 (no guarantee) may never hold more than 10 - 7 = 3 firm units
    dec = b.acquire(Intent("c1", {"gpu": 4}, duration=10.0))
    assert (dec.outcome, dec.reason) == ("refused", "capacity")
    assert b.acquire(Intent("c1", {"gpu": 3}, duration=10.0)).outcome == "granted"


@pytest.mark.skipif("compiled" not in ENGINES, reason="compiled engine not built")
def test_a_malformed_record_array_is_refused_by_name():
    b = _broker("compiled", 4)
    st = b.st
    st.cdrow = np.zeros((st._calloc, st.D, S.CD_WIDTH - 1), dtype=np.int64)
    with pytest.raises(ValueError, match=r"EngineState\.cdrow has shape"):
        b.acquire(Intent("c0", {"gpu": 1}, duration=1.0))
    st.cdrow = np.zeros((st._calloc, st.D, S.CD_WIDTH), dtype=np.int32)
    with pytest.raises(TypeError, match=r"EngineState\.cdrow must be"):
        b.acquire(Intent("c0", {"gpu": 1}, duration=1.0))


@pytest.mark.skipif("compiled" not in ENGINES, reason="compiled engine not built")
def test_a_build_with_other_records_does_not_import():
    """A stale build (its record structs ordered otherwise than admission.state) refuses to
    import, so the broker falls back to the reference instead of misreading the records."""
    import subprocess
    import sys
    code = ("from bursarcore.admission import state\n"
            "state._L_FIELDS = state._L_FIELDS[1:] + state._L_FIELDS[:1]\n"
            "try:\n    import bursarcore._engine\nexcept ImportError as e:\n"
            "    print('refused:', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.startswith("refused:") and "records differ" in out


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_loaded_state_keeps_the_descendants_firm_holding(backend):
    """SPEC §14.8: a node's idle guarantee is measured against its own firm holding and its
    descendants' (``bor[c, d, BOR_FSUB]``, which the core keeps on every firm grant and end
    below the node). A loaded state has it from the holdings, whatever the pickle held: a
    leaf's is 0, a parent's the sum of its descendants' firm units."""
    b = Broker(Pool(gpu=64), clock=ManualClock(0.0), backend=backend)
    env = lambda g: Envelope(credits=float("inf"), service_class="agent-burst",  # noqa: E731
                             guaranteed={"gpu": g}, sustained={"gpu": 16}, ceiling={"gpu": 32},
                             burst={"gpu": float("inf")})
    b.register("p", env(12))
    b.register("p/a", env(4))
    b.register("p/a/x", env(2))
    b.register("p/b", env(4))
    for name, n in (("p/a/x", 3), ("p/a", 2), ("p/b", 1), ("p", 1)):
        b.acquire(Intent(name, {"gpu": n}, duration=30.0))
    st, ix = b.st, b.campaign_index
    want = {"p": 6, "p/a": 3, "p/a/x": 0, "p/b": 0}
    assert {n: int(st.bor[ix(n), 0, S.BOR_FSUB]) for n in want} == want
    d = dict(st.__getstate__())
    d["bor"] = np.array(d["bor"])
    d["bor"][:, :, S.BOR_FSUB] = 99                   # whatever a pickle kept
    back = S.EngineState.__new__(S.EngineState)
    back.__setstate__(pickle.loads(pickle.dumps(d)))
    assert {n: int(back.bor[ix(n), 0, S.BOR_FSUB]) for n in want} == want
