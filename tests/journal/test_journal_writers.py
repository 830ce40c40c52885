"""The journal's fast paths (journal/fill.py, ``_journalfill``, the growable row store and
the SQLite page rows) against their specifications: the compiled record writer and CRC
against the pure-Python reference byte for byte, a batch's records against the single
path's, and the SQLite pages' corruption checks naming the damaged record."""

from __future__ import annotations

import math
import sqlite3
import zlib

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bursarcore import Broker, Envelope, Intent, ManualClock, Pool, _backend
from bursarcore.broker import BACKENDS
from bursarcore.errors import JournalCorrupt
from bursarcore.journal import MemoryJournal, SQLiteJournal, fill
from bursarcore.journal import sqlite as jsqlite
from bursarcore.journal.base import crc
from bursarcore.journal.records import RECORD_DTYPE, new_rows

ext = _backend.compiled("_journalfill")
needs_ext = pytest.mark.skipif(ext is None, reason="compiled _journalfill not built "
                               "(BURSARCORE_NO_EXTENSIONS=1)")
I64 = st.integers(-(2**63), 2**63 - 1)


# ------------------------------------------------------------------ compiled vs reference
@needs_ext
def test_compiled_record_layout_is_record_dtype():
    size, off = ext.layout()
    assert size == RECORD_DTYPE.itemsize
    assert off == {f: RECORD_DTYPE.fields[f][1] for f in RECORD_DTYPE.names}
    assert fill.BACKEND == "compiled"


W = fill.REC_WIDTH      # the loop's per-item record: rule inputs, state after, level


@st.composite
def batches(draw):
    n = draw(st.integers(1, 40))
    j0 = draw(st.integers(0, n - 1))
    m = draw(st.integers(0, n - j0))
    C, K, L = draw(st.integers(1, 6)), draw(st.integers(1, 4)), draw(st.integers(1, 30))
    col = lambda elems: np.array(draw(st.lists(elems, min_size=n, max_size=n)), dtype=np.int64)
    return dict(
        seq0=draw(st.integers(0, 2**40)), j0=j0, m=m, t=draw(st.integers(0, 2**62)),
        d=draw(st.integers(0, 7)), ttl=draw(st.integers(-1, 2**50)),
        iid0=draw(st.integers(0, 2**40)),
        ci=col(st.integers(0, C - 1)), ks=col(st.integers(0, K - 1)),
        nmin=col(I64), nmax=col(I64), dur=col(I64), out_n=col(I64),
        out_r=col(st.integers(-200, 200)),             # wraps into int8 the same way
        out_l=col(st.integers(-1, L - 1)),
        rec=np.array(draw(st.lists(st.lists(I64, min_size=W, max_size=W),
                                   min_size=n, max_size=n)), dtype=np.int64).reshape(n, W),
        rank=np.array(draw(st.lists(st.integers(-300, 300), min_size=K, max_size=K))),
        deficit=np.array(draw(st.lists(st.floats(allow_nan=True), min_size=C, max_size=C))),
        cost=np.array(draw(st.lists(I64, min_size=L, max_size=L)), dtype=np.int64),
    )


def _fill(fn, b, strided_rank=False):
    rows = np.empty(b["m"], dtype=RECORD_DTYPE)
    rows.view(np.uint8)[:] = 0xA5  # reserve() hands out uninitialised rows
    rank = b["rank"]
    if strided_rank:  # the broker passes a column of the class table
        tbl = np.zeros((rank.shape[0], 3), dtype=np.int64)
        tbl[:, 0] = rank
        rank = tbl[:, 0]
    fn(rows, b["seq0"], b["j0"], b["t"], b["d"], b["ttl"], b["iid0"], b["ci"], b["ks"],
       b["nmin"], b["nmax"], b["dur"], b["out_n"], b["out_r"], b["out_l"], b["rec"], rank,
       b["deficit"], b["cost"])
    return rows


@needs_ext
@given(b=batches(), strided=st.booleans())
def test_fill_acquire_compiled_equals_reference(b, strided):
    ref = _fill(fill.reference_fill_acquire, b)
    assert _fill(fill.fill_acquire, b, strided).tobytes() == ref.tobytes()


@given(b=batches())
def test_fill_acquire_reference_is_the_single_path_record(b):
    """Every field set, as the broker's single path would: granted items carry units,
    lease and cost; refused ones the reason; the rule inputs come from ``rec``."""
    rows = _fill(fill.reference_fill_acquire, b)
    for i, r in enumerate(rows):
        j = b["j0"] + i
        lid = int(b["out_l"][j])
        assert r["seq"] == b["seq0"] + i and r["intent"] == b["iid0"] + j
        assert r["op"] == 2 and r["batch"] == (1 if j == 0 else 2)
        assert r["max_spend"] == -1 and r["deadline"] == -1 and r["lease"] == lid
        if lid >= 0:
            assert (r["outcome"], r["reason"], r["path"]) == (1, 0, 1)
            assert r["units"] == b["out_n"][j] and r["cost"] == b["cost"][lid]
        else:
            assert (r["outcome"], r["path"], r["units"], r["cost"]) == (3, 0, 0, 0)
        assert [int(r[f]) for f in fill._REC_FIELDS] == b["rec"][j].tolist()
        dv = b["deficit"][b["ci"][j]]
        assert (math.isnan(r["deficit"]) and math.isnan(dv)) or r["deficit"] == dv


def test_fill_acquire_refuses_out_of_range_items():
    b = dict(seq0=0, j0=0, m=2, t=0, d=0, ttl=0, iid0=0, ci=np.array([0, 5]),
             ks=np.zeros(2, np.int64), nmin=np.ones(2, np.int64), nmax=np.ones(2, np.int64),
             dur=np.ones(2, np.int64), out_n=np.ones(2, np.int64), out_r=np.zeros(2, np.int64),
             out_l=np.array([0, -1]), rec=np.zeros((2, W), np.int64), rank=np.zeros(1, np.int64),
             deficit=np.zeros(2), cost=np.zeros(1, np.int64))
    for fn in {fill.fill_acquire, fill.reference_fill_acquire}:
        with pytest.raises(IndexError):
            _fill(fn, b)


@given(data=st.binary(max_size=2000), size=st.integers(1, 300))
def test_crc32_rows_is_zlib_per_record(data, size):
    data = data[: len(data) - len(data) % size]
    want = [zlib.crc32(data[i:i + size]) for i in range(0, len(data), size)]
    assert fill.reference_crc32_rows(data, size).tolist() == want
    assert fill.crc32_rows(data, size).tolist() == want
    if size > 1:
        with pytest.raises(ValueError):
            fill.crc32_rows(data + b"x", size)


# ------------------------------------------------------------------ broker: batch = singles
def _broker(backend, journal):
    b = Broker(Pool(gpu=96), clock=ManualClock(0.0), backend=backend, journal=journal)
    b.register("a", Envelope(credits=50, sustained={"gpu": 8}, ceiling={"gpu": 24},
                             burst={"gpu": 400}))
    b.register("g", Envelope(credits=math.inf, service_class="interactive",
                             guaranteed={"gpu": 8}, sustained={"gpu": 8}, ceiling={"gpu": 16}))
    b.register("o", Envelope(credits=math.inf, service_class="opportunistic",
                             sustained={"gpu": 64}, ceiling={"gpu": 64}, burst={"gpu": math.inf}))
    return b


def _drive(b, rng):
    for _ in range(25):
        n = int(rng.integers(1, 40))
        units = np.stack([rng.integers(1, 4, n), rng.integers(4, 20, n)], axis=1)
        b.admit_batch(rng.integers(0, 3, n), units, float(rng.choice([1.0, 30.0, 300.0])))
        if rng.random() < 0.3 and b.leases():
            b.release(b.leases()[0].id)
        b.clock.advance(float(rng.choice([0.0, 0.5, 5.0])))


@pytest.mark.parametrize("backend", BACKENDS)
def test_batch_records_equal_across_fill_backends_and_replay(backend, monkeypatch):
    journals = []
    for fn in (fill.fill_acquire, fill.reference_fill_acquire):
        monkeypatch.setattr(fill, "fill_acquire", fn)
        j = MemoryJournal(chunk=8)  # grows many times on the way
        _drive(_broker(backend, j), np.random.default_rng(3))
        journals.append(j)
    assert journals[0].rows().tobytes() == journals[1].rows().tobytes()
    # replay runs every acquire through the single path and checks it field for field
    Broker.replay(journals[0], backend=backend, resume=False)


# ------------------------------------------------------------------ memory sink
def test_memory_reserve_in_place_and_growth():
    j = MemoryJournal(chunk=4)
    j.add({"op": 0, "t": 0}, "{}")
    before = j.rows()
    for k in (3, 10, 1, 40):
        rows = j.reserve(k)
        rows[:] = new_rows(k)
        rows["seq"] = np.arange(j.next_seq, j.next_seq + k)
        rows["op"], rows["t"] = 12, j.next_seq
        assert j.append_reserved(rows) == j.next_seq - k
    assert j.rows()["seq"].tolist() == list(range(len(j))) and len(j) == 55
    assert before["seq"].tolist() == [0]  # an earlier view stays valid after growth
    foreign = new_rows(2)                 # rows that are not the reserved block: copied
    foreign["seq"], foreign["op"] = [55, 56], 12
    j.reserve(2)
    assert j.append_reserved(foreign) == 55 and j.rows()["seq"][-2:].tolist() == [55, 56]


# ------------------------------------------------------------------ SQLite pages
def _page_journal(tmp_path, backend=BACKENDS[0]):
    path = tmp_path / "p.db"
    j = SQLiteJournal(path, batch=10**6, create=True)
    b = _broker(backend, j)
    b.admit_batch(np.arange(30) % 2 * 2, np.full(30, 1), 10.0)  # 30 records: one page
    b.sync()
    b.acquire(Intent("a", units={"gpu": 1}, duration=5))         # one record: a row
    b.sync()
    j.close()
    return path, j.rows().copy()


def test_sqlite_pages_round_trip(tmp_path):
    path, rows = _page_journal(tmp_path)
    db = sqlite3.connect(path)
    kinds = db.execute("SELECT seq, op, typeof(crc), length(rec) FROM journal ORDER BY seq").fetchall()
    db.close()
    # the config and registers carry payloads: rows of their own; the batch is one page
    assert [k[1] for k in kinds[:4]] == [0, 1, 1, 1]
    page = [k for k in kinds if k[1] == -1]
    assert len(page) == 1 and page[0][2] == "blob" and page[0][3] == 30 * RECORD_DTYPE.itemsize
    assert kinds[-1][1:3] == (2, "integer")  # the single acquire: a row of its own
    back = SQLiteJournal(path)
    assert back.rows().tobytes() == rows.tobytes() and back.durable_seq == len(rows) - 1
    assert back.names == ["a", "g", "o"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_sqlite_journal_reopens_and_replays_after_batches(backend, tmp_path):
    j = SQLiteJournal(tmp_path / "r.db", batch=64, create=True)
    b = _broker(backend, j)
    _drive(b, np.random.default_rng(8))
    b.sync()
    j.close()
    again = SQLiteJournal(tmp_path / "r.db")
    assert again.rows().tobytes() == j.rows().tobytes()
    r = Broker.replay(again, backend=backend, resume=False)
    r.clock.set(b.clock.now())
    assert r.state() == b.state()


def _tamper(path, sql, *args):
    db = sqlite3.connect(path)
    db.execute(sql, args)
    db.commit()
    db.close()


def test_sqlite_page_corruption_names_the_record(tmp_path):
    path, rows = _page_journal(tmp_path)
    size = RECORD_DTYPE.itemsize
    db = sqlite3.connect(path)
    last, rec, c = db.execute("SELECT seq, rec, crc FROM journal WHERE op = -1").fetchone()
    db.close()
    first = last - len(c) // 4 + 1
    # one altered byte in the page's 8th record
    bad = bytearray(rec)
    bad[7 * size + 40] ^= 1
    _tamper(path, "UPDATE journal SET rec = ? WHERE seq = ?", bytes(bad), last)
    with pytest.raises(JournalCorrupt) as e:
        SQLiteJournal(path)
    assert e.value.record == first + 7 and "checksum" in str(e.value)
    # a torn page: cut in the middle of its 12th record
    _tamper(path, "UPDATE journal SET rec = ? WHERE seq = ?", rec[: 11 * size + 100], last)
    with pytest.raises(JournalCorrupt) as e:
        SQLiteJournal(path)
    assert e.value.record == first + 11 and "truncated" in str(e.value)
    # an altered checksum
    cc = bytearray(c)
    cc[4 * 3] ^= 0xFF
    _tamper(path, "UPDATE journal SET rec = ?, crc = ? WHERE seq = ?", rec, bytes(cc), last)
    with pytest.raises(JournalCorrupt) as e:
        SQLiteJournal(path)
    assert e.value.record == first + 3
    # a checksum that is no CRC at all
    _tamper(path, "UPDATE journal SET crc = ? WHERE seq = ?", b"xyz", last)
    with pytest.raises(JournalCorrupt) as e:
        SQLiteJournal(path)
    assert e.value.record == first     # the first record it leaves unverified
    # a page whose seq was moved: its records are out of sequence
    _tamper(path, "UPDATE journal SET crc = ?, seq = ? WHERE seq = ?", c, last + 1000, last)
    with pytest.raises(JournalCorrupt) as e:
        SQLiteJournal(path)
    assert "sequence" in str(e.value)
    _tamper(path, "UPDATE journal SET seq = ? WHERE seq = ?", last, last + 1000)
    assert SQLiteJournal(path).rows().tobytes() == rows.tobytes()
    # a missing page: the record after it is out of sequence
    _tamper(path, "DELETE FROM journal WHERE seq = ?", last)
    with pytest.raises(JournalCorrupt) as e:
        SQLiteJournal(path)
    assert e.value.record == last + 1 and "sequence" in str(e.value)


def test_sqlite_reads_one_row_per_record_files(tmp_path):
    """Files written before pages (one row per record, integer CRC) still open."""
    path, rows = _page_journal(tmp_path)
    old = tmp_path / "old.db"
    src, dst = sqlite3.connect(path), sqlite3.connect(old)
    dst.executescript(jsqlite._SCHEMA)
    pl = dict(src.execute("SELECT seq, payload FROM journal WHERE payload IS NOT NULL"))
    for r in rows:
        s = int(r["seq"])
        dst.execute("INSERT INTO journal VALUES (?,?,?,?,?,?,?,?,?)",
                    (s, int(r["t"]), int(r["op"]), int(r["campaign"]), int(r["outcome"]),
                     int(r["reason"]), r.tobytes(), pl.get(s), crc(r.tobytes(), pl.get(s))))
    dst.commit()
    src.close()
    dst.close()
    assert SQLiteJournal(old).rows().tobytes() == rows.tobytes()


def test_sqlite_pages_are_bounded_and_split_at_payloads(tmp_path, monkeypatch):
    monkeypatch.setattr(jsqlite, "PAGE_RECORDS", 4)
    j = SQLiteJournal(tmp_path / "s.db", batch=10**6, create=True)
    rows = new_rows(11)
    rows["op"] = 12
    pl = {5: '{"x": 1}'}
    j.append(rows, pl)
    j.flush()
    shape = [(s, op, n) for s, op, n in j._db.execute(
        "SELECT seq, op, length(rec) / ? FROM journal ORDER BY seq", (RECORD_DTYPE.itemsize,))]
    assert shape == [(3, -1, 4), (4, 12, 1), (5, 12, 1), (9, -1, 4), (10, 12, 1)]
    j.close()
    back = SQLiteJournal(tmp_path / "s.db")
    assert back.rows().tobytes() == j.rows().tobytes() and back.payloads() == pl


# ------------------------------------------------------------------ single records
from bursarcore.journal.records import DEFAULTS, FIELDS  # noqa: E402

_KIND = {f: RECORD_DTYPE.fields[f][0].str[1:] for f in FIELDS}
_RANGE = {"i1": 2**7, "i2": 2**15, "i4": 2**31, "i8": 2**63}


@st.composite
def field_values(draw, wild=False):
    """A dict of some fields: in-range numbers of the kinds the broker writes (Python and
    numpy ints and floats, bools) and, when ``wild``, out-of-range ints too."""
    out = {}
    for f in draw(st.lists(st.sampled_from(FIELDS), unique=True)):
        k = _KIND[f]
        if k == "f8":
            v = draw(st.one_of(st.floats(allow_nan=True), st.integers(-(2**53), 2**53),
                               st.floats(width=32).map(np.float32),
                               st.floats().map(np.float64)))
        else:
            r = _RANGE[k]
            ints = st.integers(-r, r - 1)
            v = draw(st.one_of(ints, ints.map(np.int64) if k != "i8" else ints.map(int),
                               st.booleans()))
            if wild and draw(st.booleans()):
                v = draw(st.integers(r, 2**64))
        out[f] = v
    return out


@given(recs=st.lists(field_values(), max_size=20))
def test_as_tuple_and_pack_tuples_equal_the_reference(recs):
    tuples = [fill.as_tuple(dict(r)) for r in recs]
    assert tuples == [fill.reference_as_tuple(dict(r)) for r in recs]
    assert all(len(t) == len(FIELDS) for t in tuples)
    mine, ref = np.empty(len(tuples), RECORD_DTYPE), np.empty(len(tuples), RECORD_DTYPE)
    fill.pack_tuples(tuples, mine)
    fill.reference_pack_tuples(tuples, ref)
    assert mine.tobytes() == ref.tobytes()


@given(recs=st.lists(field_values(wild=True), min_size=1, max_size=5))
def test_pack_tuples_leaves_odd_values_to_numpy(recs):
    """A value out of its field's range: the compiled path hands the batch to numpy, so
    both raise, or both store the same bytes."""
    tuples = [fill.reference_as_tuple(dict(r)) for r in recs]
    results = []
    for fn in (fill.pack_tuples, fill.reference_pack_tuples):
        out = np.zeros(len(tuples), RECORD_DTYPE)
        try:
            fn(tuples, out)
            results.append(out.tobytes())
        except (OverflowError, ValueError, TypeError) as e:
            results.append(type(e))
    assert results[0] == results[1]


def test_as_tuple_defaults_and_ignores_other_keys():
    t = fill.as_tuple({"op": 2, "nosuchfield": 5})
    assert t == tuple(DEFAULTS[f] if f != "op" else 2 for f in FIELDS)
