"""The pool manager over the local binding, on a manual clock: the warm pool grows from
demand and congestion, never faster than its rate limit nor beyond its in-flight cap,
shrinks when idle, drains pilots ahead of their walltime, and enforces revocations on
real processes (signal, then kill after the grace) without touching other leases."""

from __future__ import annotations

import math
import signal
import sys
import time

import pytest

from bursarcore import Broker, Envelope, Intent, ManualClock, Pool
from bursarcore.adapters import (CANCELLED, FAILED, PENDING, RUNNING, TIMEOUT, LocalBinding,
                                 PoolManager)
from bursarcore.errors import InvalidArgument

TRAP = ('trap "echo TERM >> \\"$OUT\\"; exit 7" TERM; echo up >> "$OUT"; '
        'while :; do sleep 0.05; done')


def setup(**kw):
    clock = ManualClock(0.0)
    b = Broker(Pool(cpu=0), clock=clock)
    b.register("a", Envelope(credits=math.inf, sustained={"cpu": 256}, ceiling={"cpu": 256}))
    lb = LocalBinding(slots_per_node=kw.pop("slots", 4), total_slots=kw.pop("total", 64),
                      start_delay=kw.pop("start_delay", 0.0), min_interval=kw.pop("interval", 0.0),
                      clock=clock)
    kw.setdefault("walltime", 3600)
    m = PoolManager(b, lb, **kw)
    return clock, b, lb, m


def wait_for(pred, timeout=10.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.02)
    return pred()


def read(path):
    return path.read_text().split() if path.exists() else []


def test_min_pilots_join_the_pool_after_their_queue_wait():
    clock, b, lb, m = setup(min_pilots=2, max_pilots=4, max_in_flight=2, start_delay=30)
    rep = m.tick()
    assert len(rep.submitted) == 2 and b.state()["pool"]["cpu"]["capacity"] == 0
    assert {p.state for p in m.pilots.values()} == {PENDING}
    assert m.cold_wait("cpu") == pytest.approx(30.0)
    clock.advance(30)
    rep = m.tick()
    assert sorted(rep.joined) == sorted(m.pilots) and rep.submitted == []
    assert b.state()["pool"]["cpu"]["capacity"] == 8
    assert sorted(b.pool.slot_map["cpu"]) == [("local1/localhost", 4), ("local2/localhost", 4)]
    assert m.cold_wait("cpu") == pytest.approx(30.0)   # slots free: just the queue wait
    assert m.cold_wait("gpu") is None
    # the broker shows it as the cold path's wait
    assert b.supply("a").dims["cpu"].wait["cold"] == pytest.approx(30.0)


def test_pending_demand_scales_out_within_max():
    clock, b, lb, m = setup(min_pilots=1, max_pilots=3, max_in_flight=2, start_delay=10,
                            submit_burst=5)
    m.tick()
    clock.advance(10)
    m.tick()
    assert b.acquire(Intent("a", units={"cpu": 4}, duration=600)).granted
    for _ in range(3):                                  # 6 more units wanted
        assert b.acquire(Intent("a", units={"cpu": 2}, duration=600)).outcome == "pending"
    rep = m.tick()
    assert len(rep.submitted) == 2                      # ceil(6 / 4)
    clock.advance(10)
    rep = m.tick()
    assert len(rep.joined) == 2
    assert [e.kind for e in b.poll()].count("granted") == 3   # served as the pool grew
    rep = m.tick()
    assert rep.submitted == [] and len(m.live()) == 3


def test_congestion_alone_scales_out():
    clock, b, lb, m = setup(min_pilots=1, max_pilots=2, start_delay=0, congestion_high=0.9)
    m.tick()
    m.tick()
    assert b.state()["pool"]["cpu"]["capacity"] == 4
    b.acquire(Intent("a", units={"cpu": 4}, duration=600))
    # an intent bigger than the whole pool is refused, but its shortfall is congestion
    assert b.acquire(Intent("a", units={"cpu": 8}, duration=600)).reason == "capacity"
    assert b.state()["pool"]["cpu"]["congestion"] >= 0.9
    rep = m.tick()
    assert len(rep.submitted) == 1


def test_rate_limit_under_a_burst_of_demand():
    """Runaway demand; the scheduler sees at most burst + rate * t submissions."""
    rate, burst = 0.1, 2
    clock, b, lb, m = setup(min_pilots=0, max_pilots=100, max_in_flight=100, start_delay=1e9,
                            submit_rate=rate, submit_burst=burst)
    b.add_nodes("cpu", [("static/host", 1)])            # so that intents can pend
    b.acquire(Intent("a", units={"cpu": 1}, duration=1e6))
    for _ in range(200):
        b.acquire(Intent("a", units={"cpu": 1}, duration=600, ttl=86_400))
    throttled = 0
    for _ in range(120):
        throttled += m.tick().throttled
        clock.advance(1.0)
    times = [t for t, _ in m.submissions]
    assert len(times) == burst + int(rate * 119)       # 2 at once, then one per 10 s
    for i, t0 in enumerate(times):                      # no window beats the bucket
        for j in range(i, len(times)):
            assert j - i + 1 <= burst + rate * (times[j] - t0) + 1e-9
    assert throttled > 100
    for _ in range(3):                                  # spend what refilled meanwhile
        r = m.provision()
        if r.outcome != "submitted":
            break
    assert r.outcome == "throttled" and r.reason == "rate" and 0 < r.retry_after <= 10
    assert m.provision(force=True).outcome == "submitted"


def test_in_flight_cap():
    clock, b, lb, m = setup(min_pilots=0, max_pilots=50, max_in_flight=3, start_delay=1e9,
                            submit_rate=100.0, submit_burst=100)
    b.add_nodes("cpu", [("static/host", 1)])
    b.acquire(Intent("a", units={"cpu": 1}, duration=1e6))
    for _ in range(100):
        b.acquire(Intent("a", units={"cpu": 1}, duration=600, ttl=86_400))
    for _ in range(20):
        m.tick()
        clock.advance(1)
        assert len([p for p in m.pilots.values() if p.state == PENDING]) <= 3
    assert len(m.pilots) == 3
    assert m.provision().reason == "in_flight"


def test_idle_pilots_scale_in_to_min():
    clock, b, lb, m = setup(min_pilots=1, max_pilots=3, idle_time=120)
    for _ in range(2):
        m.provision(force=True)
    m.tick()
    m.tick()
    assert len(m.live()) == 2 and b.state()["pool"]["cpu"]["capacity"] == 8
    lease = b.acquire(Intent("a", units={"cpu": 4}, duration=1000)).lease
    busy = lease.placement[0][0].split("/")[0]
    clock.advance(119)
    assert m.tick().cancelled == []
    clock.advance(1)
    rep = m.tick()
    assert len(rep.cancelled) == 1 and rep.cancelled[0] != busy
    m.tick()
    assert [p.id for p in m.live()] == [busy]
    assert m.pilots[rep.cancelled[0]].state == CANCELLED
    assert b.state()["pool"]["cpu"]["capacity"] == 4
    assert b.lease(lease.id).state == "active"          # the busy pilot was kept


def test_walltime_drain_revokes_with_notice_then_kill(tmp_path):
    clock, b, lb, m = setup(min_pilots=1, max_pilots=1, walltime=600, drain_lead=60,
                            drain_margin=5, submit_burst=3)
    m.tick()
    m.tick()
    keep = b.acquire(Intent("a", units={"cpu": 2}, duration=550)).lease   # ends in time
    lease = b.acquire(Intent("a", units={"cpu": 2}, duration=3000)).lease
    out, out_keep = tmp_path / "lease.out", tmp_path / "keep.out"
    h = m.launch(lease, ["/bin/sh", "-c", TRAP], {"OUT": str(out)})
    hk = m.launch(keep.id, ["/bin/sh", "-c", TRAP], {"OUT": str(out_keep)})
    assert wait_for(lambda: read(out) == ["up"] and read(out_keep) == ["up"])
    clock.advance(539)
    assert m.tick().drained == []
    clock.advance(1)                                   # 60 s before the end
    rep = m.tick()
    pid = lease.placement[0][0].split("/")[0]
    assert rep.drained == [pid] and sorted(rep.revoked) == sorted([lease.id, keep.id])
    assert b.lease(lease.id).state == "revoking" and b.lease(lease.id).revoke_at == pytest.approx(595)
    # (the trap writes TERM, then exits: wait for the exit too)
    assert wait_for(lambda: read(out) == ["up", "TERM"] and h.exit_code == 7)
    assert h.status == "revoked"
    # its replacement (min_pilots=1) is on its way while this one drains
    assert len(rep.submitted) == 1
    clock.advance(55)
    m.tick()
    assert b.lease(lease.id).state == "revoked"
    clock.advance(5)
    rep = m.tick()
    assert pid in rep.ended and m.pilots[pid].state == TIMEOUT
    assert hk.wait(5) is not None


def test_revoking_one_lease_spares_the_pilots_others(tmp_path):
    clock, b, lb, m = setup(min_pilots=1, max_pilots=1)
    m.tick()
    m.tick()
    l1 = b.acquire(Intent("a", units={"cpu": 2}, duration=100)).lease
    l2 = b.acquire(Intent("a", units={"cpu": 2}, duration=1000)).lease
    assert l1.placement[0][0] == l2.placement[0][0]     # same pilot, same host
    o1, o2 = tmp_path / "1", tmp_path / "2"
    h1 = m.launch(l1, ["/bin/sh", "-c", "trap '' TERM; echo up >> $OUT; while :; do sleep 0.05; done"],
                  {"OUT": str(o1)})
    h2 = m.launch(l2, ["/bin/sh", "-c", TRAP], {"OUT": str(o2)})
    assert wait_for(lambda: read(o1) == ["up"] and read(o2) == ["up"])
    clock.advance(100)                                  # l1 expires: signal, kill after 5 s
    m.tick()
    time.sleep(0.3)
    assert h1.exit_code is None                         # it ignores TERM
    clock.advance(5)
    assert m.tick().killed == [l1.id]
    assert h1.wait(5) == 128 + signal.SIGKILL and h1.status == "revoked"
    assert h2.exit_code is None and read(o2) == ["up"]  # untouched
    assert m.pilots[l2.placement[0][0].split("/")[0]].state == RUNNING
    lb.kill(l2.id)
    assert h2.wait(5) == 128 + signal.SIGKILL


def test_pilot_failure_revokes_its_leases_at_once(tmp_path):
    clock, b, lb, m = setup(min_pilots=1, max_pilots=1)
    m.tick()
    m.tick()
    lease = b.acquire(Intent("a", units={"cpu": 4}, duration=1000)).lease
    h = m.launch(lease, ["/bin/sh", "-c", TRAP], {"OUT": str(tmp_path / "o")})
    assert wait_for(lambda: read(tmp_path / "o") == ["up"])
    pid = lease.placement[0][0].split("/")[0]
    lb.fail(pid)
    rep = m.tick()
    assert rep.left == [pid] and rep.revoked == [lease.id] and pid in rep.ended
    assert m.pilots[pid].state == FAILED and m.pilots[pid].reason == "node failure"
    assert b.lease(lease.id).state == "revoked"
    assert h.wait(5) is not None
    assert b.state()["pool"]["cpu"]["capacity"] == 0
    assert len(rep.submitted) == 1                      # replaced


def test_per_slot_launch_runs_one_process_per_slot(tmp_path):
    clock, b, lb, m = setup(min_pilots=1, max_pilots=1, slots=3)
    m.tick()
    m.tick()
    lease = b.acquire(Intent("a", units={"cpu": 3}, duration=100)).lease
    out = tmp_path / "slots"
    h = m.launch(lease, ["/bin/sh", "-c", 'echo "$BURSAR_SLOT/$BURSAR_SLOTS" >> "$OUT"'],
                 {"OUT": str(out)}, per_slot=True)
    assert h.wait(10) == 0 and h.status == "completed"
    assert sorted(read(out)) == ["0/3", "1/3", "2/3"]


def test_failed_process_status_and_exit_code(tmp_path):
    clock, b, lb, m = setup(min_pilots=1, max_pilots=1)
    m.tick()
    m.tick()
    lease = b.acquire(Intent("a", units={"cpu": 1}, duration=100)).lease
    h = m.launch(lease, [sys.executable, "-c", "import sys; sys.exit(3)"])
    assert h.wait(10) == 3 and h.status == "failed"
    with pytest.raises(InvalidArgument):
        lb.launch(b.lease(lease.id), [])


def test_manager_validation():
    clock = ManualClock(0.0)
    b = Broker(Pool(cpu=0), clock=clock)
    with pytest.raises(InvalidArgument):
        PoolManager(b, LocalBinding(clock=ManualClock(0.0)))       # another clock
    with pytest.raises(InvalidArgument):
        PoolManager(b, LocalBinding(dim="gpu", clock=clock))       # no gpu dimension
    with pytest.raises(InvalidArgument):
        PoolManager(b, LocalBinding(clock=clock), min_pilots=3, max_pilots=2)
    with pytest.raises(InvalidArgument):
        PoolManager(b, LocalBinding(clock=clock), submit_rate=0)


def test_local_binding_queues_pilots_beyond_its_slots():
    clock = ManualClock(0.0)
    lb = LocalBinding(slots_per_node=4, total_slots=8, clock=clock, wallclock=lambda: 1000 + clock.now())
    a, c, d = (lb.submit(1, 100) for _ in range(3))
    st = lb.status([a, c, d])
    assert [st[i].state for i in (a, c, d)] == [RUNNING, RUNNING, PENDING]
    assert lb.expected_start(1, 100) == pytest.approx(1000 + 100)  # when a and c end
    assert lb.supply().slots_free == 0 and lb.supply().pending_jobs == 1
    clock.advance(100)
    st = lb.status([a, c, d])
    assert [st[i].state for i in (a, c, d)] == [TIMEOUT, TIMEOUT, RUNNING]
    assert st[d].start == pytest.approx(1000 + 100)
    lb.cancel([d])
    assert lb.status([d])[d].state == CANCELLED
