"""``bursar-run`` and the Slurm submission module, with the command seam faked.

Checks the JSONL validation (errors name file, line and field), the ``sbatch`` argv and
batch script of each tier, that nothing is written before everything is checked, the
``jobs.json`` record, status (counts per state and tier, array states from recorded
``squeue --json``, stranded tiers, the TTY redraw), cancel and requeue-failed. The
generated batch script is also run with bash (no Slurm) to check that it ``exec``\\ s the
wrapper, so a SIGTERM sent to the batch shell reaches the worker.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from bursarcore.adapters.base import CommandError
from bursarcore.errors import InvalidArgument
from bursarcore.runtime import QueueConfig, TaskQueue
from bursarcore.runtime.cli import main, read_tasks
from bursarcore.runtime.slurm import (ArraySpec, SlurmArrays, batch_script, count_task_string,
                                      load_jobs, parse_tiers, parse_time, sbatch_argv)
from bursarcore.runtime.wrapper import BOOTSTRAP


class FakeSlurm(SlurmArrays):
    """Records every command; answers sbatch with ids 101, 102 ...; squeue with ``doc``."""

    def __init__(self, doc: dict | None = None, fail: str | None = None) -> None:
        super().__init__()
        self.inputs: list[str | None] = []
        self.doc = doc or {"jobs": []}
        self.fail = fail
        self.next_id = 100

    def execute(self, argv, *, input=None):
        self.commands.append(list(argv))
        self.inputs.append(input)
        if argv[0] == self.fail:
            raise CommandError(argv, 1, "sbatch: error: Batch job submission failed")
        out = ""
        if argv[0] == "sbatch":
            self.next_id += 1
            out = f"{self.next_id}\n"
        elif argv[0] == "squeue":
            out = json.dumps(self.doc)
        return subprocess.CompletedProcess(list(argv), 0, out, "")


def write_tasks(path, lines) -> str:
    path.write_text("".join((ln if isinstance(ln, str) else json.dumps(ln)) + "\n"
                            for ln in lines))
    return str(path)


def run_cli(*argv: str, slurm: FakeSlurm | None = None) -> tuple[int, str]:
    out = io.StringIO()
    rc = main(list(argv), slurm=slurm or FakeSlurm(), out=out)
    return rc, out.getvalue()


# ---------------------------------------------------------------------- JSONL
def test_read_tasks_accepts_ids_payloads_tiers_and_blank_lines(tmp_path):
    f = write_tasks(tmp_path / "t.jsonl", [{"id": "a", "payload": {"steps": 3}}, "",
                                          {"id": "b", "tier": 1}, {"id": "c_1-x", "payload": [1]}])
    assert read_tasks(f, tiers=2) == [("a", {"steps": 3}, 0), ("b", None, 1), ("c_1-x", [1], 0)]


@pytest.mark.parametrize("lines, field, rule", [
    (['{"id": "a"}', "{not json"], ":2", "one JSON object per line"),
    (["[1, 2]"], ":1", "must be a JSON object"),
    ([{"payload": 1}], ":1 id", "is required"),
    ([{"id": "a.b"}], ":1 id", "must match"),
    ([{"id": 7}], ":1 id", "must match"),
    ([{"id": "a", "tier": 2}], ":1 tier", "must be an integer in [0, 2)"),
    ([{"id": "a", "tier": True}], ":1 tier", "must be an integer"),
    ([{"id": "a", "priority": 3}], ":1 priority", "unknown key"),
    ([{"id": "a"}, {"id": "b"}, {"id": "a"}], ":3 id", "duplicate of line 1"),
])
def test_read_tasks_errors_name_the_line_and_field(tmp_path, lines, field, rule):
    f = write_tasks(tmp_path / "t.jsonl", lines)
    with pytest.raises(InvalidArgument) as e:
        read_tasks(f, tiers=2)
    assert e.value.field == f + field
    assert rule in e.value.rule


def test_read_tasks_empty_or_missing_file(tmp_path):
    f = write_tasks(tmp_path / "t.jsonl", ["", "  "])
    with pytest.raises(InvalidArgument, match="has no tasks"):
        read_tasks(f)
    with pytest.raises(InvalidArgument, match="cannot be read") as e:
        read_tasks(str(tmp_path / "nope.jsonl"))
    assert e.value.field == "TASKS"


# ---------------------------------------------------------------------- parsing
@pytest.mark.parametrize("text, secs", [("30", 1800), ("1:30", 90), ("00:30:00", 1800),
                                        ("1-2", 93600), ("1-02:03", 93780),
                                        ("2-00:00:05", 172805)])
def test_parse_time(text, secs):
    assert parse_time(text) == secs


@pytest.mark.parametrize("text", ["", "abc", "1:2:3:4", "0", "00:00:00", "-5"])
def test_parse_time_rejects(text):
    with pytest.raises(InvalidArgument) as e:
        parse_time(text)
    assert e.value.field == "time"


def test_parse_tiers():
    assert parse_tiers(None) == [None]
    assert parse_tiers("mem=2G,8g") == ["2G", "8G"]
    assert parse_tiers("mem=512M,1G,1G") == ["512M", "1G", "1G"]
    for bad, rule in (("2G,8G", "mem=2G,8G"), ("cpu=2", "mem=2G,8G"), ("mem=2X", "<n>"),
                      ("mem=8G,2G", "must not decrease"), ("mem=", "<n>")):
        with pytest.raises(InvalidArgument, match=rule.replace("=", "=")) as e:
            parse_tiers(bad)
        assert e.value.field == "tiers"


@pytest.mark.parametrize("text, n", [("2-5%2", 4), ("0", 1), ("1,3-4", 3), ("0-9:2", 5),
                                     ("0-39%4", 40), ("", 0)])
def test_count_task_string(text, n):
    assert count_task_string(text) == n


# ---------------------------------------------------------------------- sbatch + script
def test_sbatch_argv_of_a_tier():
    s = ArraySpec(queue="/shared/q", tier=1, workers=8, max_running=3, mem="8G",
                  time="00:30:00", grace=45, partition="debug", cpus_per_task=2)
    assert sbatch_argv(s) == [
        "sbatch", "--parsable", "--job-name=bursar-q-t1", "--array=0-7%3", "--requeue",
        "--open-mode=append", "--signal=B:TERM@45", "--output=/shared/q/logs/%A_%a.out",
        "--mem=8G", "--time=00:30:00", "--partition=debug", "--cpus-per-task=2"]
    bare = sbatch_argv(ArraySpec(queue="/q", workers=1))
    assert "--array=0-0" in bare and not any(a.startswith(("--mem", "--time")) for a in bare)


def test_batch_script_execs_the_wrapper_around_the_tier_worker():
    s = ArraySpec(queue="/shared/q", tier=1, workers=2, time="10", grace=30, max_restarts=5,
                  requeue="admin", worker_options=("--runner", "bwrap"),
                  python="/opt/py/bin/python", python_path="/src dir")
    text = batch_script(s)
    assert text.startswith("#!/bin/bash\n")
    assert "export PYTHONPATH='/src dir'${PYTHONPATH:+:$PYTHONPATH}\n" in text
    [line] = [ln for ln in text.splitlines() if not ln.startswith(("#", "export"))]
    assert line.startswith("exec /opt/py/bin/python -c ")
    assert "--max-restarts 5 --requeue admin --stop-file /shared/q/cancelled --queue /shared/q " \
           "--resubmit /shared/q/slurm/tier1.json --max-resubmits 3 -- " \
           "/opt/py/bin/python -m " \
           "bursarcore.runtime.worker --queue /shared/q --tier 1 --grace 15 --runner bwrap " \
           '--walltime-end "$(( $(date +%s) + 600 ))"' in line
    no_time = batch_script(ArraySpec(queue="/q", python_path=None))
    assert "--walltime-end" not in no_time and "PYTHONPATH" not in no_time
    # the agent gets half the warning by default (the rest is for the checkpoint)
    assert batch_script(ArraySpec(queue="/q", grace=60)).endswith("--grace 30\n")
    tuned = batch_script(ArraySpec(queue="/q", time="10", grace=60, agent_grace=50,
                                   checkpoint_margin=90))
    assert "--grace 50 --checkpoint-margin 90 " in tuned


@pytest.mark.parametrize("kw, field", [
    ({"queue": "relative/q"}, "queue"),
    ({"workers": 0}, "workers"),
    ({"max_running": 0}, "max_running"),
    ({"grace": 0}, "grace"),
    ({"grace": 70000}, "grace"),
    ({"time": "1", "grace": 60}, "grace"),
    ({"time": "2", "grace": 30}, "time"),     # 120 s: not longer than the worker's margin
    ({"time": "2", "grace": 30, "checkpoint_margin": 200}, "time"),
    ({"grace": 30, "agent_grace": 30}, "agent_grace"),
    ({"agent_grace": -1}, "agent_grace"),
    ({"mem": "lots"}, "mem"),
    ({"requeue": "auto"}, "requeue"),
    ({"tier": -1}, "tier"),
])
def test_array_spec_rules(kw, field):
    with pytest.raises(InvalidArgument) as e:
        ArraySpec(**{"queue": "/q", **kw})
    assert e.value.field == field


FAKE_WORKER = textwrap.dedent('''\
    import json, signal, sys, time
    out = sys.argv[1]
    def on_term(signum, frame):
        open(out + ".term", "w").write(signal.Signals(signum).name[3:])
        sys.exit(99)
    for s in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(s, on_term)
    json.dump(sys.argv[2:], open(out, "w"))
    if "--queue" in sys.argv and sys.argv[sys.argv.index("--queue") + 1].endswith("wait"):
        time.sleep(30)
    sys.exit(0)
''')


def _script_rig(tmp_path, queue_name: str, sig: str = "TERM"):
    worker = tmp_path / "worker.py"
    worker.write_text(FAKE_WORKER)
    seen = tmp_path / "argv.json"
    spec = ArraySpec(queue=str(tmp_path / queue_name), time="00:05:00", grace=20, signal=sig,
                     worker_cmd=(sys.executable, str(worker), str(seen)))
    script = tmp_path / "job.sh"
    script.write_text(batch_script(spec))
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "scontrol").write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path}/scontrol\n")
    (bindir / "scontrol").chmod(0o755)
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}",
           "SLURM_ARRAY_JOB_ID": "9", "SLURM_ARRAY_TASK_ID": "2", "SLURM_JOB_ID": "11"}
    return script, seen, env


def test_batch_script_runs_the_worker_with_its_walltime(tmp_path):
    script, seen, env = _script_rig(tmp_path, "q")
    t0 = time.time()
    cp = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True,
                        timeout=60)
    assert cp.returncode == 0, cp.stderr
    argv = json.loads(seen.read_text())
    assert argv[:6] == ["--queue", str(tmp_path / "q"), "--tier", "0", "--grace", "10"]
    end = int(argv[argv.index("--walltime-end") + 1])
    assert t0 + 300 - 5 <= end <= time.time() + 300 + 5


def test_batch_script_sigterm_to_the_batch_shell_reaches_the_worker(tmp_path):
    """--signal=B:TERM signals the batch shell only: the script execs the wrapper, which
    forwards to the worker and requeues this array task."""
    script, seen, env = _script_rig(tmp_path, "wait")
    p = subprocess.Popen(["bash", str(script)], env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not seen.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert seen.exists(), "worker did not start"
    os.kill(p.pid, signal.SIGTERM)            # the batch shell's pid, as slurmstepd does
    _, err = p.communicate(timeout=30)
    assert p.returncode == 99, err
    assert (tmp_path / "argv.json.term").read_text() == "TERM"
    assert (tmp_path / "scontrol").read_text().split() == ["requeue", "9_2"]
    assert BOOTSTRAP


@pytest.mark.parametrize("sig", ["USR1", "USR2"])
def test_batch_script_warning_signal_reaches_the_worker_as_it_came(tmp_path, sig):
    """With --signal USR1@S the batch shell gets SIGUSR1 (whose default action would kill
    it): the wrapper treats it like SIGTERM, forwards it, and requeues after exit 99; the
    worker is told (--stop-signal) to treat it like SIGTERM."""
    script, seen, env = _script_rig(tmp_path, "wait", sig)
    p = subprocess.Popen(["bash", str(script)], env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not seen.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert seen.exists(), "worker did not start"
    os.kill(p.pid, getattr(signal, f"SIG{sig}"))
    _, err = p.communicate(timeout=30)
    assert p.returncode == 99, err
    assert (tmp_path / "argv.json.term").read_text() == sig
    assert (tmp_path / "scontrol").read_text().split() == ["requeue", "9_2"]
    argv = json.loads(seen.read_text())
    assert argv[argv.index("--stop-signal") + 1] == sig
    assert f"SIG{sig}: forwarding to worker" in err


def test_submit_signal_sets_the_sbatch_warning_and_the_stop_signal(tmp_path):
    f = write_tasks(tmp_path / "t.jsonl", [{"id": "a"}])
    slurm = FakeSlurm()
    rc, out = run_cli("submit", f, "--queue", str(tmp_path / "q"), "--workers", "2",
                      "--time", "30:00", "--signal", "USR1@90", slurm=slurm)
    assert rc == 0, out
    [sbatch] = [c for c in slurm.commands if c[0] == "sbatch"]
    assert "--signal=B:USR1@90" in sbatch
    script = slurm.inputs[slurm.commands.index(sbatch)]
    assert script.count("--stop-signal USR1") == 2  # the wrapper's and the worker's
    assert "signal.SIGUSR1" in script and "--grace 45" in script  # agent grace: half of 90
    rc, out = run_cli("submit", f, "--queue", str(tmp_path / "q2"), "--workers", "1",
                      "--signal", "sigterm@30", "--grace", "30", slurm=FakeSlurm())
    assert rc == 0, out


@pytest.mark.parametrize("extra,why", [
    (["--signal", "HUP@10"], "one of TERM, USR1, USR2"),
    (["--signal", "USR1"], "SIG@SECONDS"),
    (["--signal", "USR1@0"], "[1, 65535]"),
    (["--signal", "USR2@70000"], "[1, 65535]"),
    (["--signal", "USR1@90", "--grace", "30"], "disagrees"),
])
def test_submit_bad_signal_is_refused_before_any_change(tmp_path, capsys, extra, why):
    f = write_tasks(tmp_path / "t.jsonl", [{"id": "a"}])
    slurm = FakeSlurm()
    rc, _ = run_cli("submit", f, "--queue", str(tmp_path / "q"), "--workers", "1",
                    "--time", "30:00", *extra, slurm=slurm)
    err = capsys.readouterr().err
    assert rc == 2 and "--signal" in err and why in err, err
    assert slurm.commands == [] and not (tmp_path / "q").exists()


# ---------------------------------------------------------------------- submit
def test_submit_creates_the_queue_and_one_array_per_tier(tmp_path):
    q = tmp_path / "q"
    f = write_tasks(tmp_path / "t.jsonl", [{"id": f"t{i}", "payload": {"steps": i}}
                                           for i in range(5)] + [{"id": "big", "tier": 1}])
    slurm = FakeSlurm()
    rc, out = run_cli("submit", f, "--queue", str(q), "--workers", "4,2", "--max-running",
                      "2", "--tiers", "mem=2G,8G", "--promote-after", "2", "--time", "30",
                      "--grace", "40", "--runner", "bwrap", slurm=slurm)
    assert rc == 0, out
    tq = TaskQueue(q)
    assert tq.config.tiers == 2 and tq.config.promote_after == 2
    assert tq.counts() == {"pending": 6, "claimed": 0, "done": 0, "failed": 0}
    assert tq.counts_by_tier()["pending"] == {0: 5, 1: 1}
    sb = [c for c in slurm.commands if c[0] == "sbatch"]
    assert len(sb) == 2
    assert "--array=0-3%2" in sb[0] and "--mem=2G" in sb[0] and "--signal=B:TERM@40" in sb[0]
    assert "--array=0-1%2" in sb[1] and "--mem=8G" in sb[1]
    scripts = [i for c, i in zip(slurm.commands, slurm.inputs) if c[0] == "sbatch"]
    assert "--tier 0 " in scripts[0] and "--tier 1 " in scripts[1]
    assert all("--runner bwrap" in s for s in scripts)
    assert "tier 0: array 101" in out and "tier 1: array 102" in out
    jobs = load_jobs(str(q))
    assert [(j["job_id"], j["tier"], j["mem"]) for j in jobs] == [("101", 0, "2G"), ("102", 1, "8G")]
    assert (q / "logs").is_dir()
    assert (q / "slurm" / "101.sh").read_text() == scripts[0]
    # submitting again adds nothing to the queue, and records the new arrays
    rc, out = run_cli("submit", f, "--queue", str(q), "--workers", "1", "--tiers", "mem=2G,8G",
                      "--promote-after", "2", slurm=slurm)
    assert rc == 0 and "0 new task(s), 6 already queued" in out
    assert len(load_jobs(str(q))) == 4


def test_submit_dry_run_writes_and_submits_nothing(tmp_path):
    q = tmp_path / "q"
    f = write_tasks(tmp_path / "t.jsonl", [{"id": "a"}])
    slurm = FakeSlurm()
    rc, out = run_cli("submit", f, "--queue", str(q), "--workers", "3", "--tiers", "mem=1G,4G",
                      "--dry-run", slurm=slurm)
    assert rc == 0
    assert slurm.commands == [] and not q.exists()
    assert out.count("sbatch --parsable") == 2 and out.count("#!/bin/bash") == 2
    assert "--array=0-2 " in out and "--mem=4G" in out


@pytest.mark.parametrize("extra, msg", [
    (["--workers", "0"], "workers"),
    (["--workers", "2,2,2"], "one per tier"),
    (["--workers", "2", "--tiers", "mem=big"], "tiers"),
    (["--workers", "2", "--time", "1", "--grace", "90"], "grace"),
    (["--workers", "2", "--promote-after", "0"], "promote_after"),
])
def test_submit_bad_arguments_change_nothing(tmp_path, capsys, extra, msg):
    q = tmp_path / "q"
    f = write_tasks(tmp_path / "t.jsonl", [{"id": "a"}])
    slurm = FakeSlurm()
    rc, _ = run_cli("submit", f, "--queue", str(q), *extra, slurm=slurm)
    assert rc == 2
    assert msg in capsys.readouterr().err
    assert slurm.commands == [] and not q.exists()


def test_submit_bad_line_changes_nothing(tmp_path, capsys):
    q = tmp_path / "q"
    f = write_tasks(tmp_path / "t.jsonl", [{"id": "a"}, {"id": "b/c"}])
    slurm = FakeSlurm()
    assert run_cli("submit", f, "--queue", str(q), "--workers", "1", slurm=slurm)[0] == 2
    assert f"{f}:2 id: must match" in capsys.readouterr().err
    assert slurm.commands == [] and not q.exists()


def test_submit_to_a_queue_with_other_settings_is_refused(tmp_path, capsys):
    q = tmp_path / "q"
    TaskQueue.create(q, QueueConfig(tiers=1))
    f = write_tasks(tmp_path / "t.jsonl", [{"id": "a"}])
    rc, _ = run_cli("submit", f, "--queue", str(q), "--workers", "1", "--tiers", "mem=1G,2G")
    assert rc == 2 and "exists with other settings" in capsys.readouterr().err


def test_sbatch_failure_is_exit_1_with_the_command(tmp_path, capsys):
    f = write_tasks(tmp_path / "t.jsonl", [{"id": "a"}])
    rc, _ = run_cli("submit", f, "--queue", str(tmp_path / "q"), "--workers", "1",
                    slurm=FakeSlurm(fail="sbatch"))
    assert rc == 1
    err = capsys.readouterr().err
    assert "sbatch --parsable" in err and "Batch job submission failed" in err


# ---------------------------------------------------------------------- status
def squeue_doc(job: int) -> dict:
    return {"jobs": [
        {"job_id": job + 1, "array_job_id": job, "array_task_id": 0, "array_task_string": "",
         "job_state": "RUNNING", "restart_cnt": 2},
        {"job_id": job + 2, "array_job_id": job, "array_task_id": 1, "array_task_string": "",
         "job_state": "COMPLETED", "restart_cnt": 0},
        {"job_id": job, "array_job_id": job, "array_task_id": None,
         "array_task_string": "2-5%2", "job_state": "PENDING", "restart_cnt": 0},
        {"job_id": 999, "array_job_id": 0, "array_task_id": None, "job_state": "RUNNING"},
    ]}


def _queue_with_work(tmp_path) -> str:
    q = TaskQueue.create(tmp_path / "q", QueueConfig(tiers=2, max_failures=1))
    q.put_many([("a", None), ("b", None), ("c", None), ("d", None, 1)])
    c = q.claim(0)
    q.complete(c, {"ok": 1})
    c = q.claim(0)
    assert q.fail(c, "boom") == "failed"
    q.claim(0)
    return str(tmp_path / "q")


def test_status_counts_and_array_states(tmp_path):
    q = _queue_with_work(tmp_path)
    slurm = FakeSlurm(squeue_doc(101))
    from bursarcore.runtime.slurm import record_jobs
    record_jobs(q, [{"job_id": "101", "tier": 0, "workers": 6, "mem": None},
                    {"job_id": "55", "tier": 1, "workers": 1, "mem": None}])
    rc, out = run_cli("status", "--queue", q, "--json", slurm=slurm)
    assert rc == 0
    st = json.loads(out)
    assert st["counts"] == {"pending": 1, "claimed": 1, "done": 1, "failed": 1}
    assert st["by_tier"]["pending"] == {"0": 0, "1": 1}
    a101, a55 = st["arrays"]
    assert a101["states"] == {"RUNNING": 1, "COMPLETED": 1, "PENDING": 4}
    assert a101["restarts"] == 2 and a101["live"] is True
    assert a55["states"] == {} and a55["live"] is False
    assert st["stranded"] == [1]               # tier 1 has a pending task, no live array
    assert st["finished"] is False
    # a live tier-1 array serves tier 0 too (workers steal down), not the reverse
    only_big = FakeSlurm({"jobs": [{"job_id": 55, "array_job_id": 55, "array_task_id": 0,
                                    "job_state": "RUNNING"}]})
    assert json.loads(run_cli("status", "--queue", q, "--json",
                              slurm=only_big)[1])["stranded"] == []
    rc, text = run_cli("status", "--queue", q, slurm=slurm)
    assert "tier 1" in text and "PENDING 4" in text and "requeued 2x" in text
    assert "note: tier 1 has unfinished tasks and no live array" in text


def test_status_watch_redraws_on_a_tty_and_stops_when_finished(tmp_path):
    q = TaskQueue.create(tmp_path / "q")
    q.put("a")
    q.complete(q.claim(0), 1)

    class Tty(io.StringIO):
        def isatty(self):
            return True

    out = Tty()
    assert main(["status", "--queue", str(tmp_path / "q"), "--watch", "--interval", "0.01"],
                slurm=FakeSlurm(), out=out) == 0
    text = out.getvalue()
    assert text.startswith("\x1b[H\x1b[J") and "finished" in text
    plain = io.StringIO()
    main(["status", "--queue", str(tmp_path / "q"), "--watch"], slurm=FakeSlurm(), out=plain)
    assert "\x1b[" not in plain.getvalue() and plain.getvalue().startswith("--- ")


def test_status_of_a_missing_queue_is_exit_2(tmp_path, capsys):
    assert run_cli("status", "--queue", str(tmp_path / "nope"))[0] == 2
    assert "no queue.json" in capsys.readouterr().err


def test_status_survives_slurm_errors(tmp_path):
    q = _queue_with_work(tmp_path)
    from bursarcore.runtime.slurm import record_jobs
    record_jobs(q, [{"job_id": "101", "tier": 0}])
    rc, out = run_cli("status", "--queue", q, slurm=FakeSlurm(fail="squeue"))
    assert rc == 0 and "slurm: unavailable" in out and "total" in out


# ---------------------------------------------------------------------- cancel, requeue
def test_cancel_scancels_the_recorded_arrays(tmp_path):
    q = _queue_with_work(tmp_path)
    slurm = FakeSlurm()
    rc, out = run_cli("cancel", "--queue", q, slurm=slurm)
    assert rc == 0 and "no arrays recorded" in out and slurm.commands == []
    from bursarcore.runtime.slurm import record_jobs
    record_jobs(q, [{"job_id": "101", "tier": 0}, {"job_id": "102", "tier": 1}])
    rc, out = run_cli("cancel", "--queue", q, slurm=slurm)
    assert rc == 0 and slurm.commands == [["scancel", "101", "102"]]
    # the stop file keeps the wrappers that get scancel's SIGTERM from requeueing
    assert json.loads((tmp_path / "q" / "cancelled").read_text())["arrays"] == ["101", "102"]
    # submitting again resumes the campaign: the stop file goes
    f = write_tasks(tmp_path / "t.jsonl", [{"id": "e"}])
    assert run_cli("submit", f, "--queue", q, "--workers", "1", "--tiers", "mem=1G,2G",
                   "--max-failures", "1", slurm=slurm)[0] == 0
    assert not (tmp_path / "q" / "cancelled").exists()


def test_requeue_failed_moves_failed_tasks_back(tmp_path):
    q = _queue_with_work(tmp_path)
    rc, out = run_cli("requeue-failed", "--queue", q, "nosuch")
    assert rc == 0 and "requeued 0" in out and "not in failed/: nosuch" in out
    rc, out = run_cli("requeue-failed", "--queue", q)
    assert rc == 0 and "requeued 1 failed task(s): b" in out
    assert TaskQueue(q).counts() == {"pending": 2, "claimed": 1, "done": 1, "failed": 0}
    assert "note: tier 0 has no live array" in out


def test_module_entry_point(tmp_path):
    f = write_tasks(tmp_path / "t.jsonl", [{"id": "a"}])
    cp = subprocess.run([sys.executable, "-m", "bursarcore.runtime.cli", "submit", f,
                         "--queue", str(tmp_path / "q"), "--workers", "1", "--dry-run"],
                        capture_output=True, text=True, timeout=60)
    assert cp.returncode == 0, cp.stderr
    assert "sbatch --parsable" in cp.stdout


@pytest.mark.parametrize("dry_run", [False, True])
def test_submit_refuses_a_task_naming_no_installed_plugin(tmp_path, capsys, dry_run):
    q = tmp_path / "q"
    f = write_tasks(tmp_path / "t.jsonl", [{"id": "a", "payload": {"plugin": "counter"}},
                                           {"id": "b", "payload": {"plugin": "nosuch"}}])
    slurm = FakeSlurm()
    rc, out = run_cli("submit", f, "--queue", str(q), "--workers", "1",
                      *(["--dry-run"] if dry_run else []), slurm=slurm)
    assert rc == 2 and out == ""
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert f"{f}:2 payload.plugin: task 'b' names no installed plugin" in err
    assert "'nosuch'" in err and "installed: command, counter" in err
    assert slurm.commands == [] and not q.exists()


@pytest.mark.parametrize("payload", [{"plugin": 5}, {"plugin": ""}, {"plugin": None}])
def test_submit_refuses_a_plugin_that_is_not_a_name(tmp_path, capsys, payload):
    q = tmp_path / "q"
    f = write_tasks(tmp_path / "t.jsonl", [{"id": "a", "payload": payload}])
    rc, _ = run_cli("submit", f, "--queue", str(q), "--workers", "1", slurm=FakeSlurm())
    assert rc == 2 and "payload.plugin" in capsys.readouterr().err and not q.exists()


def test_submit_accepts_installed_and_default_plugins(tmp_path, monkeypatch):
    from bursarcore.runtime import plugins

    class EP:
        name, value = "mine", "somepkg:MinePlugin"

    monkeypatch.setattr(plugins, "_entry_points", lambda: {"mine": EP()})
    f = write_tasks(tmp_path / "t.jsonl", [{"id": "a", "payload": {"plugin": "mine"}},
                                           {"id": "b", "payload": ["not", "an", "object"]},
                                           {"id": "c"}])
    rc, out = run_cli("submit", f, "--queue", str(tmp_path / "q"), "--workers", "1",
                      "--dry-run", slurm=FakeSlurm())
    assert rc == 0 and "3 tasks" in out


@pytest.mark.parametrize("command", [["status"], ["cancel"], ["requeue-failed"],
                                     ["submit", "{tasks}", "--workers", "1"]])
@pytest.mark.parametrize("queue, rule", [("{file}", "is an existing file"),
                                         ("{file}/q", "cannot be a directory")])
def test_a_queue_path_that_cannot_be_a_directory(tmp_path, capsys, command, queue, rule):
    (tmp_path / "file").write_text("keep")
    tasks = write_tasks(tmp_path / "t.jsonl", [{"id": "a"}])
    subst = {"{file}": str(tmp_path / "file"), "{tasks}": tasks}
    argv = [subst.get(a, a) for a in command]
    queue = queue.replace("{file}", str(tmp_path / "file"))
    slurm = FakeSlurm()
    rc, _ = run_cli(*argv, "--queue", queue, slurm=slurm)
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err and f"--queue: {rule}" in err
    assert len(err.strip().splitlines()) == 1
    assert slurm.commands == [] and (tmp_path / "file").read_text() == "keep"


def test_submit_tasks_that_are_not_text(tmp_path, capsys):
    f = tmp_path / "t.jsonl"
    f.write_bytes(b'{"id": "a"}\n\xff\xfe\n')
    rc, _ = run_cli("submit", str(f), "--queue", str(tmp_path / "q"), "--workers", "1")
    err = capsys.readouterr().err
    assert rc == 2 and "TASKS: is not UTF-8 text" in err and "Traceback" not in err
    assert not (tmp_path / "q").exists()


# ---------------------------------------------------------------------- site policy
def test_submit_writes_the_resubmission_spec_of_each_tier(tmp_path):
    f = write_tasks(tmp_path / "t.jsonl", [{"id": "a"}])
    slurm = FakeSlurm()
    q = tmp_path / "q"
    assert run_cli("submit", f, "--queue", str(q), "--workers", "2,1", "--tiers", "mem=1G,2G",
                   "--max-resubmits", "5", slurm=slurm)[0] == 0
    for tier, job in ((0, "101"), (1, "102")):
        spec = json.loads((q / "slurm" / f"tier{tier}.json").read_text())
        assert spec["script"] == (q / "slurm" / f"{job}.sh").read_text()
        assert spec["sbatch"] == slurm.commands[tier]
        assert f"--resubmit {q}/slurm/tier{tier}.json --max-resubmits 5" in spec["script"]


def test_status_and_cancel_see_requeues_and_resubmissions(tmp_path):
    from bursarcore.runtime.slurm import record_jobs
    from bursarcore.runtime.wrapper import record_event

    q = _queue_with_work(tmp_path)
    record_jobs(q, [{"job_id": "101", "tier": 0, "workers": 6, "mem": None}])
    record_event(q, {"event": "requeue", "task": "101_1"})
    record_event(q, {"event": "requeue-refused", "task": "101_2",
                     "reason": "Requested operation is presently disabled"})
    record_event(q, {"event": "resubmit", "task": "101_2", "job_id": "300", "count": 1})
    record_event(q, {"event": "requeue-refused", "task": "101_3", "reason": "denied"})
    record_event(q, {"event": "resubmit-limit", "task": "101_3"})
    slurm = FakeSlurm({"jobs": [{"job_id": 300, "array_job_id": 300, "array_task_id": 2,
                                 "job_state": "RUNNING"}]})
    st = json.loads(run_cli("status", "--queue", q, "--json", slurm=slurm)[1])
    assert st["requeues"] == {"requeued": 1, "refused": 2, "resubmitted": 1,
                              "resubmit_failed": 0, "resubmit_limit": 1, "last_refusal": "denied"}
    a101, a300 = st["arrays"]
    assert a300["job_id"] == "300" and a300["tier"] == 0 and a300["live"] is True
    assert a300["resubmitted_from"] == "101_2"
    assert st["stranded"] == [1]  # tier 0 is served by the resubmitted job (101 is gone)
    text = run_cli("status", "--queue", q, slurm=slurm)[1]
    assert "requeues: 1 by the wrappers, 2 refused by Slurm; resubmissions: 1, 1 at the limit" in text
    assert "last refusal: denied" in text and "resubmitted for 101_2" in text
    slurm = FakeSlurm()
    assert run_cli("cancel", "--queue", q, slurm=slurm)[0] == 0
    assert slurm.commands == [["scancel", "101", "300"]]
