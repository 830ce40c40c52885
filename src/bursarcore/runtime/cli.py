"""``bursar-run``: run a campaign of agent tasks on Slurm (SPEC §13, after RASER §3).

::

    bursar-run submit TASKS.jsonl --queue DIR --workers N [--max-running M]
               [--tiers mem=2G,8G] [--promote-after K] [--time 00:30:00]
               [--grace S | --signal TERM|USR1|USR2@S]
               [--partition P] [--runner none|bwrap|apptainer] [--dry-run]
    bursar-run status --queue DIR [--watch] [--json]
    bursar-run cancel --queue DIR
    bursar-run requeue-failed --queue DIR [IDS ...]

``submit`` reads TASKS.jsonl (one ``{"id": ..., "payload": ...[, "tier": t]}`` per line;
every line is checked, errors name the file, line and field), creates or reopens the queue
(:class:`~bursarcore.runtime.queue.TaskQueue`), puts the tasks (ids already in the queue
are skipped, so submitting again is harmless) and submits one worker array per tier
(:mod:`bursarcore.runtime.slurm`), recording the job ids in ``<queue>/jobs.json``. Nothing
is written or submitted before every argument and line has been checked; ``--dry-run``
only prints the batch scripts and ``sbatch`` commands.

Also ``python -m bursarcore.runtime.cli``. Exit status: 0 success, 1 a Slurm command
failed, 2 bad arguments or input.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from typing import Any, Collection, Sequence, TextIO, cast

from .._version import __version__
from ..adapters.base import CommandError
from ..errors import BursarError, InvalidArgument
from .plugins import available_plugins, plugin_name
from .queue import STATES, QueueConfig, TaskQueue, check_task_id
from .slurm import (ArraySpec, SlurmArrays, array_record, batch_script, load_jobs,
                    parse_signal, parse_tiers, record_jobs, sbatch_argv, stop_file,
                    write_resubmit_spec)
from .wrapper import load_events

__all__ = ["main", "build_parser", "read_tasks", "queue_status", "format_status"]

#: Slurm states in which an array task still holds or awaits an allocation
LIVE = frozenset({"PENDING", "RUNNING", "REQUEUED", "CONFIGURING", "COMPLETING", "SUSPENDED",
                  "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT",
                  "STOPPED", "SPECIAL_EXIT"})
_TASK_KEYS = {"id", "payload", "tier"}


# ---------------------------------------------------------------------- input
def read_tasks(path: str, tiers: int = 1,
               plugins: Collection[str] | None = None) -> list[tuple[str, Any, int]]:
    """``(id, payload, tier)`` for each non-blank line of a JSON-lines file.

    Each line must be an object with ``id`` (a task id: ``[A-Za-z0-9_][A-Za-z0-9_-]*``, at
    most 200 characters, unique in the file), optionally ``payload`` (any JSON, default
    null) and ``tier`` (an integer in ``[0, tiers)``, default 0), and no other keys. With
    ``plugins`` (the installed plugin names), the plugin each payload names
    (``payload.plugin``, default ``command``) must be one of them: a worker could not run
    the task. Raises :class:`InvalidArgument` whose field is ``<path>:<line> <key>``.
    """
    out: list[tuple[str, Any, int]] = []
    seen: dict[str, int] = {}
    try:
        f = open(path, encoding="utf-8")
    except OSError as exc:
        raise InvalidArgument("TASKS", f"cannot be read ({exc.strerror})", path) from None
    with f:
        try:
            lines = f.readlines()
        except UnicodeDecodeError as exc:
            raise InvalidArgument("TASKS", f"is not UTF-8 text (byte {exc.start})", path) from None
        except OSError as exc:
            raise InvalidArgument("TASKS", f"cannot be read ({exc.strerror})", path) from None
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            where = f"{path}:{n}"
            try:
                obj = json.loads(line)
            except ValueError as exc:
                raise InvalidArgument(where, f"must be one JSON object per line ({exc})",
                                      line.strip()) from None
            if not isinstance(obj, dict):
                raise InvalidArgument(where, "must be a JSON object with an 'id'", obj)
            extra = sorted(set(obj) - _TASK_KEYS)
            if extra:
                raise InvalidArgument(f"{where} {extra[0]}",
                                      "unknown key (allowed: id, payload, tier)", obj[extra[0]])
            if "id" not in obj:
                raise InvalidArgument(f"{where} id", "is required", None)
            try:
                task_id = check_task_id(obj["id"])
            except InvalidArgument as exc:
                raise InvalidArgument(f"{where} id", exc.rule, obj["id"]) from None
            tier = obj.get("tier", 0)
            if isinstance(tier, bool) or not isinstance(tier, int) or not 0 <= tier < tiers:
                raise InvalidArgument(f"{where} tier", f"must be an integer in [0, {tiers})", tier)
            if task_id in seen:
                raise InvalidArgument(f"{where} id", f"is a duplicate of line {seen[task_id]}",
                                      task_id)
            seen[task_id] = n
            payload = obj.get("payload")
            if plugins is not None:
                name = plugin_name(payload)
                if not isinstance(name, str) or name not in plugins:
                    raise InvalidArgument(
                        f"{where} payload.plugin", f"task {task_id!r} names no installed "
                        f"plugin (installed: {', '.join(sorted(plugins))})", name)
            out.append((task_id, payload, tier))
    if not out:
        raise InvalidArgument("TASKS", "has no tasks (one JSON object per line)", path)
    return out


def _per_tier(text: str | None, tiers: int, name: str) -> list[int | None]:
    """``"8"`` -> the same for every tier; ``"8,2"`` -> one per tier."""
    if text is None:
        return [None] * tiers
    parts = [p.strip() for p in str(text).split(",")]
    if len(parts) not in (1, tiers):
        raise InvalidArgument(name, f"must be one integer, or one per tier ({tiers})", text)
    vals: list[int | None] = []
    for p in parts:
        if not p.isdigit() or int(p) < 1:
            raise InvalidArgument(name, "must be integers >= 1", text)
        vals.append(int(p))
    return vals * tiers if len(vals) == 1 else vals


def _check_queue_path(queue: str) -> None:
    """``--queue`` is a directory, or (for submit) a path where one can be created."""
    p = os.path.abspath(queue)
    if os.path.exists(p) and not os.path.isdir(p):
        raise InvalidArgument("--queue", "is an existing file, not a queue directory", queue)
    while not os.path.exists(p):
        p = os.path.dirname(p)
    if not os.path.isdir(p):
        raise InvalidArgument("--queue", f"cannot be a directory: {p} is a file", queue)


# ---------------------------------------------------------------------- submit
def _specs(args: argparse.Namespace, queue: str) -> list[ArraySpec]:
    mems = parse_tiers(args.tiers)
    # --workers is required: every tier has a count
    workers = cast("list[int]", _per_tier(args.workers, len(mems), "workers"))
    running = _per_tier(args.max_running, len(mems), "max_running")
    opts: list[str] = []
    for flag, value in (("--runner", args.runner), ("--image", args.image),
                        ("--secrets", args.secrets), ("--scratch", args.scratch),
                        ("--heartbeat", args.heartbeat)):
        if value is not None:
            if flag in ("--secrets", "--scratch", "--image") and not os.path.isabs(str(value)) \
                    and os.path.exists(str(value)):
                value = os.path.abspath(str(value))
            opts += [flag, str(value)]
    worker_cmd = tuple(shlex.split(args.worker_cmd)) if args.worker_cmd else None
    sig, grace = "TERM", 60 if args.grace is None else args.grace
    if args.signal is not None:
        sig, grace = parse_signal(args.signal)
        if args.grace is not None and args.grace != grace:
            raise InvalidArgument("--signal", f"sets the warning to {grace} s before the limit; "
                                  f"--grace {args.grace} disagrees (give one of them)",
                                  args.signal)
    return [ArraySpec(queue=queue, tier=t, workers=workers[t], max_running=running[t],
                      mem=mems[t], time=args.time, grace=grace, signal=sig,
                      agent_grace=args.agent_grace, checkpoint_margin=args.checkpoint_margin,
                      partition=args.partition,
                      cpus_per_task=args.cpus_per_task, max_restarts=args.max_restarts,
                      max_resubmits=args.max_resubmits,
                      requeue=args.requeue, worker_options=tuple(opts), worker_cmd=worker_cmd,
                      sbatch_options=tuple(shlex.split(args.sbatch_options or "")))
            for t in range(len(mems))]


def _submit(args: argparse.Namespace, slurm: SlurmArrays, out: TextIO) -> int:
    queue = os.path.abspath(args.queue)
    specs = _specs(args, queue)
    config = QueueConfig(tiers=len(specs), promote_after=args.promote_after,
                         max_failures=args.max_failures, stale_after=args.stale_after)
    tasks = read_tasks(args.tasks, len(specs), plugins=available_plugins())
    if args.dry_run:
        print(f"# dry run: {len(tasks)} tasks for {queue} ({len(specs)} tier(s)); "
              "nothing written or submitted", file=out)
        for s in specs:
            print(f"\n# tier {s.tier}: the batch script goes on sbatch's stdin", file=out)
            print(f"{shlex.join(sbatch_argv(s))} <<'EOF'", file=out)
            print(batch_script(s) + "EOF", file=out)
        return 0
    q = TaskQueue.create(queue, config)
    new = q.put_many(tasks)
    if os.path.exists(stop_file(queue)):   # a new submission resumes a cancelled campaign
        os.unlink(stop_file(queue))
    print(f"queue {queue}: {new} new task(s), {len(tasks) - new} already queued", file=out)
    os.makedirs(os.path.join(queue, "slurm"), exist_ok=True)
    for s in specs:
        job = slurm.submit(s)
        record_jobs(queue, [array_record(s, job)])
        with open(os.path.join(queue, "slurm", f"{job}.sh"), "w") as f:
            f.write(batch_script(s))
        write_resubmit_spec(s)
        print(f"tier {s.tier}: array {job} ({s.workers} workers"
              + (f", at most {s.max_running} at once" if s.max_running else "")
              + (f", --mem={s.mem}" if s.mem else "") + ")", file=out)
    return 0


# ---------------------------------------------------------------------- status
def queue_status(queue: str, slurm: SlurmArrays | None) -> dict[str, Any]:
    """Counts per state and tier, and the recorded arrays' Slurm states (JSON-ready).

    ``finished``: nothing pending or claimed. ``stranded``: tiers with pending or claimed
    tasks and no live array that may run them (its own tier, or a higher one when the queue
    lets workers steal down): submit again to finish them.
    """
    q = TaskQueue(queue)
    by_tier = q.counts_by_tier()
    tiers = q.config.tiers
    table = {s: {str(t): by_tier[s].get(t, 0) for t in range(tiers)} for s in STATES}
    totals = {s: sum(by_tier[s].values()) for s in STATES}
    arrays = [dict(a) for a in load_jobs(queue)]
    events = load_events(queue)
    known = {str(a["job_id"]) for a in arrays}
    for e in events:  # jobs the wrappers resubmitted count as arrays of their tier
        if e.get("event") == "resubmit" and str(e.get("job_id")) not in known:
            known.add(str(e["job_id"]))
            tier = next((a["tier"] for a in arrays
                         if str(e.get("task", "")).split("_")[0] == str(a["job_id"])), None)
            arrays.append({"job_id": str(e["job_id"]), "tier": tier,
                           "resubmitted_from": e.get("task")})
    slurm_error = None
    if arrays and slurm is not None:
        try:
            states = slurm.array_states([a["job_id"] for a in arrays])
        except CommandError as exc:
            slurm_error = str(exc)
            states = {}
        for a in arrays:
            st = states.get(str(a["job_id"]))
            a["states"] = st["states"] if st else {}
            a["restarts"] = st["restarts"] if st else 0
            a["live"] = bool(st and any(k in LIVE for k in st["states"]))
    live_tiers = {a["tier"] for a in arrays if a.get("live")}

    def served(t: int) -> bool:  # a live worker array may run tier t's tasks
        return any(w == t or (q.config.steal_down and w > t) for w in live_tiers)

    stranded = [] if slurm is None or slurm_error else [
        t for t in range(tiers)
        if table["pending"][str(t)] + table["claimed"][str(t)] and not served(t)]
    return {"queue": queue, "tiers": tiers, "counts": totals, "by_tier": table,
            "arrays": [{k: a.get(k) for k in ("job_id", "tier", "workers", "mem", "states",
                                               "restarts", "live", "resubmitted_from")}
                       for a in arrays],
            "requeues": _requeue_summary(events),
            "slurm_error": slurm_error,
            "finished": totals["pending"] + totals["claimed"] == 0,
            "stranded": stranded}


def _requeue_summary(events: list[dict[str, Any]]) -> dict[str, Any]:
    """What the wrappers recorded: requeues done, requeues refused, resubmissions (and
    their failures and limits), with the last refusal's reason."""
    n = {k: sum(e.get("event") == k for e in events)
         for k in ("requeue", "requeue-refused", "resubmit", "resubmit-failed", "resubmit-limit")}
    refused = [e for e in events if e.get("event") == "requeue-refused"]
    return {"requeued": n["requeue"], "refused": n["requeue-refused"],
            "resubmitted": n["resubmit"], "resubmit_failed": n["resubmit-failed"],
            "resubmit_limit": n["resubmit-limit"],
            "last_refusal": refused[-1].get("reason") if refused else None}


def format_status(st: dict[str, Any]) -> str:
    """The plain-text view of :func:`queue_status`."""
    lines = [f"queue {st['queue']}  ({st['tiers']} tier(s))",
             f"{'':8}" + "".join(f"{s:>9}" for s in STATES)]
    for t in range(st["tiers"]):
        lines.append(f"{'tier ' + str(t):8}" + "".join(f"{st['by_tier'][s][str(t)]:>9}"
                                                      for s in STATES))
    lines.append(f"{'total':8}" + "".join(f"{st['counts'][s]:>9}" for s in STATES))
    if st["arrays"]:
        lines.append("arrays")
        for a in st["arrays"]:
            states = ", ".join(f"{k} {v}" for k, v in sorted((a.get("states") or {}).items())) \
                if a.get("states") else "not listed by Slurm"
            lines.append(f"  {a['job_id']:>8}  tier {a['tier']}  {states}"
                         + (f"  (requeued {a['restarts']}x)" if a.get("restarts") else "")
                         + (f"  (resubmitted for {a['resubmitted_from']})"
                            if a.get("resubmitted_from") else ""))
    else:
        lines.append("arrays: none recorded in jobs.json")
    rq = st.get("requeues") or {}
    if any(v for k, v in rq.items() if k != "last_refusal"):
        lines.append(f"requeues: {rq['requeued']} by the wrappers, {rq['refused']} refused by "
                     f"Slurm; resubmissions: {rq['resubmitted']}"
                     + (f", {rq['resubmit_failed']} failed" if rq["resubmit_failed"] else "")
                     + (f", {rq['resubmit_limit']} at the limit" if rq["resubmit_limit"] else ""))
        if rq.get("last_refusal"):
            lines.append(f"  last refusal: {rq['last_refusal']}")
    if st.get("slurm_error"):
        lines.append(f"slurm: unavailable: {st['slurm_error']}")
    for t in st.get("stranded", []):
        lines.append(f"note: tier {t} has unfinished tasks and no live array; submit again "
                     "(bursar-run submit TASKS.jsonl --queue ...) to start workers")
    lines.append("finished: all tasks done or failed" if st["finished"] else "")
    return "\n".join(lines).rstrip() + "\n"


def _status(args: argparse.Namespace, slurm: SlurmArrays, out: TextIO) -> int:
    queue = os.path.abspath(args.queue)
    tty = out.isatty() if hasattr(out, "isatty") else False
    try:
        while True:
            st = queue_status(queue, slurm)
            if args.json:
                print(json.dumps(st, sort_keys=True), file=out, flush=True)
            elif args.watch and tty:   # redraw in place: home, clear to the end
                out.write("\x1b[H\x1b[J" + time.strftime("%H:%M:%S ") + format_status(st))
                out.flush()
            else:
                if args.watch:
                    print(time.strftime("--- %H:%M:%S"), file=out)
                out.write(format_status(st))
                out.flush()
            if not args.watch or st["finished"]:
                return 0
            time.sleep(args.interval)
    except KeyboardInterrupt:
        return 0


# ---------------------------------------------------------------------- cancel, requeue
def _cancel(args: argparse.Namespace, slurm: SlurmArrays, out: TextIO) -> int:
    queue = os.path.abspath(args.queue)
    TaskQueue(queue)  # a clear error if this is not a queue
    ids = [str(a["job_id"]) for a in load_jobs(queue)]
    ids += [str(e["job_id"]) for e in load_events(queue)
            if e.get("event") == "resubmit" and str(e.get("job_id")) not in ids]
    if not ids:
        print(f"queue {queue}: no arrays recorded in jobs.json; nothing to cancel", file=out)
        return 0
    # first the stop file, so the wrappers that get scancel's SIGTERM do not requeue
    with open(stop_file(queue), "w") as f:
        f.write(json.dumps({"at": time.time(), "arrays": ids}) + "\n")
    slurm.cancel(ids)
    print(f"cancelled arrays {' '.join(ids)}: workers checkpoint and release their tasks; "
          "`bursar-run submit` on this queue resumes the campaign", file=out)
    return 0


def _requeue_failed(args: argparse.Namespace, slurm: SlurmArrays, out: TextIO) -> int:
    queue = os.path.abspath(args.queue)
    q = TaskQueue(queue)
    moved = q.requeue_failed(args.ids or None)
    print(f"requeued {len(moved)} failed task(s)" + (f": {' '.join(moved)}" if moved else ""),
          file=out)
    missing = sorted(set(args.ids) - set(moved))
    if missing:
        print(f"not in failed/: {' '.join(missing)}", file=out)
    if moved:
        st = queue_status(queue, slurm)
        for t in st["stranded"]:
            print(f"note: tier {t} has no live array; submit again to run them", file=out)
    return 0


# ---------------------------------------------------------------------- parser
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bursar-run", description="Run agent tasks from a "
                                "shared-filesystem queue in Slurm job arrays, with "
                                "checkpoint, requeue and resume.")
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("submit", help="queue tasks and submit one worker array per tier")
    s.add_argument("tasks", metavar="TASKS.jsonl",
                   help='one {"id": ..., "payload": ...[, "tier": t]} object per line')
    s.add_argument("--queue", required=True, help="queue directory on a shared filesystem")
    s.add_argument("--workers", required=True, metavar="N[,N...]",
                   help="array tasks per tier (one number, or one per tier)")
    s.add_argument("--max-running", metavar="M[,M...]",
                   help="at most M array tasks of a tier at once (%%M)")
    s.add_argument("--tiers", metavar="mem=2G,8G",
                   help="one tier per memory size, smallest first (default: one tier)")
    s.add_argument("--promote-after", type=int, default=1, metavar="K",
                   help="failures before a task moves up a tier (default 1)")
    s.add_argument("--max-failures", type=int, default=3, metavar="N",
                   help="failures before a task goes to failed/ (default 3)")
    s.add_argument("--stale-after", type=float, default=180.0, metavar="S",
                   help="seconds without heartbeat before a claim is reclaimed (default 180)")
    s.add_argument("--time", metavar="LIMIT", help="each array task's --time (e.g. 00:30:00)")
    s.add_argument("--grace", type=int, metavar="S",
                   help="SIGTERM this many seconds before the limit (default 60; Slurm "
                        "checks every 30 s, so it may come up to 30 s earlier)")
    s.add_argument("--signal", metavar="SIG@S",
                   help="warn with SIG (TERM, USR1 or USR2) S seconds before the limit "
                        "(sbatch --signal=B:SIG@S; sets --grace); wrapper and worker handle "
                        "SIG like SIGTERM: checkpoint, release, requeue")
    s.add_argument("--agent-grace", type=float, metavar="S",
                   help="seconds a SIGTERMed agent gets to stop (default: half of --grace)")
    s.add_argument("--partition", metavar="P")
    s.add_argument("--cpus-per-task", type=int, metavar="C")
    s.add_argument("--runner", choices=["none", "bwrap", "apptainer"])
    s.add_argument("--image", metavar="IMG", help="container image (--runner apptainer)")
    s.add_argument("--secrets", metavar="FILE", help="environment file passed to agents")
    s.add_argument("--scratch", metavar="DIR", help="node-local scratch for workspaces")
    s.add_argument("--heartbeat", type=float, metavar="S", help="worker heartbeat period")
    s.add_argument("--checkpoint-margin", type=float, metavar="S",
                   help="worker checkpoints this long before its time limit (worker "
                        "default 120; --time must be longer)")
    s.add_argument("--max-restarts", type=int, default=3, metavar="K",
                   help="wrapper relaunches after worker crashes (default 3)")
    s.add_argument("--max-resubmits", type=int, default=3, metavar="N",
                   help="where scontrol requeue is refused (site policy), the wrapper "
                        "submits a lost task again itself, at most N times in a row "
                        "(default 3; 0: never)")
    s.add_argument("--requeue", choices=["self", "admin"], default="self",
                   help="self: the wrapper runs scontrol requeue (default); admin: the "
                        "site has RequeueExit=99")
    s.add_argument("--worker-cmd", metavar="CMD",
                   help="worker program instead of 'python -m bursarcore.runtime.worker' "
                        "(--queue, --tier, --grace ... are appended)")
    s.add_argument("--sbatch-options", metavar="OPTS", help="extra sbatch options (quoted)")
    s.add_argument("--dry-run", action="store_true",
                   help="print the batch scripts and sbatch commands; write nothing")
    s.set_defaults(func=_submit)

    st = sub.add_parser("status", help="tasks per state and tier, and the arrays' states")
    st.add_argument("--queue", required=True)
    st.add_argument("--watch", action="store_true",
                    help="refresh until nothing is pending or claimed (Ctrl-C stops)")
    st.add_argument("--interval", type=float, default=2.0, metavar="S",
                    help="seconds between refreshes (default 2)")
    st.add_argument("--json", action="store_true", help="one JSON object per refresh")
    st.set_defaults(func=_status)

    c = sub.add_parser("cancel", help="scancel the queue's recorded arrays")
    c.add_argument("--queue", required=True)
    c.set_defaults(func=_cancel)

    r = sub.add_parser("requeue-failed", help="move failed tasks (all, or IDS) back to pending")
    r.add_argument("--queue", required=True)
    r.add_argument("ids", nargs="*", metavar="IDS")
    r.set_defaults(func=_requeue_failed)
    return p


def main(argv: Sequence[str] | None = None, *, slurm: SlurmArrays | None = None,
         out: TextIO | None = None) -> int:
    """Entry point of ``bursar-run``. ``slurm``: the command seam (tests pass a fake);
    ``out``: where reports go (default stdout)."""
    args = build_parser().parse_args(argv)
    out = sys.stdout if out is None else out
    slurm = SlurmArrays() if slurm is None else slurm
    try:
        _check_queue_path(args.queue)
        return int(args.func(args, slurm, out))
    except InvalidArgument as exc:
        print(f"bursar-run {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except CommandError as exc:
        print(f"bursar-run {args.command}: {exc}", file=sys.stderr)
        return 1
    except BursarError as exc:  # not a queue, settings disagree, lock problems
        print(f"bursar-run {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
