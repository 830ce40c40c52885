"""One worker's claim + complete rate, this tree's queue against another revision's,
interleaved: the two queues take turns in short rounds, so both see the same moments of a
shared machine's load and disk (single back-to-back runs of a few seconds each compare
the minutes, not the queues: an fsync costs 0.05 ms one second and 10 ms the next).

One process, one handle per queue (``worker="w0"``), each queue on local disk with the
same settings and ``--tasks`` no-op tasks; a round is ``--chunk`` claim → complete pairs
on one queue, then as many on the other (the order alternating from round to round).
Reported: claims + completions per second of each queue over all its rounds, the
quartiles of the per-round ratio new / old (each ratio taken from two adjacent rounds),
and each queue's CPU time per task (which the machine's load hardly moves).
Every run is verified afterwards (every task done once, ``check() == []``).

Usage::

    python benchmarks/runtime/queue_one_worker.py --old-rev REV [--durable yes]
        [--tasks 6000] [--chunk 50] [--dir /var/tmp]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from queue_scaling import load_impl  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--old-rev", required=True)
    p.add_argument("--durable", choices=("yes", "no"), default="yes")
    p.add_argument("--tasks", type=int, default=6000)
    p.add_argument("--chunk", type=int, default=50)
    p.add_argument("--dir", default=tempfile.gettempdir())
    a = p.parse_args(argv)
    durable = a.durable == "yes"
    work = tempfile.mkdtemp(prefix="queue-one-", dir=a.dir)
    try:
        qs = {}
        for impl in ("new", "old"):
            mod = load_impl(impl, a.old_rev)
            root = os.path.join(work, impl)
            mod.TaskQueue.create(root, mod.QueueConfig(durable=durable), lock="fcntl")
            q = mod.TaskQueue(root, worker="w0")
            q.put_many([(f"t{i:06d}", None) for i in range(a.tasks)])
            qs[impl] = q
        spent = {"new": [], "old": []}
        cpu = {"new": 0.0, "old": 0.0}
        done = {"new": 0, "old": 0}
        load = os.getloadavg()[0]
        r = 0
        while done["new"] < a.tasks and done["old"] < a.tasks:
            order = ("new", "old") if r % 2 == 0 else ("old", "new")
            for impl in order:
                q = qs[impl]
                n = min(a.chunk, a.tasks - done[impl])
                t, u = time.perf_counter(), time.process_time()
                for _ in range(n):
                    c = q.claim(0)
                    if c is None or not q.complete(c, None):
                        raise SystemExit(f"{impl}: claim or complete failed")
                spent[impl].append((time.perf_counter() - t) / n)
                cpu[impl] += time.process_time() - u
                done[impl] += n
            r += 1
        problems = []
        for impl, q in qs.items():
            counts = q.counts()
            if counts["done"] != a.tasks or q.check():
                problems.append(f"{impl}: {counts} {q.check()[:3]}")
        new, old = np.array(spent["new"]), np.array(spent["old"])
        ratio = old / new  # > 1: the new queue is faster
        q1, q2, q3 = np.percentile(ratio, [25, 50, 75])
        print(f"durable={a.durable} tasks={a.tasks} rounds={len(ratio)} chunk={a.chunk} "
              f"load={load:.1f}")
        print(f"claims+completions/s new {2 / new.mean():,.0f} old {2 / old.mean():,.0f} "
              f"(ratio of totals {old.mean() / new.mean():.3f}); per-round rate ratio new/old "
              f"quartiles {q1:.3f} / {q2:.3f} / {q3:.3f}; CPU ms per task new "
              f"{1e3 * cpu['new'] / a.tasks:.3f} old {1e3 * cpu['old'] / a.tasks:.3f}; "
              f"{'verified' if not problems else 'NOT VERIFIED ' + '; '.join(problems)}")
        return 0 if not problems else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
