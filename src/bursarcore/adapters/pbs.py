"""PBS Professional / OpenPBS binding (SPEC §12).

The same interface as the Slurm binding over ``qsub``, ``qstat -x -f -F json``,
``pbsnodes -a -F json``, ``qstat -Q -f -F json``, ``qstat -T -w``, ``qdel`` — every one
through :meth:`~bursarcore.adapters.Binding.execute`.

**No PBS server can run on the project's machines** (not in Debian, no PyPI build), so
this module has only been run against recorded documents (``tests/fixtures/pbs/``, built
from OpenPBS documentation and source and from captures published by sites; each cites
its origin) through the command seam. See ``docs/bindings.md``.

Pilot. ``qsub -N <name> -r n -j oe -o <output> -l select=N:ncpus=C[:ngpus=G]
-l place=scatter[:excl] -l walltime=HH:MM:SS [-q queue] [-A account]`` with a script on
stdin that only sleeps.

States. ``job_state`` letters (qstat(1B)); ``F`` (finished) is refined by
``Exit_status``: 0 completed; -29 (``JOB_EXEC_KILL_WALLTIME``) or ``resources_used.
walltime`` at the requested walltime: timeout; a pilot we ``qdel``-ed: cancelled;
anything else: failed.

Launch — the site convention chosen: **ssh into the pilot's hosts, attached to the job
with** ``pbs_attach``. The broker runs outside the pilot job, and ``pbsdsh`` (or an
``mpiexec`` using PBS's TM interface) only works from inside the job — it needs the
job's TM environment — so it cannot start a lease's work from the broker without an
agent inside the pilot. PBS sites commonly allow ssh to the nodes of one's running job
(``pam_pbssimpleauth``), and ``pbs_attach -j <job>`` puts the process under the job's
MoM (accounting, cgroups, cleanup at the job's end). Per host one ``ssh -o BatchMode=yes
<host> '<cd; echo $$ > pidfile; exec env K=V... pbs_attach -j <job> argv>'``; the remote
shell is a session leader (sshd calls ``setsid``), so its pid is the process group that
enforcement signals with ``ssh <host> kill -s TERM -- -<pid>``: only that lease's
processes. Set ``attach=False`` where ``pbs_attach`` is not installed, or override
:meth:`remote_command` for a site's own launcher.
"""

from __future__ import annotations

import calendar
import json
import math
import os
import re
import shlex
import signal as _signal
import time
from typing import Any, Mapping, Sequence

from ..errors import InvalidArgument
from .handles import ProcessHandle
from .interface import (CANCELLED, COMPLETED, ENDING, FAILED, HELD, NODE_BUSY, NODE_DOWN,
                        NODE_FREE, NODE_PARTIAL, NODE_UNKNOWN, PENDING, RUNNING, SUSPENDED,
                        TERMINAL, TIMEOUT, Binding, CommandError, PilotStatus,
                        SchedulerSupply, log, map_state)

__all__ = ["PBSBinding", "PBS_STATES", "PBS_NODE_STATES", "JOB_EXEC_KILL_WALLTIME",
           "parse_exec_vnode", "parse_est_start", "parse_walltime"]

#: qstat(1B) job states to ours (``F`` is refined by the exit status, see the module).
PBS_STATES: dict[str, str] = {
    "B": RUNNING,      # array job: at least one subjob running
    "E": ENDING,       # exiting after having run
    "F": COMPLETED,    # finished (refined by Exit_status)
    "H": HELD,
    "M": CANCELLED,    # moved to another server: gone from ours
    "Q": PENDING,
    "R": RUNNING,
    "S": SUSPENDED,
    "T": PENDING,      # being moved to a new location
    "U": SUSPENDED,    # cycle-harvesting job suspended (keyboard activity)
    "W": PENDING,      # waiting for its submitter-assigned start time
    "X": COMPLETED,    # subjob finished or deleted
}

#: pbs_node_attributes(7B) node states to ours; a node's ``state`` may combine several
#: ("down,offline"): any unusable one wins, then busy, then free.
PBS_NODE_STATES: dict[str, str] = {
    "free": NODE_FREE, "job-busy": NODE_BUSY, "job-exclusive": NODE_BUSY,
    "resv-exclusive": NODE_BUSY, "busy": NODE_BUSY, "offline": NODE_DOWN,
    "down": NODE_DOWN, "stale": NODE_DOWN, "state-unknown": NODE_DOWN,
    "unresolvable": NODE_DOWN, "provisioning": NODE_DOWN, "wait-provisioning": NODE_DOWN,
    "sleep": NODE_DOWN, "maintenance": NODE_DOWN, "initializing": NODE_DOWN,
}

JOB_EXEC_KILL_WALLTIME = -29
_CHUNK_RE = re.compile(r"\(([^)]*)\)")
_CTIME_FMT = "%a %b %d %H:%M:%S %Y"


def parse_walltime(text: Any) -> float | None:
    """``"HH:MM:SS"`` (or ``MM:SS``, or seconds) -> seconds."""
    if text is None:
        return None
    if isinstance(text, (int, float)):
        return float(text)
    parts = str(text).strip().split(":")
    try:
        v = 0.0
        for p in parts:
            v = v * 60 + float(p)
        return v
    except ValueError:
        return None


def _ctime(text: Any) -> float | None:
    """A qstat time ("Tue Oct  4 21:23:33 2022", printed with TZ=UTC) -> epoch."""
    if not text:
        return None
    if isinstance(text, (int, float)):
        return float(text)
    try:
        return float(calendar.timegm(time.strptime(" ".join(str(text).split()), _CTIME_FMT)))
    except ValueError:
        return None


def parse_exec_vnode(text: str, resource: str = "ncpus") -> tuple[tuple[str, int], ...]:
    """``(n1:ncpus=2:mem=4gb)+(n2[0]:ncpus=2:ngpus=1)`` -> ``(("n1", 2), ("n2", 2))`` for
    ``resource``, per host (a vnode ``host[i]`` counts for ``host``), in order."""
    out: dict[str, int] = {}
    for chunk in _CHUNK_RE.findall(text or ""):
        fields = chunk.split(":")
        host = fields[0].split("[")[0]
        n = 0
        for f in fields[1:]:
            k, _, v = f.partition("=")
            if k == resource:
                try:
                    n += int(float(v))
                except ValueError:
                    pass
        out[host] = out.get(host, 0) + n
    return tuple(out.items())


_MONTHS = {m: i for i, m in enumerate(("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul",
                                       "Aug", "Sep", "Oct", "Nov", "Dec"), 1)}
_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")


def parse_est_start(text: str, now: float) -> float | None:
    """The ``Est Start Time`` column of ``qstat -T -w`` (qstat.c, ``convert_time``): ``Today
    13:34``, ``Wed 15:34`` (this week), ``Wed Feb 10 15:34`` (this year), ``Wed Feb 10 2027
    15:34``; ``--`` (unset or past) and ``?`` (cannot be estimated) give None. Times are
    the qstat's local time: the binding runs it with TZ=UTC, so ``now`` is epoch UTC."""
    t = text.split()
    if not t or t[0] in ("--", "?"):
        return None
    today = time.gmtime(now)
    try:
        hh, mm = (int(x) for x in t[-1].split(":"))
        if t[0] == "Today" and len(t) == 2:
            y, mo, d = today.tm_year, today.tm_mon, today.tm_mday
        elif len(t) == 2 and t[0] in _DAYS:
            ahead = (_DAYS.index(t[0]) - today.tm_wday) % 7 or 7
            day = time.gmtime(now + ahead * 86400)
            y, mo, d = day.tm_year, day.tm_mon, day.tm_mday
        elif len(t) == 4 and t[1] in _MONTHS:
            y, mo, d = today.tm_year, _MONTHS[t[1]], int(t[2])
        elif len(t) == 5 and t[1] in _MONTHS:
            y, mo, d = int(t[3]), _MONTHS[t[1]], int(t[2])
        else:
            return None
        return float(calendar.timegm((y, mo, d, hh, mm, 0, 0, 0, 0)))
    except (ValueError, IndexError):
        return None


class PBSBinding(Binding):
    """Pilots as PBS jobs; leases' work over ssh, attached to the pilot job.

    ``PBSBinding(queue="workq", ncpus=64, ngpus=4, dim="gpu")``. Options: ``queue``,
    ``account``; ``ncpus`` and ``ngpus`` per node (the select chunk); ``exclusive``
    (``place=scatter:excl``, default True); ``qsub_options``; ``pilot_output``;
    ``ssh_options``; ``attach`` (``pbs_attach``); and the
    :class:`~bursarcore.adapters.Binding` options.
    """

    name = "pbs"
    STATES = PBS_STATES
    NODE_STATE_TABLE = PBS_NODE_STATES

    def __init__(self, *, queue: str | None = None, account: str | None = None,
                 ncpus: int = 1, ngpus: int = 0, exclusive: bool = True,
                 qsub_options: Sequence[str] = (), pilot_output: str = "/dev/null",
                 ssh_options: Sequence[str] = ("-o", "BatchMode=yes"), attach: bool = True,
                 **kw: Any) -> None:
        super().__init__(**kw)
        if not isinstance(ncpus, int) or ncpus < 1:
            raise InvalidArgument("ncpus", "must be an integer >= 1", ncpus)
        if not isinstance(ngpus, int) or ngpus < 0:
            raise InvalidArgument("ngpus", "must be an integer >= 0", ngpus)
        if self.dim == "gpu" and ngpus < 1:
            raise InvalidArgument("ngpus", "must be >= 1 for a gpu binding", ngpus)
        self.queue, self.account = queue, account
        self.ncpus, self.ngpus, self.exclusive = ncpus, ngpus, exclusive
        self.qsub_options = list(qsub_options)
        self.pilot_output = pilot_output
        self.ssh_options = list(ssh_options)
        self.attach = attach
        self._cancelled: set[str] = set()

    @property
    def resource(self) -> str:
        return "ngpus" if self.dim == "gpu" else "ncpus"

    # ------------------------------------------------------------------ pilots
    SCRIPT = "#!/bin/sh\n# bursar pilot: holds the allocation; work arrives over ssh\nexec sleep 2147483647\n"

    def pilot_args(self, nodes: int, walltime: float, name: str | None = None) -> list[str]:
        secs = max(1, math.ceil(float(walltime)))
        wt = f"{secs // 3600:02d}:{secs % 3600 // 60:02d}:{secs % 60:02d}"
        sel = f"select={int(nodes)}:ncpus={self.ncpus}"
        if self.ngpus:
            sel += f":ngpus={self.ngpus}"
        a = ["-N", name or "bursar-pilot", "-r", "n", "-j", "oe", "-o", self.pilot_output,
             "-l", sel, "-l", "place=scatter:excl" if self.exclusive else "place=scatter",
             "-l", f"walltime={wt}"]
        if self.queue:
            a += ["-q", self.queue]
        if self.account:
            a += ["-A", self.account]
        return a + self.qsub_options

    def submit(self, nodes: int, walltime: float, *, name: str | None = None) -> str:
        cp = self.execute(["qsub", *self.pilot_args(nodes, walltime, name)], input=self.SCRIPT)
        job = cp.stdout.strip().splitlines()[-1].strip() if cp.stdout.strip() else ""
        if not job or not job.split(".")[0].isdigit():
            raise CommandError(["qsub"], 0, f"unexpected qsub output {cp.stdout!r}", cp.stdout)
        return job

    def cancel(self, ids: Sequence[str]) -> None:
        if ids:
            self._cancelled.update(str(i) for i in ids)
            self.execute(["qdel", *[str(i) for i in ids]])

    def _jobs(self, ids: Sequence[str]) -> dict[str, dict]:
        ids = sorted(str(i) for i in ids)

        def load() -> dict[str, dict]:
            argv = ["qstat", "-x", "-f", "-F", "json", *ids]
            try:
                out = self.execute(argv, env={"TZ": "UTC"}).stdout
            except CommandError as e:
                # "qstat: Unknown Job Id ..." for a purged job exits non-zero but still
                # prints the others; anything else is a real failure
                if "Unknown Job Id" not in e.stderr or not e.stdout.strip():
                    raise
                out = e.stdout
            try:
                doc = json.loads(out)
            except ValueError as err:
                raise CommandError(argv, 0, f"unparseable JSON: {err}", out) from None
            return dict(doc.get("Jobs") or {})
        # one key for every id set: a new pilot waits for the next interval to be seen
        return self.query("qstat", load)

    def status(self, ids: Sequence[str]) -> dict[str, PilotStatus]:
        if not ids:
            return {}
        jobs = self._jobs(ids)
        out = {}
        for i in ids:
            j = jobs.get(str(i))
            if j is None:   # the JSON may key a job by a longer id: match the number
                j = next((v for k, v in jobs.items() if k.split(".")[0] == str(i).split(".")[0]), None)
            if j is not None:
                out[str(i)] = self._status_of(str(i), j)
        return out

    def _status_of(self, jid: str, j: Mapping[str, Any]) -> PilotStatus:
        raw = str(j.get("job_state", ""))
        state = map_state(self.STATES, raw, scheduler=self.name)
        exit_status = j.get("Exit_status")
        reason = j.get("comment")
        code = None
        if exit_status is not None:
            es = int(exit_status)
            code = 128 + (es - 256) if es > 256 else es  # 256+N: killed by signal N
        if raw == "F":
            req = parse_walltime((j.get("Resource_List") or {}).get("walltime"))
            used = parse_walltime((j.get("resources_used") or {}).get("walltime"))
            if jid in self._cancelled:
                state = CANCELLED
            elif exit_status is not None and int(exit_status) == JOB_EXEC_KILL_WALLTIME:
                state, reason = TIMEOUT, "walltime"
            elif req and used is not None and used >= req:
                state, reason = TIMEOUT, "walltime"
            elif exit_status is None or int(exit_status) != 0:
                state = FAILED
        hosts: tuple[tuple[str, int], ...] = ()
        if state in (RUNNING, SUSPENDED, ENDING):
            hosts = parse_exec_vnode(str(j.get("exec_vnode", "")), self.resource)
        start = _ctime(j.get("stime"))
        wt = parse_walltime((j.get("Resource_List") or {}).get("walltime"))
        return PilotStatus(state=state, raw=raw, hosts=hosts,
                           start=start if state != PENDING else None,
                           end=start + wt if start is not None and wt and state == RUNNING else None,
                           exit_code=code if state in TERMINAL else None,
                           reason=reason)

    # ------------------------------------------------------------------ supply
    def _nodes(self) -> dict[str, dict]:
        def load() -> dict[str, dict]:
            out = self.execute(["pbsnodes", "-a", "-F", "json"]).stdout
            try:
                return dict(json.loads(out).get("nodes") or {})
            except ValueError as e:
                raise CommandError(["pbsnodes", "-a", "-F", "json"], 0,
                                   f"unparseable JSON: {e}", out) from None
        return self.query("pbsnodes", load)

    def node_state(self, n: Mapping[str, Any]) -> str:
        parts = [p.strip() for p in str(n.get("state", "")).split(",") if p.strip()]
        ours = [map_state(self.NODE_STATE_TABLE, p, scheduler=self.name, what="node")
                for p in parts] or [NODE_UNKNOWN]
        for s in (NODE_DOWN, NODE_UNKNOWN, NODE_BUSY):
            if s in ours:
                return s
        assigned = int((n.get("resources_assigned") or {}).get(self.resource) or 0)
        return NODE_PARTIAL if assigned else NODE_FREE

    def supply(self) -> SchedulerSupply:
        nodes = self._nodes()
        total = free = down = s_total = s_free = s_alloc = 0
        for n in nodes.values():
            if self.queue and n.get("queue") not in (None, self.queue):
                continue
            st = self.node_state(n)
            total += 1
            if st in (NODE_DOWN, NODE_UNKNOWN):
                down += 1
                continue
            cap = int((n.get("resources_available") or {}).get(self.resource) or 0)
            used = int((n.get("resources_assigned") or {}).get(self.resource) or 0)
            if st == NODE_BUSY and used == 0:
                used = cap   # job-exclusive without assigned counts: all of it
            s_total += cap
            s_alloc += min(cap, used)
            s_free += max(0, cap - used) if st != NODE_BUSY else 0
            free += st == NODE_FREE
        pend = 0
        try:
            queues = self.query("qstat-Q", lambda: json.loads(self.execute(
                ["qstat", "-Q", "-f", "-F", "json", *([self.queue] if self.queue else [])]
            ).stdout).get("Queue") or {})
        except (CommandError, ValueError) as e:
            log.warning("pbs: queue status unavailable: %s", e)
            queues = {}
        for q in queues.values():
            m = re.search(r"Queued:(\d+)", str(q.get("state_count", "")))
            pend += int(m.group(1)) if m else 0
        return SchedulerSupply(time=self.wallclock(), dim=self.dim, nodes_total=total,
                               nodes_free=free, nodes_down=down, slots_total=s_total,
                               slots_free=s_free, slots_allocated=s_alloc,
                               pending_jobs=pend, pending_slots=None)

    def expected_start(self, nodes: int, walltime: float,
                       pending: Sequence[str] = ()) -> float | None:
        """From ``qstat -T -w`` for our queued pilots (the scheduler's
        ``estimated.start_time``). PBS has no dry-run submission, so with no pilot queued
        the estimate is "now" when enough nodes are free, else unknown."""
        now = self.wallclock()
        if pending:
            ids = sorted(str(i) for i in pending)
            try:
                out = self.query("qstat-T", lambda: self.execute(
                    ["qstat", "-T", "-w", *ids], env={"TZ": "UTC"}).stdout)
            except CommandError as e:
                log.info("pbs: qstat -T failed: %s", e)
                out = ""
            times = []
            for line in out.splitlines():
                tok = line.split()
                if len(tok) < 11 or not tok[0][:1].isdigit():
                    continue
                if not any(i.startswith(tok[0]) or tok[0].startswith(i) for i in ids):
                    continue
                t = parse_est_start(" ".join(tok[10:]), now)
                if t is not None:
                    times.append(t)
            if times:
                return min(times)
        s = self.supply()
        return now if s.nodes_free >= nodes else None

    # ------------------------------------------------------------------ launch
    def _lease_env(self, env, lid, pilot_id, host, units):
        # the remote login sets the environment; send only the lease's own variables
        out = dict(env or {})
        for k, v in out.items():
            if not isinstance(k, str) or not isinstance(v, str) or not re.fullmatch(
                    r"[A-Za-z_][A-Za-z0-9_]*", k):
                raise InvalidArgument("env", "must map variable names to strings", (k, v))
        out.update(BURSAR_LEASE_ID=str(lid), BURSAR_SLOTS=str(units), BURSAR_PILOT=pilot_id,
                   BURSAR_HOST=host)
        return out

    def pidfile(self, pilot_id: str, lid: int, k: int) -> str:
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", pilot_id)
        return f"${{TMPDIR:-/tmp}}/bursar-{safe}-lease-{lid}.{k}.pid"

    def remote_command(self, pilot_id: str, lid: int, k: int, units: int, argv: list[str],
                       env: Mapping[str, str], per_slot: bool, cwd: str | None) -> str:
        """The shell command run on the host (through ssh)."""
        cmd = [*(["pbs_attach", "-j", pilot_id] if self.attach else []), *argv]
        if per_slot:
            cmd = ["/bin/sh", "-c", 'n=$1; shift; i=0; while [ "$i" -lt "$n" ]; do '
                   'BURSAR_SLOT=$i "$@" & i=$((i+1)); done; wait', "bursar-slots", str(units), *cmd]
        envs = [f"{k}={shlex.quote(v)}" for k, v in sorted(env.items())]
        pre = f"cd {shlex.quote(cwd)} && " if cwd else ""
        return (f"{pre}echo $$ > {self.pidfile(pilot_id, lid, k)} && exec env "
                + " ".join(envs + [shlex.quote(a) for a in cmd]))

    def _launch_part(self, lid, k, pilot_id, host, units, argv, env, per_slot, cwd):
        remote = self.remote_command(pilot_id, lid, k, units, argv, env, per_slot, cwd)
        full = ["ssh", *self.ssh_options, host, remote]
        out, err = self._outputs(lid, k)
        try:
            proc = self.spawn(full, env=dict(os.environ), stdout=out, stderr=err)
        finally:
            for f in (out, err):
                if hasattr(f, "close"):
                    f.close()
        h = ProcessHandle(proc, lid, pilot_id, host, units, full)
        h.k = k
        return h

    def _signal_part(self, handle, sig):
        if handle.poll() is not None:
            return
        name = _signal.Signals(sig).name.removeprefix("SIG")
        pf = self.pidfile(handle.pilot_id, handle.lease_id, getattr(handle, "k", 0))
        self.execute(["ssh", *self.ssh_options, handle.host,
                      f"kill -s {name} -- -$(cat {pf})"])
        if sig == _signal.SIGKILL:
            handle.send_group(_signal.SIGKILL)   # and the local ssh client
