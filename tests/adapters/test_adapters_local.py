"""The local binding's two execution modes behind one interface, the manager's graceful
drain, its event horizon for discrete-event drivers, the cold path's configuration, and
CommandError's home in ``bursarcore.errors``."""

from __future__ import annotations

import math
import pickle
import signal
import subprocess

import pytest

from bursarcore import Broker, Envelope, Intent, ManualClock, Pool
from bursarcore.adapters import (COLD_WAIT_MODES, LocalBinding, PoolManager, ProcessHandle,
                                 SimHandle)
from bursarcore.errors import BursarError, InvalidArgument


def setup(execution="simulated", **kw):
    clock = ManualClock(0.0)
    b = Broker(Pool(gpu=0), clock=clock)
    b.register("a", Envelope(credits=math.inf, sustained={"gpu": 64}, ceiling={"gpu": 64}))
    lb = LocalBinding(dim="gpu", slots_per_node=4, total_slots=kw.pop("total", 16),
                      start_delay=kw.pop("start_delay", 0.0), min_interval=0.0, clock=clock,
                      execution=execution, sim_on_notice=kw.pop("on_notice", "ignore"),
                      sim_duration=kw.pop("sim_duration", None))
    kw.setdefault("walltime", 3600)
    kw.setdefault("min_pilots", 2)
    kw.setdefault("max_pilots", 2)
    kw.setdefault("max_in_flight", 2)
    m = PoolManager(b, lb, **kw)
    m.tick()
    m.tick()
    return clock, b, lb, m


@pytest.fixture
def no_spawn(monkeypatch):
    """Simulated execution must never start a process."""
    def refuse(*a, **k):
        raise AssertionError(f"a process was started: {a!r}")
    monkeypatch.setattr(subprocess, "Popen", refuse)


def test_commanderror_lives_in_errors_and_is_reexported():
    from bursarcore import adapters, errors
    from bursarcore.adapters import base

    assert adapters.CommandError is base.CommandError is errors.CommandError
    e = errors.CommandError(["squeue", "--json"], 1, "slurm_load_jobs error")
    assert isinstance(e, BursarError) and isinstance(e, RuntimeError)
    assert "exit 1" in str(e) and "squeue --json" in str(e) and "slurm_load_jobs" in str(e)
    back = pickle.loads(pickle.dumps(e))
    assert (back.argv, back.returncode, back.stderr) == (e.argv, 1, e.stderr)
    assert "CommandError" in errors.__all__


def test_simulated_launch_runs_on_the_clock_without_a_process(no_spawn):
    clock, b, lb, m = setup()
    d = b.acquire(Intent("a", {"gpu": 6}, 600))
    h = m.launch(d.lease, ["train.py"], {"X": "1"})
    assert all(isinstance(p, SimHandle) for p in h.parts)
    # the parts are exactly the lease's placement (pilot and host from the node name)
    assert sorted((f"{p.pilot_id}/{p.host}", p.slots) for p in h.parts) == \
        sorted(d.lease.placement)
    assert h.parts[0].env["X"] == "1" and h.parts[0].env["BURSAR_LEASE_ID"] == str(d.lease.id)
    assert h.status == "running" and h.wait(5) is None       # waiting does not move it
    clock.advance(100)
    assert h.status == "running"
    assert lb.finish(d.lease.id) == len(h.parts)
    assert h.status == "completed" and h.exit_code == 0


def test_simulated_duration_ends_the_work_by_itself(no_spawn):
    clock, b, lb, m = setup(sim_duration=30.0)
    d = b.acquire(Intent("a", {"gpu": 2}, 600))
    h = m.launch(d.lease, ["job"])
    clock.advance(29.5)
    assert h.exit_code is None
    clock.advance(0.5)
    assert h.exit_code == 0 and h.status == "completed" and h.parts[0].ended_at == 30.0


def test_simulated_revocation_goes_through_the_enforce_path(no_spawn):
    clock, b, lb, m = setup()
    d = b.acquire(Intent("a", {"gpu": 4}, 600))
    h = m.launch(d.lease, ["job"])
    pilot = d.lease.placement[0][0].partition("/")[0]
    revoked = m.drain(pilot, grace=20.0)          # the pool shrinks with notice
    assert revoked == [d.lease.id]
    assert lb.next_deadline() == 20.0
    (part,) = h.parts
    assert part.signalled == [signal.SIGTERM] and part.received == [(signal.SIGTERM, 0.0)]
    assert h.status == "running"                   # "ignore": it runs on until the kill
    clock.advance(10)
    assert m.tick().killed == [] and h.status == "running"
    clock.advance(10)
    rep = m.tick()
    assert rep.killed == [d.lease.id] and pilot in rep.cancelled
    assert h.exit_code == 137 and h.status == "revoked" and part.killed
    assert m.pilots[pilot].cancel_requested


def test_simulated_work_may_leave_at_the_notice(no_spawn):
    clock, b, lb, m = setup(on_notice="exit")
    d = b.acquire(Intent("a", {"gpu": 4}, 60))
    h = m.launch(d.lease, ["job"])
    clock.advance(60)
    m.tick()                                     # the lease expired: the notice signal
    assert h.exit_code == 128 + signal.SIGTERM and h.status == "revoked"
    assert lb.next_deadline() == pytest.approx(65.0)
    clock.advance(5)
    assert lb.enforce() == []                    # nothing left to kill


def test_pilot_end_kills_its_simulated_work(no_spawn):
    clock, b, lb, m = setup()
    d = b.acquire(Intent("a", {"gpu": 4}, 600))
    h = m.launch(d.lease, ["job"])
    pilot = d.lease.placement[0][0].partition("/")[0]
    lb.fail(pilot)
    assert h.exit_code == 137 and h.parts[0].killed
    rep = m.tick()
    assert pilot in rep.left and d.lease.id in rep.revoked


def test_execution_mode_switches_between_launches(tmp_path):
    clock, b, lb, m = setup()
    d1 = b.acquire(Intent("a", {"gpu": 2}, 600))
    h1 = m.launch(d1.lease, ["job"])
    lb.execution = "process"
    d2 = b.acquire(Intent("a", {"gpu": 2}, 600))
    h2 = m.launch(d2.lease, ["/bin/sh", "-c", "exit 3"])
    assert isinstance(h1.parts[0], SimHandle) and isinstance(h2.parts[0], ProcessHandle)
    assert h2.wait(10) == 3 and h2.status == "failed"
    assert h1.status == "running"
    with pytest.raises(InvalidArgument, match="execution"):
        lb.execution = "virtual"
    with pytest.raises(InvalidArgument, match="sim_on_notice"):
        LocalBinding(sim_on_notice="maybe")


def test_next_event_is_the_binding_and_manager_horizon(no_spawn):
    clock, b, lb, m = setup(walltime=1000, drain_lead=100, start_delay=0.0, total=8)
    assert lb.next_event() == 1000.0              # both pilots end at their walltime
    assert m.next_event() == 900.0                # ... and are drained 100 s before
    lb.start_delay = 50.0                         # the setter validates and re-plans
    with pytest.raises(InvalidArgument):
        lb.start_delay = -1
    m.provision(force=True)                       # queued: total slots are all in use
    assert lb.next_event() == 50.0                # its queue wait ends (it may start)
    clock.advance(50)
    assert lb.next_event() == 1000.0              # ... it waits for slots: the pilots' end
    clock.advance(850)
    rep = m.tick()
    assert sorted(rep.drained) == ["local1", "local2"] and rep.submitted == ["local4"]
    assert m.next_event(kills=False) == 950.0     # local4's queue wait ends
    clock.advance(100)
    rep = m.tick()
    assert sorted(rep.ended) == ["local1", "local2"]
    assert sorted(rep.joined) == ["local3", "local4"]   # they started as slots came free
    assert m.next_event() == 1900.0


def test_cold_wait_modes():
    assert COLD_WAIT_MODES == ("if_unset", "replace", "off")

    def mk(mode, preset):
        clock = ManualClock(0.0)
        b = Broker(Pool(gpu=0), clock=clock, cold_wait=preset)
        lb = LocalBinding(dim="gpu", slots_per_node=4, total_slots=8, start_delay=42.0,
                          min_interval=0.0, clock=clock)
        return b, PoolManager(b, lb, cold_wait=mode)

    mine = lambda dim: 1.0  # noqa: E731
    b, m = mk("if_unset", mine)
    assert b.cold_wait is mine
    b, m = mk("replace", mine)
    assert b.cold_wait == m.cold_wait and b.cold_wait("gpu") == pytest.approx(42.0)
    b, m = mk("off", None)
    assert b.cold_wait is None
    assert m.attach_cold_wait() and b.cold_wait("gpu") == pytest.approx(42.0)
    m.detach_cold_wait()
    assert b.cold_wait is None
    b.cold_wait = mine
    assert not m.attach_cold_wait(replace=False) and b.cold_wait is mine
    with pytest.raises(InvalidArgument, match="cold_wait"):
        mk("sometimes", None)


def test_state_every_skips_whole_state_reads_but_keeps_the_floor(no_spawn, monkeypatch):
    clock, b, lb, m = setup(state_every=math.inf, submit_burst=3)
    calls = []
    real = b.state
    monkeypatch.setattr(b, "state", lambda: calls.append(1) or real())
    lb.fail("local1")
    rep = m.tick()
    assert rep.left == ["local1"] and len(rep.submitted) == 1   # the floor is kept
    clock.advance(1)
    assert m.tick().joined == rep.submitted
    assert calls == []
    with pytest.raises(InvalidArgument, match="state_every"):
        setup(state_every=-1)


def test_a_refused_submission_is_reported_not_raised(no_spawn, monkeypatch):
    from bursarcore.errors import CommandError

    clock, b, lb, m = setup(submit_burst=3)

    def refuse(nodes, walltime, *, name=None):
        raise CommandError(["sbatch", "--parsable"], 1, "Invalid account or account/partition")
    monkeypatch.setattr(lb, "submit", refuse)
    lb.fail("local1")
    rep = m.tick()
    assert rep.left == ["local1"] and rep.submitted == []
    assert any("Invalid account" in e for e in rep.errors)
