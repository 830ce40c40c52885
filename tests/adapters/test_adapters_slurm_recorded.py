"""The Slurm binding against output recorded from the project's Slurm 22.05.8 (scripts/slurm
up.sh, 2 CPUs), fed through the command seam. ``recorded/slurm/``: ``squeue_running.json``
(pilot 43 running with two lease steps, pilot 45 pending, job 46 pending), ``squeue_ended.json``
(43 and 45 cancelled, 46 failed with ``exit 3``), ``sinfo.json``, ``squeue --start``,
``sbatch --test-only`` and ``squeue --steps`` output; ``now*.txt`` hold the epoch they were
taken at. Only the three jobs were kept from ``squeue --json`` (which ignores ``-j`` in
22.05 and returned every job slurmctld held). ``PENDING_45_46`` is the queue's pending
list in the text form the binding reads (``squeue --noheader --states=PENDING
--format=%i|%P|%C|%D|%b``, format as recorded in tests/fixtures/slurm/squeue_pending_22.05.txt)
for the same two pending jobs."""

from __future__ import annotations

import json
import logging
import signal

import pytest

from bursarcore import Broker, Envelope, Intent, ManualClock, Pool
from bursarcore.adapters import (CANCELLED, FAILED, PENDING, RUNNING, CommandError,
                                 PILOT_STATES, SlurmBinding)
from bursarcore.adapters.slurm import (SLURM_NODE_STATES, SLURM_STATES, SQUEUE_CODES,
                                       parse_wait_status)

from bindings_helpers import FakeProc, Script, recorded

NOW = float(recorded("slurm/now.txt"))
PENDING_45_46 = "45|debug|1|1|N/A\n46|debug|1|1|N/A\n"


class RecordedSlurm(SlurmBinding):
    """The seam: commands answered by a Script, processes by FakeProc."""

    def __init__(self, script: Script, **kw) -> None:
        kw.setdefault("clock", ManualClock(0.0))
        kw.setdefault("wallclock", lambda: NOW)
        super().__init__(**kw)
        self.script = script
        self.spawned: list[FakeProc] = []

    def execute(self, argv, *, input=None, env=None, timeout=None):
        return self.script(argv, input=input, env=env, timeout=timeout)

    def spawn(self, argv, *, env, cwd=None, stdout=None, stderr=None):
        p = FakeProc(argv, env)
        self.spawned.append(p)
        return p


@pytest.fixture
def slurm(script):
    script.on("squeue", "--json", stdout=recorded("slurm/squeue_running.json"))
    script.on("sinfo", "--json", stdout=recorded("slurm/sinfo.json"))
    script.on("squeue", "--noheader", "--states=PENDING", stdout=PENDING_45_46)
    return RecordedSlurm(script, min_interval=5.0)


def test_status_of_running_and_pending_pilots(slurm):
    st = slurm.status(["43", "45", "999"])
    assert set(st) == {"43", "45"}            # 999 is not listed: gone
    assert st["43"].state == RUNNING and st["43"].raw == "RUNNING"
    assert st["43"].hosts == (("localhost", 2),)   # two cores allocated on localhost
    assert st["43"].start == 1795975229 and st["43"].end == 1795975349  # start + 2 min
    assert st["45"].state == PENDING and st["45"].hosts == () and st["45"].start is None
    assert st["45"].reason == "Priority"


def test_status_of_ended_jobs_and_raw_wait_status(script):
    script.on("squeue", "--json", stdout=recorded("slurm/squeue_ended.json"))
    b = RecordedSlurm(script)
    st = b.status(["43", "45", "46"])
    assert (st["43"].state, st["43"].exit_code) == (CANCELLED, 128 + 15)   # raw 15: SIGTERM
    assert st["45"].state == CANCELLED
    assert (st["46"].state, st["46"].exit_code) == (FAILED, 3)              # raw 768
    assert st["46"].reason == "NonZeroExitCode"


def test_wait_status_decoding():
    assert parse_wait_status(768) == 3 and parse_wait_status(25344) == 99
    assert parse_wait_status(9) == 137 and parse_wait_status(0) == 0
    assert parse_wait_status(None) is None


def test_query_commands_are_rate_limited(slurm, script):
    for _ in range(5):
        slurm.status(["43"])
        slurm.supply()
    assert len(script.ran("squeue", "--json")) == 1 and len(script.ran("sinfo")) == 1
    slurm.clock.advance(4.9)
    slurm.status(["43"])
    assert len(script.ran("squeue", "--json")) == 1
    slurm.clock.advance(0.2)
    slurm.status(["43"])
    assert len(script.ran("squeue", "--json")) == 2


def test_a_failing_query_raises_with_command_and_stderr_and_is_not_retried_at_once(script):
    script.on("squeue", "--json", rc=1,
              stderr="slurm_load_jobs error: Unable to contact slurm controller (connect failure)")
    b = RecordedSlurm(script, min_interval=10)
    with pytest.raises(CommandError) as e:
        b.status(["43"])
    assert e.value.argv == ["squeue", "--json", "--me"] and e.value.returncode == 1
    assert "squeue --json" in str(e.value) and "Unable to contact slurm controller" in str(e.value)
    with pytest.raises(CommandError):
        b.status(["43"])
    assert len(script.ran("squeue")) == 1       # the error is cached for min_interval
    b.clock.advance(10)
    with pytest.raises(CommandError):
        b.status(["43"])
    assert len(script.ran("squeue")) == 2


def test_unparseable_json_is_a_command_error(script):
    script.on("squeue", "--json", stdout="{not json")
    with pytest.raises(CommandError, match="unparseable JSON"):
        RecordedSlurm(script).status(["1"])


def test_every_state_is_mapped_and_unknown_ones_are_logged(script, caplog):
    assert set(SLURM_STATES.values()) <= set(PILOT_STATES)
    assert set(SQUEUE_CODES.values()) <= set(SLURM_STATES)
    doc = json.loads(recorded("slurm/squeue_running.json"))
    for raw, ours in SLURM_STATES.items():
        doc["jobs"][1]["job_state"] = raw
        s = Script().on("squeue", "--json", stdout=json.dumps(doc))
        assert RecordedSlurm(s).status(["45"])["45"].state == ours, raw
    doc["jobs"][1]["job_state"] = "WARP_DRIVE"
    s = Script().on("squeue", "--json", stdout=json.dumps(doc))
    with caplog.at_level(logging.WARNING, logger="bursarcore.adapters"):
        assert RecordedSlurm(s).status(["45"])["45"].state == "unknown"
    assert "'WARP_DRIVE' is not in the state table" in caplog.text


def test_supply_from_sinfo_and_the_queue(slurm):
    s = slurm.supply()
    assert (s.nodes_total, s.nodes_down, s.slots_total) == (1, 0, 2)
    assert (s.slots_allocated, s.slots_free, s.nodes_free) == (2, 0, 0)   # pilot 43 holds both
    assert (s.pending_jobs, s.pending_slots) == (2, 2)                    # 45 and 46


def test_node_states_and_flags(slurm):
    assert slurm.node_state({"state": "idle", "state_flags": []}) == "free"
    assert slurm.node_state({"state": "mixed", "state_flags": []}) == "partial"
    assert slurm.node_state({"state": "idle", "state_flags": ["DRAIN"]}) == "down"
    assert slurm.node_state({"state": "idle+drain"}) == "down"
    for raw in SLURM_NODE_STATES:
        assert slurm.node_state({"state": raw}) in ("free", "partial", "busy", "down", "unknown")


def test_expected_start_from_squeue_start_then_test_only(script):
    est_now = float(recorded("slurm/now_est.txt"))
    script.on("squeue", "--start", stdout=recorded("slurm/squeue_start_est.txt"))
    script.on("sbatch", "--test-only", stderr=recorded("slurm/sbatch_test_only_est.txt"))
    b = RecordedSlurm(script, wallclock=lambda: est_now)
    t = b.expected_start(1, 120, pending=["53"])
    assert t == 1795975364.0                        # 2026-11-29T18:02:44 UTC
    [call] = [c for c in script.calls if c["argv"][:2] == ["squeue", "--start"]]
    assert call["argv"][-1] == "--jobs=53" and call["env"] == {"TZ": "UTC"}
    t2 = b.expected_start(1, 120)                  # no pilot queued: ask sbatch --test-only
    assert t2 == 1795975484.0                       # 18:04:44, after pilot 53's walltime
    [call] = [c for c in script.calls if c["argv"][:2] == ["sbatch", "--test-only"]]
    assert "--exclusive" in call["argv"] and call["input"].startswith("#!/bin/sh")


def test_expected_start_quirks_na_and_a_year_10193(script):
    # recorded: squeue --start said N/A right after submission, and sbatch --test-only
    # printed a start in the year 10193 while two jobs were queued
    script.on("squeue", "--start", stdout=recorded("slurm/squeue_start.txt"))
    script.on("sbatch", "--test-only", stderr=recorded("slurm/sbatch_test_only.txt"))
    assert "10193-01-13" in recorded("slurm/sbatch_test_only.txt")
    assert RecordedSlurm(script).expected_start(1, 120, pending=["45"]) is None


def test_submit_builds_the_pilot(script):
    script.on("sbatch", "--parsable", stdout="57\n")
    b = RecordedSlurm(script, partition="debug", account="proj", slots_per_node=2)
    assert b.submit(2, 90.0, name="bursar-pilot") == "57"
    [call] = script.calls
    assert call["argv"] == ["sbatch", "--parsable", "--job-name=bursar-pilot", "--nodes=2",
                            "--time=2", "--no-requeue", "--output=/dev/null",
                            "--ntasks-per-node=2", "--partition=debug", "--account=proj"]
    assert "exec sleep infinity" in call["input"]
    script.on("sbatch", "--parsable", stdout="57;othercluster\n")
    assert b.submit(1, 60) == "57"
    script.on("sbatch", "--parsable", rc=1,
              stderr="sbatch: error: Batch job submission failed: Invalid partition name specified")
    with pytest.raises(CommandError, match="Invalid partition name"):
        b.submit(1, 60)


def test_gpu_pilot_and_steps(script):
    script.on("sbatch", "--parsable", stdout="60\n")
    b = RecordedSlurm(script, dim="gpu", gpus_per_node=4)
    b.submit(1, 600)
    assert "--gres=gpu:4" in script.calls[0]["argv"] and "--exclusive" in script.calls[0]["argv"]
    assert b.step_args("60", "n1", 2, False, "s")[-2:] == ["--ntasks=1", "--gres=gpu:2"]
    assert b.step_args("60", "n1", 2, True, "s")[-2:] == ["--ntasks=2", "--gpus-per-task=1"]
    doc = json.loads(recorded("slurm/squeue_running.json"))
    doc["jobs"][0]["gres_detail"] = ["gpu:a100:4(IDX:0-3)"]
    s = Script().on("squeue", "--json", stdout=json.dumps(doc))
    assert RecordedSlurm(s, dim="gpu", gpus_per_node=4).status(["43"])["43"].hosts == (("localhost", 4),)


def _lease_on(node: str, units: int):
    b = Broker(Pool(cpu=0), clock=ManualClock(0.0))
    b.register("a", Envelope(credits=1e9, sustained={"cpu": 64}, ceiling={"cpu": 64}))
    b.add_nodes("cpu", [(node, units)])
    return b.acquire(Intent("a", units={"cpu": units}, duration=600)).lease


def test_launch_is_a_step_on_exactly_the_placement(slurm, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "999")         # as if the broker ran inside a job
    monkeypatch.setenv("SLURM_CONF", "/etc/slurm/slurm.conf")
    lease = _lease_on("43/localhost", 2)
    h = slurm.launch(lease, ["python3", "work.py"], {"TASK": "t1"})
    [p] = slurm.spawned
    assert p.argv == ["srun", "--jobid=43", "--nodelist=localhost", "--nodes=1",
                      f"--job-name=bursar-lease-{lease.id}.0", "--exact", "--kill-on-bad-exit=0",
                      "--ntasks=1", "--cpus-per-task=2", "--", "python3", "work.py"]
    assert p.env["TASK"] == "t1" and p.env["BURSAR_SLOTS"] == "2"
    assert p.env["BURSAR_LEASE_ID"] == str(lease.id) and p.env["BURSAR_PILOT"] == "43"
    assert "SLURM_JOB_ID" not in p.env and p.env["SLURM_CONF"] == "/etc/slurm/slurm.conf"
    assert h.status == "running" and h.exit_code is None
    p.finish(0)
    assert h.status == "completed" and h.exit_code == 0


def test_per_slot_and_overlap(script):
    b = RecordedSlurm(script, step_mode="overlap")
    b.launch(_lease_on("43/localhost", 2), ["true"], per_slot=True)
    argv = b.spawned[0].argv
    assert "--overlap" in argv and "--ntasks=2" in argv and "--cpus-per-task=1" in argv


def test_revoke_signals_the_step_then_kills_it_at_the_deadline(slurm, script):
    lease = _lease_on("43/localhost", 1)
    steps = recorded("slurm/squeue_steps.txt").replace("bursar-lease-0.0", f"bursar-lease-{lease.id}.0")
    script.on("squeue", "--steps", stdout=steps)
    script.on("scancel", stdout="")
    h = slurm.launch(lease, ["sleep", "60"])
    assert slurm.revoke(lease.id, deadline=30.0) == 1
    assert script.ran("scancel")[-1] == ["scancel", "--signal=TERM", "43.1"]
    assert script.ran("squeue", "--steps")[-1][-1] == "--jobs=43"
    assert slurm.enforce() == []
    slurm.clock.advance(30)
    assert slurm.enforce() == [lease.id]
    assert script.ran("scancel")[-1] == ["scancel", "--signal=KILL", "43.1"]
    # the pilot (43) and its other step (43.0) were never named
    assert all(a[-1] == "43.1" for a in script.ran("scancel"))
    slurm.spawned[0].finish(137)
    assert h.status == "revoked" and h.exit_code == 137


def test_revoke_before_the_step_exists_stops_srun(slurm, script):
    script.on("squeue", "--steps", stdout="43.batch|batch\n")
    lease = _lease_on("43/localhost", 1)
    slurm.launch(lease, ["sleep", "60"])
    slurm.revoke(lease.id, deadline=10.0)
    assert slurm.spawned[0].signals == [signal.SIGTERM] and not script.ran("scancel")


def test_launch_needs_an_active_lease(slurm):
    b = Broker(Pool(cpu=0), clock=ManualClock(0.0))
    b.register("a", Envelope(credits=1e9, sustained={"cpu": 8}, ceiling={"cpu": 8}))
    b.add_nodes("cpu", [("43/localhost", 2)])
    lease = b.acquire(Intent("a", units={"cpu": 1}, duration=10)).lease
    b.clock.advance(11)
    b.poll()                                          # the broker sees the expiry
    with pytest.raises(ValueError, match="must be active"):
        slurm.launch(b.lease(lease.id), ["true"])
    with pytest.raises(ValueError, match="argv"):
        slurm.launch(lease, "true")
