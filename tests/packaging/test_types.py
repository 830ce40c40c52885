"""The typed surface: mypy over src/bursarcore with the committed configuration
([tool.mypy] in pyproject.toml), the public modules under ``--strict``, a user's program
type-checked against the public API (the operations keep their signatures through the
journal's ``@_op`` wrapper), and the compiled modules' ``.pyi`` stubs checked against the
modules themselves (``stubtest``). Each fails on any error; skipped only without mypy."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("mypy")

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
PKG = SRC / "bursarcore"

# what a user imports directly: the modules [tool.mypy] holds to the strict flags
PUBLIC = ["__init__.py", "errors.py", "units.py", "clock.py", "buckets.py", "broker.py",
          "admission/__init__.py", "admission/classes.py", "admission/envelope.py",
          "admission/state.py", "admission/results.py", "admission/batch.py",
          "leases/__init__.py", "leases/types.py", "flow.py"]
# the compiled modules with a stub beside them
COMPILED = ["_engine", "_acquire", "_results", "_buckets", "_flow", "_batchprep", "_journalfill",
            "_cffi_core"]


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One mypy cache for the module's runs (the repository's tree stays clean)."""
    return tmp_path_factory.mktemp("mypy-cache")


def _run(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, capture_output=True,
                          text=True, env={**os.environ, **env}, timeout=600)


def _mypy(args: list[str], cache: Path, cwd: Path = ROOT,
          **env: str) -> subprocess.CompletedProcess[str]:
    return _run(["mypy", "--cache-dir", str(cache), "--no-color-output", *args], cwd, **env)


def _check(r: subprocess.CompletedProcess[str]) -> None:
    assert r.returncode == 0, f"mypy found errors:\n{r.stdout}{r.stderr}"
    assert "Success: no issues found" in r.stdout, r.stdout + r.stderr


def test_mypy_src_with_committed_config(cache: Path) -> None:
    """``mypy`` in the repository root: pyproject.toml's files, overrides and flags."""
    r = _mypy([], cache)
    _check(r)


def test_public_modules_pass_strict(cache: Path) -> None:
    """``mypy --strict`` itself (not only the flags the config spells out) on the public
    modules; what they import is followed but not reported."""
    r = _mypy(["--strict", "--follow-imports=silent", *(str(PKG / m) for m in PUBLIC)],
              cache)
    _check(r)


USER_PROGRAM = '''
from typing import Any, assert_type

import numpy as np

from bursarcore import (DEFAULT_CLASSES, BatchResult, Broker, Congestion, Decision, Envelope,
                        Event, Intent, Lease, ManualClock, MonotonicClock, Pool, Quote,
                        ServiceClass, Supply, TokenBuckets, __version__, available_backends,
                        errors, get_include, units)
from bursarcore.broker import Consumption

b = Broker(Pool(gpu=8, flow={"fs": 10.0}), clock=ManualClock(0.0))
assert_type(b.register("a", Envelope(credits=10, sustained={"gpu": 4})), int)
d = b.acquire(Intent("a", units={"gpu": (1, 2)}, duration=60))
assert_type(d, Decision)
assert_type(d.lease, Lease | None)
assert_type(b.release(1), Decision)
assert_type(b.renew(1, 30.0, max_spend=None), Decision)
assert_type(b.cancel(3), bool)
assert_type(b.leases(), list[Lease])
assert_type(b.poll(), list[Event])
assert_type(b.supply("a"), Supply)
assert_type(b.quote("a", [1, 2], [60.0]), Quote)
assert_type(b.consume("a", "fs", 1.0), Consumption)
assert_type(b.admit_batch(np.zeros(2, np.int64), np.ones(2, np.int64), 60.0), BatchResult)
assert_type(b.add_nodes("gpu", [("n9", 4)]), list[int])
assert_type(b.remove_nodes("gpu", ["n9"], grace=1.0), list[int])
assert_type(b.deficits(), dict[str, float])
assert_type(b.state(), dict[str, Any])
assert_type(units.to_ns(1.5), int)
TokenBuckets([4.0], [1.0])
assert issubclass(errors.InvalidArgument, ValueError)
assert_type(get_include(), str)
assert_type(__version__, str)
print(DEFAULT_CLASSES, Congestion, MonotonicClock, ServiceClass, available_backends())

# a wrong call is an error (the ignores below are used, or --strict reports them)
b.acquire("storm")  # type: ignore[arg-type]
b.release()  # type: ignore[call-arg]
b.renew(1, 30.0, spend=2.0)  # type: ignore[call-arg]
b.supply("a").no_such_field  # type: ignore[attr-defined]
'''


def test_user_program_sees_the_typed_api(cache: Path, tmp_path: Path) -> None:
    """A program using the public API checks under --strict: every operation has its
    own signature and result type (an untyped decorator would make them Any, and then
    the assert_type lines and the used ignores fail)."""
    prog = tmp_path / "user_program.py"
    prog.write_text(textwrap.dedent(USER_PROGRAM))
    (tmp_path / "none.ini").write_text("[mypy]\n")   # the user's own, empty configuration
    r = _mypy(["--strict", "--follow-imports=silent", "--python-version", "3.11",
               "--config-file", str(tmp_path / "none.ini"), str(prog)], cache, cwd=tmp_path,
              MYPYPATH=str(SRC))
    _check(r)


def test_compiled_stubs_match_the_modules(tmp_path: Path) -> None:
    """``stubtest``: every name, signature and class in the ``.pyi`` beside each compiled
    module is what the module has at run time (Cython's own module attributes aside)."""
    env = {"PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    have = [m for m in COMPILED if _importable(f"bursarcore.{m}", env)]
    if not have:      # src is not built in place: the installed modules beside their stubs
        env = {}
        have = [m for m in COMPILED if _importable(f"bursarcore.{m}", env)]
    if not have:
        pytest.skip("no compiled module is built (python setup.py build_ext --inplace)")
    cfg = tmp_path / "stubtest.ini"
    cfg.write_text("[mypy]\npython_version = 3.11\n")
    allow = Path(__file__).with_name("stubtest_allowlist.txt")
    r = _run(["mypy.stubtest", *(f"bursarcore.{m}" for m in have), "--mypy-config-file",
              str(cfg), "--allowlist", str(allow)], tmp_path, **env)
    assert r.returncode == 0, f"stubs differ from the compiled modules:\n{r.stdout}{r.stderr}"


def _importable(name: str, env: dict[str, str]) -> bool:
    r = subprocess.run([sys.executable, "-c", f"import {name}"], capture_output=True,
                       env={**os.environ, **env}, timeout=120)
    return r.returncode == 0
