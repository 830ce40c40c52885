"""The Slurm binding and the pool manager against the real single-node Slurm that
``scripts/slurm/up.sh`` brings up (the same one ``.ci/run`` starts).

Skipped, with the reason, when Slurm is missing or down; ``BURSAR_REQUIRE_SLURM=1`` (CI)
turns that skip into a failure. Every wait is bounded. The node needs 2 CPUs (the
default ``up.sh`` configuration on this machine; more are fine): pilots ask for 1 or 2 of
them with ``--ntasks-per-node``, so nothing here depends on ``BURSAR_SLURM_CPUS``.

What runs for real: ``sbatch`` pilots, ``squeue --json`` / ``sinfo --json`` states and
supply, ``squeue --start`` / ``sbatch --test-only`` estimates, ``srun --jobid`` steps on a
lease's placement, ``scancel --signal`` on one step, ``scancel`` of a pilot, and Slurm's
own walltime kill (its time limits are checked on a 30 s tick, so a pilot with a
1-minute limit ends 60–90 s after it starts: the walltime test waits up to 105 s for it).
"""

from __future__ import annotations

import dataclasses
import math
import os
import time

import pytest

from bursarcore import DEFAULT_CLASSES, Broker, Envelope, Intent, MonotonicClock, Pool
from bursarcore.adapters import (CANCELLED, PENDING, RUNNING, TIMEOUT, PoolManager,
                                 SlurmBinding)

from slurm_cluster import require_cluster, run

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="module")
def slurm_up():
    require_cluster(min_cpus=2)


@pytest.fixture
def cluster(slurm_up):
    """A free node: these tests need its CPUs, so wait (bounded) for other jobs — an
    earlier test's pilot finishing, or another test run sharing this Slurm — to end."""
    deadline = time.monotonic() + 120
    while run("squeue", "-h", "-t", "PENDING,RUNNING,COMPLETING", "-o", "%i").stdout.strip():
        if time.monotonic() > deadline:
            pytest.fail("the node is still busy with other jobs after 120 s: "
                        + run("squeue").stdout, pytrace=False)
        time.sleep(0.5)


@pytest.fixture
def managers():
    """Managers made by a test; every pilot they submitted is cancelled afterwards."""
    made: list[PoolManager] = []
    yield made
    ids = [pid for m in made for pid in m.pilots]
    if ids:
        run("scancel", *ids)
        end = time.monotonic() + 30
        while time.monotonic() < end:
            out = run("squeue", "-h", "-o", "%i", "-t", "PENDING,RUNNING,COMPLETING").stdout.split()
            if not set(out) & set(ids):
                break
            time.sleep(0.2)


CLASSES = tuple(dataclasses.replace(c, grace=4.0) if c.preemptible else c for c in DEFAULT_CLASSES)


def make(managers, tmp_path, **kw):
    clock = MonotonicClock()
    b = Broker(Pool(cpu=0), clock=clock, classes=CLASSES)
    b.register("a", Envelope(credits=math.inf, sustained={"cpu": 64}, ceiling={"cpu": 64}))
    b.register("bf", Envelope(credits=math.inf, service_class="opportunistic",
                              sustained={"cpu": 64}, ceiling={"cpu": 64}, burst={"cpu": math.inf}))
    binding = SlurmBinding(slots_per_node=kw.pop("slots_per_node", 2), min_interval=0.5,
                           log_dir=tmp_path / "logs", kill_check=5.0)
    m = PoolManager(b, binding, pilot_name=f"bursar-test-{os.getpid()}", **kw)
    managers.append(m)
    return b, m


def tick_until(m, pred, timeout, what, period=0.25):
    reports = []
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        reports.append(m.tick())
        if pred(reports):
            return reports
        time.sleep(period)
    pytest.fail(f"{what}: not after {timeout} s; pilots "
                f"{[(p.id, p.state, p.raw_state, p.reason) for p in m.pilots.values()]}")


def lines(path):
    return path.read_text().splitlines() if path.exists() else []


def wait_lines(path, pred, timeout, what):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred(lines(path)):
            return lines(path)
        time.sleep(0.05)
    pytest.fail(f"{what}: {path} has {lines(path)} after {timeout} s")


STEP = ('echo "up $SLURM_JOB_ID.$SLURM_STEP_ID cpus=$SLURM_CPUS_ON_NODE '
        'lease=$BURSAR_LEASE_ID slots=$BURSAR_SLOTS" >> "$OUT"; '
        'trap "echo TERM >> \\"$OUT\\"; exit 7" TERM; while :; do sleep 0.1; done')
STUBBORN = ('echo "up $SLURM_JOB_ID.$SLURM_STEP_ID" >> "$OUT"; '
            'trap "echo TERM-ignored >> \\"$OUT\\"" TERM; while :; do sleep 0.1; done')


def test_pilot_leases_steps_revocation_and_walltime(cluster, managers, tmp_path):
    """A 1-minute pilot joins the pool; leases run as steps on their placement; a reclaim
    revokes one lease (TERM, ignored, then KILL after the 4 s grace) and spares the other;
    the pilot is drained 20 s before its walltime (notice: TERM, the step exits 7); Slurm
    then ends it (TIMEOUT) and its slots are gone. The replacement the minimum asks for is
    held back by the submission rate limit."""
    b, m = make(managers, tmp_path, min_pilots=1, max_pilots=1, walltime=60, drain_lead=20,
                drain_margin=0, submit_burst=1, submit_rate=1 / 600)
    t0 = time.monotonic()
    reps = tick_until(m, lambda r: r[-1].joined, 60, "the pilot joins the pool")
    [pid] = reps[-1].joined
    t_join = time.monotonic() - t0
    pilot = m.pilots[pid]
    assert pilot.state == RUNNING and pilot.hosts == (("localhost", 2),)
    assert b.pool.slot_map["cpu"] == [(f"{pid}/localhost", 2)]
    assert pilot.ends_at - pilot.started_at == pytest.approx(60, abs=1)
    s = m.binding.supply()
    assert s.slots_total >= 2 and s.slots_allocated >= 2

    # two leases: one firm, one opportunistic; a step each, on exactly their slot
    la = b.acquire(Intent("a", units={"cpu": 1}, duration=600)).lease
    lb = b.acquire(Intent("bf", units={"cpu": 1}, duration=600)).lease
    assert la.placement == lb.placement == ((f"{pid}/localhost", 1),)
    oa, ob = tmp_path / "a.out", tmp_path / "bf.out"
    ha = m.launch(la, ["bash", "-c", STEP], {"OUT": str(oa)})
    hb = m.launch(lb, ["bash", "-c", STUBBORN], {"OUT": str(ob)})
    up_a = wait_lines(oa, lambda l: l, 20, "lease a's step starts")[0]
    wait_lines(ob, lambda l: l, 20, "lease bf's step starts")
    assert up_a.startswith(f"up {pid}.") and "cpus=1" in up_a and f"lease={la.id}" in up_a
    steps = run("squeue", "--steps", "-h", "-o", "%i %j", f"--jobs={pid}").stdout
    assert f"bursar-lease-{la.id}.0" in steps and f"bursar-lease-{lb.id}.0" in steps

    # a firm intent reclaims bf's slot: notice now, kill after the class grace (4 s)
    t_rev = time.monotonic()
    d = b.acquire(Intent("a", units={"cpu": 1}, duration=600))
    assert d.granted and d.path == "reclaim" and d.wait == pytest.approx(4.0, abs=0.1)
    wait_lines(ob, lambda l: "TERM-ignored" in l, 10, "bf's step gets the notice signal")
    t_notice = time.monotonic() - t_rev
    assert hb.exit_code is None                        # it ignored TERM: still running
    tick_until(m, lambda r: any(lb.id in x.killed for x in r), 15, "bf is killed after its grace")
    assert hb.wait(15) == 137 and hb.status == "revoked"
    t_kill = time.monotonic() - t_rev
    assert 3.5 <= t_kill <= 12
    assert ha.exit_code is None and lines(oa) == [up_a]  # the other lease is untouched
    assert m.binding.status([pid])[pid].state == RUNNING

    # the reclaiming lease activates on the freed slot and runs there
    m.tick()
    lc = b.lease(d.lease.id)
    assert lc.state == "active" and lc.placement == ((f"{pid}/localhost", 1),)
    oc = tmp_path / "c.out"
    hc = m.launch(lc, ["bash", "-c", STEP], {"OUT": str(oc)})
    wait_lines(oc, lambda l: l, 20, "the reclaiming lease's step starts")

    # the drain: 20 s before the walltime, notice with the walltime as deadline
    reps = tick_until(m, lambda r: any(x.drained for x in r), 75, "the pilot is drained")
    rep = next(x for x in reps if x.drained)
    assert sorted(rep.revoked) == sorted([la.id, lc.id])
    assert b.lease(la.id).revoke_at == pytest.approx(pilot.ends_at, abs=0.5)
    for out, h in ((oa, ha), (oc, hc)):
        wait_lines(out, lambda l: l[-1:] == ["TERM"], 10, "a drained lease's step gets TERM")
        assert h.wait(10) == 7 and h.status == "revoked"
    t_drain = time.monotonic() - t0
    # Slurm's own walltime kill: checked every 30 s, so 60-90 s after the start
    reps = tick_until(m, lambda r: pid in r[-1].ended, 110 - (time.monotonic() - t0),
                      "Slurm ends the pilot at its walltime", period=0.5)
    t_end = time.monotonic() - t0
    assert pilot.state == TIMEOUT and pilot.raw_state == "TIMEOUT"
    assert b.lease(la.id).state == "revoked" and b.lease(lc.id).state == "revoked"
    assert b.state()["pool"]["cpu"]["capacity"] == 0
    assert len(m.pilots) == 1 and sum(x.throttled for x in reps) >= 1   # rate limit held
    print(f"\n[slurm walltime] join {t_join:.2f} s, notice {t_notice:.2f} s, "
          f"kill after grace {t_kill:.2f} s, drain at {t_drain:.1f} s, "
          f"TIMEOUT seen at {t_end:.1f} s after submission")


def test_cancelled_pilot_revokes_its_leases(cluster, managers, tmp_path):
    """An operator's scancel ends the pilot: it leaves the pool, its lease is revoked at
    once (its step died with it). Also: supply and the cold path's wait from Slurm."""
    b, m = make(managers, tmp_path, min_pilots=1, max_pilots=1, walltime=120, autoscale=True)
    reps = tick_until(m, lambda r: r[-1].joined, 60, "the pilot joins the pool")
    [pid] = reps[-1].joined
    m.autoscale = False
    lease = b.acquire(Intent("a", units={"cpu": 2}, duration=600)).lease
    out = tmp_path / "o"
    h = m.launch(lease, ["bash", "-c", STEP], {"OUT": str(out)})
    assert "cpus=2" in wait_lines(out, lambda l: l, 20, "the step starts")[0]
    # the node is full until this pilot's walltime: a new pilot would start ~120 s later
    wait = m.cold_wait("cpu")
    assert wait is not None and 60 <= wait <= 130
    assert b.supply("a").dims["cpu"].wait["cold"] == pytest.approx(wait, abs=2)
    t = time.monotonic()
    assert run("scancel", pid).returncode == 0
    reps = tick_until(m, lambda r: any(pid in x.left for x in r), 20, "the pilot leaves the pool")
    rep = next(x for x in reps if pid in x.left)
    assert rep.revoked == [lease.id]
    assert b.lease(lease.id).state == "revoked"
    assert h.wait(15) is not None and h.status == "revoked"
    tick_until(m, lambda r: m.pilots[pid].state == CANCELLED, 20, "the pilot is cancelled")
    assert b.state()["pool"]["cpu"]["capacity"] == 0
    print(f"\n[slurm cancel] pilot left the pool {time.monotonic() - t:.2f} s after scancel")


def test_rate_limit_and_in_flight_cap_under_a_burst(cluster, managers, tmp_path):
    """A burst of demand far beyond any pilot; submissions stay within burst + rate * t,
    pilots queued never exceed the cap, and the scheduler holds exactly what we submitted."""
    burst, rate, cap = 2, 0.5, 3
    b, m = make(managers, tmp_path, slots_per_node=1, min_pilots=0, max_pilots=12,
                max_in_flight=cap, submit_burst=burst, submit_rate=rate, walltime=120)
    m.binding.pilot_output = "/dev/null"
    b.add_nodes("cpu", [("static/nowhere", 1)])        # lets intents pend until pilots come
    b.acquire(Intent("a", units={"cpu": 1}, duration=1e6))
    for _ in range(40):
        b.acquire(Intent("a", units={"cpu": 1}, duration=600, ttl=86_400))
    t0 = time.monotonic()
    max_queued = 0
    while time.monotonic() - t0 < 8.0:
        m.tick()
        max_queued = max(max_queued, sum(p.state == PENDING for p in m.pilots.values()))
        time.sleep(0.2)
    elapsed = time.monotonic() - t0
    times = [t for t, _ in m.submissions]
    assert burst < len(times) <= burst + rate * elapsed + 1
    for i, t_i in enumerate(times):
        for j in range(i, len(times)):
            assert j - i + 1 <= burst + rate * (times[j] - t_i) + 1e-6
    assert max_queued <= cap
    ours = set(m.pilots)
    listed = {j for j in run("squeue", "-h", "-o", "%i").stdout.split() if j in ours}
    assert listed == ours                               # nothing submitted behind our back
    joined = [p for p in m.pilots.values() if p.in_pool]
    assert len(joined) >= 1                             # the node's 2 CPUs run 1-CPU pilots
    m.shutdown()
    tick_until(m, lambda r: all(p.terminal for p in m.pilots.values()), 30, "all pilots end")
    print(f"\n[slurm burst] {len(times)} submissions in {elapsed:.1f} s "
          f"(bound {burst} + {rate}/s), at most {max_queued} queued (cap {cap})")
