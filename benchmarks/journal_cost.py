"""Decisions per second with no journal, the in-memory journal and SQLite (group commit).

python benchmarks/journal_cost.py      (numbers go to benchmarks/RESULTS.md by hand)
"""

import math
import os
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
    d = tempfile.mkdtemp()
    for label, mk in [("no journal", lambda: None), ("memory", MemoryJournal),
                      ("sqlite batch=4096", lambda: SQLiteJournal(os.path.join(d, f"j{time.time_ns()}.db"),
                                                                  batch=4096))]:
        print(f"{label:20s} admit_batch {run(mk()):>12,.0f}/s   acquire {run(mk(), n=5000, single=True):>10,.0f}/s")
    sys.exit(0)
