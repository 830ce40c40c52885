"""bursar simulate's outputs: report.html (self-contained), journal.jsonl, summary.json."""

from __future__ import annotations

import json
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
