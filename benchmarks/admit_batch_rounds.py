"""``test_admit_batch`` (compiled, 10,000 campaigns) for more rounds, timed in CPU time.

The same broker, warm-up and intents as ``benchmarks/test_bench_engine.py``; each round is
``admit_batch`` of 10,000 intents 20 s after the last, then ``poll()``. Prints the best,
10th-percentile and median round in ms of this thread's CPU time (``time.thread_time``:
on a shared machine, time spent descheduled is not counted). With ``READY=seconds`` it
prints "ready" after the set-up and sleeps that long, to attach ``perf record -p``.

    OPENBLAS_NUM_THREADS=1 PYTHONPATH=src python benchmarks/admit_batch_rounds.py 100
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_bench_engine import STEP, intents, make_broker, warm  # noqa: E402


def main(rounds: int) -> None:
    n = 10_000
    b, rng = make_broker("compiled", n)
    t = warm(b, rng, n)
    work = [intents(rng, n, n) for _ in range(rounds)]
    if os.environ.get("READY"):
        print("ready", flush=True)
        time.sleep(float(os.environ["READY"]))
    ts, nev = [], 0
    for ci, u, dur in work:
        t += STEP
        t0 = time.thread_time()
        b.admit_batch(ci, u, dur, now=t)
        nev += len(b.poll())
        ts.append(time.thread_time() - t0)
    ms = np.array(ts) * 1e3
    print(f"best {ms.min():.3f} p10 {np.percentile(ms, 10):.3f} median {np.median(ms):.3f} ms "
          f"per round of {n:,}; expired events per round {nev / rounds:.0f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 100)
