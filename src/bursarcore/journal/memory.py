"""In-memory columnar journal: one structured array grown geometrically (the fast path)."""

from __future__ import annotations

import numpy as np

from .base import Journal, RowStore
from .fill import pack_tuples
from .records import FIELDS

_NFIELDS = len(FIELDS)

__all__ = ["MemoryJournal"]


class MemoryJournal(Journal):
    """Records in one array of initial capacity ``chunk`` rows, doubled when full (an
    append is a memory copy, a batch is written in place, ``rows()`` is a view); nothing
    survives the process."""

    def __init__(self, chunk: int = 1 << 16) -> None:
        super().__init__()
        self._rs = RowStore(chunk)
        self._payloads: dict[int, str] = {}
        self._tuples: list[tuple] = []       # single records not yet in the array
        self._reserved: np.ndarray | None = None

    def _store_one(self, record: tuple, payload: str | None, seq: int) -> None:
        self._tuples.append(record)
        if payload is not None:
            self._payloads[seq] = payload
        if len(self._tuples) >= 4096:
            self._settle()

    def add_record(self, record: tuple) -> int:
        """:meth:`Journal.add_record`, onto the records not yet in the array."""
        seq = self.next_seq
        if record[0] != seq or len(record) != _NFIELDS:
            raise ValueError(f"a record must have {_NFIELDS} fields and seq {seq}")
        tuples = self._tuples
        tuples.append(record)
        if len(tuples) >= 4096:
            self._settle()
        self.next_seq = seq + 1
        return seq

    def _settle(self) -> None:
        if self._tuples:
            k = len(self._tuples)
            pack_tuples(self._tuples, self._rs.reserve(k))
            self._tuples = []
            self._rs.advance(k)

    def _store(self, rows: np.ndarray, payloads: dict[int, str]) -> None:
        self._settle()
        self._payloads.update(payloads)
        self._rs.extend(rows)

    def reserve(self, n: int) -> np.ndarray:
        self._settle()
        self._reserved = self._rs.reserve(n)
        return self._reserved

    def append_reserved(self, rows: np.ndarray) -> int:
        if rows is not self._reserved or self._tuples:   # not ours (or out of turn): a copy
            self._reserved = None
            return super().append_reserved(rows.copy())
        self._reserved = None
        first = self.next_seq
        self._rs.advance(rows.shape[0])
        self.next_seq = first + rows.shape[0]
        return first

    def rows(self) -> np.ndarray:
        self._settle()
        return self._rs.view()

    def payloads(self) -> dict[int, str]:
        return self._payloads  # single records' payloads are stored at once
