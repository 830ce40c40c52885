"""Parsl execution provider on bursar leases: one Parsl block = one lease (SPEC §12).

Joining a pilot is a config change, not a rewrite::

    from bursarcore.adapters.parsl import BursarProvider
    provider = BursarProvider(
        campaign="my-campaign",
        base_url="https://bursar.example.gov",
        token=CAMPAIGN_TOKEN,               # campaign-scoped credential
        gpus_per_block=64, lease_duration=600, adaptive=True,
        init_blocks=1, min_blocks=0, max_blocks=3)
    config = Config(executors=[HighThroughputExecutor(provider=provider, ...)])

(``broker=`` instead of ``base_url=``/``token=`` uses an in-process broker.)

How Parsl's calls map onto the broker:

* ``submit`` never blocks the poller: it records a block in state PENDING and returns its
  id at once. A background thread files the intent, sized to what the broker quotes as
  grantable (``adaptive=True``: the largest grantable size up to ``gpus_per_block``, at
  least ``min_units``), and keeps the block PENDING while the intent waits in the queue or
  its lease is ``starting`` (reclaim path). A refused intent is filed again after its
  ``retry_after`` (or a backoff): the block stays PENDING, so Parsl's strategy does not
  over-submit.
* When the lease is ``active`` the block's workers are launched through the *launcher*
  (the facility binding's seam, :class:`WorkerLauncher`) on the lease's placement; the
  block is RUNNING.
* ``cancel`` (Parsl's scale-in, and cleanup) stops the workers and releases the lease
  (unused tokens and credits come back) or cancels the pending intent.
* An expired lease reports the block TIMEOUT, a revoked (or externally released) one
  CANCELLED — never FAILED, which would trip Parsl's error handler — after its workers
  are stopped, so Parsl's strategy negotiates a replacement. The broker's word is
  enforced: a revoking lease's workers are stopped at its revocation deadline.
* ``status`` answers from local state: one background refresh (two requests) per
  ``poll_period`` whatever Parsl polls.
* Leases of blocks Parsl has not scaled in are renewed ``renew_margin`` seconds before
  expiry, while the campaign's tokens and credits allow; a refused renewal lets the lease
  expire and the block end as TIMEOUT.

Tasks that were running on a block whose lease is revoked are lost with its workers; Parsl
re-runs them when the config asks for it (``Config(retries=...)``), on the replacement
block. ``submit``'s ``tasks_per_node`` is honoured: the block starts that many copies of
the worker command (per node, with ``LocalLauncher(per_node=True)`` or a facility binding),
wrapped by Parsl's own ``SingleNodeLauncher``; the block fails if any copy fails. A
block's status carries the paths of its workers' output (``stdout_path``/``stderr_path``,
which Parsl's error handler shows), when the launcher writes them to files.

``BursarProvider`` is defined in :mod:`bursarcore.adapters.parsl_provider`, the one module
that imports Parsl; ``import bursarcore.adapters.parsl`` does not need Parsl, and
``from bursarcore.adapters.parsl import BursarProvider`` loads it on first access. The
provider pickles as its configuration (``copy.deepcopy`` too): an unpickled copy has the
same settings and no blocks, threads or leases — those stay with the process that holds
them. A provider on ``broker=`` or ``client=`` does not pickle (an in-process broker and
an open HTTP client do not leave their process); give ``base_url=`` and ``token=``. The
pickle then holds the campaign token, like the config that made it.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Protocol, Sequence, runtime_checkable

from ..admission import Intent
from ..broker import Lease
from ..errors import BursarError, InvalidArgument, UnknownLease

__all__ = ["BursarProvider", "WorkerLauncher", "LocalLauncher", "LocalHandle", "BindingLauncher",
           "lease_env"]

if TYPE_CHECKING:
    # loaded on first access by the module's __getattr__ (below): it subclasses Parsl's
    # ExecutionProvider, and importing this module must not import Parsl
    from .parsl_provider import BursarProvider as BursarProvider

log = logging.getLogger("bursarcore.adapters.parsl")


# ---------------------------------------------------------------------------- launching
@runtime_checkable
class WorkerLauncher(Protocol):
    """The seam between the provider and a facility binding: start a block's worker
    command on a lease's placement, tell whether it still runs, stop it.

    ``start(block_id, command, lease, env) -> handle``; ``poll(handle) -> int | None``
    (an exit status once every process has ended, else None); ``stop(handle, grace)``
    (SIGTERM, then SIGKILL after ``grace`` seconds; must return within about ``grace``).
    A launcher may also have ``outputs(handle) -> (stdout_path, stderr_path)``: the files
    the block's output goes to (of the process that failed, if one did), for the block's
    status; without it, or with ``(None, None)``, the status names no files.
    """

    def start(self, block_id: str, command: str, lease: Lease,
              env: Mapping[str, str]) -> Any: ...

    def poll(self, handle: Any) -> int | None: ...

    def stop(self, handle: Any, grace: float) -> None: ...


def lease_env(lease: Lease, campaign: str) -> dict[str, str]:
    """What a worker learns about its lease, as environment variables."""
    return {"BURSAR_CAMPAIGN": campaign, "BURSAR_LEASE_ID": str(lease.id),
            "BURSAR_DIM": lease.dim, "BURSAR_UNITS": str(lease.units),
            "BURSAR_PLACEMENT": ",".join(f"{n}:{u}" for n, u in lease.placement),
            "BURSAR_SLOTS": ",".join(str(s) for s in lease.slots),
            "BURSAR_EXPIRY": "" if lease.expiry is None else repr(lease.expiry)}


class LocalHandle(list):
    """The processes of one block (a ``list`` of ``Popen``) and, in the same order, the
    ``(stdout, stderr)`` files each writes to."""

    def __init__(self, procs: Sequence[subprocess.Popen], paths: Sequence[tuple[str, str]]) -> None:
        super().__init__(procs)
        self.paths = list(paths)


class LocalLauncher:
    """Run the worker command as local processes (``bash -c``), one process group each.

    ``per_node=False`` (default) starts the command once per block; ``per_node=True`` once
    per node of the lease's placement, with ``BURSAR_NODE`` and ``BURSAR_NODE_UNITS`` set
    (the shape a multi-node binding has, here all on this machine). Output goes to
    ``<script_dir>/<block>.{out,err}``.
    """

    def __init__(self, script_dir: str | None = None, per_node: bool = False) -> None:
        self.script_dir = script_dir
        self.per_node = per_node

    def _dir(self) -> str:
        if self.script_dir is None:
            self.script_dir = tempfile.mkdtemp(prefix="bursar-parsl-")
        os.makedirs(self.script_dir, exist_ok=True)
        return self.script_dir

    def start(self, block_id: str, command: str, lease: Lease,
              env: Mapping[str, str]) -> LocalHandle:
        d = self._dir()
        nodes = list(lease.placement) if self.per_node and lease.placement else [("", lease.units)]
        procs, paths = [], []
        for i, (node, units) in enumerate(nodes):
            e = {**os.environ, **env}
            if node:
                e["BURSAR_NODE"], e["BURSAR_NODE_UNITS"] = node, str(units)
            suffix = f".{i}" if len(nodes) > 1 else ""
            files = (os.path.join(d, f"{block_id}{suffix}.out"),
                     os.path.join(d, f"{block_id}{suffix}.err"))
            out, err = open(files[0], "ab"), open(files[1], "ab")
            try:
                procs.append(subprocess.Popen(["/bin/bash", "-c", command], env=e, stdout=out,
                                              stderr=err, stdin=subprocess.DEVNULL,
                                              start_new_session=True))
                paths.append(files)
            finally:
                out.close()
                err.close()
        return LocalHandle(procs, paths)

    def outputs(self, handle: LocalHandle) -> tuple[str | None, str | None]:
        """The files of the first process that exited non-zero, else of the first."""
        if not handle.paths:
            return None, None
        codes = [p.poll() for p in handle]
        i = next((k for k, c in enumerate(codes) if c not in (None, 0)), 0)
        return handle.paths[i]

    def poll(self, handle: list[subprocess.Popen]) -> int | None:
        codes = [p.poll() for p in handle]
        if any(c is None for c in codes):
            return None
        return next((c for c in codes if c != 0), 0)

    def stop(self, handle: list[subprocess.Popen], grace: float = 5.0) -> None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for p in handle:
                if p.poll() is None:
                    try:
                        os.killpg(p.pid, sig)
                    except (ProcessLookupError, PermissionError):
                        pass
            end = time.monotonic() + (grace if sig == signal.SIGTERM else 2.0)
            for p in handle:
                try:
                    p.wait(timeout=max(0.0, end - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
            if all(p.poll() is not None for p in handle):
                return


class BindingLauncher:
    """Workers through a facility binding (:class:`bursarcore.adapters.Binding`): the
    block's command runs on exactly the hosts of the lease's placement, inside the pilot
    allocations they belong to (``binding.launch``); stopping it is the binding's own
    revocation — the notice signal now, a kill at ``grace`` (``binding.revoke`` /
    ``binding.kill``)."""

    def __init__(self, binding: Any) -> None:
        self.binding = binding

    def start(self, block_id: str, command: str, lease: Lease, env: Mapping[str, str]) -> Any:
        return self.binding.launch(lease, ["/bin/bash", "-c", command], env=dict(env))

    def poll(self, handle: Any) -> int | None:
        return handle.exit_code

    def outputs(self, handle: Any) -> tuple[str | None, str | None]:
        """The binding's ``log_dir/lease-<id>.<k>.{out,err}`` of the first part that exited
        non-zero, else of part 0; none if the binding discards output (no ``log_dir``)."""
        log_dir = getattr(self.binding, "log_dir", None)
        parts = list(getattr(handle, "parts", ()))
        if log_dir is None or not parts:
            return None, None
        k = next((i for i, p in enumerate(parts) if p.poll() not in (None, 0)), 0)
        base = os.path.join(log_dir, f"lease-{handle.lease_id}.{k}")
        return base + ".out", base + ".err"

    def stop(self, handle: Any, grace: float) -> None:
        if handle.exit_code is not None:
            return
        self.binding.revoke(handle.lease_id, self.binding.now() + grace)
        if handle.wait(grace) is None:
            self.binding.kill(handle.lease_id)
            handle.wait(2.0)


def _launcher_of(obj: Any, script_dir: str | None) -> WorkerLauncher:
    if obj is None:
        return LocalLauncher(script_dir)
    if isinstance(obj, WorkerLauncher):
        return obj
    if all(callable(getattr(obj, m, None)) for m in ("launch", "revoke", "kill", "now")):
        return BindingLauncher(obj)          # a facility binding (bursarcore.adapters)
    raise InvalidArgument("launcher", "must be a WorkerLauncher (start, poll, stop) or a "
                          "facility binding (launch, revoke, kill)", type(obj).__name__)


# ---------------------------------------------------------------------------- blocks
NEW, WAITING, RUNNING, ENDED = "new", "waiting", "running", "ended"


@dataclass
class _Block:
    job_id: str
    command: str
    state: str = NEW
    intent_id: int | None = None
    lease: Lease | None = None
    handle: Any = None
    cancelled: bool = False
    released: bool = False
    attempts: int = 0
    next_try: float = 0.0            # monotonic time the intent may be filed (again)
    next_renew: float = 0.0
    final: tuple[str, str | None, int | None] | None = None   # (state name, message, exit)
    leases: list[int] = field(default_factory=list)
    outputs: tuple[str | None, str | None] = (None, None)       # the workers' stdout, stderr


class _Provider:
    """The provider's logic, independent of Parsl (the Parsl class mixes it in)."""

    def __init__(self, campaign: str, *, base_url: str | None = None, broker: Any = None,
                 token: str | None = None, client: Any = None, gpus_per_block: int = 1,
                 dim: str | None = None, lease_duration: float = 600.0, adaptive: bool = True,
                 min_units: int | None = None, init_blocks: int = 1, min_blocks: int = 0,
                 max_blocks: int = 1, parallelism: float = 1.0, nodes_per_block: int = 1,
                 service_class: str | None = None, max_spend: float | None = None,
                 launcher: Any = None, binding: Any = None, worker_init: str = "",
                 poll_period: float | None = None, renew_margin: float | None = None,
                 stop_grace: float = 5.0, label: str = "bursar",
                 cores_per_node: int | None = None, mem_per_node: float | None = None,
                 status_polling_interval: float = 1.0, background: bool = True) -> None:
        # the arguments as given, before any is resolved (base_url= becomes a client
        # below): pickling rebuilds the provider from them (__reduce__)
        self._init_args = {k: v for k, v in locals().items() if k not in ("self", "__class__")}
        if not isinstance(campaign, str) or not campaign:
            raise InvalidArgument("campaign", "must be a non-empty string", campaign)
        sources = sum(x is not None for x in (base_url, broker, client))
        if sources != 1:
            raise InvalidArgument("base_url", "give exactly one of base_url= (with token=), "
                                  "broker= or client=")
        if base_url is not None:
            if not token:
                raise InvalidArgument("token", "base_url= needs the campaign's token")
            from ..client import BursarClient
            # few client-level retries: the provider's own loop retries on its schedule
            client = BursarClient(base_url, token, campaign=campaign, retries=1, timeout=10.0,
                                  max_wait=10.0)
        if broker is not None:
            from ..service.locked import LockedBroker
            self.api: Any = broker if isinstance(broker, LockedBroker) else LockedBroker(broker)
            self._remote = False
        else:
            self.api = client
            self._remote = True
        # a lease or intent id is reached through its campaign's URL: the client is told
        # the campaign on every such call (its own default is the token's node, which for
        # a token of an ancestor node is not this campaign); the broker needs no campaign
        self._by_id: dict[str, Any] = {"campaign": campaign} if self._remote else {}
        for name, v, lo in (("gpus_per_block", gpus_per_block, 1), ("init_blocks", init_blocks, 0),
                            ("min_blocks", min_blocks, 0), ("max_blocks", max_blocks, 0),
                            ("nodes_per_block", nodes_per_block, 1)):
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise InvalidArgument(name, f"must be an integer >= {lo}", v)
        if not isinstance(lease_duration, (int, float)) or not 0 < lease_duration < math.inf:
            raise InvalidArgument("lease_duration", "must be a number of seconds > 0",
                                  lease_duration)
        if min_blocks > max_blocks:
            raise InvalidArgument("min_blocks", f"must be <= max_blocks ({max_blocks})", min_blocks)
        self.campaign = campaign
        self.gpus_per_block = gpus_per_block
        self.dim = dim
        self.lease_duration = float(lease_duration)
        self.adaptive = bool(adaptive)
        self.min_units = (1 if adaptive else gpus_per_block) if min_units is None else int(min_units)
        if not 0 <= self.min_units <= gpus_per_block:
            raise InvalidArgument("min_units", "must be in [0, gpus_per_block]", min_units)
        self.init_blocks, self.min_blocks, self.max_blocks = init_blocks, min_blocks, max_blocks
        self.parallelism = float(parallelism)
        self.nodes_per_block = nodes_per_block
        self.service_class = service_class
        self.max_spend = max_spend
        self.worker_init = worker_init
        self.script_dir: str | None = None
        self.resources: dict[object, Any] = {}   # (as Parsl's ExecutionProvider types it)
        self.cores_per_node = cores_per_node
        self.mem_per_node = mem_per_node
        self._label = label
        self._status_interval = status_polling_interval
        self.poll_period = float(poll_period if poll_period is not None
                                 else (1.0 if self._remote else 0.25))
        self.renew_margin = float(renew_margin if renew_margin is not None
                                  else max(3 * self.poll_period, 0.25 * self.lease_duration))
        self.stop_grace = float(stop_grace)
        self._launcher_arg = launcher if launcher is not None else binding
        self._launcher: WorkerLauncher | None = None
        if self._launcher_arg is not None:
            self._launcher = _launcher_of(self._launcher_arg, None)
        self._blocks: dict[str, _Block] = {}
        self._ids = itertools.count()
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.background = background      # False: the caller drives refresh() (tests)
        self.stats = {"intents": 0, "granted": 0, "pending": 0, "refused": 0, "renewed": 0,
                      "renew_refused": 0, "released": 0, "revoked": 0, "expired": 0,
                      "launched": 0, "refreshes": 0}

    def __repr__(self) -> str:  # never the token
        src = "remote" if self._remote else "in-process"
        return (f"BursarProvider(campaign={self.campaign!r}, {src}, gpus_per_block="
                f"{self.gpus_per_block}, lease_duration={self.lease_duration}, "
                f"adaptive={self.adaptive}, init_blocks={self.init_blocks}, "
                f"min_blocks={self.min_blocks}, max_blocks={self.max_blocks})")

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle as the configuration (see the module docstring): the copy is
        ``type(self)(campaign, **arguments)``, with no blocks."""
        kw = dict(self._init_args)
        for name in ("broker", "client"):
            if kw[name] is not None:
                raise TypeError(f"BursarProvider({name}=...) cannot be pickled: an in-process "
                                f"broker or an open client does not leave its process; give "
                                f"base_url= and token= instead")
        return _restore, (type(self), kw.pop("campaign"), kw)

    @property
    def label(self) -> str:
        return self._label

    @property
    def status_polling_interval(self) -> float:
        return self._status_interval

    @property
    def launcher(self) -> WorkerLauncher:
        if self._launcher is None:
            d = os.path.join(self.script_dir, "bursar") if self.script_dir else None
            self._launcher = _launcher_of(self._launcher_arg, d)
        return self._launcher

    # ------------------------------------------------------------------ Parsl's interface
    def submit(self, command: str, tasks_per_node: int = 1,
               job_name: str = "parsl.auto") -> str:
        """Record a PENDING block and return its id at once; the background thread files
        its intent. ``tasks_per_node`` copies of ``command`` run on the block (per node,
        when the launcher starts one per node), after ``worker_init``; a bad
        ``tasks_per_node`` raises :class:`InvalidArgument` and records nothing."""
        if isinstance(tasks_per_node, bool) or not isinstance(tasks_per_node, int) \
                or tasks_per_node < 1:
            raise InvalidArgument("tasks_per_node", "must be an integer >= 1", tasks_per_node)
        if tasks_per_node > 1:
            # Parsl's own wrapper (what its cluster providers run): N copies in the
            # background, wait for all; fail_on_any so one failed copy fails the block
            from parsl.launchers import SingleNodeLauncher

            command = SingleNodeLauncher(debug=False, fail_on_any=True)(command, tasks_per_node, 1)
        job_id = f"{self._label}-{next(self._ids)}"
        cmd = f"{self.worker_init}\n{command}" if self.worker_init else command
        with self._lock:
            self._blocks[job_id] = _Block(job_id, cmd)
            self.resources[job_id] = {"job_id": job_id, "job_name": job_name}
        self._ensure_thread()
        self._wake.set()
        return job_id

    def status(self, job_ids: Sequence[Any]) -> list[Any]:
        """From local state only."""
        from parsl.jobs.states import JobState, JobStatus

        out = []
        with self._lock:
            for jid in job_ids:
                b = self._blocks.get(jid)
                if b is None:
                    out.append(JobStatus(JobState.UNKNOWN, "not a block of this provider"))
                elif b.final is not None:
                    name, msg, code = b.final
                    out.append(JobStatus(JobState[name], msg, exit_code=code,
                                         stdout_path=b.outputs[0], stderr_path=b.outputs[1]))
                elif b.state == RUNNING:
                    out.append(JobStatus(JobState.RUNNING, f"lease {b.lease.id}"
                                         if b.lease else None, stdout_path=b.outputs[0],
                                         stderr_path=b.outputs[1]))
                else:
                    out.append(JobStatus(JobState.PENDING, self._pending_message(b)))
        return out

    def cancel(self, job_ids: Sequence[Any]) -> list[bool]:
        """Scale in: stop the workers, release the lease or cancel the pending intent."""
        done = []
        todo = []
        with self._lock:
            for jid in job_ids:
                b = self._blocks.get(jid)
                if b is None:
                    done.append(False)
                    continue
                done.append(True)
                if b.cancelled:
                    continue
                b.cancelled = True
                if b.final is None:
                    b.final = ("CANCELLED", "scaled in", None)
                todo.append((b, b.handle, b.lease, b.intent_id if b.state == WAITING else None))
                b.handle = None
        for b, handle, lease, iid in todo:
            if handle is not None:
                self._stop_workers(handle)
            self._settle(b, lease, iid)
        self._wake.set()
        return done

    # ------------------------------------------------------------------ lifecycle
    def close(self, timeout: float = 10.0) -> None:
        """Cancel every block (releasing its lease) and stop the background thread."""
        with self._lock:
            live = [jid for jid, b in self._blocks.items() if not b.cancelled]
        self.cancel(live)
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if self._remote and hasattr(self.api, "close") and not (
                self._thread is not None and self._thread.is_alive()):
            self.api.close()

    def _ensure_thread(self) -> None:
        if not self.background:
            return
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name=f"bursar-{self._label}",
                                            daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.refresh()
            except Exception:  # noqa: BLE001 - the poller thread must survive anything
                log.exception("bursar provider refresh")
            self._wake.wait(self.poll_period)
            self._wake.clear()

    # ------------------------------------------------------------------ the broker's side
    def _now(self) -> float:
        return self.api.now() if self._remote else self.api.clock.now()

    def _pending_message(self, b: _Block) -> str:
        if b.lease is not None:
            return f"lease {b.lease.id} {b.lease.state}"
        if b.intent_id is not None:
            return f"intent {b.intent_id} pending"
        return "waiting to file an intent" if b.attempts == 0 else "intent refused; will retry"

    def _size(self) -> tuple[int, int]:
        """(min, max) units: the largest size the broker quotes as grantable, up to
        ``gpus_per_block`` (adaptive), else exactly ``gpus_per_block``."""
        if not self.adaptive:
            return self.min_units, self.gpus_per_block
        n = self.gpus_per_block
        sizes = sorted({max(1, self.min_units), n} | ({*range(1, n + 1)} if n <= 64 else
                                                       {1 << k for k in range(n.bit_length())}))
        sizes = [s for s in sizes if 1 <= s <= n]
        try:
            q = self.api.quote(self.campaign, sizes, [self.lease_duration], dim=self.dim,
                               service_class=self.service_class)
        except BursarError as e:
            log.debug("quote failed (%s); asking for %d", e, n)
            return self.min_units, n
        ok = [int(s) for s, g in zip(q.sizes, q.grantable[:, 0]) if g]
        best = max(ok) if ok else n
        return min(self.min_units, best), best

    def _file(self, b: _Block) -> None:
        """File the block's intent (background thread, outside the block lock)."""
        self.stats["intents"] += 1
        try:
            dim = self.dim or self._default_dim()
            lo, hi = self._size()
            intent = Intent(self.campaign, units={dim: (lo, hi)}, duration=self.lease_duration,
                            max_spend=self.max_spend, service_class=self.service_class)
            d = self.api.acquire(intent)
        except InvalidArgument as e:
            with self._lock:
                b.final = ("FAILED", f"the broker rejects the block's intent: {e}", None)
                b.state = ENDED
            return
        except BursarError as e:
            self._retry_later(b, None, f"{type(e).__name__}: {e}")
            return
        with self._lock:
            b.attempts += 1
            if d.outcome == "granted":
                self.stats["granted"] += 1
                b.lease, b.intent_id, b.state = d.lease, d.intent_id, WAITING
                b.leases.append(d.lease.id)
            elif d.outcome == "pending":
                self.stats["pending"] += 1
                b.intent_id, b.state = d.intent_id, WAITING
            else:
                self.stats["refused"] += 1
                if d.reason in ("invalid", "unknown_campaign"):
                    b.final = ("FAILED", f"intent refused: {d.reason}", None)
                    b.state = ENDED
                    return
        if d.outcome == "refused":
            self._retry_later(b, d.retry_after, d.reason)
        elif b.cancelled:
            self._settle(b, d.lease, d.intent_id if d.outcome == "pending" else None)

    def _default_dim(self) -> str:
        if self._remote:
            self.dim = next(iter(self.api.supply(self.campaign).dims))
        else:
            self.dim = self.api.broker.dims[0]
        return self.dim

    def _retry_later(self, b: _Block, retry_after: float | None, why: Any) -> None:
        wait = min(60.0, max(self.poll_period, 0.5 * 2 ** min(b.attempts, 6)))
        if retry_after is not None and math.isfinite(retry_after):
            wait = min(60.0, max(self.poll_period, retry_after))
        with self._lock:
            b.state, b.intent_id, b.lease = NEW, None, None
            b.next_try = time.monotonic() + wait
        log.debug("block %s: intent refused (%s); again in %.1f s", b.job_id, why, wait)

    def _settle(self, b: _Block, lease: Lease | None, intent_id: int | None) -> None:
        """A cancelled block gives back what it holds (once: Parsl's thread and the
        refresh thread may both get here)."""
        with self._lock:
            release = lease is not None and not b.released
            if release:
                b.released = True
        try:
            if release and lease is not None:     # (release implies a lease)
                self.api.release(lease.id, **self._by_id)
                self.stats["released"] += 1
            if intent_id is not None:
                self.api.cancel(intent_id, **self._by_id)
        except BursarError as e:
            log.warning("block %s: could not give back lease/intent: %s", b.job_id, e)
            if release:
                with self._lock:
                    b.released = False          # the refresh thread tries again

    def _outputs(self, handle: Any) -> tuple[str | None, str | None]:
        get = getattr(self.launcher, "outputs", None)
        if get is None:
            return None, None
        try:
            out, err = get(handle)
        except Exception:  # noqa: BLE001 - a status without paths, not a failed block
            log.exception("reading the workers' output paths")
            return None, None
        return (None if out is None else str(out)), (None if err is None else str(err))

    def _stop_workers(self, handle: Any) -> None:
        try:
            self.launcher.stop(handle, self.stop_grace)
        except Exception:  # noqa: BLE001
            log.exception("stopping workers")

    def refresh(self) -> None:
        """One pass: file due intents, read the campaign's leases and pending intents once,
        and move every block along (launch, renew, tear down)."""
        now = time.monotonic()
        with self._lock:
            blocks = [b for b in self._blocks.values() if b.final is None or
                      (b.cancelled and b.lease is not None and not b.released)]
        if not blocks:
            return
        for b in blocks:
            if b.state == NEW and not b.cancelled and b.final is None and b.next_try <= now:
                self._file(b)
        watching = [b for b in blocks if b.state in (WAITING, RUNNING)]
        if not watching:
            return
        try:
            live = {l.id: l for l in self.api.leases(self.campaign)}
            pend = {p["intent_id"] for p in self.api.pending(self.campaign)}
        except BursarError as e:
            log.warning("bursar provider: cannot read leases: %s", e)
            return
        self.stats["refreshes"] += 1
        by_intent = {l.intent: l for l in live.values()}
        tnow = self._now()
        for b in watching:
            if b.cancelled:
                lease = by_intent.get(b.intent_id) if b.intent_id is not None else None
                if lease is not None and not b.released:
                    self._settle(b, lease, None)
                continue
            if b.state == WAITING:
                self._advance_waiting(b, live, by_intent, pend)
            if b.state == RUNNING:
                self._advance_running(b, live, tnow)

    def _advance_waiting(self, b: _Block, live: dict, by_intent: dict, pend: set) -> None:
        lease = live.get(b.lease.id) if b.lease is not None else by_intent.get(b.intent_id)
        if lease is None:
            if b.lease is None and b.intent_id in pend:
                return                                   # still queued
            # the intent left the queue unanswered (TTL, deadline) or its lease ended first
            self._retry_later(b, None, "intent or lease ended before the block started")
            return
        if lease.id not in b.leases:
            b.leases.append(lease.id)
            self.stats["granted"] += 1
        b.lease = lease
        if lease.state != "active":
            return                                       # starting: reclaim path
        env = lease_env(lease, self.campaign)
        if self.cores_per_node is not None:
            env["PARSL_CORES"] = str(self.cores_per_node)
        if self.mem_per_node is not None:
            env["PARSL_MEMORY_GB"] = str(self.mem_per_node)
        try:
            handle = self.launcher.start(b.job_id, b.command, lease, env)
        except Exception as e:  # noqa: BLE001 - a launch failure is the block's failure
            log.exception("block %s: launch failed", b.job_id)
            self._settle(b, lease, None)
            with self._lock:
                b.final, b.state = ("FAILED", f"launch failed: {e}", None), ENDED
            return
        self.stats["launched"] += 1
        outputs = self._outputs(handle)
        with self._lock:
            b.outputs = outputs
            if b.cancelled:
                cancelled = True
            else:
                cancelled = False
                b.handle, b.state = handle, RUNNING
                b.next_renew = 0.0
        if cancelled:
            self._stop_workers(handle)
            self._settle(b, lease, None)

    def _advance_running(self, b: _Block, live: dict, tnow: float) -> None:
        assert b.lease is not None            # a running block holds its lease
        lease = live.get(b.lease.id)
        if lease is None:
            self._ended(b, tnow=tnow)
            return
        b.lease = lease
        if lease.state == "revoking" and lease.revoke_at is not None and tnow >= lease.revoke_at:
            self._ended(b, enforce=True)
            return
        code = self.launcher.poll(b.handle) if b.handle is not None else None
        if code is not None:
            # the workers ended by themselves: nothing uses the lease any more
            outputs = self._outputs(b.handle)      # now: of the process that failed
            self._settle(b, lease, None)
            with self._lock:
                b.outputs = outputs
                b.handle, b.state = None, ENDED
                b.final = ("COMPLETED", "workers exited", 0) if code == 0 else \
                    ("FAILED", f"workers exited with status {code}", code)
            return
        if lease.state == "active" and lease.expiry is not None \
                and lease.expiry - tnow <= self.renew_margin \
                and time.monotonic() >= b.next_renew:
            try:
                d = self.api.renew(lease.id, self.lease_duration, self.max_spend,
                                   **self._by_id)
            except BursarError as e:
                log.warning("block %s: renewal failed: %s", b.job_id, e)
                b.next_renew = time.monotonic() + max(self.poll_period, 1.0)
                return
            if d.outcome == "granted":
                self.stats["renewed"] += 1
                b.lease = d.lease
            else:
                self.stats["renew_refused"] += 1
                wait = d.retry_after if d.retry_after is not None else 5.0
                b.next_renew = time.monotonic() + min(max(self.poll_period, wait), 30.0)

    def _ended(self, b: _Block, enforce: bool = False, tnow: float | None = None) -> None:
        """The lease is gone (or past its revocation deadline): stop the workers and
        report the block ended, not failed."""
        assert b.lease is not None            # only a block that ran ends
        with self._lock:
            handle, b.handle = b.handle, None
        if handle is not None:
            self._stop_workers(handle)
        state = "revoked" if enforce else None
        if state is None:
            try:
                state = self.api.lease(b.lease.id, **self._by_id).state
            except UnknownLease:
                state = _gone(b.lease, self._now() if tnow is None else tnow)
            except BursarError:
                state = "ended"
        if state == "expired":
            self.stats["expired"] += 1
            final = ("TIMEOUT", f"lease {b.lease.id} expired", None)
        else:
            if state in ("revoked", "revoking"):
                self.stats["revoked"] += 1
            final = ("CANCELLED", f"lease {b.lease.id} {state}", None)
        with self._lock:
            b.state, b.final = ENDED, final
        log.info("block %s ended: %s", b.job_id, final[1])


def _gone(last: Lease, now: float) -> str:
    """How a lease ended whose record the broker no longer keeps (its row was reused after
    ``reuse_after`` later leases ended, docs/policy.md "Memory"), from the provider's last
    snapshot of it: ``expired`` if its expiry has passed and no earlier revocation deadline
    was announced, ``revoked`` if one was, else ``ended`` (released by someone else, or
    revoked without the provider seeing the notice)."""
    exp, rev = last.expiry, last.revoke_at
    if last.state == "revoking" and rev is not None and (exp is None or rev < exp):
        return "revoked" if now >= rev else "ended"
    if exp is not None and now >= exp:
        return "expired"
    return "ended"


def _restore(cls: type, campaign: str, kwargs: dict[str, Any]) -> Any:
    """Unpickle a provider: a new one from the same arguments (``_Provider.__reduce__``)."""
    return cls(campaign, **kwargs)


def __getattr__(name: str) -> Any:
    """``BursarProvider`` is loaded (and Parsl imported) on first access (PEP 562)."""
    if name == "BursarProvider":
        from .parsl_provider import BursarProvider

        return BursarProvider
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | {"BursarProvider"})
