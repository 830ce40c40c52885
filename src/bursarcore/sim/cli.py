"""``bursar simulate`` and ``bursar experiments``: ``add_simulate(sub)`` and
``add_experiments(sub)`` register them on the main parser (see ``bursarcore.__main__``)."""

from __future__ import annotations

import argparse
import os
import sys

from ..errors import InvalidArgument
from .paths import check_output_dir

__all__ = ["add_simulate", "add_experiments"]


def _fail(command: str, msg: object) -> int:
    """Bad input: one line on stderr, exit status 2 (as argparse does)."""
    print(f"bursar {command}: error: {msg}", file=sys.stderr)
    return 2


def _make_out(command: str, out: str) -> int | None:
    """Create the output directory once everything else has been checked; 2 if it cannot
    be made."""
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as e:
        return _fail(command, f"--out: cannot be created ({e.strerror}) (got {out!r})")
    return None


def add_simulate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "simulate", help="run a scenario and write report.html, journal.jsonl, summary.json",
        description="Run a scenario (default: the source document's, SPEC §10) on the real "
                    "broker with a manual clock, offline, and write a self-contained "
                    "report.html (figures, an interactive timeline, SPEC §10's claims beside "
                    "this run's values), the decision journal and a summary.")
    p.add_argument("scenario", nargs="?", default="default",
                   help="a scenario TOML file, or a shipped one by name "
                        "(default, large, overbooked, no-backfill, tree; --list)")
    p.add_argument("--out", metavar="DIR", default="bursar-report",
                   help="output directory (default: ./bursar-report)")
    p.add_argument("--seed", type=int, default=None, help="override the scenario's seed")
    p.add_argument("--duration", type=float, default=None,
                   help="override the simulated seconds")
    p.add_argument("--backend", choices=["compiled", "reference"], default=None,
                   help="engine backend (default: compiled when built)")
    p.add_argument("--no-journal", dest="journal", action="store_false", default=None,
                   help="do not journal (faster; no journal.jsonl)")
    p.add_argument("--numba", choices=["auto", "on", "off"], default="auto",
                   help="population kernels: numba if installed (auto), required, or numpy")
    p.add_argument("--list", action="store_true", help="list the shipped scenarios and exit")
    p.set_defaults(func=_simulate)


def _simulate(args: argparse.Namespace) -> int:
    from .engine import Simulation
    from .report import write_outputs
    from .kernels import numba_available
    from .scenario import ScenarioError, builtin_scenarios, load_scenario

    if args.list:
        for name in builtin_scenarios():
            sc = load_scenario(name)
            print(f"{name:14s} {sc.description}")
        return 0
    try:
        sc = load_scenario(args.scenario)
        if args.seed is not None:
            sc = sc.with_changes(**{"scenario.seed": args.seed})
        if args.duration is not None:
            sc = sc.with_changes(**{"scenario.duration": args.duration})
        check_output_dir(args.out)
    except (ScenarioError, InvalidArgument) as e:
        return _fail("simulate", e)
    if args.numba == "on" and not numba_available():
        return _fail("simulate", "--numba on: numba is not installed (pip install "
                                 "'bursarcore[numba]'), or BURSARCORE_NO_NUMBA is set")
    numba = {"auto": None, "on": True, "off": False}[args.numba]
    try:
        sim = Simulation(sc, backend=args.backend, journal=args.journal, use_numba=numba)
    except InvalidArgument as e:   # e.g. --backend compiled where it is not built
        return _fail("simulate", f"--{e}" if e.field == "backend" else e)
    failed = _make_out("simulate", args.out)
    if failed is not None:
        return failed
    print(f"bursar simulate: {sc.name} — {sc.duration:,.0f} simulated s, seed {sc.seed}",
          file=sys.stderr)
    res = sim.run()
    try:
        paths = write_outputs(res, args.out)
    except OSError as e:   # the directory was writable when checked; the disk may be full
        print(f"bursar simulate: cannot write the outputs into {args.out} ({e.strerror}); "
              "nothing partial was left there", file=sys.stderr)
        return 1
    tm = res.timing
    print(f"  {tm['wall_seconds']:.2f} s wall: {tm['engine_seconds']:.2f} s in the broker "
          f"({tm['broker_calls']:,} calls), {tm['agents_seconds']:.2f} s agents and loop")
    for c in res.claims:
        print(f"  ({c['claim']}) {c['verdict']:>16s}: {c['measured']}")
    if res.summary.get("tree"):
        from .report import tree_lines

        for line in tree_lines(res.summary["tree"]):
            print(f"  {line}")
    for k in ("report", "journal", "summary"):
        if k in paths:
            print(f"  {k:8s} {os.path.abspath(paths[k])}")
    return 0


def add_experiments(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "experiments", help="SPEC §10's three sweeps: figures and a CSV per sweep",
        description="(a) preemption grace vs warm headroom → median time to 128 GPUs of a "
                    "standardized probe; (b) overbooking (sum of ceilings up to 7x the pool) "
                    "→ the guaranteed campaign's p95 latency and violations; (c) instant vs "
                    "prepaid token enforcement → GPU-seconds extracted above sustained vs B. "
                    "Several seeds per point, in parallel over the cores.")
    p.add_argument("--seeds", type=int, default=3, help="seeds per point (default 3)")
    p.add_argument("--jobs", type=int, default=0,
                   help="worker processes (default: one per core)")
    p.add_argument("--out", metavar="DIR", default="bursar-experiments",
                   help="output directory (default: ./bursar-experiments)")
    p.add_argument("--only", choices=["a", "b", "c"], action="append",
                   help="run only this sweep (repeatable)")
    p.add_argument("--quick", action="store_true",
                   help="short runs and fewer points (a smoke test, not the finding)")
    p.add_argument("--no-progress", dest="progress", action="store_false",
                   help="no progress bar")
    p.add_argument("--executor", choices=["local", "parsl"], default="local",
                   help="where the runs go: local worker processes (default), or Parsl "
                        "(with --parsl-config), e.g. over a cluster's nodes")
    p.add_argument("--parsl-config", metavar="FILE",
                   help="a Python file defining `config`, a parsl.config.Config "
                        "(--executor parsl)")
    p.set_defaults(func=_experiments)


def _experiments(args: argparse.Namespace) -> int:
    from .experiments import load_parsl_config, run_experiments

    if args.seeds < 1:
        return _fail("experiments", f"--seeds: must be >= 1 (got {args.seeds})")
    if args.jobs < 0:
        return _fail("experiments", f"--jobs: must be >= 0, 0 for one per core (got {args.jobs})")
    config = None
    if args.executor == "parsl" and args.parsl_config is None:
        return _fail("experiments", "--parsl-config: is required with --executor parsl")
    if args.executor != "parsl" and args.parsl_config is not None:
        return _fail("experiments", "--parsl-config: is only for --executor parsl")
    try:
        check_output_dir(args.out)
        if args.executor == "parsl":
            config = load_parsl_config(args.parsl_config)
    except InvalidArgument as e:
        if e.field == "parsl_config":
            return _fail("experiments", f"--parsl-config: {e.rule} (got {args.parsl_config!r})")
        if e.field == "executor":
            return _fail("experiments", f"--executor: {e.rule}")
        return _fail("experiments", e)
    failed = _make_out("experiments", args.out)
    if failed is not None:
        return failed
    jobs = args.jobs or os.cpu_count() or 1
    out = run_experiments(args.out, seeds=args.seeds, jobs=jobs, only=args.only,
                          quick=args.quick, progress=args.progress, executor=args.executor,
                          parsl_config=config)
    for name, info in out.items():
        print(f"  ({name}) {info['finding']}")
        for k in ("csv", "figure"):
            if info.get(k):
                print(f"      {k:6s} {os.path.abspath(info[k])}")
    return 0
