"""The persistent per-array-task wrapper (SPEC §13, after RASER §3).

One wrapper runs in each Slurm array task, in place of the batch shell (the batch script
``exec``\\ s it, so Slurm's signals reach it)::

    python -m bursarcore.runtime.wrapper [--max-restarts K] [--backoff S]
        [--requeue self|admin] -- python -m bursarcore.runtime.worker --queue DIR ...

What it guarantees, given the worker contract (exit 0: no claimable task left; exit 99:
checkpointed and released its task after SIGTERM, or before its walltime; anything else:
a crash):

* **Crash → relaunch.** A worker that exits with any other code (or dies by a signal) is
  started again after ``backoff * 2**(n-1)`` seconds (capped at 30 s), at most
  ``max_restarts`` times in the life of this array task run; after that the wrapper exits
  with the worker's code (shell convention, 128+N for signal N), so Slurm records the array
  task as FAILED. A crashed worker's claim is not lost: the queue reclaims it once its
  heartbeat is stale.
* **SIGTERM → forward → requeue.** The first SIGTERM is forwarded to the worker (later ones
  are only logged: the worker is already checkpointing) and no further worker is started.
  When the worker then exits 99 — or exits 99 on its own, e.g. at ``--walltime-end`` — the
  array task is requeued and the wrapper exits 99. ``--requeue self`` (default) runs
  ``scontrol requeue ${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}`` (``SLURM_JOB_ID`` for a
  job outside an array); Slurm keeps ``SLURM_ARRAY_TASK_ID`` and starts the task again
  after ``cred_expire`` + 1 s. ``--requeue admin`` only exits 99, for sites whose
  slurm.conf has ``RequeueExit=99``. If a SIGTERM came and the worker crashed instead of
  exiting 99, the task is requeued all the same (its work is not finished) and the
  wrapper exits 99.
* **Requeue refused → resubmit.** Where ``scontrol requeue`` fails (the site does not
  let users requeue, or ``PreemptMode=CANCEL`` already ended the job), the wrapper, given
  ``--resubmit SPEC`` (``bursar-run submit`` writes ``<queue>/slurm/tier<T>.json``: the
  tier's ``sbatch`` command and batch script), submits the lost task again itself: the
  same batch script as a one-task array of the same index (``--array=<task>``), so the
  new run has the same ``SLURM_ARRAY_TASK_ID``. Resubmissions are bounded: each one
  carries its number in ``BURSAR_RESUBMITS``, and at ``--max-resubmits`` (default 3) the
  wrapper gives up and says so. Each outcome — requeued, requeue refused (with
  ``scontrol``'s message), resubmitted (with the new job id), resubmission failed or
  limit reached — is logged, and with ``--queue DIR`` also recorded as one file in
  ``<queue>/slurm/events/``, which ``bursar-run status`` counts and ``bursar-run cancel``
  reads to cancel resubmitted jobs too.
* **Exit 0 → exit 0**: the queue has nothing left for this tier.
* **Cancel.** A plain ``scancel`` also sends SIGTERM, and Slurm 22.05 accepts
  ``scontrol requeue`` of a job being cancelled (it shows ``COMPLETING`` either way), so a
  requeue would undo the cancel. With ``--stop-file PATH`` (``bursar-run cancel`` creates
  ``<queue>/cancelled`` before it runs ``scancel``) the wrapper does not requeue when that
  file exists: it logs why and exits 0 (so ``RequeueExit=99`` does not requeue either).

Every decision is logged as one line on stderr (the array task's ``--output`` file):
``bursar-wrapper <job>_<task> <UTC time>: <event>``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from typing import Callable, Sequence

__all__ = ["Wrapper", "main", "slurm_task_id", "REQUEUE_EXIT", "MAX_BACKOFF", "BOOTSTRAP",
           "STOP_SIGNALS", "bootstrap", "resubmit_argv", "record_event", "load_events",
           "RESUBMITS_ENV"]

REQUEUE_EXIT = 99
"""The exit code of a worker that checkpointed and released its task (and of the wrapper
when the array task is to be requeued)."""
MAX_BACKOFF = 30.0
"""Upper bound, in seconds, on the pause before a crashed worker is relaunched."""


RESUBMITS_ENV = "BURSAR_RESUBMITS"
"""Environment variable of a resubmitted run: how many resubmissions led to it."""

STOP_SIGNALS = ("TERM", "USR1", "USR2")
"""Signals a batch job may be warned with (``--signal=B:<SIG>@<s>``); each means SIGTERM."""


def bootstrap(stop_signal: str = "TERM") -> str:
    """The ``python -c`` program of a batch script whose warning signal is ``stop_signal``:
    it catches SIGTERM and that signal before any import (see :data:`BOOTSTRAP`)."""
    if stop_signal not in STOP_SIGNALS:
        raise ValueError(f"stop_signal must be one of {STOP_SIGNALS}, not {stop_signal!r}")
    sigs = "signal.SIGTERM" + ("" if stop_signal == "TERM" else f", signal.SIG{stop_signal}")
    return ("import signal, sys; early = []; "
            f"[signal.signal(s, lambda *a: early.append(1)) for s in ({sigs},)]; "
            "from bursarcore.runtime.wrapper import main; sys.exit(main(early=early))")


BOOTSTRAP = bootstrap("TERM")
"""``python -c BOOTSTRAP <wrapper args>`` is what batch scripts run: it catches SIGTERM
before anything is imported (importing bursarcore takes about a second, during which a
signal would otherwise kill the interpreter and lose the requeue) and hands any early
signal to :func:`main`."""


def slurm_task_id(env: "os._Environ[str] | dict[str, str]") -> str | None:
    """``<array job>_<task>`` inside an array task, ``<job>`` inside a plain job, else
    ``None``: the id ``scontrol requeue`` needs to requeue only this task."""
    aj, at = env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")
    if aj and at:
        return f"{aj}_{at}"
    return env.get("SLURM_JOB_ID") or None


def _one_line(text: str) -> str:
    return " ".join(text.split())[:300]


def _shell_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def resubmit_argv(sbatch: Sequence[str], task_index: str | None, count: int) -> list[str]:
    """The ``sbatch`` command that submits one lost task again: the tier's command with
    its ``--array`` narrowed to ``task_index`` (dropped for a plain job) and
    ``--export=ALL,BURSAR_RESUBMITS=<count>`` added."""
    argv = [a for a in sbatch if not a.startswith(("--array=", "--export="))]
    if task_index is not None:
        argv.insert(1, f"--array={task_index}")
    return argv + [f"--export=ALL,{RESUBMITS_ENV}={count}"]


def _events_dir(queue: str) -> str:
    return os.path.join(queue, "slurm", "events")


def record_event(queue: str, event: dict[str, object]) -> None:
    """Write ``event`` as one new file in ``<queue>/slurm/events/`` (temp file + rename:
    wrappers of many array tasks record at once without sharing a file)."""
    d = _events_dir(queue)
    os.makedirs(d, exist_ok=True)
    name = f"{time.time_ns():020d}-{os.getpid()}-{event.get('event')}.json"
    tmp = os.path.join(d, f".{name}.tmp")
    with open(tmp, "w") as f:
        json.dump(event, f, sort_keys=True)
    os.replace(tmp, os.path.join(d, name))


def load_events(queue: str) -> list[dict[str, object]]:
    """The recorded requeue and resubmission events of ``queue``, oldest first (an
    unreadable file is skipped)."""
    d = _events_dir(queue)
    try:
        names = sorted(n for n in os.listdir(d) if n.endswith(".json") and not n.startswith("."))
    except FileNotFoundError:
        return []
    out = []
    for n in names:
        try:
            with open(os.path.join(d, n)) as f:
                out.append(json.load(f))
        except (OSError, ValueError):
            continue
    return out


def _ignore_term() -> None:
    """In a command's child process, before exec: SIGTERM ignored (kept across exec)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


class Wrapper:
    """Run ``argv`` (the worker) until it exits 0 or 99, relaunching it after crashes.

    ``max_restarts``: relaunches allowed after crashes (0: none). ``backoff``: seconds
    before the first relaunch, doubled each time up to :data:`MAX_BACKOFF`. ``requeue``:
    ``"self"`` (run ``scontrol requeue``) or ``"admin"`` (rely on ``RequeueExit=99``).
    ``env``: the worker's environment (default: ours). ``run_command``: how ``scontrol``
    is run (returns its exit code; a seam for tests). ``log``: where log lines go (default:
    stderr). ``stop_file``: when this file exists, never requeue (the campaign was
    cancelled); exit 0 instead. ``resubmit``: the tier's submission spec (JSON with
    ``sbatch`` and ``script``), to submit the task again when ``scontrol requeue`` is
    refused, at most ``max_resubmits`` times in a row (counted in ``BURSAR_RESUBMITS``).
    ``queue``: where events are recorded (``<queue>/slurm/events/``). The pauses taken
    before relaunches are kept in ``pauses``.

    ``run_command(argv, input)`` returns ``(exit code, output)``.
    """

    def __init__(self, argv: Sequence[str], *, max_restarts: int = 3, backoff: float = 1.0,
                 requeue: str = "self", env: dict[str, str] | None = None,
                 run_command: Callable[[list[str], str | None], tuple[int, str]] | None = None,
                 log: Callable[[str], None] | None = None,
                 stop_file: str | None = None, stop_signal: str = "TERM",
                 resubmit: str | None = None, max_resubmits: int = 3,
                 queue: str | None = None) -> None:
        from ..errors import InvalidArgument

        if not argv:
            raise InvalidArgument("worker argv", "must name the worker command after '--'", argv)
        if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
            raise InvalidArgument("max_restarts", "must be an integer >= 0", max_restarts)
        if isinstance(backoff, bool) or not isinstance(backoff, (int, float)) \
                or not 0 <= backoff <= 3600:
            raise InvalidArgument("backoff", "must be a number of seconds in [0, 3600]", backoff)
        if requeue not in ("self", "admin"):
            raise InvalidArgument("requeue", "must be 'self' or 'admin'", requeue)
        if isinstance(max_resubmits, bool) or not isinstance(max_resubmits, int) \
                or max_resubmits < 0:
            raise InvalidArgument("max_resubmits", "must be an integer >= 0", max_resubmits)
        if stop_signal not in STOP_SIGNALS:
            raise InvalidArgument("stop_signal", f"must be one of {', '.join(STOP_SIGNALS)}",
                                  stop_signal)
        self.stop_signal = stop_signal
        self.signum = 0  # the first stop signal received: the one forwarded
        self.argv = list(argv)
        self.max_restarts = max_restarts
        self.backoff = float(backoff)
        self.requeue_mode = requeue
        self.stop_file = stop_file
        self.resubmit = resubmit
        self.max_resubmits = max_resubmits
        self.queue = queue
        self.env = dict(os.environ if env is None else env)
        try:
            self.resubmits = max(0, int(self.env.get(RESUBMITS_ENV, "0")))
        except ValueError:
            self.resubmits = 0
        self.task = slurm_task_id(self.env)
        self._run_command = run_command or self._default_run
        self._log = log or self._default_log
        self._custom_log = log is not None
        self.pauses: list[float] = []
        self.proc: subprocess.Popen | None = None
        self.terminating = False
        self.forwarded = False
        self.restarts = 0

    # ------------------------------------------------------------------ seams
    def _default_log(self, msg: str) -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        print(f"bursar-wrapper {self.task or '-'} {stamp}: {msg}", file=sys.stderr, flush=True)

    @staticmethod
    def _default_run(argv: list[str], input: str | None = None) -> tuple[int, str]:
        # The commands run with SIGTERM ignored: an accepted `scontrol requeue` of this very
        # task makes Slurm signal every process of the job, the scontrol among them, which
        # would otherwise die of it before reporting its success (the timeout still kills).
        try:
            cp = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=60,
                                preexec_fn=_ignore_term)
        except (OSError, subprocess.TimeoutExpired) as exc:
            print(f"bursar-wrapper: {shlex.join(argv)}: {exc}", file=sys.stderr, flush=True)
            return 127, str(exc)
        for stream in (cp.stdout, cp.stderr):
            if stream.strip():
                print(stream.rstrip(), file=sys.stderr, flush=True)
        return cp.returncode, (cp.stdout + cp.stderr).strip()

    def _signal_log(self, msg: str) -> None:
        # inside a signal handler: a print() could re-enter the buffered stderr the main
        # thread is writing to, so write the bytes directly
        if not self._custom_log:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            line = f"bursar-wrapper {self.task or '-'} {stamp}: {msg}\n"
            try:
                os.write(2, line.encode())
            except OSError:
                pass
        else:
            self._log(msg)

    # ------------------------------------------------------------------ signals
    def on_sigterm(self, signum: int = 0, frame: object = None) -> None:
        """Signal handler (SIGTERM, and ``stop_signal`` if another): remember that we are
        stopping; forward the first such signal, as it came, to the worker."""
        first = not self.terminating
        self.terminating = True
        self.signum = self.signum or signum or signal.SIGTERM
        name = signal.Signals(self.signum).name  # the first one's: that is what is forwarded
        proc = self.proc
        if proc is not None and proc.returncode is None and not self.forwarded:
            self.forwarded = True
            self._signal_log(f"{name}: forwarding to worker pid {proc.pid}")
            try:
                os.kill(proc.pid, self.signum)
            except ProcessLookupError:
                pass
        elif first:
            self._signal_log(f"{name}: no worker running; will not start another")
        else:
            self._signal_log(f"{name} again: already stopping")

    def _stop_name(self) -> str:
        """The name of the stop signal that came (SIGTERM when it came before start-up)."""
        return signal.Signals(self.signum).name if self.signum else "SIGTERM"

    def _pause(self, seconds: float) -> None:
        """Sleep ``seconds``, cut short by a SIGTERM."""
        self.pauses.append(seconds)
        end = time.monotonic() + seconds
        while not self.terminating:
            left = end - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(0.1, left))

    # ------------------------------------------------------------------ main loop
    def run(self) -> int:
        """Run until done; returns the wrapper's exit code (0, 99 or the worker's)."""
        self._log(f"starting (max_restarts={self.max_restarts}, requeue={self.requeue_mode}): "
                  f"{shlex.join(self.argv)}")
        while True:
            if self.terminating:
                return self._requeue("SIGTERM before the worker was (re)started")
            self.forwarded = False
            try:
                self.proc = subprocess.Popen(self.argv, env=self.env)
            except OSError as exc:
                self._log(f"cannot start the worker: {exc}")
                return 127
            if self.terminating and not self.forwarded:  # came while Popen was starting it
                self.on_sigterm()
            self._log(f"worker pid {self.proc.pid} started (run {self.restarts + 1})")
            code = _shell_code(self.proc.wait())
            self.proc = None
            if code == 0:
                self._log("worker exited 0: nothing left to claim; done")
                return 0
            if code == REQUEUE_EXIT:
                why = f"after {self._stop_name()}" if self.terminating else "on its own (walltime)"
                return self._requeue(f"worker checkpointed and exited 99 {why}")
            if self.terminating:
                return self._requeue(f"worker exited {code} after {self._stop_name()} (not 99)")
            if self.restarts >= self.max_restarts:
                self._log(f"worker crashed (exit {code}); {self.restarts} restart(s) used of "
                          f"{self.max_restarts}: giving up with exit {code}")
                return code
            self.restarts += 1
            pause = min(MAX_BACKOFF, self.backoff * 2 ** (self.restarts - 1))
            self._log(f"worker crashed (exit {code}); relaunching in {pause:g} s "
                      f"(restart {self.restarts} of {self.max_restarts})")
            self._pause(pause)

    def _requeue(self, why: str) -> int:
        if self.stop_file and os.path.exists(self.stop_file):
            self._log(f"{why}: {self.stop_file} exists (the campaign was cancelled): "
                      "not requeueing; exiting 0")
            return 0
        if self.requeue_mode == "admin":
            self._log(f"{why}: exiting 99 (the site's RequeueExit=99 requeues this task)")
            return REQUEUE_EXIT
        if self.task is None:
            self._log(f"{why}: not inside a Slurm job (no SLURM_JOB_ID); cannot requeue; "
                      "exiting 99")
            return REQUEUE_EXIT
        argv = ["scontrol", "requeue", self.task]
        rc, out = self._run_command(argv, None)
        if rc == 0 or rc == -signal.SIGTERM:
            # (ended by SIGTERM: the signal Slurm sends the task it requeues, so accepted)
            how = (shlex.join(argv) if rc == 0 else f"{shlex.join(argv)} was ended by "
                   "SIGTERM, which Slurm sends to the task it requeues")
            self._log(f"{why}: requeued {self.task} ({how}); exiting 99")
            self._event("requeue", why=why)
            return REQUEUE_EXIT
        reason = _one_line(out) or f"exit {rc}"
        said = f"exit {rc}" + (f": {_one_line(out)}" if _one_line(out) else "")
        self._event("requeue-refused", why=why, reason=reason, rc=rc)
        if self.resubmit is None:
            self._log(f"{why}: {shlex.join(argv)} failed ({said}); exiting 99 without "
                      "requeue — resubmit to finish the queue")
            return REQUEUE_EXIT
        self._log(f"{why}: {shlex.join(argv)} failed ({said}): the site refuses the "
                  "requeue; resubmitting the task")
        return self._resubmit(reason)

    def _event(self, event: str, **fields: object) -> None:
        if self.queue is None:
            return
        try:
            record_event(self.queue, {"event": event, "task": self.task, "at": time.time(),
                                      "resubmits": self.resubmits, **fields})
        except OSError as exc:
            self._log(f"cannot record the {event} event in {self.queue}: {exc}")

    def _resubmit(self, reason: str) -> int:
        """Submit the lost task again (bounded); always exits 99."""
        if self.resubmits >= self.max_resubmits:
            self._log(f"resubmission limit reached ({self.resubmits} of {self.max_resubmits}); "
                      "not resubmitting — submit again to finish the queue")
            self._event("resubmit-limit", reason=reason, max_resubmits=self.max_resubmits)
            return REQUEUE_EXIT
        assert self.resubmit is not None
        try:
            with open(self.resubmit) as f:
                spec = json.load(f)
            sbatch, script = list(spec["sbatch"]), str(spec["script"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            self._log(f"cannot resubmit: {self.resubmit}: {exc}")
            self._event("resubmit-failed", reason=f"{self.resubmit}: {exc}")
            return REQUEUE_EXIT
        index = self.env.get("SLURM_ARRAY_TASK_ID") or None
        count = self.resubmits + 1
        argv = resubmit_argv(sbatch, index, count)
        rc, out = self._run_command(argv, script)
        job = out.strip().splitlines()[-1].split(";")[0].strip() if out.strip() else ""
        if rc != 0 or not job.isdigit():
            why = _one_line(out) or f"exit {rc}"
            self._log(f"resubmission failed ({shlex.join(argv)}: {why}); exiting 99")
            self._event("resubmit-failed", reason=why, rc=rc)
            return REQUEUE_EXIT
        new = f"{job}_{index}" if index is not None else job
        self._log(f"resubmitted as job {new} (resubmission {count} of {self.max_resubmits}, "
                  f"because: {reason}); exiting 99")
        self._event("resubmit", job_id=job, new_task=new, count=count, reason=reason)
        return REQUEUE_EXIT


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bursarcore.runtime.wrapper",
        description="Run a bursar worker in a Slurm array task: relaunch it after crashes; "
                    "on SIGTERM forward it, then requeue the array task when the worker "
                    "exits 99.")
    p.add_argument("--max-restarts", type=int, default=3, metavar="K",
                   help="relaunches after crashes (default 3)")
    p.add_argument("--backoff", type=float, default=1.0, metavar="S",
                   help="seconds before the first relaunch, doubled each time (default 1)")
    p.add_argument("--requeue", choices=["self", "admin"], default="self",
                   help="self: scontrol requeue this array task (default); admin: only exit "
                        "99, for sites with RequeueExit=99")
    p.add_argument("--stop-signal", choices=STOP_SIGNALS, default="TERM",
                   help="the batch job's warning signal (--signal=B:SIG@s), handled like "
                        "SIGTERM and forwarded to the worker as it came (default TERM)")
    p.add_argument("--stop-file", metavar="PATH",
                   help="never requeue while this file exists (bursar-run cancel creates it)")
    p.add_argument("--resubmit", metavar="SPEC",
                   help="when scontrol requeue is refused, submit the task again with this "
                        "tier's sbatch command and script (JSON; bursar-run submit writes "
                        "<queue>/slurm/tier<T>.json)")
    p.add_argument("--max-resubmits", type=int, default=3, metavar="N",
                   help="resubmissions of one lost task in a row (default 3)")
    p.add_argument("--queue", metavar="DIR",
                   help="record requeues and resubmissions in DIR/slurm/events/")
    p.add_argument("worker", nargs=argparse.REMAINDER,
                   help="-- then the worker command and its arguments")
    return p


def main(argv: Sequence[str] | None = None, *, early: Sequence[int] = ()) -> int:
    """Entry point of ``python -m bursarcore.runtime.wrapper`` (and of :data:`BOOTSTRAP`,
    which passes the SIGTERMs that came before this module was imported as ``early``)."""
    from ..errors import InvalidArgument

    args = build_parser().parse_args(argv)
    worker = list(args.worker)
    if worker and worker[0] == "--":
        worker = worker[1:]
    try:
        w = Wrapper(worker, max_restarts=args.max_restarts, backoff=args.backoff,
                    requeue=args.requeue, stop_file=args.stop_file,
                    stop_signal=args.stop_signal, resubmit=args.resubmit,
                    max_resubmits=args.max_resubmits, queue=args.queue)
    except InvalidArgument as exc:
        print(f"bursar-wrapper: error: {exc}", file=sys.stderr)
        return 2
    stops = {signal.SIGTERM, getattr(signal, f"SIG{args.stop_signal}")}
    for s in stops:
        signal.signal(s, w.on_sigterm)
    if early:
        w._log("SIGTERM during start-up")
        w.terminating = True
    code = w.run()
    # Slurm may signal again while we exit (a requeue kills the batch step; a time limit
    # TERMs every process): keep the exit code ours — RequeueExit=99 depends on it
    for s in stops:
        signal.signal(s, signal.SIG_IGN)
    return code


if __name__ == "__main__":
    sys.exit(main())
