"""The decision stream: ``/v1/stream``, one WebSocket per agent (docs/service.md, "The
decision stream").

An agent opens one connection and sends intents, renewals, releases and consumptions
without waiting for each answer; the server decides them in the order they arrive and
answers each, **in the same order**, once its journal record is durable. Events of the
stream's campaign (preempt notices, revocations, expiries, activations, grants and
refusals of pending intents) arrive on the same connection as they become durable.

Durability is the HTTP API's: each message runs through :meth:`BrokerService.apply`
(the broker operation under the lock, with the service's failure policy) and its answer
waits in :meth:`BrokerService.wait_durable` for the group commit that covers it, so an
answer the client receives is an acknowledged decision. One connection's answers share
fsyncs with each other and with every concurrent HTTP request.

Back pressure. A connection holds at most ``window`` messages that were read and not yet
answered on the socket. The server reads the next frame only while a whole frame still
fits (``in flight + frame <= window``): a client that does not read its answers stops
being read, its TCP window fills and its sends block, and the server holds no more than
``window`` answers for it. Events are fetched from the service's event log (the journal
behind it) only while the outgoing queue has room, so a slow reader lags behind the log
rather than growing a buffer.

Fairness. A frame's messages are decided in slices of :data:`SLICE`, with a return to the
event loop between slices, so a connection sending large frames never holds the loop for
more than one slice, and every other connection and request, the committer and the
ticker go on between them. Rate limits are the per-token ones of the HTTP API: a frame of
k messages costs ``1 + k // batch_unit`` requests, as a batch of k items does.

Access is the HTTP API's rule: a campaign token acts only for its own campaign, the
operator for any, and a campaign the token may not act for answers exactly as one that
does not exist (404 ``campaign not found``).
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import math
from typing import Any, Callable

from fastapi import FastAPI, WebSocket
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse

from ..admission import Intent
from ..errors import BursarError, InvalidArgument, UnknownCampaign, UnknownLease
from . import models as M
from .auth import Principal, TokenStore
from .core import (JOURNAL_ERRORS, BrokerService, OperationFailed, ServiceUnavailable,
                   json_safe)
from .ratelimit import RateLimiter, RequestLimits

try:  # the binary form needs msgpack (a dependency of the 'service' extra)
    import msgpack
except ImportError:  # pragma: no cover
    msgpack = None
try:  # answers are encoded with msgspec when it is there (the 'service' extra has it)
    import msgspec
except ImportError:  # pragma: no cover
    msgspec = None  # type: ignore[assignment]

__all__ = ["install", "OPS", "SLICE", "StreamSession", "MAX_ID_LEN"]

log = logging.getLogger("bursarcore.service")

#: the operations a message may ask for
OPS = ("acquire", "renew", "release", "consume")
#: messages decided between two returns to the event loop
SLICE = 128
#: the longest string id a message may carry
MAX_ID_LEN = 64
#: the fewest consecutive like intents decided as one run (``Broker._acquire_many``)
RUN = 4
#: message shapes a connection remembers (see StreamSession._prepare)
_SHAPES = 1024
_MAX_LEASE = 1 << 62
#: fields every message may carry beside its operation's own
_COMMON = ("id", "op", "campaign")
_FIELDS = {"acquire": ("dim", "min", "max", "duration", "deadline", "max_spend",
                       "service_class", "ttl"),
           "renew": ("lease", "duration", "max_spend"),
           "release": ("lease",),
           "consume": ("dim", "amount")}
_MODELS: dict[str, Any] = {"acquire": M.IntentIn, "renew": M.RenewIn, "consume": M.ConsumeIn}


class _Refused(Exception):
    """One message's error frame: ``status`` (422, 404, 429, 500, 503) and ``detail`` (a
    list of ``{loc, msg, type}`` for 422, else a sentence)."""

    def __init__(self, status: int, detail: Any, retry_after: float | None = None) -> None:
        super().__init__(detail)
        self.status, self.detail, self.retry_after = status, detail, retry_after


def _bad(loc: list, msg: str, kind: str = "invalid_argument") -> _Refused:
    return _Refused(422, [{"loc": loc, "msg": msg, "type": kind}])


def _error_doc(mid: Any, e: _Refused) -> dict[str, Any]:
    doc: dict[str, Any] = {"id": mid, "type": "error", "status": e.status, "detail": e.detail}
    if e.retry_after is not None:
        doc["retry_after"] = e.retry_after
    return doc


def _refusal_of(e: BaseException) -> _Refused:
    """The error frame of an expected error a broker call raised (nothing changed)."""
    if isinstance(e, UnknownCampaign):
        return _Refused(404, "campaign not found")
    if isinstance(e, UnknownLease):
        return _Refused(404, ("intent" if "intent" in e.field else "lease") + " not found")
    if isinstance(e, InvalidArgument):
        return _bad([e.field], e.rule)
    if isinstance(e, RequestValidationError):
        return _Refused(422, [{"loc": [x for x in it.get("loc", ()) if x != "body"],
                               "msg": str(it.get("msg", "invalid")),
                               "type": str(it.get("type", "value_error"))}
                              for it in e.errors()])
    if isinstance(e, StarletteHTTPException):
        return _Refused(e.status_code, e.detail)
    return _Refused(422, [{"loc": ["message"], "msg": str(e), "type": type(e).__name__}])


def _validation(e: ValidationError) -> _Refused:
    return _Refused(422, [{"loc": [x if isinstance(x, int) else str(x) for x in it["loc"]],
                           "msg": str(it["msg"]), "type": str(it["type"])}
                          for it in e.errors()])


def _encode_list(docs: list[dict[str, Any]], binary: bool) -> bytes:
    """``docs`` as one array in the frame's form (MessagePack, or JSON as UTF-8 bytes;
    JSON has no infinity: null, as everywhere in the API)."""
    if binary:
        if _MP is not None:
            return _MP.encode(docs)
        assert msgpack is not None
        return msgpack.packb(docs, use_bin_type=True)
    if _JS is not None:
        return _JS.encode(docs)          # non-finite floats: null
    try:
        text = json.dumps(docs, separators=(",", ":"), allow_nan=False)
    except ValueError:
        text = json.dumps(json_safe(docs), separators=(",", ":"), allow_nan=False)
    return text.encode()


_MP = msgspec.msgpack.Encoder() if msgspec is not None else None
_JS = msgspec.json.Encoder() if msgspec is not None else None


def _body(docs: list[dict[str, Any]], binary: bool) -> bytes:
    """The encoded items of ``docs`` without the array around them: arrays of answers
    join by concatenation (MessagePack) or with commas (JSON) under one new header."""
    data = _encode_list(docs, binary)
    if not binary:
        return data[1:-1]
    n = len(docs)
    return data[1:] if n < 16 else data[3:] if n < 1 << 16 else data[5:]


def _array(bodies: list[bytes], n: int, binary: bool) -> bytes | str:
    """One frame of ``n`` encoded items: the item alone when there is one, else an
    array."""
    if binary:
        body = b"".join(bodies)
        if n == 1:
            return body
        head = (bytes((0x90 | n,)) if n < 16 else b"\xdc" + n.to_bytes(2, "big")
                if n < 1 << 16 else b"\xdd" + n.to_bytes(4, "big"))
        return head + body
    body = b",".join(bodies)
    return (body if n == 1 else b"[" + body + b"]").decode()


def _decode_array(frame: bytes | str, binary: bool) -> list[dict[str, Any]]:
    doc = msgpack.unpackb(frame, raw=False) if binary else json.loads(frame)
    return doc if isinstance(doc, list) else [doc]


class _Chunk:
    """Encoded outgoing messages: ``n`` items (``answers`` of them answers, counted in
    flight; the rest events), sendable once ``seq`` is durable."""

    __slots__ = ("body", "n", "answers", "seq", "binary")

    def __init__(self, body: bytes, n: int, answers: int, seq: int, binary: bool) -> None:
        self.body, self.n, self.answers, self.seq, self.binary = body, n, answers, seq, binary


class StreamSession:
    """One connection: a reader that decides messages, a writer that answers them once
    durable, and (unless ``events`` is off) an event watcher. See the module docstring."""

    def __init__(self, ws: Any, ctx: "_Context", p: Principal, campaign: str | None,
                 after: int, events: bool) -> None:
        self.ws, self.ctx, self.p = ws, ctx, p
        self.campaign = campaign          # default campaign of messages; events' filter
        self.cursor = after
        self.events = events
        self.window = ctx.window
        self.frame_max = min(ctx.frame, ctx.window)
        # a frame's messages are decided (and their answers encoded) this many at a time
        self.slice = min(SLICE, self.frame_max)
        self.out: collections.deque[_Chunk] = collections.deque()
        self.inflight = 0                 # answers read and not yet sent
        self.peak = 0                     # the most ever in flight (metrics, tests)
        self.received = 0                 # messages read
        self.answered = 0                 # answers sent
        self.frames_sent = 0              # frames of answers and events sent
        self.binary = False               # the form of the client's last frame
        self.failed = False               # the service stopped acknowledging
        self._wake = asyncio.Event()      # the writer: something to send
        self._room = asyncio.Event()      # the reader and the watcher: room in flight
        self._pending: list[Any] = []     # the messages of the frame being decided
        self._pending_binary = False
        # messages this connection sent before, by their fields and the fields' types (so
        # that 1, 1.0 and true stay apart), id aside: an agent sends the same few shapes
        # again and again, and a checked intent (or consumption) is immutable, so a shape
        # is checked once and its broker call remembered
        self._shapes: dict[tuple, tuple[str, Callable[..., Any], tuple]] = {}

    # ------------------------------------------------------------------ the tasks
    async def run(self) -> None:
        tasks = [asyncio.create_task(self._reader()), asyncio.create_task(self._writer())]
        if self.events:
            tasks.append(asyncio.create_task(self._watcher()))
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            if self.failed and tasks[1] not in done:
                # the reader stopped because the service did: the writer sends what is
                # queued (the 503s) and closes the socket
                await asyncio.wait([tasks[1]], timeout=self.ctx.service.commit_timeout)
        finally:
            # no await here: a session cancelled from outside (the server shutting down)
            # ends at once, and its tasks end at their next step
            for t in tasks:
                t.cancel()
        for t in done:
            err = None if t.cancelled() else t.exception()
            if err is not None and not _is_disconnect(err):
                # a bug, not the client: logged, and the client told (1011) rather than
                # left to wait for answers that will not come
                log.error("decision stream failed", exc_info=err)
                try:
                    await self.ws.close(code=1011, reason="internal error")
                except Exception:  # noqa: BLE001 - the socket may be gone already
                    pass

    async def _wait_room(self, need: int) -> None:
        while self.inflight + need > self.window:
            self._room.clear()
            await self._room.wait()

    async def _reader(self) -> None:
        ws = self.ws
        while True:
            await self._wait_room(self.frame_max)
            msg = await ws.receive()
            if msg["type"] == "websocket.disconnect":
                return
            if msg.get("bytes") is not None:
                self.binary = True
                self._frame(msg["bytes"], True)
            else:
                self.binary = False
                self._frame(msg.get("text") or "", False)
            self._wake.set()          # the frame's own error answers, if any
            # decide the frame's messages a slice at a time (see the module docstring)
            pending, binary, step = self._pending, self._pending_binary, self.slice
            self._pending = []
            for i in range(0, len(pending), step):
                self._decide(pending[i:i + step], binary)
                self._wake.set()
                if self.failed:
                    return
                await asyncio.sleep(0)

    def _frame(self, data: str | bytes, binary: bool) -> None:
        """Read one frame into ``_pending`` (its messages); a frame that cannot be read
        answers one error (id null) and changes nothing."""
        self._pending, self._pending_binary = [], binary
        if len(data) > self.ctx.max_frame_bytes:
            self._answer_now(None, _bad(["frame"], f"must be at most "
                                        f"{self.ctx.max_frame_bytes} bytes"), binary)
            return
        try:
            if binary:
                if msgpack is None:  # pragma: no cover
                    raise ValueError("the binary form needs msgpack on the server")
                doc = msgpack.unpackb(data, raw=False, strict_map_key=True)
            else:
                doc = json.loads(data)
        except Exception as e:  # noqa: BLE001 - each parser has errors of its own
            name = "MessagePack" if binary else "JSON"
            self._answer_now(None, _bad(["frame"], f"is not valid {name} "
                                        f"({type(e).__name__})", "frame_invalid"), binary)
            return
        items = doc if isinstance(doc, list) else [doc]
        if not items or len(items) > self.frame_max:
            self._answer_now(None, _bad(["frame"], f"must hold 1 to {self.frame_max} "
                                        f"messages"), binary)
            return
        wait = self.ctx.charge(self.p, len(items))
        if wait:
            limited = _Refused(429, "rate limit exceeded",
                               retry_after=math.ceil(wait * 1000) / 1000)
            for m in items:
                self._answer_now(m.get("id") if isinstance(m, dict) else None, limited, binary)
            return
        self._pending = items

    def _answer_now(self, mid: Any, e: _Refused, binary: bool) -> None:
        """An error answer that changes nothing (it still waits for the answers before it,
        which the writer sends first)."""
        if not _valid_id(mid):
            mid = None
        self._push([_error_doc(mid, e)], -1, binary)

    def _push(self, docs: list[dict[str, Any]], seq: int, binary: bool) -> None:
        """Queue answers, encoded now: what waits for the commit is bytes, not objects."""
        n = len(docs)
        self.received += n
        self.inflight += n
        if self.inflight > self.peak:
            self.peak = self.inflight
        self.out.append(_Chunk(_body(docs, binary), n, n, seq, binary))

    def _decide(self, items: list[Any], binary: bool) -> None:
        """Decide a slice of messages, in order, under the broker lock once: each is one
        broker operation with :meth:`BrokerService.apply`'s failure policy, and the
        slice's answers wait together for the commit that covers the last of them.

        Every message is read and checked first (a check reads no state a decision
        changes). Where the broker has runs (``_Context.acquire_many``), a run of
        :data:`RUN` or more consecutive intents without a deadline or a max_spend is
        decided by one ``Broker._acquire_many`` (the same decisions, records and state as
        one acquire each, at one instant); any other message, and every intent of a run
        the broker refused before deciding any, is its own operation."""
        svc = self.ctx.service
        journal = svc.journal
        many = self.ctx.acquire_many
        docs: list[dict[str, Any]] = []
        seq = -1
        with svc.lock:
            calls = [self._read(m) for m in items]
            n = len(calls)
            i = 0
            solo = 0                          # messages before this one go one at a time
            while i < n:
                mid, call = calls[i]
                if svc.failed is not None:
                    docs.append(_error_doc(mid, _Refused(503, "the journal cannot be "
                                                         "written; not accepting operations")))
                    self.failed = True
                    break
                j = i
                xs = []                       # the intents of a run from i
                if many is not None and i >= solo:
                    while j < n:
                        x = _batchable(calls[j][1])
                        if x is None:
                            break
                        xs.append(x)
                        j += 1
                if j - i >= RUN:
                    before = journal.next_seq
                    try:
                        decs = many(xs)          # type: ignore[misc]
                    except Exception as e:  # noqa: BLE001 - classified as apply() does
                        if journal.next_seq == before and not isinstance(e, JOURNAL_ERRORS):
                            solo = j          # nothing changed: one operation each
                        else:
                            self._fail_run(e, before, calls[i:j], docs)
                            break
                    else:
                        seq = journal.next_seq - 1
                        for c, dec in zip(calls[i:j], decs):
                            docs.append({"id": c[0], "type": "decision",
                                         "decision": M.decision_out(dec)})
                        i = j
                        continue
                doc, done = self._one(mid, call)
                docs.append(doc)
                if done is None:              # the service stopped
                    self.failed = True
                    break
                if done:
                    seq = journal.next_seq - 1
                i += 1
        if docs:
            self._push(docs, seq, binary)

    def _fail_run(self, e: Exception, before: int, calls: list, docs: list) -> None:
        """A run that failed once it had journaled (or in the journal): the service fails
        stop, and every intent of the run answers 503 (not acknowledged, as with a
        crash)."""
        try:
            self.ctx.service._unexpected(e, before, "acquire_many")
        except (ServiceUnavailable, OperationFailed) as f:
            why = str(f)
        for c in calls:
            docs.append(_error_doc(c[0], _Refused(503, why)))
        self.failed = True

    def _read(self, m: Any) -> tuple[Any, tuple[str, Callable[..., Any], tuple] | _Refused]:
        """A message's id and its broker call (see :meth:`_prepare`), or the error it
        answers; changes nothing."""
        # the id is read off the message: the rest is its shape (see _prepare)
        mid = m.pop("id", None) if type(m) is dict else None
        try:
            if type(m) is not dict:
                raise _bad(["message"], "must be a map of named fields")
            if type(mid) is not int or not -(1 << 63) <= mid < (1 << 63):
                if not _valid_id(mid):
                    mid = None
                    raise _bad(["id"], f"must be an integer or a string of 1 to "
                               f"{MAX_ID_LEN} characters")
            try:                # a shape seen before: its call (see _prepare)
                # the names, the values and their types, flat (n fields: 3n entries)
                shape = (*m, *m.values(), *map(type, m.values()))
                got = self._shapes.get(shape)
                key: tuple | None = shape
            except TypeError:                    # a list or a map among the values
                key, got = None, None
            return mid, got if got is not None else self._prepare(m, key)
        except _Refused as e:
            return mid, e
        except BursarError as e:       # bad input the checks found: nothing changed
            return mid, _refusal_of(e)

    def _one(self, mid: Any, call: tuple[str, Callable[..., Any], tuple] | _Refused
             ) -> tuple[dict[str, Any], bool | None]:
        """One message's answer: its broker operation with :meth:`BrokerService.apply`'s
        failure policy, or the error it answers; and whether the operation ran (None: the
        service stopped, the answer is a 503)."""
        svc = self.ctx.service
        try:
            if isinstance(call, _Refused):
                raise call
            kind, fn, args = call
            before = svc.journal.next_seq
            try:
                result = fn(*args)
            except svc.expected_errors as e:       # bad input: nothing changed
                raise _refusal_of(e) from None
            except Exception as e:  # noqa: BLE001 - classified as apply() does
                try:
                    svc._unexpected(e, before, getattr(fn, "__name__", repr(fn)))
                except OperationFailed as f:
                    raise _Refused(500, str(f)) from None
            if kind == "consume":
                return {"id": mid, "type": "consumption",
                        "consumption": M.consumption_out(result)}, True
            return {"id": mid, "type": "decision", "decision": M.decision_out(result)}, True
        except _Refused as e:
            return _error_doc(mid, e), False
        except BursarError as e:       # bad input the checks found: nothing changed
            return _error_doc(mid, _refusal_of(e)), False
        except ServiceUnavailable as e:
            return _error_doc(mid, _Refused(503, str(e))), None

    def _prepare(self, m: dict[str, Any], key: tuple | None
                 ) -> tuple[str, Callable[..., Any], tuple]:
        """Check one message (its id taken off); return its op and the broker call that
        decides it (the function and its arguments). Raises :class:`_Refused` naming the
        field, before anything changes. The call of an intent or a consumption is
        remembered under its shape ``key`` (the fields and their types; None: not
        hashable), which :meth:`_read` looks up first: a shape seen before is not
        checked again, the call it made is made again."""
        got = self._check(m)
        if key is not None and got[0] in ("acquire", "consume"):
            if len(self._shapes) >= _SHAPES:
                self._shapes.clear()
            self._shapes[key] = got
        return got

    def _check(self, m: dict[str, Any]) -> tuple[str, Callable[..., Any], tuple]:
        ctx = self.ctx
        op = m.get("op")
        if op not in _FIELDS:
            raise _bad(["op"], f"must be one of {list(OPS)}")
        campaign = m.get("campaign", self.campaign)
        if campaign is None:
            raise _bad(["campaign"], "is required: an operator token names the campaign")
        if not isinstance(campaign, str):
            raise _bad(["campaign"], "must be a campaign name (a string)")
        if not self.p.may_act_for(campaign) or campaign not in ctx.broker.envelopes:
            raise _Refused(404, "campaign not found")
        broker = ctx.broker
        allowed = _FIELDS[op]
        for k in m:
            if k not in allowed and k not in _COMMON:
                raise _bad([str(k)], f"is not a field of {op}; its fields are "
                           f"{[*_COMMON, *allowed]}", "extra_forbidden")
        if op == "release":
            lid = _lease_id(m)
            return op, _released, (ctx.own_lease, broker.release, campaign, lid)
        body = {k: v for k, v in m.items() if k not in _COMMON and k != "lease"}
        if op == "acquire":
            return op, broker.acquire, (self._intent(campaign, body),)
        try:
            model = _MODELS[op].model_validate(body)
        except ValidationError as e:
            raise _validation(e) from None
        if op == "renew":
            lid = _lease_id(m)
            return op, _renewed, (ctx.own_lease, broker.renew, campaign, lid, model.duration,
                                  model.max_spend)
        if model.dim not in broker.flow_dims:
            raise _bad(["dim"], f"must be a flow dimension, one of {broker.flow_dims}")
        return op, broker.consume, (campaign, model.dim, model.amount)

    def _intent(self, campaign: str, body: dict[str, Any]) -> Intent:
        """An intent checked as the HTTP API checks it (the same model, the same rules)."""
        try:
            model = M.IntentIn.model_validate(body)
        except ValidationError as e:
            raise _validation(e) from None
        try:
            return self.ctx.intent_of(campaign, model, ())
        except RequestValidationError as e:
            raise _refusal_of(e) from None

    async def _writer(self) -> None:
        svc = self.ctx.service
        ws = self.ws
        cap = self.frame_max
        while True:
            if not self.out:
                if self.failed:
                    await ws.close(code=1011, reason="the journal cannot be written")
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            batch = list(self.out)
            self.out.clear()
            seq = max(c.seq for c in batch)
            try:
                await svc.wait_durable(seq)
            except ServiceUnavailable as e:
                # not acknowledged: the decisions may or may not become durable (as with
                # a crash); each of them answers 503 instead
                for c in batch:
                    if c.seq >= 0 and c.answers:
                        _unacknowledged(c, str(e))
                if svc.failed is not None:
                    self.failed = True
            sent = 0
            i = 0
            while i < len(batch):
                # whole chunks of one form, at most a frame's worth of messages
                form = batch[i].binary
                n = batch[i].n
                j = i + 1
                while j < len(batch) and batch[j].binary == form and n + batch[j].n <= cap:
                    n += batch[j].n
                    j += 1
                payload = _array([c.body for c in batch[i:j]], n, form)
                if isinstance(payload, bytes):
                    await ws.send_bytes(payload)
                else:
                    await ws.send_text(payload)
                self.frames_sent += 1
                for c in batch[i:j]:
                    sent += c.answers
                i = j
            self.inflight -= sent
            self.answered += sent
            self.ctx.sent(sent)
            self._room.set()

    async def _watcher(self) -> None:
        svc = self.ctx.service
        while True:
            while len(self.out) >= self.window:
                self._room.clear()
                await self._room.wait()
            room = max(1, min(100, self.frame_max, self.window - len(self.out)))
            if not svc.running:             # no commits, no events (an app not started)
                await asyncio.sleep(1.0)
                continue
            evs = await svc.wait_events(self.campaign, self.cursor, room, 30.0)
            if not evs:
                continue
            binary = self.binary
            self.out.append(_Chunk(_body([{"type": "event", "event": e} for e in evs],
                                         binary), len(evs), 0, -1, binary))
            self.cursor = evs[-1]["seq"]
            self._wake.set()


def _released(own_lease: Callable, release: Callable, campaign: str, lid: int) -> Any:
    own_lease(campaign, lid)
    return release(lid)


def _renewed(own_lease: Callable, renew: Callable, campaign: str, lid: int, duration: float,
             max_spend: float | None) -> Any:
    own_lease(campaign, lid)
    return renew(lid, duration, max_spend)


def _unacknowledged(c: _Chunk, why: str) -> None:
    """A chunk whose commit did not come: each decision in it answers 503 instead."""
    docs = _decode_array(_array([c.body], c.n, c.binary), c.binary)
    docs = [_error_doc(d.get("id"), _Refused(503, why))
            if d.get("type") in ("decision", "consumption") else d for d in docs]
    c.body = _body(docs, c.binary)


def _batchable(call: Any) -> Intent | None:
    """A message call's intent if a run may hold it (no deadline, no max_spend: what the
    compiled batch loop expresses), else None."""
    if type(call) is not tuple or call[0] != "acquire":
        return None
    x = call[2][0]
    return x if x.deadline is None and x.max_spend is None else None


def _valid_id(mid: Any) -> bool:
    if isinstance(mid, bool):
        return False
    if isinstance(mid, int):
        return -(1 << 63) <= mid < (1 << 63)
    return isinstance(mid, str) and 1 <= len(mid) <= MAX_ID_LEN


def _lease_id(m: dict[str, Any]) -> int:
    lid = m.get("lease")
    if isinstance(lid, bool) or not isinstance(lid, int) or not 0 <= lid <= _MAX_LEASE:
        raise _bad(["lease"], f"must be a lease id, an integer >= 0 and <= {_MAX_LEASE}")
    return lid


def _is_disconnect(e: BaseException) -> bool:
    # the client went away mid-send: the server's socket layer says so in its own words
    from starlette.websockets import WebSocketDisconnect
    return isinstance(e, (WebSocketDisconnect, OSError, ConnectionError)) \
        or type(e).__name__ in ("ClientDisconnected", "ConnectionClosed", "ConnectionClosedOK",
                                "ConnectionClosedError")


class _Context:
    """What every session of one app shares."""

    def __init__(self, service: BrokerService, limiter: RequestLimits, batch_unit: int,
                 window: int, frame: int, max_frame_bytes: int,
                 intent_of: Callable[..., Intent], own_lease: Callable[[str, int], Any],
                 on_sent: Callable[[int], None]) -> None:
        self.service, self.broker = service, service.broker
        self.limiter, self.batch_unit = limiter, batch_unit
        self.window, self.frame, self.max_frame_bytes = window, frame, max_frame_bytes
        self.intent_of, self.own_lease = intent_of, own_lease
        self.sent = on_sent
        # many intents decided as one operation, where the broker has it (not the
        # reference broker: there each intent is its own acquire)
        self.acquire_many: Callable[[list[Intent]], list[Any]] | None = \
            getattr(self.broker, "_acquire_many", None)
        self.sessions: set[StreamSession] = set()

    def charge(self, p: Principal, n: int) -> float:
        """The rate limit of a frame of ``n`` messages: 0 when allowed, else the wait."""
        return self.limiter.check(p, 1 + n // self.batch_unit)


def install(app: FastAPI, service: BrokerService, tokens: TokenStore, limiter: RequestLimits,
            fail_limiter: RateLimiter, *, batch_unit: int, window: int, frame: int,
            max_frame_bytes: int, intent_of: Callable[..., Intent],
            own_lease: Callable[[str, int], Any],
            on_sent: Callable[[int], None] = lambda n: None) -> _Context:
    """Add ``/v1/stream`` to ``app``; returns the shared context (its live sessions)."""
    ctx = _Context(service, limiter, batch_unit, max(1, window), max(1, frame),
                   max_frame_bytes, intent_of, own_lease, on_sent)
    broker = service.broker

    async def deny(ws: WebSocket, status: int, detail: Any,
                   headers: dict[str, str] | None = None) -> None:
        send_denial = getattr(ws, "send_denial_response", None)
        if send_denial is not None and "websocket.http.response" in \
                (ws.scope.get("extensions") or {}):
            await send_denial(JSONResponse({"detail": detail}, status_code=status,
                                           headers=headers))
        else:  # a server without denial responses: the handshake fails (HTTP 403)
            await ws.close(code=1008)

    @app.websocket("/v1/stream")
    async def stream(ws: WebSocket) -> None:
        """The decision stream (docs/service.md)."""
        auth = ws.headers.get("authorization") or ""
        scheme, _, cred = auth.partition(" ")
        p = tokens.authenticate(cred.strip()) if scheme.lower() == "bearer" else None
        if p is None:
            host = ws.client.host if ws.client else "?"
            wait = fail_limiter.check(host)
            if wait:
                await deny(ws, 429, "too many failed authentications",
                           {"Retry-After": str(max(1, math.ceil(wait)))})
                return
            await deny(ws, 401, "missing or invalid bearer token",
                       {"WWW-Authenticate": "Bearer"})
            return
        q = ws.query_params
        unknown = sorted(set(q) - {"campaign", "after", "events"})
        if unknown:
            await deny(ws, 422, [{"loc": ["query", unknown[0]], "type": "extra_forbidden",
                                  "msg": "is not a parameter; they are campaign, after, "
                                         "events"}])
            return
        campaign = q.get("campaign", p.campaign)
        if campaign is not None and (not p.may_act_for(campaign)
                                     or campaign not in broker.envelopes):
            await deny(ws, 404, "campaign not found")
            return
        after = service.durable_seq
        if "after" in q:
            try:
                after = int(q["after"])
                if not -1 <= after <= 1 << 62:
                    raise ValueError
            except ValueError:
                await deny(ws, 422, [{"loc": ["query", "after"], "type": "invalid_argument",
                                      "msg": "must be a journal seq, an integer >= -1"}])
                return
        events = q.get("events", "true").lower()
        if events not in ("true", "false", "1", "0"):
            await deny(ws, 422, [{"loc": ["query", "events"], "type": "invalid_argument",
                                  "msg": "must be true or false"}])
            return
        if service.failed is not None:
            await deny(ws, 503, "the journal cannot be written")
            return
        await ws.accept()
        session = StreamSession(ws, ctx, p, campaign, after, events in ("true", "1"))
        ctx.sessions.add(session)
        try:
            await session.run()
        finally:
            ctx.sessions.discard(session)

    return ctx
