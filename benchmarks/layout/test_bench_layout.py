"""Struct-of-arrays vs array-of-structs for the batched refill+debit kernel.

The product (``bursarcore._buckets``) keeps each bucket in one 64-byte, 8 x int64 row
(AoS). This measures the same loop (``_layout.pyx``, the product's arithmetic) over:
``aos8`` (the product's layout), ``aos5`` (unpadded 40-byte rows), ``soa`` (five separate
int64 arrays) and ``aos8_prefetch`` (aos8 with a software prefetch 16 requests ahead),
with 1,000,000 random requests per round over 10,000 and 1,000,000 buckets.

After timing, each run is replayed through the product's ``debit_fixed`` and must leave
identical state and decisions, so every layout is measured doing the product's work.
"""

from __future__ import annotations

import numpy as np
import pytest

import layouts
from bursarcore import bench, units
from bursarcore.buckets import BACKENDS

BATCH = 1_000_000
ROUNDS = 15
STEP_NS = 10_000_000


@pytest.fixture(scope="module")
def built():
    return layouts.build()


@pytest.mark.skipif("compiled" not in BACKENDS, reason="compiled extension unavailable")
@pytest.mark.parametrize("layout", layouts.LAYOUTS)
@pytest.mark.parametrize("nbuckets", [10_000, 1_000_000])
def test_layout(benchmark, record, built, nbuckets, layout):
    benchmark.group = f"layout, {nbuckets:,} buckets, batch {BATCH:,}"
    cap, rate = units.to_fixed(bench.CAPACITY), units.to_fixed(bench.RATE)
    table = layouts.Table(layout, nbuckets, cap, rate)
    idx = np.random.default_rng(7).integers(0, nbuckets, BATCH)
    amt = np.full(BATCH, units.to_fixed(bench.AMOUNT), dtype=np.int64)
    out = np.empty(BATCH, dtype=np.uint8)
    t = [0]

    def setup():
        t[0] += STEP_NS
        return (idx, amt, t[0], out), {}

    benchmark.pedantic(table.debit, setup=setup, rounds=ROUNDS, warmup_rounds=1)
    rounds = t[0] // STEP_NS

    product = BACKENDS["compiled"](np.full(nbuckets, bench.CAPACITY),
                                   np.full(nbuckets, bench.RATE), now=0.0)
    for r in range(1, rounds + 1):
        last = product.debit_fixed(idx, amt, np.array([r * STEP_NS], dtype=np.int64))
    np.testing.assert_array_equal(out.view(bool), last)
    state, got = product.state, table.state()
    for field in layouts.FIELDS:
        np.testing.assert_array_equal(got[field], state[field], err_msg=field)
    record(f"layout/{layout}/{nbuckets}", f"{layout} ({layouts.DESCRIBE[layout]})", BATCH,
           admitted=float(out.mean()))
