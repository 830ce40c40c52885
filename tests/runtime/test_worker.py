"""The worker (SPEC §13): the process contract end to end with real subprocesses, and the
loop's decisions in-process with an injected walltime clock.

Every wait is a bounded wait on a real subprocess (or on a file an agent writes); none is a
sleep standing in for synchronisation. Workers and agents run with
``BURSARCORE_NO_EXTENSIONS=1`` so they never import compiled modules being rebuilt.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from bursarcore.runtime import QueueConfig, TaskQueue
from bursarcore.runtime.checkpoint import CheckpointStore
from bursarcore.runtime.worker import EXIT_CHECKPOINTED, EXIT_DONE, Worker

WAIT = 30.0
ENV = {**os.environ, "BURSARCORE_NO_EXTENSIONS": "1"}

def _need_runner(runner):
    if runner == "bwrap" and shutil.which("bwrap") is None:
        if os.environ.get("BURSAR_REQUIRE_BWRAP") == "1":
            pytest.fail("BURSAR_REQUIRE_BWRAP=1 but bwrap is not on PATH")
        pytest.skip("bubblewrap (bwrap) is not installed; BURSAR_REQUIRE_BWRAP=1 makes this a failure")


def _start(root, *args, wid=None):
    cmd = [sys.executable, "-m", "bursarcore.runtime.worker", "--queue", str(root),
           "--heartbeat", "0.2", *args]
    if wid:
        cmd += ["--id", wid]
    return subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(p, timeout=WAIT):
    out, err = p.communicate(timeout=timeout)
    return p.returncode, err


def _wait(pred, timeout=WAIT, what="condition"):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def _state_step(ws):
    try:
        with open(os.path.join(ws, "state.json")) as f:
            return json.load(f)["step"]
    except (OSError, ValueError, KeyError):
        return 0


def _counter(n, steps, step_seconds=0.05):
    return [(f"t{i:02d}", {"plugin": "counter", "steps": steps, "step_seconds": step_seconds})
            for i in range(n)]


# ---------------------------------------------------------------------- end to end
def test_concurrent_workers_do_every_task_exactly_once(tmp_path):
    root = tmp_path / "q"
    q = TaskQueue.create(root, QueueConfig())
    tasks = _counter(8, steps=3, step_seconds=0.02)
    q.put_many(tasks)
    procs = [_start(root, wid=f"w{k}") for k in range(4)]
    results = [_finish(p) for p in procs]
    assert [rc for rc, _ in results] == [EXIT_DONE] * 4, [e[-2000:] for _, e in results]
    assert q.counts() == {"pending": 0, "claimed": 0, "done": 8, "failed": 0}
    assert q.check() == []
    workers = set()
    for tid, _ in tasks:
        state, rec = q.get(tid)
        events = [h["event"] for h in rec["history"]]
        assert events == ["claim", "done"], (tid, events)  # one claim, one completion
        assert rec["result"] == {"steps": 3, "resumed_at_step": None, "checkpoints_resumed": 0,
                                 "resumed_from": None}
        workers.add(rec["completed_by"])
        # the agent ran once: one attempt header in its log
        with open(root / "logs" / f"{tid}.log") as f:
            assert sum(line.startswith("=== ") for line in f) == 1
        assert not (root / "workspaces" / tid).exists()  # cleaned after completion
    assert len(workers) >= 2  # the work was actually shared
    # one line per event on stderr, with task ids
    assert "task t" in results[0][1] and "claimed" in results[0][1]


def _preempted_counter(root, sig, *args):
    """A worker running a 60-step counter task gets ``sig`` after 3 steps: ``(queue, exit
    code, stderr, the step reached before the signal)``."""
    q = TaskQueue.create(root, QueueConfig())
    q.put("job", {"plugin": "counter", "steps": 60, "step_seconds": 0.03})
    ws = str(root / "workspaces" / "job")
    p = _start(root, *args, "--grace", "10", wid="first")
    try:
        step = _wait(lambda: _state_step(ws) >= 3 and _state_step(ws), what="agent progress")
        p.send_signal(sig)
        rc, err = _finish(p)
    finally:
        if p.poll() is None:
            p.kill()
    return q, rc, err, step


@pytest.mark.parametrize("runner", ["none", "bwrap"])
def test_sigterm_checkpoints_exits_99_and_a_new_worker_resumes(tmp_path, runner):
    _need_runner(runner)
    root = tmp_path / "q"
    q, rc, err, step = _preempted_counter(root, signal.SIGTERM, "--runner", runner)
    assert rc == EXIT_CHECKPOINTED, err[-3000:]
    state, rec = q.get("job")
    assert state == "pending" and rec["failures"] == 0  # a preemption is not a failure
    assert rec["resume"]["checkpoint"] == 1
    ck = CheckpointStore(root / "checkpoints" / "job").latest()
    assert ck is not None and ck.seq == 1
    saved_step = json.loads(_tar_member(ck.archive, "agent-state"))["step"]
    assert saved_step >= step
    assert "checkpoint 1 saved" in err and "released (preempted: SIGTERM)" in err
    p2 = _start(root, "--runner", runner, wid="second")
    rc2, err2 = _finish(p2)
    assert rc2 == EXIT_DONE, err2[-3000:]
    state, rec = q.get("job")
    assert state == "done"
    assert rec["result"] == {"steps": 60, "resumed_at_step": saved_step, "checkpoints_resumed": 1,
                             "resumed_from": 1}
    assert rec["result"]["resumed_at_step"] > 0
    assert not (root / "checkpoints" / "job").exists()


def _tar_member(path, name):
    import tarfile
    with tarfile.open(path) as t:
        return t.extractfile(name).read()


def test_failing_agent_is_retried_then_failed_with_reason(tmp_path):
    root = tmp_path / "q"
    q = TaskQueue.create(root, QueueConfig(max_failures=2))
    q.put("bad", {"plugin": "command",
                  "argv": ["sh", "-c", "echo working; echo 'fatal: model crashed' >&2; exit 3"]})
    q.put("nope", {"plugin": "no-such-plugin"})
    q.put("absent", {"plugin": "command", "argv": [str(tmp_path / "no-such-agent")]})
    rc, err = _finish(_start(root))
    assert rc == EXIT_DONE, err[-3000:]
    state, rec = q.get("bad")
    assert state == "failed" and rec["attempts"] == 2 and rec["failures"] == 2
    assert rec["reason"] == "agent exited with code 3; last stderr lines:\nfatal: model crashed"
    assert "-> retry" in err and "-> failed" in err
    state, rec = q.get("nope")
    assert state == "failed" and "unknown plugin" in rec["reason"]
    state, rec = q.get("absent")
    assert state == "failed" and "cannot start the agent" in rec["reason"]
    assert "No such file" in rec["reason"]
    assert os.path.isdir(root / "workspaces" / "bad")  # kept for inspection


def test_secrets_reach_the_agent_and_nothing_else(tmp_path):
    secret = "sk-test-9f8e7d6c5b4a"
    sf = tmp_path / "secrets.env"
    sf.write_text(f"API_KEY={secret}\n")
    os.chmod(sf, 0o600)
    root = tmp_path / "q"
    q = TaskQueue.create(root, QueueConfig(max_failures=1))
    agent = ("import json, os, sys; k = os.environ['API_KEY']; print('key is', k); "
             "print('stderr key', k, file=sys.stderr); "
             "json.dump({'len': len(k), 'echo': k}, open('out.json', 'w')); "
             "sys.exit(int(sys.argv[1]))")
    q.put("ok", {"plugin": "command", "argv": [sys.executable, "-c", agent, "0"],
                 "result_file": "out.json"})
    q.put("leaky", {"plugin": "command", "argv": [sys.executable, "-c", agent, "1"]})
    rc, err = _finish(_start(root, "--secrets", str(sf)))
    assert rc == EXIT_DONE, err[-3000:]
    _, rec = q.get("ok")
    assert rec["result"]["output"] == {"len": len(secret), "echo": "***"}  # the agent had it
    _, rec = q.get("leaky")
    assert "stderr key ***" in rec["reason"]
    assert secret not in err
    for path in glob.glob(str(root / "**"), recursive=True):
        if os.path.isfile(path) and "/workspaces/" not in path:
            with open(path, "rb") as f:
                assert secret.encode() not in f.read(), path


def test_secrets_file_readable_by_others_refuses_to_start(tmp_path):
    sf = tmp_path / "secrets.env"
    sf.write_text("API_KEY=abcdef\n")
    os.chmod(sf, 0o644)
    root = tmp_path / "q"
    TaskQueue.create(root, QueueConfig()).put("t", {"argv": ["true"]})
    rc, err = _finish(_start(root, "--secrets", str(sf)))
    assert rc == 2 and "chmod 600" in err and "abcdef" not in err
    assert TaskQueue(root).counts()["pending"] == 1  # nothing was claimed


# ---------------------------------------------------------------------- in process
class Clock:
    def __init__(self, t=1_000_000.0):
        self.t = t

    def __call__(self):
        return self.t


def _run_in_thread(worker):
    box = {}
    th = threading.Thread(target=lambda: box.setdefault("rc", worker.run()), daemon=True)
    th.start()
    return th, box


def test_walltime_margin_checkpoints_and_exits_99(tmp_path, monkeypatch):
    monkeypatch.setenv("BURSARCORE_NO_EXTENSIONS", "1")
    q = TaskQueue.create(tmp_path / "q", QueueConfig())
    q.put("job", {"plugin": "counter", "steps": 500, "step_seconds": 0.02})
    clock = Clock()
    w = Worker(q, clock=clock, walltime_end=clock.t + 1000, checkpoint_margin=60, heartbeat=0.1)
    th, box = _run_in_thread(w)
    ws = str(tmp_path / "q" / "workspaces" / "job")
    _wait(lambda: _state_step(ws) >= 2, what="agent progress")
    _wait(lambda: ((q.get("job")[1]["resume"] or {}).get("progress") or {}).get("step", 0) >= 2,
          what="a heartbeat with progress")
    clock.t += 939.0  # still 61 s left: keep going
    assert w._stop_reason() is None and q.get("job")[0] == "claimed"
    clock.t += 2.0    # 59 s left < 60 s margin
    th.join(WAIT)
    assert box["rc"] == EXIT_CHECKPOINTED
    state, rec = q.get("job")
    assert state == "pending" and rec["resume"]["checkpoint"] == 1
    assert rec["history"][-1]["reason"] == "preempted (walltime)"
    assert rec["resume"]["progress"]["steps"] == 500  # the plugin's heartbeat was stored


def test_walltime_between_tasks(tmp_path):
    q = TaskQueue.create(tmp_path / "q", QueueConfig())
    clock = Clock()
    assert Worker(q, clock=clock, walltime_end=clock.t + 10, checkpoint_margin=60).run() == EXIT_DONE
    q.put("t", {"argv": ["true"]})
    assert Worker(q, clock=clock, walltime_end=clock.t + 10, checkpoint_margin=60).run() == EXIT_CHECKPOINTED
    assert q.counts()["pending"] == 1  # not claimed so close to the end


def test_stop_before_any_task_exits_99_without_claiming(tmp_path):
    q = TaskQueue.create(tmp_path / "q", QueueConfig())
    q.put("t", {"argv": ["true"]})
    w = Worker(q)
    w.request_stop()
    assert w.run() == EXIT_CHECKPOINTED and q.counts()["pending"] == 1


def test_stop_signal_usr1_checkpoints_and_exits_99_like_sigterm(tmp_path):
    q, rc, err, _ = _preempted_counter(tmp_path / "q", signal.SIGUSR1, "--stop-signal", "USR1")
    assert rc == EXIT_CHECKPOINTED, err[-3000:]
    state, rec = q.get("job")
    assert state == "pending" and rec["failures"] == 0 and rec["resume"]["checkpoint"] == 1
    assert "released (preempted: SIGUSR1)" in err


def test_agent_ignoring_sigterm_is_killed_after_grace_and_still_checkpointed(tmp_path):
    q = TaskQueue.create(tmp_path / "q", QueueConfig())
    q.put("stubborn", {"argv": ["sh", "-c", "trap '' TERM; echo 1 > progress; touch started; "
                                "while :; do sleep 0.05; done"]})
    w = Worker(q, grace=0.5, heartbeat=0.1)
    th, box = _run_in_thread(w)
    _wait(lambda: os.path.exists(tmp_path / "q" / "workspaces" / "stubborn" / "started"))
    t0 = time.monotonic()
    w.request_stop()
    th.join(WAIT)
    assert box["rc"] == EXIT_CHECKPOINTED and time.monotonic() - t0 < 10
    state, rec = q.get("stubborn")
    assert state == "pending" and rec["resume"]["checkpoint"] == 1
    # the resumed attempt finds the workspace as it was
    store = CheckpointStore(tmp_path / "q" / "checkpoints" / "stubborn")
    ws2 = tmp_path / "restored"
    store.restore(str(ws2))
    assert (ws2 / "progress").read_text() == "1\n"


def test_lost_claim_stops_the_agent_and_discards_its_work(tmp_path):
    q = TaskQueue.create(tmp_path / "q", QueueConfig(stale_after=5))
    q.put("job", {"argv": ["sh", "-c", "touch started; sleep 30"]})
    w = Worker(q, heartbeat=0.05, grace=5, max_tasks=1)
    th, box = _run_in_thread(w)
    _wait(lambda: os.path.exists(tmp_path / "q" / "workspaces" / "job" / "started"))
    # a peer whose clock says the heartbeat is long stale takes the task back
    peer = TaskQueue(tmp_path / "q", clock=lambda: time.time() + 3600, worker="peer")
    assert peer.reclaim_stale() == ["job"]
    th.join(WAIT)
    assert not th.is_alive() and box["rc"] == EXIT_DONE
    state, rec = q.get("job")
    assert state == "pending" and rec["failures"] == 1 and "result" not in rec


def test_higher_tier_worker_waits_for_a_peer_task_that_may_be_promoted_to_it(tmp_path):
    # the tier-1 worker finds nothing claimable but a tier-0 task is still claimed by a
    # peer: it waits, the peer's attempt fails (promoted to tier 1), and it runs the task
    q = TaskQueue.create(tmp_path / "q", QueueConfig(tiers=2, promote_after=1))
    q.put("heavy", {"argv": ["true"]})
    peer = TaskQueue(tmp_path / "q", worker="peer")
    held = peer.claim(worker_tier=0)
    naps = []

    def sleep(s):
        naps.append(s)
        if len(naps) == 1:
            assert peer.fail(held, "exit 137 (out of memory)") == "retry"

    assert Worker(q, tier=1, idle_poll=2.0, sleep=sleep).run() == EXIT_DONE
    state, rec = q.get("heavy")
    assert state == "done" and rec["tier"] == 1 and rec["completed_by"] == q.worker
    assert sum(naps) == 2.0                       # one idle wait, in short steps


def test_worker_does_not_wait_for_tasks_it_could_never_run(tmp_path):
    q = TaskQueue.create(tmp_path / "q", QueueConfig(tiers=2, promote_after=1))
    q.put("big", {"argv": ["true"]}, tier=1)
    TaskQueue(tmp_path / "q", worker="peer").claim(worker_tier=1)
    naps = []
    assert Worker(q, tier=0, sleep=naps.append).run() == EXIT_DONE
    assert naps == []


def test_max_tasks(tmp_path):
    q = TaskQueue.create(tmp_path / "q", QueueConfig())
    q.put_many([("a", {"argv": ["true"]}), ("b", {"argv": ["true"]})])
    assert Worker(q, max_tasks=1).run() == EXIT_DONE
    assert q.counts()["done"] == 1 and q.counts()["pending"] == 1


def test_broken_newest_checkpoint_resumes_from_the_previous(tmp_path, caplog):
    q = TaskQueue.create(tmp_path / "q", QueueConfig())
    q.put("job", {"argv": ["sh", "-c", 'printf \'{"seen": "%s"}\' "$(cat note)" > out.json'],
                  "result_file": "out.json"})
    store = CheckpointStore(tmp_path / "q" / "checkpoints" / "job", keep=2)
    src = tmp_path / "src"
    src.mkdir()
    (src / "note").write_text("first")
    store.save(str(src), b"")
    (src / "note").write_text("second")
    ck2 = store.save(str(src), b"")
    os.truncate(ck2.archive, 512)
    c = q.claim()
    q.release(c, "preempted", resume={"checkpoint": 2})
    assert Worker(q).run() == EXIT_DONE
    _, rec = q.get("job")
    assert rec["result"]["output"] == {"seen": "first"} and rec["result"]["resumed_from"] == 1
    assert "seq 2 is broken" in caplog.text


def test_worker_rejects_bad_settings(tmp_path):
    from bursarcore.errors import InvalidArgument
    q = TaskQueue.create(tmp_path / "q", QueueConfig(tiers=2))
    for kw, field in [({"tier": 2}, "tier"), ({"grace": -1}, "grace"), ({"heartbeat": 0}, "heartbeat"),
                      ({"max_tasks": 0}, "max_tasks"), ({"checkpoint_margin": "x"}, "checkpoint_margin"),
                      ({"idle_poll": -1}, "idle_poll")]:
        with pytest.raises(InvalidArgument) as e:
            Worker(q, **kw)
        assert e.value.field == field
    assert Worker(q).heartbeat_every == 30.0
    assert Worker(TaskQueue.create(tmp_path / "q2", QueueConfig(stale_after=60))).heartbeat_every == 10.0


def test_bad_command_line_is_exit_2(tmp_path):
    rc, err = _finish(_start(tmp_path / "missing"))
    assert rc == 2 and "no queue.json" in err
    rc, err = _finish(subprocess.Popen(
        [sys.executable, "-m", "bursarcore.runtime.worker", "--queue", str(tmp_path), "--runner", "apptainer"],
        env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    assert rc == 2 and "image" in err


def test_agent_dies_with_a_killed_worker(tmp_path):
    root = tmp_path / "q"
    q = TaskQueue.create(root, QueueConfig())
    q.put("job", {"argv": ["sh", "-c", "echo $$ > pid.tmp && mv pid.tmp pid; exec sleep 60"]})
    p = _start(root)
    pidfile = root / "workspaces" / "job" / "pid"
    try:
        _wait(lambda: pidfile.exists() and pidfile.read_text().strip(), what="agent pid")
        agent = int(pidfile.read_text())
        p.kill()  # SIGKILL: no handler runs, only the kernel's parent-death signal
        p.wait(WAIT)
    finally:
        if p.poll() is None:
            p.kill()

    def gone():
        try:
            with open(f"/proc/{agent}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] == "Z"  # zombie: dead
        except FileNotFoundError:
            return True
    _wait(gone, what="the orphaned agent to die")
    assert q.get("job")[0] == "claimed"  # left for a peer's stale reclaim


def test_all_checkpoints_broken_starts_afresh_and_says_so(tmp_path, caplog):
    q = TaskQueue.create(tmp_path / "q", QueueConfig())
    q.put("job", {"argv": ["sh", "-c", "ls > listing; printf '{\"n\": %d}' $(wc -l < listing) > out.json"],
                  "result_file": "out.json"})
    store = CheckpointStore(tmp_path / "q" / "checkpoints" / "job")
    src = tmp_path / "src"
    src.mkdir()
    (src / "stale-file").write_text("x")
    os.truncate(store.save(str(src), b"").archive, 100)
    q.release(q.claim(), "preempted", resume={"checkpoint": 1})
    ws = tmp_path / "q" / "workspaces" / "job"
    ws.mkdir(parents=True)
    (ws / "leftover").write_text("from a failed attempt")
    assert Worker(q).run() == EXIT_DONE
    _, rec = q.get("job")
    assert rec["result"]["resumed_from"] is None
    assert rec["result"]["output"] == {"n": 1}  # only its own listing: the workspace was emptied
    assert "names checkpoint 1 but no checkpoint verifies" in caplog.text


def test_worker_and_agent_start_without_numpy_or_the_engine():
    # workers and agents start by the thousand: the top-level package loads its public
    # names lazily, so the runtime imports neither numpy nor the compiled engine
    code = ("import sys, bursarcore.runtime.worker, bursarcore.runtime.examples.counter; "
            "heavy = sorted(m for m in sys.modules if m == 'numpy' or m.startswith('bursarcore.broker')"
            " or m.startswith('bursarcore._engine')); print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
