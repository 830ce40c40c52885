"""``bursar simulate`` and ``bursar experiments``: ``add_simulate(sub)`` and
``add_experiments(sub)`` register them on the main parser (see ``bursarcore.__main__``)."""

from __future__ import annotations

import argparse
import os
import sys

__all__ = ["add_simulate", "add_experiments"]


def add_simulate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "simulate", help="run a scenario and write report.html, journal.jsonl, summary.json",
        description="Run a scenario (default: the source document's, SPEC §10) on the real "
                    "broker with a manual clock, offline, and write a self-contained "
                    "report.html (figures, an interactive timeline, SPEC §10's claims beside "
                    "this run's values), the decision journal and a summary.")
    p.add_argument("scenario", nargs="?", default="default",
                   help="a scenario TOML file, or a shipped one by name "
                        "(default, large, overbooked, no-backfill; --list)")
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
    except ScenarioError as e:
        print(f"bursar simulate: {e}", file=sys.stderr)
        return 2
    numba = {"auto": None, "on": True, "off": False}[args.numba]
    print(f"bursar simulate: {sc.name} — {sc.duration:,.0f} simulated s, seed {sc.seed}",
          file=sys.stderr)
    res = Simulation(sc, backend=args.backend, journal=args.journal, use_numba=numba).run()
    paths = write_outputs(res, args.out)
    tm = res.timing
    print(f"  {tm['wall_seconds']:.2f} s wall: {tm['engine_seconds']:.2f} s in the broker "
          f"({tm['broker_calls']:,} calls), {tm['agents_seconds']:.2f} s agents and loop")
    for c in res.claims:
        print(f"  ({c['claim']}) {c['verdict']:>16s}: {c['measured']}")
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
    p.set_defaults(func=_experiments)


def _experiments(args: argparse.Namespace) -> int:
    from .experiments import run_experiments

    if args.seeds < 1:
        print("bursar experiments: --seeds must be >= 1", file=sys.stderr)
        return 2
    jobs = args.jobs or os.cpu_count() or 1
    out = run_experiments(args.out, seeds=args.seeds, jobs=jobs, only=args.only,
                          quick=args.quick, progress=args.progress)
    for name, info in out.items():
        print(f"  ({name}) {info['finding']}")
        for k in ("csv", "figure"):
            if info.get(k):
                print(f"      {k:6s} {os.path.abspath(info[k])}")
    return 0
