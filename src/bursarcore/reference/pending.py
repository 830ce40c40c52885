"""The reference broker's pending queue (SPEC §4.4, §4.5): waiting intents by id, in
arrival order, and per campaign (for the pending cap)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PendingIntent:
    """A waiting intent in engine units (SPEC §2): ``spend`` None for no ``max_spend``."""
    intent_id: int          # also its arrival order: ids grow
    campaign: int
    dim: int
    cls: int
    nmin: int
    nmax: int
    dur: int
    spend: int | None
    deadline: int | None
    expires: int            # min(arrival + TTL, deadline)


class PendingQueue:
    """Waiting intents, oldest first."""

    def __init__(self) -> None:
        self._all: dict[int, PendingIntent] = {}
        self._by_campaign: dict[int, dict[int, PendingIntent]] = {}

    def __bool__(self) -> bool:
        return bool(self._all)

    def __len__(self) -> int:
        return len(self._all)

    def add(self, p: PendingIntent) -> None:
        self._all[p.intent_id] = p
        self._by_campaign.setdefault(p.campaign, {})[p.intent_id] = p

    def remove(self, p: PendingIntent) -> None:
        del self._all[p.intent_id]
        mine = self._by_campaign[p.campaign]
        del mine[p.intent_id]
        if not mine:
            del self._by_campaign[p.campaign]

    def get(self, intent_id: int) -> PendingIntent | None:
        return self._all.get(intent_id)

    def all(self) -> list[PendingIntent]:
        return list(self._all.values())

    def of_campaign(self, c: int) -> list[PendingIntent]:
        return list(self._by_campaign.get(c, {}).values())
