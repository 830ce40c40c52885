"""Runtime experiments (SPEC §13, after RASER §4): real worker processes over a
real :class:`bursarcore.runtime.TaskQueue` in a temporary directory.

1. ``makespan``: work stealing (every worker claims from the shared queue until it is
   empty) against static partitioning by array index (task ``i`` runs on worker
   ``i mod W``, each worker runs its own fixed list, as a plain Slurm array does), on a
   heterogeneous workload (log-normal durations, fixed seeds). Tasks sleep a scaled
   duration. Also the *ideal* makespans of the same durations (no processes, no queue),
   computed exactly, so the difference is the queue's and the OS's overhead.
2. ``throughput``: P processes claim and complete no-op tasks from one queue (fcntl lock
   and the lock-file protocol); tasks per second; afterwards checks that no task was
   claimed twice and none was lost.
3. Figures: per-worker Gantt chart (static vs stealing, one seed), makespan bars,
   throughput bars.

Usage::

    python benchmarks/runtime/experiments.py [--quick] [--exp makespan|throughput|all] --out DIR

Writes ``DIR/results.json`` (merged with an existing one, so the experiments can be run
separately), ``DIR/*.csv`` and ``DIR/*.png``. Every run records the load average.
The functions are importable (``tests/runtime/test_experiments.py`` runs them tiny).
"""

from __future__ import annotations

import argparse
import collections
import heapq
import json
import multiprocessing as mp
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any, Sequence

import numpy as np

from bursarcore.runtime import QueueConfig, TaskQueue

CTX = mp.get_context("fork")
CONFIGS = {  # makespan workloads: tasks, worker processes, total work (s), log-normal sigma
    "paper60": dict(n_tasks=60, workers=8, total=48.0, sigma=1.0),   # RASER used 60 tasks
    "many240": dict(n_tasks=240, workers=8, total=48.0, sigma=1.0),  # 30 tasks per worker
    "quick": dict(n_tasks=24, workers=4, total=6.0, sigma=1.0),
}
START_DELAY = 0.5  # s: every worker starts at the same instant, after its fork and open


# --------------------------------------------------------------------------- workloads
def lognormal_durations(n: int, seed: int, sigma: float = 1.0, total: float = 48.0) -> list[float]:
    """``n`` log-normal durations (median-relative spread ``sigma``) scaled to sum to
    ``total`` seconds; in submission (array index) order."""
    d = np.random.default_rng(seed).lognormal(0.0, sigma, n)
    return [float(x) for x in d * (total / d.sum())]


def adversarial_durations(workers: int, rounds: int, long: float, short: float) -> list[float]:
    """Every task with index ``i % workers == 0`` is long, the rest short: static
    partitioning by index puts all long tasks on worker 0."""
    return [long if i % workers == 0 else short for i in range(workers * rounds)]


# --------------------------------------------------------------------------- ideal schedules
def static_assignment(n: int, workers: int) -> list[list[int]]:
    """Task indices of each worker under static partitioning by index (``i mod W``)."""
    return [list(range(w, n, workers)) for w in range(workers)]


def ideal_static(durations: Sequence[float], workers: int) -> float:
    return max((sum(durations[i] for i in part) for part in static_assignment(len(durations), workers)),
               default=0.0)


def ideal_stealing(durations: Sequence[float], workers: int) -> float:
    """Greedy list scheduling in submission order: each task goes to the first free worker
    (what the FIFO queue does with zero overhead)."""
    free = [0.0] * workers
    for d in durations:
        heapq.heappush(free, heapq.heappop(free) + d)
    return max(free)


def lower_bound(durations: Sequence[float], workers: int) -> float:
    """No schedule finishes before the longest task, nor before total work / workers."""
    return max(max(durations, default=0.0), sum(durations) / workers)


def graham_bound(durations: Sequence[float], workers: int) -> float:
    """Any greedy list schedule finishes by total/W + (1 - 1/W) * longest (Graham 1966)."""
    return sum(durations) / workers + (1 - 1 / workers) * max(durations, default=0.0)


# --------------------------------------------------------------------------- workers
def _sleep_until(t: float) -> None:
    while True:
        dt = t - time.monotonic()
        if dt <= 0:
            return
        time.sleep(min(dt, 0.05))


def _stealing_worker(root: str, wid: int, t0: float, out: str) -> None:
    q = TaskQueue(root, worker=f"w{wid}")
    spans = []
    _sleep_until(t0)
    t_overhead = max_op = 0.0
    while True:
        a = time.monotonic()
        c = q.claim(0)
        b = time.monotonic()
        t_overhead += b - a
        max_op = max(max_op, b - a)
        if c is None:
            break
        time.sleep(c.payload["d"])
        e = time.monotonic()
        ok = q.complete(c, {"worker": wid})
        f = time.monotonic()
        t_overhead += f - e
        max_op = max(max_op, f - e)
        spans.append([c.payload["i"], b - t0, e - t0, ok])
    _dump(out, {"worker": wid, "spans": spans, "end": time.monotonic() - t0, "overhead": t_overhead,
                "max_op": max_op})


def _static_worker(durations: list[float], indices: list[int], wid: int, t0: float, out: str) -> None:
    spans = []
    _sleep_until(t0)
    for i in indices:
        b = time.monotonic()
        time.sleep(durations[i])
        spans.append([i, b - t0, time.monotonic() - t0, True])
    _dump(out, {"worker": wid, "spans": spans, "end": time.monotonic() - t0, "overhead": 0.0})


def _dump(path: str, obj: Any) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f)
    os.replace(path + ".tmp", path)


def _run_procs(targets: list[tuple[Any, tuple]], timeout: float, *, allow_timeout: bool = False) -> int:
    """Run the workers; returns how many were still running at ``timeout`` (and were
    terminated). Raises on a timeout unless ``allow_timeout``, and on a worker error."""
    procs = [CTX.Process(target=fn, args=args) for fn, args in targets]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout
    for p in procs:
        p.join(max(0.1, deadline - time.monotonic()))
    alive = [p for p in procs if p.is_alive()]
    for p in alive:
        p.terminate()
        p.join(5)
    if alive and not allow_timeout:
        raise RuntimeError(f"{len(alive)} worker(s) did not finish within {timeout} s")
    bad = [p.exitcode for p in procs if p.exitcode != 0 and p not in alive]
    if bad:
        raise RuntimeError(f"worker exit codes {bad}")
    return len(alive)


# --------------------------------------------------------------------------- experiment 1
def run_makespan(durations: Sequence[float], workers: int, mode: str, workdir: str,
                 *, durable: bool = True, timeout: float = 170.0) -> dict[str, Any]:
    """One real run: ``mode`` is ``"stealing"`` or ``"static"``. Returns makespan (from the
    common start to the last worker's end), busy time, utilisation and per-worker spans."""
    durations = [float(d) for d in durations]
    os.makedirs(workdir, exist_ok=True)
    t0 = time.monotonic() + START_DELAY + 0.02 * workers
    outs = [os.path.join(workdir, f"{mode}-w{w}.json") for w in range(workers)]
    if mode == "stealing":
        root = os.path.join(workdir, "queue")
        shutil.rmtree(root, ignore_errors=True)
        q = TaskQueue.create(root, QueueConfig(durable=durable))
        q.put_many([(f"t{i:05d}", {"i": i, "d": d}) for i, d in enumerate(durations)])
        t0 = time.monotonic() + START_DELAY + 0.02 * workers
        targets = [(_stealing_worker, (root, w, t0, outs[w])) for w in range(workers)]
    elif mode == "static":
        parts = static_assignment(len(durations), workers)
        targets = [(_static_worker, (durations, parts[w], w, t0, outs[w])) for w in range(workers)]
    else:
        raise ValueError(mode)
    _run_procs(targets, timeout)
    logs = []
    for path in outs:
        with open(path) as f:
            logs.append(json.load(f))
    spans = {lg["worker"]: lg["spans"] for lg in logs}
    makespan = max(lg["end"] for lg in logs)
    busy = sum(e - b for lg in logs for _, b, e, _ in lg["spans"])
    ran = collections.Counter(i for lg in logs for i, *_ in lg["spans"])
    res: dict[str, Any] = {
        "mode": mode, "workers": workers, "tasks": len(durations),
        "makespan": makespan,
        "last_task_end": max((e for lg in logs for _, _, e, _ in lg["spans"]), default=0.0),
        "busy": busy, "utilisation": busy / (workers * makespan) if makespan > 0 else 0.0,
        "queue_overhead": sum(lg["overhead"] for lg in logs),
        "max_queue_op": max(lg.get("max_op", 0.0) for lg in logs),
        "ran_once": sorted(ran) == list(range(len(durations))) and all(v == 1 for v in ran.values()),
        "all_completed": all(ok for lg in logs for *_, ok in lg["spans"]),
        "spans": spans,
    }
    if mode == "stealing":
        q = TaskQueue(os.path.join(workdir, "queue"))
        res["queue_counts"] = q.counts()
        res["queue_check"] = q.check()
    return res


def makespan_experiment(seeds: Sequence[int], n_tasks: int, workers: int, total: float,
                        sigma: float, workdir: str, ideal_seeds: int = 1000) -> dict[str, Any]:
    rows = []
    gantt = None
    for s in seeds:
        d = lognormal_durations(n_tasks, s, sigma, total)
        row: dict[str, Any] = {
            "seed": s, "total_work": sum(d), "longest": max(d),
            "lower_bound": lower_bound(d, workers),
            "ideal_static": ideal_static(d, workers), "ideal_stealing": ideal_stealing(d, workers),
            "load_before": os.getloadavg(),
        }
        runs = {}
        for mode in ("static", "stealing"):
            r = run_makespan(d, workers, mode, os.path.join(workdir, f"seed{s}"))
            runs[mode] = r
            row[f"{mode}_makespan"] = r["makespan"]
            row[f"{mode}_utilisation"] = r["utilisation"]
            row[f"{mode}_busy"] = r["busy"]
            row[f"{mode}_ran_once"] = r["ran_once"]
        row["stealing_queue_overhead"] = runs["stealing"]["queue_overhead"]
        row["stealing_max_queue_op"] = runs["stealing"]["max_queue_op"]
        row["stealing_queue_counts"] = runs["stealing"]["queue_counts"]
        row["stealing_queue_check"] = runs["stealing"]["queue_check"]
        row["reduction"] = 1 - row["stealing_makespan"] / row["static_makespan"]
        row["ideal_reduction"] = 1 - row["ideal_stealing"] / row["ideal_static"]
        row["load_after"] = os.getloadavg()
        rows.append(row)
        if gantt is None:
            gantt = {"seed": s, "durations": d,
                     "static": runs["static"]["spans"], "stealing": runs["stealing"]["spans"],
                     "static_makespan": runs["static"]["makespan"],
                     "stealing_makespan": runs["stealing"]["makespan"]}
        print(f"  seed {s}: static {row['static_makespan']:.2f} s (ideal {row['ideal_static']:.2f}), "
              f"stealing {row['stealing_makespan']:.2f} s (ideal {row['ideal_stealing']:.2f}), "
              f"reduction {row['reduction']:.1%} (ideal {row['ideal_reduction']:.1%}), "
              f"util {row['static_utilisation']:.1%} / {row['stealing_utilisation']:.1%}, "
              f"load {os.getloadavg()[0]:.2f}", flush=True)
    # the ideal reduction over many seeds: how typical the measured seeds are
    ideal = []
    for s in range(ideal_seeds):
        d = lognormal_durations(n_tasks, s, sigma, total)
        ideal.append(1 - ideal_stealing(d, workers) / ideal_static(d, workers))
    ideal_arr = np.array(ideal)
    summary = {k: _mean_spread([r[k] for r in rows]) for k in (
        "static_makespan", "stealing_makespan", "ideal_static", "ideal_stealing", "lower_bound",
        "reduction", "ideal_reduction", "static_utilisation", "stealing_utilisation")}
    summary["ideal_reduction_many_seeds"] = {
        "seeds": ideal_seeds, "mean": float(ideal_arr.mean()), "median": float(np.median(ideal_arr)),
        "p10": float(np.percentile(ideal_arr, 10)), "p90": float(np.percentile(ideal_arr, 90)),
        "share_stealing_worse": float((ideal_arr < 0).mean()),
        "share_at_least_39pct": float((ideal_arr >= 0.39).mean())}
    return {"params": {"seeds": list(seeds), "tasks": n_tasks, "workers": workers,
                       "total_work": total, "sigma": sigma, "distribution": "lognormal(0, sigma), scaled",
                       "durable": True},
            "rows": rows, "summary": summary, "gantt": gantt}


def _mean_spread(xs: Sequence[float]) -> dict[str, float]:
    xs = [float(x) for x in xs]
    return {"mean": statistics.fmean(xs), "sd": statistics.stdev(xs) if len(xs) > 1 else 0.0,
            "min": min(xs), "max": max(xs)}


def ideal_sweep(sigmas: Sequence[float], tasks_per_worker: Sequence[int], workers: int = 8,
                seeds: int = 1000) -> list[dict[str, Any]]:
    """Ideal (zero-overhead) reduction of stealing over static, by spread and tasks per
    worker, over many seeds: where a ~39% reduction is and is not to be expected."""
    out = []
    for sigma in sigmas:
        for k in tasks_per_worker:
            n = k * workers
            red, util_st, util_ws = [], [], []
            for s in range(seeds):
                d = lognormal_durations(n, s, sigma, 1.0)
                a, b = ideal_static(d, workers), ideal_stealing(d, workers)
                red.append(1 - b / a)
                util_st.append(1 / (workers * a))
                util_ws.append(1 / (workers * b))
            r = np.array(red)
            out.append({"sigma": sigma, "tasks_per_worker": k, "workers": workers, "seeds": seeds,
                        "reduction_mean": float(r.mean()), "reduction_p10": float(np.percentile(r, 10)),
                        "reduction_p90": float(np.percentile(r, 90)),
                        "share_stealing_worse": float((r < 0).mean()),
                        "util_static_mean": float(np.mean(util_st)), "util_stealing_mean": float(np.mean(util_ws))})
    return out


# --------------------------------------------------------------------------- experiment 2
def _throughput_worker(root: str, wid: int, t0: float, out: str, t_stop: float = float("inf")) -> None:
    q = TaskQueue(root, worker=f"w{wid}")
    claimed, claim_lat, complete_lat, not_ok = [], [], [], 0
    _sleep_until(t0)
    while True:
        a = time.monotonic()
        c = q.claim(0)
        b = time.monotonic()
        if c is None:
            break
        claim_lat.append(b - a)
        claimed.append(c.task_id)
        ok = q.complete(c, {"w": wid})
        complete_lat.append(time.monotonic() - b)
        not_ok += not ok
        if time.monotonic() >= t_stop:
            break  # over time: stop cleanly so the partial run can still be verified
    _dump(out, {"worker": wid, "claimed": claimed, "claim_lat": claim_lat,
                "complete_lat": complete_lat, "not_ok": not_ok, "end": time.monotonic() - t0})


def run_throughput(n_tasks: int, workers: int, lock: str, workdir: str, *, durable: bool = True,
                   timeout: float = 175.0) -> dict[str, Any]:
    """``workers`` processes claim + complete ``n_tasks`` no-op tasks; verifies afterwards."""
    root = os.path.join(workdir, f"q-{lock}-{workers}-{n_tasks}")
    shutil.rmtree(root, ignore_errors=True)
    q = TaskQueue.create(root, QueueConfig(durable=durable), lock=lock)
    a = time.monotonic()
    q.put_many([(f"t{i:06d}", {"i": i}) for i in range(n_tasks)])
    put_s = time.monotonic() - a
    load_before = os.getloadavg()
    t0 = time.monotonic() + START_DELAY + 0.01 * workers
    outs = [os.path.join(workdir, f"tp-{lock}-{workers}-w{w}.json") for w in range(workers)]
    t_stop = t0 + timeout
    killed = _run_procs([(_throughput_worker, (root, w, t0, outs[w], t_stop)) for w in range(workers)],
                        timeout + 60, allow_timeout=True)
    logs = []
    for path in outs:
        if os.path.exists(path):  # a worker killed at the hard limit left none
            with open(path) as f:
                logs.append(json.load(f))
    elapsed = max(lg["end"] for lg in logs)
    claimed = collections.Counter(t for lg in logs for t in lg["claimed"])
    by_worker = {t: lg["worker"] for lg in logs for t in lg["claimed"]}
    finished = sum(claimed.values())
    # verification against the queue's own records
    problems = []
    if killed:
        problems.append(f"{killed} worker(s) killed at the hard time limit")
    twice = [t for t, k in claimed.items() if k > 1]
    if twice:
        problems.append(f"claimed twice: {twice[:5]}")
    unknown = set(claimed) - {f"t{i:06d}" for i in range(n_tasks)}
    if unknown:
        problems.append(f"unknown ids claimed: {sorted(unknown)[:5]}")
    # all done, or (stopped at the time limit) the rest still pending: none lost
    counts = q.counts()
    if counts != {"pending": n_tasks - len(claimed), "claimed": 0, "done": len(claimed), "failed": 0}:
        problems.append(f"counts {counts} after {len(claimed)} distinct claims")
    for tid, _ in q.results():
        rec = q.get(tid)[1]
        events = [h["event"] for h in rec["history"]]
        if rec["attempts"] != 1 or events.count("claim") != 1 or events.count("done") != 1:
            problems.append(f"{rec['id']}: attempts {rec['attempts']}, history {events}")
        if rec["completed_by"] != f"w{by_worker.get(rec['id'])}" or rec["result"] != {"w": by_worker.get(rec["id"])}:
            problems.append(f"{rec['id']}: completed by {rec['completed_by']}, logged by {by_worker.get(rec['id'])}")
    problems += q.check()
    if sum(lg["not_ok"] for lg in logs):
        problems.append(f"{sum(lg['not_ok'] for lg in logs)} completes returned False")
    cl = np.array([x for lg in logs for x in lg["claim_lat"]] or [0.0])
    co = np.array([x for lg in logs for x in lg["complete_lat"]] or [0.0])
    per_worker = [len(lg["claimed"]) for lg in logs]
    res = {
        "tasks": n_tasks, "workers": workers, "lock": lock, "durable": durable,
        "put_many_s": put_s, "elapsed_s": elapsed,
        "finished": finished, "stopped_at_limit": finished < n_tasks,
        "tasks_per_s": finished / elapsed, "ops_per_s": 2 * finished / elapsed,
        "claim_ms_p50": 1e3 * float(np.median(cl)), "claim_ms_p99": 1e3 * float(np.percentile(cl, 99)),
        "claim_ms_max": 1e3 * float(cl.max()),
        "complete_ms_p50": 1e3 * float(np.median(co)), "complete_ms_p99": 1e3 * float(np.percentile(co, 99)),
        "per_worker_min": min(per_worker), "per_worker_max": max(per_worker),
        "verified": not problems, "problems": problems[:20],
        "load_before": load_before, "load_after": os.getloadavg(),
    }
    shutil.rmtree(root, ignore_errors=True)
    return res


def claim_cost_vs_backlog(sizes: Sequence[int], workdir: str, reps: int = 50) -> list[dict[str, Any]]:
    """Single process: claim + complete latency with ``n`` tasks pending (a claim lists
    the shard directories when its lists run out or tasks were added)."""
    out = []
    for n in sizes:
        root = os.path.join(workdir, f"backlog-{n}")
        shutil.rmtree(root, ignore_errors=True)
        q = TaskQueue.create(root, QueueConfig(durable=False))
        q.put_many([(f"t{i:06d}", None) for i in range(n)])
        q.claim(0)  # first claim scans claimed/; not timed
        lat = []
        for _ in range(reps):
            a = time.perf_counter()
            c = q.claim(0)
            q.complete(c, None)
            lat.append(time.perf_counter() - a)
        out.append({"pending": n, "claim_complete_ms_median": 1e3 * statistics.median(lat),
                    "durable": False, "load": os.getloadavg()})
        shutil.rmtree(root, ignore_errors=True)
    return out


# --------------------------------------------------------------------------- lock stress
def _lock_stress_worker(lock_path: str, marker: str, wid: int, t_end: float, hold: float, out: str,
                        stale_after: float) -> None:
    import logging
    from bursarcore.runtime.locks import FileLock
    broken_msgs: list[str] = []

    class _Catch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            broken_msgs.append(record.getMessage())

    logging.getLogger("bursarcore.runtime.locks").addHandler(_Catch())
    logging.getLogger("bursarcore.runtime.locks").propagate = False
    lk = FileLock(lock_path, stale_after=stale_after, owner=f"w{wid}", timeout=60)
    attempts = [0]
    remembered: set[int] = set()
    real_break, real_stale = lk._break, lk._stale

    def _break(info: dict[str, Any]) -> None:  # count every attempt, successful or put back
        attempts[0] += 1
        real_break(info)

    def _stale() -> Any:
        r = real_stale()
        remembered.update(lk._unreadable_since)
        return r

    lk._break, lk._stale = _break, _stale  # type: ignore[method-assign]
    n = overlaps = 0
    while time.monotonic() < t_end:
        with lk:
            try:
                fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                overlaps += 1  # another process is inside the critical section
            else:
                os.close(fd)
                time.sleep(hold)
                os.unlink(marker)
            n += 1
    _dump(out, {"worker": wid, "sections": n, "overlaps": overlaps, "broken": lk.broken,
                "break_attempts": attempts[0], "inodes_remembered": len(remembered),
                "messages": broken_msgs[:5]})


def lock_stress(workers: int, seconds: float, workdir: str, hold: float = 0.0005,
                stale_after: float = 5.0) -> dict[str, Any]:
    """``workers`` processes take the lock-file lock (``stale_after`` seconds; every critical
    section lasts ~``hold``) for ``seconds``; an ``O_EXCL`` marker inside the section detects
    two holders at once. Every break of a lock is a false one here: no holder dies or stalls
    for seconds."""
    os.makedirs(workdir, exist_ok=True)
    lock_path, marker = os.path.join(workdir, ".lock.excl"), os.path.join(workdir, "inside")
    t0 = time.monotonic() + START_DELAY
    outs = [os.path.join(workdir, f"ls-w{w}.json") for w in range(workers)]
    _run_procs([(_lock_stress_worker, (lock_path, marker, w, t0 + seconds, hold, outs[w], stale_after))
                for w in range(workers)], seconds + 90)
    logs = [json.load(open(p)) for p in outs]
    return {"workers": workers, "seconds": seconds, "stale_after": stale_after,
            "sections": sum(lg["sections"] for lg in logs),
            "overlaps": sum(lg["overlaps"] for lg in logs),
            "broken": sum(lg["broken"] for lg in logs),
            "break_attempts": sum(lg["break_attempts"] for lg in logs),
            "workers_remembering_an_inode": sum(lg["inodes_remembered"] > 0 for lg in logs),
            "messages": [m for lg in logs for m in lg["messages"]][:10],
            "load": os.getloadavg()}


# --------------------------------------------------------------------------- figures
def plot_gantt(g: dict[str, Any], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import cm, colors

    d = g["durations"]
    norm = colors.LogNorm(vmin=min(d), vmax=max(d))
    cmap = cm.get_cmap("viridis") if hasattr(cm, "get_cmap") else matplotlib.colormaps["viridis"]
    fig, axes = plt.subplots(2, 1, figsize=(10, 6.5), sharex=True)
    horizon = max(g["static_makespan"], g["stealing_makespan"])
    for ax, mode in zip(axes, ("static", "stealing")):
        spans = g[mode]
        for w, items in spans.items():
            for i, b, e, _ in items:
                ax.barh(int(w), e - b, left=b, height=0.8, color=cmap(norm(d[i])), edgecolor="k", linewidth=0.4)
                if e - b > 0.06 * horizon:
                    ax.text(b + (e - b) / 2, int(w), str(i), ha="center", va="center", fontsize=7, color="w")
        ms = g[f"{mode}_makespan"]
        ax.axvline(ms, color="r", ls="--", lw=1)
        ax.text(ms, len(spans) - 0.6, f"makespan {ms:.2f} s ", color="r", ha="right", va="bottom", fontsize=8)
        ax.set_ylabel("worker")
        ax.set_yticks(range(len(spans)))
        title = "static partitioning (task i on worker i mod W)" if mode == "static" else \
            "work stealing (shared TaskQueue, FIFO claims)"
        ax.set_title(f"{title}, seed {g['seed']}", fontsize=10)
        ax.invert_yaxis()
    axes[-1].set_xlabel("seconds since the common start")
    sm = cm.ScalarMappable(norm=norm, cmap=cmap)
    fig.colorbar(sm, ax=axes, label="task duration (s)")
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def plot_makespans(mk: dict[str, Any], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = mk["rows"]
    x = np.arange(len(rows))
    fig, ax = plt.subplots(figsize=(9, 4.2))
    w = 0.2
    ax.bar(x - 1.5 * w, [r["static_makespan"] for r in rows], w, label="static, measured", color="tab:red")
    ax.bar(x - 0.5 * w, [r["ideal_static"] for r in rows], w, label="static, ideal", color="tab:red", alpha=0.4)
    ax.bar(x + 0.5 * w, [r["stealing_makespan"] for r in rows], w, label="stealing, measured", color="tab:blue")
    ax.bar(x + 1.5 * w, [r["ideal_stealing"] for r in rows], w, label="stealing, ideal", color="tab:blue", alpha=0.4)
    ax.scatter(x, [r["lower_bound"] for r in rows], marker="_", s=900, color="k", zorder=3,
               label="lower bound max(longest, total/W)")
    for k, r in enumerate(rows):
        ax.text(k, max(r["static_makespan"], r["ideal_static"]) * 1.02, f"{r['reduction']:+.0%}",
                ha="center", fontsize=8)
    p = mk["params"]
    ax.set_xticks(x, [f"seed {r['seed']}" for r in rows])
    ax.set_ylabel("makespan (s)")
    ax.set_title(f"{p['tasks']} log-normal(σ={p['sigma']}) tasks, {p['total_work']:.0f} s of work, "
                 f"W={p['workers']} processes; label: measured reduction", fontsize=10)
    ax.legend(fontsize=8, ncol=3, loc="lower center", bbox_to_anchor=(0.5, -0.38))
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def plot_throughput(rows: list[dict[str, Any]], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.8))
    labels = [f"{r['workers']} × {r['lock']}" + ("" if r["durable"] else "\nno fsync") for r in rows]
    bars = ax.bar(range(len(rows)), [r["tasks_per_s"] for r in rows],
                  color=["tab:blue" if r["lock"] == "fcntl" else "tab:orange" for r in rows])
    for b, r in zip(bars, rows):
        ax.text(b.get_x() + b.get_width() / 2, b.get_height(), f"{r['tasks_per_s']:.0f}",
                ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(rows)), labels, fontsize=8)
    ax.set_ylabel("tasks/s (claim + complete)")
    ax.set_title(f"TaskQueue throughput, {rows[0]['tasks']} no-op tasks, ext4, 2 cores", fontsize=10)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


# --------------------------------------------------------------------------- main
def _env() -> dict[str, Any]:
    import bursarcore
    return {"date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "python": platform.python_version(), "bursarcore": getattr(bursarcore, "__version__", "?"),
            "nproc": os.cpu_count(), "command": " ".join([sys.executable.split("/")[-1]] + sys.argv)}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny configuration (~30 s)")
    ap.add_argument("--exp", choices=("makespan", "throughput", "backlog", "ideal", "lockstress", "all"), default="all")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seeds", type=int, default=None, help="number of seeds (makespan)")
    ap.add_argument("--config", choices=sorted(CONFIGS), default="paper60",
                    help="makespan workload (see CONFIGS)")
    ap.add_argument("--tp-configs", default=None,
                    help="throughput configs, e.g. '1:fcntl,8:fcntl,64:fcntl,64:file'")
    ap.add_argument("--tp-tasks", type=int, default=None)
    ap.add_argument("--no-fsync", action="store_true", help="throughput with durable=False")
    ap.add_argument("--ls-workers", type=int, default=16)
    ap.add_argument("--ls-seconds", type=float, default=60.0)
    ap.add_argument("--ls-stale", type=float, default=5.0, help="lockstress: FileLock stale_after")
    ap.add_argument("--tp-limit", type=float, default=150.0,
                    help="throughput: workers stop after this many seconds (rate of what finished)")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    res_path = os.path.join(args.out, "results.json")
    results: dict[str, Any] = {}
    if os.path.exists(res_path):
        with open(res_path) as f:
            results = json.load(f)
    work = tempfile.mkdtemp(prefix="bursar-rt-exp-")
    try:
        if args.exp in ("makespan", "all"):
            n_seeds = args.seeds or (2 if args.quick else 5)
            name = "quick" if args.quick else args.config
            cfg = CONFIGS[name]
            print(f"makespan {name}: {cfg}, seeds 0..{n_seeds - 1}, load {os.getloadavg()}", flush=True)
            mk = makespan_experiment(list(range(n_seeds)), workdir=os.path.join(work, "mk"), **cfg)
            mk["env"] = _env()
            results.setdefault("makespan", {})[name] = mk
            sfx = "" if name == "paper60" else f"_{name}"
            plot_gantt(mk["gantt"], os.path.join(args.out, f"gantt{sfx}.png"))
            plot_makespans(mk, os.path.join(args.out, f"makespan{sfx}.png"))
            with open(os.path.join(args.out, f"makespan{sfx}.csv"), "w") as f:
                keys = ["seed", "total_work", "longest", "lower_bound", "ideal_static", "ideal_stealing",
                        "static_makespan", "stealing_makespan", "reduction", "ideal_reduction",
                        "static_utilisation", "stealing_utilisation", "stealing_queue_overhead"]
                f.write(",".join(keys + ["load1_before", "load1_after"]) + "\n")
                for r in mk["rows"]:
                    f.write(",".join(f"{r[k]:.4f}" if isinstance(r[k], float) else str(r[k]) for k in keys)
                            + f",{r['load_before'][0]:.2f},{r['load_after'][0]:.2f}\n")
        if args.exp in ("throughput", "all"):
            n = args.tp_tasks or (300 if args.quick else 5000)
            spec = args.tp_configs or ("1:fcntl,8:fcntl,8:file" if args.quick else
                                       "1:fcntl,8:fcntl,64:fcntl,64:file")
            rows = results.get("throughput", {}).get("rows", [])
            for item in spec.split(","):
                w, lock = item.split(":")
                print(f"throughput: {n} tasks, {w} workers, lock {lock}, durable {not args.no_fsync}, "
                      f"load {os.getloadavg()}", flush=True)
                r = run_throughput(n, int(w), lock, os.path.join(work, "tp"), durable=not args.no_fsync,
                                   timeout=args.tp_limit)
                r["env"] = _env()
                print(f"  {r['finished']} done in {r['elapsed_s']:.1f} s: {r['tasks_per_s']:.0f} tasks/s ({r['ops_per_s']:.0f} ops/s), claim p50 "
                      f"{r['claim_ms_p50']:.1f} ms p99 {r['claim_ms_p99']:.1f} ms max {r['claim_ms_max']:.0f} ms, per worker "
                      f"{r['per_worker_min']}..{r['per_worker_max']}, verified {r['verified']} "
                      f"{r['problems'][:3]}, load {r['load_after']}", flush=True)
                rows = [x for x in rows if (x["tasks"], x["workers"], x["lock"], x["durable"])
                        != (r["tasks"], r["workers"], r["lock"], r["durable"])] + [r]
            rows.sort(key=lambda x: (x["tasks"], not x["durable"], x["lock"] != "fcntl", x["workers"]))
            results.setdefault("throughput", {})["rows"] = rows
            plot_throughput([x for x in rows if x["tasks"] == n],
                            os.path.join(args.out, "throughput.png" if n == 5000 else f"throughput_{n}.png"))
        if args.exp in ("ideal", "all"):
            sw = ideal_sweep([0.5, 1.0, 1.5], [2, 4, 8, 30], seeds=200 if args.quick else 1000)
            for r in sw:
                print(f"  ideal sigma {r['sigma']} {r['tasks_per_worker']}/worker: reduction mean "
                      f"{r['reduction_mean']:.1%} (p10 {r['reduction_p10']:.1%}, p90 {r['reduction_p90']:.1%}), "
                      f"stealing worse in {r['share_stealing_worse']:.1%}, util {r['util_static_mean']:.1%} "
                      f"/ {r['util_stealing_mean']:.1%}", flush=True)
            results["ideal_sweep"] = sw
        if args.exp == "lockstress":  # not part of "all": it demonstrates a defect
            print(f"lock-file stress: {args.ls_workers} workers, {args.ls_seconds} s, stale_after "
                  f"{args.ls_stale} s, load {os.getloadavg()}", flush=True)
            ls = lock_stress(args.ls_workers, args.ls_seconds, os.path.join(work, "ls"),
                             stale_after=args.ls_stale)
            print(f"  {ls['sections']} critical sections, {ls['overlaps']} overlaps, {ls['broken']} "
                  f"locks broken, {ls['break_attempts']} break attempts, {ls['workers_remembering_an_inode']} "
                  f"workers remembered an 'unreadable' inode, load {ls['load']}: {ls['messages'][:3]}", flush=True)
            results.setdefault("lock_stress_runs", []).append(ls)
        if args.exp in ("backlog", "all"):
            sizes = [100, 1000] if args.quick else [100, 1000, 5000, 10000, 20000]
            print(f"claim cost vs backlog {sizes}, load {os.getloadavg()}", flush=True)
            bl = claim_cost_vs_backlog(sizes, os.path.join(work, "bl"))
            for r in bl:
                print(f"  {r['pending']} pending: claim+complete {r['claim_complete_ms_median']:.2f} ms", flush=True)
            results["backlog"] = bl
    finally:
        shutil.rmtree(work, ignore_errors=True)
    with open(res_path, "w") as f:
        json.dump(results, f, indent=1, default=str)
    print(f"written {res_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
