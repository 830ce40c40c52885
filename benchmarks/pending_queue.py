"""Acquire latency against a standing pending queue, both backends.

python benchmarks/pending_queue.py [calls] [backend ...]   (default: 2000 calls, compiled;
                                                           numbers go to RESULTS.md by hand)

The queue: ``CAMPAIGNS`` campaigns each hold their ceiling (100 GPUs) and wait on more:
``KEYS_PER_CAMPAIGN`` distinct keys each (durations 1 + k * 0.001 s, min = max = 100),
``depth`` intents per key, so 0, 10,000 (one per key) and 100,000 (ten per key) pending
intents over 10,000 distinct keys. They wait on their ceiling and cost nothing. Another
campaign then acquires 1 GPU for 50 ms ``calls`` times, the clock moving 1 ms before every
call (so every call serves the queue first, and its own leases expire as it goes). Each
call is timed alone; the line gives the median and the 99th percentile, and their ratio to
the same backend's empty queue. The per-campaign cap on pending intents (``max_pending``,
1024 by default) is not reached: each campaign keeps at most 1,000.

The ``tree`` lines put the same 100 waiting campaigns under 10 top-level nodes (10 children
each, SPEC §14), the acquiring campaign outside their trees: nothing it does can raise the
waiting nodes' limits, so their keys should cost it as little as the flat ones.
"""

from __future__ import annotations

import math
import os
import statistics
import sys
import time

from bursarcore import Broker, Envelope, Intent, ManualClock, Pool
from bursarcore.broker import BACKENDS

CAMPAIGNS = 100
KEYS_PER_CAMPAIGN = 100
INF = math.inf


def build(backend: str, depth: int, tree: bool = False) -> Broker:
    b = Broker(Pool(gpu=100_000, slots_per_node=1000), clock=ManualClock(0.0),
               backend=backend, ttl=86_400.0)
    env = Envelope(credits=INF, sustained={"gpu": 100}, ceiling={"gpu": 100}, burst={"gpu": INF})
    top = Envelope(credits=INF, sustained={"gpu": 1000}, ceiling={"gpu": 1000},
                   burst={"gpu": INF})
    for i in range(CAMPAIGNS):
        name = f"q{i}"
        if tree:
            if i % 10 == 0:
                b.register(f"p{i // 10}", top)
            name = f"p{i // 10}/q{i}"
        b.register(name, env)
        assert b.acquire(Intent(name, {"gpu": 100}, duration=1e5)).granted
        for k in range(KEYS_PER_CAMPAIGN if depth else 0):
            for _ in range(depth):
                d = b.acquire(Intent(name, {"gpu": 100}, duration=1 + k * 0.001))
                assert d.outcome == "pending" and d.reason == "ceiling", d
    b.register("m", Envelope(credits=INF, sustained={"gpu": 1000}, ceiling={"gpu": 1000},
                             burst={"gpu": INF}))
    assert len(b.pending()) == depth * CAMPAIGNS * KEYS_PER_CAMPAIGN
    return b


def measure(b: Broker, calls: int) -> tuple[float, float]:
    clock, acquire, perf = b.clock, b.acquire, time.perf_counter
    intent = Intent("m", {"gpu": 1}, duration=0.05)
    for _ in range(50):                      # warm up (first probes, caches)
        clock.advance(0.001)
        acquire(intent)
    out = []
    for _ in range(calls):
        clock.advance(0.001)
        t0 = perf()
        d = acquire(intent)
        out.append(perf() - t0)
        assert d.granted
    out.sort()
    return statistics.median(out), out[min(len(out) - 1, int(0.99 * len(out)))]


def main() -> None:
    calls = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    print(f"load average {os.getloadavg()[0]:.2f}; {calls} calls per line")
    for backend in sys.argv[2:] or ["compiled"]:
        if backend not in BACKENDS:
            raise SystemExit(f"backend {backend!r}: this build has {list(BACKENDS)}")
        base = None
        for depth, tree in ((0, False), (1, False), (10, False), (1, True), (10, True)):
            b = build(backend, depth, tree)
            med, p99 = measure(b, calls)
            if base is None:
                base = (med, p99)
            print(f"{backend:9s} {'tree' if tree else 'flat'} "
                  f"pending {depth * CAMPAIGNS * KEYS_PER_CAMPAIGN:7d} "
                  f"keys {CAMPAIGNS * KEYS_PER_CAMPAIGN if depth else 0:6d}: "
                  f"median {med * 1e6:9.2f} us ({med / base[0]:7.2f}x)  "
                  f"p99 {p99 * 1e6:9.2f} us ({p99 / base[1]:7.2f}x)", flush=True)
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
