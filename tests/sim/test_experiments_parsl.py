"""``bursar experiments --executor parsl --parsl-config FILE``: the sweep's runs go through
Parsl (here a HighThroughputExecutor with a LocalProvider: worker processes on this
machine, as a cluster provider would start them on nodes) and give the same rows as the
local executor for the same seeds. Bad flags are refused in one line, before anything is
written. Parsl is an optional extra: without it these tests skip."""

from __future__ import annotations

import csv
import os
import sys

import pytest

import bursarcore
from bursarcore.errors import InvalidArgument
from bursarcore.sim.experiments import load_parsl_config, run_experiments

from .test_cli import _one_line_error, main

pytest.importorskip("parsl")

SRC = os.path.dirname(os.path.dirname(os.path.abspath(bursarcore.__file__)))

HTEX_CONFIG = '''
from parsl.config import Config
from parsl.executors import HighThroughputExecutor
from parsl.providers import LocalProvider

config = Config(
    executors=[HighThroughputExecutor(
        label="sweep", max_workers_per_node=2, address="127.0.0.1",
        loopback_address="127.0.0.1",
        provider=LocalProvider(init_blocks=1, min_blocks=1, max_blocks=1,
                               worker_init="export PYTHONPATH={src}:$PYTHONPATH"))],
    run_dir={run_dir!r}, strategy="none", usage_tracking=0)
'''


@pytest.fixture
def htex_file(tmp_path, monkeypatch):
    # HTEX starts its interchange and workers as commands of the Python environment
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    f = tmp_path / "htex_config.py"
    f.write_text(HTEX_CONFIG.format(src=SRC, run_dir=str(tmp_path / "runinfo")))
    return f


def _rows(path):
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    for r in rows:
        assert float(r.pop("wall_seconds")) >= 0        # the one field that may differ
    return rows


def test_a_sweep_through_parsl_htex_gives_the_local_rows(tmp_path, htex_file, capsys):
    base = ["experiments", "--quick", "--seeds", "2", "--only", "c", "--only", "b",
            "--no-progress"]
    assert main([*base, "--jobs", "2", "--out", str(tmp_path / "local")]) == 0
    assert main([*base, "--executor", "parsl", "--parsl-config", str(htex_file),
                 "--out", str(tmp_path / "parsl")]) == 0
    for sweep, n in (("c", 4 * 2), ("b", 2 * 2)):
        local, parsl = (_rows(tmp_path / d / f"sweep_{sweep}.csv") for d in ("local", "parsl"))
        assert len(local) == n and parsl == local, sweep
    # and the runs did go through Parsl: one app per run, on the HTEX workers
    logs = list((tmp_path / "runinfo").glob("*/parsl.log"))
    assert len(logs) == 1
    text = logs[0].read_text()
    assert text.count("submitted for App run_point") == 4 * 2 + 2 * 2
    assert list((tmp_path / "runinfo").glob("*/sweep/block-0"))
    out = capsys.readouterr().out
    assert out.count("instant checks extracted") == 2


def test_run_experiments_takes_a_config_object_and_leaves_parsls_global_kernel_alone(
        tmp_path, htex_file):
    import parsl

    cfg = load_parsl_config(str(htex_file))
    res = run_experiments(str(tmp_path / "o"), seeds=1, only=["c"], quick=True,
                          progress=False, executor="parsl", parsl_config=cfg)
    local = run_experiments(str(tmp_path / "l"), seeds=1, only=["c"], quick=True,
                            progress=False, jobs=1)
    strip = lambda rows: [{k: v for k, v in r.items() if k != "wall_seconds"} for r in rows]  # noqa: E731
    assert strip(res["c"]["rows"]) == strip(local["c"]["rows"])
    with pytest.raises(parsl.errors.NoDataFlowKernelError):
        parsl.dfk()                                 # nothing loaded globally


@pytest.mark.parametrize("argv, needle", [
    (["--executor", "parsl"], "--parsl-config: is required with --executor parsl"),
    (["--parsl-config", "x.py"], "--parsl-config: is only for --executor parsl"),
    (["--executor", "parsl", "--parsl-config", "/nonexistent/cfg.py"],
     "--parsl-config: must be an existing Python file"),
])
def test_bad_executor_flags_are_refused_in_one_line(tmp_path, capsys, argv, needle):
    assert main(["experiments", "--quick", "--only", "c", "--no-progress", *argv,
                 "--out", str(tmp_path / "ex")]) == 2
    _one_line_error(capsys, needle)
    assert not (tmp_path / "ex").exists()


@pytest.mark.parametrize("body, needle", [
    ("x = 1\n", "must define a variable named 'config'"),
    ("config = {'executors': []}\n", "'config' must be a parsl.config.Config, not dict"),
    ("raise RuntimeError('no such site')\n", "raised RuntimeError: no such site"),
])
def test_a_config_file_that_does_not_define_a_parsl_config(tmp_path, capsys, body, needle):
    f = tmp_path / "cfg.py"
    f.write_text(body)
    assert main(["experiments", "--quick", "--only", "c", "--no-progress", "--executor",
                 "parsl", "--parsl-config", str(f), "--out", str(tmp_path / "ex")]) == 2
    _one_line_error(capsys, f"--parsl-config: {needle}")
    assert not (tmp_path / "ex").exists()
    with pytest.raises(InvalidArgument) as e:
        run_experiments(str(tmp_path / "ex"), executor="parsl", parsl_config=str(f))
    assert e.value.field == "parsl_config" and not (tmp_path / "ex").exists()


def test_run_experiments_refuses_a_bad_executor_naming_the_field(tmp_path):
    with pytest.raises(InvalidArgument) as e:
        run_experiments(str(tmp_path / "ex"), executor="slurm")
    assert e.value.field == "executor" and not (tmp_path / "ex").exists()
    with pytest.raises(InvalidArgument) as e:
        run_experiments(str(tmp_path / "ex"), executor="parsl")
    assert e.value.field == "parsl_config"
