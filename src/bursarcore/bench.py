"""Quick throughput figures for this machine: ``python -m bursarcore bench --quick``.

Decisions per second for the token-bucket core (single ``try_debit`` calls from Python,
``try_debit_batch`` over 10,000 and 1,000,000 buckets), the pure-Python reference model,
and the rate limiters a user would otherwise pick (token-bucket, limits, pyrate-limiter)
when they are installed. Each figure is the best of a few repetitions timed with
:func:`time.perf_counter`; the full, statistically careful run is the pytest-benchmark
suite in ``benchmarks/`` (see ``benchmarks/RESULTS.md``).

Every contender gets the same policy: buckets of :data:`CAPACITY` units refilling at
:data:`RATE` units per second, one unit per decision. The peer adapters here
(:data:`PEERS`) are also what ``benchmarks/`` measures, so both report the same thing.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, TextIO, cast

import numpy as np

from .buckets import BACKENDS

__all__ = ["CAPACITY", "RATE", "AMOUNT", "STEP", "PEERS", "Sizes", "Row", "run", "render",
           "best_rate", "peer_version"]

CAPACITY = 50.0
"""Units per bucket (the burst allowance)."""
RATE = 1000.0
"""Refill, units per second."""
AMOUNT = 1.0
"""Units per decision."""
STEP = 0.01
"""Seconds the synthetic clock advances between batches (10 units of refill per bucket)."""


# -- timing --------------------------------------------------------------------------------

def best_rate(fn: Callable[[], object], decisions: int, reps: int,
              setup: Callable[[], object] | None = None) -> float:
    """Decisions per second of ``fn`` (best of ``reps``; ``setup`` runs untimed before each)."""
    best = float("inf")
    for _ in range(reps):
        if setup is not None:
            setup()
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return decisions / best


# -- peers: each maker returns a one-decision callable taking a string key -----------------

def _token_bucket(nkeys: int) -> Callable[[str], bool]:
    import token_bucket

    limiter = token_bucket.Limiter(RATE, int(CAPACITY), token_bucket.MemoryStorage())
    return limiter.consume


def _limits(strategy: str) -> Callable[[int], Callable[[str], bool]]:
    def make(nkeys: int) -> Callable[[str], bool]:
        from limits import RateLimitItemPerSecond, storage, strategies

        cls = {"fixed": strategies.FixedWindowRateLimiter,
               "moving": strategies.MovingWindowRateLimiter}[strategy]
        limiter = cls(storage.MemoryStorage())
        item = RateLimitItemPerSecond(int(RATE))
        hit = limiter.hit
        return lambda key: hit(item, key)

    return make


def _pyrate(nkeys: int) -> Callable[[str], bool]:
    import pyrate_limiter as pl

    rate = pl.Rate(int(RATE), pl.Duration.SECOND, burst=int(CAPACITY))

    class PerKey(pl.BucketFactory):
        """One constant-state token bucket per key: pyrate-limiter's documented pattern for
        per-key limits (a BucketFactory routing items by name). StateBucket needs no leak
        task, so none is scheduled."""

        def __init__(self) -> None:
            self.clock = pl.MonotonicClock()
            self.by_name: dict[str, pl.StateBucket] = {}

        def wrap_item(self, name: str, weight: int = 1) -> pl.RateItem:
            return pl.RateItem(name, self.clock.now(), weight=weight)

        def get(self, item: pl.RateItem) -> pl.StateBucket:
            bucket = self.by_name.get(item.name)
            if bucket is None:
                bucket = self.by_name[item.name] = pl.StateBucket([rate],
                                                                  algorithm=pl.TokenBucket())
            return bucket

    limiter = pl.Limiter(PerKey())
    acquire = limiter.try_acquire
    # (try_acquire is typed for async buckets too; this synchronous one answers a bool)
    return lambda key: cast(bool, acquire(key, blocking=False))


@dataclass(frozen=True)
class Peer:
    label: str        # what the table shows
    dist: str         # PyPI distribution name (for the version and the install hint)
    make: Callable[[int], Callable[[str], bool]]


PEERS: dict[str, Peer] = {
    "token-bucket": Peer("token-bucket Limiter.consume", "token-bucket", _token_bucket),
    "limits-fixed": Peer("limits fixed-window hit", "limits", _limits("fixed")),
    "limits-moving": Peer("limits moving-window hit", "limits", _limits("moving")),
    "pyrate-limiter": Peer("pyrate-limiter TokenBucket try_acquire", "pyrate-limiter", _pyrate),
}


def peer_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


# -- the measurements ----------------------------------------------------------------------

@dataclass(frozen=True)
class Sizes:
    single_calls: int          # try_debit calls per repetition (compiled)
    ref_single_calls: int      # ... for the reference
    peer_calls: int            # peer decisions per repetition
    keys: int                  # buckets / keys for single calls and peers
    small_buckets: int         # "10k buckets" batch row
    small_batch: int
    large_buckets: int         # "1M buckets" batch row
    large_batch: int
    ref_batch: int             # reference batch (over small_buckets)
    reps: int


QUICK = Sizes(single_calls=50_000, ref_single_calls=5_000, peer_calls=5_000, keys=10_000,
              small_buckets=10_000, small_batch=1_000_000, large_buckets=1_000_000,
              large_batch=1_000_000, ref_batch=20_000, reps=3)
FULL = Sizes(single_calls=300_000, ref_single_calls=30_000, peer_calls=30_000, keys=10_000,
             small_buckets=10_000, small_batch=1_000_000, large_buckets=1_000_000,
             large_batch=1_000_000, ref_batch=100_000, reps=7)
TINY = Sizes(single_calls=2_000, ref_single_calls=300, peer_calls=300, keys=1_000,
             small_buckets=1_000, small_batch=10_000, large_buckets=20_000,
             large_batch=10_000, ref_batch=1_000, reps=1)


@dataclass
class Row:
    key: str                   # stable identifier (tests and ratios use it)
    label: str
    buckets: int | None = None
    decisions: int | None = None
    rate: float | None = None  # decisions per second
    note: str = ""


@dataclass
class Report:
    sizes: Sizes
    rows: list[Row] = field(default_factory=list)

    def get(self, key: str) -> Row | None:
        return next((r for r in self.rows if r.key == key), None)

    def ratio(self, num: str, den: str) -> float | None:
        a, b = self.get(num), self.get(den)
        if a is None or b is None or not a.rate or not b.rate:
            return None
        return a.rate / b.rate


def _single(cls: type, nkeys: int, calls: int, reps: int, seed: int = 1) -> float:
    """``try_debit(i, 1.0, time.monotonic())`` over random buckets, as a service would."""
    clock = time.monotonic
    b = cls(np.full(nkeys, CAPACITY), np.full(nkeys, RATE), now=clock())
    idx = np.random.default_rng(seed).integers(0, nkeys, calls).tolist()
    debit = b.try_debit

    def run() -> None:
        for i in idx:
            debit(i, AMOUNT, clock())

    return best_rate(run, calls, reps)


def _batch(cls: type, nbuckets: int, batch: int, reps: int, seed: int = 2) -> float:
    """``try_debit_batch(idx, amounts, now)``, random order, one instant per batch."""
    b = cls(np.full(nbuckets, CAPACITY), np.full(nbuckets, RATE))
    idx = np.random.default_rng(seed).integers(0, nbuckets, batch)
    amounts = np.full(batch, AMOUNT)
    now = [0.0]

    def tick() -> None:
        now[0] += STEP

    return best_rate(lambda: b.try_debit_batch(idx, amounts, now[0]), batch, reps, tick)


def _peer(peer: Peer, nkeys: int, calls: int, reps: int, seed: int = 1) -> float:
    decide = peer.make(nkeys)
    keys = [f"k{i}" for i in np.random.default_rng(seed).integers(0, nkeys, calls)]
    for k in set(keys):   # create every key's state outside the timing
        decide(k)

    def run() -> None:
        for k in keys:
            decide(k)

    return best_rate(run, calls, reps)


def run(sizes: Sizes = QUICK, peers: bool = True) -> Report:
    """Measure every row; peers missing from the environment get a row with a note."""
    s = sizes
    rep = Report(s)
    add = rep.rows.append
    compiled = BACKENDS.get("cython")   # the C core through its Cython binding
    reference = BACKENDS["reference"]
    if compiled is None:
        why = "compiled extension unavailable (BURSARCORE_NO_EXTENSIONS or no build)"
        for key, label in (("single", "compiled try_debit, single calls"),
                           ("batch-small", "compiled try_debit_batch"),
                           ("batch-large", "compiled try_debit_batch")):
            add(Row(key, label, note=why))
    else:
        add(Row("single", "compiled try_debit, single calls", s.keys, s.single_calls,
                _single(compiled, s.keys, s.single_calls, s.reps)))
        add(Row("batch-small", "compiled try_debit_batch", s.small_buckets, s.small_batch,
                _batch(compiled, s.small_buckets, s.small_batch, s.reps)))
        add(Row("batch-large", "compiled try_debit_batch", s.large_buckets, s.large_batch,
                _batch(compiled, s.large_buckets, s.large_batch, s.reps)))
    add(Row("ref-single", "reference try_debit, single calls", s.keys, s.ref_single_calls,
            _single(reference, s.keys, s.ref_single_calls, s.reps)))
    add(Row("ref-batch", "reference try_debit_batch", s.small_buckets, s.ref_batch,
            _batch(reference, s.small_buckets, s.ref_batch, s.reps)))
    if peers:
        for name, peer in PEERS.items():
            version = peer_version(peer.dist)
            row = Row(f"peer:{name}", peer.label, s.keys, s.peer_calls)
            if version is None:
                row.decisions = None
                row.note = f"not installed (pip install {peer.dist})"
            else:
                row.label = f"{peer.label} ({version})"
                try:
                    row.rate = _peer(peer, s.keys, s.peer_calls, s.reps)
                except Exception as exc:  # a peer's API drifted: report, don't abort
                    row.note = f"failed: {type(exc).__name__}: {exc}"
            add(row)
    return rep


# -- output --------------------------------------------------------------------------------

def _fmt_rate(x: float | None) -> str:
    if x is None:
        return "-"
    if x >= 1e6:
        return f"{x / 1e6:.1f} M/s"
    return f"{x / 1e3:.0f} k/s"


def _fmt_ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}x" if x >= 10 else f"{x:.1f}x"


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f
                       if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return (f"{cpu}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
            f"numpy {np.__version__}")


def render(rep: Report, out: TextIO | None = None) -> None:
    out = sys.stdout if out is None else out
    head = ("benchmark", "buckets", "decisions", "decisions/s", "note")
    lines = [(r.label, f"{r.buckets:,}" if r.buckets else "-",
              f"{r.decisions:,}" if r.decisions else "-", _fmt_rate(r.rate), r.note)
             for r in rep.rows]
    widths = [max(len(x[j]) for x in [head, *lines]) for j in range(4)]
    print(f"bursarcore bench: {machine()}", file=out)
    print(f"best of {rep.sizes.reps} repetition(s); buckets of {CAPACITY:g} units refilling "
          f"at {RATE:g}/s, {AMOUNT:g} unit per decision", file=out)
    print(file=out)
    for line in [head, *lines]:
        cells = [line[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(line[1:4], widths[1:])]
        print("  ".join(cells + [line[4]]).rstrip(), file=out)
    print(file=out)
    ratios = [("compiled / reference, single calls", rep.ratio("single", "ref-single")),
              ("compiled / reference, batched", rep.ratio("batch-small", "ref-batch"))]
    ratios += [(f"compiled single calls / {r.key[5:]}", rep.ratio("single", r.key))
               for r in rep.rows if r.key.startswith("peer:") and r.rate]
    width = max(len(label) for label, _ in ratios)
    print("ratios (decisions/s over decisions/s)", file=out)
    for label, x in ratios:
        print(f"  {label.ljust(width)}  {_fmt_ratio(x):>6}", file=out)


def main(quick: bool = True, tiny: bool = False, peers: bool = True,
         out: TextIO | None = None) -> Report:
    sizes = TINY if tiny else QUICK if quick else FULL
    rep = run(sizes, peers=peers)
    render(rep, out)
    return rep
