"""Fixtures for the HTTP service tests: a real ``bursar serve`` process on loopback.

The service extra (FastAPI, uvicorn, httpx) is optional; without it these tests skip.
"""

from __future__ import annotations

import copy

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("httpx")

from bursarcore.service.testing import ServerProcess  # noqa: E402
from service_classes import CLASSES  # noqa: E402

CONFIG = {
    "pool": {"gpu": 64, "flow": {"fs": 10.0}},
    "classes": copy.deepcopy(CLASSES),
    "campaigns": {
        "alpha": {"credits": 10000, "service_class": "agent-burst",
                  "guaranteed": {"gpu": 8, "fs": 1}, "sustained": {"gpu": 16, "fs": 2},
                  "ceiling": {"gpu": 32, "fs": 4}, "burst": {"gpu": 20000, "fs": 10}},
        "beta": {"credits": 10000, "service_class": "agent-burst",
                 "guaranteed": {"gpu": 8, "fs": 1}, "sustained": {"gpu": 16, "fs": 2},
                 "ceiling": {"gpu": 32, "fs": 4}, "burst": {"gpu": 20000, "fs": 10}},
        "gamma": {"credits": None, "service_class": "opportunistic",
                  "sustained": {"gpu": 64}, "ceiling": {"gpu": 64}, "burst": {"gpu": None}},
    },
}


@pytest.fixture(scope="session")
def base_config() -> dict:
    """The standard configuration (a copy: tests may not change the shared one)."""
    return copy.deepcopy(CONFIG)


@pytest.fixture
def server_factory(tmp_path):
    """``server_factory(config=None, **kw)`` starts a server; all are stopped at the end."""
    started: list[ServerProcess] = []

    def make(config: dict | None = None, name: str = "srv", **kw) -> ServerProcess:
        srv = ServerProcess(tmp_path / name, config or copy.deepcopy(CONFIG), **kw)
        started.append(srv)
        return srv.start()

    yield make
    for s in started:
        s.stop()


@pytest.fixture
def server(server_factory) -> ServerProcess:
    return server_factory()
