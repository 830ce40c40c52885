"""The simulator's pool comes from the local binding, as a deployment's comes from Slurm
(SPEC §12): pilots join the empty broker with ``add_nodes``, leases are placed on their
hosts, work is launched (simulated, no process) and enforced through the binding, and a
pilot that ends mid-run revokes its leases with notice — counted in the report."""

from __future__ import annotations

import json
import subprocess

import pytest

from bursarcore.sim import Simulation, write_outputs
from bursarcore.sim.scenario import ScenarioError

from .conftest import short_default

TINY = {"scenario.duration": 1200.0, "tasksets.science.count": 300,
        "tasksets.science.arrival_window": 1000.0,
        "campaigns.storm.behaviour.start": 300.0, "campaigns.storm.behaviour.end": 900.0}


@pytest.fixture
def no_spawn(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError(f"the simulator started a process: {a!r}")
    monkeypatch.setattr(subprocess, "Popen", refuse)


def test_pool_is_fed_by_the_binding(short_result):
    """The broker starts empty; the pilots' nodes join it (journaled add_nodes)."""
    recs = list(short_result.journal)
    assert recs[0]["op"] == "config"
    assert recs[0]["payload"]["pool"]["capacity"]["gpu"] == 0          # starts empty
    joins = [r for r in recs if r["op"] == "add_nodes"]
    assert [r["payload"]["nodes"] for r in joins[:2]] == [[["local1/localhost", 8]],
                                                          [["local2/localhost", 8]]]
    assert all(r["seq"] < next(x["seq"] for x in recs if x["op"] == "register")
               for r in joins)                    # the pool is there before campaigns
    fac = short_result.summary["facility"]
    assert fac["binding"] == "local" and fac["execution"] == "simulated"
    assert fac["pilots"] == 64 and fac["pilots_joined"] == 64 and fac["pilots_ended"] == {}
    assert fac["capacity_changes"] == [[0.0, 0], [0.0, 512]]
    assert short_result.summary["journal"]["ops"]["add_nodes"] == 64
    # every lease's work went through the binding; expiries were signalled and killed
    assert fac["work_launched"] > 100 and fac["work_parts"] >= fac["work_launched"]
    assert fac["work_signalled"] > 0 and fac["work_killed"] > 0
    assert fac["leases_revoked_by_pool"] == 0


def test_pilot_nodes_carry_the_placements(no_spawn):
    sim = Simulation(short_default(**TINY))
    assert sim.broker.pool.capacity["gpu"] == 512
    nodes = sim.broker.pool.slot_map["gpu"]
    assert len(nodes) == 64 and nodes[0] == ("local1/localhost", 8)
    sim.run()
    assert sim.work
    for lid, h in list(sim.work.items())[:50]:
        for part in h.parts:
            assert part.pilot_id.startswith("local") and part.host == "localhost"
            assert part.env["BURSAR_LEASE_ID"] == str(lid)


def test_node_failure_revokes_with_notice_and_the_report_counts_it(no_spawn, tmp_path):
    base = Simulation(short_default(**TINY)).run()
    sc = short_default(**TINY, **{"facility.failures": [{"at": 600.0, "pilots": 4}],
                                  "facility.start_delay": 120.0})
    sim = Simulation(sc)
    res = sim.run()
    fac = res.summary["facility"]
    assert fac["pilots_failed"] == 4 and fac["pilots_left"] == 4
    assert fac["pilots_ended"] == {"failed": 4}
    assert fac["pilots_submitted"] == 68 and fac["pilots_joined"] == 68   # replaced
    assert fac["capacity_changes"][2:] == [[600.0, 480], [720.0, 512]]     # queue wait 120 s
    n = fac["leases_revoked_by_pool"]
    assert n > 0
    # each of those leases got a preempt notice (counted per campaign) and its work the kill
    preempted = sum(d["preempted"] for d in res.summary["campaigns"].values())
    base_preempted = sum(d["preempted"] for d in base.summary["campaigns"].values())
    assert preempted >= base_preempted + n
    ops = res.summary["journal"]["ops"]
    assert ops["remove_nodes"] == 4 and ops["add_nodes"] == 68
    ran = [lid for lid in sim.fac["revoked"] if lid in sim.work]   # (not those starting)
    assert ran
    for lid in ran:
        h = sim.work[lid]
        assert h.status == "revoked" and all(p.killed for p in h.parts), lid
    paths = write_outputs(res, tmp_path, journal=False)
    html = open(paths["report"], encoding="utf-8").read()
    assert "Facility (SPEC §12)" in html and "node failures: 4 at 600 s" in html
    assert json.load(open(paths["summary"]))["summary"]["facility"][
        "leases_revoked_by_pool"] == n


def test_walltime_drains_ahead_and_replacements_join(no_spawn):
    sc = short_default(**TINY, **{"facility.walltime": 1000.0, "facility.start_delay": 30.0})
    res = Simulation(sc).run()
    fac = res.summary["facility"]
    # first walltimes staggered over [500, 1000] s; drained 100 s (10 %) ahead
    assert fac["pilots_drained"] >= 64 and fac["pilots_ended"].get("timeout", 0) >= 60
    assert fac["pilots_joined"] > 64
    assert fac["leases_revoked_by_pool"] > 0
    assert 400 <= fac["capacity_min"] < 512


def test_default_numbers_do_not_depend_on_the_pilot_shape():
    """Pilots that outlive the run change placements, not admission."""
    a = Simulation(short_default(**TINY)).run().summary
    b = Simulation(short_default(**TINY, **{"facility.slots_per_node": 4,
                                            "facility.nodes_per_pilot": 8})).run().summary
    assert b["facility"]["pilots"] == 16
    for name, d in a["campaigns"].items():
        assert b["campaigns"][name]["credits_spent"] == pytest.approx(d["credits_spent"])
        assert b["campaigns"][name]["mean_held"] == pytest.approx(d["mean_held"])


@pytest.mark.parametrize("change, field", [
    ({"facility.slots_per_node": 7}, "facility.slots_per_node"),
    ({"facility.nodes_per_pilot": 5}, "facility.nodes_per_pilot"),
    ({"facility.on_notice": "pray"}, "facility.on_notice"),
    ({"facility.tick": 0}, "facility.tick"),
    ({"facility.failures": [{"pilots": 1}]}, "facility.failures[0].at"),
    ({"facility.failures": [{"at": 10, "pilots": 65}]}, "facility.failures[0].pilots"),
    ({"facility.colour": "blue"}, "facility.colour"),
])
def test_facility_validation_names_the_field(change, field):
    with pytest.raises(ScenarioError) as e:
        short_default(**change)
    assert e.value.field == field


def test_adaptive_agent_with_an_unbounded_bucket(short):
    """supply() reports an unbounded bucket's tokens as inf; the adaptive agent sizes its
    pipeline from them and must take that as "tokens never limit me"."""
    sc = short(**{"scenario.duration": 600.0, "tasksets.science.count": 200,
                  "tasksets.science.arrival_window": 500.0,
                  "campaigns.storm.behaviour.start": 100.0,
                  "campaigns.storm.behaviour.end": 300.0,
                  "campaigns.adaptive-sci.envelope.burst.gpu": "unlimited"})
    res = Simulation(sc).run()
    a = next(d for d in res.summary["campaigns"].values() if d["agent"] == "adaptive")
    assert a["plans"] > 0 and a["completed"] > 0
