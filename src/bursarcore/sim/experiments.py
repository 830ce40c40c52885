"""SPEC §10's three sweeps, several seeds per point, in parallel over the cores.

(a) **grace vs warm headroom**: the default scenario with a work-conserving backfill
    (headroom 0) and a standardized probe — a ``deadline``-class campaign asking for
    exactly 128 GPUs every 300 s — over the opportunistic class's preemption grace and the
    pool's ``warm_headroom``; measured: the probe's median time to 128 GPUs (request →
    lease active), and utilisation.
(b) **overbooking**: a guaranteed interactive campaign (g = 32), backfill, and k correlated
    storms (each s = 64, b = 384, storming together), so that the firm campaigns' ceilings
    sum to 0.9–7.1× the pool; measured: the interactive campaign's p95 grant latency during
    the storm and its violations (a within-guarantee request not active within the grace).
(c) **enforcement**: one storm with bucket B in 5k–150k GPU-s, under ``prepaid`` and
    ``instant`` token checks; measured: GPU-seconds extracted above sustained, against B.

Each point × seed is one :class:`~bursarcore.sim.engine.Simulation` without a journal.
Writes ``sweep_a.csv`` (one row per run), ``sweep_a.png`` and so on, and returns findings.

Where the runs go: local worker processes (``executor="local"``, ``jobs`` of them), or
Parsl (``executor="parsl"``, ``parsl_config=`` a Python file defining ``config``, a
``parsl.config.Config``, as Parsl configs usually are), so a sweep of many seeds spreads
over a cluster's nodes through any Parsl provider. A run depends only on its point and
seed, so both give the same rows but for ``wall_seconds`` (tested).
"""

from __future__ import annotations

import copy
import csv
import math
import multiprocessing as mp
import os
import sys
import time
from typing import Any, Iterable

import numpy as np

from .scenario import load_scenario, parse_scenario

__all__ = ["run_experiments", "sweep_points", "run_point", "Progress", "load_parsl_config",
           "EXECUTORS"]

#: where ``run_experiments`` runs the simulations
EXECUTORS = ("local", "parsl")


def _base_raw() -> dict:
    return copy.deepcopy(load_scenario("default").raw)


def _probe() -> dict:
    return {"name": "probe", "agent": "probe", "class": "deadline", "credits": "unlimited",
            "envelope": {"guaranteed": {"gpu": 0}, "sustained": {"gpu": 128},
                         "ceiling": {"gpu": 128}, "burst": {"gpu": 0}},
            "behaviour": {"size": 128, "every": 300.0, "start": 600.0, "hold": 30.0,
                          "ttl": 1800.0}}


def _storm(i: int, B: float, start: float, end: float, lease: float = 60.0) -> dict:
    return {"name": f"storm{i}", "agent": "storm", "credits": 100000,
            "envelope": {"guaranteed": {"gpu": 0}, "sustained": {"gpu": 64},
                         "ceiling": {"gpu": 384}, "burst": {"gpu": B}},
            "behaviour": {"start": start, "end": end, "lease": lease, "inference": 0.0}}


def scenario_for(sweep: str, params: dict, seed: int, quick: bool) -> Any:
    raw = _base_raw()
    raw["scenario"]["seed"] = seed
    raw["broker"]["journal"] = False
    camps = raw["campaigns"]
    if sweep == "a":
        raw["scenario"]["duration"] = 2400.0 if quick else 7200.0
        raw["broker"]["grace"] = float(params["grace"])
        raw["pool"]["warm_headroom"] = int(params["headroom"])
        for c in camps:
            if c["agent"] == "backfill":
                c["behaviour"]["headroom"] = 0
            if c["agent"] == "storm" and quick:
                c["behaviour"]["start"], c["behaviour"]["end"] = 1200.0, 2000.0
        if quick:
            raw["tasksets"]["science"]["count"] = 1000
            raw["tasksets"]["science"]["arrival_window"] = 2000.0
        camps.append(_probe())
    elif sweep == "b":
        dur = 1500.0 if quick else 3600.0
        raw["scenario"]["duration"] = dur
        keep = [c for c in camps if c["agent"] in ("interactive", "backfill")]
        w0, w1 = (300.0, 1200.0) if quick else (600.0, 3000.0)
        keep += [_storm(i, 150000.0, w0, w1) for i in range(int(params["storms"]))]
        raw["campaigns"] = keep
        raw.pop("tasksets", None)
    elif sweep == "c":
        dur = 1200.0 if quick else 3000.0
        raw["scenario"]["duration"] = dur
        raw["broker"]["enforcement"] = params["enforcement"]
        w0, w1 = (100.0, 1100.0) if quick else (300.0, 2700.0)
        keep = [c for c in camps if c["agent"] in ("backfill",)]
        keep.append(_storm(0, float(params["B"]), w0, w1, lease=300.0))
        raw["campaigns"] = keep
        raw.pop("tasksets", None)
    else:
        raise ValueError(sweep)
    return parse_scenario(raw, source=f"sweep-{sweep}")


def sweep_points(sweep: str, quick: bool = False) -> list[dict]:
    if sweep == "a":
        graces = [30, 120] if quick else [15, 30, 60, 120, 240]
        heads = [0, 128] if quick else [0, 64, 128, 256]
        return [{"grace": g, "headroom": h} for g in graces for h in heads]
    if sweep == "b":
        ks = [1, 9] if quick else [1, 2, 4, 6, 8, 9]
        return [{"storms": k} for k in ks]
    if sweep == "c":
        Bs = [5000, 25000] if quick else [5000, 10000, 25000, 50000, 100000, 150000]
        return [{"B": B, "enforcement": e} for B in Bs for e in ("prepaid", "instant")]
    raise ValueError(sweep)


def run_point(task: tuple[str, dict, int, bool]) -> dict:
    """One run of one sweep point (in a worker process)."""
    from .engine import Simulation

    sweep, params, seed, quick = task
    sc = scenario_for(sweep, params, seed, quick)
    t0 = time.perf_counter()
    res = Simulation(sc, journal=False).run()
    camps = res.summary["campaigns"]
    row = {"sweep": sweep, **params, "seed": seed, "wall_seconds": round(time.perf_counter() - t0, 3),
           "utilisation": res.summary["utilisation"]}
    if sweep == "a":
        p = camps["probe"]
        row.update(time_to_128_median=p["time_to_capacity_median"], probes=p["probes"],
                   probes_unserved=p["probes_unserved"])
    elif sweep == "b":
        v = camps["victim"]
        firm = sum(c.envelope.b(sc.pool.dims[0]) for c in sc.campaigns
                   if c.service_class != "opportunistic")
        row.update(overbooking=firm / res.summary["capacity"],
                   victim_p95=v["storm_latency_p95"], victim_p50=v["storm_latency_p50"],
                   victim_requests=v["storm_requests"], violations=v["violations"],
                   storm_mean_hold=sum(c["avg_hold_window"] or 0.0 for c in camps.values()
                                       if c["agent"] == "storm"))
    else:
        s = camps["storm0"]
        row.update(extracted=s["extracted_above_sustained"], refill=s["refill"],
                   extracted_over_B=s["extracted_above_sustained"] / params["B"])
    return row


class Progress:
    """tqdm when installed, else a plain bar on stderr."""

    def __init__(self, total: int, desc: str, enabled: bool = True) -> None:
        self.total, self.n, self.desc, self.enabled = total, 0, desc, enabled
        self._t0 = time.perf_counter()
        self._tq = None
        if enabled:
            try:
                from tqdm import tqdm

                self._tq = tqdm(total=total, desc=desc, file=sys.stderr, leave=True)
            except ImportError:
                pass

    def update(self, k: int = 1) -> None:
        self.n += k
        if not self.enabled:
            return
        if self._tq is not None:
            self._tq.update(k)
            return
        w = 30
        done = int(w * self.n / max(self.total, 1))
        el = time.perf_counter() - self._t0
        sys.stderr.write(f"\r{self.desc} [{'#' * done}{'.' * (w - done)}] {self.n}/{self.total} "
                         f"{el:5.0f} s")
        sys.stderr.flush()

    def close(self) -> None:
        if self._tq is not None:
            self._tq.close()
        elif self.enabled:
            sys.stderr.write("\n")


def load_parsl_config(path: str | os.PathLike[str]) -> Any:
    """The ``config`` a Parsl config file defines (run as a Python file, as Parsl configs
    are written). Raises :class:`~bursarcore.errors.InvalidArgument` naming
    ``parsl_config`` when the file is missing, fails, defines no ``config``, or defines
    something that is not a ``parsl.config.Config``; or naming ``executor`` when Parsl is
    not installed."""
    import runpy

    from ..errors import InvalidArgument

    try:
        from parsl.config import Config
    except ImportError:
        raise InvalidArgument("executor", "'parsl' needs Parsl (pip install "
                              "'bursarcore[parsl]')", "parsl") from None
    if not os.path.isfile(path):
        raise InvalidArgument("parsl_config", "must be an existing Python file", path)
    try:
        ns = runpy.run_path(os.fspath(path), run_name="__parsl_config__")
    except Exception as e:  # noqa: BLE001 - the user's file: say what it raised
        raise InvalidArgument("parsl_config", f"raised {type(e).__name__}: {e}", path) from None
    if "config" not in ns:
        raise InvalidArgument("parsl_config", "must define a variable named 'config'", path)
    if not isinstance(ns["config"], Config):
        raise InvalidArgument("parsl_config", "'config' must be a parsl.config.Config, not "
                              f"{type(ns['config']).__name__}", path)
    return ns["config"]


def _run_all(tasks: list, jobs: int, desc: str, progress: bool,
             app: Any = None) -> list[dict]:
    """Run the tasks: as the Parsl app ``app`` when given, else in ``jobs`` local
    processes; rows in a fixed order (point, then seed) however they finished."""
    bar = Progress(len(tasks), desc, progress)
    rows: list[dict] = []
    try:
        if app is not None:
            from concurrent.futures import as_completed

            for fut in as_completed([app(t) for t in tasks]):
                rows.append(fut.result())
                bar.update()
        elif jobs <= 1 or len(tasks) <= 1:
            for t in tasks:
                rows.append(run_point(t))
                bar.update()
        else:
            # not fork: a caller with threads (a test runner, a service) can hold a lock at
            # the fork and deadlock the child; forkserver children start from a clean process
            methods = mp.get_all_start_methods()
            ctx = mp.get_context("forkserver" if "forkserver" in methods else "spawn")
            with ctx.Pool(min(jobs, len(tasks))) as pool:
                for r in pool.imap_unordered(run_point, tasks):
                    rows.append(r)
                    bar.update()
    finally:
        bar.close()
    keys = [k for k in tasks[0][1]] + ["seed"]
    rows.sort(key=lambda r: tuple(str(r[k]) if isinstance(r[k], str) else r[k] for k in keys))
    return rows


def _write_csv(rows: list[dict], path: str) -> None:
    fields: list[str] = []
    for r in rows:
        fields += [k for k in r if k not in fields]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in fields})


def _median(rows: Iterable[dict], key: str) -> float:
    x = [r[key] for r in rows if r.get(key) is not None]
    return float(np.median(x)) if x else math.nan


def _mpl():
    try:
        import matplotlib

        matplotlib.use("Agg", force=True)
        import matplotlib.pyplot as plt

        return plt
    except ImportError:
        return None


def _finding_a(rows: list[dict], out: str) -> tuple[str, str | None]:
    graces = sorted({r["grace"] for r in rows})
    heads = sorted({r["headroom"] for r in rows})
    med = {(g, h): _median([r for r in rows if r["grace"] == g and r["headroom"] == h],
                           "time_to_128_median") for g in graces for h in heads}
    util = {(g, h): _median([r for r in rows if r["grace"] == g and r["headroom"] == h],
                            "utilisation") for g in graces for h in heads}
    fig_path = None
    plt = _mpl()
    if plt is not None:
        fig, axs = plt.subplots(1, 2, figsize=(10, 3.6))
        for h in heads:
            axs[0].plot(graces, [med[(g, h)] for g in graces], "o-", label=f"warm headroom {h}")
        axs[0].plot(graces, graces, "k:", lw=1, label="= grace")
        axs[0].set_xlabel("preemption grace (s)")
        axs[0].set_ylabel("median time to 128 GPUs (s)")
        axs[0].set_title("(a) time to capacity tracks the grace")
        axs[0].legend(fontsize=7)
        for g in graces:
            axs[1].plot(heads, [100 * util[(g, h)] for h in heads], "o-", label=f"grace {g} s")
        axs[1].set_xlabel("warm headroom (GPUs)")
        axs[1].set_ylabel("mean utilisation (%)")
        axs[1].set_title("headroom costs utilisation")
        axs[1].legend(fontsize=7)
        fig_path = os.path.join(out, "sweep_a.png")
        fig.savefig(fig_path, dpi=96, bbox_inches="tight")
        plt.close(fig)
    h0 = heads[0]
    slope = np.polyfit(graces, [med[(g, h0)] for g in graces], 1)[0] if len(graces) > 1 else math.nan
    spread = [max(med[(g, h)] for h in heads) - min(med[(g, h)] for h in heads) for g in graces]
    text = (f"median time to 128 GPUs vs grace, headroom {h0}: slope {slope:.2f} s per s of grace "
            f"({', '.join(f'{g}s→{med[(g, h0)]:.0f}s' for g in graces)}); across warm headroom "
            f"{heads[0]}–{heads[-1]} the median moves by at most {max(spread):.0f} s at a grace; "
            f"utilisation {100 * util[(graces[0], heads[0])]:.1f}% → "
            f"{100 * util[(graces[0], heads[-1])]:.1f}% from headroom {heads[0]} to {heads[-1]}")
    return text, fig_path


def _finding_b(rows: list[dict], out: str) -> tuple[str, str | None]:
    ks = sorted({r["storms"] for r in rows})
    ob = {k: _median([r for r in rows if r["storms"] == k], "overbooking") for k in ks}
    p95 = {k: _median([r for r in rows if r["storms"] == k], "victim_p95") for k in ks}
    viol = {k: sum(r["violations"] for r in rows if r["storms"] == k) for k in ks}
    hold = {k: _median([r for r in rows if r["storms"] == k], "storm_mean_hold") for k in ks}
    fig_path = None
    plt = _mpl()
    if plt is not None:
        fig, ax = plt.subplots(figsize=(6.5, 3.6))
        xs = [ob[k] for k in ks]
        ax.plot(xs, [p95[k] for k in ks], "o-", label="guaranteed campaign p95 (s)")
        ax.bar(xs, [viol[k] for k in ks], width=0.15, color="#d62728", alpha=0.6,
               label="violations (all seeds)")
        ax.set_xlabel("sum of firm burst ceilings / pool")
        ax.set_ylabel("seconds / count")
        ax.set_title("(b) guarantees under overbooking")
        ax2 = ax.twinx()
        ax2.plot(xs, [hold[k] for k in ks], "s--", color="#888", label="storms' total mean hold")
        ax2.set_ylabel("GPUs held by the storms")
        ax.legend(fontsize=7, loc="upper left")
        fig_path = os.path.join(out, "sweep_b.png")
        fig.savefig(fig_path, dpi=96, bbox_inches="tight")
        plt.close(fig)
    text = (f"overbooking {ob[ks[0]]:.1f}x–{ob[ks[-1]]:.1f}x: guaranteed p95 "
            f"{', '.join(f'{p95[k]:.1f}s' for k in ks)}; violations {sum(viol.values())} "
            f"over {len(rows)} runs")
    return text, fig_path


def _finding_c(rows: list[dict], out: str) -> tuple[str, str | None]:
    Bs = sorted({r["B"] for r in rows})
    ext = {(B, e): _median([r for r in rows if r["B"] == B and r["enforcement"] == e], "extracted")
           for B in Bs for e in ("prepaid", "instant")}
    fig_path = None
    plt = _mpl()
    if plt is not None:
        fig, ax = plt.subplots(figsize=(6.5, 3.6))
        for e, m in (("prepaid", "o-"), ("instant", "s-")):
            ax.plot(Bs, [ext[(B, e)] for B in Bs], m, label=f"{e} leases")
        ax.plot(Bs, Bs, "k:", lw=1, label="= B")
        ax.set_xlabel("bucket B (GPU-s)")
        ax.set_ylabel("GPU-s extracted above sustained")
        ax.set_title("(c) token enforcement: instant checks leak")
        ax.legend(fontsize=8)
        fig_path = os.path.join(out, "sweep_c.png")
        fig.savefig(fig_path, dpi=96, bbox_inches="tight")
        plt.close(fig)
    ref = 25000 if 25000 in Bs else Bs[0]
    text = (f"B = {ref:,}: instant checks extracted {ext[(ref, 'instant')]:,.0f} GPU-s, prepaid "
            f"{ext[(ref, 'prepaid')]:,.0f}; prepaid/B over the sweep "
            f"{min(ext[(B, 'prepaid')] / B for B in Bs):.2f}–{max(ext[(B, 'prepaid')] / B for B in Bs):.2f}, "
            f"instant/B {min(ext[(B, 'instant')] / B for B in Bs):.1f}–"
            f"{max(ext[(B, 'instant')] / B for B in Bs):.1f}")
    return text, fig_path


_FINDINGS = {"a": _finding_a, "b": _finding_b, "c": _finding_c}


def run_experiments(out: str, seeds: int = 3, jobs: int = 1, only: list[str] | None = None,
                    quick: bool = False, progress: bool = True, executor: str = "local",
                    parsl_config: str | Any = None) -> dict[str, dict]:
    """Run the sweeps; write a CSV and a figure per sweep into ``out``; return findings.

    ``executor="local"``: ``jobs`` worker processes. ``executor="parsl"``: through Parsl,
    ``parsl_config`` a config file's path (see :func:`load_parsl_config`) or a
    ``parsl.config.Config``; ``jobs`` is then unused (the config decides). Bad arguments
    raise :class:`~bursarcore.errors.InvalidArgument` naming them before anything runs or
    is written."""
    from ..errors import InvalidArgument

    if executor not in EXECUTORS:
        raise InvalidArgument("executor", f"must be one of {', '.join(EXECUTORS)}", executor)
    config = None
    if executor == "parsl":
        if parsl_config is None:
            raise InvalidArgument("parsl_config", "is required with executor 'parsl'", None)
        config = load_parsl_config(parsl_config) if isinstance(parsl_config, (str, os.PathLike)) \
            else parsl_config
    elif parsl_config is not None:
        raise InvalidArgument("parsl_config", "is only for executor 'parsl'", parsl_config)
    os.makedirs(out, exist_ok=True)
    dfk = app = None
    if config is not None:
        from parsl import python_app
        from parsl.dataflow.dflow import DataFlowKernel

        # a DataFlowKernel of its own, not Parsl's global one (a caller that loaded its
        # own keeps it); one for every sweep, so the workers start once
        dfk = DataFlowKernel(config)
        app = python_app(run_point, data_flow_kernel=dfk)
    try:
        return _sweeps(out, seeds, jobs, only, quick, progress, app)
    finally:
        if dfk is not None:
            dfk.cleanup()


def _sweeps(out: str, seeds: int, jobs: int, only: list[str] | None, quick: bool,
            progress: bool, app: Any) -> dict[str, dict]:
    result = {}
    for sweep in (only or ["a", "b", "c"]):
        tasks = [(sweep, pt, 7 + s, quick) for pt in sweep_points(sweep, quick)
                 for s in range(seeds)]
        rows = _run_all(tasks, jobs, f"sweep ({sweep})", progress, app)
        csv_path = os.path.join(out, f"sweep_{sweep}.csv")
        _write_csv(rows, csv_path)
        finding, fig = _FINDINGS[sweep](rows, out)
        result[sweep] = {"finding": finding, "csv": csv_path, "figure": fig, "rows": rows}
    return result
