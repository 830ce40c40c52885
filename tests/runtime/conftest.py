"""Fixtures for the runtime tests: a manual clock and a fresh queue directory."""

from __future__ import annotations

import pytest


class ManualClock:
    """A clock that moves only when told: ``clock()`` reads, ``advance(dt)`` moves."""

    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = float(t)

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> float:
        self.t += dt
        return self.t


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def qdir(tmp_path):
    return tmp_path / "queue"
