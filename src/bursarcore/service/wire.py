"""The columnar batch format of the HTTP API, shared by the server and the client.

A columnar request or answer is one map of named fields, sent as JSON
(``application/json``) or as MessagePack (``application/msgpack``). A numeric column is
either a list of numbers (both forms) or, in MessagePack only, a *typed column*: a map
``{"dtype": "<i4", "n": 10000, "data": <bin>}`` whose ``data`` is the column's raw
little-endian bytes, ``n * itemsize`` of them. Typed columns decode with
:func:`numpy.frombuffer` (no Python object per item) and encode with ``tobytes``.

This module needs only numpy (and ``msgpack`` for the binary form): the client imports it
without the web framework. Decoding checks the shape of what arrived — the dtype is one
the column allows, the length matches, lists hold numbers only — and raises
:class:`ColumnError` naming the column (and the row, where there is one); the rules of
the values themselves (ranges, names) are the server's.
"""

from __future__ import annotations

import json
import math
from typing import Any, Mapping

import numpy as np

try:  # the binary form needs msgpack (the 'service' extra); JSON works without it
    import msgpack
except ImportError:  # pragma: no cover
    msgpack = None

__all__ = ["JSON", "MSGPACK", "MEDIA_TYPES", "ColumnError", "INT_DTYPES", "FLOAT_DTYPES",
           "decode_body", "encode_body", "column", "typed", "media_type_of"]

JSON = "application/json"
MSGPACK = "application/msgpack"
#: the media types a columnar request may have, and the form each one means
MEDIA_TYPES = {JSON: JSON, MSGPACK: MSGPACK, "application/x-msgpack": MSGPACK,
               "application/vnd.msgpack": MSGPACK}

#: the dtypes a typed integer column may declare (little-endian or single bytes)
INT_DTYPES = frozenset({"<i8", "<i4", "<i2", "|i1", "<u4", "<u2", "|u1"})
#: the dtypes a typed real column may declare (integers too)
FLOAT_DTYPES = frozenset({"<f8", "<f4"}) | INT_DTYPES
_TYPED_KEYS = frozenset({"dtype", "n", "data"})


class ColumnError(ValueError):
    """A column that cannot be read: ``field`` names it (``"max_units"``), ``row`` the
    first bad item (None when the column as a whole is wrong), ``rule`` what it breaks."""

    def __init__(self, field: str, rule: str, row: int | None = None) -> None:
        self.field, self.rule, self.row = field, rule, row
        where = field if row is None else f"{field}[{row}]"
        super().__init__(f"{where}: {rule}")


def media_type_of(content_type: str | None) -> str | None:
    """The columnar form a ``Content-Type`` header means (parameters ignored), or None."""
    if not content_type:
        return None
    return MEDIA_TYPES.get(content_type.split(";", 1)[0].strip().lower())


def decode_body(body: bytes, form: str) -> dict[str, Any]:
    """The request's map of fields; :class:`ColumnError` (field ``"body"``) if the body is
    not one map in its form."""
    if form == MSGPACK and msgpack is None:  # pragma: no cover
        raise ColumnError("body", "the binary form needs msgpack on the server")
    try:
        if form == MSGPACK:
            doc = msgpack.unpackb(body, raw=False, strict_map_key=True)
        else:
            doc = json.loads(body)
    except Exception as e:  # noqa: BLE001 - each parser has errors of its own
        name = "MessagePack" if form == MSGPACK else "JSON"
        raise ColumnError("body", f"is not valid {name} ({type(e).__name__})") from None
    if not isinstance(doc, dict):
        raise ColumnError("body", "must be a map of named fields")
    return doc


def column(value: Any, field: str, kind: str, *, n: int | None = None,
           finite: bool = True) -> np.ndarray:
    """One column as a 1-D numpy array: ``kind`` ``"int"`` (int64) or ``"float"``
    (float64); ``n`` the length it must have. A typed column is read in place
    (``np.frombuffer``) and converted once; a list must hold numbers only (no strings,
    no booleans, and integers only for ``"int"``); JSON ``null`` is refused, and so are
    NaN and infinity unless ``finite`` is False."""
    allowed = INT_DTYPES if kind == "int" else FLOAT_DTYPES
    want = np.int64 if kind == "int" else np.float64
    if isinstance(value, dict):
        if set(value) != _TYPED_KEYS:
            raise ColumnError(field, "a typed column is a map of dtype, n and data")
        dt, k, data = value["dtype"], value["n"], value["data"]
        if not isinstance(dt, str) or dt not in allowed:
            raise ColumnError(field, f"dtype must be one of {sorted(allowed)}, not {dt!r}")
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise ColumnError(field, "n must be a whole number >= 0")
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise ColumnError(field, "data must be binary (bin), the column's raw bytes")
        dtype = np.dtype(dt)
        if len(data) != k * dtype.itemsize:
            raise ColumnError(field, f"data holds {len(data)} bytes; n={k} of {dt} are "
                                     f"{k * dtype.itemsize}")
        arr = np.frombuffer(data, dtype=dtype)
    elif isinstance(value, list):
        arr = _from_list(value, field, kind)
    else:
        raise ColumnError(field, "must be a list of numbers or a typed column")
    if n is not None and arr.shape[0] != n:
        raise ColumnError(field, f"has {arr.shape[0]} items; the batch has {n}")
    if finite and arr.dtype.kind == "f":
        fin = np.isfinite(arr)
        if not fin.all():
            raise ColumnError(field, "must be finite", int(np.flatnonzero(~fin)[0]))
    return arr.astype(want, copy=False)


def _from_list(value: list, field: str, kind: str) -> np.ndarray:
    if not value:
        return np.zeros(0, np.int64 if kind == "int" else np.float64)
    try:
        arr = np.array(value)
    except (ValueError, OverflowError):
        arr = np.array(value, dtype=object)
    k = arr.dtype.kind
    # (a boolean among numbers would be upcast to 0 or 1: refused, as in the JSON API)
    if arr.ndim == 1 and (k in "iu" or (k == "f" and kind == "float")) \
            and bool not in set(map(type, value)):
        return arr
    # the first item that is not a number of the column's kind
    for i, x in enumerate(value):
        ok = isinstance(x, int) and not isinstance(x, bool) and -(1 << 63) <= x < (1 << 63)
        if kind == "float":
            ok = ok or isinstance(x, float)
        if not ok:
            what = "an integer" if kind == "int" else "a number"
            raise ColumnError(field, f"must be {what}", i)
    raise ColumnError(field, "must be a flat list of numbers")  # pragma: no cover


def typed(arr: np.ndarray) -> dict[str, Any]:
    """A numpy column as a typed column (little-endian raw bytes)."""
    a = np.ascontiguousarray(arr)
    a = a.astype(a.dtype.newbyteorder("<"), copy=False)
    return {"dtype": a.dtype.str, "n": int(a.shape[0]), "data": a.tobytes()}


def encode_body(doc: Mapping[str, Any], form: str) -> bytes:
    """A map of fields in ``form``: numpy columns become typed columns in MessagePack and
    lists in JSON (a non-finite float becomes ``null``: JSON has no infinity)."""
    if form == MSGPACK:
        if msgpack is None:  # pragma: no cover
            raise RuntimeError("the binary form needs msgpack: pip install msgpack")
        return msgpack.packb({k: typed(v) if isinstance(v, np.ndarray) else v
                              for k, v in doc.items()}, use_bin_type=True)
    out: dict[str, Any] = {}
    for k, v in doc.items():
        if isinstance(v, np.ndarray):
            items = v.tolist()
            if v.dtype.kind == "f" and not np.isfinite(v).all():
                items = [x if math.isfinite(x) else None for x in items]
            out[k] = items
        else:
            out[k] = v
    return json.dumps(out, separators=(",", ":"), allow_nan=False).encode()
