"""What a binding launches for a lease (SPEC §12): one :class:`Handle` per host of the
lease's placement — a :class:`ProcessHandle` over a local process group, or a binding's
own kind — gathered in one :class:`LeaseHandle`.

A handle's :attr:`~Handle.status` tells a lease's work that ended by itself (``completed``,
``failed``) from work ended by enforcement or by its pilot's end (``revoked``); exit codes
are in shell convention (:func:`exit_code_of`).
"""

from __future__ import annotations

import abc
import os
import subprocess
import time
from typing import Any, Sequence

__all__ = ["Handle", "ProcessHandle", "LeaseHandle", "exit_code_of"]


def exit_code_of(returncode: int | None) -> int | None:
    """A Popen return code in shell convention: a death by signal N becomes 128 + N."""
    if returncode is None:
        return None
    return 128 - returncode if returncode < 0 else returncode


class Handle(abc.ABC):
    """One launched process group of a lease: on one host of one pilot."""

    def __init__(self, lease_id: int, pilot_id: str, host: str, slots: int,
                 argv: Sequence[str]) -> None:
        self.lease_id = lease_id
        self.pilot_id = pilot_id
        self.host = host
        self.slots = slots
        self.argv = list(argv)
        self.signalled: list[int] = []   # signals our enforcement delivered
        self.killed = False
        self.revoked = False             # its lease was revoked while it ran

    @abc.abstractmethod
    def poll(self) -> int | None:
        """The exit code (shell convention) once ended, else None."""

    @abc.abstractmethod
    def wait(self, timeout: float | None = None) -> int | None:
        """Wait (real time, bounded by ``timeout``) for the end; the exit code or None."""

    @property
    def exit_code(self) -> int | None:
        return self.poll()

    @property
    def status(self) -> str:
        """``running``, ``completed`` (exit 0), ``failed`` (non-zero exit) or ``revoked``
        (its lease was revoked while it ran: ended by our signal or kill, or by its
        pilot's end)."""
        rc = self.poll()
        if rc is None:
            return "running"
        if self.signalled or self.killed or self.revoked:
            return "revoked"
        return "completed" if rc == 0 else "failed"

    def __repr__(self) -> str:
        return (f"<{type(self).__name__} lease={self.lease_id} pilot={self.pilot_id} "
                f"host={self.host} slots={self.slots} status={self.status}>")


class ProcessHandle(Handle):
    """A handle over a local process (``Popen``), its own session and process group."""

    def __init__(self, proc: Any, lease_id: int, pilot_id: str, host: str, slots: int,
                 argv: Sequence[str]) -> None:
        super().__init__(lease_id, pilot_id, host, slots, argv)
        self.proc = proc

    @property
    def pid(self) -> int:
        return self.proc.pid

    def poll(self) -> int | None:
        return exit_code_of(self.proc.poll())

    def wait(self, timeout: float | None = None) -> int | None:
        try:
            return exit_code_of(self.proc.wait(timeout=timeout))
        except subprocess.TimeoutExpired:
            return None

    def send_group(self, sig: int) -> bool:
        """Signal the process group (the process started a session of its own). A
        stand-in process (a test's) may provide ``signal_group(sig)`` instead."""
        if self.proc.poll() is not None:
            return False
        own = getattr(self.proc, "signal_group", None)
        if own is not None:
            own(sig)
            return True
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            return False
        except PermissionError:  # pragma: no cover - not our group
            self.proc.send_signal(sig)
        return True


class LeaseHandle:
    """Everything launched for one lease (one part per host of its placement)."""

    def __init__(self, lease_id: int, parts: Sequence[Handle]) -> None:
        self.lease_id = lease_id
        self.parts = list(parts)

    @property
    def exit_code(self) -> int | None:
        """None while any part runs; then the largest part exit code."""
        codes = [p.poll() for p in self.parts]
        done = [c for c in codes if c is not None]
        if len(done) < len(codes):
            return None
        return max(done) if done else 0

    @property
    def status(self) -> str:
        """``running`` while any part runs; then ``revoked`` if any part was ended by
        enforcement, ``failed`` if any exited non-zero, else ``completed``."""
        states = [p.status for p in self.parts]
        if "running" in states:
            return "running"
        for s in ("revoked", "failed"):
            if s in states:
                return s
        return "completed"

    def wait(self, timeout: float | None = None) -> int | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        for p in self.parts:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if p.wait(left) is None:
                return None
        return self.exit_code

    def __repr__(self) -> str:
        return f"<LeaseHandle lease={self.lease_id} parts={len(self.parts)} status={self.status}>"
