"""Population agents: numpy and numba kernels decide identically; both paths run."""

from __future__ import annotations

import numpy as np
import pytest

from bursarcore.sim import Simulation, load_scenario
from bursarcore.sim.kernels import numba_available, step_numpy

needs_numba = pytest.mark.skipif(not numba_available(),
                                 reason="numba not installed (pip install 'bursarcore[numba]')")


def _arrays(n, seed):
    r = np.random.default_rng(seed)
    return dict(queue=r.uniform(0, 1e5, n), prev=r.integers(0, 64, n).astype(float),
                held=r.integers(0, 64, n).astype(float), arrivals=r.uniform(0, 1e4, n),
                io_factor=r.uniform(0, 1, n), tokens=r.uniform(0, 2e4, n),
                s=np.full(n, 8.0), b=np.full(n, 64.0), B=np.full(n, 2e4),
                greedy=(r.random(n) < 0.5).astype(np.int8))


def _call(step, a, mult):
    a = {k: v.copy() for k, v in a.items()}
    want = np.zeros(a["queue"].shape[0], np.int64)
    done = np.zeros(a["queue"].shape[0])
    step(a["queue"], a["prev"], a["held"], a["arrivals"], a["io_factor"], a["tokens"], a["s"],
         a["b"], a["B"], 300.0, 10.0, a["greedy"], mult, want, done)
    return a, want, done


def test_numpy_kernel_rules():
    a, want, done = _call(step_numpy, _arrays(1000, 1), 1.0)
    src = _arrays(1000, 1)
    assert (done <= src["prev"] * 10.0 * src["io_factor"] + 1e-9).all()
    assert (want >= 0).all() and (want <= 64 - src["held"]).all()
    assert (a["tokens"] <= src["B"]).all()
    _, want3, _ = _call(step_numpy, src, 3.0)
    assert (want3[src["greedy"] == 0] == 0).all()        # readers of supply wait


@needs_numba
@pytest.mark.parametrize("mult", [1.0, 2.25])
def test_numba_kernel_equals_numpy(mult):
    from bursarcore.sim.kernels import step_numba

    src = _arrays(5000, 2)
    a1, w1, d1 = _call(step_numpy, src, mult)
    a2, w2, d2 = _call(step_numba, src, mult)
    assert np.array_equal(w1, w2) and np.array_equal(d1, d2)
    for k in a1:
        assert np.array_equal(a1[k], a2[k]), k


def _small():
    return load_scenario("large").with_changes(**{
        "scenario.duration": 600.0, "pool.gpu": 4000, "populations.0.count": 400})


def test_population_runs_on_numpy():
    res = Simulation(_small(), use_numba=False).run()
    pop = res.summary["populations"][0]
    assert pop["kernel"] == "numpy" and pop["granted"] > 0
    assert pop["gpu_seconds_of_work_done"] > 0
    assert 0 < res.summary["utilisation"] <= 1


@needs_numba
def test_population_same_on_numba():
    a = Simulation(_small(), use_numba=False).run().summary
    b = Simulation(_small(), use_numba=True).run().summary
    pa, pb = dict(a["populations"][0]), dict(b["populations"][0])
    assert (pa.pop("kernel"), pb.pop("kernel")) == ("numpy", "numba")
    pa.pop("kernel_seconds"), pb.pop("kernel_seconds")
    assert pa == pb
    assert a["utilisation"] == b["utilisation"]
