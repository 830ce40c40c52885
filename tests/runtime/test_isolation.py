"""Runners (SPEC §13): the plain process, a real bubblewrap sandbox, and the Apptainer
command line (Apptainer cannot be installed here, so only its construction is tested).

bwrap tests skip with a reason when ``bwrap`` is absent, unless ``BURSAR_REQUIRE_BWRAP=1``
makes its absence a failure. Their waits are bounded waits on real subprocesses."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time

import pytest

from bursarcore.errors import InvalidArgument
from bursarcore.runtime import isolation
from bursarcore.runtime.isolation import (
    ApptainerRunner,
    BwrapRunner,
    NoneRunner,
    RunnerUnavailable,
    get_runner,
    runtime_paths,
)
from bursarcore.runtime.plugins import runtime_dir

BWRAP = shutil.which("bwrap")


@pytest.fixture
def bwrap():
    if BWRAP is None:
        if os.environ.get("BURSAR_REQUIRE_BWRAP") == "1":
            pytest.fail("BURSAR_REQUIRE_BWRAP=1 but bwrap is not on PATH")
        pytest.skip("bubblewrap (bwrap) is not installed; BURSAR_REQUIRE_BWRAP=1 makes this a failure")
    return get_runner("bwrap")


def test_none_runner(tmp_path):
    r = get_runner("none")
    assert isinstance(r, NoneRunner)
    argv, env = r.prepare(["echo", "x"], workspace=str(tmp_path), env={"A": "1"})
    assert argv == ["echo", "x"] and env["A"] == "1" and env["PATH"] == os.environ["PATH"]
    assert r.workspace_path(str(tmp_path)) == str(tmp_path)
    _, env = NoneRunner(inherit_env=False).prepare(["x"], workspace=str(tmp_path), env={"A": "1"})
    assert env == {"A": "1"}


@pytest.mark.parametrize("kw, field", [
    ({"argv": []}, "argv"),
    ({"argv": "echo x"}, "argv"),
    ({"env": {"A=B": "1"}}, "env"),
    ({"env": {"A": 1}}, "env"),
    ({"binds": [("relative", "/x")]}, "binds"),
    ({"binds": [("/a", "/b", "rwx")]}, "binds"),
])
def test_prepare_rejects_bad_input(tmp_path, kw, field):
    args = {"argv": ["true"], "workspace": str(tmp_path), "env": {}, **kw}
    argv = args.pop("argv")
    with pytest.raises(InvalidArgument) as e:
        NoneRunner().prepare(argv, **args)
    assert e.value.field == field


def test_runtime_paths_cover_the_package_and_python():
    paths = runtime_paths()
    # the package's directory is bound itself, or inside a bound prefix (an installed
    # package lives in the venv's site-packages; a source checkout elsewhere)
    pkg = os.path.realpath(runtime_dir())
    assert any(pkg == p or pkg.startswith(p + "/") for p in paths)
    assert any(os.path.realpath(sys.executable).startswith(p + "/") for p in paths)
    for p in paths:  # no path nested in another
        assert not any(q != p and p.startswith(q + "/") for q in paths)


def test_missing_programs_give_clear_errors(monkeypatch):
    monkeypatch.setattr(isolation.shutil, "which", lambda name: None)
    with pytest.raises(RunnerUnavailable, match="bubblewrap program 'bwrap' not found on PATH"):
        get_runner("bwrap")
    with pytest.raises(RunnerUnavailable, match="Apptainer"):
        get_runner("apptainer", image="img.sif")
    with pytest.raises(InvalidArgument) as e:
        get_runner("apptainer")
    assert e.value.field == "image"
    with pytest.raises(InvalidArgument) as e:
        get_runner("docker")
    assert e.value.field == "runner"


# ---------------------------------------------------------------------- apptainer
def test_apptainer_command_construction(monkeypatch, tmp_path):
    monkeypatch.setattr(isolation.shutil, "which", lambda name: f"/opt/apptainer/bin/{name}")
    monkeypatch.setenv("APPTAINERENV_STALE", "from the host")
    r = get_runner("apptainer", image="/images/agent.sif")
    assert isinstance(r, ApptainerRunner) and r.binary == "/opt/apptainer/bin/apptainer"
    ws = tmp_path / "ws"
    ws.mkdir()
    argv, env = r.prepare(["python", "-m", "agent"], workspace=str(ws),
                          env={"TOKEN": "sekrit", "BURSAR_TASK_ID": "t1"},
                          binds=["/data", ("/models", "/m", "rw")])
    rt = [b for p in runtime_paths() for b in ("--bind", f"{p}:{p}:ro")]
    assert argv == ["/opt/apptainer/bin/apptainer", "exec", "--containall", "--cleanenv",
                    "--bind", f"{os.path.realpath(ws)}:/workspace", *rt,
                    "--bind", "/data:/data:ro", "--bind", "/models:/m:rw",
                    "--pwd", "/workspace", "/images/agent.sif", "python", "-m", "agent"]
    assert env["APPTAINERENV_TOKEN"] == "sekrit" and env["APPTAINERENV_BURSAR_TASK_ID"] == "t1"
    assert env["APPTAINERENV_HOME"] == "/workspace"
    assert "APPTAINERENV_STALE" not in env  # the host's leftovers never reach the container
    assert env["PATH"] == os.environ["PATH"]  # apptainer itself needs the host environment
    assert not any("sekrit" in a for a in argv)  # secrets never in argv (/proc is world-readable)
    assert r.workspace_path(str(ws)) == "/workspace"


# ---------------------------------------------------------------------- bwrap, really run
PROBE = textwrap.dedent("""
    import json, os, sys
    out = {}
    for p in sys.argv[1:]:
        try:
            with open(p, "w") as f:
                f.write("escaped")
            out[p] = "written"
        except OSError as e:
            out[p] = e.strerror
    with open("probe.json", "w") as f:
        json.dump({"results": out, "cwd": os.getcwd(), "token": os.environ.get("TOKEN"),
                   "pid": os.getpid(), "visible_root": sorted(os.listdir("/"))}, f)
""")


def test_bwrap_confines_writes_to_the_workspace(bwrap, tmp_path):
    import json
    ws = tmp_path / "ws"
    ws.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (ws / "probe.py").write_text(PROBE)
    targets = [str(outside / "x"), str(tmp_path / "x"), os.path.join(runtime_dir(), "x"),
               "/usr/x", "/etc/x", "/x", os.path.join(os.path.dirname(sys.executable), "x"),
               str(ws / "inside")]
    argv, env = bwrap.prepare([sys.executable, "probe.py", *targets], workspace=str(ws),
                              env={"TOKEN": "sekrit"})
    assert argv[0] == BWRAP and "--die-with-parent" in argv and "--unshare-pid" in argv
    assert not any("sekrit" in a for a in argv)
    p = subprocess.run(argv, env=env, cwd=str(ws), capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    res = json.loads((ws / "probe.json").read_text())
    assert res["cwd"] == os.path.realpath(ws) and res["token"] == "sekrit"
    assert res["pid"] < 10  # a new pid namespace
    assert res["results"][str(ws / "inside")] == "written"
    for t in targets[2:-1]:  # read-only everywhere outside the workspace and /tmp
        assert res["results"][t] == "Read-only file system", t
    # under /tmp a write lands in the sandbox's private tmpfs (or fails): never on the host
    # and nothing appeared on the host outside the workspace
    assert os.listdir(outside) == [] and not (tmp_path / "x").exists()
    assert not os.path.exists(os.path.join(runtime_dir(), "x")) and not os.path.exists("/x")
    # nothing of the host is visible beyond what the runner binds
    allowed = {"usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "opt", "proc",
               "dev", "tmp", "var"}
    allowed |= {p.split("/")[1] for p in runtime_paths()}
    assert set(res["visible_root"]) <= allowed


AGENT = textwrap.dedent("""
    import os, signal, sys, time
    def on_term(signum, frame):
        time.sleep(0.3)  # a save that takes a while: bwrap must not SIGKILL us meanwhile
        open("saved", "w").write("ok")
        sys.exit(0)
    signal.signal(signal.SIGTERM, on_term)
    open("started", "w").write("1")
    time.sleep(30)
    sys.exit(5)
""")


def _wait_for(path, timeout=20.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if os.path.exists(path):
            return True
        time.sleep(0.02)
    return False


def test_bwrap_terminate_reaches_the_agent_not_bwrap(bwrap, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "agent.py").write_text(AGENT)
    argv, env = bwrap.prepare([sys.executable, "agent.py"], workspace=str(ws), env={})
    proc = subprocess.Popen(argv, env=env, cwd=str(ws), start_new_session=True)
    try:
        assert _wait_for(ws / "started"), "agent did not start"
        bwrap.terminate(proc)
        assert proc.wait(timeout=20) == 0  # bwrap relays the agent's own exit status
        assert (ws / "saved").read_text() == "ok"
    finally:
        bwrap.kill(proc)
        proc.wait(timeout=20)


def test_bwrap_kill_stops_everything(bwrap, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    argv, env = bwrap.prepare(["sh", "-c", "trap '' TERM; touch started; sleep 30"],
                              workspace=str(ws), env={})
    proc = subprocess.Popen(argv, env=env, cwd=str(ws), start_new_session=True)
    assert _wait_for(ws / "started")
    bwrap.kill(proc)
    assert proc.wait(timeout=20) != 0


def test_bwrap_extra_binds_and_no_network_option(bwrap, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    data = tmp_path / "data"
    data.mkdir()
    (data / "in.txt").write_text("input")
    r = BwrapRunner(BWRAP, share_net=False)
    argv, env = r.prepare(["sh", "-c", "cat /data/in.txt > got; echo x > /data/new 2>/dev/null; true"],
                          workspace=str(ws), env={}, binds=[(str(data), "/data")])
    assert "--unshare-net" in argv
    subprocess.run(argv, env=env, cwd=str(ws), check=True, timeout=60)
    assert (ws / "got").read_text() == "input" and not (data / "new").exists()
