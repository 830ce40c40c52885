"""``squeue --json`` of every Slurm release from 22.05 to 25.11 (tests/fixtures/slurm/, whose
README cites the Slurm source each shape comes from): the same seven jobs must map to the
same states, exit codes, times and hosts whatever the release; and the binding asks only
about its own jobs, and reads the queue's pending demand from text."""

from __future__ import annotations

import json
import pathlib

import pytest

from bursarcore.adapters import CANCELLED, ENDING, FAILED, PENDING, RUNNING
from bursarcore.adapters.slurm import job_exit_code, job_state_name, slurm_number

from bindings_helpers import Script
from test_adapters_slurm_recorded import RecordedSlurm

FIXTURES = pathlib.Path(__file__).parent.parent / "fixtures" / "slurm"
RELEASES = ["22.05", "23.02", "23.11", "24.05", "24.11", "25.05", "25.11"]
START, END = 1795975229.0, 1795975349.0
IDS = ["101", "102", "103", "104", "105", "106", "107", "999"]


def _doc(release: str) -> str:
    return (FIXTURES / f"squeue_{release}.json").read_text()


def _binding(release: str, **kw) -> tuple[RecordedSlurm, Script]:
    s = Script().on("squeue", "--json", "--me", stdout=_doc(release))
    return RecordedSlurm(s, **kw), s


def test_every_release_has_a_fixture_in_its_own_shape():
    shapes = {}
    for r in RELEASES:
        j = json.loads(_doc(r))["jobs"][0]
        shapes[r] = (type(j["job_state"]).__name__, type(j["exit_code"]).__name__,
                     type(j["start_time"]).__name__,
                     "allocation" if isinstance(j["job_resources"].get("nodes"), dict)
                     else "allocated_nodes")
    assert shapes["22.05"] == ("str", "int", "int", "allocated_nodes")
    assert shapes["23.02"] == ("str", "dict", "int", "allocated_nodes")
    assert shapes["23.11"] == ("list", "dict", "dict", "allocated_nodes")
    for r in RELEASES[3:]:
        assert shapes[r] == ("list", "dict", "dict", "allocation"), r


@pytest.mark.parametrize("release", RELEASES)
def test_states_exit_codes_times_and_hosts_in_every_release(release):
    b, script = _binding(release)
    st = b.status(IDS)
    assert set(st) == set(IDS) - {"999"}                  # not listed: gone
    assert [c["argv"] for c in script.calls] == [["squeue", "--json", "--me"]]
    run = st["101"]
    assert (run.state, run.raw, run.exit_code) == (RUNNING, "RUNNING", None)
    assert (run.start, run.end) == (START, END)
    assert run.hosts == (("nid001", 4), ("nid002", 4))
    assert run.reason is None
    pend = st["102"]
    assert (pend.state, pend.start, pend.end, pend.hosts) == (PENDING, None, None, ())
    assert pend.reason == "Priority"
    assert (st["103"].state, st["103"].exit_code, st["103"].reason) == (FAILED, 3, "NonZeroExitCode")
    assert (st["103"].start, st["103"].end) == (START, None)      # end only while running
    assert (st["104"].state, st["104"].exit_code) == (CANCELLED, 128 + 15)
    assert (st["105"].state, st["105"].raw, st["105"].hosts) == (ENDING, "COMPLETING",
                                                                 (("nid003", 2),))
    assert (st["106"].state, st["106"].raw, st["106"].reason) == (PENDING, "REQUEUED", "BeginTime")


@pytest.mark.parametrize("release", RELEASES)
def test_gpu_hosts_from_gres_detail_in_every_release(release):
    b, _ = _binding(release, dim="gpu", gpus_per_node=4)
    assert b.status(["107"])["107"].hosts == (("nid004", 2),)


def test_a_list_state_is_named_as_job_state_string_names_the_bits():
    assert job_state_name("RUNNING") == "RUNNING"
    assert job_state_name(["RUNNING"]) == "RUNNING"
    assert job_state_name(["CANCELLED", "COMPLETING"]) == "COMPLETING"
    assert job_state_name(["PENDING", "REQUEUED"]) == "REQUEUED"
    assert job_state_name(["RUNNING", "SIGNALING", "CONFIGURING"]) == "CONFIGURING"
    assert job_state_name(["FAILED", "LAUNCH_FAILED"]) == "FAILED"    # not a named flag
    assert job_state_name(["PENDING", "EXPEDITING"]) == "EXPEDITING"  # 25.11
    assert job_state_name([]) == "" and job_state_name(None) == ""


def test_numbers_in_every_shape():
    assert slurm_number(5) == 5 and slurm_number(0) == 0 and slurm_number(None) is None
    assert slurm_number({"set": True, "infinite": False, "number": 7}) == 7
    assert slurm_number({"set": False, "infinite": False, "number": 0}) is None   # NO_VAL
    assert slurm_number({"set": False, "infinite": True, "number": 0}) is None    # INFINITE
    assert slurm_number(True) is None


def test_exit_codes_in_every_shape():
    nv = lambda n, s=True: {"set": s, "infinite": False, "number": n}  # noqa: E731
    assert job_exit_code(768) == 3 and job_exit_code(9) == 137 and job_exit_code(None) is None
    assert job_exit_code(nv(25344)) == 99 and job_exit_code(nv(0, False)) is None
    assert job_exit_code({"status": ["ERROR"], "return_code": nv(99),
                          "signal": {"id": nv(0, False), "name": ""}}) == 99
    assert job_exit_code({"status": ["SUCCESS"], "return_code": nv(0)}) == 0
    assert job_exit_code({"status": ["SIGNALED"], "return_code": nv(0, False),
                          "signal": {"id": nv(9), "name": "KILL"}}) == 137
    # a signal given by name only
    assert job_exit_code({"status": "SIGNALED", "signal": {"name": "TERM"}}) == 143
    assert job_exit_code({"status": ["CORE_DUMPED"], "signal": {"id": nv(11)}}) == 139
    assert job_exit_code({"status": ["PENDING"], "return_code": nv(0, False)}) is None


def test_an_unknown_state_in_list_form_is_unknown_not_a_crash(caplog):
    doc = json.loads(_doc("25.11"))
    doc["jobs"][0]["job_state"] = ["SLURM_99_STATE"]
    s = Script().on("squeue", "--json", "--me", stdout=json.dumps(doc))
    st = RecordedSlurm(s).status(["101"])["101"]
    assert st.state == "unknown" and st.raw == "SLURM_99_STATE"


# ---------------------------------------------------------------------------- supply
def test_supply_reads_the_queues_pending_jobs_from_text_recorded_on_22_05():
    pending = (FIXTURES / "squeue_pending_22.05.txt").read_text()
    s = (Script().on("sinfo", "--json", stdout=(pathlib.Path(__file__).parent / "recorded" /
                                               "slurm" / "sinfo.json").read_text())
         .on("squeue", "--noheader", "--states=PENDING", stdout=pending))
    b = RecordedSlurm(s, partition="debug")
    sup = b.supply()
    assert (sup.pending_jobs, sup.pending_slots) == (2, 3)          # 1 + 2 CPUs asked
    (argv,) = s.ran("squeue")
    assert argv == ["squeue", "--noheader", "--states=PENDING", "--format=%i|%P|%C|%D|%b",
                    "--partition=debug"]
    assert not s.ran("squeue", "--json")          # supply never lists the cluster as JSON


def test_supply_counts_pending_gpus_per_node_times_nodes_and_skips_other_partitions():
    # the text form squeue prints for %b in 22.05 and later ("gres:gpu:..."/"gres/gpu:...")
    pending = ("7|gpu|8|2|gres:gpu:4\n8|gpu,long|4|1|gres/gpu:a100:2\n"
               "9|other|4|1|gres:gpu:4\n10|gpu|1|1|N/A\n")
    sinfo = json.dumps({"nodes": []})
    s = Script().on("sinfo", "--json", stdout=sinfo).on("squeue", "--noheader", stdout=pending)
    sup = RecordedSlurm(s, partition="gpu", dim="gpu", gpus_per_node=4).supply()
    assert (sup.pending_jobs, sup.pending_slots) == (3, 4 * 2 + 2 + 0)


def test_an_unreadable_pending_line_is_a_command_error():
    from bursarcore.adapters import CommandError

    s = (Script().on("sinfo", "--json", stdout=json.dumps({"nodes": []}))
         .on("squeue", "--noheader", stdout="7|gpu|many|1|N/A\n"))
    with pytest.raises(CommandError, match="unexpected squeue line"):
        RecordedSlurm(s).supply()


def test_sinfo_node_states_as_a_name_with_flags_or_as_one_list():
    """22.05: ``state`` + ``state_flags``; 23.02 on (data_parser ``PARSER_FLAG_ARRAY
    (NODE_STATES)``, see the README): one list, base state first."""
    from bursarcore.adapters.base import NODE_BUSY, NODE_DOWN, NODE_FREE, NODE_PARTIAL

    b, _ = _binding("25.11")
    assert b.node_state({"state": "idle", "state_flags": []}) == NODE_FREE
    assert b.node_state({"state": "idle", "state_flags": ["DRAIN"]}) == NODE_DOWN
    assert b.node_state({"state": ["IDLE"]}) == NODE_FREE
    assert b.node_state({"state": ["MIXED"]}) == NODE_PARTIAL
    assert b.node_state({"state": ["ALLOCATED", "COMPLETING"]}) == NODE_BUSY
    assert b.node_state({"state": ["IDLE", "DRAIN"]}) == NODE_DOWN
    assert b.node_state({"state": ["IDLE", "NOT_RESPONDING"]}) == NODE_DOWN


def test_supply_takes_partitions_as_a_list_or_a_comma_separated_string():
    nodes = [{"name": "a", "state": ["IDLE"], "cpus": 4, "alloc_cpus": 0, "partitions": ["debug"]},
             {"name": "b", "state": ["MIXED"], "cpus": 4, "alloc_cpus": 1,
              "partitions": "long,debug"},
             {"name": "c", "state": ["IDLE"], "cpus": 4, "alloc_cpus": 0, "partitions": "debugx"}]
    s = (Script().on("sinfo", "--json", stdout=json.dumps({"nodes": nodes}))
         .on("squeue", "--noheader", stdout=""))
    sup = RecordedSlurm(s, partition="debug").supply()
    assert (sup.nodes_total, sup.nodes_free, sup.slots_total, sup.slots_free) == (2, 1, 8, 7)
