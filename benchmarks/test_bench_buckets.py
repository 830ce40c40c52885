"""Decisions per second of the token-bucket core, the reference model, and peer libraries.

Every contender enforces the same policy (:mod:`bursarcore.bench`): buckets of 50 units
refilling at 1,000 units/s, one unit per decision.

- ``single``: one decision per Python call. bursarcore: ``try_debit(i, 1.0, now)`` with
  ``now = time.monotonic()`` read per call, as a service would (peers read their own clock
  per call too); ``compiled-now-given`` passes precomputed times, to show the clock's
  share. Peers: their natural one-decision call with a string key (``bench.PEERS``).
- ``batch``: ``try_debit_batch(idx, amounts, now)`` — float amounts, one instant per batch,
  indices uniformly random (fresh each round for 1k batches) — and ``debit_fixed`` on the
  same requests already in fixed point, so the cost of conversion and validation shows.
- ``ref-batch``: the reference model, both calls, on 1k and 100k (not 1M) requests. Its
  ``try_debit_batch`` copies every bucket's last-update time into an array per call, so
  over 1M buckets a 1k batch mostly measures that copy; ``debit_fixed`` is the kernel.

The synthetic clock advances 10 ms per round (10 units of refill per bucket).
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from bursarcore import bench, units
from bursarcore.buckets import BACKENDS

#: "compiled" in the rows: the C core through its Cython binding, the default backend
COMPILED = {"compiled": BACKENDS["cython"]} if "cython" in BACKENDS else {}
CLASSES = {**COMPILED, "reference": BACKENDS["reference"]}
needs_compiled = pytest.mark.skipif(not COMPILED, reason="compiled extension unavailable")

CALLS = 10_000                       # single calls per round
ROUNDS_SINGLE = {"compiled": 60, "compiled-now-given": 60, "reference": 8}
ROUNDS_PEER = 5
PEER_NAMES = list(bench.PEERS)


def _table(cls, n, now=1.0):
    return cls(np.full(n, bench.CAPACITY), np.full(n, bench.RATE), now=now)


# -- single calls --------------------------------------------------------------------------

@pytest.mark.parametrize("keys", [1, 10_000])
@pytest.mark.parametrize("who", ["compiled", "compiled-now-given", "reference"])
def test_single(benchmark, record, rng, clock, keys, who):
    backend = "reference" if who == "reference" else "compiled"
    if backend not in CLASSES:
        pytest.skip("compiled extension unavailable")
    benchmark.group = f"single calls, {keys} key(s)"
    monotonic = time.monotonic
    given = who == "compiled-now-given"
    b = _table(CLASSES[backend], keys, now=0.0 if given else monotonic())
    debit = b.try_debit
    idx = rng.integers(0, keys, CALLS).tolist()
    amount = bench.AMOUNT

    if given:
        def setup():
            t0 = clock.tick()      # 10 ms per round; a round's times span 1 ms
            return ([t0 + k * 1e-7 for k in range(CALLS)],), {}

        def run(times):
            for i, t in zip(idx, times):
                debit(i, amount, t)
    else:
        setup = None

        def run():
            for i in idx:
                debit(i, amount, monotonic())

    benchmark.pedantic(run, setup=setup, rounds=ROUNDS_SINGLE[who], warmup_rounds=1)
    label = {"compiled": "bursarcore compiled try_debit(i, 1.0, monotonic())",
             "compiled-now-given": "bursarcore compiled try_debit(i, 1.0, t), t precomputed",
             "reference": "bursarcore reference try_debit(i, 1.0, monotonic())"}[who]
    record(f"single/{who}/{keys}", label, CALLS)


@pytest.mark.parametrize("keys", [1, 10_000])
@pytest.mark.parametrize("name", PEER_NAMES)
def test_single_peer(benchmark, record, rng, keys, name):
    peer = bench.PEERS[name]
    version = bench.peer_version(peer.dist)
    if version is None:
        pytest.skip(f"{peer.dist} not installed")
    benchmark.group = f"single calls, {keys} key(s)"
    decide = peer.make(keys)
    names = [f"k{i}" for i in rng.integers(0, keys, CALLS)]
    for k in set(names):          # every key's state exists before timing
        decide(k)

    def run():
        for k in names:
            decide(k)

    benchmark.pedantic(run, rounds=ROUNDS_PEER, warmup_rounds=1)
    record(f"single/{name}/{keys}", f"{peer.label} {version}", CALLS)


# -- batches -------------------------------------------------------------------------------

BATCH_CASES = [(10_000, 1_000), (10_000, 1_000_000), (1_000_000, 1_000), (1_000_000, 1_000_000)]


def _batch_bench(benchmark, rng, clock, b, nbuckets, batch, api, rounds=None):
    fixed_amounts = np.full(batch, units.to_fixed(bench.AMOUNT), dtype=np.int64)
    float_amounts = np.full(batch, bench.AMOUNT)
    shared = rng.integers(0, nbuckets, batch) if batch > 1_000 else None

    def setup():
        idx = shared if shared is not None else rng.integers(0, nbuckets, batch)
        now = clock.tick()
        if api == "debit_fixed":
            return (idx, fixed_amounts, np.array([units.to_ns(now)], dtype=np.int64)), {}
        return (idx, float_amounts, now), {}

    run = getattr(b, api)
    if rounds is None:
        rounds = 400 if batch <= 1_000 else 15
    out = benchmark.pedantic(run, setup=setup, rounds=rounds, warmup_rounds=1)
    return float(np.mean(out))


@needs_compiled
@pytest.mark.parametrize("api", ["try_debit_batch", "debit_fixed"])
@pytest.mark.parametrize("nbuckets,batch", BATCH_CASES)
def test_batch(benchmark, record, rng, clock, nbuckets, batch, api):
    benchmark.group = f"batched, {nbuckets:,} buckets"
    b = _table(CLASSES["compiled"], nbuckets)
    admitted = _batch_bench(benchmark, rng, clock, b, nbuckets, batch, api)
    what = "(idx, float amounts, now)" if api == "try_debit_batch" else "(int64 fixed point)"
    record(f"batch/{api}/{nbuckets}/{batch}", f"compiled {api} {what}, batch {batch:,}", batch,
           admitted=admitted)


@pytest.mark.parametrize("api", ["try_debit_batch", "debit_fixed"])
@pytest.mark.parametrize("nbuckets,batch", [(10_000, 1_000), (10_000, 100_000),
                                            (1_000_000, 1_000), (1_000_000, 100_000)])
def test_reference_batch(benchmark, record, rng, clock, nbuckets, batch, api):
    benchmark.group = f"batched, {nbuckets:,} buckets"
    b = _table(CLASSES["reference"], nbuckets)
    admitted = _batch_bench(benchmark, rng, clock, b, nbuckets, batch, api,
                            rounds=30 if batch <= 1_000 else 4)
    record(f"ref-batch/{api}/{nbuckets}/{batch}", f"reference {api}, batch {batch:,}", batch,
           admitted=admitted)
