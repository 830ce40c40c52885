"""The direct path of ``POST /v1/campaigns/{campaign}/intents``: one intent per request,
the API's busiest call, answered without the framework's per-request machinery.

FastAPI routes a request through a stack of middlewares, solves the route's dependencies
(the bearer scheme, the principal), validates the body, calls the endpoint, validates the
returned document against the response model and serialises it, and sends it back up the
stack: on a small request that is most of the server's time. :class:`DirectIntents`
answers the plain case itself, with the same pieces the route uses — the token store, the
rate limiter, the access rule, :class:`~bursarcore.service.models.IntentIn`,
``intent_of``, :meth:`BrokerService.call` and the response model's own serialiser — so
the answer is the route's, byte for byte, and every rule stays in one place.

Anything that is not the plain case goes to the FastAPI route untouched, with the body it
sent: a body that is not a JSON object the model accepts, no or an unknown token, a
campaign the token may not act for, an over-limit request, a body without a length or
over ``--max-body``, a content type other than JSON. Those checks change nothing, so the
route repeats them and answers as it always does (422, 401, 404, 429, 413). Once the
broker was called the request is never handed on (it would decide twice): an error from
the operation or its commit is answered here by the app's own exception handlers.

Durability is unchanged: the answer is sent after :meth:`BrokerService.call` returns,
that is once the decision's journal record is durable.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
from typing import Any, Callable

from pydantic import TypeAdapter, ValidationError
from starlette.requests import Request
from starlette.types import Message, Receive, Scope, Send

from . import models as M
from .auth import TokenStore
from .core import BrokerService
from .nodes import MAX_PATH
from .ratelimit import RequestLimits, retry_after_header

__all__ = ["DirectIntents", "ROUTE"]

log = logging.getLogger("bursarcore.service")

#: the route template this path answers (the metrics' label)
ROUTE = "/v1/campaigns/{campaign}/intents"
_PATH = re.compile(r"/v1/campaigns/(.+)/intents")   # a node path: as the route's converter
_JSON = b"application/json"
_INTERNAL = b'{"detail": "internal error; this request failed"}'
#: bodies remembered with the intent they make, at most, and the longest remembered
_SHAPES, _SHAPE_BYTES = 1024, 512

class _Replay:
    """A ``receive`` that gives the messages already read again, then the server's own."""

    __slots__ = ("messages", "upstream")

    def __init__(self, messages: list[Message], upstream: Receive) -> None:
        self.messages, self.upstream = messages, upstream

    async def __call__(self) -> Message:
        if self.messages:
            return self.messages.pop(0)
        return await self.upstream()


class DirectIntents:
    """``await direct(scope, receive, send)`` answers a plain single intent and returns
    None, or returns the ``receive`` with which the FastAPI app must serve the request
    (the body it read, replayed). See the module docstring."""

    def __init__(self, app: Any, service: BrokerService, tokens: TokenStore,
                 limiter: RequestLimits, *, max_body: int,
                 intent_of: Callable[[str, M.IntentIn], Any],
                 observe: Callable[[str, str, int, float], None]) -> None:
        self.app, self.service, self.tokens, self.limiter = app, service, tokens, limiter
        self.broker = service.broker
        self.max_body = max_body
        self.intent_of = intent_of
        self.observe = observe
        self.clock = self.broker.clock.now
        # the route's response model: validated, then serialised, as FastAPI does
        self._decision = TypeAdapter(M.DecisionOut)
        # intents checked before, by campaign and body: agents send the same few bodies
        # again and again, and an Intent is immutable (the pool's dimensions and classes,
        # which the checks read, never change)
        self._intents: dict[tuple[str, bytes], Any] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> Receive | None:
        if scope["method"] != "POST" or scope.get("root_path"):
            return receive
        m = _PATH.fullmatch(scope["path"])
        if m is None:
            return receive
        campaign = m.group(1)
        if len(campaign) > MAX_PATH:
            return receive
        t0 = time.perf_counter()
        auth = ctype = length = None
        for k, v in scope["headers"]:
            if k == b"authorization":
                if auth is None:
                    auth = v
            elif k == b"content-type":
                if ctype is None:
                    ctype = v
            elif k == b"content-length":
                if length is None:
                    length = v
        if auth is None or ctype is None or length is None:
            return receive
        try:
            n = int(length)
        except ValueError:
            return receive
        if n > self.max_body or ctype.split(b";", 1)[0].strip().lower() != _JSON:
            return receive
        # the body, kept for the route should it take the request over
        read: list[Message] = []
        chunks: list[bytes] = []
        while True:
            msg = await receive()
            read.append(msg)
            if msg["type"] != "http.request":
                return _Replay(read, receive)
            chunks.append(msg.get("body", b""))
            if not msg.get("more_body", False):
                break
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        try:
            p = self._check(campaign, auth, body)
        except Exception:  # noqa: BLE001 - any doubt: the route decides, as it always did
            p = None
        if p is None:
            return _Replay(read, receive)
        principal, intent = p
        if self.limiter.check(principal):
            return _Replay(read, receive)     # the route answers 429 (a refusal debits nothing)
        status = 500
        try:
            status = await self._decide(scope, receive, send, campaign, intent)
        finally:
            self.observe("POST", ROUTE, status, time.perf_counter() - t0)
        return None

    def _check(self, campaign: str, auth: bytes, body: bytes) -> tuple[Any, Any] | None:
        """The checks the route makes before the broker is called, each without a side
        effect; None when one fails (the route then answers it)."""
        scheme, _, cred = auth.decode("latin-1").partition(" ")
        if scheme.lower() != "bearer" or not cred:
            return None
        p = self.tokens.authenticate(cred)
        if p is None or not p.may_act_for(campaign) or campaign not in self.broker.envelopes:
            return None
        key = (campaign, body)
        intent = self._intents.get(key)
        if intent is None:
            try:
                model = M.IntentIn.model_validate(json.loads(body))
            except (ValueError, ValidationError):
                return None
            intent = self.intent_of(campaign, model)
            if len(body) <= _SHAPE_BYTES:
                if len(self._intents) >= _SHAPES:
                    self._intents.clear()
                self._intents[key] = intent
        return p, intent

    async def _decide(self, scope: Scope, receive: Receive, send: Send, campaign: str,
                      intent: Any) -> int:
        try:
            d = await self.service.call(self.broker.acquire, intent)
            headers = []
            if d.outcome == "granted":
                status = 201
                headers.append((b"location", f"/v1/campaigns/{campaign}/leases/"
                                             f"{d.lease.id}".encode("latin-1")))
            elif d.outcome == "pending":
                status = 202
                headers.append((b"location", f"/v1/campaigns/{campaign}/intents/"
                                             f"{d.intent_id}".encode("latin-1")))
            else:
                status = 200
            if d.retry_after is not None and math.isfinite(d.retry_after):
                headers.append((b"retry-after", retry_after_header(d.retry_after).encode()))
            ta = self._decision
            out = ta.dump_json(ta.validate_python(M.decision_out(d)), by_alias=True)
        except Exception as e:  # noqa: BLE001 - answered as the app answers it
            return await self._error(scope, receive, send, campaign, e)
        await send({"type": "http.response.start", "status": status, "headers": [
            (b"content-length", str(len(out)).encode()),
            (b"content-type", _JSON), *headers,
            (b"x-bursar-time", repr(self.clock()).encode()),
            (b"cache-control", b"no-store")]})
        await send({"type": "http.response.body", "body": out})
        return status

    async def _error(self, scope: Scope, receive: Receive, send: Send, campaign: str,
                     e: Exception) -> int:
        """An error of the operation or of its commit, answered by the app's handler for
        it (a 500 with a JSON body when none takes it, as for any request)."""
        handler = None
        for cls in type(e).__mro__:
            handler = self.app.exception_handlers.get(cls)
            if handler is not None:
                break
        clock = self.clock

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [
                    *message.get("headers", ()), (b"x-bursar-time", repr(clock()).encode()),
                    (b"cache-control", b"no-store")]}
            await send(message)

        if handler is None:
            log.error("POST %s failed", scope.get("path"), exc_info=e)
            await send_with_headers({"type": "http.response.start", "status": 500,
                                     "headers": [(b"content-type", _JSON),
                                                 (b"content-length",
                                                  str(len(_INTERNAL)).encode())]})
            await send({"type": "http.response.body", "body": _INTERNAL})
            return 500
        request = Request({**scope, "path_params": {"campaign": campaign}}, receive)
        response = await handler(request, e)
        await response({**scope, "path_params": {"campaign": campaign}}, receive,
                       send_with_headers)
        return int(response.status_code)
