"""Wall time of the simulator (not tests: the default run never collects benchmarks/).

    python -m pytest benchmarks/test_bench_sim.py --benchmark-only

* ``default``: SPEC §10's default scenario (7,200 simulated s, journaled), each backend;
* ``default-nojournal``: the same without a journal (the journal's share);
* ``large``: 100,000 GPUs, 10,000 campaigns, one simulated hour, numpy and numba kernels.

``extra_info`` records the split between the engine (time inside broker calls) and the
agents (everything else: agent logic, ledger, loop), and the broker calls made.
Results and the machine they came from: benchmarks/RESULTS_sim.md.
"""

from __future__ import annotations

import pytest

from bursarcore.broker import BACKENDS
from bursarcore.sim import Simulation, load_scenario
from bursarcore.sim.kernels import numba_available


def _bench(benchmark, sc, rounds, **kw):
    out = {}

    def run():
        out["res"] = Simulation(sc, **kw).run()

    benchmark.pedantic(run, rounds=rounds, iterations=1, warmup_rounds=0)
    tm = out["res"].timing
    benchmark.extra_info.update(engine_seconds=round(tm["engine_seconds"], 3),
                                agents_seconds=round(tm["agents_seconds"], 3),
                                broker_calls=tm["broker_calls"])
    return out["res"]


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_default(benchmark, backend):
    benchmark.group = "default scenario (7,200 s, 512 GPUs)"
    _bench(benchmark, load_scenario("default"), 3, backend=backend)


def test_default_nojournal(benchmark):
    benchmark.group = "default scenario (7,200 s, 512 GPUs)"
    _bench(benchmark, load_scenario("default"), 3, journal=False)


@pytest.mark.parametrize("kernel", ["numpy", "numba"])
def test_large(benchmark, kernel):
    if kernel == "numba" and not numba_available():
        pytest.skip("numba not installed")
    benchmark.group = "large scenario (100,000 GPUs, 10,000 campaigns, 3,600 s)"
    res = _bench(benchmark, load_scenario("large"), 1, use_numba=kernel == "numba")
    pop = res.summary["populations"][0]
    benchmark.extra_info.update(kernel_seconds=round(pop["kernel_seconds"], 3),
                                requests=pop["requests"], granted=pop["granted"])
