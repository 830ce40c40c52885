"""Fixtures and the decisions-per-second summary of the benchmarks. Not tests: the default
run (testpaths = tests) never collects this directory. Run them, all in one session, with::

    python -m pytest benchmarks/ --benchmark-only --decisions-md=benchmarks/last-run.md

Every benchmark records ``extra_info``: ``key`` (a stable name, used by :data:`RATIOS`),
``label`` and ``decisions`` (per timed round). At the end of the session a table of
decisions per second (median round and best round) and the ratios below are printed, and
written as Markdown to ``--decisions-md`` if given.
"""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
import sys

import numpy as np
import pytest


def _ratios() -> list[tuple[str, str, str]]:
    """(what, numerator key, denominator key): median decisions/s over median decisions/s."""
    r = []
    for keys in ("1", "10000"):
        r.append((f"single call, {keys} key(s): compiled / reference",
                  f"single/compiled/{keys}", f"single/reference/{keys}"))
    for api in ("try_debit_batch", "debit_fixed"):
        for nb in ("10000", "1000000"):
            r.append((f"{api}, batch 1k over {nb} buckets: compiled / reference",
                      f"batch/{api}/{nb}/1000", f"ref-batch/{api}/{nb}/1000"))
            r.append((f"{api}, batch 1M (reference: 100k) over {nb} buckets: "
                      "compiled / reference",
                      f"batch/{api}/{nb}/1000000", f"ref-batch/{api}/{nb}/100000"))
    for nb in ("10000", "1000000"):
        for m in ("1000", "1000000"):
            r.append((f"debit_fixed / try_debit_batch, {m} over {nb} buckets",
                      f"batch/debit_fixed/{nb}/{m}", f"batch/try_debit_batch/{nb}/{m}"))
    for keys in ("1", "10000"):
        for peer in ("token-bucket", "limits-fixed", "limits-moving", "pyrate-limiter"):
            r.append((f"single call, {keys} key(s): compiled / {peer}",
                      f"single/compiled/{keys}", f"single/{peer}/{keys}"))
    for peer in ("token-bucket", "limits-fixed", "limits-moving", "pyrate-limiter"):
        r.append((f"batch 1M over 10000 buckets / {peer} single calls, 10000 keys",
                  "batch/try_debit_batch/10000/1000000", f"single/{peer}/10000"))
    return r


RATIOS = _ratios()


def pytest_addoption(parser):
    parser.addoption("--decisions-md", default=None, metavar="PATH",
                     help="write the decisions/s table and ratios as Markdown to PATH")


@pytest.fixture
def record(benchmark):
    """``record(key, label, decisions, **more)`` fills the benchmark's extra_info."""

    def _record(key: str, label: str, decisions: int, **more) -> None:
        benchmark.extra_info.update(key=key, label=label, decisions=decisions, **more)

    return _record


class Clock:
    """Synthetic seconds that only move forward: one step per timed round."""

    def __init__(self, start: float = 1.0, step: float = 0.01) -> None:
        self.now = start
        self.step = step

    def tick(self) -> float:
        self.now += self.step
        return self.now


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture(scope="session")
def rng():
    return np.random.default_rng(20240601)


# -- the summary ---------------------------------------------------------------------------

def _rate(x: float) -> str:
    if x >= 1e6:
        return f"{x / 1e6:,.2f} M"
    return f"{x / 1e3:,.1f} k"


_LOAD: dict[str, tuple[float, float, float]] = {}


def pytest_sessionstart(session):
    _LOAD["start"] = os.getloadavg()


def _machine() -> list[str]:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f
                       if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, check=False).stdout.strip()
    except OSError:
        commit = "?"
    import bursarcore

    return [f"- date: {datetime.datetime.now().astimezone().isoformat(timespec='minutes')}",
            f"- machine: {cpu}, nproc {os.cpu_count()}, {platform.system()} "
            f"{platform.release()}",
            f"- Python {platform.python_version()}, numpy {np.__version__}, "
            f"bursarcore {bursarcore.__version__} (HEAD {commit}, working tree as run), "
            f"backends {bursarcore.available_backends()}",
            f"- load average (1/5/15 min) at start {_fmt_load(_LOAD.get('start'))}, "
            f"at end {_fmt_load(os.getloadavg())} (other work shares the {os.cpu_count()} CPUs)",
            f"- command: `{' '.join(['python -m pytest'] + sys.argv[1:])}`"]


def _fmt_load(load) -> str:
    return "?" if load is None else "/".join(f"{x:.1f}" for x in load)


def _collect(config) -> dict[str, dict]:
    session = getattr(config, "_benchmarksession", None)  # pytest-benchmark's session
    out: dict[str, dict] = {}
    for b in getattr(session, "benchmarks", []) or []:
        info = b.extra_info
        if not b.stats or "decisions" not in info:
            continue
        n = info["decisions"]
        out[info["key"]] = dict(group=b.group or "", label=info["label"], decisions=n,
                                rounds=b.stats.rounds, median=b.stats.median,
                                rate=n / b.stats.median, best=n / b.stats.min,
                                admitted=info.get("admitted"))
    return out


def _markdown(rows: dict[str, dict]) -> list[str]:
    lines: list[str] = []
    groups: dict[str, list[dict]] = {}
    for row in rows.values():
        groups.setdefault(row["group"], []).append(row)
    for group, members in groups.items():
        lines += ["", f"#### {group}", "",
                  "| benchmark | decisions/round | rounds | median round | "
                  "decisions/s (median) | decisions/s (best) | admitted |",
                  "|---|--:|--:|--:|--:|--:|--:|"]
        for r in members:
            adm = "" if r["admitted"] is None else f"{r['admitted']:.0%}"
            lines.append(f"| {r['label']} | {r['decisions']:,} | {r['rounds']} | "
                         f"{r['median'] * 1e3:,.3f} ms | {_rate(r['rate'])} | "
                         f"{_rate(r['best'])} | {adm} |")
    ratios = [(what, rows[a]["rate"] / rows[b]["rate"])
              for what, a, b in RATIOS if a in rows and b in rows]
    if ratios:
        lines += ["", "#### ratios (median decisions/s over median decisions/s)", "",
                  "| ratio | value |", "|---|--:|"]
        lines += [f"| {what} | {x:,.2f}x |" for what, x in ratios]
    return lines


def pytest_terminal_summary(terminalreporter, config):
    rows = _collect(config)
    if not rows:
        return
    lines = ["### Run", "", *_machine(), *_markdown(rows)]
    terminalreporter.write_sep("=", "decisions per second")
    for line in lines:
        terminalreporter.write_line(line)
    path = config.getoption("--decisions-md")
    if path:
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        terminalreporter.write_line(f"written to {path}")
