"""Plugins adapt agent frameworks to the worker; secrets reach agents and nothing else.

SPEC §13 (after RASER §3: "plugins connect the generic orchestrator to agent frameworks by
handling setup, injecting variables, updating heartbeats, and adding state-saving hooks").
The worker calls, for each claimed task (``ctx`` is a :class:`TaskContext`)::

    setup(ctx)                      after the workspace is ready (fresh or restored)
    restore(ctx, state)             only when resuming, with the bytes save() returned
    environment(ctx) -> {str: str}  variables for the agent (secrets are added by the worker)
    command(ctx) -> [argv...]       the agent process, run in the workspace by the runner
    heartbeat(ctx) -> dict | None   every --heartbeat s; stored in the queue record
    save(ctx) -> bytes              after the agent stopped on SIGTERM; goes in the checkpoint
    result(ctx, returncode) -> JSON after the agent exited 0; the task's result

Hooks run in the worker process, on the host, never inside the agent's sandbox.

Plugins are found by name: the entry-point group ``bursarcore.runtime.plugins`` first, then
the built-ins (``command``, ``counter``), which are available even when the package's
metadata is not installed. A task names its plugin in ``payload["plugin"]`` (default
``command``).

Secrets (:func:`load_secrets`) come from a ``KEY=VALUE`` file that only its owner may read;
the worker puts them in the agent's environment and nowhere else, and
:class:`SecretRedactor` replaces their values in every log record and queue record.
"""

from __future__ import annotations

import json
import logging
import os
import re
import stat
import sys
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, Callable, Iterable, Mapping

from ..errors import InvalidArgument

__all__ = [
    "ENTRY_POINT_GROUP",
    "Plugin",
    "TaskContext",
    "CommandPlugin",
    "CounterPlugin",
    "BUILTIN_PLUGINS",
    "load_plugin",
    "available_plugins",
    "plugin_name",
    "load_secrets",
    "SecretRedactor",
    "runtime_dir",
]

ENTRY_POINT_GROUP = "bursarcore.runtime.plugins"
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
REDACTED = "***"


def runtime_dir() -> str:
    """The directory holding the ``bursarcore`` package (what agents need on PYTHONPATH
    and what sandboxes bind read-only)."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))


@dataclass
class TaskContext:
    """What a plugin knows about the task it serves.

    ``workspace``: the task's private directory on the host (the agent runs in it, or in
    its sandbox view of it). ``attempt``: claims so far, this one included.
    ``resumed_from``: the checkpoint seq restored for this attempt, or ``None``.
    ``secrets``: name → value; for :meth:`Plugin.environment` to rename or select, never
    to log (the repr hides the values).
    """

    task_id: str
    payload: Any
    workspace: str
    attempt: int = 1
    resumed_from: int | None = None
    secrets: Mapping[str, str] = field(default_factory=dict, repr=False)
    logger: logging.Logger = field(default_factory=lambda: logging.getLogger("bursarcore.runtime.plugin"))


class Plugin:
    """Base class: every hook has a no-op default, so a plugin overrides what it needs.

    ``command`` has no sensible default and raises; every other hook may be left alone.
    """

    name = "plugin"

    def setup(self, ctx: TaskContext) -> None:
        """Prepare the workspace (validate the payload, write config files)."""

    def environment(self, ctx: TaskContext) -> Mapping[str, str]:
        """Extra environment variables for the agent."""
        return {}

    def command(self, ctx: TaskContext) -> list[str]:
        """The agent's argv, run with the workspace as its working directory."""
        raise NotImplementedError(f"plugin {self.name!r} does not define command()")

    def heartbeat(self, ctx: TaskContext) -> Mapping[str, Any] | None:
        """Progress to store with the queue heartbeat (JSON-serialisable), or ``None``."""
        return None

    def save(self, ctx: TaskContext) -> bytes:
        """The agent's state after it stopped on SIGTERM (the workspace is archived too)."""
        return b""

    def restore(self, ctx: TaskContext, state: bytes) -> None:
        """Reinstate ``state`` (from :meth:`save`) before the agent starts again."""

    def result(self, ctx: TaskContext, returncode: int) -> Any:
        """The task's result after the agent exited 0 (JSON-serialisable)."""
        return {"returncode": returncode}


def _payload_dict(ctx: TaskContext) -> dict[str, Any]:
    if not isinstance(ctx.payload, dict):
        raise InvalidArgument("payload", "must be a JSON object", type(ctx.payload).__name__)
    return ctx.payload


class CommandPlugin(Plugin):
    """Runs an unmodified CLI agent: payload ``{"plugin": "command", "argv": [...],
    "env": {...}, "result_file": "out.json"}`` (``env`` and ``result_file`` optional).

    The agent's state is its workspace, so :meth:`save` returns nothing; an agent that
    wants to resume must pick up where it left off from its files. The result is
    ``{"returncode": 0}`` plus, with ``result_file``, that workspace file's JSON under
    ``"output"``.
    """

    name = "command"

    def setup(self, ctx: TaskContext) -> None:
        p = _payload_dict(ctx)
        argv = p.get("argv")
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
            raise InvalidArgument("payload.argv", "must be a non-empty list of strings", argv)
        env = p.get("env", {})
        if not isinstance(env, dict) or not all(
                isinstance(k, str) and _KEY.match(k) and isinstance(v, str) for k, v in env.items()):
            raise InvalidArgument("payload.env", "must map variable names to strings", env)
        rf = p.get("result_file")
        if rf is not None and (not isinstance(rf, str) or os.path.isabs(rf) or ".." in rf.split("/")):
            raise InvalidArgument("payload.result_file", "must be a relative path inside the workspace", rf)

    def environment(self, ctx: TaskContext) -> Mapping[str, str]:
        return dict(_payload_dict(ctx).get("env", {}))

    def command(self, ctx: TaskContext) -> list[str]:
        return list(_payload_dict(ctx)["argv"])

    def result(self, ctx: TaskContext, returncode: int) -> Any:
        out: dict[str, Any] = {"returncode": returncode}
        rf = _payload_dict(ctx).get("result_file")
        if rf:
            path = os.path.join(ctx.workspace, rf)
            try:
                with open(path, "rb") as f:
                    out["output"] = json.loads(f.read())
            except (OSError, ValueError) as exc:
                raise InvalidArgument("payload.result_file", f"could not read JSON from it: {exc}", rf) from None
        return out


class CounterPlugin(Plugin):
    """The example stateful agent (:mod:`bursarcore.runtime.examples.counter`).

    Payload ``{"plugin": "counter", "steps": N, "step_seconds": 0.1}``. The agent keeps
    ``state.json`` (``{"step": k, ...}``) in its workspace; :meth:`save` returns it and
    :meth:`restore` writes it back marking the resume, so the result
    ``{"steps": N, "resumed_at_step": k | None, "checkpoints_resumed": n}`` proves a task
    was resumed from step ``k`` rather than restarted.
    """

    name = "counter"
    STATE = "state.json"

    def setup(self, ctx: TaskContext) -> None:
        p = _payload_dict(ctx)
        steps = p.get("steps")
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
            raise InvalidArgument("payload.steps", "must be an integer >= 0", steps)
        sec = p.get("step_seconds", 0.1)
        if isinstance(sec, bool) or not isinstance(sec, (int, float)) or not 0 <= sec <= 3600:
            raise InvalidArgument("payload.step_seconds", "must be a number in [0, 3600]", sec)

    def environment(self, ctx: TaskContext) -> Mapping[str, str]:
        # the agent imports bursarcore; inside a sandbox only the bind-mounted runtime is there
        pp = os.environ.get("PYTHONPATH")
        return {"PYTHONPATH": runtime_dir() + (os.pathsep + pp if pp else "")}

    def command(self, ctx: TaskContext) -> list[str]:
        p = _payload_dict(ctx)
        return [sys.executable, "-m", "bursarcore.runtime.examples.counter",
                "--steps", str(p["steps"]), "--step-seconds", repr(float(p.get("step_seconds", 0.1))),
                "--state", self.STATE]

    def _read(self, ctx: TaskContext) -> dict[str, Any] | None:
        try:
            with open(os.path.join(ctx.workspace, self.STATE), "rb") as f:
                data = json.loads(f.read())
        except FileNotFoundError:
            return None
        except ValueError as exc:
            ctx.logger.warning("task %s: %s unreadable (%s)", ctx.task_id, self.STATE, exc)
            return None
        return data if isinstance(data, dict) else None

    def heartbeat(self, ctx: TaskContext) -> Mapping[str, Any] | None:
        s = self._read(ctx)
        return None if s is None else {"step": s.get("step", 0), "steps": _payload_dict(ctx)["steps"]}

    def save(self, ctx: TaskContext) -> bytes:
        s = self._read(ctx)
        return b"" if s is None else json.dumps(s).encode()

    def restore(self, ctx: TaskContext, state: bytes) -> None:
        if not state:
            return  # preempted before its first step: a fresh start
        s = json.loads(state)
        s["resumed_at_step"] = int(s.get("step", 0))
        s["checkpoints_resumed"] = int(s.get("checkpoints_resumed", 0)) + 1
        from .examples.counter import write_state
        write_state(os.path.join(ctx.workspace, self.STATE), s)
        ctx.logger.info("task %s: counter resumes at step %d (resume #%d)", ctx.task_id,
                        s["resumed_at_step"], s["checkpoints_resumed"])

    def result(self, ctx: TaskContext, returncode: int) -> Any:
        s = self._read(ctx) or {}
        return {"steps": int(s.get("step", 0)), "resumed_at_step": s.get("resumed_at_step"),
                "checkpoints_resumed": int(s.get("checkpoints_resumed", 0))}


BUILTIN_PLUGINS: dict[str, Callable[[], Plugin]] = {"command": CommandPlugin, "counter": CounterPlugin}
"""Plugins available without installed package metadata."""

_log = logging.getLogger("bursarcore.runtime.plugins")


def _entry_points() -> dict[str, Any]:
    try:
        eps = metadata.entry_points(group=ENTRY_POINT_GROUP)
    except Exception as exc:  # noqa: BLE001 - broken metadata must not stop the built-ins
        _log.warning("cannot read entry points of %s: %s", ENTRY_POINT_GROUP, exc)
        return {}
    return {ep.name: ep for ep in eps}


def available_plugins() -> list[str]:
    """Names :func:`load_plugin` accepts: installed entry points and the built-ins."""
    return sorted(set(_entry_points()) | set(BUILTIN_PLUGINS))


def plugin_name(payload: Any) -> Any:
    """The plugin a task's payload names: ``payload["plugin"]``, ``command`` when the
    payload is not an object or names none. Not checked here (see :func:`load_plugin`)."""
    return payload.get("plugin", "command") if isinstance(payload, dict) else "command"


def load_plugin(name: str) -> Plugin:
    """A new instance of the plugin ``name``.

    The entry point of that name in ``bursarcore.runtime.plugins`` wins; if it cannot be
    loaded and a built-in has the name, the built-in is used (with a warning). The entry
    point must name a :class:`Plugin` subclass or a factory returning an instance.
    """
    if not isinstance(name, str) or not name:
        raise InvalidArgument("plugin", "must be a non-empty string", name)
    ep = _entry_points().get(name)
    factory: Any = None
    if ep is not None:
        try:
            factory = ep.load()
        except Exception as exc:  # noqa: BLE001 - report which plugin failed and why
            if name not in BUILTIN_PLUGINS:
                raise InvalidArgument("plugin", f"entry point {ep.value} failed to load: {exc}", name) from exc
            _log.warning("plugin %s: entry point %s failed to load (%s); using the built-in",
                         name, ep.value, exc)
    if factory is None:
        factory = BUILTIN_PLUGINS.get(name)
    if factory is None:
        raise InvalidArgument("plugin", f"unknown plugin; available: {', '.join(available_plugins())}", name)
    plugin = factory()
    if not isinstance(plugin, Plugin):
        raise InvalidArgument("plugin", "entry point must give a bursarcore.runtime.plugins.Plugin", name)
    return plugin


# ---------------------------------------------------------------------- secrets
def load_secrets(path: str | os.PathLike[str]) -> dict[str, str]:
    """Read ``KEY=VALUE`` lines (blank lines, ``#`` comments and an ``export`` prefix
    allowed; one layer of matching quotes stripped).

    Refuses a file that is not a regular file owned by this user, or that group or others
    may access at all (``chmod 600`` fixes it). Errors name the line, never the value.
    """
    path = os.fspath(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as exc:
        raise InvalidArgument("secrets", f"cannot open the secrets file: {exc.strerror}", path) from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise InvalidArgument("secrets", "must be a regular file", path)
        if st.st_uid != os.geteuid():
            raise InvalidArgument("secrets", f"must be owned by uid {os.geteuid()} (owned by "
                                  f"{st.st_uid})", path)
        if st.st_mode & 0o077:
            raise InvalidArgument("secrets", f"group/others may access it (mode "
                                  f"{stat.S_IMODE(st.st_mode):04o}); run chmod 600 on it", path)
        try:
            text = f.read().decode()
        except UnicodeDecodeError:
            raise InvalidArgument("secrets", "must be UTF-8 text", path) from None
    out: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        if s.startswith("export "):
            s = s[7:].lstrip()
        key, sep, value = s.partition("=")
        key = key.strip()
        if not sep or not _KEY.match(key):
            raise InvalidArgument(f"secrets line {n}", "must be KEY=VALUE with KEY a variable name", path)
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        out[key] = value
    return out


class SecretRedactor(logging.Filter):
    """Replaces every secret value with ``***`` in log records (message, arguments,
    exception and stack text) and, through :meth:`redact` / :meth:`redact_json`, in
    anything else the worker writes (queue records, agent logs).

    Attach it to *handlers* (:meth:`install`): a logger's own filters do not see records
    propagated from child loggers.
    """

    def __init__(self, values: Iterable[str] = ()) -> None:
        super().__init__()
        # longest first, so a secret containing another is replaced whole
        self.values = sorted({v for v in values if v}, key=len, reverse=True)

    def redact(self, text: str) -> str:
        for v in self.values:
            if v in text:
                text = text.replace(v, REDACTED)
        return text

    def redact_json(self, obj: Any) -> Any:
        """A copy of a JSON value with secrets replaced in every string (keys too)."""
        if not self.values:
            return obj
        if isinstance(obj, str):
            return self.redact(obj)
        if isinstance(obj, list):
            return [self.redact_json(x) for x in obj]
        if isinstance(obj, dict):
            return {self.redact(str(k)): self.redact_json(v) for k, v in obj.items()}
        return obj

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.values:
            return True
        msg = record.getMessage()
        red = self.redact(msg)
        if red != msg:
            record.msg, record.args = red, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self.redact(record.exc_text)
        if record.stack_info:
            record.stack_info = self.redact(record.stack_info)
        return True

    def install(self, logger: logging.Logger | None = None) -> None:
        """Add this filter to every handler of ``logger`` (default: the root logger)."""
        for h in (logger or logging.getLogger()).handlers:
            if self not in h.filters:
                h.addFilter(self)
