"""The worker: claims tasks from the queue, runs their agents, checkpoints on SIGTERM.

SPEC §13 (after RASER §3). One worker runs per array task, relaunched by the array task's
wrapper after a crash. Process contract (``docs/runtime.md`` §3)::

    python -m bursarcore.runtime.worker --queue DIR [--tier T] [--id WORKER_ID]
        [--runner none|bwrap|apptainer] [--image IMG] [--secrets FILE] [--scratch DIR]
        [--grace S] [--walltime-end EPOCH_SECONDS] [--checkpoint-margin S]
        [--max-tasks N] [--heartbeat S]

Exit status: **0** no claimable task remains (or ``--max-tasks`` were run); **99** the
worker was told to stop (SIGTERM, or ``--walltime-end - now < --checkpoint-margin``): the
running agent was stopped, checkpointed and its task released with
``resume={"checkpoint": seq}`` — requeue the array task (``scontrol requeue``); anything
else is a crash (2: bad arguments; 1: an unexpected error, logged with its traceback).

For each claimed task: a private workspace ``<scratch>/<task_id>`` (default scratch
``<queue>/workspaces``), emptied, or filled from the task's newest verified checkpoint
(``<queue>/checkpoints/<task_id>``); plugin ``setup`` (and ``restore`` when resuming); the
agent runs through the runner in its own process group, its output appended (secrets
redacted) to ``<queue>/logs/<task_id>.log``; a heartbeat thread refreshes the claim and
stores the plugin's progress in the record's ``resume["progress"]``. Exit 0 → ``complete``
with the plugin's result plus ``{"resumed_from": seq | None}``, then the workspace and
checkpoints are deleted; non-zero → ``fail`` with the exit status and the last stderr
lines (retried by the queue, then ``failed/``; workspace and checkpoints kept).
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Mapping

from .._version import __version__
from ..errors import InvalidArgument
from .checkpoint import CheckpointStore, empty_directory
from .isolation import RUNNERS, NoneRunner, Runner, get_runner
from .plugins import SecretRedactor, TaskContext, load_plugin, load_secrets, plugin_name
from .queue import Claim, TaskQueue, default_worker_id

__all__ = ["Worker", "main", "EXIT_DONE", "EXIT_CHECKPOINTED", "stderr_logging"]

log = logging.getLogger("bursarcore.runtime.worker")

EXIT_DONE = 0
EXIT_CHECKPOINTED = 99
EXIT_CRASH = 1
TAIL_LINES = 10
TAIL_CHARS = 2000


_PRCTL: Callable[..., int] | None
try:  # resolved here, not in the child: no dlopen between fork and exec
    _PRCTL = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # pragma: no cover - not Linux
    _PRCTL = None


def _set_pdeathsig() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Have the kernel SIGKILL the agent if the worker dies (Linux ``PR_SET_PDEATHSIG``)."""
    if _PRCTL is not None:
        _PRCTL(1, int(signal.SIGKILL), 0, 0, 0)


def _describe_exit(rc: int) -> str:
    if rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = f"signal {-rc}"
        return f"agent killed by {name}"
    return f"agent exited with code {rc}"


class _Output:
    """Copies an agent's stdout/stderr to its log file (redacted) and keeps the stderr tail."""

    def __init__(self, proc: subprocess.Popen, path: str, redact: Callable[[str], str],
                 header: str) -> None:
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self._lock = threading.Lock()
        self._redact = redact
        self._f = open(path, "a", encoding="utf-8", errors="replace")
        self._f.write(header + "\n")
        self._f.flush()
        self._threads = [threading.Thread(target=self._pump, args=(proc.stdout, False), daemon=True),
                         threading.Thread(target=self._pump, args=(proc.stderr, True), daemon=True)]
        for t in self._threads:
            t.start()

    def _pump(self, stream, is_err: bool) -> None:
        for raw in iter(stream.readline, b""):
            line = self._redact(raw.decode("utf-8", "replace").rstrip("\n"))
            with self._lock:
                if is_err:
                    self.tail.append(line)
                self._f.write(("[stderr] " if is_err else "") + line + "\n")
                self._f.flush()
        stream.close()

    def close(self, timeout: float = 5.0) -> None:
        # an orphaned grandchild may hold the pipes open; do not wait for it forever
        for t in self._threads:
            t.join(timeout)
        with self._lock:
            self._f.close()


class Worker:
    """Runs tasks from ``queue`` until none is claimable, or until told to stop.

    ``tier``: the worker's memory tier. ``runner``: how agents are isolated (default a
    plain process). ``secrets``: name → value, put in agents' environments only and
    redacted everywhere else. ``scratch``: parent of the task workspaces. ``grace``:
    seconds a SIGTERMed agent gets before SIGKILL. ``walltime_end``/``checkpoint_margin``:
    checkpoint and stop when ``walltime_end - clock() < checkpoint_margin``.
    ``max_tasks``: stop after this many tasks. ``heartbeat``: seconds between heartbeats
    (default ``min(30, stale_after / 6)``). ``clock``: the walltime clock (the queue keeps
    its own). ``poll``: seconds between checks while an agent runs.

    ``idle_poll``: when nothing is claimable but a peer still holds a task this worker
    could run later (a claimed task of an eligible tier: it may fail and be retried here,
    be promoted into this tier, or go stale), the worker waits ``idle_poll`` seconds and
    looks again instead of exiting; otherwise a tier whose workers all left early would be
    stranded with promoted tasks and no worker. ``sleep`` is how it waits (tests inject one).
    """

    def __init__(self, queue: TaskQueue, *, tier: int = 0, runner: Runner | None = None,
                 secrets: Mapping[str, str] | None = None, scratch: str | None = None,
                 grace: float = 20.0, walltime_end: float | None = None,
                 checkpoint_margin: float = 120.0, max_tasks: int | None = None,
                 heartbeat: float | None = None, keep: int = 2,
                 clock: Callable[[], float] = time.time, poll: float = 0.05,
                 redactor: SecretRedactor | None = None, idle_poll: float = 5.0,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        queue.policy.check_tier(tier, "tier")
        for name, v, lo in (("grace", grace, 0.0), ("checkpoint_margin", checkpoint_margin, 0.0),
                            ("idle_poll", idle_poll, 0.0)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= lo:
                raise InvalidArgument(name, "must be a number of seconds >= 0", v)
        if heartbeat is None:
            heartbeat = min(30.0, queue.config.stale_after / 6)
        if isinstance(heartbeat, bool) or not isinstance(heartbeat, (int, float)) or not heartbeat > 0:
            raise InvalidArgument("heartbeat", "must be a positive number of seconds", heartbeat)
        if max_tasks is not None and (isinstance(max_tasks, bool) or not isinstance(max_tasks, int)
                                      or max_tasks < 1):
            raise InvalidArgument("max_tasks", "must be an integer >= 1", max_tasks)
        self.q = queue
        self.tier = tier
        self.runner = runner or NoneRunner()
        self.secrets = dict(secrets or {})
        self.redactor = redactor or SecretRedactor(self.secrets.values())
        self.scratch = scratch or os.path.join(queue.root, "workspaces")
        self.grace = float(grace)
        self.walltime_end = walltime_end
        self.margin = float(checkpoint_margin)
        self.max_tasks = max_tasks
        self.heartbeat_every = float(heartbeat)
        self.keep = keep
        self.clock = clock
        self.poll = poll
        self.idle_poll = float(idle_poll)
        self._sleep = sleep
        self._stop: str | None = None
        self.tasks_run = 0

    # ------------------------------------------------------------------ control
    def request_stop(self, why: str = "SIGTERM") -> None:
        """Checkpoint the running task and stop (safe to call from a signal handler)."""
        if self._stop is None:
            self._stop = why

    def _stop_reason(self) -> str | None:
        if self._stop is not None:
            return self._stop
        if self.walltime_end is not None and self.walltime_end - self.clock() < self.margin:
            return "walltime"
        return None

    def _has_work(self) -> bool:
        n = self.q.counts()
        return n["pending"] + n["claimed"] > 0

    def _awaited_peer_claims(self) -> list[str]:
        """Ids of tasks claimed by peers that this worker's tier could run later (tiers
        only go up, so those of a tier this worker may run)."""
        out = []
        for rec in self.q.claims():
            tid = rec.get("id")
            got = self.q.get(tid) if isinstance(tid, str) else None  # still claimed now?
            if isinstance(tid, str) and got is not None and got[0] == "claimed" and \
                    self.q.policy.eligible(self.tier, int(got[1].get("tier", 0))):
                out.append(tid)
        out.sort()
        return out

    def _idle(self) -> None:
        """Wait ``idle_poll`` seconds, in short steps so a stop request is seen at once."""
        left = self.idle_poll
        while left > 0 and self._stop_reason() is None:
            step = min(left, 0.5)
            self._sleep(step)
            left -= step

    def run(self) -> int:
        """Loop until no task is claimable (0) or a stop was requested (99)."""
        log.info("worker %s: start (queue %s, tier %d, runner %s)", self.q.worker, self.q.root,
                 self.tier, self.runner.name)
        while True:
            why = self._stop_reason()
            if why is not None:
                if why == "walltime" and not self._has_work():
                    log.info("worker %s: walltime margin reached and the queue is empty; exit 0",
                             self.q.worker)
                    return EXIT_DONE
                log.info("worker %s: stopping (%s) between tasks; exit 99", self.q.worker, why)
                return EXIT_CHECKPOINTED
            if self.max_tasks is not None and self.tasks_run >= self.max_tasks:
                log.info("worker %s: ran --max-tasks %d tasks; exit 0", self.q.worker, self.max_tasks)
                return EXIT_DONE
            taken = self.q.reclaim_stale()
            if taken:
                log.info("worker %s: reclaimed stale claims %s", self.q.worker, ", ".join(taken))
            claim = self.q.claim(worker_tier=self.tier)
            if claim is None:
                awaited = self._awaited_peer_claims()
                if not awaited:
                    log.info("worker %s: no claimable task; exit 0", self.q.worker)
                    return EXIT_DONE
                log.info("worker %s: nothing claimable; waiting %.1f s for %d task(s) peers "
                         "hold that this tier could run (%s)", self.q.worker, self.idle_poll,
                         len(awaited), ", ".join(awaited[:5]))
                self._idle()
                continue
            self.tasks_run += 1
            if self.run_task(claim) == "preempted":
                return EXIT_CHECKPOINTED

    # ------------------------------------------------------------------ one task
    def run_task(self, claim: Claim) -> str:
        """Run one claimed task; returns ``done``, ``retry``, ``failed``, ``lost`` or
        ``preempted``."""
        tid = claim.task_id
        red = self.redactor
        log.info("task %s: claimed (attempt %d, tier %d, failures %d)", tid, claim.attempts,
                 claim.tier, claim.failures)
        ws = os.path.join(self.scratch, tid)
        store = CheckpointStore(os.path.join(self.q.root, "checkpoints", tid), keep=self.keep,
                                clock=self.clock, durable=self.q.config.durable)
        resume: dict[str, Any] = dict(claim.resume) if isinstance(claim.resume, dict) else {}
        try:
            os.makedirs(ws, exist_ok=True)
            named = resume.get("checkpoint")
            restored = store.restore(ws)
            if restored is None:
                if named is not None:
                    log.error("task %s: the record names checkpoint %s but no checkpoint "
                              "verifies; starting afresh", tid, named)
                    resume["checkpoint"] = None
                empty_directory(ws)
                ck, state = None, b""
            else:
                ck, state = restored
                if named != ck.seq:
                    log.warning("task %s: the record names checkpoint %s; resuming from the "
                                "newest verified one, %d", tid, named, ck.seq)
                resume["checkpoint"] = ck.seq
                log.info("task %s: restored checkpoint %d (%d bytes)", tid, ck.seq, ck.size)
            payload = claim.payload
            plugin = load_plugin(plugin_name(payload))
            ctx = TaskContext(tid, payload, ws, claim.attempts, ck.seq if ck else None,
                              self.secrets, logging.getLogger("bursarcore.runtime.plugin"))
            plugin.setup(ctx)
            if ck is not None:
                plugin.restore(ctx, state)
            env = {"BURSAR_TASK_ID": tid, "BURSAR_ATTEMPT": str(claim.attempts),
                   "BURSAR_WORKSPACE": self.runner.workspace_path(ws)}
            if ck is not None:
                env["BURSAR_RESUMED_FROM"] = str(ck.seq)
            env.update(plugin.environment(ctx))
            env.update(self.secrets)
            argv, full_env = self.runner.prepare(plugin.command(ctx), workspace=ws, env=env)
        except Exception as exc:  # noqa: BLE001 - a bad task fails, the worker carries on
            reason = red.redact(f"task setup failed: {type(exc).__name__}: {exc}")
            outcome = self.q.fail(claim, reason)
            log.error("task %s: %s -> %s", tid, reason, outcome)
            return outcome
        if self._stop_reason() is not None:
            # stopped while restoring: nothing new to save, keep the checkpoint we had
            self.q.release(claim, f"preempted ({self._stop_reason()}) before start",
                           resume=red.redact_json(resume))
            log.info("task %s: released before start (%s)", tid, self._stop_reason())
            return "preempted"
        return self._execute(claim, plugin, ctx, argv, full_env, ws, store, resume)

    def _execute(self, claim: Claim, plugin, ctx: TaskContext, argv: list[str],
                 env: dict[str, str], ws: str, store: CheckpointStore,
                 resume: dict[str, Any]) -> str:
        tid = claim.task_id
        red = self.redactor
        logs = os.path.join(self.q.root, "logs")
        os.makedirs(logs, exist_ok=True)
        try:
            proc = subprocess.Popen(
                argv, env=env, cwd=ws, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, start_new_session=True,
                preexec_fn=_set_pdeathsig if isinstance(self.runner, NoneRunner) else None)
        except OSError as exc:  # no such program, not executable, ...
            reason = red.redact(f"cannot start the agent {argv[0]!r}: {exc.strerror or exc}")
            outcome = self.q.fail(claim, reason)
            log.error("task %s: %s -> %s", tid, reason, outcome)
            return outcome
        out = _Output(proc, os.path.join(logs, f"{tid}.log"), red.redact,
                      f"=== {time.strftime('%Y-%m-%dT%H:%M:%S')} attempt {claim.attempts} worker "
                      f"{self.q.worker} pid {proc.pid} resumed_from {ctx.resumed_from}")
        log.info("task %s: agent started (pid %d, plugin %s, runner %s)", tid, proc.pid,
                 type(plugin).__name__, self.runner.name)
        lost = threading.Event()
        hb_stop = threading.Event()
        hb = threading.Thread(target=self._heartbeats, args=(claim, plugin, ctx, resume, lost, hb_stop),
                              daemon=True, name=f"heartbeat-{tid}")
        hb.start()
        why = None
        try:
            while (rc := proc.poll()) is None:
                if lost.is_set():
                    break
                why = self._stop_reason()
                if why is not None:
                    break
                time.sleep(self.poll)
            if rc is None:
                rc = self._stop_agent(proc, tid, why or "claim lost")
        finally:
            if proc.poll() is None:  # an unexpected error above: never leave the agent behind
                self.runner.kill(proc)
                proc.wait()
            hb_stop.set()
            hb.join()
            self.runner.kill(proc)  # leftovers of the agent's process group
            out.close()
        if lost.is_set():
            log.error("task %s: claim lost (reclaimed by a peer); abandoned", tid)
            return "lost"
        if why is not None:
            return self._checkpoint(claim, plugin, ctx, ws, store, resume, why)
        if rc == 0:
            try:
                result = plugin.result(ctx, rc)
            except Exception as exc:  # noqa: BLE001
                reason = red.redact(f"result hook failed: {type(exc).__name__}: {exc}")
                outcome = self.q.fail(claim, reason)
                log.error("task %s: %s -> %s", tid, reason, outcome)
                return outcome
            if not isinstance(result, dict):
                result = {"result": result}
            result = red.redact_json({**result, "resumed_from": ctx.resumed_from})
            if not self.q.complete(claim, result):
                log.error("task %s: claim lost before completion; result discarded", tid)
                return "lost"
            log.info("task %s: done (resumed_from %s)", tid, ctx.resumed_from)
            store.clear()
            shutil.rmtree(ws, ignore_errors=True)
            return "done"
        tail = "\n".join(out.tail)[-TAIL_CHARS:]
        reason = red.redact(_describe_exit(rc) + (f"; last stderr lines:\n{tail}" if tail else ""))
        outcome = self.q.fail(claim, reason)
        log.error("task %s: %s -> %s", tid, _describe_exit(rc), outcome)
        return outcome

    def _stop_agent(self, proc: subprocess.Popen, tid: str, why: str) -> int:
        log.info("task %s: stopping agent (%s): SIGTERM, grace %.0f s", tid, why, self.grace)
        self.runner.terminate(proc)
        try:
            return proc.wait(timeout=self.grace)
        except subprocess.TimeoutExpired:
            log.warning("task %s: agent still running after %.0f s; SIGKILL", tid, self.grace)
            self.runner.kill(proc)
            return proc.wait()

    def _heartbeats(self, claim: Claim, plugin, ctx: TaskContext, resume: dict[str, Any],
                    lost: threading.Event, stop: threading.Event) -> None:
        while not stop.wait(self.heartbeat_every):
            progress = None
            try:
                progress = plugin.heartbeat(ctx)
            except Exception as exc:  # noqa: BLE001 - progress is best effort
                log.warning("task %s: plugin heartbeat failed: %s", claim.task_id,
                            self.redactor.redact(f"{type(exc).__name__}: {exc}"))
            try:
                if progress is None:
                    ok = self.q.heartbeat(claim)
                else:
                    # kept in ``resume`` too, so the release after a checkpoint keeps it
                    resume["progress"] = self.redactor.redact_json(dict(progress))
                    ok = self.q.heartbeat(claim, resume=dict(resume))
            except Exception as exc:  # noqa: BLE001 - e.g. a lock timeout: try again next beat
                log.error("task %s: heartbeat failed: %s: %s", claim.task_id, type(exc).__name__, exc)
                continue
            if not ok:
                lost.set()
                return

    def _checkpoint(self, claim: Claim, plugin, ctx: TaskContext, ws: str, store: CheckpointStore,
                    resume: dict[str, Any], why: str) -> str:
        tid = claim.task_id
        t0 = time.monotonic()
        new = dict(resume)
        try:
            state = plugin.save(ctx)
            if not isinstance(state, (bytes, bytearray)):
                raise InvalidArgument("save()", "must return bytes", type(state).__name__)
            ck = store.save(ws, bytes(state))
            new["checkpoint"] = ck.seq
            log.info("task %s: checkpoint %d saved (%d bytes, %.2f s)", tid, ck.seq, ck.size,
                     time.monotonic() - t0)
        except Exception as exc:  # noqa: BLE001 - release anyway; the previous checkpoint stands
            log.error("task %s: checkpoint failed (%s); the task resumes from checkpoint %s and "
                      "work since then is lost", tid,
                      self.redactor.redact(f"{type(exc).__name__}: {exc}"), resume.get("checkpoint"))
        if self.q.release(claim, f"preempted ({why})", resume=self.redactor.redact_json(new)):
            log.info("task %s: released (preempted: %s), resume %s", tid, why, new.get("checkpoint"))
        else:
            log.error("task %s: claim lost before release", tid)
        return "preempted"


# ---------------------------------------------------------------------- command line
def stderr_logging(worker_id: str, redactor: SecretRedactor, level: int = logging.INFO) -> logging.Handler:
    """One line per event on stderr, tagged with the worker id, secrets redacted."""
    h = logging.StreamHandler(sys.stderr)
    h.setFormatter(logging.Formatter(
        "%(asctime)s " + worker_id.replace("%", "%%") + " %(levelname)s %(name)s: %(message)s"))
    h.addFilter(redactor)
    root = logging.getLogger()
    root.addHandler(h)
    root.setLevel(level)
    return h


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bursar-worker",
                                description="Run tasks from a bursarcore runtime queue (SPEC §13).")
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    p.add_argument("--queue", required=True, help="queue directory (TaskQueue.create)")
    p.add_argument("--tier", type=int, default=0, help="this worker's memory tier (default 0)")
    p.add_argument("--id", dest="worker_id", help="worker id (default host:pid[:job_task])")
    p.add_argument("--runner", choices=RUNNERS, default="none", help="agent isolation (default none)")
    p.add_argument("--image", help="container image (--runner apptainer)")
    p.add_argument("--secrets", help="KEY=VALUE file, mode 600, injected into agents only")
    p.add_argument("--scratch", help="parent of task workspaces (default <queue>/workspaces)")
    p.add_argument("--grace", type=float, default=20.0,
                   help="seconds a SIGTERMed agent gets to stop (default 20)")
    p.add_argument("--walltime-end", type=float, help="epoch seconds when the allocation ends")
    p.add_argument("--checkpoint-margin", type=float, default=120.0,
                   help="checkpoint and exit 99 this long before --walltime-end (default 120)")
    p.add_argument("--max-tasks", type=int, help="stop (exit 0) after this many tasks")
    p.add_argument("--idle-poll", type=float, default=5.0,
                   help="seconds between looks while peers hold tasks this tier could run "
                        "later (default 5)")
    p.add_argument("--heartbeat", type=float,
                   help="seconds between heartbeats (default min(30, stale_after/6))")
    p.add_argument("--stop-signal", choices=("TERM", "USR1", "USR2"), default="TERM",
                   help="also treat this signal as SIGTERM: checkpoint, release, exit 99 "
                        "(for batch jobs warned with --signal=B:USR1@s; default TERM only)")
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``bursar-worker`` (``python -m bursarcore.runtime.worker``); returns the
    exit status."""
    a = _parser().parse_args(argv)
    worker = None

    def on_term(signum, frame):
        if worker is not None:
            worker.request_stop(signal.Signals(signum).name)
        else:
            pending.append(signum)

    pending: list[int] = []
    for s in {signal.SIGTERM, getattr(signal, f"SIG{a.stop_signal}")}:
        signal.signal(s, on_term)
    wid = a.worker_id or default_worker_id()
    redactor = SecretRedactor()
    stderr_logging(wid, redactor)
    try:
        secrets = load_secrets(a.secrets) if a.secrets else {}
        redactor.values = SecretRedactor(secrets.values()).values
        opts = {"image": a.image} if a.runner == "apptainer" else {}
        runner = get_runner(a.runner, **opts)
        q = TaskQueue(a.queue, worker=wid)
        worker = Worker(q, tier=a.tier, runner=runner, secrets=secrets, scratch=a.scratch,
                        grace=a.grace, walltime_end=a.walltime_end,
                        checkpoint_margin=a.checkpoint_margin, max_tasks=a.max_tasks,
                        heartbeat=a.heartbeat, redactor=redactor, idle_poll=a.idle_poll)
    except Exception as exc:  # noqa: BLE001 - bad configuration: a clear line, not a traceback
        log.error("worker %s: cannot start: %s: %s", wid, type(exc).__name__, exc)
        return 2
    if pending:
        worker.request_stop(signal.Signals(pending[0]).name)
    try:
        return worker.run()
    except Exception:  # noqa: BLE001 - a crash: the wrapper relaunches the worker
        log.exception("worker %s: crashed", wid)
        return EXIT_CRASH


if __name__ == "__main__":
    sys.exit(main())
