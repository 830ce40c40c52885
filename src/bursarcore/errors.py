"""Exceptions raised by bursarcore.

One base class, :class:`BursarError`. Bad input raises :class:`InvalidArgument`, which is
also a :class:`ValueError`, names the offending field and the rule it broke, and is raised
before any state is changed. A *denial* (not enough tokens, capacity, credits) is never an
exception: it is a value with a reason code.
"""

from __future__ import annotations

import shlex
from typing import Any, Sequence

__all__ = [
    "BursarError",
    "InvalidArgument",
    "TimeWentBackwards",
    "UnknownCampaign",
    "UnknownLease",
    "JournalCorrupt",
    "JournalUnavailable",
    "CommandError",
]


def _safe_repr(value: object) -> str:
    """``repr(value)``, short and never raising (a huge int's repr can raise ValueError)."""
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a message must never fail to build
        return f"<{type(value).__name__}>"
    return text if len(text) <= 200 else text[:197] + "..."


class BursarError(Exception):
    """Base class of every exception bursarcore raises on purpose."""


class InvalidArgument(BursarError, ValueError):
    """An argument broke a rule. ``field`` names it, ``rule`` says what was required."""

    def __init__(self, field: str, rule: str, value: object = None) -> None:
        self.field = field
        self.rule = rule
        self.value = value
        super().__init__(f"{field}: {rule} (got {_safe_repr(value)})")

    # keep field/rule through pickling (multiprocessing, services)
    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (type(self), (self.field, self.rule, self.value))


class TimeWentBackwards(InvalidArgument):
    """``now`` is earlier than a bucket's or the broker's last update."""


class UnknownCampaign(InvalidArgument, KeyError):
    """A campaign name that was never registered."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return InvalidArgument.__str__(self)


class UnknownLease(InvalidArgument, KeyError):
    """A lease or intent id the broker does not hold."""

    def __str__(self) -> str:
        return InvalidArgument.__str__(self)


class JournalCorrupt(BursarError):
    """A journal file or database could not be read back; ``record`` names where."""

    def __init__(self, record: object, problem: str) -> None:
        self.record = record
        self.problem = problem
        super().__init__(f"journal record {record}: {problem}")

    # the default would call __init__ with the message alone
    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (type(self), (self.record, self.problem))


class JournalUnavailable(BursarError):
    """A journal file cannot be opened as asked. ``path`` names the file, ``problem`` says
    what is wrong as a predicate of it (``"does not exist"``), and ``kind`` is one of
    ``missing`` (no file, and creating one was not asked for), ``empty`` (it holds no
    records), ``exists`` (asked to create one where a journal is), ``locked`` (another
    process has it open), ``lost`` (it ends before records that were acknowledged) and
    ``unreadable``."""

    def __init__(self, path: object, problem: str, kind: str = "unreadable") -> None:
        self.path = path
        self.problem = problem
        self.kind = kind
        super().__init__(f"journal {path} {problem}")

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (type(self), (self.path, self.problem, self.kind))


class CommandError(BursarError, RuntimeError):
    """A scheduler command of a facility binding failed (non-zero exit, timeout, or not
    found). ``argv``, ``returncode`` (None for a timeout or a missing program) and
    ``stderr`` say which and why; the message carries all three. Also importable from
    :mod:`bursarcore.adapters`."""

    def __init__(self, argv: Sequence[str], returncode: int | None, stderr: str,
                 stdout: str = "") -> None:
        self.argv = list(argv)
        self.returncode = returncode
        self.stderr = stderr
        self.stdout = stdout
        err = (stderr or "").strip()
        if len(err) > 2000:
            err = err[:1000] + " ... " + err[-900:]
        rc = "timed out or could not start" if returncode is None else f"exit {returncode}"
        super().__init__(f"command failed ({rc}): {shlex.join(self.argv)}: "
                         f"{err or '(no stderr)'}")

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (type(self), (self.argv, self.returncode, self.stderr, self.stdout))
