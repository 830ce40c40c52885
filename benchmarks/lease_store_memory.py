"""The lease store's size and the process's resident memory under churn (docs/policy.md,
"Memory"). Two workloads, compiled backend, no journal:

* ``small``: ``admit_batch`` of 100 one-GPU, 1 s leases every simulated second (at most
  100 live), 1,000,000 leases;
* ``large``: ``admit_batch`` of 1,000 two-GPU, 5 s leases every 50 ms at 1,000 campaigns
  (100,000 live in the steady state), 2,000,000 leases.

Run: ``PYTHONPATH=src python benchmarks/lease_store_memory.py small|large``.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from bursarcore import Broker, Envelope, ManualClock, Pool

INF = float("inf")


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
    return float("nan")


def main(which: str) -> None:
    clk = ManualClock(0.0)
    if which == "small":
        b = Broker(Pool(gpu=1000), clk, backend="compiled")
        b.register("a", Envelope(credits=INF, sustained={"gpu": 1000}, ceiling={"gpu": 1000},
                                 burst={"gpu": INF}))
        ci, u, dur, step, rounds = np.zeros(100, np.int64), np.ones(100, np.int64), 1.0, 1.0, 10_000
    else:
        b = Broker(Pool(gpu=400_000), clk, backend="compiled")
        for i in range(1000):
            b.register(f"c{i}", Envelope(credits=INF, sustained={"gpu": 1000},
                                         ceiling={"gpu": 1000}, burst={"gpu": INF}))
        ci, u, dur, step, rounds = (np.arange(1000, dtype=np.int64), np.full(1000, 2, np.int64),
                                    5.0, 0.05, 2000)
    t0 = time.perf_counter()
    for i in range(rounds):
        clk.set(i * step)
        r = b.admit_batch(ci, u, dur)
        assert (r.outcome == 0).all()
        b.poll()
        if (i + 1) % (rounds // 5) == 0:
            st = b.st
            print(f"{(i + 1) * len(ci):>10,} leases: store rows {st.camp.shape[0]:>10,} "
                  f"(used {st.nleases:>10,}), rss {rss_mb():5.0f} MB, "
                  f"{time.perf_counter() - t0:6.2f} s")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "small")
