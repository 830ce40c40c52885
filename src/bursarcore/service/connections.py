"""Bounds on the connections of ``bursar serve``: uvicorn's h11 protocol with a request-read
timeout and a cap on open connections.

uvicorn closes a keep-alive connection idle after a response (``timeout_keep_alive``), but
nothing bounds a connection that never completes a request: one opened and left silent, or
one that sends half its headers or half its body and stalls. Each holds a socket and a file
descriptor for as long as the client likes. :func:`bounded_protocol` gives every request
``request_timeout`` seconds from its first byte (from the connection's opening, for the
first) until it has been read in full: headers not complete by then answer ``408`` and the
connection closes; a body not complete closes the connection (the application sees a
disconnect). A request read in full is never timed here — a long-poll or an event stream
may run as long as the application allows. Beyond ``max_connections`` open connections a new
one is answered ``503`` and closed at once.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["bounded_protocol"]

_408 = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
        b"connection: close\r\ncontent-length: 47\r\n\r\n"
        b'{"detail": "the request was not sent in time"}\n')
_503 = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
        b"connection: close\r\nretry-after: 1\r\ncontent-length: 40\r\n\r\n"
        b'{"detail": "too many open connections"}\n')


def bounded_protocol(request_timeout: float, max_connections: int) -> type[asyncio.Protocol]:
    """An ``H11Protocol`` subclass for ``uvicorn.Config(http=...)`` with these bounds
    (``request_timeout`` <= 0 or ``max_connections`` <= 0: that bound is off)."""

    class BoundedH11Protocol(H11Protocol):
        _timer: asyncio.TimerHandle | None = None
        _before: Any = None          # the request cycle before the one being read
        _refused = False

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            if max_connections > 0 and len(self.server_state.connections) >= max_connections:
                self._refused = True
                self.transport = transport
                transport.write(_503)
                transport.close()
                return
            super().connection_made(transport)
            self._start()

        def connection_lost(self, exc: Exception | None) -> None:
            self._stop()
            if self._refused:
                return
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._refused:
                return
            if self._timer is None and (self.cycle is None or self.cycle.response_complete):
                self._start()                     # the first byte of the next request
            super().data_received(data)
            c = self.cycle
            if self._timer is not None and c is not None and c is not self._before \
                    and not c.more_body:
                self._stop()                      # read in full: no longer timed here

        def handle_websocket_upgrade(self, event: Any) -> None:
            # the upgrade request arrived in full: the WebSocket protocol takes the
            # connection over (its own pings time it from here), so this one's timer stops
            self._stop()
            super().handle_websocket_upgrade(event)

        def _start(self) -> None:
            if request_timeout > 0:
                self._before = self.cycle
                self._timer = self.loop.call_later(request_timeout, self._expired)

        def _stop(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _expired(self) -> None:
            self._timer = None
            if self.transport.is_closing():
                return
            if self.cycle is self._before:        # the headers never came in full
                self.transport.write(_408)
            self.transport.close()

    return BoundedH11Protocol
