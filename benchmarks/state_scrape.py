"""What a metrics scrape costs the broker: ``state()`` against ``state(leases=False)``.

    PYTHONPATH=src python benchmarks/state_scrape.py [leases]

One campaign holds ``leases`` one-GPU leases (default 300,000, granted by one
``admit_batch``); each call is timed once. ``/metrics`` reads ``state(leases=False)``
under the service's lock, so its cost is what every other request waits for.
"""

from __future__ import annotations

import math
import sys
import time

import numpy as np

from bursarcore import Broker, Envelope, ManualClock, Pool


def main(n: int) -> None:
    b = Broker(Pool(gpu=n), clock=ManualClock(0.0))
    b.register("a", Envelope(credits=math.inf, sustained={"gpu": n}, ceiling={"gpu": n},
                             burst={"gpu": math.inf}))
    granted = b.admit_batch(np.zeros(n, dtype=np.int64), np.ones(n, dtype=np.int64), 600.0)
    assert int((granted.outcome == 0).sum()) == n
    for leases in (False, True):
        t0 = time.perf_counter()
        s = b.state(leases=leases)
        dt = time.perf_counter() - t0
        print(f"state(leases={leases}): {len(s['leases']):,} leases listed, {dt * 1e3:,.1f} ms")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 300_000)
