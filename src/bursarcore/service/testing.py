"""The service for tests, benchmarks and examples: in this process, or as a process on
loopback.

``InProcessService(config)`` builds the broker on a :class:`~bursarcore.ManualClock` (no
ticker: time moves only when the test says so) and the FastAPI app over it, with an
operator token and one token per configured campaign; ``client()`` is a Starlette
``TestClient`` (the app's lifespan runs: committer, shutdown flush). With ``journal`` a
path, the journal is SQLite with group commit, as in ``bursar serve``; without, in memory.

``ServerProcess(workdir, config)`` (``config`` in the broker's constructor form, written
to ``workdir/config.json`` in the file's form) mints an operator token and one token per configured
campaign into ``workdir/tokens.json`` (hashed; the plaintext stays in this object), starts
``python -m bursarcore.service`` on 127.0.0.1 with a free port (the first start makes its
journal, ``--init``), and waits (bounded) until it accepts connections. ``kill()`` sends
SIGKILL (a crash), ``restart()`` starts it again on the same journal and tokens, ``stop()``
shuts it down cleanly. Loopback only.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from .auth import CAMPAIGN, OPERATOR, TokenStore

__all__ = ["ServerProcess", "InProcessService"]


class InProcessService:
    def __init__(self, config: Mapping[str, Any], *, journal: str | os.PathLike | None = None,
                 backend: str | None = None, start: float = 1.7e9,
                 settings: Any = None) -> None:
        from ..clock import ManualClock
        from .app import ServiceSettings, create_app
        from .core import BrokerService

        self.clock = ManualClock(start)
        # a harness: a journal path that does not exist yet is made (explicitly)
        self.service = BrokerService.open(json.loads(json.dumps(config)),
                                          None if journal is None else str(journal),
                                          create=journal is not None
                                          and not os.path.exists(journal),
                                          backend=backend, tick=0, clock=self.clock)
        self.broker = self.service.broker
        self.store = TokenStore(None)
        self.tokens: dict[str, str] = {"operator": self.store.mint(OPERATOR)}
        for name in self.broker.campaigns:
            self.tokens[name] = self.store.mint(CAMPAIGN, name)
        self.app = create_app(self.service, self.store,
                              settings if settings is not None else ServiceSettings(
                                  rate=0, tenant_rate=0, auth_fail_rate=0))

    def headers(self, who: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[who]}"}

    def client(self, **kw: Any) -> Any:
        """A ``TestClient`` over the app; use it as a context manager (lifespan)."""
        from fastapi.testclient import TestClient

        return TestClient(self.app, raise_server_exceptions=False, **kw)


class ServerProcess:
    def __init__(self, workdir: str | os.PathLike, config: Mapping[str, Any], *,
                 journal: bool = True, rate: float = 0.0, burst: float = 200.0,
                 tenant_rate: float = 0.0, tick: float = 0.2, synchronous: str = "FULL",
                 extra_args: Sequence[str] = (), env: Mapping[str, str] | None = None) -> None:
        self.dir = Path(workdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.config_path = self.dir / "config.json"
        # the constructor form the tests write (pool dimensions beside its options) in the
        # file's form (pool.capacity)
        from .config import file_form

        self.config_path.write_text(json.dumps(file_form(config)))
        self.journal_path = self.dir / "journal.db" if journal else None
        self.tokens_path = self.dir / "tokens.json"
        self.ready_path = self.dir / "ready.txt"
        self.log_path = self.dir / "server.log"
        store = TokenStore(self.tokens_path)
        self.tokens: dict[str, str] = {"operator": store.mint(OPERATOR)}
        for name in (config.get("campaigns") or {}):
            self.tokens[name] = store.mint(CAMPAIGN, name)
        self.args = [sys.executable, "-m", "bursarcore.service", "--host", "127.0.0.1",
                     "--port", "0", "--config", str(self.config_path),
                     "--tokens", str(self.tokens_path), "--ready-file", str(self.ready_path),
                     "--rate", repr(float(rate)), "--burst", repr(float(burst)),
                     "--tenant-rate", repr(float(tenant_rate)),
                     "--tick", repr(float(tick)), "--synchronous", synchronous,
                     "--log-level", "warning", *extra_args]
        if self.journal_path is not None:
            self.args += ["--journal", str(self.journal_path)]
        else:
            self.args += ["--memory"]
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen | None = None
        self.url = ""
        self.initialised = self.journal_path is None   # --init only on the first start

    def __repr__(self) -> str:
        return f"ServerProcess({self.url or 'not started'})"

    def start(self, timeout: float = 30.0) -> "ServerProcess":
        if self.ready_path.exists():
            self.ready_path.unlink()
        args = list(self.args)
        if self.url:   # a restart keeps the address, as a real service would
            args[args.index("--port") + 1] = self.url.rsplit(":", 1)[1]
        if not self.initialised:
            args.append("--init")
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=self.env)
        log.close()
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.ready_path.exists():
                self.url = self.ready_path.read_text().strip()
                self.initialised = True
                return self
            if self.proc.poll() is not None:
                raise RuntimeError(f"bursar serve exited with {self.proc.returncode}:\n"
                                   + self.log_path.read_text()[-4000:])
            time.sleep(0.05)
        self.kill()
        raise TimeoutError(f"bursar serve did not start within {timeout} s:\n"
                           + self.log_path.read_text()[-4000:])

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def kill(self) -> None:
        """SIGKILL: the process dies mid-whatever, like a crash."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, timeout: float = 10.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode

    def restart(self, timeout: float = 30.0) -> "ServerProcess":
        self.stop()
        return self.start(timeout)

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def __enter__(self) -> "ServerProcess":
        return self.start() if self.proc is None else self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
