"""Clocks. Only a broker façade reads a clock; every core operation takes ``now`` (SPEC §2)."""

from __future__ import annotations

import math
import time

from . import units
from .errors import InvalidArgument

__all__ = ["ManualClock", "MonotonicClock"]


class ManualClock:
    """A clock that moves only when told to: tests and simulations use it, nothing sleeps."""

    def __init__(self, start: float = 0.0) -> None:
        self._t = _finite(start, "start")

    def now(self) -> float:
        return self._t

    def advance(self, seconds: float) -> float:
        s = _finite(seconds, "seconds")
        if s < 0:
            raise InvalidArgument("seconds", "must be >= 0 (time never runs backwards)", seconds)
        if self._t + s > units.MAX_SECONDS:
            raise InvalidArgument("seconds", f"would move the clock past {units.MAX_SECONDS:.6g} s "
                                  "(the engine's range)", seconds)
        self._t += s
        return self._t

    def set(self, t: float) -> float:
        t = _finite(t, "t")
        if t < self._t:
            raise InvalidArgument("t", f"must be >= the current time {self._t}", t)
        self._t = t
        return self._t

    def __repr__(self) -> str:
        return f"ManualClock({self._t!r})"


class MonotonicClock:
    """Seconds since the clock was made, from ``time.monotonic`` (services)."""

    def __init__(self, start: float = 0.0) -> None:
        self._origin = time.monotonic() - start

    def now(self) -> float:
        return time.monotonic() - self._origin

    def advance(self, seconds: float) -> float:  # pragma: no cover - only manual clocks move
        raise TypeError("a MonotonicClock cannot be advanced; use ManualClock in tests")


def _finite(x: object, field: str) -> float:
    """A time or a step in seconds within the engine's range (``units.MAX_SECONDS``)."""
    return units.real(x, field, lo=-units.MAX_SECONDS, hi=units.MAX_SECONDS,
                      what="a number of seconds")
