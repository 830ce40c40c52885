"""Token buckets held as arrays — the core every envelope control is built on.

``TokenBuckets(capacity, rate, tokens=None, now=0.0)`` holds N buckets, each with a capacity
(units), a refill rate (units per second), tokens and a last-update time. Buckets start full
unless told otherwise. Every operation takes ``now`` (float seconds); inside, time is int64
ns and amounts are int64 fixed point (:mod:`bursarcore.units`), so every backend decides
identically, bit for bit.

Operations
    ``try_debit(i, amount, now) -> bool``
    ``try_debit_batch(idx, amounts, now) -> ndarray[bool]`` — sequential semantics: request
    k sees the effect of requests < k; ``amounts``/``now`` scalars or arrays; ``now`` must
    be non-decreasing per bucket.
    ``refund(i, amount, now) -> float`` — returns what was credited (capped at capacity).
    ``tokens(now) -> ndarray`` — peek, no mutation.
    ``set_rate(i, rate, now)`` — settles the bucket at the old rate first.
    ``time_until(i, amount, now) -> float`` — seconds until ``amount`` is available (0 if
    now; ``inf`` if it exceeds the capacity, the rate is 0, or the wait would exceed
    2^62 ns, 146 years).
    ``append(capacity, rate, tokens=None, now=None) -> int`` — grows in place.
    ``state`` / ``from_state`` and pickling.

Bad input raises :class:`bursarcore.errors.InvalidArgument` naming the argument, before
any state changes. ``TokenBuckets`` is the backend's class (``BURSARCORE_BACKEND``,
:mod:`bursarcore._backend`): the C core bound by Cython, the same core bound by cffi, or the
pure-Python reference; :data:`BACKENDS` has every usable one, fastest first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import _backend
from .reference.buckets import TokenBuckets as ReferenceTokenBuckets

__all__ = ["TokenBuckets", "ReferenceTokenBuckets", "BACKENDS"]

BACKENDS: dict[str, type] = {}
_cy = _backend.compiled("_buckets")
if _cy is not None:
    BACKENDS["cython"] = _cy.TokenBuckets
_cf = _backend.cffi("_cffi_buckets")
if _cf is not None:
    BACKENDS["cffi"] = _cf.TokenBuckets
BACKENDS["reference"] = ReferenceTokenBuckets
if TYPE_CHECKING:       # every backend has the reference's interface
    TokenBuckets = ReferenceTokenBuckets
else:
    TokenBuckets = _backend.pick(BACKENDS)
