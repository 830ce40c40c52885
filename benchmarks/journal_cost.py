"""Decisions per second with no journal, the in-memory journal and SQLite (group commit).

python benchmarks/journal_cost.py [repeat]     (numbers go to benchmarks/RESULTS.md by hand)

A timed run is short (20,000 decisions: a few ms), so one preemption moves it a lot. The
three journals take turns ``repeat`` times (default 5); each line gives a journal's best
rate (timeit's habit: the least disturbed run), its ratio to the best no-journal rate of
the same invocation, and the medians. The load average is printed before and after.
"""

import math
import os
import statistics
import sys
import tempfile
import time

import numpy as np

from bursarcore import Broker, Envelope, Intent, ManualClock, Pool
from bursarcore.journal import MemoryJournal, SQLiteJournal


def run(journal, n=20_000, batch=1000, single=False):
    b = Broker(Pool(gpu=1_000_000, slots_per_node=1024), clock=ManualClock(0.0), journal=journal)
    for i in range(1000):
        b.register(f"c{i}", Envelope(credits=math.inf, sustained={"gpu": 100},
                                     ceiling={"gpu": 1000}, burst={"gpu": 1e6}))
    rng = np.random.default_rng(1)
    b.sync()  # registrations and the config header are committed before timing
    t0 = time.perf_counter()
    done = 0
    while done < n:
        if single:
            c = int(rng.integers(0, 1000))
            b.acquire(Intent(f"c{c}", units={"gpu": 2}, duration=5.0))
            done += 1
        else:
            b.admit_batch(rng.integers(0, 1000, batch), np.full(batch, 2), 5.0)
            done += batch
        b.clock.advance(0.01)
    b.sync()
    return done / (time.perf_counter() - t0)


if __name__ == "__main__":
    repeat = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    d = tempfile.mkdtemp()
    kinds = [("no journal", lambda: None), ("memory", MemoryJournal),
             ("sqlite batch=4096", lambda: SQLiteJournal(os.path.join(d, f"j{time.time_ns()}.db"),
                                                         batch=4096, create=True))]
    print(f"load average {os.getloadavg()}")
    rates: dict[str, list[list[float]]] = {label: [[], []] for label, _ in kinds}
    for _ in range(repeat):            # the kinds take turns, so passing load hits all alike
        for label, mk in kinds:
            rates[label][0].append(run(mk()))
            rates[label][1].append(run(mk(), n=5000, single=True))
    base = [max(v) for v in rates["no journal"]]
    for label, (batch, one) in rates.items():
        print(f"{label:20s} admit_batch {max(batch):>12,.0f}/s ({base[0] / max(batch):4.2f}x)"
              f"   acquire {max(one):>10,.0f}/s ({base[1] / max(one):4.2f}x)"
              f"   [medians {statistics.median(batch):,.0f} / {statistics.median(one):,.0f}]")
    print(f"load average {os.getloadavg()}")
    sys.exit(0)
