"""Tier policy of the task queue: pure functions, no I/O (SPEC §13, after RASER §3).

Tiers are numbered ``0 .. tiers-1``, higher meaning more memory per worker (each tier is
its own job array with its own ``--mem``). A task starts at its ``base_tier`` and moves up
one tier every ``promote_after`` failures, capped at the top tier::

    tier = min(tiers - 1, base_tier + failures // promote_after)

With ``promote_after=1`` and 3 tiers: fresh → tier 0, after one failure (say, killed for
memory) → tier 1, after two → tier 2, and it stays there.

A worker of tier ``w`` may run a task of tier ``t <= w`` (a big worker can run a small
task, never the reverse); with ``steal_down=False`` only ``t == w``. Among the tasks it may
run, it prefers, in order:

1. its own tier (``w - t`` smallest), so promoted tasks reach the big workers first and
   light tasks do not occupy them while heavy ones wait;
2. fresh tasks (fewest failures), so a low-tier worker spends its time on work likely to
   succeed rather than on retries that are drifting towards a higher tier;
3. submission order (``seq``), so the queue is FIFO otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InvalidArgument

__all__ = ["TierPolicy"]


@dataclass(frozen=True)
class TierPolicy:
    """How failures move tasks between tiers and which tasks a worker prefers."""

    tiers: int = 1
    promote_after: int = 1
    steal_down: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.tiers, int) or self.tiers < 1:
            raise InvalidArgument("tiers", "must be an integer >= 1", self.tiers)
        if not isinstance(self.promote_after, int) or self.promote_after < 1:
            raise InvalidArgument("promote_after", "must be an integer >= 1", self.promote_after)

    def check_tier(self, tier: int, field: str = "tier") -> int:
        if not isinstance(tier, int) or isinstance(tier, bool) or not 0 <= tier < self.tiers:
            raise InvalidArgument(field, f"must be an integer in [0, {self.tiers})", tier)
        return tier

    def tier_of(self, base_tier: int, failures: int) -> int:
        """The tier a task with ``failures`` failures runs in."""
        return min(self.tiers - 1, base_tier + failures // self.promote_after)

    def eligible(self, worker_tier: int, task_tier: int) -> bool:
        """May a worker of ``worker_tier`` run a task of ``task_tier``?"""
        return task_tier == worker_tier or (self.steal_down and task_tier < worker_tier)

    def class_preference(self, worker_tier: int, task_tier: int, failures: int) -> tuple[int, int]:
        """Sort key of a class of tasks (one tier, one failure count): rules 1 and 2."""
        return (worker_tier - task_tier, failures)

    def preference(self, worker_tier: int, task_tier: int, failures: int, seq: int) -> tuple[int, int, int]:
        """Sort key: the smallest key among eligible tasks is claimed first (the class's
        key, then ``seq``)."""
        return (*self.class_preference(worker_tier, task_tier, failures), seq)
