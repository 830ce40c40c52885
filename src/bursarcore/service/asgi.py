"""The ASGI layer in front of the API's routes.

:class:`BursarAPI` is the FastAPI app with the direct path
(:class:`~bursarcore.service.fastpath.DirectIntents`) in front of it: a request the direct
path does not answer reaches the routes unchanged, with the body it sent. :class:`Limits`
is the middleware every request passes: a body over its limit is refused with 413 before
the app reads it, every response carries the broker's time and ``no-store``, and an
exception no handler took fails that request only (500 with a JSON body), never the server.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Callable

from fastapi import FastAPI
from starlette.types import Receive, Scope, Send

log = logging.getLogger("bursarcore.service")


class BursarAPI(FastAPI):
    """The FastAPI app, with a direct path in front for the requests that have one
    (:class:`~bursarcore.service.fastpath.DirectIntents`): a request it does not answer
    goes through the app as usual, with the body it read."""

    direct: Any = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        direct = self.direct
        if direct is not None and scope["type"] == "http":
            receive = await direct(scope, receive, send)
            if receive is None:
                return
        await super().__call__(scope, receive, send)


class Limits:
    """Pure ASGI middleware: request bodies over ``max_body`` bytes (``batch_body`` under
    ``/v1/batch/``, the columnar batches) answer 413 before the app reads them (by
    Content-Length, or by counting a chunked body); every response gets
    ``X-Bursar-Time`` (broker time) and ``Cache-Control: no-store``; an exception no
    handler took answers 500 with a JSON body."""

    def __init__(self, app: Any, max_body: int, clock: Callable[[], float], *,
                 batch_body: int | None = None) -> None:
        self.app, self.max_body, self.clock = app, max_body, clock
        self.batch_body = max_body if batch_body is None else batch_body

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.batch_body if scope.get("path", "").startswith("/v1/batch/") \
            else self.max_body
        headers = dict(scope.get("headers") or [])
        cl = headers.get(b"content-length")
        if cl is not None:
            try:
                too_big = int(cl) > limit
            except ValueError:
                too_big = True
            if too_big:
                await self._reject(send, limit)
                return
        else:
            # no length given (chunked): buffer up to the limit, then replay
            chunks, size, more = [], 0, True
            msg = None
            while more:
                msg = await receive()
                if msg["type"] != "http.request":
                    break
                body = msg.get("body", b"")
                size += len(body)
                if size > limit:
                    await self._reject(send, limit)
                    return
                chunks.append(body)
                more = msg.get("more_body", False)
            if msg is not None and msg["type"] == "http.request":
                data = b"".join(chunks)
                sent = False
                upstream = receive

                async def replay() -> dict:
                    nonlocal sent
                    if not sent:
                        sent = True
                        return {"type": "http.request", "body": data, "more_body": False}
                    return await upstream()

                receive = replay

        started = False

        async def send_with_headers(message: dict) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                h = list(message.get("headers") or [])
                h.append((b"x-bursar-time", repr(self.clock()).encode()))
                h.append((b"cache-control", b"no-store"))
                message = {**message, "headers": h}
            await send(message)

        try:
            await self.app(scope, receive, send_with_headers)
        except Exception:
            # a bug in one request: a 500 for it, logged once with its traceback; the
            # server and every other request go on
            log.exception("%s %s failed", scope.get("method"), scope.get("path"))
            if started:
                raise                     # mid-response: the server drops the connection
            await self._send_json(send, 500, {"detail": "internal error; this request failed"})

    async def _reject(self, send: Callable, limit: int) -> None:
        await self._send_json(send, 413, {"detail": f"request body over {limit} bytes"},
                              close=True)

    async def _send_json(self, send: Callable, status: int, doc: dict, *,
                         close: bool = False) -> None:
        body = json.dumps(doc).encode()
        headers = [(b"content-type", b"application/json"),
                   (b"content-length", str(len(body)).encode()),
                   (b"x-bursar-time", repr(self.clock()).encode()),
                   (b"cache-control", b"no-store")]
        if close:
            headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
