"""Helpers for the binding tests: recorded command output fed through the seam.

``Script`` stands in for :meth:`Binding.execute`: it answers each command by the longest
matching argv prefix with recorded stdout/stderr (or a failure), and records every call,
so a test can check both what a binding made of the output and which commands it ran.
``FakeProc`` stands in for the ``Popen`` that :meth:`Binding.spawn` returns.
"""

from __future__ import annotations

import pathlib
import subprocess

from bursarcore.adapters import CommandError

HERE = pathlib.Path(__file__).parent
RECORDED = HERE / "recorded"
PBS_FIXTURES = HERE.parent / "fixtures" / "pbs"


class Script:
    def __init__(self) -> None:
        self.rules: list[tuple[tuple[str, ...], str, str, int]] = []
        self.calls: list[dict] = []

    def on(self, *prefix: str, stdout: str = "", stderr: str = "", rc: int = 0) -> "Script":
        self.rules.insert(0, (tuple(prefix), stdout, stderr, rc))
        return self

    def __call__(self, argv, *, input=None, env=None, timeout=None):
        argv = list(argv)
        self.calls.append({"argv": argv, "input": input, "env": env})
        best = None
        for prefix, out, err, rc in self.rules:
            if tuple(argv[:len(prefix)]) == prefix and (best is None or len(prefix) > len(best[0])):
                best = (prefix, out, err, rc)
        if best is None:
            raise CommandError(argv, 127, f"no recorded output for {argv}")
        _, out, err, rc = best
        if rc:
            raise CommandError(argv, rc, err, out)
        return subprocess.CompletedProcess(argv, 0, out, err)

    def ran(self, *prefix: str) -> list[list[str]]:
        return [c["argv"] for c in self.calls if tuple(c["argv"][:len(prefix)]) == prefix]


class FakeProc:
    """A Popen stand-in: ``finish(rc)`` ends it; signals are recorded."""

    _pids = iter(range(40000, 50000))

    def __init__(self, argv, env) -> None:
        self.argv, self.env = list(argv), dict(env)
        self.pid = next(self._pids)
        self.returncode = None
        self.signals: list[int] = []

    def poll(self):
        return self.returncode

    def wait(self, timeout=None):
        if self.returncode is None:
            raise subprocess.TimeoutExpired(self.argv, timeout)
        return self.returncode

    def send_signal(self, sig):
        self.signals.append(sig)

    def signal_group(self, sig):  # what ProcessHandle.send_group uses on a stand-in
        self.signals.append(sig)

    def finish(self, rc: int) -> None:
        self.returncode = rc


def recorded(name: str) -> str:
    return (RECORDED / name).read_text()


def pbs_fixture(name: str) -> str:
    return (PBS_FIXTURES / name).read_text()
