"""Full admission decisions per second: the held-dimension engine, compiled vs reference.

Every contender answers the same realistic stream (SPEC §4), generated once per size:

- a pool of 8 GPUs per campaign; every campaign ``agent-burst`` (congestion-priced) with
  g = 2, s = 8, b = 16 GPUs and a 3,600 GPU-s bucket; 90% hold 1e6 credits, 10% are
  broke (0.01 credits: their intents are refused with ``credits``);
- intents pick a campaign uniformly; 90% ask (1, 1..4) GPUs, 10% ask (17..20, +3), above
  the ceiling (refused with ``ceiling``); durations 5..60 s;
- time moves so that each campaign asks about once per 20 simulated seconds: leases expire
  as the clock advances (every round pays for its expiries, events included), the pool
  sits at a steady occupancy, and a small share of intents (< 1%) goes pending (TTL 60 s).

Benchmarks:

- ``batch``: ``Broker.admit_batch(idx, units, durations, now=t)`` with one intent per
  campaign per round (a batch of 100 or 10,000), ``t`` 20 s later each round, then
  ``poll()``. Decisions/round = the batch size.
- ``single``: ``Broker.acquire(Intent)`` one at a time (a ``Decision`` object per call,
  Intent objects built beforehand), the ManualClock advanced 20 s / campaigns before each
  call; 1,000 calls per round.
- ``summary`` (the workload of the targets in RESULTS_engine.md): ``Pool(gpu=1_000_000)``,
  campaigns with unlimited credits and tokens, s = b = 100,000 (Σ b overbooks the pool, as
  SPEC §3 allows); every intent asks 2 GPUs for 5 s. ``acquire``: 10,000 calls per round,
  the clock advanced 10 ms per 100 calls (so leases expire in the steady state: 100,000
  GPUs held, every intent granted); ``batch``: ``admit_batch`` of 10,000 at 10,000
  campaigns, 10 ms apart, all granted (the pool fills: no expiry within the run).
- ``saturated``: the ``summary`` ``acquire`` at 100 campaigns with b = 1,000, which is
  exactly each campaign's average demand: about 60 % of intents wait behind their ceiling
  in a queue thousands deep, so the row measures the pending-queue pass (every clock move
  serves the queue), not admission.
- ``kernel``: the engine without the broker: per round ``ring_advance`` + ``advance`` (the
  expiries) + ``admit_batch`` over an :class:`EngineState`, SLOW items skipped (the policy
  layer's share), so the figure is the kernel's ceiling.

Each benchmark warms the broker up with 5 untimed rounds (leases live at most 60 s, so the
pool is in its steady state). Run with (see benchmarks/RESULTS_engine.md)::

    OPENBLAS_NUM_THREADS=1 python -m pytest benchmarks/test_bench_engine.py --benchmark-only \
        --decisions-md=benchmarks/last-engine.md
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

from bursarcore import Broker, Envelope, Intent, ManualClock, Pool
from bursarcore.admission.state import MAXV, PPM, EngineState
from bursarcore.broker import BACKENDS, ENGINES

BACKENDS = list(BACKENDS)
SIZES = (100, 10_000)
STEP = 20.0                 # simulated seconds per round: each campaign asks ~once per STEP
WARMUP = 5                  # untimed rounds before measuring
NS = 1_000_000_000

ROUNDS_BATCH = {("compiled", 100): 300, ("compiled", 10_000): 20,
                ("reference", 100): 60, ("reference", 10_000): 3}
CALLS_SINGLE = 1_000
ROUNDS_SINGLE = {"compiled": 15, "reference": 5}
ROUNDS_KERNEL = {("compiled", 100): 2000, ("compiled", 10_000): 40,
                 ("reference", 100): 60, ("reference", 10_000): 3}

# ratios for the session summary (benchmarks/conftest.py prints RATIOS)
_RATIOS = []
for _n in SIZES:
    for _what in ("batch", "single", "kernel", "summary-single"):
        _RATIOS.append((f"{_what}, {_n:,} campaigns: compiled / reference",
                        f"engine/{_what}/compiled/{_n}", f"engine/{_what}/reference/{_n}"))
for _n in SIZES:
    _RATIOS.append((f"summary-single, {_n:,} campaigns: fast path / general path (compiled)",
                    f"engine/summary-single/compiled/{_n}",
                    f"engine/summary-single/compiled-general/{_n}"))
_RATIOS.append(("saturated-single, 100 campaigns: compiled / reference",
                "engine/saturated-single/compiled/100", "engine/saturated-single/reference/100"))
_RATIOS.append(("summary-batch, 10,000 campaigns: compiled / reference",
                "engine/summary-batch/compiled/10000", "engine/summary-batch/reference/10000"))
_conf = sys.modules.get("conftest")
if _conf is not None and str(getattr(_conf, "__file__", "")).endswith("benchmarks/conftest.py"):
    _conf.RATIOS.extend(r for r in _RATIOS if r not in _conf.RATIOS)


# -- the workload ----------------------------------------------------------------------------
def make_broker(backend: str, n: int, seed: int = 7) -> tuple[Broker, np.random.Generator]:
    rng = np.random.default_rng(seed)
    b = Broker(Pool(gpu=8 * n), clock=ManualClock(0.0), backend=backend, ttl=60.0)
    broke = rng.random(n) < 0.1
    for i in range(n):
        b.register(f"c{i}", Envelope(credits=0.01 if broke[i] else 1e6,
                                     service_class="agent-burst", guaranteed={"gpu": 2},
                                     sustained={"gpu": 8}, ceiling={"gpu": 16},
                                     burst={"gpu": 3600.0}))
    return b, rng


def intents(rng: np.random.Generator, n: int, m: int):
    """m intents over n campaigns: (campaign index, (min, max) units, duration seconds)."""
    ci = rng.integers(0, n, m)
    lo = np.ones(m, dtype=np.int64)
    hi = rng.integers(1, 5, m)
    over = rng.random(m) < 0.1
    lo[over] = rng.integers(17, 21, int(over.sum()))
    hi[over] = lo[over] + 3
    dur = rng.integers(5, 61, m).astype(float)
    return ci.astype(np.int64), np.stack([lo, hi], axis=1), dur


def warm(b: Broker, rng: np.random.Generator, n: int) -> float:
    t = b.clock.now()
    for _ in range(WARMUP):
        t += STEP
        b.admit_batch(*intents(rng, n, n), now=t)
    b.poll()
    return t


# -- Broker.admit_batch -----------------------------------------------------------------------
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_admit_batch(benchmark, record, backend, n):
    benchmark.group = f"engine: Broker.admit_batch, {n:,} campaigns"
    b, rng = make_broker(backend, n)
    t0 = warm(b, rng, n)
    rounds = ROUNDS_BATCH[backend, n]
    work = [intents(rng, n, n) for _ in range(rounds + 1)]
    it = {"i": 0, "t": t0, "granted": 0, "pending": 0}

    def one_round():
        ci, u, dur = work[it["i"]]
        it["i"] += 1
        it["t"] += STEP
        res = b.admit_batch(ci, u, dur, now=it["t"])
        b.poll()
        it["granted"] = int((res.outcome == 0).sum())
        it["pending"] = int((res.outcome == 2).sum())

    benchmark.pedantic(one_round, rounds=rounds, iterations=1, warmup_rounds=0)
    record(f"engine/batch/{backend}/{n}", f"admit_batch of {n:,}, {backend}", n,
           admitted=it["granted"] / n, pending=it["pending"] / n, leases=b.st.nleases)


# -- Broker.acquire ---------------------------------------------------------------------------
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_acquire(benchmark, record, backend, n):
    benchmark.group = f"engine: Broker.acquire, {n:,} campaigns"
    b, rng = make_broker(backend, n)
    warm(b, rng, n)
    rounds = ROUNDS_SINGLE[backend]
    ci, u, dur = intents(rng, n, CALLS_SINGLE * (rounds + 1))
    names = b.campaigns
    work = [Intent(names[c], {"gpu": (int(lo), int(hi))}, duration=float(d))
            for c, (lo, hi), d in zip(ci.tolist(), u.tolist(), dur.tolist())]
    dt = STEP / n
    clock, acquire = b.clock, b.acquire
    it = {"i": 0, "granted": 0}

    def one_round():
        i = it["i"]
        it["i"] += CALLS_SINGLE
        granted = 0
        for intent in work[i:i + CALLS_SINGLE]:
            clock.advance(dt)
            granted += acquire(intent).outcome == "granted"
        b.poll()
        it["granted"] = granted

    benchmark.pedantic(one_round, rounds=rounds, iterations=1, warmup_rounds=0)
    record(f"engine/single/{backend}/{n}", f"acquire x {CALLS_SINGLE:,}, {backend}",
           CALLS_SINGLE, admitted=it["granted"] / CALLS_SINGLE, leases=b.st.nleases)


# -- the summary workload ---------------------------------------------------------------
SUMMARY_CALLS = 10_000
SUMMARY_ROUNDS = {"compiled": 10, "compiled-general": 3, "reference": 3}


def summary_broker(backend: str, n: int, ceiling: int = 100_000) -> Broker:
    b = Broker(Pool(gpu=1_000_000), clock=ManualClock(0.0), backend=backend)
    for i in range(n):
        b.register(f"c{i}", Envelope(credits=float("inf"), service_class="agent-burst",
                                     sustained={"gpu": ceiling}, ceiling={"gpu": ceiling},
                                     burst={"gpu": float("inf")}))
    return b


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("backend", BACKENDS + (["compiled-general"] if "compiled" in ENGINES
                                                else []))
def test_summary_acquire(benchmark, record, backend, n):
    """``compiled-general``: the compiled engine without ``FastAcquire`` (the broker's
    general path, as before the fast path existed)."""
    _summary_acquire(benchmark, record, backend, n, "summary", 100_000)


@pytest.mark.parametrize("backend", BACKENDS)
def test_saturated_acquire(benchmark, record, backend):
    """The summary ``acquire`` with every campaign's ceiling at its average demand."""
    _summary_acquire(benchmark, record, backend, 100, "saturated", 1_000)


def _summary_acquire(benchmark, record, backend, n, what, ceiling):
    benchmark.group = f"engine: {what} workload, Broker.acquire, {n:,} campaigns"
    b = summary_broker(backend.split("-")[0], n, ceiling)
    if backend == "compiled-general":
        b._fast = None
    rng = np.random.default_rng(1)
    rounds = SUMMARY_ROUNDS[backend]
    names = b.campaigns
    total = SUMMARY_CALLS * (rounds + 2)
    work = [Intent(names[c], {"gpu": 2}, duration=5.0)
            for c in rng.integers(0, n, total).tolist()]
    clock, acquire = b.clock, b.acquire
    it = {"i": 0, "granted": 0}

    def one_round():
        i = it["i"]
        it["i"] += SUMMARY_CALLS
        granted = 0
        for j, intent in enumerate(work[i:i + SUMMARY_CALLS]):
            if j % 100 == 0:
                clock.advance(0.01)
            granted += acquire(intent).outcome == "granted"
        b.poll()
        it["granted"] = granted

    for _ in range(2):      # 2 s of traffic before measuring (leases live 5 s)
        one_round()
    benchmark.pedantic(one_round, rounds=rounds, iterations=1, warmup_rounds=0)
    record(f"engine/{what}-single/{backend}/{n}", f"{what} acquire x {SUMMARY_CALLS:,}, {backend}",
           SUMMARY_CALLS, admitted=it["granted"] / SUMMARY_CALLS, leases=b.st.nleases)


@pytest.mark.parametrize("backend", BACKENDS)
def test_summary_batch(benchmark, record, backend):
    n = 10_000
    benchmark.group = "engine: summary workload, Broker.admit_batch, 10,000 campaigns"
    _batch_rounds(benchmark, record, backend, summary_broker(backend, n), np.arange(n),
                  f"engine/summary-batch/{backend}/{n}", f"summary admit_batch of {n:,}, {backend}")


def _batch_rounds(benchmark, record, backend, b, targets, key, label):
    """Rounds of ``admit_batch`` of as many intents as ``targets`` (campaign indices), each
    for 2 units for 5 s at a random target, the clock 10 ms on per round."""
    n = targets.shape[0]
    rng = np.random.default_rng(2)
    rounds = 20 if backend == "compiled" else 2
    work = [targets[rng.integers(0, n, n)] for _ in range(rounds + 2)]
    u = np.full(n, 2, dtype=np.int64)
    it = {"i": 0, "t": 0.0, "granted": 0}

    def one_round():
        it["t"] += 0.01
        res = b.admit_batch(work[it["i"]], u, 5.0, now=it["t"])
        it["i"] += 1
        it["granted"] = int((res.outcome == 0).sum())

    for _ in range(2):
        one_round()
    benchmark.pedantic(one_round, rounds=rounds, iterations=1, warmup_rounds=0)
    st = getattr(b, "st", None)          # (the reference broker keeps no engine state)
    record(key, label, n, admitted=it["granted"] / n,
           leases=st.nleases if st is not None else len(b.leases()))


def tree_broker(backend: str, shape: tuple[int, ...] = (10, 10, 100),
                ceiling: int = 100_000) -> tuple[Broker, np.ndarray]:
    """The summary workload's envelopes as a tree of envelopes (SPEC §14): ``shape`` nodes
    per level (projects, campaigns per project, agents per campaign), every level
    unbudgeted with an unbounded bucket; the broker and the leaves' indices."""
    b = Broker(Pool(gpu=1_000_000), clock=ManualClock(0.0), backend=backend)
    env = Envelope(credits=float("inf"), service_class="agent-burst", sustained={"gpu": ceiling},
                   ceiling={"gpu": ceiling}, burst={"gpu": float("inf")})
    level = [""]
    for width in shape:
        level = [f"{p}/n{i}" if p else f"n{i}" for p in level for i in range(width)]
        for name in level:
            b.register(name, env)
    return b, np.array([b.campaign_index(x) for x in level], dtype=np.int64)


@pytest.mark.parametrize("backend", ["compiled"])
def test_tree_batch(benchmark, record, backend):
    """``admit_batch`` of 10,000 intents over the 10,000 leaves of a tree of depth 3 (10
    projects × 10 campaigns × 100 agents): each decision walks its path. (Compiled only: the
    reference recomputes every load of the tree per decision.)"""
    b, leaves = tree_broker(backend)
    n = leaves.shape[0]
    benchmark.group = f"engine: tree workload (depth 3), Broker.admit_batch, {n:,} leaves"
    _batch_rounds(benchmark, record, backend, b, leaves, f"engine/tree-batch/{backend}/{n}",
                  f"tree (depth 3) admit_batch of {n:,}, {backend}")


# -- the kernel alone -------------------------------------------------------------------------
def _engine_state(n: int) -> EngineState:
    classes = [(0, 4 * PPM, 1, 0, 0, 0), (1, 2 * PPM, 1, 0, 0, 0), (2, 3 * PPM, 1, 0, 0, 0),
               (3, PPM // 4, 0, 1, 60 * NS, 1)]
    s = EngineState([8 * n], [0], [8 * n], classes, [PPM], [PPM // 2, PPM, 2 * PPM],
                    [PPM, 3 * PPM // 2, 9 * PPM // 4, 3 * PPM], 60 * NS, 60, False)
    rng = np.random.default_rng(7)
    broke = rng.random(n) < 0.1
    for c in range(n):
        s.add_campaign([2], [8], [16], [3600 * NS], 10**4 if broke[c] else 10**12, 0)
    return s


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("backend", list(ENGINES))
def test_kernel(benchmark, record, backend, n):
    benchmark.group = f"engine: kernel admit_batch + advance, {n:,} campaigns"
    k = ENGINES[backend]
    s = _engine_state(n)
    rng = np.random.default_rng(11)
    rounds = ROUNDS_KERNEL[backend, n]
    out = np.zeros(1 << 16, dtype=np.int64)
    ks = np.full(n, 2, dtype=np.int64)
    dims = np.zeros(n, dtype=np.int64)
    on, orz, ol = (np.zeros(n, dtype=np.int64) for _ in range(3))

    def batch():
        ci, u, dur = intents(rng, n, n)
        return (ci, np.ascontiguousarray(u[:, 0]), np.ascontiguousarray(u[:, 1]),
                (dur * NS).astype(np.int64))

    work = [batch() for _ in range(rounds + WARMUP + 1)]
    it = {"i": 0, "t": 0, "granted": 0}

    def one_round():
        ci, lo, hi, dur = work[it["i"]]
        it["i"] += 1
        it["t"] += int(STEP * NS)
        t = it["t"]
        s.grow_leases(n, int(hi.sum()))             # what Broker._reserve does
        k.ring_advance(s, t)
        k.advance(s, t, out)
        ol.fill(-1)
        j = 0
        while j < n:
            j = k.admit_batch(s, ci, ks, dims, lo, hi, dur, t, 0, on, orz, ol, j) + 1
        it["granted"] = int((ol >= 0).sum())

    for _ in range(WARMUP):
        one_round()
    benchmark.pedantic(one_round, rounds=rounds, iterations=1, warmup_rounds=0)
    record(f"engine/kernel/{backend}/{n}", f"kernel batch of {n:,}, {backend}", n,
           admitted=it["granted"] / n, leases=s.nleases)


# -- where the kernel's time goes (compiled only) ---------------------------------------------
PART_ROUNDS = 30


@pytest.mark.skipif("compiled" not in ENGINES, reason="compiled engine not built")
@pytest.mark.parametrize("part", ["refuse", "grant", "expire", "grant-cold"])
def test_kernel_parts(benchmark, record, part):
    """10,000 campaigns, batches of 10,000: ``refuse`` (above the ceiling: decide + never),
    ``grant`` (warm grants into a lease store already grown and touched), ``grant-cold``
    (the same into fresh pages, as the append-only store grows), ``expire`` (``advance``
    over 10,000 due leases of the 10 rounds of grants before)."""
    benchmark.group = "engine: compiled kernel parts, 10,000 campaigns"
    from bursarcore.admission.state import _L_FIELDS
    k = ENGINES["compiled"]
    n = 10_000
    total = n * (PART_ROUNDS + 12)
    s = _engine_state(n)
    s.cap[0] = total                       # never short of capacity: every ask fits
    s.free_slots = np.arange(total, dtype=np.int32)[None, ::-1].copy()
    s.top[0] = total
    s.Bcap[:n, 0] = s.T[:n, 0] = MAXV
    s.left[:n] = MAXV
    s.b[:n, 0] = total
    s.grow_leases(total, total)
    while s.heap_t.shape[0] < total + 1:
        s.grow_heap()
    if part != "grant-cold":
        for f in _L_FIELDS + ("heap_t", "heap_id", "arena"):
            getattr(s, f)[:] = 0
    rng = np.random.default_rng(3)
    ks = np.full(n, 2, dtype=np.int64)
    dims = np.zeros(n, dtype=np.int64)
    on, orz, ol = (np.zeros(n, dtype=np.int64) for _ in range(3))
    one = np.ones(n, dtype=np.int64)
    big = np.full(n, 2 * total, dtype=np.int64)
    out = np.zeros(n, dtype=np.int64)
    it = {"t": 0}

    def grants():
        it["t"] += NS
        ci = rng.integers(0, n, n)
        dur = rng.integers(5, 61, n) * NS + it["t"] * 0 + 3600 * NS
        j = k.admit_batch(s, ci, ks, dims, one, one, dur, it["t"], 0, on, orz, ol, 0)
        assert j == n

    if part == "expire":
        for _ in range(10):
            grants()
        nowt = {"t": it["t"] + 3600 * NS}

        def one_round():
            nowt["t"] += 6 * NS                 # about 10,000 leases come due per round
            k.advance(s, nowt["t"], out)
    elif part == "refuse":
        def one_round():
            it["t"] += NS
            ci = rng.integers(0, n, n)
            k.admit_batch(s, ci, ks, dims, big, big, np.full(n, 60 * NS), it["t"], 0, on, orz,
                          ol, 0)
    else:
        one_round = grants
    benchmark.pedantic(one_round, rounds=PART_ROUNDS if part != "expire" else 8,
                       iterations=1, warmup_rounds=1)
    record(f"engine/part/{part}", f"kernel {part}", n)
