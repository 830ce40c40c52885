"""How an agent process is isolated: plain, in a bubblewrap sandbox, or in Apptainer.

SPEC §13 (after RASER §3: "unmodified user containers with a runtime bind-mounted at
execution", "each agent gets a private workspace"). A :class:`Runner` turns the agent's
argv and environment into the command the worker executes::

    argv, env = runner.prepare(agent_argv, workspace=ws, env=agent_env, binds=extra)
    proc = subprocess.Popen(argv, env=env, cwd=ws, start_new_session=True)

``env`` passed in holds only what the agent must see beyond the base environment (the
plugin's variables, the secrets, ``BURSAR_*``); each runner decides the base:

* ``none`` — a plain process in the workspace, inheriting the worker's environment.
* ``bwrap`` — bubblewrap: new pid/ipc/uts(/cgroup) namespaces, ``--die-with-parent``, the
  system directories (``/usr``, ``/etc``, ...) and the runtime (the directory holding the
  ``bursarcore`` package and the Python prefix) read-only, private ``/tmp``, ``/proc`` and
  ``/dev``, and the workspace bound read-write *at its own path* (so paths in saved agent
  state stay valid across hosts with the same scratch layout). Nothing else of the host
  is visible; writes anywhere but the workspace fail (read-only) or land in the sandbox's
  private, throwaway ``/tmp``. The
  environment is inherited through ``execve`` (never ``--setenv``: argv is world-readable
  in ``/proc``), with ``HOME`` set to the workspace.
* ``apptainer`` — ``apptainer exec --containall --cleanenv`` on an unmodified image, the
  workspace bound at ``/workspace``, the runtime bound read-only at its own path, the
  agent's variables passed as ``APPTAINERENV_<NAME>`` (again never in argv).

Signals: the worker stops an agent with :meth:`Runner.terminate` (SIGTERM) and, after
the grace period, :meth:`Runner.kill` (SIGKILL to the whole process group). bwrap must not
itself receive the SIGTERM — it would die at once and ``--die-with-parent`` would SIGKILL
the agent mid-save — so :class:`BwrapRunner` signals the processes of the group that are
not bwrap.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from typing import Iterable, Mapping, Sequence, Union

from ..errors import BursarError, InvalidArgument
from .plugins import runtime_dir

__all__ = [
    "Runner",
    "NoneRunner",
    "BwrapRunner",
    "ApptainerRunner",
    "RunnerUnavailable",
    "get_runner",
    "runtime_paths",
    "RUNNERS",
]

Bind = Union[str, Sequence[str]]
"""A bind: ``"path"`` (read-only, same path), ``(src, dst)`` (read-only) or
``(src, dst, "ro"|"rw")``."""


class RunnerUnavailable(BursarError, RuntimeError):
    """The runner's program (``bwrap``, ``apptainer``) is not installed or not usable."""


def runtime_paths() -> list[str]:
    """Host directories an agent needs to run this runtime's Python: the directory holding
    the ``bursarcore`` package and the interpreter's prefixes (site-packages included).
    Nested paths are dropped (binding the parent covers them)."""
    cands = [runtime_dir(), sys.prefix, sys.base_prefix, sys.exec_prefix,
             os.path.dirname(os.path.dirname(os.path.realpath(sys.executable)))]
    out: list[str] = []
    for p in sorted({os.path.realpath(c) for c in cands if c}, key=len):
        if p == "/" or any(p == q or p.startswith(q.rstrip("/") + "/") for q in out):
            continue
        out.append(p)
    return out


def _check_argv(argv: Sequence[str]) -> list[str]:
    if isinstance(argv, (str, bytes)) or not argv or not all(isinstance(a, str) for a in argv):
        raise InvalidArgument("argv", "must be a non-empty list of strings", argv)
    return list(argv)


def _check_env(env: Mapping[str, str]) -> dict[str, str]:
    if not isinstance(env, Mapping):
        raise InvalidArgument("env", "must be a mapping of strings", type(env).__name__)
    for k, v in env.items():
        if not isinstance(k, str) or not k or "=" in k or "\0" in k or not isinstance(v, str) or "\0" in v:
            raise InvalidArgument("env", "names and values must be strings without '=' in names "
                                  "or NUL anywhere", k)
    return dict(env)


def _norm_binds(binds: Iterable[Bind]) -> list[tuple[str, str, str]]:
    out = []
    for b in binds:
        if isinstance(b, (str, os.PathLike)):
            src = dst = os.fspath(b)
            mode = "ro"
        else:
            b = tuple(b)
            if len(b) == 2:
                (src, dst), mode = b, "ro"
            elif len(b) == 3:
                src, dst, mode = b
            else:
                raise InvalidArgument("binds", "items must be path, (src, dst) or (src, dst, mode)", b)
        if mode not in ("ro", "rw"):
            raise InvalidArgument("binds", "mode must be 'ro' or 'rw'", b)
        if not os.path.isabs(src) or not os.path.isabs(dst):
            raise InvalidArgument("binds", "paths must be absolute", b)
        out.append((src, dst, mode))
    return out


def _pgid_members(pgid: int) -> list[int]:
    """Pids of the processes in process group ``pgid`` (Linux ``/proc``)."""
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if len(fields) > 2 and int(fields[2]) == pgid:
            pids.append(int(name))
    return pids


class Runner:
    """Base class: a plain process. Subclasses wrap the command in a sandbox."""

    name = "none"

    def __init__(self, *, inherit_env: bool = True) -> None:
        self.inherit_env = inherit_env

    def prepare(self, argv: Sequence[str], *, workspace: str, env: Mapping[str, str],
                binds: Iterable[Bind] = ()) -> tuple[list[str], dict[str, str]]:
        """The full command to execute (with ``cwd=workspace``) and its environment."""
        argv = _check_argv(argv)
        env = _check_env(env)
        _norm_binds(binds)  # validated; a plain process sees the host anyway
        base = dict(os.environ) if self.inherit_env else {}
        return argv, {**base, **env}

    def workspace_path(self, workspace: str) -> str:
        """Where the agent sees its workspace."""
        return workspace

    def terminate(self, proc: subprocess.Popen) -> None:
        """Ask the agent to stop: SIGTERM to its process group (started with
        ``start_new_session=True``)."""
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass

    def kill(self, proc: subprocess.Popen) -> None:
        """SIGKILL the agent's whole process group."""
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class NoneRunner(Runner):
    """No isolation beyond a private working directory: ``cwd = workspace``."""

    name = "none"


class BwrapRunner(Runner):
    """Bubblewrap sandbox (see the module docstring).

    ``binary``: the bwrap program. ``share_net``: keep the host network (agents call
    APIs; ``False`` adds ``--unshare-net``). ``system``: host directories bound read-only
    at the same path (missing ones skipped; symlinks such as ``/bin -> usr/bin`` recreated
    as symlinks). ``runtime``: read-only runtime directories (default :func:`runtime_paths`).
    """

    name = "bwrap"
    SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt")

    def __init__(self, binary: str = "bwrap", *, share_net: bool = True,
                 system: Sequence[str] = SYSTEM, runtime: Sequence[str] | None = None,
                 inherit_env: bool = True) -> None:
        super().__init__(inherit_env=inherit_env)
        self.binary = binary
        self.share_net = share_net
        self.system = tuple(system)
        self.runtime = list(runtime) if runtime is not None else runtime_paths()

    def prepare(self, argv, *, workspace, env, binds=()):
        argv = _check_argv(argv)
        env = _check_env(env)
        extra = _norm_binds(binds)
        ws = os.path.realpath(workspace)
        cmd = [self.binary, "--die-with-parent", "--unshare-pid", "--unshare-ipc",
               "--unshare-uts", "--unshare-cgroup-try"]
        if not self.share_net:
            cmd.append("--unshare-net")
        if os.geteuid() == 0:
            cmd += ["--cap-drop", "ALL"]  # root in the sandbox could remount the binds rw
        for d in self.system:
            if os.path.islink(d):
                cmd += ["--symlink", os.readlink(d), d]
            elif os.path.isdir(d):
                cmd += ["--ro-bind", d, d]
        cmd += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--tmpfs", "/var/tmp"]
        for p in self.runtime:
            cmd += ["--ro-bind", p, p]
        for src, dst, mode in extra:
            cmd += ["--bind" if mode == "rw" else "--ro-bind", src, dst]
        # the sandbox's own root (a tmpfs holding the mount points) read-only as well
        cmd += ["--bind", ws, ws, "--remount-ro", "/", "--chdir", ws, "--"]
        base = dict(os.environ) if self.inherit_env else {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        return cmd + argv, {**base, "HOME": ws, "TMPDIR": "/tmp", **env}

    def workspace_path(self, workspace: str) -> str:
        return os.path.realpath(workspace)

    def terminate(self, proc: subprocess.Popen) -> None:
        """SIGTERM every process of the group except bwrap itself (its outer process and
        the pid-1 reaper inside): the agent gets the signal, bwrap waits for it."""
        try:
            me = os.stat(shutil.which(self.binary) or self.binary)
            ident = (me.st_dev, me.st_ino)
        except OSError:
            ident = None
        for pid in _pgid_members(proc.pid):
            try:
                st = os.stat(f"/proc/{pid}/exe")
                if ident is not None and (st.st_dev, st.st_ino) == ident:
                    continue
                os.kill(pid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError, FileNotFoundError):
                continue


class ApptainerRunner(Runner):
    """``apptainer exec --containall --cleanenv`` on ``image`` (see the module docstring).

    ``binary``: the apptainer program. ``runtime``: read-only runtime binds (default
    :func:`runtime_paths`). ``options``: extra ``apptainer exec`` options (e.g. ``--nv``).
    The agent's variables go in as ``APPTAINERENV_<NAME>``; the host environment reaches
    apptainer itself, never the container.
    """

    name = "apptainer"
    WORKSPACE = "/workspace"

    def __init__(self, image: str, binary: str = "apptainer", *,
                 runtime: Sequence[str] | None = None, options: Sequence[str] = ()) -> None:
        super().__init__(inherit_env=True)
        if not isinstance(image, str) or not image:
            raise InvalidArgument("image", "the apptainer runner needs an image (--image)", image)
        self.image = image
        self.binary = binary
        self.runtime = list(runtime) if runtime is not None else runtime_paths()
        self.options = list(options)

    def prepare(self, argv, *, workspace, env, binds=()):
        argv = _check_argv(argv)
        env = _check_env(env)
        extra = _norm_binds(binds)
        ws = os.path.realpath(workspace)
        cmd = [self.binary, "exec", "--containall", "--cleanenv", "--bind", f"{ws}:{self.WORKSPACE}"]
        for p in self.runtime:
            cmd += ["--bind", f"{p}:{p}:ro"]
        for src, dst, mode in extra:
            cmd += ["--bind", f"{src}:{dst}:{mode}"]
        cmd += [*self.options, "--pwd", self.WORKSPACE, self.image, *argv]
        base = {k: v for k, v in os.environ.items()
                if not k.startswith(("APPTAINERENV_", "SINGULARITYENV_"))}
        agent = {"HOME": self.WORKSPACE, **env}
        return cmd, {**base, **{f"APPTAINERENV_{k}": v for k, v in agent.items()}}

    def workspace_path(self, workspace: str) -> str:
        return self.WORKSPACE


RUNNERS = ("none", "bwrap", "apptainer")


def get_runner(name: str, **opts) -> Runner:
    """The runner ``name`` (``none``, ``bwrap`` or ``apptainer``) built with ``opts``.

    Raises :class:`RunnerUnavailable` when the program is not on ``PATH`` (resolved here,
    so the error comes before any task is claimed), :class:`InvalidArgument` for an
    unknown name or a missing apptainer ``image``.
    """
    if name == "none":
        return NoneRunner(**opts)
    if name == "bwrap":
        binary = opts.pop("binary", "bwrap")
        path = shutil.which(binary)
        if path is None:
            raise RunnerUnavailable(f"runner bwrap: bubblewrap program {binary!r} not found on PATH; "
                                    "install bubblewrap (apt-get install bubblewrap) or use --runner none")
        return BwrapRunner(path, **opts)
    if name == "apptainer":
        binary = opts.pop("binary", "apptainer")
        image = opts.pop("image", None)
        if not image:
            raise InvalidArgument("image", "the apptainer runner needs an image (--image)", image)
        path = shutil.which(binary)
        if path is None:
            raise RunnerUnavailable(f"runner apptainer: program {binary!r} not found on PATH; "
                                    "load or install Apptainer >= 1.1, or use --runner bwrap/none")
        return ApptainerRunner(image, path, **opts)
    raise InvalidArgument("runner", f"must be one of {', '.join(RUNNERS)}", name)
