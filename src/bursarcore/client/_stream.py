"""The decision stream on the client side: one WebSocket (``/v1/stream``) over which an
agent sends intents, renewals, releases and consumptions without waiting for each answer,
and reads the answers — in the order it sent them, each once durable — and its campaign's
events.

``BursarClient.stream()`` returns a :class:`DecisionStream`, ``AsyncBursarClient.stream()``
an :class:`AsyncDecisionStream`. Each send (``acquire``, ``renew``, ``release``,
``consume``) returns the message's id; messages are gathered into frames of up to
``frame`` messages, sent when a frame is full, on :meth:`flush`, and before every read.
Reading (iterating, or :meth:`receive` for the id too) yields the broker's own types:
:class:`~bursarcore.Decision`, :class:`~bursarcore.broker.Consumption` and
:class:`~bursarcore.Event`. An error answer raises what the HTTP client raises for the same
status — :class:`~bursarcore.errors.InvalidArgument` naming the field (422),
:class:`~bursarcore.errors.UnknownLease` / :class:`~bursarcore.errors.UnknownCampaign`
(404), :class:`RateLimited` (429), :class:`Unavailable` (5xx) — with the message's id as
``message_id``; the stream goes on, and the next read returns the next answer.

Flow control. The server holds at most its window of messages for a connection (4096 by
default) and stops reading from a client that does not read its answers. So that a
program which sends a long run before reading cannot block for ever, a send first reads
answers into the stream's own queue while ``window`` messages are unanswered.
"""

from __future__ import annotations

import collections
import inspect
import json
import urllib.parse
from typing import Any, NamedTuple

from ..admission import Intent
from ..broker import Consumption, Decision, Event
from ..errors import InvalidArgument, UnknownCampaign, UnknownLease
from ._base import (RateLimited, ServiceError, ServiceTimeout, Unauthorized, Unavailable,
                    consumption_from, decision_from, event_from, _intent_body)

try:  # the 'service' extra
    import msgpack
except ImportError:  # pragma: no cover
    msgpack = None

try:
    import websockets
    from websockets.exceptions import ConnectionClosed, InvalidStatus
except ImportError:  # pragma: no cover
    websockets = None  # type: ignore[assignment]

__all__ = ["DecisionStream", "AsyncDecisionStream", "Answer"]


class Answer(NamedTuple):
    """One thing read from a stream: ``id`` is the message's id (None for an event) and
    ``value`` a :class:`~bursarcore.Decision`, :class:`~bursarcore.broker.Consumption` or
    :class:`~bursarcore.Event`."""

    id: int | str | None
    value: Decision | Consumption | Event


def stream_url(base_url: str, campaign: str | None, after: int | None, events: bool) -> str:
    u = urllib.parse.urlsplit(base_url)
    scheme = {"http": "ws", "https": "wss"}.get(u.scheme, u.scheme)
    q: dict[str, str] = {}
    if campaign is not None:
        q["campaign"] = campaign
    if after is not None:
        q["after"] = str(int(after))
    if not events:
        q["events"] = "false"
    query = urllib.parse.urlencode(q)
    return urllib.parse.urlunsplit((scheme, u.netloc, u.path.rstrip("/") + "/v1/stream",
                                    query, ""))


def handshake_error(e: BaseException, campaign: str | None) -> BaseException:
    """What a refused upgrade means, as the HTTP client says it."""
    status = getattr(getattr(e, "response", None), "status_code", None)
    body = getattr(getattr(e, "response", None), "body", b"") or b""
    try:
        detail = json.loads(body).get("detail")
    except (ValueError, AttributeError):
        detail = body[:200].decode("utf-8", "replace")
    if status == 401:
        return Unauthorized(str(detail), 401)
    if status == 404:
        return UnknownCampaign("campaign", "is not registered (or not yours)", campaign)
    if status == 422:
        item = detail[0] if isinstance(detail, list) and detail else {}
        loc = [str(x) for x in item.get("loc", []) if x != "query"]
        return InvalidArgument(".".join(loc) or "request", item.get("msg", str(detail)))
    if status == 429:
        return RateLimited(str(detail), 1.0)
    if status is None:
        if isinstance(e, TimeoutError):
            return ServiceTimeout("stream: no answer in time")
        return Unavailable(f"stream: {type(e).__name__}: {e}")
    return Unavailable(f"stream: HTTP {status}: {detail}", status)


def _raise_error(doc: dict[str, Any]) -> None:
    status, detail, mid = doc.get("status"), doc.get("detail"), doc.get("id")
    err: BaseException
    if status == 422:
        item = detail[0] if isinstance(detail, list) and detail else {}
        loc = [str(x) for x in item.get("loc", [])]
        err = InvalidArgument(".".join(loc) or "message", item.get("msg", str(detail)))
    elif status == 404:
        text = str(detail)
        if text.startswith("campaign"):
            err = UnknownCampaign("campaign", "is not registered (or not yours)")
        else:
            err = UnknownLease(text.split(" ")[0] if text else "id",
                               "is not one of this campaign's", None)
    elif status == 429:
        err = RateLimited(str(detail), float(doc.get("retry_after") or 1.0))
    else:
        err = Unavailable(f"stream: {status}: {detail}", status)
    setattr(err, "message_id", mid)   # which message this answers
    raise err


class _Protocol:
    """Message building and answer decoding, shared by both streams."""

    timeout: float            # seconds a read waits while an answer is due

    def __init__(self, campaign: str | None, binary: bool, frame: int, window: int) -> None:
        if websockets is None:  # pragma: no cover
            raise ImportError("the decision stream needs websockets: "
                              "pip install 'bursarcore[service]'")
        if binary and msgpack is None:  # pragma: no cover
            raise ImportError("the binary form needs msgpack: pip install 'bursarcore[service]'")
        self.campaign = campaign
        self.binary = bool(binary)
        self.frame = max(1, int(frame))
        self.window = max(1, int(window))
        self._next_id = 0
        self._outbox: list[dict[str, Any]] = []
        self._inbox: collections.deque[dict[str, Any]] = collections.deque()
        self.unanswered = 0          # messages sent (or gathered) and not yet answered
        self.sent = 0                # messages sent
        self.frames = 0              # frames sent

    def _message(self, op: str, fields: dict[str, Any], campaign: str | None) -> int:
        mid = self._next_id
        self._next_id += 1
        m: dict[str, Any] = {"id": mid, "op": op}
        if campaign is not None:
            m["campaign"] = campaign
        m.update(fields)
        self._outbox.append(m)
        self.unanswered += 1
        return mid

    def _acquire(self, intent: Intent) -> int:
        body = _intent_body(intent)
        campaign = intent.campaign if intent.campaign != self.campaign else None
        return self._message("acquire", body, campaign)

    def _renew(self, lease_id: int, duration: float, max_spend: float | None,
               campaign: str | None) -> int:
        f: dict[str, Any] = {"lease": int(lease_id), "duration": float(duration)}
        if max_spend is not None:
            f["max_spend"] = float(max_spend)
        return self._message("renew", f, campaign)

    def _release(self, lease_id: int, campaign: str | None) -> int:
        return self._message("release", {"lease": int(lease_id)}, campaign)

    def _consume(self, dim: str, amount: float, campaign: str | None) -> int:
        return self._message("consume", {"dim": dim, "amount": float(amount)}, campaign)

    def _take_frame(self) -> str | bytes | None:
        if not self._outbox:
            return None
        batch, self._outbox = self._outbox, []
        one: Any = batch[0] if len(batch) == 1 else batch
        self.sent += len(batch)
        self.frames += 1
        if self.binary:
            return msgpack.packb(one, use_bin_type=True)
        return json.dumps(one, separators=(",", ":"), allow_nan=False)

    def _feed(self, data: str | bytes) -> None:
        doc = msgpack.unpackb(data, raw=False) if isinstance(data, bytes) else json.loads(data)
        if isinstance(doc, list):
            self._inbox.extend(doc)
        else:
            self._inbox.append(doc)

    def _decode(self, doc: dict[str, Any]) -> Answer:
        kind = doc.get("type")
        if kind == "event":
            return Answer(None, event_from(doc["event"]))
        self.unanswered -= 1
        if kind == "decision":
            return Answer(doc["id"], decision_from(doc["decision"]))
        if kind == "consumption":
            c = doc["consumption"]
            return Answer(doc["id"], consumption_from(c))
        _raise_error(doc)
        raise AssertionError("unreachable")  # pragma: no cover

    def _wait(self, timeout: float | None) -> float | None:
        """How long a read may wait: ``timeout``, else the stream's own while an answer is
        due, else without bound (only events can come)."""
        if timeout is not None:
            return timeout
        return self.timeout if self.unanswered > 0 else None

    def _fits(self) -> bool:
        """Whether another message may be sent before reading (see the module's flow
        control)."""
        return self.unanswered - len(self._inbox) < self.window


class DecisionStream(_Protocol):
    """A decision stream over a synchronous WebSocket; a context manager and an iterator
    of the broker's types (see the module docstring)."""

    def __init__(self, url: str, token: str, *, campaign: str | None, binary: bool = False,
                 frame: int = 100, window: int = 2048, timeout: float = 10.0,
                 max_size: int = 1 << 24) -> None:
        super().__init__(campaign, binary, frame, window)
        from websockets.sync.client import connect

        self.timeout = float(timeout)
        # a connection held open by this object (websockets >= 17.1 asks for legacy=True
        # to return one outside a with block; earlier versions always do)
        legacy: dict[str, Any] = \
            {"legacy": True} if "legacy" in inspect.signature(connect).parameters else {}
        try:
            self._ws = connect(url, additional_headers={"Authorization": f"Bearer {token}"},
                               open_timeout=timeout, compression=None, max_size=max_size,
                               **legacy)
        except InvalidStatus as e:
            raise handshake_error(e, campaign) from None
        except (OSError, TimeoutError, websockets.exceptions.WebSocketException) as e:
            raise handshake_error(e, campaign) from None

    # -- sends (each returns the message's id) ----------------------------------------
    def acquire(self, intent: Intent) -> int:
        """State an intent; its answer is a :class:`~bursarcore.Decision`."""
        self._room()
        return self._after(self._acquire(intent))

    def renew(self, lease_id: int, duration: float, max_spend: float | None = None, *,
              campaign: str | None = None) -> int:
        self._room()
        return self._after(self._renew(lease_id, duration, max_spend, campaign))

    def release(self, lease_id: int, campaign: str | None = None) -> int:
        self._room()
        return self._after(self._release(lease_id, campaign))

    def consume(self, dim: str, amount: float, campaign: str | None = None) -> int:
        """Consume a flow dimension; the answer is a :class:`~bursarcore.broker.Consumption`."""
        self._room()
        return self._after(self._consume(dim, amount, campaign))

    def flush(self) -> None:
        """Send the messages gathered so far."""
        payload = self._take_frame()
        if payload is not None:
            try:
                self._ws.send(payload)
            except ConnectionClosed as e:
                raise Unavailable(f"stream closed: {e}") from None

    def _after(self, mid: int) -> int:
        if len(self._outbox) >= self.frame:
            self.flush()
        return mid

    def _room(self) -> None:
        while not self._fits():
            self.flush()
            self._read_frame(self.timeout)

    # -- reads ------------------------------------------------------------------------
    def _read_frame(self, timeout: float | None) -> None:
        try:
            data = self._ws.recv(timeout=timeout)
        except TimeoutError:
            raise ServiceTimeout(f"stream: nothing arrived in {timeout} s") from None
        except ConnectionClosed as e:
            raise Unavailable(f"stream closed: {e}") from None
        self._feed(data)

    def receive(self, timeout: float | None = None) -> Answer:
        """The next answer or event, waiting ``timeout`` seconds at most
        (:class:`ServiceTimeout`); None: the stream's ``timeout`` while an answer is due,
        else as long as it takes (only events can come). An error answer raises
        (``message_id`` on the exception)."""
        self.flush()
        if not self._inbox:
            self._read_frame(self._wait(timeout))
        return self._decode(self._inbox.popleft())

    def __iter__(self) -> "DecisionStream":
        return self

    def __next__(self) -> Decision | Consumption | Event:
        return self.receive().value

    def close(self) -> None:
        """Send what was gathered (as a file's close writes its buffer), then close the
        connection; answers not read by then are not read."""
        try:
            self.flush()
        except ServiceError:
            pass
        self._ws.close()

    def __enter__(self) -> "DecisionStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class AsyncDecisionStream(_Protocol):
    """A decision stream over an asyncio WebSocket; an async context manager and an async
    iterator of the broker's types. Open it with ``await`` or ``async with``."""

    def __init__(self, url: str, token: str, *, campaign: str | None, binary: bool = False,
                 frame: int = 100, window: int = 2048, timeout: float = 10.0,
                 max_size: int = 1 << 24) -> None:
        super().__init__(campaign, binary, frame, window)
        self._url, self._token, self._max_size = url, token, max_size
        self.timeout = float(timeout)
        self._ws: Any = None

    async def open(self) -> "AsyncDecisionStream":
        from websockets.asyncio.client import connect

        try:
            self._ws = await connect(self._url, open_timeout=self.timeout, compression=None,
                                     additional_headers={"Authorization":
                                                         f"Bearer {self._token}"},
                                     max_size=self._max_size)
        except InvalidStatus as e:
            raise handshake_error(e, self.campaign) from None
        except (OSError, TimeoutError, websockets.exceptions.WebSocketException) as e:
            raise handshake_error(e, self.campaign) from None
        return self

    def __await__(self) -> Any:
        return self.open().__await__()

    async def __aenter__(self) -> "AsyncDecisionStream":
        if self._ws is None:
            await self.open()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def acquire(self, intent: Intent) -> int:
        await self._room()
        return await self._after(self._acquire(intent))

    async def renew(self, lease_id: int, duration: float, max_spend: float | None = None, *,
                    campaign: str | None = None) -> int:
        await self._room()
        return await self._after(self._renew(lease_id, duration, max_spend, campaign))

    async def release(self, lease_id: int, campaign: str | None = None) -> int:
        await self._room()
        return await self._after(self._release(lease_id, campaign))

    async def consume(self, dim: str, amount: float, campaign: str | None = None) -> int:
        await self._room()
        return await self._after(self._consume(dim, amount, campaign))

    async def flush(self) -> None:
        payload = self._take_frame()
        if payload is not None:
            try:
                await self._ws.send(payload)
            except ConnectionClosed as e:
                raise Unavailable(f"stream closed: {e}") from None

    async def _after(self, mid: int) -> int:
        if len(self._outbox) >= self.frame:
            await self.flush()
        return mid

    async def _room(self) -> None:
        while not self._fits():
            await self.flush()
            await self._read_frame(self.timeout)

    async def _read_frame(self, timeout: float | None) -> None:
        import asyncio

        try:
            data = await asyncio.wait_for(self._ws.recv(), timeout)
        except (asyncio.TimeoutError, TimeoutError):
            raise ServiceTimeout(f"stream: nothing arrived in {timeout} s") from None
        except ConnectionClosed as e:
            raise Unavailable(f"stream closed: {e}") from None
        self._feed(data)

    async def receive(self, timeout: float | None = None) -> Answer:
        await self.flush()
        if not self._inbox:
            await self._read_frame(self._wait(timeout))
        return self._decode(self._inbox.popleft())

    def __aiter__(self) -> "AsyncDecisionStream":
        return self

    async def __anext__(self) -> Decision | Consumption | Event:
        return (await self.receive()).value

    async def aclose(self) -> None:
        if self._ws is None:
            return
        try:
            await self.flush()
        except ServiceError:
            pass
        await self._ws.close()
