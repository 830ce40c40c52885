"""One simulated agent's consumption of one flow dimension (SPEC §5): a queue of tasks
waiting for their input, served by the broker's ``consume`` with its ``retry_after``."""

from __future__ import annotations

import math
from collections import deque
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from .agents import ScienceAgent

__all__ = ["FlowStream", "EPS"]

EPS = 1e-6


class FlowStream:
    """One agent's consumption of one flow dimension: tasks wait in order for their
    remaining amount; each call asks for everything outstanding, hands what was allowed to
    the tasks in order, and — when throttled — waits the ``retry_after`` the broker gave."""

    def __init__(self, agent: "ScienceAgent", dim: str, remaining: np.ndarray, state: int,
                 on_done: Any) -> None:
        self.agent, self.dim, self.rem, self.state = agent, dim, remaining, state
        self.on_done = on_done
        self.q: deque[int] = deque()
        self.total = 0.0
        self.next_ok = 0.0
        self.scheduled = False
        self.calls = self.throttled = 0
        self.recent: deque[tuple[float, float, float]] = deque()  # (t, asked, allowed)

    def add(self, t: float, task: int) -> None:
        if self.rem[task] <= EPS:
            self.rem[task] = 0.0
            self.on_done(t, task)
            return
        self.q.append(task)
        self.total += self.rem[task]
        self.kick(t)

    def drop(self, task: int) -> None:
        """The task left the stream (killed); its progress stays in ``remaining``."""
        self.total = max(0.0, self.total - self.rem[task])

    def kick(self, t: float) -> None:
        if not self.scheduled and self.q:
            self.scheduled = True
            self.agent.sim.at(max(t, self.next_ok), self._call)

    def _call(self, t: float) -> None:
        self.scheduled = False
        st = self.agent.state
        while self.q and st[self.q[0]] != self.state:
            self.q.popleft()
        if not self.q:
            self.total = 0.0
            return
        ask = self.total
        c = self.agent.consume(self.dim, ask)
        got = c.allowed
        self.calls += 1
        self.recent.append((t, ask, got))
        while self.recent and self.recent[0][0] < t - 60.0:
            self.recent.popleft()
        left = got
        while self.q and left > EPS:
            task = self.q[0]
            if st[task] != self.state:
                self.q.popleft()
                continue
            r = self.rem[task]
            if r <= left + EPS:
                left -= r
                self.total -= r
                self.rem[task] = 0.0
                self.q.popleft()
                self.on_done(t, task)
            else:
                self.rem[task] = r - left
                self.total -= left
                left = 0.0
        if got < ask - EPS:
            self.throttled += 1
            wait = c.retry_after
            if not math.isfinite(wait):
                return                      # never: this agent has no access to the dimension
            self.next_ok = t + max(wait, 1e-3)
        else:
            self.next_ok = t
        if not self.q:
            self.total = 0.0
        self.kick(t)

    def throttle_ratio(self) -> float:
        """Share of what was asked in the last minute that was held back."""
        asked = sum(a for _, a, _ in self.recent)
        return 0.0 if asked <= 0 else 1.0 - sum(g for _, _, g in self.recent) / asked

    def rate(self, t: float) -> float:
        """Units per second allowed over the last minute."""
        if not self.recent:
            return 0.0
        return sum(g for _, _, g in self.recent) / max(1.0, min(60.0, t - self.recent[0][0] + 1.0))
