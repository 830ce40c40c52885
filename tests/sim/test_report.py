"""bursar simulate's outputs: report.html (self-contained), journal.jsonl, summary.json."""

from __future__ import annotations

import json
import os
import re

import pytest

from bursarcore.journal import import_jsonl
from bursarcore.sim import write_outputs


@pytest.fixture(scope="module")
def outputs(short_result, tmp_path_factory):
    d = tmp_path_factory.mktemp("report")
    return d, write_outputs(short_result, d)


def test_files(outputs, short_result):
    d, paths = outputs
    assert set(paths) == {"report", "journal", "summary"}
    s = json.loads((d / "summary.json").read_text())
    assert s["summary"]["scenario"] == "default"
    assert [c["claim"] for c in s["claims"]] == [1, 2, 3, 4, 5, 6]
    j = import_jsonl(d / "journal.jsonl")
    assert len(j) == len(short_result.journal)


def test_report_is_self_contained(outputs):
    html = (outputs[0] / "report.html").read_text()
    assert html.startswith("<!DOCTYPE html>")
    # no network: no external src/href, no http(s) fetches
    assert not re.search(r"""(src|href)\s*=\s*['"](?!data:|#)""", html)
    assert "http://" not in html and "https://" not in html
    assert "id='timeline-data'" in html and "tl-slider" in html
    for claim in range(1, 7):
        assert f"<tr><td>{claim}</td>" in html


def test_report_figures(outputs):
    pytest.importorskip("matplotlib")
    html = (outputs[0] / "report.html").read_text()
    figs = re.findall(r"data-figure='(\w+)' src='data:image/png;base64,", html)
    assert {"occupancy", "storm", "latency", "utilisation", "credits", "io"} <= set(figs)


POPULATION_ONLY = """
[scenario]
name = "population-only"
duration = 300
seed = 1
sample_every = 30
[pool]
gpu = 512
[broker]
journal = false
[[populations]]
name = "pop"
count = 40
class = "agent-burst"
credits = "unlimited"
[populations.envelope]
sustained = { gpu = 8 }
ceiling = { gpu = 64 }
burst = { gpu = 20000 }
[populations.behaviour]
arrival_rate = 0.01
job_gpus = [1, 16]
job_seconds = [60.0, 200.0]
lease = 120.0
step = 10.0
"""


@pytest.fixture(scope="module")
def population_result():
    import tomllib

    from bursarcore.sim import Simulation
    from bursarcore.sim.scenario import parse_scenario

    return Simulation(parse_scenario(tomllib.loads(POPULATION_ONLY), "pop.toml")).run()


def test_report_of_populations_alone(population_result, tmp_path):
    """No named campaign: the occupancy figure stacks the population's members as one band,
    and the timeline has its row."""
    pytest.importorskip("matplotlib")
    assert population_result.summary["campaigns"] == {}
    paths = write_outputs(population_result, tmp_path)
    assert population_result.series["groups_held"]["pop"].max() > 0
    html = (tmp_path / "report.html").read_text()
    assert paths["report"] == str(tmp_path / "report.html")
    figs = re.findall(r"data-figure='(\w+)' src='data:image/png;base64,", html)
    assert "occupancy" in figs and "utilisation" in figs
    assert "credits" not in figs          # nothing to draw: no campaign spends credits
    data = json.loads(re.search(r"<script id='timeline-data' type='application/json'>(.*?)"
                                r"</script>", html).group(1))
    assert [c["agent"] for c in data["campaigns"]] == ["population"]
    assert max(data["campaigns"][0]["held"]) > 0


def test_a_report_that_cannot_be_rendered_writes_nothing(population_result, tmp_path,
                                                         monkeypatch):
    from bursarcore.sim import report

    def broken(res):
        raise RuntimeError("figure failed")

    monkeypatch.setattr(report, "figures", broken)
    with pytest.raises(RuntimeError):
        write_outputs(population_result, tmp_path / "out")
    assert not (tmp_path / "out").exists() or os.listdir(tmp_path / "out") == []


def test_outputs_replace_the_previous_run_whole(population_result, tmp_path, monkeypatch):
    from bursarcore.sim import report

    write_outputs(population_result, tmp_path)
    before = {p: (tmp_path / p).read_bytes() for p in ("summary.json", "report.html")}
    monkeypatch.setattr(report, "figures", lambda res: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        write_outputs(population_result, tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["report.html", "summary.json"]
    assert {p: (tmp_path / p).read_bytes() for p in before} == before
