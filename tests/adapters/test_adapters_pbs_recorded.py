"""The PBS binding against recorded documents (``tests/fixtures/pbs/``, see its README for
where each comes from), fed through the command seam. No PBS server runs here: these are
the only tests of the PBS binding."""

from __future__ import annotations

import json
import logging
import signal

import pytest

from bursarcore import Broker, Envelope, Intent, ManualClock, Pool
from bursarcore.adapters import (CANCELLED, COMPLETED, ENDING, FAILED, HELD, PENDING,
                                 PILOT_STATES, RUNNING, SUSPENDED, TIMEOUT, CommandError,
                                 PBSBinding, PoolManager)
from bursarcore.adapters.pbs import (PBS_NODE_STATES, PBS_STATES, parse_est_start,
                                     parse_exec_vnode, parse_walltime)

from bindings_helpers import FakeProc, Script, pbs_fixture

NOW = 1699630815.0          # the fixtures' timestamp: Fri 10 Nov 2023 15:40:15 UTC
IDS = [f"41{i:02d}.pbs-head" for i in range(1, 9)]


class RecordedPBS(PBSBinding):
    def __init__(self, script: Script, **kw) -> None:
        kw.setdefault("clock", ManualClock(0.0))
        kw.setdefault("wallclock", lambda: NOW)
        kw.setdefault("ncpus", 64)
        kw.setdefault("ngpus", 4)
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
def pbs(script):
    script.on("qstat", "-x", "-f", "-F", "json", stdout=pbs_fixture("qstat_f.json"))
    script.on("pbsnodes", "-a", "-F", "json", stdout=pbs_fixture("pbsnodes_a.json"))
    script.on("qstat", "-Q", "-f", "-F", "json", stdout=pbs_fixture("qstat_Q.json"))
    script.on("qstat", "-T", "-w", stdout=pbs_fixture("qstat_T_w.txt"))
    return RecordedPBS(script, queue="workq", dim="gpu")


def test_states_of_recorded_jobs(pbs, script):
    st = pbs.status(IDS)
    got = {k.split(".")[0]: (v.state, v.raw) for k, v in st.items()}
    assert got == {"4101": (RUNNING, "R"), "4102": (PENDING, "Q"), "4103": (HELD, "H"),
                   "4104": (TIMEOUT, "F"), "4105": (FAILED, "F"), "4106": (COMPLETED, "F"),
                   "4107": (ENDING, "E"), "4108": (SUSPENDED, "S")}
    [call] = script.calls
    assert call["argv"] == ["qstat", "-x", "-f", "-F", "json", *sorted(IDS)]
    assert call["env"] == {"TZ": "UTC"}           # times parse as UTC


def test_running_pilot_hosts_times_and_exit_codes(pbs):
    st = pbs.status(IDS)
    r = st["4101.pbs-head"]
    assert r.hosts == (("gpu-n01", 4), ("gpu-n02", 4))          # ngpus per host
    assert r.start == 1699629615.0 and r.end == r.start + 3600   # stime + walltime
    assert st["4104.pbs-head"].exit_code == -29 and st["4104.pbs-head"].reason == "walltime"
    assert st["4105.pbs-head"].exit_code == 128 + 15              # 271: SIGTERM
    assert st["4106.pbs-head"].exit_code == 0
    cpu = RecordedPBS(pbs.script)
    assert cpu.status(["4108.pbs-head"])["4108.pbs-head"].hosts == (("bigmem01", 64),)


def test_a_pilot_we_deleted_is_cancelled(pbs, script):
    script.on("qdel", stdout="")
    pbs.cancel(["4105.pbs-head"])
    assert script.ran("qdel") == [["qdel", "4105.pbs-head"]]
    assert pbs.status(["4105.pbs-head"])["4105.pbs-head"].state == CANCELLED


def test_unknown_job_ids_among_known_ones(script):
    # qstat exits non-zero for a purged job but still prints the others
    script.on("qstat", "-x", "-f", "-F", "json", rc=153, stdout=pbs_fixture("qstat_f.json"),
              stderr="qstat: Unknown Job Id 4000.pbs-head\n")
    b = RecordedPBS(script)
    assert set(b.status(["4000.pbs-head", "4101.pbs-head"])) == {"4101.pbs-head"}
    s2 = Script().on("qstat", rc=2, stderr="qstat: cannot connect to server pbs-head (errno=15010)")
    with pytest.raises(CommandError, match="cannot connect to server"):
        RecordedPBS(s2).status(["4101.pbs-head"])


def test_every_state_is_mapped_and_unknown_ones_logged(caplog):
    assert set(PBS_STATES.values()) <= set(PILOT_STATES)
    doc = json.loads(pbs_fixture("qstat_f.json"))
    for raw, ours in PBS_STATES.items():
        if raw == "F":
            continue
        doc["Jobs"]["4102.pbs-head"]["job_state"] = raw
        s = Script().on("qstat", stdout=json.dumps(doc))
        assert RecordedPBS(s).status(["4102.pbs-head"])["4102.pbs-head"].state == ours, raw
    doc["Jobs"]["4102.pbs-head"]["job_state"] = "Z"
    s = Script().on("qstat", stdout=json.dumps(doc))
    with caplog.at_level(logging.WARNING, logger="bursarcore.adapters"):
        assert RecordedPBS(s).status(["4102.pbs-head"])["4102.pbs-head"].state == "unknown"
    assert "pbs: job state 'Z' is not in the state table" in caplog.text


def test_supply_from_pbsnodes_and_the_queue(pbs):
    s = pbs.supply()
    # n01, n02 job-exclusive; n03 free; n04 down; n05 down,offline; n06 free with 1 GPU
    # assigned; n07 resv-exclusive; n08 job-busy
    assert (s.nodes_total, s.nodes_free, s.nodes_down) == (8, 1, 2)
    # job-busy n08 has 2 GPUs unassigned but takes no new job: neither allocated nor free
    assert (s.slots_total, s.slots_allocated, s.slots_free) == (24, 15, 7)
    assert (s.pending_jobs, s.pending_slots) == (3, None)
    cpu = RecordedPBS(pbs.script, queue="workq")
    c = cpu.supply()
    assert (c.slots_total, c.slots_free) == (384, 64 + 48)


def test_node_state_table(pbs):
    for raw, ours in PBS_NODE_STATES.items():
        assert pbs.node_state({"state": raw}) in ("free", "busy", "down"), raw
    assert pbs.node_state({"state": "down,offline"}) == "down"
    assert pbs.node_state({"state": "free", "resources_assigned": {"ngpus": 1}}) == "partial"


def test_expected_start_from_qstat_T(pbs, script):
    t = pbs.expected_start(1, 3600, pending=["4102.pbs-head", "4110.pbs-head"])
    assert t == 1699633200.0                      # "Today 16:20"
    assert script.ran("qstat", "-T")[-1] == ["qstat", "-T", "-w", "4102.pbs-head", "4110.pbs-head"]
    assert pbs.expected_start(1, 3600, pending=["4110.pbs-head"]) == 1699866000.0  # Mon 09:00
    assert pbs.expected_start(1, 3600, pending=["4113.pbs-head"]) == NOW   # "?"; n03 is free
    assert pbs.expected_start(2, 3600) is None    # only one free node, no dry run in PBS


def test_est_start_formats():
    assert parse_est_start("Today 16:20", NOW) == 1699633200.0
    assert parse_est_start("Mon 09:00", NOW) == 1699866000.0      # Mon 13 Nov 2023
    assert parse_est_start("Fri 09:00", NOW) == 1699866000.0 + 4 * 86400  # next Friday
    assert parse_est_start("Fri Dec 01 12:00", NOW) == 1701432000.0
    assert parse_est_start("Wed Jan 10 2024 09:00", NOW) == 1704877200.0
    for unset in ("--", "?", "", "tomorrow-ish"):
        assert parse_est_start(unset, NOW) is None


def test_parsers():
    assert parse_walltime("01:00:04") == 3604 and parse_walltime("05:00") == 300
    assert parse_walltime(None) is None
    assert parse_exec_vnode("(n1:ncpus=2:mem=4194304kb)+(n2:ncpus=2:mem=4194304kb)") == \
        (("n1", 2), ("n2", 2))
    assert parse_exec_vnode("(b[0]:ncpus=32)+(b[1]:ncpus=32:ngpus=1)", "ngpus") == (("b", 1),)


def test_submit_builds_the_pilot(script):
    script.on("qsub", stdout="4120.pbs-head\n")
    b = RecordedPBS(script, queue="workq", account="proj42", dim="gpu")
    assert b.submit(2, 5400, name="bursar-pilot") == "4120.pbs-head"
    [call] = script.calls
    assert call["argv"] == ["qsub", "-N", "bursar-pilot", "-r", "n", "-j", "oe", "-o", "/dev/null",
                            "-l", "select=2:ncpus=64:ngpus=4", "-l", "place=scatter:excl",
                            "-l", "walltime=01:30:00", "-q", "workq", "-A", "proj42"]
    assert call["input"].startswith("#!/bin/sh")
    script.on("qsub", rc=38, stderr="qsub: Job exceeds queue resource limits MSG=...")
    with pytest.raises(CommandError, match="exceeds queue resource limits"):
        b.submit(1, 60)


def _lease_on(placement):
    b = Broker(Pool(gpu=0), clock=ManualClock(0.0))
    b.register("a", Envelope(credits=1e9, sustained={"gpu": 64}, ceiling={"gpu": 64}))
    b.add_nodes("gpu", placement)
    return b.acquire(Intent("a", units={"gpu": sum(k for _, k in placement)}, duration=600)).lease


def test_launch_over_ssh_attached_to_the_pilot(pbs, script):
    lease = _lease_on([("4101.pbs-head/gpu-n01", 4), ("4101.pbs-head/gpu-n02", 2)])
    h = pbs.launch(lease, ["python3", "serve.py", "--port", "8000"], {"MODEL": "x y"},
                   cwd="/work/run 1")
    assert [p.argv[:4] for p in pbs.spawned] == [["ssh", "-o", "BatchMode=yes", "gpu-n01"],
                                                  ["ssh", "-o", "BatchMode=yes", "gpu-n02"]]
    remote = pbs.spawned[1].argv[4]
    assert remote.startswith("cd '/work/run 1' && echo $$ > ${TMPDIR:-/tmp}/bursar-4101.pbs-head-lease-")
    assert f"BURSAR_LEASE_ID={lease.id}" in remote and "BURSAR_SLOTS=2" in remote
    assert "MODEL='x y'" in remote
    assert remote.endswith("pbs_attach -j 4101.pbs-head python3 serve.py --port 8000")
    assert len(h.parts) == 2 and h.status == "running"
    script.on("ssh", stdout="")
    pbs.revoke(lease.id, deadline=20.0)
    kills = script.ran("ssh")
    assert [k[3] for k in kills] == ["gpu-n01", "gpu-n02"]
    assert kills[0][4].startswith("kill -s TERM -- -$(cat ${TMPDIR:-/tmp}/bursar-4101.pbs-head-lease-")
    pbs.clock.advance(20)
    pbs.enforce()
    assert script.ran("ssh")[-1][4].startswith("kill -s KILL")
    assert all(signal.SIGKILL in p.signals for p in pbs.spawned)   # and the ssh clients


def test_pool_manager_over_recorded_pbs(script):
    """The manager, driven through the seam: the running pilot's GPUs join the pool."""
    script.on("qsub", stdout="4101.pbs-head\n")
    script.on("qstat", "-x", "-f", "-F", "json", stdout=pbs_fixture("qstat_f.json"))
    clock = ManualClock(0.0)
    b = Broker(Pool(gpu=0), clock=clock)
    pbs = RecordedPBS(script, dim="gpu", clock=clock)
    m = PoolManager(b, pbs, nodes_per_pilot=2, walltime=3600, min_pilots=1, max_pilots=1)
    rep = m.tick()
    assert rep.submitted == ["4101.pbs-head"]
    clock.advance(10)
    rep = m.tick()
    assert rep.joined == ["4101.pbs-head"]
    assert b.state()["pool"]["gpu"]["capacity"] == 8
    assert b.pool.slot_map["gpu"] == [("4101.pbs-head/gpu-n01", 4), ("4101.pbs-head/gpu-n02", 4)]
    # its walltime ends 2400 s after the fixture's "now": drained 360 s before (10 %)
    assert m.pilots["4101.pbs-head"].ends_at == pytest.approx(10 + 2400)
