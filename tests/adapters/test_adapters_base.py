"""The binding interface's own parts: the real command seam and its errors, the query
cache, state mapping with logging, names, handles."""

from __future__ import annotations

import logging
import pickle
import signal
import sys

import pytest

from bursarcore import ManualClock
from bursarcore.adapters import (CommandError, LeaseHandle, LocalBinding, ProcessHandle,
                                 map_state, node_name, split_node)
from bursarcore.adapters.base import exit_code_of
from bursarcore.errors import BursarError, InvalidArgument

from bindings_helpers import FakeProc


def binding(**kw):
    return LocalBinding(clock=ManualClock(0.0), **kw)


def test_execute_returns_output_and_raises_with_command_and_stderr():
    b = binding()
    cp = b.execute(["sh", "-c", "echo out; echo err >&2"])
    assert cp.stdout == "out\n" and cp.stderr == "err\n"
    with pytest.raises(CommandError) as e:
        b.execute(["sh", "-c", "echo partial; echo 'sbatch: error: no such partition' >&2; exit 3"])
    err = e.value
    assert isinstance(err, BursarError) and isinstance(err, RuntimeError)
    assert err.returncode == 3 and err.stdout == "partial\n"
    assert "exit 3" in str(err) and "no such partition" in str(err)
    assert "sh -c 'echo partial;" in str(err)             # the command, shell-quoted
    assert pickle.loads(pickle.dumps(err)).stderr == err.stderr
    assert b.execute(["sh", "-c", 'echo "$X"'], env={"X": "y"}).stdout == "y\n"
    assert b.execute(["cat"], input="stdin text").stdout == "stdin text"


def test_execute_timeout_and_missing_program():
    b = binding(command_timeout=0.2)
    with pytest.raises(CommandError, match="timed out") as e:
        b.execute(["sleep", "5"])
    assert e.value.returncode is None
    with pytest.raises(CommandError, match="could not start") as e:
        b.execute(["/nonexistent/squeue", "--json"])
    assert e.value.returncode is None


def test_query_caches_values_and_errors_for_the_interval():
    b = binding(min_interval=5.0)
    calls = []

    def ok():
        calls.append(1)
        return len(calls)

    assert b.query("k", ok) == 1 and b.query("k", ok) == 1
    b.clock.advance(5)
    assert b.query("k", ok) == 2

    def bad():
        calls.append(1)
        raise CommandError(["squeue"], 1, "down")

    n = len(calls)
    for _ in range(3):
        with pytest.raises(CommandError):
            b.query("e", bad)
    assert len(calls) == n + 1
    b.invalidate("e")
    with pytest.raises(CommandError):
        b.query("e", bad)
    assert len(calls) == n + 2


def test_map_state_logs_an_unknown_state_once(caplog):
    table = {"R": "running"}
    assert map_state(table, "R", scheduler="test") == "running"
    with caplog.at_level(logging.WARNING, logger="bursarcore.adapters"):
        assert map_state(table, "ZZ-new", scheduler="test") == "unknown"
        assert map_state(table, "ZZ-new", scheduler="test") == "unknown"
        assert map_state(table, "zz-node", scheduler="test", what="node") == "unknown"
    msgs = [r.getMessage() for r in caplog.records]
    assert sum("'ZZ-new'" in m for m in msgs) == 1 and any("node state 'zz-node'" in m for m in msgs)


def test_names_and_exit_codes():
    assert node_name("4711", "n017") == "4711/n017"
    assert split_node("4101.pbs-head/gpu-n01") == ("4101.pbs-head", "gpu-n01")
    for bad in ("nohost", "/h", "p/"):
        with pytest.raises(InvalidArgument):
            split_node(bad)
    assert exit_code_of(-9) == 137 and exit_code_of(3) == 3 and exit_code_of(None) is None


def test_lease_handle_aggregates_its_parts():
    a, b = FakeProc(["x"], {}), FakeProc(["y"], {})
    ha, hb = ProcessHandle(a, 1, "p", "h1", 2, ["x"]), ProcessHandle(b, 1, "p", "h2", 2, ["y"])
    h = LeaseHandle(1, [ha, hb])
    assert h.status == "running" and h.exit_code is None and h.wait(0.01) is None
    a.finish(0)
    assert h.status == "running"
    b.finish(2)
    assert h.status == "failed" and h.exit_code == 2 and h.wait(1) == 2
    hb.revoked = True
    assert h.status == "revoked"
    assert ha.send_group(signal.SIGTERM) is False        # ended: nothing to signal


def test_binding_options_are_validated():
    with pytest.raises(InvalidArgument):
        binding(dim="tpu")
    with pytest.raises(InvalidArgument):
        binding(min_interval=-1)
    with pytest.raises(InvalidArgument):
        LocalBinding(slots_per_node=0)


def test_spawned_process_gets_its_own_session(tmp_path):
    b = binding()
    p = b.spawn([sys.executable, "-c", "import os; print(os.getsid(0) == os.getpid())"],
                env={"PATH": "/usr/bin:/bin"}, stdout=open(tmp_path / "o", "w"))
    assert p.wait(10) == 0 and (tmp_path / "o").read_text().strip() == "True"
