"""The API reference (docs/api/) builds with Sphinx, warnings as errors.

Needs the ``docs`` extra (``pip install ".[docs]"``); skipped without Sphinx. The build
imports the tree under test (docs/api/conf.py puts ``src/`` first), so a docstring that
breaks reStructuredText fails here, naming the file and line.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("sphinx", reason="the API reference needs the docs extra (sphinx)")

ROOT = Path(__file__).resolve().parents[2]


def sphinx_build(src: Path, out: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])}
    return subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q",
                           "-b", "html", "-d", str(out / ".doctrees"), str(src), str(out)],
                          capture_output=True, text=True, env=env, timeout=600)


def test_a_broken_docstring_fails_the_build(tmp_path):
    """The build really is strict: the same settings over a module whose docstring is
    bad reStructuredText fail, naming it."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "badmod.py").write_text(
        'def f():\n    """Summary.\n\n    text\n        indented without a blank line\n'
        '    back\n    """\n', encoding="utf-8")
    (tmp_path / "conf.py").write_text(
        "import sys; sys.path.insert(0, %r)\n"
        "extensions = ['sphinx.ext.autodoc', 'sphinx.ext.napoleon']\n" % str(tmp_path / "src"),
        encoding="utf-8")
    (tmp_path / "index.rst").write_text("t\n=\n\n.. automodule:: badmod\n   :members:\n",
                                        encoding="utf-8")
    r = sphinx_build(tmp_path, tmp_path / "out")
    assert r.returncode != 0 and "docstring of badmod.f" in r.stderr and "WARNING" in r.stderr


def test_api_reference_builds_without_warnings(tmp_path):
    out = tmp_path / "html"
    r = sphinx_build(ROOT / "docs" / "api", out)
    assert r.returncode == 0, r.stderr
    assert r.stderr.strip() == ""
    # the pages document the names, not just their titles
    broker = (out / "broker.html").read_text(encoding="utf-8")
    for name in ("Broker", "Broker.acquire", "Broker.admit_batch", "Broker.replay", "Envelope",
                 "Intent", "Decision", "ManualClock"):
        assert f'id="bursarcore.{name}"' in broker, name
    for page, name in (("journal", "bursarcore.journal.SQLiteJournal"),
                       ("numbers", "bursarcore.units.real"),
                       ("flow", "bursarcore.flow.FlowEngine"),
                       ("service", "bursarcore.client.BursarClient"),
                       ("adapters", "bursarcore.adapters.PoolManager"),
                       ("runtime", "bursarcore.runtime.TaskQueue"),
                       ("sim", "bursarcore.sim.Simulation")):
        assert f'id="{name}"' in (out / f"{page}.html").read_text(encoding="utf-8"), name
