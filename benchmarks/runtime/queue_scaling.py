"""Claim + complete throughput of :class:`~bursarcore.runtime.TaskQueue` against worker
processes: this tree's queue, and optionally (``--impl new,old --old-rev REV``, in the
same run, for a ratio) the queue of another revision (its whole ``runtime`` package).

W forked worker processes each open the queue and, from one common instant, loop
``claim(0)`` → ``complete(c)`` on no-op tasks until ``claim`` returns ``None`` or the time
limit passes. Reported per run: claims + completions per second (``ops/s``, from the common
start to the last worker's end), tasks per second, and the claim wait (the duration of one
``claim()`` call) p50 / p99 / max, the p99 of the steady state (each worker's first
claim, which lists every shard, and its last, which finds the queue empty, lists every
shard and scans for stale claims, left out), the median first and last claim, and how
many first, steady and last claims waited over 100 ms. Every run is verified afterwards:
no task claimed twice,
every ``complete`` accepted, ``counts()`` = done for what was claimed and pending for the
rest, ``check() == []``.

Usage::

    python benchmarks/runtime/queue_scaling.py [--workers 1,16,64,256] [--durable both]
        [--impl new[,old] --old-rev REV] [--tasks 4000] [--limit 20] [--dir /var/tmp]
        [--json OUT.json]

Prints one Markdown table row per run (the table of ``benchmarks/RESULTS_runtime.md``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

CTX = mp.get_context("fork")
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def load_impl(name: str, old_rev: str | None) -> Any:
    """The queue module: ``new`` is this tree's; ``old`` is ``queue.py`` of ``old_rev``,
    with the whole ``runtime`` package of that revision imported beside this tree's as
    ``bursarcore._runtime_old`` (its modules import each other, and ``..errors`` resolves
    to this tree's)."""
    if name in ("new", "new3"):  # new3: this tree's queue on a queue of format 3
        from bursarcore.runtime import queue
        return queue
    prefix = "src/bursarcore/runtime/"
    names = subprocess.run(["git", "-C", REPO, "ls-tree", "--name-only", old_rev, prefix],
                           check=True, capture_output=True, text=True).stdout.split()
    pkg = os.path.join(tempfile.mkdtemp(prefix="queue-old-"), "runtime_old")
    os.makedirs(pkg)
    for path in names:
        if path.endswith(".py"):
            src = subprocess.run(["git", "-C", REPO, "show", f"{old_rev}:{path}"], check=True,
                                 capture_output=True, text=True).stdout
            with open(os.path.join(pkg, os.path.basename(path)), "w") as f:
                f.write(src)
    spec = importlib.util.spec_from_file_location(
        "bursarcore._runtime_old", os.path.join(pkg, "__init__.py"),
        submodule_search_locations=[pkg])
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return importlib.import_module("bursarcore._runtime_old.queue")


def _sleep_until(t: float) -> None:
    while (dt := t - time.monotonic()) > 0:
        time.sleep(min(dt, 0.05))


def _worker(mod: Any, root: str, wid: int, t0: float, t_stop: float, out: str) -> None:
    q = mod.TaskQueue(root, worker=f"w{wid}")
    claimed, waits, not_ok = [], [], 0
    _sleep_until(t0)
    while time.monotonic() < t_stop:
        a = time.monotonic()
        c = q.claim(0)
        waits.append(time.monotonic() - a)
        if c is None:
            break
        claimed.append(c.task_id)
        not_ok += not q.complete(c, {"w": wid})
    end = time.monotonic() - t0
    with open(out + ".tmp", "w") as f:
        json.dump({"claimed": claimed, "waits": waits, "not_ok": not_ok, "end": end}, f)
    os.replace(out + ".tmp", out)


def as_format_3(mod: Any, root: str) -> Any:
    """Reopen the new, empty queue at ``root`` as a queue of format 3 (finished records in
    the shard directories), which this tree's queue reads and writes in that layout."""
    cfg = os.path.join(root, "queue.json")
    with open(cfg) as f:
        data = json.load(f)
    with open(cfg, "w") as f:
        json.dump({**data, "format": 3}, f)
    for k in os.listdir(os.path.join(root, "shards")):
        os.rmdir(os.path.join(root, "shards", k, "finished"))
    return mod.TaskQueue(root)


def run(mod: Any, impl: str, workers: int, durable: bool, n_tasks: int, limit: float,
        workdir: str) -> dict[str, Any]:
    root = os.path.join(workdir, f"q-{impl}-{workers}-{int(durable)}")
    shutil.rmtree(root, ignore_errors=True)
    q = mod.TaskQueue.create(root, mod.QueueConfig(durable=durable), lock="fcntl")
    if impl == "new3":
        q = as_format_3(mod, root)
    a = time.monotonic()
    q.put_many([(f"t{i:06d}", None) for i in range(n_tasks)])
    put_s = time.monotonic() - a
    load = os.getloadavg()[0]
    t0 = time.monotonic() + 0.5 + 0.01 * workers  # after every fork and open
    outs = [os.path.join(root, f".log{w}.json") for w in range(workers)]
    procs = [CTX.Process(target=_worker, args=(mod, root, w, t0, t0 + limit, outs[w]))
             for w in range(workers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(limit + 120)
    killed = sum(p.is_alive() for p in procs)
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    logs = [json.load(open(o)) for o in outs if os.path.exists(o)]
    claimed = [t for lg in logs for t in lg["claimed"]]
    waits = np.array([w for lg in logs for w in lg["waits"]] or [0.0])
    steady = np.array([w for lg in logs for w in lg["waits"][1:-1]] or [0.0])
    first = np.array([lg["waits"][0] for lg in logs if lg["waits"]] or [0.0])
    last = np.array([lg["waits"][-1] for lg in logs if len(lg["waits"]) > 1] or [0.0])
    elapsed = max(lg["end"] for lg in logs)
    problems = []
    if killed or len(logs) != workers:
        problems.append(f"{killed} killed, {workers - len(logs)} without a log")
    if len(set(claimed)) != len(claimed):
        problems.append(f"{len(claimed) - len(set(claimed))} tasks claimed twice")
    if sum(lg["not_ok"] for lg in logs):
        problems.append("a complete() returned False")
    counts = q.counts()
    if impl == "new3" and (q.format != 3
                           or os.path.isdir(os.path.join(root, "shards", "0", "finished"))):
        problems.append("the format 3 queue changed layout")
    want = {"pending": n_tasks - len(claimed), "claimed": 0, "done": len(claimed), "failed": 0}
    if counts != want:
        problems.append(f"counts {counts}, expected {want}")
    problems += q.check()
    shutil.rmtree(root, ignore_errors=True)
    n = len(claimed)
    return {"impl": impl, "workers": workers, "durable": durable, "tasks": n_tasks, "done": n,
            "put_s": put_s, "elapsed_s": elapsed, "tasks_per_s": n / elapsed,
            "ops_per_s": 2 * n / elapsed, "wait_ms_p50": 1e3 * float(np.median(waits)),
            "wait_ms_p99": 1e3 * float(np.percentile(waits, 99)),
            "wait_ms_max": 1e3 * float(waits.max()),
            "wait_ms_p99_steady": 1e3 * float(np.percentile(steady, 99)), "load_1min": load,
            "wait_ms_first_p50": 1e3 * float(np.median(first)),
            "wait_ms_first_max": 1e3 * float(first.max()),
            "wait_ms_last_p50": 1e3 * float(np.median(last)),
            "wait_ms_last_max": 1e3 * float(last.max()),
            "over_100ms": [int((first > 0.1).sum()), int((steady > 0.1).sum()),
                           int((last > 0.1).sum())],
            "verified": not problems, "problems": problems[:5]}


def row(r: dict[str, Any]) -> str:
    return (f"| {r['impl']} | {r['workers']} | {'yes' if r['durable'] else 'no'} | "
            f"{r['done']}/{r['tasks']} in {r['elapsed_s']:.1f} s | **{r['ops_per_s']:,.0f}** | "
            f"{r['tasks_per_s']:,.0f} | {r['wait_ms_p50']:.2f} / {r['wait_ms_p99']:.1f} / "
            f"{r['wait_ms_max']:.0f} | {r['wait_ms_p99_steady']:.1f} | "
            f"{r['wait_ms_first_p50']:.0f} / {r['wait_ms_last_p50']:.0f} | "
            f"{'/'.join(map(str, r['over_100ms']))} | {r['put_s']:.1f} | {'yes' if r['verified'] else 'NO ' + '; '.join(r['problems'])} | "
            f"{r['load_1min']:.1f} |")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", default="1,16,64,256")
    p.add_argument("--durable", choices=("yes", "no", "both"), default="both")
    p.add_argument("--impl", default="new",
                   help="comma list of new, new3 (this tree's queue on a format 3 queue), old")
    p.add_argument("--old-rev", help="the revision whose queue.py is 'old'")
    p.add_argument("--tasks", type=int, default=4000)
    p.add_argument("--limit", type=float, default=20.0, help="seconds per run (bounded)")
    p.add_argument("--dir", default=tempfile.gettempdir(), help="local-disk work directory")
    p.add_argument("--json", help="also write the results here")
    a = p.parse_args(argv)
    if "old" in a.impl.split(",") and not a.old_rev:
        p.error("--impl old needs --old-rev REV")
    mods = {impl: load_impl(impl, a.old_rev) for impl in a.impl.split(",")}
    durables = {"yes": [True], "no": [False], "both": [True, False]}[a.durable]
    workdir = tempfile.mkdtemp(prefix="queue-scaling-", dir=a.dir)
    print("| queue | workers | durable | done | claims+completions/s | tasks/s | claim wait ms p50 / p99 / max | steady p99 ms | first / last claim p50 ms | > 100 ms first/steady/last | put_many s | verified | load |")
    print("|---|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|---|--:|")
    results = []
    try:
        for durable in durables:
            for w in map(int, a.workers.split(",")):
                for impl, mod in mods.items():  # old and new back to back: same conditions
                    r = run(mod, impl, w, durable, a.tasks, a.limit, workdir)
                    results.append(r)
                    print(row(r), flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0 if all(r["verified"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
