"""Request rate limits on bursarcore's own token buckets, per token and per tenant.

Every token (by its id, never the secret) gets a bucket of ``burst`` requests refilled at
``rate`` requests per second; a request costs 1, a batch of n items costs ``1 + n //
batch_unit``. A campaign token's request also debits its tenant's bucket (``tenant_burst``
refilled at ``tenant_rate``): the tenant is the top-level node of the token's campaign, so
the tokens a subtree mints and the nodes it registers share one rate, and no tenant can
multiply its own share of the service by minting. Operator tokens have their own buckets
only. An empty bucket answers 429 with ``Retry-After`` = the seconds until the
request's cost is back (rounded up, as the header takes whole seconds). Failed
authentications are limited the same way per client address, so guessing costs time.

The buckets are one :class:`~bursarcore.buckets.TokenBuckets` array (compiled when built);
the limiter runs on the event-loop thread only, so it needs no lock.
"""

from __future__ import annotations

import math
import time
from typing import Callable, Protocol

from ..buckets import TokenBuckets

__all__ = ["RateLimiter", "RequestLimits"]


class RateLimiter:
    """``RateLimiter(rate, burst)``: ``check(key, cost) -> 0.0`` when allowed, else the
    seconds to wait. ``rate`` <= 0 disables the limit. Keys are created on first use and
    forgotten (oldest first) beyond ``max_keys``."""

    def __init__(self, rate: float, burst: float, *, max_keys: int = 100_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = float(rate)
        self.burst = max(float(burst), 1.0)
        self.max_keys = max_keys
        self._clock = clock
        self._t0 = clock()
        self._index: dict[str, int] = {}
        self._free: list[int] = []
        self._tb = TokenBuckets([], [], now=0.0)

    @property
    def enabled(self) -> bool:
        return self.rate > 0

    def _now(self) -> float:
        return self._clock() - self._t0

    def _slot(self, key: str, now: float) -> int:
        i = self._index.get(key)
        if i is not None:
            return i
        if len(self._index) >= self.max_keys:
            # forget the oldest key: its bucket is reset to full for the next key
            old = next(iter(self._index))
            self._free.append(self._index.pop(old))
        if self._free:
            i = self._free.pop()
            self._tb.refund(i, self.burst, now)
        else:
            i = self._tb.append(self.burst, self.rate, now=now)
        self._index[key] = i
        return i

    def check(self, key: str, cost: float = 1.0) -> float:
        if not self.enabled:
            return 0.0
        now = self._now()
        i = self._slot(key, now)
        cost = min(float(cost), self.burst)
        if self._tb.try_debit(i, cost, now):
            return 0.0
        wait = self._tb.time_until(i, cost, now)
        return wait if math.isfinite(wait) and wait > 0 else 1.0 / self.rate

    def refund(self, key: str, cost: float = 1.0) -> None:
        """Give back what an allowed :meth:`check` of ``key`` debited (capped at ``burst``)."""
        i = self._index.get(key)
        if self.enabled and i is not None:
            self._tb.refund(i, min(float(cost), self.burst), self._now())


class _Caller(Protocol):
    @property
    def token_id(self) -> str: ...
    @property
    def campaign(self) -> str | None: ...


class RequestLimits:
    """The limits one request passes: its token's bucket, then, for a campaign token, its
    tenant's. ``check(principal, cost) -> 0.0`` when both allow (both debited), else the
    seconds to wait (neither debited)."""

    def __init__(self, rate: float, burst: float, tenant_rate: float, tenant_burst: float,
                 *, clock: Callable[[], float] = time.monotonic) -> None:
        self.token = RateLimiter(rate, burst, clock=clock)
        self.tenant = RateLimiter(tenant_rate, tenant_burst, clock=clock)

    def check(self, p: _Caller, cost: float = 1.0) -> float:
        wait = self.token.check(p.token_id, cost)
        if wait or p.campaign is None:
            return wait
        wait = self.tenant.check(p.campaign.split("/", 1)[0], cost)
        if wait:
            self.token.refund(p.token_id, cost)
        return wait


def retry_after_header(seconds: float) -> str:
    """``Retry-After`` takes whole seconds: round up, at least 1."""
    return str(max(1, math.ceil(seconds)))
