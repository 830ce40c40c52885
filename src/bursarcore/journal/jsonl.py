"""JSON lines export and import: one record per line, exact integers, with a CRC."""

from __future__ import annotations

import json
import os

import numpy as np

from ..errors import JournalCorrupt
from .base import Journal, check_rows, crc
from .memory import MemoryJournal
from .records import LEVEL_FIELDS, RECORD_DTYPE, RECORD_DTYPE_UNLEVELLED, from_dict, to_dict

__all__ = ["export_jsonl", "import_jsonl"]


def export_jsonl(journal: Journal, path: str | os.PathLike) -> int:
    """Write every record of ``journal`` to ``path``; returns the count."""
    rows = journal.rows()
    pl = journal.payloads()
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            d = to_dict(r, pl.get(int(r["seq"])))
            d["crc"] = crc(r.tobytes(), pl.get(int(r["seq"])))
            f.write(json.dumps(d, sort_keys=True, allow_nan=False) + "\n")
    return rows.shape[0]


def import_jsonl(path: str | os.PathLike) -> MemoryJournal:
    """Read a JSON lines journal into memory; a truncated or altered line raises
    :class:`JournalCorrupt` naming its record (the seq it holds, or for a line too damaged
    to say, the seq that should come next) and its line, and nothing is returned."""
    rows: list[np.ndarray] = []
    payloads: dict[int, str] = {}
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            expect = len(rows)             # the record this line should hold
            if not line.endswith("\n"):
                raise JournalCorrupt(expect, f"line {lineno} is truncated (no end of line)")
            try:
                d = json.loads(line)
                row, payload = from_dict(d)
            except (ValueError, KeyError, TypeError, OverflowError, AttributeError) as e:
                raise JournalCorrupt(expect, f"line {lineno} is unreadable: {e}") from None
            seq = int(row["seq"][0])
            raw = row.tobytes()
            if not any(f in d for f in LEVEL_FIELDS):    # written before records named a
                raw = raw[:RECORD_DTYPE_UNLEVELLED.itemsize]   # level: checked as written
            if crc(raw, payload) != d.get("crc"):
                raise JournalCorrupt(seq, f"line {lineno}: checksum mismatch")
            rows.append(row)
            if payload is not None:
                payloads[len(rows) - 1] = payload
    allrows = np.concatenate(rows) if rows else np.empty(0, RECORD_DTYPE)
    check_rows(allrows)
    j = MemoryJournal()
    j.append(allrows, payloads)
    return j
