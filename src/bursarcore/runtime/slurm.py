"""Submitting a campaign's worker arrays to Slurm, and watching and cancelling them
(SPEC §13, after RASER §3).

One job array per tier. Each array task runs the wrapper
(:mod:`bursarcore.runtime.wrapper`), which runs the worker (``python -m
bursarcore.runtime.worker``) for that tier against the shared queue::

    sbatch --parsable --job-name=bursar-<queue>-t<T> --array=0-(N-1)%M --requeue
           --open-mode=append --signal=B:TERM@<grace> --output=<queue>/logs/%A_%a.out
           [--mem=<tier mem>] [--time=<limit>] [--partition=P] [--cpus-per-task=C]
           < batch script

The batch script ``exec``\\ s the wrapper: ``--signal=B:`` signals the batch shell only,
so the shell must *become* the wrapper for the warning to reach it (a shell waiting on a
child would not run a trap until the child ended). The wrapper forwards SIGTERM to the
worker, which checkpoints, releases its task and exits 99; the wrapper then requeues its
array task (``scontrol requeue <job>_<task>``). ``--requeue`` lets the task be requeued
at all; ``--open-mode=append`` keeps every run's output in one log (Slurm would
truncate it on the rerun). With ``--time``, the worker also gets ``--walltime-end`` (the
run's start plus the limit), so it can checkpoint before the limit on its own.

Every Slurm command goes through :meth:`SlurmArrays.execute` (the same seam and
:class:`~bursarcore.adapters.base.CommandError` as the facility bindings), so tests feed
recorded output and the same code drives the real scheduler. Array states come from
``squeue --json`` filtered here (22.05 ignores ``-j`` there); an array whose tasks are not
yet split is one record whose ``array_task_string`` (``"2-5%2"``) is expanded to count
its pending tasks.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from ..adapters.base import run_command
from ..errors import CommandError, InvalidArgument
from .wrapper import BOOTSTRAP, STOP_SIGNALS, bootstrap

__all__ = ["ArraySpec", "SlurmArrays", "CommandError", "parse_tiers", "parse_time",
           "batch_script", "parse_signal", "sbatch_argv", "worker_argv", "array_record", "count_task_string",
           "load_jobs", "record_jobs",
           "WORKER_MODULE", "WORKER_CHECKPOINT_MARGIN", "stop_file", "resubmit_spec_path",
           "write_resubmit_spec"]

WORKER_MODULE = "bursarcore.runtime.worker"
WORKER_CHECKPOINT_MARGIN = 120.0
"""The worker's default ``--checkpoint-margin``: with ``--walltime-end`` it checkpoints and
exits 99 this many seconds before the end of its run."""
_MEM = re.compile(r"^[1-9][0-9]*[KMGT]?$")
_SIGNAL_AT = re.compile(r"^(?:SIG)?([A-Z0-9]+)@([0-9]+)$")


def parse_signal(text: str) -> tuple[str, int]:
    """``SIG@SECONDS`` (``bursar-run submit --signal``) → ``(SIG, seconds)``: Slurm sends
    ``SIG`` (``TERM``, ``USR1`` or ``USR2``; a ``SIG`` prefix is accepted) to the batch
    shell ``SECONDS`` (1–65535) before the time limit."""
    m = _SIGNAL_AT.match(str(text).strip().upper())
    if not m:
        raise InvalidArgument("--signal", "must be SIG@SECONDS, e.g. USR1@90", text)
    if m.group(1) not in STOP_SIGNALS:
        raise InvalidArgument("--signal", f"the signal must be one of {', '.join(STOP_SIGNALS)}",
                              text)
    secs = int(m.group(2))
    if not 1 <= secs <= 65535:
        raise InvalidArgument("--signal", "the seconds must be in [1, 65535] (Slurm's limit)", text)
    return m.group(1), secs
_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")
_NAME = re.compile(r"[^A-Za-z0-9_.-]+")


def parse_tiers(text: str | None) -> list[str | None]:
    """``"mem=2G,8G"`` -> ``["2G", "8G"]`` (tier 0, 1, ...); ``None`` -> one tier with the
    partition's default memory. Sizes are Slurm's ``--mem`` values (``<n>[K|M|G|T]``)
    and must not shrink from one tier to the next."""
    if text is None:
        return [None]
    key, sep, values = text.partition("=")
    if not sep or key.strip() != "mem":
        raise InvalidArgument("tiers", "must look like 'mem=2G,8G' (one --mem per tier)", text)
    mems = [v.strip().upper() for v in values.split(",")]
    for m in mems:
        if not _MEM.match(m):
            raise InvalidArgument("tiers", "each memory must be <n>[K|M|G|T], e.g. 2G", m)
    sizes = [_mem_mb(m) for m in mems]
    if any(b < a for a, b in zip(sizes, sizes[1:])):
        raise InvalidArgument("tiers", "memory must not decrease from one tier to the next", text)
    return list(mems)


def _mem_mb(m: str) -> float:
    scale = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}
    return float(m[:-1]) * scale[m[-1]] if m[-1] in scale else float(m)


def parse_time(text: str) -> int:
    """Slurm's ``--time`` (``M``, ``M:S``, ``H:M:S``, ``D-H``, ``D-H:M``, ``D-H:M:S``) in
    seconds; must be positive."""
    m = _TIME.match(text.strip()) if isinstance(text, str) else None
    if not m:
        raise InvalidArgument("time", "must be a Slurm time: M, M:S, H:M:S, D-H, D-H:M or "
                                      "D-H:M:S", text)
    d, a, b, c = m.groups()
    if d is not None:                      # D-H[:M[:S]]
        secs = int(d) * 86400 + int(a) * 3600 + int(b or 0) * 60 + int(c or 0)
    elif c is not None:                    # H:M:S
        secs = int(a) * 3600 + int(b) * 60 + int(c)
    elif b is not None:                    # M:S
        secs = int(a) * 60 + int(b)
    else:                                  # M
        secs = int(a) * 60
    if secs <= 0:
        raise InvalidArgument("time", "must be more than 0 seconds", text)
    return secs


def _default_python_path() -> str | None:
    """The directory to put on ``PYTHONPATH`` so that batch jobs import the same
    bursarcore as this process (None when it is installed in site-packages)."""
    import bursarcore

    pkg = os.path.dirname(os.path.abspath(bursarcore.__file__))
    parent = os.path.dirname(pkg)
    if os.path.basename(parent) in ("site-packages", "dist-packages"):
        return None
    return parent


@dataclass(frozen=True)
class ArraySpec:
    """One tier's worker array.

    ``queue``: the queue directory (absolute). ``tier``: the workers' tier. ``workers``:
    array size N; ``max_running``: at most M tasks at once (``%M``; None: no limit).
    ``mem``: ``--mem`` (None: the partition's default). ``time``: ``--time`` (None: the
    partition's default; no ``--walltime-end`` then). ``grace``: seconds of warning before
    the time limit (``--signal=B:<signal>@grace``). ``signal``: ``TERM`` (default),
    ``USR1`` or ``USR2``, the warning signal; wrapper and worker treat it as SIGTERM. ``agent_grace``: the worker's ``--grace``,
    the time its agent gets to stop after SIGTERM (default half of ``grace``, leaving the
    rest for the checkpoint). ``checkpoint_margin``: the worker's ``--checkpoint-margin``
    (None: its default, :data:`WORKER_CHECKPOINT_MARGIN`); the time limit must exceed it,
    or every run would checkpoint at once and requeue forever.
    ``max_resubmits``: how often a wrapper may submit a lost task again when ``scontrol
    requeue`` is refused (see :mod:`~bursarcore.runtime.wrapper`).
    ``worker_options``: extra worker arguments (``--runner``, ``--image`` ...).
    ``worker_cmd``: the worker program (default ``python -m bursarcore.runtime.worker``);
    the queue, tier, grace and walltime arguments are appended to it. ``python``: the
    interpreter in the batch script. ``python_path``: prepended to ``PYTHONPATH`` there.
    """

    queue: str
    tier: int = 0
    workers: int = 1
    max_running: int | None = None
    mem: str | None = None
    time: str | None = None
    grace: int = 60
    signal: str = "TERM"
    agent_grace: float | None = None
    checkpoint_margin: float | None = None
    partition: str | None = None
    cpus_per_task: int | None = None
    max_restarts: int = 3
    max_resubmits: int = 3
    requeue: str = "self"
    worker_options: tuple[str, ...] = ()
    worker_cmd: tuple[str, ...] | None = None
    python: str = field(default_factory=lambda: sys.executable or "python3")
    python_path: str | None = field(default_factory=_default_python_path)
    job_name: str | None = None
    sbatch_options: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not os.path.isabs(self.queue):
            raise InvalidArgument("queue", "must be an absolute path (batch jobs run elsewhere)",
                                  self.queue)
        for name, lo in (("tier", 0), ("workers", 1), ("grace", 1), ("max_restarts", 0),
                         ("max_resubmits", 0)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise InvalidArgument(name, f"must be an integer >= {lo}", v)
        if self.grace > 65535:
            raise InvalidArgument("grace", "must be at most 65535 s (Slurm's --signal limit)",
                                  self.grace)
        for name in ("max_running", "cpus_per_task"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise InvalidArgument(name, "must be an integer >= 1 or None", v)
        if self.mem is not None and not _MEM.match(self.mem):
            raise InvalidArgument("mem", "must be <n>[K|M|G|T], e.g. 2G", self.mem)
        for name in ("agent_grace", "checkpoint_margin"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                                  or not 0 < v < 1e6):
                raise InvalidArgument(name, "must be a positive number of seconds or None", v)
        if self.agent_grace is not None and self.agent_grace >= self.grace:
            raise InvalidArgument("agent_grace", f"must be shorter than grace ({self.grace} s), "
                                  "leaving time for the checkpoint", self.agent_grace)
        if self.time is not None:
            limit = parse_time(self.time)
            if self.grace >= limit:
                raise InvalidArgument("grace", f"must be shorter than the time limit "
                                               f"({limit} s)", self.grace)
            margin = WORKER_CHECKPOINT_MARGIN if self.checkpoint_margin is None \
                else self.checkpoint_margin
            if margin >= limit:
                raise InvalidArgument("time", f"must be longer than the worker's checkpoint "
                                      f"margin ({margin:g} s), or each run would stop at once",
                                      self.time)
        if self.requeue not in ("self", "admin"):
            raise InvalidArgument("requeue", "must be 'self' or 'admin'", self.requeue)
        if self.signal not in STOP_SIGNALS:
            raise InvalidArgument("signal", f"must be one of {', '.join(STOP_SIGNALS)}", self.signal)
        if self.worker_cmd is not None and not self.worker_cmd:
            raise InvalidArgument("worker_cmd", "must name a program", self.worker_cmd)

    @property
    def name(self) -> str:
        if self.job_name:
            return self.job_name
        base = _NAME.sub("-", os.path.basename(self.queue.rstrip("/")) or "queue")
        return f"bursar-{base}-t{self.tier}"

    @property
    def log_pattern(self) -> str:
        return os.path.join(self.queue, "logs", "%A_%a.out")


def sbatch_argv(spec: ArraySpec) -> list[str]:
    """The ``sbatch`` command for ``spec``; the batch script goes on its stdin."""
    array = f"0-{spec.workers - 1}" + (f"%{spec.max_running}" if spec.max_running else "")
    argv = ["sbatch", "--parsable", f"--job-name={spec.name}", f"--array={array}",
            "--requeue", "--open-mode=append", f"--signal=B:{spec.signal}@{spec.grace}",
            f"--output={spec.log_pattern}"]
    if spec.mem:
        argv.append(f"--mem={spec.mem}")
    if spec.time:
        argv.append(f"--time={spec.time}")
    if spec.partition:
        argv.append(f"--partition={spec.partition}")
    if spec.cpus_per_task:
        argv.append(f"--cpus-per-task={spec.cpus_per_task}")
    return argv + list(spec.sbatch_options)


def worker_argv(spec: ArraySpec) -> list[str]:
    """The worker command inside the batch script (without the walltime argument)."""
    cmd = list(spec.worker_cmd) if spec.worker_cmd else [spec.python, "-m", WORKER_MODULE]
    agent_grace = spec.agent_grace if spec.agent_grace is not None else max(1, spec.grace // 2)
    cmd += ["--queue", spec.queue, "--tier", str(spec.tier), "--grace", f"{agent_grace:g}"]
    if spec.checkpoint_margin is not None:
        cmd += ["--checkpoint-margin", f"{spec.checkpoint_margin:g}"]
    if spec.signal != "TERM":
        cmd += ["--stop-signal", spec.signal]
    return cmd + list(spec.worker_options)


def batch_script(spec: ArraySpec) -> str:
    """The batch script: set ``PYTHONPATH`` and ``exec`` the wrapper around the worker."""
    # python -c BOOTSTRAP: catch SIGTERM before the imports (see wrapper.BOOTSTRAP)
    wrapper = [spec.python, "-c", bootstrap(spec.signal), "--max-restarts", str(spec.max_restarts),
               "--requeue", spec.requeue, "--stop-file", stop_file(spec.queue),
               "--queue", spec.queue, "--resubmit", resubmit_spec_path(spec.queue, spec.tier),
               "--max-resubmits", str(spec.max_resubmits)]
    if spec.signal != "TERM":
        wrapper += ["--stop-signal", spec.signal]
    wrapper.append("--")
    line = shlex.join(wrapper + worker_argv(spec))
    if spec.time:
        # the run's own deadline: a requeued run gets a fresh time limit
        line += f' --walltime-end "$(( $(date +%s) + {parse_time(spec.time)} ))"'
    lines = [
        "#!/bin/bash",
        f"# written by bursar-run: tier {spec.tier} of {spec.queue} ({spec.workers} workers"
        + (f", --mem={spec.mem}" if spec.mem else "") + ")",
        "# exec: the wrapper (bursarcore.runtime.wrapper) replaces this shell, so Slurm's",
        f"# --signal=B:{spec.signal} reaches it; it forwards SIG{spec.signal} to the worker and requeues this",
        "# array task when the worker exits 99",
    ]
    if spec.python_path:
        lines.append(f"export PYTHONPATH={shlex.quote(spec.python_path)}"
                     "${PYTHONPATH:+:$PYTHONPATH}")
    lines.append(f"exec {line}")
    return "\n".join(lines) + "\n"


def resubmit_spec_path(queue: str, tier: int) -> str:
    """``<queue>/slurm/tier<T>.json``: the tier's ``sbatch`` command and batch script, with
    which a wrapper submits a lost task again when ``scontrol requeue`` is refused."""
    return os.path.join(queue, "slurm", f"tier{tier}.json")


def write_resubmit_spec(spec: "ArraySpec") -> str:
    """Write :func:`resubmit_spec_path` for ``spec`` (atomic replace); returns its path."""
    path = resubmit_spec_path(spec.queue, spec.tier)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump({"sbatch": sbatch_argv(spec), "script": batch_script(spec)}, f, indent=1)
    os.replace(tmp, path)
    return path


def stop_file(queue: str) -> str:
    """``<queue>/cancelled``: while it exists, wrappers do not requeue (``bursar-run
    cancel`` creates it before ``scancel``; ``submit`` removes it)."""
    return os.path.join(queue, "cancelled")


def count_task_string(text: str) -> int:
    """Number of array tasks in Slurm's ``array_task_string`` (``"2-5%2"``, ``"1,3-4"``,
    ``"0-9:2"``)."""
    text = (text or "").split("%")[0].strip()
    n = 0
    for part in filter(None, text.split(",")):
        rng, _, step = part.partition(":")
        lo, sep, hi = rng.partition("-")
        if not sep:
            n += 1
            continue
        n += (int(hi) - int(lo)) // int(step or 1) + 1
    return n


class SlurmArrays:
    """Submit, cancel and inspect worker arrays through Slurm's commands.

    Every command goes through :meth:`execute`, which tests override to feed recorded
    output. ``command_timeout``: seconds before a command counts as failed.
    """

    def __init__(self, *, command_timeout: float = 60.0) -> None:
        self.command_timeout = float(command_timeout)
        self.commands: list[list[str]] = []

    def execute(self, argv: Sequence[str], *, input: str | None = None) -> subprocess.CompletedProcess:
        """Run one command; :class:`CommandError` (argv, exit code, stderr) on failure."""
        self.commands.append(list(argv))
        return run_command(argv, input=input, timeout=self.command_timeout)

    def submit(self, spec: ArraySpec) -> str:
        """Submit ``spec``'s array; returns its job id."""
        os.makedirs(os.path.join(spec.queue, "logs"), exist_ok=True)
        argv = sbatch_argv(spec)
        cp = self.execute(argv, input=batch_script(spec))
        job = cp.stdout.strip().split(";")[0]       # "ID" or "ID;cluster"
        if not job.isdigit():
            raise CommandError(argv, 0, f"unexpected sbatch output {cp.stdout!r}", cp.stdout)
        return job

    def cancel(self, job_ids: Sequence[str]) -> None:
        """``scancel`` the arrays (every task, running or pending)."""
        if job_ids:
            self.execute(["scancel", *[str(j) for j in job_ids]])

    def array_states(self, job_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        """Per array job id: ``{"states": {SLURM_STATE: tasks}, "restarts": n}``; an array
        that Slurm no longer lists (purged) is absent."""
        out = self.execute(["squeue", "--json"]).stdout
        try:
            jobs = json.loads(out).get("jobs", [])
        except ValueError as e:
            raise CommandError(["squeue", "--json"], 0, f"unparseable JSON: {e}", out) from None
        wanted = {int(j) for j in job_ids}
        res: dict[str, dict[str, Any]] = {}
        for j in jobs:
            aid = j.get("array_job_id") or j.get("job_id")
            if aid not in wanted:
                continue
            r = res.setdefault(str(aid), {"states": {}, "restarts": 0})
            state = str(j.get("job_state", "UNKNOWN"))
            n = 1
            if j.get("array_task_id") is None and j.get("array_task_string"):
                n = count_task_string(j["array_task_string"])   # not yet split: pending
            r["states"][state] = r["states"].get(state, 0) + n
            r["restarts"] += int(j.get("restart_cnt") or 0)
        return res


# ---------------------------------------------------------------------- jobs.json
def _jobs_path(queue: str) -> str:
    return os.path.join(queue, "jobs.json")


def load_jobs(queue: str) -> list[dict[str, Any]]:
    """The arrays submitted for ``queue`` (``<queue>/jobs.json``), oldest first."""
    try:
        with open(_jobs_path(queue)) as f:
            data = json.load(f)
    except FileNotFoundError:
        return []
    return list(data.get("arrays", []))


def record_jobs(queue: str, arrays: Sequence[Mapping[str, Any]]) -> None:
    """Append ``arrays`` to ``<queue>/jobs.json`` (atomic replace)."""
    doc = {"format": 1, "arrays": load_jobs(queue) + [dict(a) for a in arrays]}
    tmp = f"{_jobs_path(queue)}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    os.replace(tmp, _jobs_path(queue))


def array_record(spec: ArraySpec, job_id: str) -> dict[str, Any]:
    """What ``jobs.json`` keeps of one submitted array."""
    return {"job_id": job_id, "tier": spec.tier, "workers": spec.workers,
            "max_running": spec.max_running, "mem": spec.mem, "time": spec.time,
            "name": spec.name, "submitted_at": time.time(), "sbatch": sbatch_argv(spec)}
