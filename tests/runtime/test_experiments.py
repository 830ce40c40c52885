"""The runtime experiments (``benchmarks/runtime/experiments.py``, issue 6) in a tiny
configuration: the schedule arithmetic is right, real runs respect the bounds every
schedule must, work stealing beats static partitioning where static is constructed to
lose, and the throughput run's exactly-once verification passes. A few seconds."""

from __future__ import annotations

import importlib.util
import os
import random

import pytest

_PATH = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "runtime", "experiments.py")


@pytest.fixture(scope="module")
def ex():
    spec = importlib.util.spec_from_file_location("runtime_experiments", os.path.abspath(_PATH))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_ideal_schedules_by_hand(ex):
    d = [2.0, 1.0, 1.0, 2.0]
    assert ex.static_assignment(4, 2) == [[0, 2], [1, 3]]
    assert ex.ideal_static(d, 2) == 3.0            # {2,1} and {1,2}
    assert ex.ideal_stealing(d, 2) == 4.0          # greedy in order: 2|1,1 then 2 on either
    # so stealing is not better on every input; on the adversarial case it is:
    adv = ex.adversarial_durations(3, 3, long=0.4, short=0.02)
    assert ex.ideal_static(adv, 3) == pytest.approx(1.2)
    assert ex.ideal_stealing(adv, 3) == pytest.approx(0.46)


def test_ideal_bounds_random(ex):
    rng = random.Random(7)
    for _ in range(300):
        w = rng.randint(1, 9)
        d = [rng.lognormvariate(0, 1) for _ in range(rng.randint(1, 40))]
        lb = ex.lower_bound(d, w)
        assert lb <= ex.ideal_stealing(d, w) <= ex.graham_bound(d, w) + 1e-9
        assert ex.ideal_static(d, w) >= lb - 1e-9
    d = ex.lognormal_durations(30, 3, 1.0, 12.0)
    assert sum(d) == pytest.approx(12.0) and d == ex.lognormal_durations(30, 3, 1.0, 12.0)


def test_real_runs_adversarial(ex, tmp_path):
    d = ex.adversarial_durations(3, 3, long=0.4, short=0.02)
    runs = {m: ex.run_makespan(d, 3, m, str(tmp_path / m), timeout=30) for m in ("static", "stealing")}
    for m, r in runs.items():
        assert r["ran_once"] and r["all_completed"], m
        assert r["makespan"] >= max(d) and r["makespan"] >= sum(d) / 3
        assert r["makespan"] >= r["last_task_end"]
        assert sum(len(s) for s in r["spans"].values()) == len(d)
        assert r["busy"] >= sum(d) - 1e-6              # sleep never returns early
        assert 0 < r["utilisation"] <= 1
    assert runs["static"]["makespan"] >= ex.ideal_static(d, 3) - 1e-6
    # not ideal_stealing (FIFO list scheduling): concurrent claimers keep submission order
    # per shard only, so a run may beat FIFO; none beats the lower bound
    assert runs["stealing"]["makespan"] >= ex.lower_bound(d, 3) - 1e-6
    # static: the three long tasks in a row on worker 0
    assert [i for i, *_ in runs["static"]["spans"][0]] == [0, 3, 6]
    # the margin (1.2 s vs 0.46 s ideal) absorbs any plausible queue overhead
    assert runs["stealing"]["makespan"] < runs["static"]["makespan"]
    assert runs["stealing"]["utilisation"] > runs["static"]["utilisation"]
    assert runs["stealing"]["queue_counts"] == {"pending": 0, "claimed": 0, "done": len(d), "failed": 0}
    assert runs["stealing"]["queue_check"] == []


@pytest.mark.parametrize("lock", ["fcntl", "file"])
def test_throughput_verifies_exactly_once(ex, tmp_path, lock):
    r = ex.run_throughput(40, 4, lock, str(tmp_path), durable=False, timeout=30)
    assert r["verified"], r["problems"]
    assert r["tasks_per_s"] > 0 and r["per_worker_min"] >= 0
    assert r["per_worker_max"] <= 40
