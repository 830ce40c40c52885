"""What the tests that drive ``bursar-run`` against the real single-node Slurm
(``scripts/slurm/up.sh``) share: the CLI, its status, bounded waits, task files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from bursarcore.runtime import TaskQueue
from slurm_cluster import run


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bursarcore.runtime.cli", *args],
                          capture_output=True, text=True, timeout=timeout)


def status(queue) -> dict:
    cp = cli("status", "--queue", str(queue), "--json")
    assert cp.returncode == 0, cp.stderr
    return json.loads(cp.stdout)


def wait_finished(queue, timeout: float, on_tick=None) -> dict:
    """Poll (bounded) until nothing is pending or claimed and no array task is live."""
    deadline = time.monotonic() + timeout
    st: dict = {}
    while time.monotonic() < deadline:
        st = status(queue)
        if st["finished"] and st["arrays"] and not any(a["live"] for a in st["arrays"]):
            return st
        if on_tick:
            on_tick(st)
        time.sleep(0.5)
    logs = sorted(os.listdir(os.path.join(queue, "logs")))[:4]
    tails = {n: open(os.path.join(queue, "logs", n)).read()[-1500:] for n in logs}
    pytest.fail(f"not finished after {timeout} s: {json.dumps(st)}\nlogs: {tails}")


def write_tasks(path, tasks) -> str:
    path.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    return str(path)


def first_array(queue) -> str:
    """The job id of the first array ``bursar-run submit`` recorded for ``queue``."""
    with open(os.path.join(queue, "jobs.json")) as f:
        return json.load(f)["arrays"][0]["job_id"]


def held_claims(q: TaskQueue, job: str, min_age: float) -> list[tuple[str, str]]:
    """(task id, ``<job>_<idx>``) of claims of array ``job`` held for at least ``min_age`` s."""
    out = []
    now = time.time()
    for rec in q.claims():
        c = rec.get("claim") or {}
        worker = str(c.get("worker", ""))          # host:pid:<job>_<idx> (default id)
        task = worker.rsplit(":", 1)[-1]
        if task.startswith(f"{job}_") and now - c.get("claimed_at", now) >= min_age:
            out.append((rec["id"], task))
    return sorted(out)


def wrapper_logs(queue) -> str:
    """Every array task's output (the wrappers' log lines), concatenated."""
    d = os.path.join(queue, "logs")
    return "".join(open(os.path.join(d, n)).read() for n in sorted(os.listdir(d))
                   if n.endswith(".out"))


def history(q: TaskQueue, task_id: str) -> list[str]:
    return [h["event"] for h in q.get(task_id)[1]["history"]]


def squeue_jobs(job_ids) -> list[dict]:
    """``squeue --json`` records (22.05 ignores ``-j``: filtered here) of ``job_ids``."""
    out = run("squeue", "--json")
    assert out.returncode == 0, out.stderr
    wanted = {int(j) for j in job_ids}
    return [j for j in json.loads(out.stdout)["jobs"]
            if j.get("job_id") in wanted or j.get("array_job_id") in wanted]
