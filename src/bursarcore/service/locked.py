"""A broker behind a lock: :class:`Broker` is not thread-safe, so everything that shares one
between threads (the HTTP service, the Parsl provider's background thread, a test driving
time) goes through one :class:`LockedBroker`. Numpy-only: no web framework is imported."""

from __future__ import annotations

import functools
import threading
from typing import Any

__all__ = ["LockedBroker"]


class LockedBroker:
    """Proxy every public method of a :class:`~bursarcore.Broker` through one re-entrant lock.

    ``LockedBroker(broker)``; ``with lb.lock: ...`` groups several calls atomically.
    Attributes that are not callables (``clock``, ``journal``, ``dims``...) are passed
    through unlocked; read them under ``lock`` if another thread may be mid-operation.
    """

    def __init__(self, broker: Any, lock: threading.RLock | None = None) -> None:
        if isinstance(broker, LockedBroker):
            broker = broker.broker
        self.broker: Any = broker
        self.lock = lock if lock is not None else threading.RLock()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.broker, name)
        if name.startswith("_") or not callable(attr):
            return attr
        lock = self.lock

        @functools.wraps(attr)
        def locked(*args: Any, **kwargs: Any) -> Any:
            with lock:
                return attr(*args, **kwargs)

        return locked

    def __repr__(self) -> str:
        return f"LockedBroker({self.broker!r})"
