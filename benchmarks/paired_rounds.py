"""Two builds of bursarcore, timed round by round in turn: a per-round ratio that the host's
load swings cancel out of.

On a shared machine the same build's median moves by up to 2x from one minute to the next,
so two builds run one after the other compare the minutes, not the builds. Here one
process per build sets up the same workload, and the parent lets them run one round each
in turn (A B, then B A, ...), so both see the same moment; the ratio B/A of each pair of
rounds is the measure, summarised by its quartiles.

    python benchmarks/paired_rounds.py OLD/src NEW/src [--workload summary-batch]
        [--pairs 3] [--rounds 40]

``OLD/src`` and ``NEW/src`` are the ``src`` directories of two checkouts with their
extensions built in place (``BURSAR_BUILD_ONLY=_engine,_acquire,_results python setup.py
build_ext --inplace``: the modules that compile the engine's rules). Workloads
(``benchmarks/test_bench_engine.py``):

- ``summary-batch``: ``admit_batch`` at 10,000 campaigns, every intent granted, the lease
  store grown beforehand (so no round pays for a growth): a round is one batch of 10,000;
- ``tree-batch``: ``admit_batch`` of 10,000 intents over the 10,000 leaves of a tree of
  envelopes of depth 3 (``test_tree_batch``), the lease store grown beforehand;
- ``batch``: the realistic ``admit_batch`` of 10,000 plus ``poll()`` (expiries, pending);
- ``summary-acquire``: 10,000 ``acquire`` calls at 10,000 campaigns plus ``poll()``;
- ``acquire``: the realistic ``acquire`` (``test_acquire``) at 10,000 campaigns, 1,000
  calls plus ``poll()`` a round, the clock moving on every call past a standing pending
  queue of ~60 keys (two rounds of traffic before timing);
- ``summary-batch-100``, ``batch-100``, ``summary-acquire-100``, ``acquire-100``: the same
  at 100 campaigns (a batch is one intent per campaign: a round of the two batch workloads
  is 100 batches of 100, the clock moving as at 10,000);
- ``journal-memory``, ``journal-sqlite``: 5,000 ``acquire`` calls (2 GPUs for 5 s, 1,000
  campaigns, the clock 10 ms on per call) plus ``sync()``, journaled in a ``MemoryJournal``
  or a new ``SQLiteJournal`` (group commit of 4,096);
- ``sim``: the default simulation (``python -m bursarcore simulate``: 7,200 simulated s,
  journaled, no report), built and run from scratch each round.

``--engine cffi`` runs the new build's broker with ``BURSARCORE_BACKEND=cffi`` (its engine's
kernels through the cffi binding) on the engine workloads.

Token buckets and flow dimensions (``benchmarks/test_bench_buckets.py``, ``test_bench_flow.py``),
each on the fastest bucket class a build has (``--buckets cffi`` asks for the cffi binding;
an old build without it uses its compiled class):

- ``buckets-batch``: ``try_debit_batch`` of 1,000,000 requests over 10,000 buckets (float
  amounts, one instant);
- ``buckets-single``: 10,000 ``try_debit`` calls;
- ``flow-batch``: ``consume_batch`` of 1,000,000 requests, 10,000 campaigns, the
  ``congested`` workload (every request computes its exact ``retry_after``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
N = 10_000


def _buckets_class(name: str):
    from bursarcore.buckets import BACKENDS
    for key in (name, "cython", "compiled"):
        if key in BACKENDS:
            return BACKENDS[key]
    raise SystemExit(f"no compiled bucket class in {list(BACKENDS)}")


def _child(src: str, workload: str, rounds: int, seed: int) -> None:
    sys.path.insert(0, src)
    sys.path.insert(0, HERE)
    import numpy as np

    import bursarcore
    import bursarcore.broker
    if not hasattr(bursarcore.broker, "BACKENDS"):    # an old build names only its ENGINES
        bursarcore.broker.BACKENDS = tuple(bursarcore.broker.ENGINES)
    from test_bench_engine import STEP, intents, make_broker, summary_broker, warm

    if not bursarcore.__file__.startswith(os.path.abspath(src)):
        raise SystemExit(f"bursarcore imported from {bursarcore.__file__}, not {src}")
    rng = np.random.default_rng(seed)
    one = None
    n = 100 if workload.endswith("-100") else N     # campaigns
    per = N // n                                    # batches of n a round
    workload = workload.removesuffix("-100")
    if workload.startswith(("buckets-", "flow-", "journal-", "sim")):
        one = _small_workload(workload, rng, rounds)
    elif workload == "summary-batch":
        b = summary_broker("compiled", n)
        b.st.grow_leases(rounds * N + 2 * N)
        u = np.full(n, 2, dtype=np.int64)
        work = [rng.integers(0, n, n) for _ in range(rounds * per)]
        clock = {"t": 0.0}

        def one(i):
            for w in work[i * per:(i + 1) * per]:
                clock["t"] += 0.01 / per
                b.admit_batch(w, u, 5.0, now=clock["t"])
    elif workload == "tree-batch":
        from test_bench_engine import tree_broker
        b, leaves = tree_broker("compiled")
        b.st.grow_leases(rounds * N + 2 * N)
        u = np.full(N, 2, dtype=np.int64)
        work = [leaves[rng.integers(0, N, N)] for _ in range(rounds)]
        clock = {"t": 0.0}

        def one(i):
            clock["t"] += 0.01
            b.admit_batch(work[i], u, 5.0, now=clock["t"])
    elif workload == "batch":
        b, rng = make_broker("compiled", n, seed=7 + seed)
        clock = {"t": warm(b, rng, n)}
        work = [intents(rng, n, n) for _ in range(rounds * per)]

        def one(i):
            for w in work[i * per:(i + 1) * per]:
                clock["t"] += STEP
                b.admit_batch(*w, now=clock["t"])
                b.poll()
    elif workload == "summary-acquire":
        from bursarcore import Intent
        b = summary_broker("compiled", n)
        names = b.campaigns
        calls = [Intent(names[c], {"gpu": 2}, duration=5.0)
                 for c in rng.integers(0, n, N * (rounds + 2)).tolist()]
        acquire, advance = b.acquire, b.clock.advance

        def one(i):
            for j, intent in enumerate(calls[i * N:(i + 1) * N]):
                if j % 100 == 0:
                    advance(0.01)
                acquire(intent)
            b.poll()
        one(rounds)         # two rounds of traffic before timing (leases live 5 s)
        one(rounds + 1)
    elif workload == "acquire":
        from bursarcore import Intent
        from test_bench_engine import CALLS_SINGLE
        b, rng = make_broker("compiled", n, seed=7 + seed)
        warm(b, rng, n)
        ci, u, dur = intents(rng, n, CALLS_SINGLE * (rounds + 2))
        names = b.campaigns
        calls = [Intent(names[c], {"gpu": (int(lo), int(hi))}, duration=float(d))
                 for c, (lo, hi), d in zip(ci.tolist(), u.tolist(), dur.tolist())]
        acquire, advance, dt = b.acquire, b.clock.advance, STEP / n

        def one(i):
            for intent in calls[(i + 2) * CALLS_SINGLE:(i + 3) * CALLS_SINGLE]:
                advance(dt)
                acquire(intent)
            b.poll()
        one(-2)
        one(-1)
    elif one is None:
        raise SystemExit(f"unknown workload {workload!r}")
    print("ready", flush=True)
    for i in range(rounds):
        sys.stdin.readline()
        t0 = time.perf_counter()
        one(i)
        print(f"{time.perf_counter() - t0:.9f}", flush=True)


def _small_workload(workload: str, rng, rounds: int):
    import numpy as np
    clock = {"t": 0.0}
    base, _, which = workload.partition(":")
    if base == "buckets-batch":
        b = _buckets_class(which)(np.full(N, 1e3), np.full(N, 10.0))
        work = [rng.integers(0, N, 1_000_000).astype(np.int64) for _ in range(2)]
        amounts = np.full(1_000_000, 0.001)

        def one(i):
            clock["t"] += 0.01
            b.try_debit_batch(work[i % 2], amounts, clock["t"])
    elif base == "buckets-single":
        b = _buckets_class(which)(np.full(N, 1e3), np.full(N, 10.0))
        idx = rng.integers(0, N, N).tolist()

        def one(i):
            t0 = clock["t"] = clock["t"] + 0.01
            debit = b.try_debit
            for k, c in enumerate(idx):
                debit(c, 0.001, t0 + k * 1e-7)
    elif base == "flow-batch":
        from test_bench_flow import WORKLOADS, _engine
        from bursarcore.flow import FLOW_BACKENDS
        fe = _engine(FLOW_BACKENDS["compiled"], "congested")
        work = [rng.integers(0, N, 1_000_000).astype(np.int64) for _ in range(2)]
        amounts = np.full(1_000_000, WORKLOADS["congested"][-1])

        def one(i):
            clock["t"] += 0.01
            fe.consume_batch(work[i % 2], 0, amounts, clock["t"])
    elif base.startswith("journal-"):
        import atexit
        import shutil
        import tempfile
        from bursarcore import Broker, Envelope, Intent, ManualClock, Pool
        from bursarcore.journal import MemoryJournal, SQLiteJournal
        if base == "journal-memory":
            journal = MemoryJournal()
        else:   # a new file: the current build asks for create=True, the old one has no such flag
            d = tempfile.mkdtemp()
            atexit.register(shutil.rmtree, d, True)
            path = os.path.join(d, "j.db")
            try:
                journal = SQLiteJournal(path, batch=4096, create=True)
            except TypeError:
                journal = SQLiteJournal(path, batch=4096)
        b = Broker(Pool(gpu=1_000_000), clock=ManualClock(0.0), journal=journal)
        for c in range(1000):
            b.register(f"c{c}", Envelope(credits=float("inf"), sustained={"gpu": 100},
                                         ceiling={"gpu": 1000}, burst={"gpu": 1e6}))
        b.sync()
        calls = [Intent(f"c{c}", {"gpu": 2}, duration=5.0)
                 for c in rng.integers(0, 1000, 5000 * (rounds + 2)).tolist()]

        def one(i):
            for intent in calls[(i + 2) * 5000:(i + 3) * 5000]:
                b.clock.advance(0.01)
                b.acquire(intent)
            b.sync()
        one(-2)
        one(-1)
    elif base == "sim":
        from bursarcore.sim import Simulation, load_scenario
        sc = load_scenario("default")

        def one(i):
            Simulation(sc).run()
    else:
        raise SystemExit(f"unknown workload {workload!r}")
    return one


def _quartiles(x: list[float]) -> tuple[float, float, float]:
    x = sorted(x)
    q = lambda f: x[int(f * (len(x) - 1))]  # noqa: E731
    return q(0.25), q(0.5), q(0.75)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a", help="the src directory of the first (old) build")
    ap.add_argument("b", help="the src directory of the second (new) build")
    ap.add_argument("--workload", default="summary-batch",
                    choices=("summary-batch", "tree-batch", "batch", "summary-acquire", "acquire",
                             "summary-batch-100", "batch-100", "summary-acquire-100",
                             "acquire-100", "journal-memory", "journal-sqlite", "sim",
                             "buckets-batch", "buckets-single", "flow-batch"))
    ap.add_argument("--buckets", default="cython", choices=("cython", "cffi"),
                    help="the new build's bucket class (buckets-* workloads; the old build's "
                         "is its fastest)")
    ap.add_argument("--engine", default="cython", choices=("cython", "cffi"),
                    help="the binding the new build's broker calls its engine through "
                         "(engine workloads; the old build's is its default)")
    ap.add_argument("--pairs", type=int, default=3, help="process pairs, each a new seed")
    ap.add_argument("--rounds", type=int, default=40, help="rounds per process (2 untimed)")
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        src, workload, rounds, seed = args.child
        return _child(src, workload, int(rounds), int(seed))
    # the old build's bucket class is its fastest; --buckets picks the new build's
    sides = [args.workload, args.workload]
    if args.workload.startswith("buckets-"):
        sides = [f"{args.workload}:cython", f"{args.workload}:{args.buckets}"]
    ta, tb, ratio = [], [], []
    for seed in range(args.pairs):
        env_b = dict(os.environ)
        if args.engine == "cffi" and not args.workload.startswith(("buckets-", "flow-",
                                                                      "journal-", "sim")):
            env_b["BURSARCORE_BACKEND"] = "cffi"
        ps = [subprocess.Popen([sys.executable, __file__, "x", "x", "--child", src,
                                side, str(args.rounds), str(seed)],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                               env=env)
              for src, side, env in zip((args.a, args.b), sides, (dict(os.environ), env_b))]
        for p in ps:
            if p.stdout.readline().strip() != "ready":
                raise SystemExit("a child failed to start (see its traceback above)")
        for i in range(args.rounds):
            got = {}
            for p in (ps if i % 2 == 0 else ps[::-1]):
                p.stdin.write("\n")
                p.stdin.flush()
                got[p.pid] = float(p.stdout.readline())
            if i >= 2:
                a, b = got[ps[0].pid], got[ps[1].pid]
                ta.append(a)
                tb.append(b)
                ratio.append(b / a)
        for p in ps:
            p.stdin.close()
            p.wait()
    for name, src, t in (("A", args.a, ta), ("B", args.b, tb)):
        q1, q2, _ = _quartiles(t)
        print(f"{name} {src}: best {min(t) * 1e3:.3f} ms, p25 {q1 * 1e3:.3f}, "
              f"median {q2 * 1e3:.3f}")
    q1, q2, q3 = _quartiles(ratio)
    print(f"B/A per round ({args.workload}, {len(ratio)} pairs of rounds): "
          f"p25 {q1:.3f}, median {q2:.3f}, p75 {q3:.3f}")


if __name__ == "__main__":
    main()
