"""What a real site needs of BursarProvider beyond the block lifecycle: it pickles as its
configuration (the class is module-level), a block's status names its workers' output
files (Parsl's error handler prints them), and ``tasks_per_node`` copies of the worker
command run on a block. Processes are real and local; every wait is bounded."""

from __future__ import annotations

import copy
import pickle
import subprocess
import sys
import time

import pytest
from parsl.jobs.error_handlers import _get_error
from parsl.jobs.states import JobState

from bursarcore import Broker, Envelope, ManualClock, Pool
from bursarcore.adapters.parsl import BindingLauncher, BursarProvider, LocalLauncher
from bursarcore.errors import InvalidArgument
from bursarcore.service.locked import LockedBroker

from test_provider_unit import FakeBinding, make


def _local(tmp_path, **kw):
    b = Broker(Pool(gpu=16), clock=ManualClock(1000.0))
    b.register("sci", Envelope(credits=1000, sustained={"gpu": 16}, ceiling={"gpu": 16}))
    p = BursarProvider("sci", broker=LockedBroker(b), launcher=LocalLauncher(str(tmp_path)),
                       gpus_per_block=4, lease_duration=100, background=False, **kw)
    return b, p


def _until_ended(p, job, timeout=20.0):
    """Drive refresh until the block is terminal (real processes: bounded wait)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        p.refresh()
        (st,) = p.status([job])
        if st.terminal:
            return st
        time.sleep(0.02)
    raise AssertionError(f"block {job} still {st.state} after {timeout} s")


# ---------------------------------------------------------------------------- pickling
CONFIG = dict(base_url="http://127.0.0.1:1", token="bsr_secret", gpus_per_block=8,
              lease_duration=300.0, adaptive=False, init_blocks=2, min_blocks=1, max_blocks=3,
              worker_init="module load python", label="gpu-lane", poll_period=2.0,
              renew_margin=40.0, cores_per_node=16, mem_per_node=64.0, background=False)
FIELDS = ("campaign", "gpus_per_block", "lease_duration", "adaptive", "min_units",
          "init_blocks", "min_blocks", "max_blocks", "worker_init", "label", "poll_period",
          "renew_margin", "cores_per_node", "mem_per_node", "background", "_remote")


def _config_of(p):
    return {f: getattr(p, f) for f in FIELDS}


def test_the_provider_class_is_module_level_and_keeps_the_public_path():
    import bursarcore.adapters.parsl as public
    import bursarcore.adapters.parsl_provider as impl

    assert public.BursarProvider is impl.BursarProvider
    assert BursarProvider.__module__ == "bursarcore.adapters.parsl_provider"
    assert BursarProvider.__qualname__ == "BursarProvider"       # not "<locals>"
    assert pickle.loads(pickle.dumps(BursarProvider)) is BursarProvider


def test_pickle_round_trip_keeps_the_configuration(tmp_path):
    p = BursarProvider("sci", launcher=LocalLauncher(str(tmp_path), per_node=True), **CONFIG)
    job = p.submit("sleep 1", 1)                    # a block: state, not configuration
    q = pickle.loads(pickle.dumps(p))
    assert type(q) is BursarProvider and q is not p
    assert _config_of(q) == _config_of(p)
    assert q.api.base_url == p.api.base_url and q.api is not p.api
    assert isinstance(q.launcher, LocalLauncher)
    assert q.launcher.script_dir == str(tmp_path) and q.launcher.per_node is True
    assert q.status([job])[0].state == JobState.UNKNOWN     # the copy holds no blocks
    assert _config_of(copy.deepcopy(p)) == _config_of(p)
    p.close(timeout=1)


def test_a_pickled_provider_loads_in_a_fresh_interpreter():
    blob = pickle.dumps(BursarProvider("sci", **CONFIG))
    code = ("import pickle, sys\n"
            "p = pickle.loads(sys.stdin.buffer.read())\n"
            "print(type(p).__module__, p.campaign, p.gpus_per_block, p.max_blocks, p.label)\n")
    r = subprocess.run([sys.executable, "-c", code], input=blob, capture_output=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr.decode()
    assert r.stdout.decode().split() == ["bursarcore.adapters.parsl_provider", "sci", "8", "3",
                                         "gpu-lane"]


def test_a_provider_on_an_in_process_broker_refuses_to_pickle_naming_the_argument():
    _, _, p, _ = make()
    with pytest.raises(TypeError, match=r"broker=.*base_url= and token="):
        pickle.dumps(p)


# ---------------------------------------------------------------------------- output paths
def test_a_failed_block_names_its_output_files_and_parsl_shows_them(tmp_path):
    _, p = _local(tmp_path)
    go = tmp_path / "go"          # the block exits only once the running state was read
    job = p.submit(f"echo to-stdout; echo to-stderr >&2; "
                   f"while [ ! -e {go} ]; do sleep 0.02; done; exit 3", 1)
    p.refresh()
    (running,) = p.status([job])
    go.touch()
    assert running.state == JobState.RUNNING
    assert running.stdout_path == str(tmp_path / f"{job}.out")
    assert running.stderr_path == str(tmp_path / f"{job}.err")
    st = _until_ended(p, job)
    assert st.state == JobState.FAILED and st.exit_code == 3
    assert st.stdout_path == str(tmp_path / f"{job}.out")
    assert "to-stdout" in st.stdout_summary and "to-stderr" in st.stderr_summary
    text = str(_get_error({"0": st}))               # what Parsl's error handler raises
    assert "EXIT CODE: 3" in text and "to-stdout" in text and "to-stderr" in text


def test_local_launcher_points_at_the_process_that_failed(tmp_path):
    from bursarcore.broker import Lease

    lease = Lease(7, "sci", "gpu", 2, "active", True, "agent-burst", 0.0, 0.0, 10.0, 1.0,
                  None, 3, (("n0", 1), ("n1", 1)), (0, 1))
    ll = LocalLauncher(str(tmp_path), per_node=True)
    h = ll.start("blk", '[ "$BURSAR_NODE" = n1 ] && exit 4; exit 0', lease, {})
    for proc in h:
        proc.wait(10)
    assert ll.poll(h) == 4
    assert ll.outputs(h) == (str(tmp_path / "blk.1.out"), str(tmp_path / "blk.1.err"))


def test_binding_launcher_names_the_bindings_log_files(tmp_path):
    fb = FakeBinding()
    assert BindingLauncher(fb).outputs(fb.Handle(5)) == (None, None)   # no log_dir

    class Part:
        def __init__(self, code):
            self.code = code

        def poll(self):
            return self.code

    h = fb.Handle(5)
    h.parts = [Part(0), Part(9)]
    fb.log_dir = str(tmp_path)
    assert BindingLauncher(fb).outputs(h) == (str(tmp_path / "lease-5.1.out"),
                                              str(tmp_path / "lease-5.1.err"))


def test_a_launcher_without_outputs_gives_a_status_without_paths():
    _, _, p, rec = make()
    job = p.submit("cmd", 1)
    p.refresh()
    rec.exit[job] = 1
    p.refresh()
    (st,) = p.status([job])
    assert st.state == JobState.FAILED and st.stdout_path is None and st.stderr_path is None


# ---------------------------------------------------------------------------- tasks_per_node
def test_tasks_per_node_copies_of_the_worker_run_on_the_block(tmp_path):
    _, p = _local(tmp_path, worker_init="echo init-once")
    job = p.submit('echo "copy $1"', 3)
    st = _until_ended(p, job)
    assert st.state == JobState.COMPLETED
    lines = (tmp_path / f"{job}.out").read_text().split("\n")
    assert lines.count("init-once") == 1
    assert sorted(l for l in lines if l.startswith("copy")) == ["copy 1", "copy 2", "copy 3"]


def test_one_failed_copy_fails_the_block(tmp_path):
    _, p = _local(tmp_path)
    job = p.submit('[ "$1" = 2 ] && exit 7; exit 0', 3)
    st = _until_ended(p, job)
    assert st.state == JobState.FAILED


def test_one_task_per_node_runs_the_command_as_given():
    _, _, p, rec = make()
    p.submit("process_worker_pool.py --block_id=0", 1)
    p.refresh()
    assert rec.started[0][1] == "process_worker_pool.py --block_id=0"


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", True, None])
def test_a_bad_tasks_per_node_is_refused_naming_the_field_and_records_nothing(bad):
    _, _, p, rec = make()
    with pytest.raises(InvalidArgument) as e:
        p.submit("cmd", bad)
    assert e.value.field == "tasks_per_node"
    assert p._blocks == {} and p.resources == {}
    p.refresh()
    assert rec.started == []
