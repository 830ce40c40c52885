"""``add_simulate`` / ``add_experiments`` on an argparse parser, as __main__ registers them."""

from __future__ import annotations

import argparse
import json

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
