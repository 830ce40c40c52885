"""The sink interface every journal implements (limits' storage habit: one interface,
several backends)."""

from __future__ import annotations

import json
import zlib
from collections import Counter
from typing import Iterator

import numpy as np

from ..errors import InvalidArgument, JournalCorrupt
from .fill import as_tuple, pack_tuples
from .records import FIELDS, OP, OPS, OUTCOMES, RECORD_DTYPE, to_dict

__all__ = ["Journal", "RowStore", "check_rows", "crc"]

from .records import REASONS as _REASONS


def crc(row_bytes: bytes, payload: str | None) -> int:
    return zlib.crc32(row_bytes + (payload or "").encode())


def check_rows(rows: np.ndarray, first_seq: int = 0) -> None:
    """Raise :class:`JournalCorrupt` naming the first record that is out of sequence or
    holds impossible values."""
    if rows.size == 0:
        return
    seq = rows["seq"]
    expect = np.arange(first_seq, first_seq + rows.size)
    bad = np.flatnonzero(seq != expect)
    if bad.size:
        k = int(bad[0])
        raise JournalCorrupt(int(seq[k]), f"out of sequence: expected seq {int(expect[k])}")
    for name, hi in (("op", len(OPS)), ("outcome", len(OUTCOMES)), ("reason", len(_REASONS))):
        col = rows[name]
        bad = np.flatnonzero((col < 0) | (col >= hi))
        if bad.size:
            k = int(bad[0])
            raise JournalCorrupt(int(seq[k]), f"{name} code {int(col[k])} is not valid")
    t = rows["t"]
    bad = np.flatnonzero(t[1:] < t[:-1])
    if bad.size:
        k = int(bad[0]) + 1
        raise JournalCorrupt(int(seq[k]), "time runs backwards")


def _as_bytes(rows: np.ndarray) -> np.ndarray:
    """The bytes of contiguous RECORD_DTYPE rows as a flat uint8 view (copied as memory:
    a structured assignment walks every field one by one, some 20x slower)."""
    if rows.dtype != RECORD_DTYPE:
        rows = rows.astype(RECORD_DTYPE)
    return np.ascontiguousarray(rows).view(np.uint8)


class RowStore:
    """One growable array of records (capacity doubles), so ``view()`` of everything
    stored is O(1) and appends are a memory copy; ``reserve`` hands out rows to fill in
    place before ``advance`` publishes them."""

    __slots__ = ("a", "n")

    def __init__(self, capacity: int = 1024, rows: np.ndarray | None = None) -> None:
        self.a = rows if rows is not None else np.empty(max(capacity, 1), dtype=RECORD_DTYPE)
        self.n = 0 if rows is None else rows.shape[0]

    def reserve(self, k: int) -> np.ndarray:
        n = self.n
        if n + k > self.a.shape[0]:
            bigger = np.empty(max(2 * self.a.shape[0], n + k, 1024), dtype=RECORD_DTYPE)
            bigger.view(np.uint8)[: n * RECORD_DTYPE.itemsize] = self.a[:n].view(np.uint8)
            self.a = bigger
        return self.a[n: n + k]

    def advance(self, k: int) -> None:
        self.n += k

    def extend(self, rows: np.ndarray) -> None:
        k = rows.shape[0]
        self.reserve(k).view(np.uint8)[...] = _as_bytes(rows)
        self.n += k

    def view(self) -> np.ndarray:
        return self.a[: self.n]


class Journal:
    """Append-only decision records. Subclasses store them; this class queries them.

    ``append(rows, payloads)`` assigns sequence numbers and returns the first one;
    ``flush()`` makes everything appended durable (where the sink can) and returns the
    highest durable seq; ``durable_seq`` is -1 until something is durable.
    """

    durable = False

    def __init__(self) -> None:
        self.next_seq = 0
        self.durable_seq = -1
        self.names: list[str] = []     # campaign names, in registration order
        self._scratch: np.ndarray | None = None

    # -- to implement ----------------------------------------------------------------
    def _store(self, rows: np.ndarray, payloads: dict[int, str]) -> None:
        raise NotImplementedError

    def rows(self) -> np.ndarray:
        raise NotImplementedError

    def payloads(self) -> dict[int, str]:
        raise NotImplementedError

    def flush(self) -> int:
        return self.durable_seq

    def end_op(self, sync: bool = False) -> None:
        """Called by the broker after each operation: the only moment a group may commit."""
        if sync:
            self.flush()

    def close(self) -> None:
        self.flush()

    # -- shared ----------------------------------------------------------------------
    def append(self, rows: np.ndarray, payloads: dict[int, str] | None = None) -> int:
        """Store rows (their ``seq`` is assigned here); ``payloads`` maps a row's index in
        ``rows`` to its JSON payload. Returns the first seq."""
        first = self.next_seq
        n = rows.shape[0]
        rows["seq"] = np.arange(first, first + n)
        pl = {first + i: p for i, p in (payloads or {}).items()}
        for i in np.flatnonzero(rows["op"] == OP["register"]):
            self.names.append(json.loads(pl[first + int(i)])["name"])
        self._store(rows, pl)
        self.next_seq = first + n
        return first

    def reserve(self, n: int) -> np.ndarray:
        """``n`` uninitialised rows for the next records (in the sink's own storage where
        it can). Fill every field, seqs from :attr:`next_seq` on, then hand them to
        :meth:`append_reserved` before anything else is appended."""
        s = self._scratch
        if s is None or s.shape[0] < n:
            s = self._scratch = np.empty(max(n, 1024), dtype=RECORD_DTYPE)
        return s[:n]

    def append_reserved(self, rows: np.ndarray) -> int:
        """Store the rows :meth:`reserve` gave out, filled (no payloads, so no
        ``register`` records). Returns the first seq."""
        first = self.next_seq
        self._store(rows, {})
        self.next_seq = first + rows.shape[0]
        return first

    def add(self, fields: dict, payload: str | None = None) -> int:
        """Store one record given as a dict of its non-default fields (the single-decision
        fast path: no numpy until the rows are read or committed). Returns its seq."""
        seq = self.next_seq
        fields["seq"] = seq
        if payload is not None and fields.get("op") == OP["register"]:
            self.names.append(json.loads(payload)["name"])
        self._store_one(as_tuple(fields), payload, seq)
        self.next_seq = seq + 1
        return seq

    def add_record(self, record: tuple) -> int:
        """Store one record given as a tuple of every field in :data:`records.FIELDS`
        order, its seq first (which must be :attr:`next_seq`), with no payload: the
        compiled acquire path's records. Returns its seq."""
        seq = record[0]
        if seq != self.next_seq or len(record) != len(FIELDS):
            raise ValueError(f"a record must have {len(FIELDS)} fields and seq {self.next_seq}")
        self._store_one(record, None, seq)
        self.next_seq = seq + 1
        return seq

    def _store_one(self, record: tuple, payload: str | None, seq: int) -> None:
        row = np.empty(1, dtype=RECORD_DTYPE)
        pack_tuples([record], row)
        self._store(row, {seq: payload} if payload is not None else {})

    def __len__(self) -> int:
        return self.next_seq

    def __iter__(self) -> Iterator[dict]:
        pl = self.payloads()
        for r in self.rows():
            yield to_dict(r, pl.get(int(r["seq"])), self.names)

    def record(self, seq: int) -> dict:
        rows = self.rows()
        if not 0 <= seq < rows.shape[0]:
            raise InvalidArgument("seq", f"must be in [0, {rows.shape[0]})", seq)
        return to_dict(rows[seq], self.payloads().get(seq), self.names)

    def query(self, campaign: str | int | None = None, t0: float | None = None,
              t1: float | None = None, op: str | None = None, outcome: str | None = None,
              reason: str | None = None, limit: int | None = None) -> list[dict]:
        """Records matching every given filter, in seq order (times in seconds)."""
        rows = self.rows()
        m = np.ones(rows.shape[0], dtype=bool)
        if campaign is not None:
            c = campaign if isinstance(campaign, int) else (
                self.names.index(campaign) if campaign in self.names else -2)
            m &= rows["campaign"] == c
        if t0 is not None:
            m &= rows["t"] >= round(t0 * 1e9)
        if t1 is not None:
            m &= rows["t"] <= round(t1 * 1e9)
        if op is not None:
            if op not in OP:
                raise InvalidArgument("op", f"must be one of {list(OPS)}", op)
            m &= rows["op"] == OP[op]
        if outcome is not None:
            if outcome not in OUTCOMES:
                raise InvalidArgument("outcome", f"must be one of {list(OUTCOMES[1:])}", outcome)
            m &= rows["outcome"] == OUTCOMES.index(outcome)
        if reason is not None:
            if reason not in _REASONS:
                raise InvalidArgument("reason", f"must be one of {list(_REASONS[1:])}", reason)
            m &= rows["reason"] == _REASONS.index(reason)
        idx = np.flatnonzero(m)
        if limit is not None:
            idx = idx[:limit]
        pl = self.payloads()
        return [to_dict(rows[i], pl.get(int(rows[i]["seq"])), self.names) for i in idx]

    def counts(self, by: str = "reason", campaign: str | None = None) -> dict[str, int]:
        """How many decisions per reason (or per ``op`` / ``outcome``)."""
        if by not in ("reason", "op", "outcome"):
            raise InvalidArgument("by", "must be 'reason', 'op' or 'outcome'", by)
        rows = self.rows()
        if campaign is not None:
            rows = rows[rows["campaign"] == (self.names.index(campaign)
                                             if campaign in self.names else -2)]
        labels = {"reason": _REASONS, "op": OPS, "outcome": OUTCOMES}[by]
        cnt = Counter(rows[by].tolist())
        return {labels[k] or "none": v for k, v in sorted(cnt.items())}
