"""A fixed run of ``admit_batch`` rounds for counting instructions per decision.

    valgrind --tool=callgrind --toggle-collect='__pyx_pw_10bursarcore_7_engine_*admit_batch*' \\
        python benchmarks/batch_drive.py SRC ROUNDS {flat,tree}

``SRC`` is the ``src`` directory of a checkout whose extensions were built in place without
the symbol table stripped (``link = []`` in ``setup.py``), so callgrind can find the batch's
entry point. Each round is ``admit_batch`` of 10,000 intents for 2 units for 5 s, at random
campaigns of the summary workload (``flat``) or random leaves of the depth-3 tree of
envelopes (``tree``), the clock 10 ms on per round; two more rounds run first. Instructions
per decision: the counts of two runs, ROUNDS = 8 and 3, apart, over 50,000.
"""

from __future__ import annotations

import os
import sys

N = 10_000


def main(src: str, rounds: int, kind: str) -> None:
    sys.path.insert(0, src)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import numpy as np
    from test_bench_engine import summary_broker, tree_broker

    if kind == "tree":
        b, targets = tree_broker("compiled")
    else:
        b, targets = summary_broker("compiled", N), np.arange(N)
    b.st.grow_leases((rounds + 3) * N)
    rng = np.random.default_rng(2)
    u = np.full(N, 2, dtype=np.int64)
    t = 0.0
    for _ in range(rounds + 2):
        t += 0.01
        res = b.admit_batch(targets[rng.integers(0, N, N)], u, 5.0, now=t)
    print("granted in the last round:", int((res.outcome == 0).sum()))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
