"""``bursar demo``: one simulated hour of a 512-GPU pool under an adversarial storm.

A scripted scenario on the real broker with a manual clock (no sleeping, seeded):

* ``storm`` (agent-burst) demands its 384-GPU ceiling every second; sustained 64 GPUs,
  a 25,000 GPU-second burst bucket;
* ``interactive`` has a 32-GPU guarantee and, at random moments, asks for 8–32 GPUs
  within what is left of it;
* ``backfill`` (opportunistic) fills idle GPUs but leaves 160 free, and is preempted
  with a 60 s grace when a guaranteed request needs its GPUs.

It prints what an operator wants to see: the storm's average hold against its sustained
rate and ceiling, the interactive p95 grant latency, utilisation, and tokens extracted
against the bucket (SPEC §4.2: extraction above sustained ≤ B + refill).

The pool comes from a facility binding, as in a deployment (SPEC §12): the broker starts
empty; eight pilots of the local binding (8 nodes × 8 GPUs each) are provisioned by a
:class:`~bursarcore.adapters.PoolManager` and join it with ``add_nodes``; leases are placed
on their hosts and slots; every lease's work is launched through the binding — simulated
during the hour (no process; it runs on the manual clock) — and revocations and expiries
are enforced through it. After the hour, with ``processes=True`` (the default), the binding
switches to real processes: one lease runs ``python -c ...`` on its slots with the lease's
environment, and a second lease's process, which ignores SIGTERM, is on a pilot that the
manager drains with a 30 s notice: it gets SIGTERM at once and SIGKILL when the grace has
run out (30 s on the manual clock; real time, well under a second).
"""

from __future__ import annotations

import math
import os
import signal as _sig
import sys
import tempfile
import time
from dataclasses import dataclass, field

import numpy as np

from .adapters import LocalBinding, PoolManager
from .adapters.base import LeaseHandle
from .admission.envelope import Envelope, Intent, Pool
from .broker import Broker
from .clock import ManualClock
from .errors import InvalidArgument
from .journal import MemoryJournal, export_jsonl

__all__ = ["run_demo", "format_demo", "DemoResult"]


@dataclass
class DemoResult:
    seconds: int
    backend: str
    storm_avg_hold: float
    storm_sustained: int
    storm_ceiling: int
    storm_extracted_above_sustained: float
    storm_bucket: float
    storm_refilled: float
    interactive_p50: float
    interactive_p95: float
    interactive_requests: int
    interactive_refused_for_capacity: int
    utilisation: float
    utilisation_no_backfill: float
    decisions: int
    wall_seconds: float
    pilots: int = 0                 # pilots of the local binding that made the pool
    pool_nodes: int = 0
    work_launched: int = 0          # leases whose (simulated) work the binding launched
    work_signalled: int = 0         # ... that got the notice signal (revoked or expired)
    work_killed: int = 0            # ... killed by enforcement after their grace
    processes: list = field(default_factory=list)   # the real processes, after the hour

PILOTS, NODES_PER_PILOT, GPUS_PER_NODE = 8, 8, 8

# the real processes of the epilogue: one that reports where it runs, one that ignores
# the notice signal (it must be killed after the grace)
_HELLO = ("import os; e = os.environ; print('lease', e['BURSAR_LEASE_ID'], 'pilot', "
          "e['BURSAR_PILOT'], 'host', e['BURSAR_HOST'], 'slots', e['BURSAR_SLOTS'], "
          "'demo', e['BURSAR_DEMO'])")
_STUBBORN = ("import signal, time\n"
             "def term(sig, frame):\n"
             "    print('got SIGTERM: checkpointed, carrying on', flush=True)\n"
             "signal.signal(signal.SIGTERM, term)\n"
             "print('ready', flush=True)\n"
             "while True:\n"
             "    time.sleep(0.02)\n")


def _check_args(seconds: object, seed: object, journal_path: str | None) -> None:
    """The demo's arguments, checked before it starts (it writes its journal at the end)."""
    from .sim.paths import check_output_file
    from .sim.scenario import MAX_SEED, MAX_SIM_SECONDS

    for name, v, lo, hi in (("seconds", seconds, 1, MAX_SIM_SECONDS), ("seed", seed, 0, MAX_SEED)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise InvalidArgument(name, "must be an integer", v)
        if not lo <= v <= hi:
            raise InvalidArgument(name, f"must be in [{lo}, {int(hi)}]", v)
    if journal_path is not None:
        check_output_file(journal_path, "journal")


def run_demo(seconds: int = 3600, seed: int = 7, backend: str | None = None,
             journal_path: str | None = None, processes: bool = True) -> DemoResult:
    _check_args(seconds, seed, journal_path)
    wall = time.perf_counter()
    rng = np.random.default_rng(seed)
    clock = ManualClock(0.0)
    journal = MemoryJournal() if journal_path else None
    # the pool: empty until the facility's pilots join it
    b = Broker(Pool(gpu=0), clock=clock, backend=backend, journal=journal)
    binding = LocalBinding(dim="gpu", slots_per_node=GPUS_PER_NODE,
                           total_slots=PILOTS * NODES_PER_PILOT * GPUS_PER_NODE,
                           execution="simulated", clock=clock, wallclock=clock.now,
                           min_interval=0.0)
    pool = PoolManager(b, binding, nodes_per_pilot=NODES_PER_PILOT, walltime=seconds + 3600.0,
                       min_pilots=PILOTS, max_pilots=PILOTS, max_in_flight=PILOTS,
                       submit_burst=float(PILOTS), state_every=600.0)
    pool.tick()                       # submits the pilots (the queue wait is 0 here)
    pool.tick()                       # they run: their nodes join the pool
    work: dict[int, LeaseHandle] = {}

    def launch(lease) -> None:        # the lease's work, on its placement (simulated)
        if lease.state == "active" and lease.id not in work:
            work[lease.id] = pool.launch(lease, ["demo-work", lease.campaign])

    b.register("storm", Envelope(credits=50_000, service_class="agent-burst",
                                 guaranteed={"gpu": 0}, sustained={"gpu": 64},
                                 ceiling={"gpu": 384}, burst={"gpu": 25_000}))
    b.register("interactive", Envelope(credits=5_000, service_class="interactive",
                                       guaranteed={"gpu": 32}, sustained={"gpu": 32},
                                       ceiling={"gpu": 64}, burst={"gpu": 60_000}))
    b.register("backfill", Envelope(credits=math.inf, service_class="opportunistic",
                                    sustained={"gpu": 512}, ceiling={"gpu": 512},
                                    burst={"gpu": math.inf}))
    decisions = 0
    waiting: dict[int, float] = {}           # interactive intent -> request time
    starting: dict[int, float] = {}          # interactive lease -> request time
    latencies: list[float] = []
    refused_cap = 0
    storm_held, occupied, occupied_firm = [], [], []
    for now in range(seconds):
        # interactive: a request about every 20 s, within what is left of its guarantee
        want = int(rng.integers(8, 33)) if rng.random() < 0.05 else 0
        n = min(want, 32 - b.supply("interactive").dims["gpu"].held)
        if n >= 1:
            d = b.acquire(Intent("interactive", units={"gpu": n},
                                 duration=float(rng.integers(30, 121))))
            decisions += 1
            if d.granted:
                assert d.lease is not None        # a grant carries its lease
                launch(d.lease)
                if d.lease.state == "active":
                    latencies.append(0.0)
                else:
                    starting[d.lease.id] = float(now)
            elif d.outcome == "pending":
                waiting[d.intent_id] = float(now)
            elif d.reason == "capacity":
                refused_cap += 1
        # storm: demand the ceiling, every second, with short-lived intents
        sup = b.supply("storm").dims["gpu"]
        if sup.held < 384:
            d = b.acquire(Intent("storm", units={"gpu": (1, 384 - sup.held)}, duration=60, ttl=1))
            decisions += 1
            if d.granted:
                launch(d.lease)
        # backfill: every 10 s take idle GPUs above 160 of headroom, for 5 minutes
        if now % 10 == 0:
            free = b.supply("backfill").dims["gpu"].free
            if free > 160:
                d = b.acquire(Intent("backfill", units={"gpu": (1, free - 160)}, duration=300))
                decisions += 1
                if d.granted:
                    launch(d.lease)
        clock.advance(1.0)
        due = binding.next_deadline()
        if due is not None and due <= clock.now():
            binding.enforce()             # kills due (an expired lease's grace ran out)
        if now % 60 == 59:
            pool.tick()                   # pilots, drains, replacements
        for e in b.poll():
            if e.kind in ("granted", "activated") and e.lease_id is not None:
                launch(b.lease(e.lease_id))
            if e.campaign != "interactive":
                continue
            if e.kind == "granted" and e.intent_id in waiting:
                assert e.intent_id is not None and e.lease_id is not None
                t0 = waiting.pop(e.intent_id)
                lease = b.lease(e.lease_id)
                if lease.state == "active":
                    latencies.append(e.time - t0)
                else:
                    starting[e.lease_id] = t0
            elif e.kind == "activated" and e.lease_id is not None and e.lease_id in starting:
                latencies.append(e.time - starting.pop(e.lease_id))
        storm_held.append(b.supply("storm").dims["gpu"].held)
        gpu = b.state()["pool"]["gpu"]
        occupied.append(gpu["occupied"])
        occupied_firm.append(gpu["firm"])
    signalled = sum(any(h.signalled for h in lh.parts) for lh in work.values())
    killed = sum(any(h.killed for h in lh.parts) for lh in work.values())
    pilots, nodes = len(pool.pilots), sum(len(p.hosts) for p in pool.pilots.values())
    real = _real_processes(b, pool, binding) if processes else []
    pool.shutdown()
    if journal is not None and journal_path:     # (one is made exactly when a path is given)
        export_jsonl(journal, journal_path)
    held = np.array(storm_held, dtype=float)
    refilled = b.state()["campaigns"]["storm"]["tokens_refilled"]["gpu"]
    lat = np.array(latencies) if latencies else np.zeros(1)
    return DemoResult(
        seconds=seconds, backend=b.backend,
        storm_avg_hold=float(held.mean()), storm_sustained=64, storm_ceiling=384,
        storm_extracted_above_sustained=float(np.maximum(0, held - 64).sum()),
        storm_bucket=25_000.0, storm_refilled=refilled,
        interactive_p50=float(np.percentile(lat, 50)), interactive_p95=float(np.percentile(lat, 95)),
        interactive_requests=len(latencies), interactive_refused_for_capacity=refused_cap,
        utilisation=float(np.mean(occupied)) / 512,
        utilisation_no_backfill=float(np.mean(occupied_firm)) / 512,
        decisions=decisions, wall_seconds=time.perf_counter() - wall,
        pilots=pilots, pool_nodes=nodes,
        work_launched=len(work), work_signalled=signalled, work_killed=killed,
        processes=real)


def _wait_for(path: str, text: str, timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            with open(path) as f:
                if text in f.read():
                    return True
        except FileNotFoundError:
            pass
        time.sleep(0.01)
    return False


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except FileNotFoundError:
        return ""


def _real_processes(b: Broker, pool: PoolManager, binding: LocalBinding) -> list[dict]:
    """After the simulated hour: real processes through the same binding, on two leases
    of a campaign registered for it. Returns one record per lease."""
    clock = b.clock
    binding.execution = "process"
    out: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="bursar-demo-") as logs:
        binding.log_dir = logs
        b.register("operator", Envelope(credits=1_000, service_class="interactive",
                                        guaranteed={"gpu": 0}, sustained={"gpu": 8},
                                        ceiling={"gpu": 8}, burst={"gpu": 10_000}))
        leases = []
        for _ in range(2):
            d = b.acquire(Intent("operator", units={"gpu": (1, 4)}, duration=600, ttl=1))
            if not d.granted:
                out.append({"error": f"no lease for the real processes ({d.reason})"})
                return out
            assert d.lease is not None
            if d.lease.state != "active":         # a reclaim: wait out the grace
                clock.advance(max(0.0, d.wait))
                b.poll()
            leases.append(b.lease(d.lease.id))
        env = {"BURSAR_DEMO": "1"}
        # 1: a short job on its lease's slots, with the lease's environment
        ok = leases[0]
        h = pool.launch(ok, [sys.executable, "-c", _HELLO], env)
        h.wait(30.0)
        out.append({"lease": ok.id, "units": ok.units, "placement": list(ok.placement),
                    "what": "python -c (prints its environment)", "exit_code": h.exit_code,
                    "status": h.status,
                    "output": [_read(os.path.join(logs, f"lease-{ok.id}.{k}.out"))
                               for k in range(len(h.parts))]})
        # 2: a process that ignores the notice, on a pilot that is drained with 30 s notice
        lz = leases[1]
        h = pool.launch(lz, [sys.executable, "-c", _STUBBORN], env)
        log = os.path.join(logs, f"lease-{lz.id}.0.out")
        _wait_for(log, "ready")
        pilot = lz.placement[0][0].partition("/")[0]
        t0 = clock.now()
        revoked = pool.drain(pilot, grace=30.0)      # SIGTERM to its leases' processes now
        noticed = _wait_for(log, "got SIGTERM")
        clock.advance(30.0)
        rep = pool.tick()                            # the grace ran out: SIGKILL
        h.wait(10.0)
        parts = h.parts
        out.append({"lease": lz.id, "units": lz.units, "placement": list(lz.placement),
                    "what": "python -c (ignores SIGTERM)", "pilot": pilot,
                    "drained_at": t0, "grace": 30.0, "revoked_with_it": len(revoked),
                    "signals": sorted({s for p in parts for s in p.signalled}),
                    "noticed": noticed, "killed": all(p.killed for p in parts),
                    "killed_at": rep.time, "exit_code": h.exit_code, "status": h.status,
                    "output": _read(log)})
        binding.log_dir = None
    return out


def format_demo(r: DemoResult) -> str:
    lines = [
        f"bursarcore demo: 512-GPU pool, {r.seconds / 3600:g} simulated hour(s), "
        f"{r.decisions} admission decisions ({r.backend} engine, {r.wall_seconds:.1f} s wall)",
        "",
        f"  storm (adversary demanding its {r.storm_ceiling}-GPU ceiling every second)",
        f"    average hold             {r.storm_avg_hold:8.1f} GPUs   "
        f"(sustained {r.storm_sustained}, ceiling {r.storm_ceiling})",
        f"    extracted above sustained {r.storm_extracted_above_sustained:10,.0f} GPU-s  "
        f"(bucket B {r.storm_bucket:,.0f} + refill {r.storm_refilled:,.0f})",
        "  interactive (32-GPU guarantee)",
        f"    grant latency p50 / p95  {r.interactive_p50:6.1f} / {r.interactive_p95:.1f} s   "
        f"over {r.interactive_requests} requests; refused for capacity: "
        f"{r.interactive_refused_for_capacity}",
        "  utilisation",
        f"    with opportunistic backfill {100 * r.utilisation:5.1f} %   "
        f"(firm leases alone: {100 * r.utilisation_no_backfill:.1f} %)",
        f"  pool: {r.pilots} pilots of the local binding, {r.pool_nodes} nodes "
        f"(joined with add_nodes; the PoolManager keeps them)",
        f"    work launched for {r.work_launched} leases (simulated); enforcement: "
        f"{r.work_signalled} signalled, {r.work_killed} killed after their grace",
    ]
    if r.processes:
        lines.append("  real processes through the same binding, after the simulated run")
    for p in r.processes:
        if "error" in p:
            lines.append(f"    {p['error']}")
            continue
        where = ", ".join(f"{n} ×{k}" for n, k in p["placement"])
        lines.append(f"    lease {p['lease']} ({p['units']} GPUs on {where}): {p['what']}")
        if "pilot" not in p:
            for text in p["output"]:
                lines.append(f"      printed {text!r}")
            lines.append(f"      exit {p['exit_code']}, {p['status']}")
            continue
        sigs = "+".join(_sig.Signals(s).name for s in p["signals"]) or "no signal"
        lines.append(
            f"      pilot {p['pilot']} drained at t={p['drained_at']:.0f} s with "
            f"{p['grace']:.0f} s notice ({p['revoked_with_it']} leases revoked): {sigs} now;")
        lines.append(f"      it printed {p['output'].splitlines()[-1] if p['output'] else ''!r}")
        lines.append(f"      killed at t={p['killed_at']:.0f} s, after the grace: exit "
                     f"{p['exit_code']} ({p['status']})")
    return "\n".join(lines)
