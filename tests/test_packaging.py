"""The distribution itself: one version everywhere, the console scripts' ``--version`` and
names, the interpreter floor, and that every third-party module the package imports is
declared in pyproject.toml. Fast: nothing here builds a wheel (``.ci/wheel-smoke`` does)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import bursarcore
from bursarcore import __main__ as bursar_cli
from bursarcore._version import __version__
from bursarcore.runtime import cli as run_cli
from bursarcore.runtime import worker as worker_cli

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "bursarcore"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())

SCRIPTS = {"bursar": bursar_cli.main, "bursar-run": run_cli.main,
           "bursar-worker": worker_cli.main}


# ------------------------------------------------------------------------- version
def test_version_is_written_once():
    assert bursarcore.__version__ == __version__
    assert re.fullmatch(r"\d+\.\d+\.\d+(?:(?:a|b|rc)\d+)?(?:\.dev\d+)?", __version__)
    project = PYPROJECT["project"]
    assert "version" not in project and "version" in project["dynamic"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {
        "attr": "bursarcore._version.__version__"}
    # no other module spells the version out
    literal = re.compile(r"""__version__\s*=\s*["']""")
    writers = [p.relative_to(SRC).as_posix() for p in SRC.rglob("*.py")
               if literal.search(p.read_text())]
    assert writers == ["_version.py"]


@pytest.mark.parametrize("prog", sorted(SCRIPTS))
def test_version_flag(prog, capsys):
    with pytest.raises(SystemExit) as exc:
        SCRIPTS[prog](["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"{prog} {__version__}"


@pytest.mark.parametrize("prog", sorted(SCRIPTS))
def test_help_names_the_installed_script(prog, capsys):
    with pytest.raises(SystemExit) as exc:
        SCRIPTS[prog](["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: {prog} ")
    assert "python -m" not in out.splitlines()[0]


def test_console_scripts_point_at_these_mains():
    scripts = PYPROJECT["project"]["scripts"]
    assert sorted(scripts) == sorted(SCRIPTS)
    for name, target in scripts.items():
        module, func = target.split(":")
        assert sys.modules[module].__dict__[func] is SCRIPTS[name]


def test_worker_version_as_a_module():
    # the form the Slurm batch scripts run: a fresh interpreter, light imports only
    out = subprocess.run([sys.executable, "-m", "bursarcore.runtime.worker", "--version"],
                         capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == f"bursar-worker {__version__}"
