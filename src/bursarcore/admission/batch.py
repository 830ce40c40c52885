"""Validation of :meth:`Broker.admit_batch`'s columns that is not the loop's own: the
``units`` column (SPEC §4.1, one rule for a batch as for one intent)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import units
from ..batchprep import minmax
from ..errors import InvalidArgument

__all__ = ["batch_units"]

_MAX_U = units.MAX_UNITS


def batch_units(values: Any, n: int) -> tuple[np.ndarray, np.ndarray, int]:
    """admit_batch's ``units``: (n,) (min = max) or (n, 2) (min, max) integers with
    1 <= min <= max <= MAX_UNITS, as int64 columns (min and max reductions, not a
    mask per rule; an int64 (n,) array is used as it is, as campaign_idx is), and the
    largest max (0 for an empty batch)."""
    u = values if type(values) is np.ndarray else units.column(values, "units")
    if u.dtype.kind not in "iu":
        raise InvalidArgument("units", "must be integers", u.dtype)
    if u.dtype.kind == "u" and u.size and int(u.max()) > _MAX_U:
        u = np.minimum(u, _MAX_U + 1)   # (named below, before it could wrap to int64)
    if u.shape == (n,):
        nmin = nmax = np.ascontiguousarray(u, dtype=np.int64)
        low, top = minmax(nmax) if n else (1, 0)
        ok = low >= 1 and top <= _MAX_U
    elif u.shape == (n, 2):
        nmin, nmax = u[:, 0].astype(np.int64), u[:, 1].astype(np.int64)
        top = int(nmax.max()) if n else 0
        ok = not n or (int(nmin.min()) >= 1 and top <= _MAX_U and not (nmin > nmax).any())
    else:
        raise InvalidArgument("units", f"must have shape ({n},) or ({n}, 2)", u.shape)
    if not ok:
        bad = (nmin < 1) | (nmax > _MAX_U) | (nmin > nmax)
        k = int(np.flatnonzero(bad)[0])
        raise InvalidArgument("units", f"need 1 <= min <= max <= {_MAX_U:,}",
                              f"{(int(nmin[k]), int(nmax[k]))!r} at position {k}")
    return nmin, nmax, top
