"""Consume decisions per second of the flow engine (SPEC §5), compiled and reference.

10,000 campaigns on one flow dimension (``fs``), campaigns drawn uniformly at random
(fresh indices each round for small batches). Three workloads, each behaving the same at
every batch size:

- ``admitting``: g=1,000, s=20,000, b=50,000 units/s, B=1,000 units, capacity 2e8
  units/s, 1 unit per request: every request passes in full (``retry_after`` 0).
- ``throttled``: g=0, s=b=100 units/s, B=4 units, capacity 1e9 units/s, 5 units per
  request: no request passes in full — the sustained bucket holds at most 4 — so every one
  computes its exact ``retry_after`` (closed form: one bucket binds).
- ``congested``: g=1, s=b=1,000 units/s, B=100 units, capacity 10,100 units/s: the
  guarantees take 10,000, so the facility bucket refills at 100 units/s (1 per round) and
  holds 100. 1 unit per request: a campaign's first request is served by its guaranteed
  bucket; later ones find it partly refilled and the facility (nearly) empty, so their
  ``retry_after`` is the search over "guaranteed + facility" (bound, gallop, bisection).

Calls measured:

- ``consume_batch(campaigns, 0, amounts, now)`` — float amounts (an array), one instant per
  batch: validation, conversion and the nogil loop;
- ``consume_fixed`` — the same requests already in int64 fixed point (the kernel alone);
- ``consume(c, "fs", amount, t)`` — one decision per Python call, ``t`` precomputed;
- the reference model: the same calls on fewer requests (it decides ~10^5/s).

The synthetic clock advances 10 ms per round. Run with the token-bucket benchmarks or
alone::

    python -m pytest benchmarks/test_bench_flow.py --benchmark-only --decisions-md=PATH
"""

from __future__ import annotations

import numpy as np
import pytest

from bursarcore import units
from bursarcore.flow import FLOW_BACKENDS

CAMPAIGNS = 10_000
WORKLOADS = {
    # (g, s, b, B, capacity, units per request)
    "admitting": (1000.0, 20000.0, 50000.0, 1000.0, 2e8, 1.0),
    "throttled": (0.0, 100.0, 100.0, 4.0, 1e9, 5.0),
    "congested": (1.0, 1000.0, 1000.0, 100.0, 10100.0, 1.0),
}
ROUNDS = {"compiled": 20, "reference": 3}
BATCH = {"compiled": [1_000, 1_000_000], "reference": [10_000]}
CALLS = 10_000


def _engine(cls, workload: str):
    g, s, b, B, cap, _ = WORKLOADS[workload]
    fe = cls({"fs": cap}, window=1.0, now=0.0)
    for _ in range(CAMPAIGNS):
        fe.add_campaign(guaranteed={"fs": g}, sustained={"fs": s}, ceiling={"fs": b},
                        burst={"fs": B}, now=0.0)
    return fe


def _params():
    for backend in ("compiled", "reference"):
        for m in BATCH[backend]:
            yield backend, m


@pytest.mark.parametrize("workload", list(WORKLOADS))
@pytest.mark.parametrize("api", ["consume_batch", "consume_fixed"])
@pytest.mark.parametrize("backend,m", list(_params()))
def test_batch(benchmark, record, rng, clock, workload, api, backend, m):
    if backend not in FLOW_BACKENDS:
        pytest.skip("compiled extension unavailable")
    benchmark.group = f"flow: {workload}, batch over {CAMPAIGNS:,} campaigns"
    fe = _engine(FLOW_BACKENDS[backend], workload)
    fixed_idx = rng.integers(0, CAMPAIGNS, m).astype(np.int64)
    amount = WORKLOADS[workload][-1]
    famounts = np.full(m, amount)
    iamounts = np.full(m, units.to_fixed(amount), dtype=np.int64)
    dim = np.zeros(1, dtype=np.int64)
    passed = []

    def setup():
        idx = rng.integers(0, CAMPAIGNS, m).astype(np.int64) if m <= 10_000 else fixed_idx
        return (idx, clock.tick()), {}

    if api == "consume_batch":
        def run(idx, now):
            allowed, _ = fe.consume_batch(idx, 0, famounts, now)
            passed.append(float((allowed == amount).mean()))
    else:
        def run(idx, now):
            allowed, _, _ = fe.consume_fixed(idx, dim, iamounts,
                                             np.array([units.to_ns(now)], dtype=np.int64))
            passed.append(float((allowed == iamounts[0]).mean()))

    benchmark.pedantic(run, setup=setup, rounds=ROUNDS[backend], warmup_rounds=1)
    record(f"flow/{api}/{workload}/{backend}/{m}",
           f"{backend} {api}, {m:,} requests", m, admitted=float(np.mean(passed[1:] or passed)))


@pytest.mark.parametrize("workload", list(WORKLOADS))
@pytest.mark.parametrize("backend", ["compiled", "reference"])
def test_single(benchmark, record, rng, clock, workload, backend):
    if backend not in FLOW_BACKENDS:
        pytest.skip("compiled extension unavailable")
    benchmark.group = f"flow: {workload}, single consume calls, {CAMPAIGNS:,} campaigns"
    fe = _engine(FLOW_BACKENDS[backend], workload)
    idx = rng.integers(0, CAMPAIGNS, CALLS).tolist()
    consume = fe.consume
    amount = WORKLOADS[workload][-1]
    passed = []

    def setup():
        t0 = clock.tick()
        return ([t0 + k * 1e-7 for k in range(CALLS)],), {}

    def run(times):
        n = 0
        for c, t in zip(idx, times):
            n += consume(c, "fs", amount, t)[0] == amount
        passed.append(n / CALLS)

    benchmark.pedantic(run, setup=setup, rounds=ROUNDS[backend] * 2, warmup_rounds=1)
    record(f"flow/single/{workload}/{backend}", f"{backend} consume(c, 'fs', {amount}, t)", CALLS,
           admitted=float(np.mean(passed[1:] or passed)))
