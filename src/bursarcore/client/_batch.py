"""Columnar batches for both clients: numpy columns in, ``POST /v1/batch/intents`` or
``/v1/batch/consume`` in MessagePack (typed columns, the default) or JSON, numpy columns
out — the types :meth:`Broker.admit_batch` and :meth:`Broker.consume_batch` return."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..broker import BatchResult
from ..errors import InvalidArgument
from ..service.wire import JSON, MSGPACK, ColumnError, column, decode_body, encode_body
from ..service.wire import media_type_of as _form_of
from ._base import _Req

__all__ = ["intents_request", "consume_request", "batch_result", "consumptions"]

_I32 = (-(1 << 31), (1 << 31) - 1)


def _compact(a: np.ndarray) -> np.ndarray:
    """Integers as int32 when they fit (half the bytes on the wire); otherwise as they
    are, for the server to refuse by row."""
    if a.dtype.kind in "iu" and a.shape[0] and a.dtype.itemsize > 4:
        if _I32[0] <= int(a.min()) and int(a.max()) <= _I32[1]:
            return a.astype(np.int32)
    return a


def _ints(x: Any, field: str) -> np.ndarray:
    a = np.asarray(x)
    if a.ndim != 1 or (a.shape[0] and a.dtype.kind not in "iu"):
        raise InvalidArgument(field, "must be a 1-D array of integers", a.shape)
    return a


def _campaign_columns(campaign_idx: Any, campaigns: Sequence[str] | None,
                      default: Sequence[str] | None) -> tuple[list[str], np.ndarray | None, int | None]:
    """The request's name table and positions: ``campaign_idx`` indexes ``campaigns``
    (default: ``default``, the list ``GET /v1/campaigns`` gives), or holds names (one
    string for the whole batch, or one per row)."""
    if isinstance(campaign_idx, str):
        return [campaign_idx], None, None
    a = np.asarray(campaign_idx)
    if a.dtype.kind in "USO":
        if a.ndim != 1:
            raise InvalidArgument("campaign_idx", "must be 1-D", a.shape)
        table, codes = np.unique(a.astype(str), return_inverse=True)
        return [str(x) for x in table], codes.reshape(-1), a.shape[0]
    a = _ints(a, "campaign_idx")
    names = list(campaigns) if campaigns is not None else list(default or [])
    if not names:
        raise InvalidArgument("campaigns", "must name the campaigns campaign_idx indexes")
    return names, a, a.shape[0]


def _put(doc: dict[str, Any], key: str, a: np.ndarray, binary: bool) -> None:
    doc[key] = _compact(a) if binary else a


def _encode(doc: dict[str, Any], binary: bool) -> tuple[bytes, str]:
    form = MSGPACK if binary else JSON
    return encode_body(doc, form), form


def intents_request(campaign_idx: Any, units: Any, durations: Any, *,
                    campaigns: Sequence[str] | None, default: Sequence[str] | None,
                    service_class: str | None, dim: str | None, ttl: float | None,
                    binary: bool) -> _Req:
    """``POST /v1/batch/intents`` for the arguments of :meth:`Broker.admit_batch`."""
    table, codes, n = _campaign_columns(campaign_idx, campaigns, default)
    u = np.asarray(units)
    if u.ndim == 2 and u.shape[1] == 2:
        lo, hi = u[:, 0], u[:, 1]
    elif u.ndim == 1:
        lo, hi = None, u
    else:
        raise InvalidArgument("units", "must have shape (n,) or (n, 2)", u.shape)
    if hi.shape[0] and hi.dtype.kind not in "iu":
        raise InvalidArgument("units", "must be integers", str(hi.dtype))
    if n is not None and hi.shape[0] != n:
        raise InvalidArgument("units", f"must have {n} rows, as campaign_idx", hi.shape[0])
    doc: dict[str, Any] = {"campaigns": table}
    if codes is not None:
        _put(doc, "campaign", codes, binary)
    if lo is not None:
        _put(doc, "min_units", np.ascontiguousarray(lo), binary)
    _put(doc, "max_units", np.ascontiguousarray(hi), binary)
    if isinstance(durations, (int, float)) and not isinstance(durations, bool):
        doc["duration"] = float(durations)
    else:
        doc["duration"] = np.asarray(durations, dtype=np.float64).reshape(-1)
    for k, v in (("service_class", service_class), ("dim", dim), ("ttl", ttl)):
        if v is not None:
            doc[k] = v
    body, form = _encode(doc, binary)
    return _Req("POST", "/v1/batch/intents", _answer, content=body, content_type=form)


def consume_request(campaign_idx: Any, dims: Any, amounts: Any, *,
                    campaigns: Sequence[str] | None, default: Sequence[str] | None,
                    flow_dims: Sequence[str] | None, binary: bool) -> _Req:
    """``POST /v1/batch/consume`` for the arguments of :meth:`Broker.consume_batch`
    (``dims`` by name, or by index into ``flow_dims``)."""
    table, codes, n = _campaign_columns(campaign_idx, campaigns, default)
    amt = np.asarray(amounts, dtype=np.float64)
    if amt.ndim == 0:
        if n is None:
            raise InvalidArgument("amounts", "must be an array when campaign_idx is one name")
        amt = np.full(n, float(amt))
    amt = amt.reshape(-1)
    if n is not None and amt.shape[0] != n:
        raise InvalidArgument("amounts", f"must have {n} items, as campaign_idx", amt.shape[0])
    doc: dict[str, Any] = {"campaigns": table}
    if codes is not None:
        _put(doc, "campaign", codes, binary)
    d = dims if isinstance(dims, str) else np.asarray(dims)
    if isinstance(d, str) or (isinstance(d, np.ndarray) and d.ndim == 0 and d.dtype.kind in "US"):
        doc["dims"] = [str(d)]
    elif isinstance(d, np.ndarray) and d.dtype.kind in "USO":
        dt, dc = np.unique(d.astype(str).reshape(-1), return_inverse=True)
        doc["dims"] = [str(x) for x in dt]
        _put(doc, "dim", dc.reshape(-1), binary)
    else:
        if not flow_dims:
            raise InvalidArgument("dims", "by index needs the pool's flow dimensions")
        di = np.asarray(d).reshape(-1)
        if di.dtype.kind not in "iu":
            raise InvalidArgument("dims", "must be names or indices", str(di.dtype))
        doc["dims"] = list(flow_dims)
        _put(doc, "dim", np.full(amt.shape[0], int(di[0])) if di.shape[0] == 1 else di, binary)
    doc["amount"] = amt
    body, form = _encode(doc, binary)
    return _Req("POST", "/v1/batch/consume", _answer, content=body, content_type=form)


def _answer(body: bytes, content_type: str | None) -> dict[str, Any]:
    form = _form_of(content_type) or JSON
    doc = decode_body(body, form)
    out: dict[str, Any] = {}
    for k, v in doc.items():
        if isinstance(v, dict) or (isinstance(v, list) and (not v or not isinstance(v[0], str))):
            if k == "retry_after" and isinstance(v, list):
                v = [np.inf if x is None else x for x in v]       # JSON null: never
            try:
                kind = "float" if k in ("cost", "allowed", "retry_after") else "int"
                out[k] = column(v, k, kind, finite=k != "retry_after")
            except ColumnError as e:
                raise InvalidArgument(k, f"the service answered a column that cannot be "
                                         f"read: {e.rule}") from None
        else:
            out[k] = v
    return out


def batch_result(cols: dict[str, Any]) -> BatchResult:
    """The :class:`BatchResult` of an answer's columns (int64, as the broker's)."""
    return BatchResult(*(np.asarray(cols[k], np.int64)
                         for k in ("granted", "reason", "lease", "outcome", "intent")))


def consumptions(cols: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """``(allowed, retry_after)`` of an answer, as :meth:`Broker.consume_batch` returns."""
    return (np.asarray(cols["allowed"], np.float64),
            np.asarray(cols["retry_after"], np.float64))
