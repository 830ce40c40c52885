"""Input checks shared by every backend, so each backend refuses exactly the same inputs."""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

from . import units
from .errors import InvalidArgument, TimeWentBackwards


def index(i: Any, n: int, field: str = "i") -> int:
    """An integer in ``[0, n)``."""
    try:
        k = operator.index(i)
    except TypeError:
        raise InvalidArgument(field, "must be an integer index", i) from None
    if not 0 <= k < n:
        raise InvalidArgument(field, f"index out of range [0, {n})", i)
    return k


def batch_times(idx: np.ndarray, now_ns: np.ndarray, last: np.ndarray, watermark: int) -> None:
    """Raise unless ``now`` is non-decreasing per bucket and never before a bucket's last update.

    Fast path: a globally sorted batch that starts at or after the newest update of any
    bucket. Otherwise each bucket's requests are checked in order (stable sort by bucket).
    """
    n = now_ns.shape[0]
    if n == 0:
        return
    if now_ns[0] >= watermark and (n == 1 or bool((now_ns[1:] >= now_ns[:-1]).all())):
        return
    order = np.argsort(idx, kind="stable")
    si, st = idx[order], now_ns[order]
    first = np.ones(n, dtype=bool)
    first[1:] = si[1:] != si[:-1]
    back = np.zeros(n, dtype=bool)
    back[1:] = (~first[1:]) & (st[1:] < st[:-1])
    back |= first & (st < last[si])
    if back.any():
        k = int(order[np.flatnonzero(back)[0]])
        raise TimeWentBackwards(
            "now", f"must be non-decreasing per bucket (bucket {int(idx[k])})",
            f"{now_ns[k] / units.NS!r} at position {k}")
