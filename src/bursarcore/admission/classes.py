"""Service classes and congestion pricing (SPEC §7)."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InvalidArgument
from ..units import MAX_DURATION, MAX_MULTIPLIER, real

__all__ = ["ServiceClass", "Congestion", "DEFAULT_CLASSES"]


@dataclass(frozen=True)
class ServiceClass:
    """A row of the service class table (SPEC §7).

    A class sets how an intent is ordered, priced and protected; the broker's table of
    them is fixed at construction, and every value is checked here, once.

    Parameters
    ----------
    name : str
        The class name intents and envelopes use; non-empty.
    rank : int
        Orders pending intents, 0 first; an integer in [0, 2**30].
    multiplier : float
        Scales the credit price.
    congestion_priced : bool, optional
        Whether the congestion multiplier applies (default True).
    preemptible : bool, optional
        Whether the class gets opportunistic leases, revocable after ``grace`` seconds
        (default False).
    grace : float, optional
        Seconds between a preemption notice and the revocation; > 0 for a preemptible
        class (default 0.0).
    free_when_broke : bool, optional
        Whether the class is served free when the campaign's credits cannot cover it
        (SPEC §4.3; default False).

    Raises
    ------
    InvalidArgument
        A value breaks its rule; ``field`` is ``"name"`` or ``"<name>.<field>"``.
    """

    name: str
    rank: int
    multiplier: float
    congestion_priced: bool = True
    preemptible: bool = False
    grace: float = 0.0
    free_when_broke: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise InvalidArgument("name", "must be a non-empty string", self.name)
        if not isinstance(self.rank, int) or self.rank < 0:
            raise InvalidArgument(f"{self.name}.rank", "must be an integer >= 0", self.rank)
        if isinstance(self.rank, bool) or self.rank > 1 << 30:
            raise InvalidArgument(f"{self.name}.rank", "must be an integer in [0, 2**30]",
                                  self.rank)
        for f, hi in (("multiplier", MAX_MULTIPLIER), ("grace", MAX_DURATION)):
            object.__setattr__(self, f, real(getattr(self, f), f"{self.name}.{f}", hi=hi))
        if self.preemptible and self.grace <= 0:
            raise InvalidArgument(f"{self.name}.grace", "must be > 0 for a preemptible class",
                                  self.grace)


DEFAULT_CLASSES: tuple[ServiceClass, ...] = (
    ServiceClass("deadline", 0, 4.0),
    ServiceClass("interactive", 1, 2.0),
    ServiceClass("agent-burst", 2, 3.0),
    ServiceClass("opportunistic", 3, 0.25, congestion_priced=False, preemptible=True,
                 grace=60.0, free_when_broke=True),
)


@dataclass(frozen=True)
class Congestion:
    """Congestion pricing: the index κ and the multipliers it selects (SPEC §7).

    κ = unmet priced demand / free capacity over a trailing window. The window is kept as
    ``bins`` fixed bins (a ring), so it is exact integer state every backend shares.

    Parameters
    ----------
    window : float, optional
        The trailing window in seconds, > 0 (default 60.0).
    bins : int, optional
        How many bins the window is kept in, in [1, 3600] (default 60).
    thresholds : tuple of float, optional
        Three increasing κ bounds, >= 0 (default ``(0.5, 1.0, 2.0)``).
    multipliers : tuple of float, optional
        Four price multipliers, one more than ``thresholds``: κ < thresholds[0] selects
        multipliers[0], and so on (default ``(1.0, 1.5, 2.25, 3.0)``).

    Raises
    ------
    InvalidArgument
        A value breaks its rule; ``field`` is ``"congestion.<field>"``.
    """

    window: float = 60.0
    bins: int = 60
    thresholds: tuple[float, ...] = (0.5, 1.0, 2.0)
    multipliers: tuple[float, ...] = (1.0, 1.5, 2.25, 3.0)

    def __post_init__(self) -> None:
        if real(self.window, "congestion.window", hi=MAX_DURATION) <= 0:
            raise InvalidArgument("congestion.window", "must be > 0 seconds", self.window)
        if not isinstance(self.bins, int) or not 1 <= self.bins <= 3600:
            raise InvalidArgument("congestion.bins", "must be an integer in [1, 3600]", self.bins)
        if len(self.thresholds) != 3 or len(self.multipliers) != 4:
            raise InvalidArgument("congestion.thresholds",
                                  "need 3 thresholds and 4 multipliers", self.thresholds)
        if list(self.thresholds) != sorted(self.thresholds) or min(self.thresholds) < 0:
            raise InvalidArgument("congestion.thresholds", "must be increasing and >= 0",
                                  self.thresholds)
        for i, m in enumerate(self.multipliers):
            real(m, f"congestion.multipliers[{i}]", hi=MAX_MULTIPLIER)
        for i, x in enumerate(self.thresholds):
            real(x, f"congestion.thresholds[{i}]", hi=1e6)
