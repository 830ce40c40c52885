"""Slurm binding: pilots are batch jobs that hold an allocation; a lease's work is a job
step inside it (SPEC §12). Driven through Slurm's commands — ``sbatch``, ``squeue
--json``, ``sinfo --json``, ``squeue --start``, ``sbatch --test-only``, ``srun``,
``scancel`` — every one through :meth:`~bursarcore.adapters.Binding.execute`.

Run against Slurm 22.05 (Debian 12); reads the ``squeue --json`` of every release from
22.05 to 25.11 (tests/fixtures/slurm/README.md cites each shape's source).

Status. ``squeue --json --me``, once per ``min_interval``: only the pilots' user's jobs
(the binding submits them, so they are its user's). From 23.02 on, ``--me`` makes squeue ask
slurmctld for one user's jobs (``slurm_load_job_user``): one small request for every pilot
however many there are, and the JSON holds only those. ``--jobs`` would not do: squeue asks
for one job by id only when given exactly one id, else loads every job of the cluster, and
23.02 dumps that whole list into the JSON whatever the filter. 22.05's ``squeue --json``
ignores every option (it runs the openapi ``/jobs`` handler, all jobs): there the flag
costs nothing and the binding picks its pilots by id, as it must anyway. Supply's pending
demand is the queue's, every user's: ``squeue --noheader --states=PENDING
--format=%i|%P|%C|%D|%b`` (text, whose filters every release honours: a few bytes a job,
not the JSON's few kilobytes).

Shapes. 22.05 (openapi v0.0.38) prints ``job_state`` as a name, numbers as numbers and
``exit_code`` as a raw wait status; 23.02 (data_parser v0.0.39) wraps numbers that may be
unset as ``{"set", "infinite", "number"}``, the wait status too; 23.11 (v0.0.40) on print
``job_state`` as a list of the base state and its flags, times as ``{set, infinite,
number}`` and ``exit_code`` as ``{"status": [...], "return_code": {...}, "signal": {"id":
{...}, "name": ...}}``; 24.05 (v0.0.41) on print ``job_resources.nodes`` as ``{"count",
"list", "allocation": [{"name", "cpus": {"count"}, ...}]}`` instead of ``allocated_nodes``.
A state list is read as ``job_state_string()`` reads the bits: the first flag in its order,
else the base state. Times in text output are local time, so the commands whose times are
parsed run with ``TZ=UTC``.

Pilot. ``sbatch --parsable --no-requeue --job-name=<name> --nodes=N --time=<minutes>``
with either ``--exclusive`` (whole nodes, the default) or ``--ntasks-per-node=S`` (S
slots per node); a ``gpu`` binding adds ``--gres=gpu:G``. The batch script only sleeps:
the allocation is the point. Slurm's walltime is whole minutes, so a walltime is rounded
up to the next minute.

Launch. One ``srun --jobid=<pilot> --nodelist=<host> --nodes=1`` per host of the
lease's placement: ``--ntasks=1 --cpus-per-task=k`` (or ``--ntasks=k`` per slot), or for
GPUs ``--gres=gpu:k``; with ``--exact`` (``step_mode="exact"``, default) each step gets
exactly its CPUs, so Slurm itself keeps leases of one pilot apart, and a step whose CPUs
are still held by a dying step waits for them; ``step_mode="overlap"`` shares the
allocation (``--overlap``) and leaves the separation to the broker. Each step is named
``bursar-lease-<lease>.<k>``.

Enforce. The notice signal goes to the step only: ``scancel --signal=TERM <job>.<step>``
(the step id is looked up by name with ``squeue --steps``); the kill is ``scancel
--signal=KILL <job>.<step>``. The pilot and its other steps are never signalled.
(Signalling the ``srun`` process instead would not do: ``srun`` answers SIGTERM by
killing its step at once, so the task never sees the notice.)
"""

from __future__ import annotations

import calendar
import json
import math
import re
import signal as _signal
import time
from typing import Any, Mapping, Sequence

from ..errors import InvalidArgument
from .handles import ProcessHandle
from .interface import (CANCELLED, COMPLETED, ENDING, FAILED, HELD, NODE_BUSY, NODE_DOWN,
                        NODE_FREE, NODE_PARTIAL, NODE_UNKNOWN, PENDING, RUNNING, SUSPENDED,
                        TERMINAL, TIMEOUT, Binding, CommandError, PilotStatus,
                        SchedulerSupply, log, map_state)

__all__ = ["SlurmBinding", "SLURM_STATES", "SQUEUE_CODES", "SLURM_NODE_STATES",
           "SlurmStepHandle", "parse_wait_status", "slurm_number", "job_state_name",
           "job_exit_code"]

#: Every job state ``squeue``/``sacct`` print in 22.05 (base states, then the names
#: ``job_state_string`` gives a job with a state flag set), to ours.
SLURM_STATES: dict[str, str] = {
    "PENDING": PENDING,
    "CONFIGURING": PENDING,        # nodes allocated, booting/configuring: not usable yet
    "POWER_UP_NODE": PENDING,
    "REQUEUED": PENDING,           # back in the queue
    "REQUEUE_FED": PENDING,
    "REQUEUE_CRON": PENDING,
    "EXPEDITING": PENDING,         # 25.11: an expedited requeue
    "REQUEUE_HOLD": HELD,
    "SPECIAL_EXIT": HELD,          # requeued and held (RequeueExitHold)
    "RESV_DEL_HOLD": HELD,
    "RUNNING": RUNNING,
    "RESIZING": RUNNING,
    "SIGNALING": RUNNING,
    "UPDATE_DB": RUNNING,
    "SUSPENDED": SUSPENDED,
    "STOPPED": SUSPENDED,          # SIGSTOPped: allocated, not running
    "COMPLETING": ENDING,
    "STAGE_OUT": ENDING,
    "COMPLETED": COMPLETED,
    "CANCELLED": CANCELLED,
    "REVOKED": CANCELLED,          # federation: the job runs on another cluster
    "FAILED": FAILED,
    "NODE_FAIL": FAILED,
    "BOOT_FAIL": FAILED,
    "LAUNCH_FAILED": FAILED,
    "RECONFIG_FAIL": FAILED,
    "OUT_OF_MEMORY": FAILED,
    "TIMEOUT": TIMEOUT,
    "DEADLINE": TIMEOUT,
    "PREEMPTED": TIMEOUT,          # an expected end for a pilot, as in Parsl's table
}

#: ``squeue -o %t`` compact codes (squeue(1), JOB STATE CODES) to the long names.
SQUEUE_CODES: dict[str, str] = {
    "BF": "BOOT_FAIL", "CA": "CANCELLED", "CD": "COMPLETED", "CF": "CONFIGURING",
    "CG": "COMPLETING", "DL": "DEADLINE", "F": "FAILED", "NF": "NODE_FAIL",
    "OOM": "OUT_OF_MEMORY", "PD": "PENDING", "PR": "PREEMPTED", "R": "RUNNING",
    "RD": "RESV_DEL_HOLD", "RF": "REQUEUE_FED", "RH": "REQUEUE_HOLD", "RQ": "REQUEUED",
    "RS": "RESIZING", "RV": "REVOKED", "SI": "SIGNALING", "SE": "SPECIAL_EXIT",
    "SO": "STAGE_OUT", "ST": "STOPPED", "S": "SUSPENDED", "TO": "TIMEOUT",
}

#: ``sinfo --json`` base node states (lower case) to ours; flags are handled apart.
SLURM_NODE_STATES: dict[str, str] = {
    "idle": NODE_FREE, "mixed": NODE_PARTIAL, "allocated": NODE_BUSY,
    "completing": NODE_BUSY, "down": NODE_DOWN, "error": NODE_DOWN, "future": NODE_DOWN,
    "unknown": NODE_UNKNOWN,
}
#: node state flags that make a node unusable for a new pilot
_UNUSABLE_FLAGS = {"DRAIN", "DRAINED", "DRAINING", "FAIL", "FAILING", "MAINTENANCE",
                   "NOT_RESPONDING", "POWERED_DOWN", "POWERING_DOWN", "POWER_DOWN",
                   "REBOOT_ISSUED", "INVALID_REG", "DOWN"}

_START_RE = re.compile(r"to start at (\d+-\d\d-\d\dT\d\d:\d\d:\d\d)")
#: a start estimate further ahead than this is no estimate (22.05 can print a year 10193)
HORIZON = 366 * 86400.0
_GRES_RE = re.compile(r"gpu(?::[^:(,]+)?:(\d+)")


def parse_wait_status(raw: float | None) -> int | None:
    """Slurm 22.05's ``exit_code`` in ``squeue --json`` is a raw wait status (768 for
    ``exit 3``): in shell convention, 128 + N for a death by signal N."""
    if raw is None:
        return None
    raw = int(raw)
    sig = raw & 0x7F
    return 128 + sig if sig else (raw >> 8) & 0xFF


#: the flags ``job_state_string()`` names instead of the base state, in its order
#: (src/common/slurm_protocol_defs.c; EXPEDITING from 25.11)
_STATE_FLAG_ORDER = ("COMPLETING", "STAGE_OUT", "CONFIGURING", "EXPEDITING", "RESIZING",
                     "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "SPECIAL_EXIT", "STOPPED",
                     "REVOKED", "RESV_DEL_HOLD", "SIGNALING")
_BASE_STATES = ("PENDING", "RUNNING", "SUSPENDED", "COMPLETED", "CANCELLED", "FAILED",
                "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY")


def slurm_number(v: Any) -> float | int | None:
    """A number of ``squeue --json`` in any release's shape: a plain number (22.05), or
    ``{"set": bool, "infinite": bool, "number": n}`` (23.02 on): None when not set or
    infinite (Slurm's NO_VAL and INFINITE)."""
    if isinstance(v, Mapping):
        if not v.get("set", False) or v.get("infinite", False):
            return None
        v = v.get("number")
    if v is None or isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return v
    try:
        return float(v) if "." in str(v) else int(v)
    except (TypeError, ValueError):
        return None


def job_state_name(v: Any) -> str:
    """One state name from ``job_state``: a name (22.05–23.02) as it is; a list of the base
    state and its flags (23.11 on) as ``job_state_string()`` names the bits — the first
    flag in its order, else the base state, else the first entry."""
    if isinstance(v, str):
        return v
    if isinstance(v, (list, tuple)):
        names = [str(x) for x in v]
        for flag in _STATE_FLAG_ORDER:
            if flag in names:
                return flag
        return next((n for n in names if n in _BASE_STATES), names[0] if names else "")
    return "" if v is None else str(v)


def job_exit_code(v: Any) -> int | None:
    """A job's exit status in shell convention (128 + N for a death by signal N) from
    ``exit_code`` in any release's shape: a raw wait status (22.05), the same wrapped as
    ``{set, infinite, number}`` (23.02), or ``{"status": [...], "return_code": {...},
    "signal": {"id": {...}, "name": ...}}`` (23.11 on); None while it has none."""
    if isinstance(v, Mapping) and ("status" in v or "return_code" in v or "signal" in v):
        st = v.get("status")
        status = {str(x) for x in (st if isinstance(st, (list, tuple)) else [st])}
        if status & {"SIGNALED", "CORE_DUMPED"}:
            sig = v.get("signal") or {}
            num = slurm_number(sig.get("id")) if isinstance(sig, Mapping) else None
            if num is None and isinstance(sig, Mapping) and sig.get("name"):
                name = str(sig["name"]).upper()
                name = name if name.startswith("SIG") else "SIG" + name
                num = getattr(_signal.Signals, name, None)
                num = None if num is None else int(num)
            return None if num is None else 128 + int(num)
        if "PENDING" in status:
            return None
        rc = slurm_number(v.get("return_code"))
        return None if rc is None else int(rc)
    return parse_wait_status(slurm_number(v))


def _names(v: Any) -> list[str]:
    """A list of names given as a list or as one comma-separated string."""
    if isinstance(v, str):
        return [x for x in v.split(",") if x]
    return [str(x) for x in v or ()]


def _utc(text: str) -> float | None:
    if len(text.strip().partition("-")[0]) != 4:
        return None
    try:
        return float(calendar.timegm(time.strptime(text.strip(), "%Y-%m-%dT%H:%M:%S")))
    except ValueError:
        return None


def _gpus(text: str) -> int:
    return sum(int(m) for m in _GRES_RE.findall(text or ""))


class SlurmStepHandle(ProcessHandle):
    """A job step for one host of a lease: the local ``srun`` process and the step it
    creates in the pilot (``<pilot>.<step>``, looked up by its name when signalled)."""

    def __init__(self, proc: Any, lease_id: int, pilot_id: str, host: str, slots: int,
                 argv: Sequence[str], step_name: str) -> None:
        super().__init__(proc, lease_id, pilot_id, host, slots, argv)
        self.step_name = step_name
        self.step_ids: list[str] = []


class SlurmBinding(Binding):
    """Pilots as Slurm batch jobs; leases' work as job steps inside them.

    ``SlurmBinding(partition="debug", dim="cpu")``. Options: ``partition``, ``account``,
    ``qos``, ``constraint``; ``slots_per_node`` (None: whole nodes with ``--exclusive``;
    else ``--ntasks-per-node``); ``gpus_per_node`` (``dim="gpu"``: ``--gres=gpu:G``);
    ``sbatch_options`` (extra arguments); ``step_mode`` (``"exact"`` or ``"overlap"``);
    ``pilot_output`` (the pilots' ``--output``, default ``/dev/null``); and the
    :class:`~bursarcore.adapters.Binding` options.
    """

    name = "slurm"
    STATES = SLURM_STATES
    NODE_STATE_TABLE = SLURM_NODE_STATES

    def __init__(self, *, partition: str | None = None, account: str | None = None,
                 qos: str | None = None, constraint: str | None = None,
                 slots_per_node: int | None = None, gpus_per_node: int | None = None,
                 sbatch_options: Sequence[str] = (), step_mode: str = "exact",
                 pilot_output: str = "/dev/null", **kw: Any) -> None:
        super().__init__(**kw)
        if step_mode not in ("exact", "overlap"):
            raise InvalidArgument("step_mode", "must be 'exact' or 'overlap'", step_mode)
        for f, v in (("slots_per_node", slots_per_node), ("gpus_per_node", gpus_per_node)):
            if v is not None and (not isinstance(v, int) or v < 1):
                raise InvalidArgument(f, "must be an integer >= 1 or None", v)
        if self.dim == "gpu" and gpus_per_node is None:
            raise InvalidArgument("gpus_per_node", "is required for a gpu binding", None)
        self.partition, self.account, self.qos, self.constraint = partition, account, qos, constraint
        self.slots_per_node, self.gpus_per_node = slots_per_node, gpus_per_node
        self.sbatch_options = list(sbatch_options)
        self.step_mode = step_mode
        self.pilot_output = pilot_output

    # ------------------------------------------------------------------ pilots
    SCRIPT = "#!/bin/sh\n# bursar pilot: holds the allocation; work arrives as job steps\nexec sleep infinity\n"

    def pilot_args(self, nodes: int, walltime: float, name: str | None = None) -> list[str]:
        """The ``sbatch`` arguments of a pilot (without ``--parsable``)."""
        minutes = max(1, math.ceil(float(walltime) / 60.0))
        a = [f"--job-name={name or 'bursar-pilot'}", f"--nodes={int(nodes)}",
             f"--time={minutes}", "--no-requeue", f"--output={self.pilot_output}"]
        if self.slots_per_node is None:
            a.append("--exclusive")
        else:
            a.append(f"--ntasks-per-node={self.slots_per_node}")
        if self.dim == "gpu":
            a.append(f"--gres=gpu:{self.gpus_per_node}")
        for opt, v in (("partition", self.partition), ("account", self.account),
                       ("qos", self.qos), ("constraint", self.constraint)):
            if v:
                a.append(f"--{opt}={v}")
        return a + self.sbatch_options

    def submit(self, nodes: int, walltime: float, *, name: str | None = None) -> str:
        cp = self.execute(["sbatch", "--parsable", *self.pilot_args(nodes, walltime, name)],
                          input=self.SCRIPT)
        job = cp.stdout.strip().split(";")[0]       # "ID" or "ID;cluster"
        if not job.isdigit():
            raise CommandError(["sbatch", "--parsable"], 0,
                               f"unexpected sbatch output {cp.stdout!r}", cp.stdout)
        return job

    def cancel(self, ids: Sequence[str]) -> None:
        if ids:
            self.execute(["scancel", *[str(i) for i in ids]])

    #: the status query: only this user's jobs (see the module docstring)
    SQUEUE_JSON = ("squeue", "--json", "--me")

    def _jobs(self) -> dict[str, dict]:
        def load() -> dict[str, dict]:
            argv = list(self.SQUEUE_JSON)
            out = self.execute(argv).stdout
            try:
                doc = json.loads(out)
            except ValueError as e:
                raise CommandError(argv, 0, f"unparseable JSON: {e}", out) from None
            return {str(j["job_id"]): j for j in doc.get("jobs", [])}
        return self.query("squeue", load)

    def _pending(self) -> list[tuple[str, int, int, str]]:
        """Every user's pending jobs (in the partition): (partition, CPUs, nodes, gres)."""
        def load() -> list[tuple[str, int, int, str]]:
            argv = ["squeue", "--noheader", "--states=PENDING", "--format=%i|%P|%C|%D|%b"]
            if self.partition:
                argv.append(f"--partition={self.partition}")
            rows = []
            for line in self.execute(argv).stdout.splitlines():
                f = line.strip().split("|")
                if len(f) != 5 or not f[0]:
                    continue
                try:
                    rows.append((f[1], int(f[2]), int(f[3]), "" if f[4] == "N/A" else f[4]))
                except ValueError:
                    raise CommandError(argv, 0, f"unexpected squeue line {line!r}",
                                       line) from None
            return rows
        return self.query("pending", load)

    def status(self, ids: Sequence[str]) -> dict[str, PilotStatus]:
        jobs = self._jobs()
        return {str(i): self._status_of(jobs[str(i)]) for i in ids if str(i) in jobs}

    def _status_of(self, j: Mapping[str, Any]) -> PilotStatus:
        raw = job_state_name(j.get("job_state"))
        state = map_state(self.STATES, raw, scheduler=self.name)
        hosts = self._hosts(j) if state in (RUNNING, SUSPENDED, ENDING) else ()
        start = slurm_number(j.get("start_time")) or None
        end = slurm_number(j.get("end_time")) or None
        reason = j.get("state_reason") or None
        if raw == "NODE_FAIL":
            reason = "node failure"
        return PilotStatus(state=state, raw=raw, hosts=hosts,
                           start=float(start) if start and state != PENDING else None,
                           end=float(end) if end and state == RUNNING else None,
                           exit_code=job_exit_code(j.get("exit_code"))
                           if state in TERMINAL else None,
                           reason=None if reason in ("None", "") else str(reason))

    def _hosts(self, j: Mapping[str, Any]) -> tuple[tuple[str, int], ...]:
        res = j.get("job_resources") or {}
        detail = list(j.get("gres_detail") or [])
        if isinstance(res.get("nodes"), Mapping):
            # 24.05 on: nodes.allocation[i] = {name, cpus: {count, used}, sockets, ...}
            alloc = res["nodes"].get("allocation") or []
            if self.dim == "gpu":
                return tuple((str(n.get("name")), _gpus(detail[i]) if i < len(detail) else 0)
                             for i, n in enumerate(alloc))
            return tuple((str(n.get("name")), int(slurm_number((n.get("cpus") or {}).get("count"))
                                                  or 0)) for n in alloc)
        nodes = res.get("allocated_nodes") or []
        if isinstance(nodes, dict):            # some versions key the list by index
            nodes = [nodes[k] for k in sorted(nodes, key=lambda x: int(x))]
        if self.dim == "gpu":
            return tuple((str(n.get("nodename")), _gpus(detail[i]) if i < len(detail) else 0)
                         for i, n in enumerate(nodes))
        counts: list[list[Any]] = []             # [host, cores]
        for n in nodes:
            cores = 0
            for sock in (n.get("sockets") or {}).values():
                for v in (sock.get("cores") or {}).values():
                    if str(v).startswith("alloc") or "use" in str(v):
                        cores += 1
            counts.append([str(n.get("nodename")), cores])
        total, cpus = sum(c for _, c in counts), int(slurm_number(j.get("cpus")) or 0)
        if total and cpus and cpus != total and cpus % total == 0:  # threads per core
            for c in counts:
                c[1] *= cpus // total
        if not total and len(counts) == 1 and cpus:
            counts[0][1] = cpus
        return tuple((h, k) for h, k in counts)

    # ------------------------------------------------------------------ supply
    def _nodes(self) -> list[dict]:
        def load() -> list[dict]:
            out = self.execute(["sinfo", "--json"]).stdout
            try:
                return list(json.loads(out).get("nodes", []))
            except ValueError as e:
                raise CommandError(["sinfo", "--json"], 0, f"unparseable JSON: {e}", out) from None
        return self.query("sinfo", load)

    def node_state(self, n: Mapping[str, Any]) -> str:
        """Ours for one ``sinfo --json`` node: 22.05 gives ``state`` as a name and
        ``state_flags`` apart; 23.02 on give one list, the base state and its flags
        (``PARSER_FLAG_ARRAY(NODE_STATES)``), e.g. ``["IDLE", "DRAIN"]``."""
        raw = n.get("state", "")
        flags = {str(f).upper() for f in n.get("state_flags") or ()}
        if isinstance(raw, (list, tuple)):
            names = [str(x).lower() for x in raw]
            base_st = next((x for x in names if x in self.NODE_STATE_TABLE), names[0] if names else "")
            flags |= {x.upper() for x in names if x != base_st}
            raw = base_st
        st = str(raw).lower()
        if "+" in st:                         # e.g. "idle+drain" in some versions
            st, *more = st.split("+")
            flags |= {m.upper() for m in more}
        ours = map_state(self.NODE_STATE_TABLE, st, scheduler=self.name, what="node")
        return NODE_DOWN if flags & _UNUSABLE_FLAGS else ours

    def supply(self) -> SchedulerSupply:
        nodes = [n for n in self._nodes()
                 if not self.partition or self.partition in _names(n.get("partitions"))]
        pending = self._pending()
        total = free = down = s_total = s_free = s_alloc = 0
        for n in nodes:
            st = self.node_state(n)
            total += 1
            if st in (NODE_DOWN, NODE_UNKNOWN):
                down += 1
                continue
            if self.dim == "gpu":
                cap, used = _gpus(str(n.get("gres", ""))), _gpus(str(n.get("gres_used", "")))
            else:
                cap, used = int(n.get("cpus") or 0), int(n.get("alloc_cpus") or 0)
            s_total += cap
            s_alloc += used
            s_free += max(0, cap - used)
            free += st == NODE_FREE
        pend_jobs = pend_slots = 0
        for part, cpus, nnodes, gres in pending:
            # a job pending in several partitions lists them all ("debug,long")
            if self.partition and self.partition not in part.split(","):
                continue
            pend_jobs += 1
            # GPUs: the per-node gres (--gres=gpu:G) times the nodes; a job asking for
            # GPUs per job or per task (--gpus=) shows none here and counts 0
            pend_slots += _gpus(gres) * nnodes if self.dim == "gpu" else cpus
        return SchedulerSupply(time=self.wallclock(), dim=self.dim, nodes_total=total,
                               nodes_free=free, nodes_down=down, slots_total=s_total,
                               slots_free=s_free, slots_allocated=s_alloc,
                               pending_jobs=pend_jobs, pending_slots=pend_slots)

    def expected_start(self, nodes: int, walltime: float,
                       pending: Sequence[str] = ()) -> float | None:
        if pending:
            ids = ",".join(sorted(str(i) for i in pending))
            try:
                out = self.query("start", lambda: self.execute(
                    ["squeue", "--start", "--noheader", "--format=%i|%S", f"--jobs={ids}"],
                    env={"TZ": "UTC"}).stdout)
            except CommandError as e:     # e.g. a pilot purged meanwhile
                log.info("slurm: squeue --start failed (%s); asking sbatch --test-only", e)
                out = ""
            now = self.wallclock()
            times = [t for t in (_utc(line.partition("|")[2]) for line in out.splitlines()
                                 if "|" in line) if t is not None and t - now < HORIZON]
            if times:
                return min(times)
        cp = self.query("test-only", lambda: self.execute(
            ["sbatch", "--test-only", *self.pilot_args(nodes, walltime)],
            input=self.SCRIPT, env={"TZ": "UTC"}))
        m = _START_RE.search(cp.stderr + cp.stdout)
        t = _utc(m.group(1)) if m else None
        return t if t is not None and t - self.wallclock() < HORIZON else None

    # ------------------------------------------------------------------ launch
    def _strip_env(self, key: str) -> bool:
        # an outer allocation's variables (the broker may itself run in a Slurm job) or
        # srun input variables would redirect or reshape the step
        return key.startswith(("SLURM_", "SRUN_", "SBATCH_", "SALLOC_")) and key != "SLURM_CONF"

    def step_args(self, pilot_id: str, host: str, units: int, per_slot: bool,
                  step_name: str) -> list[str]:
        a = ["srun", f"--jobid={pilot_id}", f"--nodelist={host}", "--nodes=1",
             f"--job-name={step_name}", "--exact" if self.step_mode == "exact" else "--overlap",
             "--kill-on-bad-exit=0"]
        if self.dim == "gpu":
            if per_slot:
                a += [f"--ntasks={units}", "--gpus-per-task=1"]
            else:
                a += ["--ntasks=1", f"--gres=gpu:{units}"]
        elif per_slot:
            a += [f"--ntasks={units}", "--cpus-per-task=1"]
        else:
            a += ["--ntasks=1", f"--cpus-per-task={units}"]
        return a

    def _launch_part(self, lid, k, pilot_id, host, units, argv, env, per_slot, cwd):
        step_name = f"bursar-lease-{lid}.{k}"
        full = self.step_args(pilot_id, host, units, per_slot, step_name) + ["--"] + argv
        out, err = self._outputs(lid, k)
        try:
            proc = self.spawn(full, env=env, cwd=cwd, stdout=out, stderr=err)
        finally:
            for f in (out, err):
                if hasattr(f, "close"):
                    f.close()
        return SlurmStepHandle(proc, lid, pilot_id, host, units, full, step_name)

    def _steps(self, pilot_id: str, name: str) -> list[str]:
        out = self.execute(["squeue", "--steps", "--noheader", "--format=%i|%j",
                            f"--jobs={pilot_id}"]).stdout
        return [sid for sid, _, nm in (line.strip().partition("|") for line in out.splitlines())
                if nm == name and sid]

    def _signal_part(self, handle, sig):
        if handle.poll() is not None:
            return
        try:
            steps = self._steps(handle.pilot_id, handle.step_name)
        except CommandError:
            steps = []              # the pilot itself is gone: its steps went with it
        handle.step_ids = steps or handle.step_ids
        if steps:
            name = _signal.Signals(sig).name.removeprefix("SIG")
            self.execute(["scancel", f"--signal={name}", *steps])
        else:
            # no step yet (srun still waiting for its CPUs): the lease has nothing
            # running to warn; stop srun, which withdraws the step request
            handle.send_group(_signal.SIGTERM if sig != _signal.SIGKILL else _signal.SIGKILL)
