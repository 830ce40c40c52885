"""Clocks. Only a broker façade reads a clock; every core operation takes ``now`` (SPEC §2)."""

from __future__ import annotations

import time

from . import units
from .errors import InvalidArgument

__all__ = ["ManualClock", "MonotonicClock"]


class ManualClock:
    """A clock that moves only when told to.

    Tests and simulations use it so that nothing sleeps and every run decides the same:
    the broker reads the time only from its clock, and this one never runs backwards.

    Parameters
    ----------
    start : float, optional
        The time it starts at, in seconds (default 0.0).

    Raises
    ------
    InvalidArgument
        ``start`` is not a finite number of seconds within the engine's range.
    """

    def __init__(self, start: float = 0.0) -> None:
        self._t = _finite(start, "start")

    def now(self) -> float:
        """The current time.

        Returns
        -------
        float
            Seconds, as last set or advanced.
        """
        return self._t

    def advance(self, seconds: float) -> float:
        """Move the clock forward by ``seconds``.

        Parameters
        ----------
        seconds : float
            How far, >= 0.

        Returns
        -------
        float
            The new time.

        Raises
        ------
        InvalidArgument
            ``seconds`` is negative, not finite, or would move the clock past the engine's
            range (``units.MAX_SECONDS``); the clock does not move.
        """
        if type(seconds) is float and 0.0 <= seconds \
                and self._t + seconds <= units.MAX_SECONDS:             # the common case
            self._t += seconds
            return self._t
        s = _finite(seconds, "seconds")
        if s < 0:
            raise InvalidArgument("seconds", "must be >= 0 (time never runs backwards)", seconds)
        if self._t + s > units.MAX_SECONDS:
            raise InvalidArgument("seconds", f"would move the clock past {units.MAX_SECONDS:.6g} s "
                                  "(the engine's range)", seconds)
        self._t += s
        return self._t

    def set(self, t: float) -> float:
        """Move the clock to the time ``t``.

        Parameters
        ----------
        t : float
            The new time in seconds, >= the current time.

        Returns
        -------
        float
            The new time.

        Raises
        ------
        InvalidArgument
            ``t`` is earlier than the current time, or not a finite number of seconds
            within the engine's range; the clock does not move.
        """
        if type(t) is float and self._t <= t <= units.MAX_SECONDS:   # the common case
            self._t = t
            return t
        t = _finite(t, "t")
        if t < self._t:
            raise InvalidArgument("t", f"must be >= the current time {self._t}", t)
        self._t = t
        return self._t

    def __repr__(self) -> str:
        return f"ManualClock({self._t!r})"


class MonotonicClock:
    """Seconds since the clock was made, from ``time.monotonic``.

    The clock of a service: it never runs backwards (a wall clock can, when it is set),
    so a broker reading it never sees time go back.

    Parameters
    ----------
    start : float, optional
        The time it reads when made, in seconds (default 0.0).
    """

    def __init__(self, start: float = 0.0) -> None:
        self._origin = time.monotonic() - start

    def now(self) -> float:
        """The current time.

        Returns
        -------
        float
            ``start`` plus the seconds since the clock was made.
        """
        return time.monotonic() - self._origin

    def advance(self, seconds: float) -> float:  # pragma: no cover - only manual clocks move
        """Always raises: a monotonic clock follows real time.

        Raises
        ------
        TypeError
            Always; use :class:`ManualClock` where time must be moved by hand.
        """
        raise TypeError("a MonotonicClock cannot be advanced; use ManualClock in tests")


def _finite(x: object, field: str) -> float:
    """A time or a step in seconds within the engine's range (``units.MAX_SECONDS``)."""
    return units.real(x, field, lo=-units.MAX_SECONDS, hi=units.MAX_SECONDS,
                      what="a number of seconds")
