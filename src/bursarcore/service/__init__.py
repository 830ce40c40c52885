"""The broker as an HTTP service (SPEC §8, §9, §12): ``bursar serve``.

Needs the ``service`` extra (FastAPI, uvicorn). The names are imported lazily so that
``bursarcore.service.locked`` (used by the Parsl provider with an in-process broker) and
the token store stay importable without a web framework.

* :func:`create_app` — the FastAPI application over a :class:`BrokerService`;
* :class:`BrokerService` — one broker, its durable journal with group commit, the ticker
  and the event log;
* :class:`TokenStore` — hashed campaign and operator tokens;
* :func:`add_serve` — the ``serve`` subcommand for ``bursar``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["create_app", "ServiceSettings", "BrokerService", "TokenStore", "Principal",
           "LockedBroker", "add_serve", "serve"]

_WHERE = {"create_app": "app", "ServiceSettings": "app", "BrokerService": "core",
          "TokenStore": "auth", "Principal": "auth", "LockedBroker": "locked",
          "add_serve": "cli", "serve": "cli"}


def __getattr__(name: str) -> Any:
    mod = _WHERE.get(name)
    if mod is None:
        raise AttributeError(f"module 'bursarcore.service' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f".{mod}", __name__), name)
