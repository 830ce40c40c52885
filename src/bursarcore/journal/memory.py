"""In-memory columnar journal: numpy structured arrays grown in chunks (the fast path)."""

from __future__ import annotations

import numpy as np

from .base import Journal
from .records import RECORD_DTYPE

__all__ = ["MemoryJournal"]


class MemoryJournal(Journal):
    """Records in chunks of ``chunk`` rows; nothing survives the process."""

    def __init__(self, chunk: int = 1 << 16) -> None:
        super().__init__()
        self._chunk = chunk
        self._chunks: list[np.ndarray] = []
        self._fill = 0                      # rows used in the last chunk
        self._payloads: dict[int, str] = {}
        self._cache: np.ndarray | None = None
        self._tuples: list[tuple] = []       # single records not yet in a chunk

    def _store_one(self, record: tuple, payload: str | None, seq: int) -> None:
        self._tuples.append(record)
        if payload is not None:
            self._payloads[seq] = payload
        self._cache = None
        if len(self._tuples) >= 4096:
            self._settle()

    def _settle(self) -> None:
        if self._tuples:
            rows = np.array(self._tuples, dtype=RECORD_DTYPE)
            self._tuples = []
            self._store_rows(rows)

    def _store(self, rows: np.ndarray, payloads: dict[int, str]) -> None:
        self._settle()
        self._payloads.update(payloads)
        self._store_rows(rows)

    def _store_rows(self, rows: np.ndarray) -> None:
        self._cache = None
        i, n = 0, rows.shape[0]
        while i < n:
            if not self._chunks or self._fill == self._chunks[-1].shape[0]:
                self._chunks.append(np.empty(max(self._chunk, n - i), dtype=RECORD_DTYPE))
                self._fill = 0
            last = self._chunks[-1]
            k = min(n - i, last.shape[0] - self._fill)
            last[self._fill:self._fill + k] = rows[i:i + k]
            self._fill += k
            i += k

    def rows(self) -> np.ndarray:
        self._settle()
        if self._cache is None:
            if not self._chunks:
                self._cache = np.empty(0, dtype=RECORD_DTYPE)
            else:
                parts = self._chunks[:-1] + [self._chunks[-1][: self._fill]]
                self._cache = np.concatenate(parts)
        return self._cache

    def payloads(self) -> dict[int, str]:
        return self._payloads  # single records' payloads are stored at once
