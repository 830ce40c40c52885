"""Bulk record writing for the journal's fast paths, with one pure-Python specification
and a compiled twin (``bursarcore._journalfill``) that must produce the same bytes.

:func:`fill_acquire` writes the ``acquire`` records of a batch's items (the ones the
compiled admission loop decided) straight from the loop's per-item outputs — the rule
inputs and state after in ``rec`` (``REC_WIDTH`` columns: tokens, credits, free,
unmet, the rules' limits in their order, then tokens, credits and held after, and the level
whose rule bound the decision with its figure) — into rows a sink handed
out with :meth:`~bursarcore.journal.Journal.reserve`. Each record equals, field for
field, what the single path (``Broker._acquire_ns``, which replay uses) writes.

:func:`crc32_rows` is ``zlib.crc32`` of each record (the SQLite sink's per-record check).

:func:`as_tuple` and :func:`pack_tuples` are the single-record path: a record given as a
dict of its non-default fields becomes a tuple at once (so later changes to the dict do not
reach the journal), and buffered tuples become rows in bulk.
"""

from __future__ import annotations

import zlib

import numpy as np

from .. import _backend
from .records import DEFAULTS, FIELDS, LIMIT_FIELDS, OP, RECORD_DTYPE, RECORD_FIELDS
from .records import as_tuple as reference_as_tuple

__all__ = ["fill_acquire", "crc32_rows", "as_tuple", "pack_tuples", "reference_fill_acquire",
           "reference_crc32_rows", "reference_as_tuple", "reference_pack_tuples", "BACKEND",
           "REC_WIDTH"]

_REC_FIELDS = ("tokens_before", "credits_before", "free", "unmet", *LIMIT_FIELDS,
               "tokens_after", "credits_after", "held_after", "level", "level_figure")
REC_WIDTH = len(_REC_FIELDS)
_I64 = np.int64


def reference_fill_acquire(rows: np.ndarray, seq0: int, j0: int, t: int, d: int, ttl: int,
                           iid0: int, ci, ks, nmin, nmax, dur, out_n, out_r, out_l, rec,
                           rank, deficit, cost) -> None:
    """Write items ``j0 .. j0+len(rows)`` of a batch into ``rows`` (every field; seqs from
    ``seq0``). ``rank`` is each class's rank, ``deficit`` each campaign's last fair-share
    deficit, ``cost`` each lease row's cost (a lease id's row is ``id & 0xFFFFFFFF``:
    admission.state.ROW_BITS); an item with ``out_l < 0`` was refused."""
    m = rows.shape[0]
    sl = slice(j0, j0 + m)
    if j0 < 0 or j0 + m > len(ci) or j0 + m > rec.shape[0]:
        raise IndexError("fill_acquire: batch slice out of range")
    c, k, lid = np.asarray(ci[sl]), np.asarray(ks[sl]), np.asarray(out_l[sl])
    if m and (c.min() < 0 or c.max() >= len(deficit) or k.min() < 0 or k.max() >= len(rank)
              or (np.maximum(lid, 0) & 0xFFFFFFFF).max() >= len(cost)):
        raise IndexError("fill_acquire: an item indexes out of range")
    granted = lid >= 0
    rows["seq"] = np.arange(seq0, seq0 + m)
    rows["t"], rows["op"], rows["dim"] = t, OP["acquire"], d
    rows["outcome"] = np.where(granted, 1, 3)
    rows["reason"] = np.where(granted, 0, out_r[sl])
    rows["path"] = granted
    rows["rank"] = np.asarray(rank)[k]
    rows["batch"] = 2
    if j0 == 0 and m:
        rows["batch"][0] = 1
    rows["cls"], rows["campaign"] = k, c
    rows["nmin"], rows["nmax"], rows["dur"] = nmin[sl], nmax[sl], dur[sl]
    rows["max_spend"], rows["deadline"], rows["ttl"] = -1, -1, ttl
    rows["units"] = np.where(granted, out_n[sl], 0)
    rows["lease"] = lid
    rows["intent"] = iid0 + np.arange(j0, j0 + m)
    rows["cost"] = np.where(granted, np.asarray(cost)[np.maximum(lid, 0) & 0xFFFFFFFF], 0)
    rows["deficit"] = np.asarray(deficit)[c]
    for i, f in enumerate(_REC_FIELDS):
        rows[f] = rec[sl, i]


def reference_crc32_rows(raw, itemsize: int) -> np.ndarray:
    """``zlib.crc32`` of each ``itemsize``-byte record of ``raw`` (uint32)."""
    mv = memoryview(raw).cast("B")
    if itemsize <= 0 or mv.nbytes % itemsize:
        raise ValueError("crc32_rows: length is not a whole number of records")
    return np.array([zlib.crc32(mv[i:i + itemsize]) for i in range(0, mv.nbytes, itemsize)],
                    dtype=np.uint32)


def reference_pack_tuples(tuples: list[tuple], out: np.ndarray) -> None:
    """Single records (tuples in field order, :func:`as_tuple`) into the rows ``out``."""
    out[...] = np.array(tuples, dtype=RECORD_DTYPE)


def _layout_matches(ext) -> bool:
    size, off = ext.layout()
    return (size == RECORD_DTYPE.itemsize and set(off) == set(FIELDS)
            and all(RECORD_FIELDS[f][1] == o for f, o in off.items()))


_ext = _backend.compiled("_journalfill")
if _ext is not None and not _layout_matches(_ext):  # a stale build of an older record layout
    _ext = None
if _ext is not None:
    _KINDS = {"i8": 0, "i4": 1, "i2": 2, "i1": 3, "f8": 4}
    _ext.setup(FIELDS, [DEFAULTS[f] for f in FIELDS],
               [_KINDS[RECORD_FIELDS[f][0].str[1:]] for f in FIELDS],
               [RECORD_FIELDS[f][1] for f in FIELDS])
BACKEND = "compiled" if _ext is not None else "reference"


def _c64(a) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=_I64)


if _ext is not None:
    _cfill, _ccrc = _ext.fill_acquire, _ext.crc32_rows

    def fill_acquire(rows: np.ndarray, seq0: int, j0: int, t: int, d: int, ttl: int,
                     iid0: int, ci, ks, nmin, nmax, dur, out_n, out_r, out_l, rec,
                     rank, deficit, cost) -> None:
        if rows.dtype != RECORD_DTYPE or not rows.flags.c_contiguous or rows.ndim != 1:
            raise ValueError("fill_acquire: rows must be a contiguous RECORD_DTYPE array")
        _cfill(rows.view(np.uint8), seq0, j0, t, d, ttl, iid0, _c64(ci), _c64(ks), _c64(nmin),
               _c64(nmax), _c64(dur), _c64(out_n), _c64(out_r), _c64(out_l), _c64(rec),
               np.asarray(rank, dtype=_I64), np.ascontiguousarray(deficit, dtype=np.float64),
               np.asarray(cost, dtype=_I64))    # (a column of the lease records: strided)

    def crc32_rows(raw, itemsize: int) -> np.ndarray:
        return _ccrc(memoryview(raw).cast("B"), itemsize)

    as_tuple = _ext.as_tuple
    _cpack = _ext.pack_tuples

    def pack_tuples(tuples: list[tuple], out: np.ndarray) -> None:
        if (out.dtype != RECORD_DTYPE or not out.flags.c_contiguous or out.ndim != 1
                or out.shape[0] != len(tuples)):
            raise ValueError("pack_tuples: out must be len(tuples) contiguous RECORD_DTYPE rows")
        if not _cpack(tuples, out.view(np.uint8), RECORD_DTYPE.itemsize):
            reference_pack_tuples(tuples, out)   # a value numpy has to interpret
else:
    fill_acquire = reference_fill_acquire
    crc32_rows = reference_crc32_rows
    as_tuple = reference_as_tuple
    pack_tuples = reference_pack_tuples

fill_acquire.__doc__ = reference_fill_acquire.__doc__
crc32_rows.__doc__ = reference_crc32_rows.__doc__
pack_tuples.__doc__ = reference_pack_tuples.__doc__
