"""``add_simulate`` / ``add_experiments`` on an argparse parser, as __main__ registers them."""

from __future__ import annotations

import argparse
import json

import pytest

from bursarcore.sim.cli import add_experiments, add_simulate

TINY = """
[scenario]
name = "tiny"
duration = 600
seed = 3
[pool]
gpu = 64
[[campaigns]]
name = "victim"
agent = "interactive"
credits = 100
[campaigns.envelope]
guaranteed = { gpu = 8 }
sustained = { gpu = 8 }
ceiling = { gpu = 16 }
[campaigns.behaviour]
units = [1, 4]
[[campaigns]]
name = "storm"
agent = "storm"
credits = 1000
[campaigns.envelope]
sustained = { gpu = 8 }
ceiling = { gpu = 48 }
burst = { gpu = 4000 }
[campaigns.behaviour]
start = 100
end = 400
[[campaigns]]
name = "backfill"
agent = "backfill"
credits = "unlimited"
[campaigns.envelope]
sustained = { gpu = 64 }
ceiling = { gpu = 64 }
burst = { gpu = "unlimited" }
[campaigns.behaviour]
headroom = 8
"""


def main(argv):
    p = argparse.ArgumentParser(prog="bursar")
    sub = p.add_subparsers(dest="command", required=True)
    add_simulate(sub)
    add_experiments(sub)
    args = p.parse_args(argv)
    return args.func(args)


def test_simulate_writes_outputs(tmp_path, capsys):
    f = tmp_path / "tiny.toml"
    f.write_text(TINY)
    out = tmp_path / "out"
    assert main(["simulate", str(f), "--out", str(out)]) == 0
    assert (out / "report.html").exists() and (out / "journal.jsonl").exists()
    s = json.loads((out / "summary.json").read_text())
    assert s["summary"]["scenario"] == "tiny"
    text = capsys.readouterr().out
    assert "report" in text and "(1)" in text


def test_simulate_bad_scenario_exits_2(tmp_path, capsys):
    f = tmp_path / "bad.toml"
    f.write_text(TINY.replace("ceiling = { gpu = 48 }", "ceiling = { gpu = 4 }"))
    assert main(["simulate", str(f), "--out", str(tmp_path / "o")]) == 2
    assert "campaigns[1].envelope.ceiling.gpu" in capsys.readouterr().err


def test_simulate_list(capsys):
    assert main(["simulate", "--list"]) == 0
    assert "default" in capsys.readouterr().out


def test_experiments_quick(tmp_path, capsys):
    out = tmp_path / "ex"
    assert main(["experiments", "--quick", "--seeds", "1", "--jobs", "2", "--only", "c",
                 "--out", str(out), "--no-progress"]) == 0
    rows = (out / "sweep_c.csv").read_text().splitlines()
    assert rows[0].startswith("sweep,B,enforcement,seed")
    assert len(rows) == 1 + 4
    text = capsys.readouterr().out
    assert "instant checks extracted" in text


def test_experiments_rejects_zero_seeds(capsys):
    assert main(["experiments", "--seeds", "0"]) == 2


# -- plain mistakes: one line on stderr, exit 2, nothing written -----------------------------
def _one_line_error(capsys, *needles):
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


def test_simulate_a_directory_as_the_scenario(tmp_path, capsys):
    assert main(["simulate", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    _one_line_error(capsys, "scenario", "is a directory")
    assert not (tmp_path / "o").exists()


def test_simulate_a_scenario_that_is_not_text(tmp_path, capsys):
    f = tmp_path / "bin.toml"
    f.write_bytes(b"\xff\xfe[scenario]\n")
    assert main(["simulate", str(f), "--out", str(tmp_path / "o")]) == 2
    _one_line_error(capsys, "not UTF-8")


def test_simulate_a_scenario_that_cannot_be_read(tmp_path, capsys, monkeypatch):
    from bursarcore.sim import scenario

    f = tmp_path / "tiny.toml"
    f.write_text(TINY)

    def denied(*a, **k):
        raise PermissionError(13, "Permission denied", str(f))

    monkeypatch.setattr(scenario, "open", denied, raising=False)
    assert main(["simulate", str(f), "--out", str(tmp_path / "o")]) == 2
    _one_line_error(capsys, "cannot be read (Permission denied)")


@pytest.mark.parametrize("make_out, rule", [
    (lambda d: (d / "file").write_text("keep") and d / "file", "is an existing file"),
    (lambda d: (d / "file").write_text("keep") and d / "file" / "sub", "is a file, not a dir"),
])
def test_simulate_out_that_is_not_a_directory(tmp_path, capsys, make_out, rule):
    f = tmp_path / "tiny.toml"
    f.write_text(TINY)
    out = make_out(tmp_path)
    assert main(["simulate", str(f), "--out", str(out)]) == 2
    line = _one_line_error(capsys, "--out", rule)
    assert "simulated s" not in line                   # refused before running
    assert (tmp_path / "file").read_text() == "keep"


@pytest.mark.parametrize("argv, needle", [
    (["--seed", "-1"], "scenario.seed"),
    (["--duration", "0"], "scenario.duration"),
    (["--duration", "1e400"], "scenario.duration: must be finite"),
    (["--duration", "-5"], "scenario.duration"),
    (["nosuch"], "no such file, nor a shipped scenario"),
])
def test_simulate_bad_numbers_and_names(tmp_path, capsys, argv, needle):
    assert main(["simulate", *argv, "--out", str(tmp_path / "o")]) == 2
    _one_line_error(capsys, needle)
    assert not (tmp_path / "o").exists()


def test_simulate_numba_on_without_numba(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("BURSARCORE_NO_NUMBA", "1")
    assert main(["simulate", "large", "--numba", "on", "--out", str(tmp_path / "o")]) == 2
    _one_line_error(capsys, "--numba on", "not installed")


def test_simulate_write_failure_is_one_line(tmp_path, capsys, monkeypatch):
    from bursarcore.sim import report

    f = tmp_path / "tiny.toml"
    f.write_text(TINY)

    def full(path, text_writer):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(report, "_replace", full)
    assert main(["simulate", str(f), "--out", str(tmp_path / "o"), "--no-journal"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and "No space left on device" in err
    assert list((tmp_path / "o").iterdir()) == []


@pytest.mark.parametrize("argv, needle", [
    (["--jobs", "-1"], "--jobs: must be >= 0"),
    (["--seeds", "0"], "--seeds: must be >= 1"),
])
def test_experiments_bad_numbers(tmp_path, capsys, argv, needle):
    assert main(["experiments", "--quick", "--only", "c", "--no-progress", *argv,
                 "--out", str(tmp_path / "ex")]) == 2
    _one_line_error(capsys, needle)
    assert not (tmp_path / "ex").exists()


def test_experiments_out_that_is_a_file(tmp_path, capsys):
    (tmp_path / "file").write_text("keep")
    assert main(["experiments", "--quick", "--only", "c", "--seeds", "1",
                 "--out", str(tmp_path / "file"), "--no-progress"]) == 2
    _one_line_error(capsys, "--out", "is an existing file")
    assert (tmp_path / "file").read_text() == "keep"


@pytest.mark.parametrize("argv, needle", [
    (["--seed", "-1"], "--seed: must be in [0, 9223372036854775807]"),
    (["--seconds", "0"], "--seconds: must be in [1, 2592000]"),
    (["--seconds", "99999999999999"], "--seconds: must be in [1, 2592000]"),
    (["--journal", "{tmp}"], "--journal: is a directory"),
    (["--journal", "{tmp}/missing/j.jsonl"], "--journal: is in"),
])
def test_demo_plain_mistakes(tmp_path, capsys, argv, needle):
    from bursarcore.__main__ import main as bursar

    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert bursar(["demo", "--no-processes", "--seconds", "5", *argv]) == 2
    _one_line_error(capsys, needle)
    assert list(tmp_path.iterdir()) == []
