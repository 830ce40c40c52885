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
    """Base class of every exception bursarcore raises on purpose.

    Catching it catches every deliberate error of the library and nothing else, so a
    caller can tell bursarcore's refusals of its input from bugs (a plain ``TypeError``
    or ``KeyError`` escaping is one).
    """


class InvalidArgument(BursarError, ValueError):
    """An argument broke a rule.

    Raised by every public call for bad input, before any state changes, so a caller may
    fix the argument and call again. Also a :class:`ValueError`.

    Parameters
    ----------
    field : str
        The offending argument or field, as the caller spelled it (``"units[gpu].min"``).
    rule : str
        What was required (``"must be <= max (4)"``).
    value : object, optional
        The value that broke the rule, shown (shortened) in the message.
    """

    def __init__(self, field: str, rule: str, value: object = None) -> None:
        self.field = field
        self.rule = rule
        self.value = value
        super().__init__(f"{field}: {rule} (got {_safe_repr(value)})")

    # keep field/rule through pickling (multiprocessing, services)
    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (type(self), (self.field, self.rule, self.value))


class TimeWentBackwards(InvalidArgument):
    """``now`` is earlier than a bucket's or the broker's last update.

    Raised by token buckets and by the broker (a clock that ran backwards, or an
    ``admit_batch(now=...)`` before the broker time): time never runs backwards, so a
    decision can never be taken in the past of one already taken (SPEC §2). An
    :class:`InvalidArgument`; nothing changes.
    """


class UnknownCampaign(InvalidArgument, KeyError):
    """A campaign name that was never registered.

    Raised by every :class:`~bursarcore.Broker` call that names a campaign (``acquire``,
    ``supply``, ``quote``, ``consume``, ``pending``, ...). Both an
    :class:`InvalidArgument` (``field`` is ``"campaign"``) and a :class:`KeyError`.
    """

    def __str__(self) -> str:  # KeyError would quote the whole message
        return InvalidArgument.__str__(self)


class UnknownLease(InvalidArgument, KeyError):
    """A lease or intent id the broker does not hold.

    Raised by ``release``, ``renew``, ``lease`` and ``cancel`` for an id this broker never
    issued (``field`` is ``"lease_id"`` or ``"intent_id"``), and by ``lease`` for an ended
    lease whose record was reused. Both an :class:`InvalidArgument` and a
    :class:`KeyError`. An ended lease this broker still records is not an error:
    ``release`` and ``renew`` refuse it with reason ``invalid``.
    """

    def __str__(self) -> str:
        return InvalidArgument.__str__(self)


class JournalCorrupt(BursarError):
    """A journal file or database could not be read back.

    Raised when replaying or reading a journal finds a record that is malformed or does not
    follow from the ones before it: a broker rebuilt from it would not be the one that
    wrote it, so nothing is rebuilt.

    Parameters
    ----------
    record : object
        Where: the record's seq, or a line or row of the file.
    problem : str
        What is wrong with it.
    """

    def __init__(self, record: object, problem: str) -> None:
        self.record = record
        self.problem = problem
        super().__init__(f"journal record {record}: {problem}")

    # the default would call __init__ with the message alone
    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (type(self), (self.record, self.problem))


class JournalUnavailable(BursarError):
    """A journal file cannot be opened as asked.

    Raised when a journal is opened, before anything is read into a broker, so a caller can
    act on ``kind`` (create the file, wait for the lock, restore a copy) and retry.

    Parameters
    ----------
    path : object
        The file.
    problem : str
        What is wrong, as a predicate of the file (``"does not exist"``).
    kind : str, optional
        One of ``missing`` (no file, and creating one was not asked for), ``empty`` (it
        holds no records), ``exists`` (asked to create one where a journal is), ``locked``
        (another process has it open), ``lost`` (it ends before records that were
        acknowledged) and ``unreadable`` (the default).
    """

    def __init__(self, path: object, problem: str, kind: str = "unreadable") -> None:
        self.path = path
        self.problem = problem
        self.kind = kind
        super().__init__(f"journal {path} {problem}")

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (type(self), (self.path, self.problem, self.kind))


class CommandError(BursarError, RuntimeError):
    """A scheduler command of a facility binding failed.

    Raised by the facility bindings when ``sbatch``, ``qsub``, ``scancel`` and the like exit
    non-zero, time out or are not found; the message carries the command, the exit and the
    error output, so the scheduler's own words reach the caller. Also a
    :class:`RuntimeError`, and importable from :mod:`bursarcore.adapters`.

    Parameters
    ----------
    argv : sequence of str
        The command as run.
    returncode : int or None
        Its exit status; None for a timeout or a program that could not start.
    stderr : str
        Its error output (long output is shortened in the message).
    stdout : str, optional
        Its output.
    """

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
