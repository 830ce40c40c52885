"""The per-array-task wrapper (``bursarcore.runtime.wrapper``) against fake workers.

Each test runs the real wrapper as a process (``python -m bursarcore.runtime.wrapper``)
around a small fake worker script, with a fake ``scontrol`` first on ``PATH`` that records
its arguments: crash → bounded relaunch, SIGTERM → forward → exit 99 → ``scontrol
requeue <array job>_<task>``, admin mode, exit 0. Waits are bounded; no Slurm needed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from bursarcore.errors import InvalidArgument
from bursarcore.runtime.wrapper import MAX_BACKOFF, Wrapper, slurm_task_id

FAKE_WORKER = textwrap.dedent('''\
    import os, signal, sys, time
    mode, state = sys.argv[1], sys.argv[2]
    runs_file = os.path.join(state, "runs")
    runs = int(open(runs_file).read()) if os.path.exists(runs_file) else 0
    open(runs_file, "w").write(str(runs + 1))
    def note(text):
        with open(os.path.join(state, "events"), "a") as f:
            f.write(text + "\\n")
    if mode == "crash":                      # always crash with the given code
        sys.exit(int(sys.argv[3]))
    if mode == "crash-then-ok":              # crash K times, then succeed
        sys.exit(int(sys.argv[4]) if runs < int(sys.argv[3]) else 0)
    if mode == "ok":
        sys.exit(0)
    if mode == "self99":                     # checkpoint on its own (walltime) and exit 99
        sys.exit(99)
    if mode == "kill-self":
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "usr1":                       # wait for SIGUSR1, then 99
        def on_usr1(signum, frame):
            note("USR1")
            sys.exit(99)
        signal.signal(signal.SIGUSR1, on_usr1)
        note(f"ready {os.getpid()}")
        time.sleep(30)
        sys.exit(5)
    if mode in ("term", "term-crash"):       # wait for SIGTERM, then 99 (or crash)
        def on_term(signum, frame):
            note("TERM")
            sys.exit(99 if mode == "term" else 7)
        signal.signal(signal.SIGTERM, on_term)
        note(f"ready {os.getpid()}")
        time.sleep(30)
        note("timeout")
        sys.exit(5)
    sys.exit(64)
''')

FAKE_SCONTROL = textwrap.dedent('''\
    #!/bin/sh
    echo "$@" >> "$FAKE_SCONTROL_LOG"
    exit "${FAKE_SCONTROL_RC:-0}"
''')


@pytest.fixture
def rig(tmp_path):
    """A fake worker, a fake scontrol on PATH, and a helper to start the wrapper."""
    worker = tmp_path / "worker.py"
    worker.write_text(FAKE_WORKER)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    sc = bindir / "scontrol"
    sc.write_text(FAKE_SCONTROL)
    sc.chmod(0o755)
    state = tmp_path / "state"
    state.mkdir()

    class Rig:
        scontrol_log = tmp_path / "scontrol.log"

        def env(self, **extra: str) -> dict[str, str]:
            env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
            env.update(PATH=f"{bindir}:{env.get('PATH', '')}",
                       FAKE_SCONTROL_LOG=str(self.scontrol_log), **extra)
            return env

        def start(self, mode: str, *margs: str, wrapper_args: tuple[str, ...] = (),
                  **env: str) -> subprocess.Popen:
            argv = [sys.executable, "-m", "bursarcore.runtime.wrapper", *wrapper_args, "--",
                    sys.executable, str(worker), mode, str(state), *margs]
            return subprocess.Popen(argv, env=self.env(**env), stderr=subprocess.PIPE, text=True)

        def run(self, mode: str, *margs: str, **kw) -> tuple[int, str]:
            p = self.start(mode, *margs, **kw)
            _, err = p.communicate(timeout=60)
            return p.returncode, err

        def runs(self) -> int:
            f = state / "runs"
            return int(f.read_text()) if f.exists() else 0

        def events(self) -> list[str]:
            f = state / "events"
            return f.read_text().splitlines() if f.exists() else []

        def scontrol_calls(self) -> list[str]:
            f = self.scontrol_log
            return f.read_text().splitlines() if f.exists() else []

        def wait_ready(self, n: int = 1, timeout: float = 30) -> None:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if sum(e.startswith("ready") for e in self.events()) >= n:
                    return
                time.sleep(0.02)
            pytest.fail(f"fake worker not ready after {timeout} s: {self.events()}")

    return Rig()


ARRAY_ENV = {"SLURM_ARRAY_JOB_ID": "77", "SLURM_ARRAY_TASK_ID": "5", "SLURM_JOB_ID": "80"}


def test_exit_0_is_done(rig):
    rc, err = rig.run("ok", **ARRAY_ENV)
    assert rc == 0, err
    assert rig.runs() == 1
    assert rig.scontrol_calls() == []
    assert "exited 0" in err


def test_crash_is_relaunched_until_the_worker_succeeds(rig):
    rc, err = rig.run("crash-then-ok", "2", "3", wrapper_args=("--max-restarts", "3",
                                                              "--backoff", "0.01"))
    assert rc == 0, err
    assert rig.runs() == 3
    assert err.count("crashed (exit 3)") == 2
    assert rig.scontrol_calls() == []


def test_relaunches_are_bounded(rig):
    rc, err = rig.run("crash", "3", wrapper_args=("--max-restarts", "2", "--backoff", "0.01"),
                      **ARRAY_ENV)
    assert rc == 3, err                       # the worker's code: Slurm records FAILED
    assert rig.runs() == 3                    # the first run and 2 relaunches
    assert "giving up with exit 3" in err
    assert rig.scontrol_calls() == []         # a crash is not a requeue


def test_no_relaunch_with_max_restarts_0(rig):
    rc, err = rig.run("crash", "4", wrapper_args=("--max-restarts", "0"))
    assert rc == 4 and rig.runs() == 1, err


def test_death_by_signal_is_a_crash_in_shell_convention(rig):
    rc, err = rig.run("kill-self", wrapper_args=("--max-restarts", "1", "--backoff", "0.01"))
    assert rc == 128 + signal.SIGKILL, err
    assert rig.runs() == 2


def test_sigterm_is_forwarded_then_the_array_task_requeued(rig):
    p = rig.start("term", **ARRAY_ENV)
    rig.wait_ready()
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 99, err
    assert "TERM" in rig.events()             # the worker got the forwarded signal
    assert rig.scontrol_calls() == ["requeue 77_5"]   # only this array task
    assert rig.runs() == 1                    # no relaunch after the requeue
    assert "requeued 77_5" in err


def test_stop_signal_is_handled_like_sigterm_and_forwarded_as_it_came(rig):
    p = rig.start("usr1", wrapper_args=("--stop-signal", "USR1"), **ARRAY_ENV)
    rig.wait_ready()
    p.send_signal(signal.SIGUSR1)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 99, err
    assert rig.events()[-1] == "USR1" and rig.runs() == 1
    assert rig.scontrol_calls() == ["requeue 77_5"]
    assert "SIGUSR1: forwarding to worker" in err
    assert "exited 99 after SIGUSR1: requeued 77_5" in err    # the log names the signal


def test_without_stop_signal_usr1_is_not_a_stop(rig):
    """Only the configured signal means stop: by default SIGUSR1 keeps its default action
    (the wrapper dies; nothing is requeued by it)."""
    p = rig.start("usr1", **ARRAY_ENV)
    rig.wait_ready()
    p.send_signal(signal.SIGUSR1)
    assert p.wait(timeout=30) == -signal.SIGUSR1
    worker_pid = int(next(e for e in rig.events() if e.startswith("ready")).split()[1])
    os.kill(worker_pid, signal.SIGKILL)  # orphaned by the wrapper's death
    assert p.stderr is not None
    p.stderr.close()
    assert rig.scontrol_calls() == []


def test_plain_job_requeues_its_job_id(rig):
    p = rig.start("term", SLURM_JOB_ID="80")
    rig.wait_ready()
    p.send_signal(signal.SIGTERM)
    p.communicate(timeout=30)
    assert p.returncode == 99
    assert rig.scontrol_calls() == ["requeue 80"]


def test_admin_mode_only_exits_99(rig):
    p = rig.start("term", wrapper_args=("--requeue", "admin"), **ARRAY_ENV)
    rig.wait_ready()
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 99, err
    assert "TERM" in rig.events()
    assert rig.scontrol_calls() == []
    assert "RequeueExit=99" in err


def test_worker_exit_99_on_its_own_requeues(rig):
    rc, err = rig.run("self99", **ARRAY_ENV)
    assert rc == 99, err
    assert rig.scontrol_calls() == ["requeue 77_5"]
    assert rig.runs() == 1


def test_crash_after_sigterm_still_requeues_and_is_not_relaunched(rig):
    p = rig.start("term-crash", wrapper_args=("--max-restarts", "5", "--backoff", "0.01"),
                  **ARRAY_ENV)
    rig.wait_ready()
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 99, err
    assert rig.runs() == 1
    assert rig.scontrol_calls() == ["requeue 77_5"]
    assert "exited 7 after SIGTERM" in err


def test_a_second_sigterm_is_not_forwarded_again(rig):
    p = rig.start("term", **ARRAY_ENV)
    rig.wait_ready()
    # the fake worker exits at the first TERM; the second one must not break the wrapper
    p.send_signal(signal.SIGTERM)
    time.sleep(0.05)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 99, err
    assert rig.events().count("TERM") == 1
    assert err.count("forwarding to worker") == 1


def test_sigterm_during_backoff_stops_relaunching(rig):
    p = rig.start("crash", "3", wrapper_args=("--max-restarts", "5", "--backoff", "20"),
                  **ARRAY_ENV)
    assert p.stderr is not None
    seen = []
    for line in p.stderr:                     # wait until the wrapper is in its 20 s pause
        seen.append(line)
        if "relaunching in 20 s" in line:
            break
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=30)
    assert time.monotonic() - t0 < 10         # the pause was cut short
    assert p.returncode == 99, "".join(seen) + err
    assert rig.runs() == 1
    assert rig.scontrol_calls() == ["requeue 77_5"]


def test_stop_file_prevents_the_requeue_of_a_cancelled_campaign(rig, tmp_path):
    stop = tmp_path / "cancelled"
    stop.write_text("{}")
    p = rig.start("term", wrapper_args=("--stop-file", str(stop)), **ARRAY_ENV)
    rig.wait_ready()
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 0, err
    assert "TERM" in rig.events()             # the worker still checkpoints
    assert rig.scontrol_calls() == []
    assert "not requeueing" in err
    stop.unlink()                             # no stop file: the usual requeue
    rc, err = rig.run("self99", wrapper_args=("--stop-file", str(stop)), **ARRAY_ENV)
    assert rc == 99 and rig.scontrol_calls() == ["requeue 77_5"], err


def test_failed_scontrol_is_logged_and_still_exits_99(rig):
    rc, err = rig.run("self99", FAKE_SCONTROL_RC="1", **ARRAY_ENV)
    assert rc == 99
    assert rig.scontrol_calls() == ["requeue 77_5"]
    assert "failed (exit 1)" in err


def test_outside_slurm_exit_99_without_requeue(rig):
    rc, err = rig.run("self99")
    assert rc == 99
    assert rig.scontrol_calls() == []
    assert "not inside a Slurm job" in err


def test_missing_worker_command_is_a_usage_error(rig):
    p = subprocess.run([sys.executable, "-m", "bursarcore.runtime.wrapper", "--"],
                       env=rig.env(), capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert "worker argv" in p.stderr


# ---------------------------------------------------------------- in process
def test_backoff_doubles_and_is_capped(tmp_path):
    calls: list[list[str]] = []
    w = Wrapper([sys.executable, "-c", "raise SystemExit(3)"], max_restarts=3, backoff=0.01,
                env={}, run_command=lambda a, i=None: (calls.append(a), (0, ""))[1], log=lambda m: None)
    assert w.run() == 3
    assert w.pauses == [0.01, 0.02, 0.04]
    assert calls == []
    assert min(MAX_BACKOFF, 20 * 2 ** 5) == MAX_BACKOFF


def test_requeue_through_the_command_seam():
    calls: list[list[str]] = []
    w = Wrapper([sys.executable, "-c", "raise SystemExit(99)"], env=dict(ARRAY_ENV),
                run_command=lambda a, i=None: (calls.append(a), (0, ""))[1], log=lambda m: None)
    assert w.run() == 99
    assert calls == [["scontrol", "requeue", "77_5"]]


@pytest.mark.parametrize("kw, field", [
    ({"max_restarts": -1}, "max_restarts"),
    ({"max_restarts": True}, "max_restarts"),
    ({"backoff": -0.5}, "backoff"),
    ({"requeue": "never"}, "requeue"),
])
def test_bad_arguments_name_the_field(kw, field):
    with pytest.raises(InvalidArgument) as e:
        Wrapper(["true"], **kw)
    assert e.value.field == field


def test_slurm_task_id():
    assert slurm_task_id(ARRAY_ENV) == "77_5"
    assert slurm_task_id({"SLURM_JOB_ID": "80"}) == "80"
    assert slurm_task_id({}) is None


def test_bootstrap_catches_sigterm_during_start_up(rig, tmp_path):
    """Batch scripts run ``python -c BOOTSTRAP``: a SIGTERM while bursarcore is still being
    imported (about a second) is kept, not fatal: no worker starts and the task is
    requeued."""
    from bursarcore.runtime.wrapper import BOOTSTRAP

    # -X importtime reports each import as it ends: once a bursarcore module has been
    # imported, the bootstrap's handler is in place and the wrapper's main has not run
    argv = [sys.executable, "-X", "importtime", "-c", BOOTSTRAP, "--max-restarts", "0", "--",
            sys.executable, str(tmp_path / "worker.py"), "ok", str(tmp_path / "state")]
    p = subprocess.Popen(argv, env=rig.env(**ARRAY_ENV), stderr=subprocess.PIPE, text=True)
    assert p.stderr is not None
    for line in p.stderr:
        if "bursarcore.errors" in line:
            break
    p.send_signal(signal.SIGTERM)
    _, rest = p.communicate(timeout=60)
    err = "\n".join(ln for ln in rest.splitlines() if not ln.startswith("import time:"))
    assert p.returncode == 99, err
    assert "SIGTERM during start-up" in err
    assert rig.runs() == 0
    assert rig.scontrol_calls() == ["requeue 77_5"]


def test_a_worker_that_cannot_start_is_exit_127(tmp_path):
    lines: list[str] = []
    w = Wrapper([str(tmp_path / "no-such-worker")], env={}, log=lines.append)
    assert w.run() == 127
    assert any("cannot start the worker" in ln for ln in lines)


# ---------------------------------------------------------------- site policy: resubmission
REFUSED = "scontrol: error: Requested operation is presently disabled for job 77_5"


class Commands:
    """The command seam with recorded outputs: ``answers`` maps a program to its
    ``(exit code, output)``; every call and its stdin is kept."""

    def __init__(self, **answers: tuple[int, str]) -> None:
        self.answers = answers
        self.calls: list[tuple[list[str], str | None]] = []

    def __call__(self, argv: list[str], input: str | None = None) -> tuple[int, str]:
        self.calls.append((list(argv), input))
        return self.answers.get(argv[0], (0, ""))


def _resubmit_rig(tmp_path, cmds, **env):
    from bursarcore.runtime.slurm import ArraySpec, write_resubmit_spec

    q = tmp_path / "q"
    spec = ArraySpec(queue=str(q), tier=1, workers=4, max_running=2, mem="8G")
    path = write_resubmit_spec(spec)
    logs: list[str] = []
    w = Wrapper([sys.executable, "-c", "raise SystemExit(99)"], env={**ARRAY_ENV, **env},
                run_command=cmds, log=logs.append, resubmit=path, queue=str(q))
    return w, logs, q


def test_refused_requeue_resubmits_the_lost_task_with_its_index(tmp_path):
    from bursarcore.runtime.wrapper import load_events

    cmds = Commands(scontrol=(1, REFUSED), sbatch=(0, "4242\n"))
    w, logs, q = _resubmit_rig(tmp_path, cmds)
    assert w.run() == 99
    (req, _), (sub, script) = cmds.calls
    assert req == ["scontrol", "requeue", "77_5"]
    assert sub[0] == "sbatch" and "--array=5" in sub and "--array=0-3%2" not in sub
    assert sub[-1] == "--export=ALL,BURSAR_RESUBMITS=1" and "--mem=8G" in sub
    assert script.startswith("#!/bin/bash") and "--tier 1" in script
    text = "\n".join(logs)
    assert "presently disabled" in text and "resubmitted as job 4242_5" in text
    assert "resubmission 1 of 3" in text
    events = load_events(str(q))
    assert [e["event"] for e in events] == ["requeue-refused", "resubmit"]
    assert events[0]["reason"] == REFUSED and events[1]["job_id"] == "4242"
    assert events[1]["task"] == "77_5" and events[1]["new_task"] == "4242_5"


def test_resubmissions_are_bounded(tmp_path):
    from bursarcore.runtime.wrapper import load_events

    cmds = Commands(scontrol=(1, REFUSED), sbatch=(0, "4243\n"))
    w, logs, q = _resubmit_rig(tmp_path, cmds, BURSAR_RESUBMITS="2")
    assert w.run() == 99
    assert cmds.calls[-1][0][-1] == "--export=ALL,BURSAR_RESUBMITS=3"  # the third, the last
    cmds = Commands(scontrol=(1, REFUSED), sbatch=(0, "4244\n"))
    w, logs, q = _resubmit_rig(tmp_path, cmds, BURSAR_RESUBMITS="3")
    assert w.run() == 99
    assert [c[0][0] for c in cmds.calls] == ["scontrol"]  # no fourth sbatch
    assert any("resubmission limit reached (3 of 3)" in m for m in logs)
    assert [e["event"] for e in load_events(str(q))][-2:] == ["requeue-refused", "resubmit-limit"]


def test_failed_resubmission_is_logged_and_recorded(tmp_path):
    from bursarcore.runtime.wrapper import load_events

    cmds = Commands(scontrol=(1, REFUSED),
                    sbatch=(1, "sbatch: error: QOSMaxSubmitJobPerUserLimit"))
    w, logs, q = _resubmit_rig(tmp_path, cmds)
    assert w.run() == 99
    assert any("resubmission failed" in m and "QOSMaxSubmitJobPerUserLimit" in m for m in logs)
    assert [e["event"] for e in load_events(str(q))] == ["requeue-refused", "resubmit-failed"]


def test_accepted_requeue_does_not_resubmit(tmp_path):
    from bursarcore.runtime.wrapper import load_events

    cmds = Commands()
    w, logs, q = _resubmit_rig(tmp_path, cmds)
    assert w.run() == 99
    assert [c[0][0] for c in cmds.calls] == ["scontrol"]
    assert [e["event"] for e in load_events(str(q))] == ["requeue"]


def test_no_resubmission_without_a_spec_or_when_cancelled(tmp_path):
    cmds = Commands(scontrol=(1, REFUSED))
    w = Wrapper([sys.executable, "-c", "raise SystemExit(99)"], env=dict(ARRAY_ENV),
                run_command=cmds, log=lambda m: None)
    assert w.run() == 99 and [c[0][0] for c in cmds.calls] == ["scontrol"]
    stop = tmp_path / "cancelled"
    stop.write_text("{}")
    cmds = Commands(scontrol=(1, REFUSED))
    w, logs, q = _resubmit_rig(tmp_path, cmds)
    w.stop_file = str(stop)
    assert w.run() == 0 and cmds.calls == []


def test_resubmit_argv_for_a_plain_job():
    from bursarcore.runtime.wrapper import resubmit_argv

    argv = resubmit_argv(["sbatch", "--parsable", "--array=0-9%3", "--export=NONE", "--mem=2G"],
                         None, 2)
    assert argv == ["sbatch", "--parsable", "--mem=2G", "--export=ALL,BURSAR_RESUBMITS=2"]


def test_bad_max_resubmits_names_the_field():
    with pytest.raises(InvalidArgument) as e:
        Wrapper(["x"], max_resubmits=-1)
    assert e.value.field == "max_resubmits"


def test_a_requeue_ended_by_its_own_sigterm_counts_as_accepted(tmp_path):
    # Slurm signals every process of the task it requeues, the scontrol that asked included
    from bursarcore.runtime.wrapper import load_events

    cmds = Commands(scontrol=(-signal.SIGTERM, ""))
    w, logs, q = _resubmit_rig(tmp_path, cmds)
    assert w.run() == 99
    assert [c[0][0] for c in cmds.calls] == ["scontrol"]      # no resubmission
    assert [e["event"] for e in load_events(str(q))] == ["requeue"]
    assert any("ended by SIGTERM" in m and "requeued 77_5" in m for m in logs)


def test_the_wrappers_commands_survive_a_sigterm_sent_to_them():
    code = "import os, signal; os.kill(os.getpid(), signal.SIGTERM); print('reported')"
    rc, out = Wrapper._default_run([sys.executable, "-c", code])
    assert (rc, out) == (0, "reported")
