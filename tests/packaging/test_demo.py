"""The scripted demonstration reproduces the qualitative claims of SPEC §10 (1, 2, 4), on
a pool that the local binding's pilots provide, and its real processes are launched and
enforced through that binding."""

import signal

import pytest

from bursarcore.broker import BACKENDS
from bursarcore.demo import format_demo, run_demo


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_demo_claims(backend):
    r = run_demo(seconds=1200, backend=backend, processes=False)
    # (1) the storm is held between its sustained rate and its ceiling, and extracts no
    #     more above sustained than its bucket plus refill
    assert r.storm_sustained < r.storm_avg_hold < r.storm_ceiling
    assert r.storm_extracted_above_sustained <= r.storm_bucket + r.storm_refilled
    assert r.storm_extracted_above_sustained > 0.8 * r.storm_bucket  # it did burst
    # (2) the guaranteed interactive campaign is never refused for capacity, p95 ≤ grace
    assert r.interactive_requests > 10
    assert r.interactive_refused_for_capacity == 0
    assert r.interactive_p95 <= 60.0
    # (4) backfill recovers idle capacity
    assert r.utilisation > r.utilisation_no_backfill + 0.2
    text = format_demo(r)
    assert "average hold" in text and "p50 / p95" in text


def test_demo_is_deterministic():
    assert run_demo(seconds=300, backend="reference", processes=False).storm_avg_hold == \
        run_demo(seconds=300, backend="reference", processes=False).storm_avg_hold


def test_demo_pool_comes_from_the_local_binding():
    r = run_demo(seconds=600, processes=False)
    assert (r.pilots, r.pool_nodes) == (8, 64)
    assert r.work_launched > 10                     # every lease's work, simulated
    assert 0 < r.work_killed <= r.work_signalled    # expiries enforced: signal, then kill
    assert r.processes == []


def test_demo_real_processes_run_and_a_revoked_one_is_signalled_then_killed():
    r = run_demo(seconds=300, backend="reference")
    ok, revoked = r.processes
    # a real process on each host of the lease's placement, with the lease's environment
    assert ok["exit_code"] == 0 and ok["status"] == "completed"
    assert len(ok["output"]) == len(ok["placement"])
    for (node, k), text in zip(ok["placement"], ok["output"]):
        pilot, host = node.split("/")
        assert text == f"lease {ok['lease']} pilot {pilot} host {host} slots {k} demo 1"
    # the drained pilot's lease: SIGTERM at once (the process saw it), SIGKILL after 30 s
    assert revoked["signals"] == [signal.SIGTERM] and revoked["noticed"]
    assert "got SIGTERM" in revoked["output"]
    assert revoked["killed"] and revoked["exit_code"] == 128 + signal.SIGKILL
    assert revoked["status"] == "revoked"
    assert revoked["killed_at"] - revoked["drained_at"] == pytest.approx(revoked["grace"])
    text = format_demo(r)
    assert "real processes" in text and "SIGTERM now" in text and "exit 137" in text


def test_demo_command_writes_journal(tmp_path, capsys):
    from bursarcore.__main__ import main
    from bursarcore.journal import import_jsonl

    path = tmp_path / "j.jsonl"
    assert main(["demo", "--seconds", "120", "--backend", "reference", "--no-processes",
                 "--journal", str(path)]) == 0
    out = capsys.readouterr().out
    assert "storm" in out and "utilisation" in out
    assert len(import_jsonl(path)) > 100
