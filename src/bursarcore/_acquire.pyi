"""Typing stub of ``Broker.acquire``'s common case in one call, over the Cython binding of
the C core's engine."""

from typing import Any

from typing_extensions import disjoint_base

@disjoint_base                    # a cdef class: no second base with a layout of its own
class FastAcquire:
    """``Broker.acquire``'s common case in one call."""

    def __init__(self, broker: Any, queue: Any, Decision: type, Lease: type, Event: type,
                 Intent: type) -> None: ...
    def acquire(self, intent: Any) -> Any | None: ...
    def __call__(self, intent: Any) -> Any | None: ...
    def expire(self, t: int) -> int: ...
    def events(self, ev: list[Any], take: bool) -> list[Any]: ...
