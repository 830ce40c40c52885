"""Population agents: thousands of campaigns driven as arrays (large scenarios).

A :class:`PopulationGroup` owns ``count`` campaigns registered with one envelope. Every
``step`` seconds it draws the step's job arrivals (numpy, from its own seeded generator),
runs the per-step kernel (:mod:`bursarcore.sim.kernels`, numba when installed) and asks
the broker for everything at once: one :meth:`~bursarcore.Broker.supply` (the pool's
free units and congestion multiplier), one :meth:`~bursarcore.Broker.admit_batch` for all
the campaigns that want GPUs (capped at the free units, so the compiled loop decides
nearly all of them) and, when the pool has a filesystem, one
:meth:`~bursarcore.Broker.consume_batch` for the step's reads, whose throttling slows the
next step's progress. Lease ends reach the group through the ledger like any agent's.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .kernels import get_step
from .scenario import PopulationSpec

__all__ = ["PopulationGroup"]


class _Member:
    """The ledger's view of one campaign of a group (hooks forward to the group)."""

    __slots__ = ("group", "k", "name", "index")

    def __init__(self, group: "PopulationGroup", k: int) -> None:
        self.group, self.k = group, k
        self.index = group.first + k
        self.name = group.sim.names[self.index]

    def lease_active(self, lid: int, n: int, expiry: float | None, t: float) -> None:
        self.group.held[self.k] += n

    def lease_ended(self, lid: int, n: int, t: float, how: str) -> None:
        self.group.held[self.k] -= n

    def lease_starting(self, lid: int, n: int, t: float) -> None:
        pass

    def lease_renewed(self, lid: int, expiry: float | None) -> None:
        pass

    def intent_granted(self, iid: int, lid: int, t: float) -> None:
        self.group.pending[self.k] = False

    def intent_refused(self, iid: int, reason: str | None, t: float) -> None:
        self.group.pending[self.k] = False

    def preempt_notice(self, lid: int, deadline: float | None, t: float) -> None:
        pass


class PopulationGroup:
    def __init__(self, sim: Any, spec: PopulationSpec, first: int, rng: np.random.Generator,
                 use_numba: bool | None = None) -> None:
        self.sim, self.spec, self.first, self.rng = sim, spec, first, rng
        n = spec.count
        self.n = n
        p = spec.behaviour
        self.p = p
        env, dim = spec.envelope, sim.dim
        self.s = np.full(n, env.s(dim))
        self.b = np.full(n, env.b(dim))
        B = env.B(dim)
        self.B = np.full(n, B if math.isfinite(B) else 1e18)
        self.tokens = self.B.copy()
        self.queue = np.zeros(n)
        self.held = np.zeros(n)
        self.prev = np.zeros(n)         # what each held during the step that just ended
        self.pending = np.zeros(n, dtype=bool)
        self.io_factor = np.ones(n)
        self.greedy = (rng.random(n) < p["greedy_fraction"]).astype(np.int8)
        self.want = np.zeros(n, dtype=np.int64)
        self.done = np.zeros(n)
        self.idx = np.arange(first, first + n, dtype=np.int64)
        self.kernel, self.kernel_name = get_step(use_numba)
        self.has_fs = "fs" in sim.sc.pool.flow and env.b("fs") > 0
        self.science = 0.0
        self.kernel_seconds = 0.0
        self.asked = self.granted = self.steps = 0
        self._members = [_Member(self, k) for k in range(n)]

    def member(self, k: int) -> _Member:
        return self._members[k]

    def start(self) -> None:
        self.sim.at(0.0, self._step)

    def _step(self, t: float) -> None:
        import time

        sim, p = self.sim, self.p
        dt = p["step"]
        n = self.n
        self.steps += 1
        # arrivals over the coming step (drawn in numpy whatever the kernel)
        k = self.rng.poisson(p["arrival_rate"] * dt, n)
        g = self.rng.integers(p["job_gpus"][0], p["job_gpus"][1] + 1, n)
        sec = self.rng.uniform(p["job_seconds"][0], p["job_seconds"][1], n)
        arrivals = k * g * sec
        sup = sim._b_supply(sim.names[self.first]).dims[sim.dim]
        t0 = time.perf_counter()
        self.kernel(self.queue, self.prev, self.held, arrivals, self.io_factor, self.tokens, self.s,
                    self.b, self.B, float(p["lease"]), float(dt), self.greedy,
                    float(sup.multiplier), self.want, self.done)
        self.kernel_seconds += time.perf_counter() - t0
        self.science += float(self.done.sum())
        want = self.want
        want[self.pending] = 0
        ask = np.flatnonzero(want > 0)
        if ask.size:
            # first come, first served within the free units (the compiled loop decides
            # them; only what does not fit would drop to the pending queue)
            cum = np.cumsum(want[ask])
            ask = ask[cum <= max(0, sup.free - 1)]
        if ask.size:
            units = np.stack([np.ones(ask.size, np.int64), want[ask]], axis=1)
            dur = float(p["lease"])
            res = sim._b_admit_batch(self.idx[ask], units, dur)
            sim.decision_counts["acquire"] += int(ask.size)
            self.asked += int(ask.size)
            granted = res.outcome == 0
            self.granted += int(granted.sum())
            hs = self.held
            # mirror the prepaid debit so the next step asks only for what tokens cover
            n_g = res.granted.astype(float)
            h0 = hs[ask] - 0.0
            excess = np.maximum(0.0, h0 + n_g - self.s[ask]) - np.maximum(0.0, h0 - self.s[ask])
            self.tokens[ask] = np.maximum(0.0, self.tokens[ask] - excess * dur)
            self.pending[ask[res.outcome == 2]] = True
            sim.ledger.on_batch(self.idx[ask], t, res, np.full(ask.size, dur), True,
                                maybe_starting=bool(sim.sc.by_agent("backfill")))
            if res.outcome.size and (res.outcome == 2).any():
                sim.wake(t + sim.sc.broker["ttl"])
        self.prev[:] = self.held
        if self.has_fs:
            busy = np.flatnonzero(self.held > 0)
            if busy.size:
                amt = self.held[busy] * dt * p["io_per_gpu_second"]
                allowed, _ = sim._b_consume_batch(self.idx[busy], "fs", amt)
                sim.decision_counts["consume"] += int(busy.size)
                self.io_factor[:] = 1.0
                self.io_factor[busy] = np.where(amt > 0, allowed / np.maximum(amt, 1e-12), 1.0)
        nxt = t + dt
        if nxt <= sim.duration:
            sim.at(nxt, self._step)

    def finish(self, t: float) -> None:
        pass

    def summary(self) -> dict:
        return {"name": self.spec.name, "count": self.n, "kernel": self.kernel_name,
                "kernel_seconds": self.kernel_seconds, "steps": self.steps,
                "requests": self.asked, "granted": self.granted,
                "gpu_seconds_of_work_done": self.science,
                "queue_left_gpu_seconds": float(self.queue.sum()),
                "greedy": int(self.greedy.sum())}
