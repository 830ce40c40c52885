"""A client for ``bursar serve``: the broker's API over HTTP, returning the broker's types.

``BursarClient(base_url, token)`` (sync) and ``AsyncBursarClient`` (async) answer with the
same :class:`~bursarcore.Decision`, :class:`~bursarcore.Lease`, :class:`~bursarcore.Supply`,
:class:`~bursarcore.Quote`, :class:`~bursarcore.broker.Consumption` and
:class:`~bursarcore.Event` the in-process :class:`~bursarcore.Broker` returns, and take the
same arguments (an :class:`~bursarcore.Intent` for ``acquire``), so an agent switches from
embedded to remote by changing the line that makes the broker::

    broker = Broker(Pool(gpu=512), clock=MonotonicClock())      # embedded
    broker = BursarClient("http://127.0.0.1:8000", token)         # remote

A campaign argument may be left out: it defaults to the token's own campaign.

Errors: bad input raises :class:`~bursarcore.errors.InvalidArgument` naming the field (HTTP
422); another campaign's or a missing lease raises :class:`~bursarcore.errors.UnknownLease`
(404), a campaign :class:`~bursarcore.errors.UnknownCampaign`; a refusal is a value, as in
process. Transport trouble raises :class:`ServiceError` subclasses.

Retries: a 429 (rate limit) is retried after its ``Retry-After`` (the request was not
processed). Idempotent calls (reads, ``cancel``, ``release``) are also retried with
exponential backoff and jitter on connection errors, timeouts and 502/503/504. Calls that
change state (``acquire``, ``renew``, ``consume``) are retried only when the request never
reached the server (a refused connection). Every call is bounded: ``timeout`` seconds per
attempt, ``retries`` extra attempts, waits capped at ``max_wait``.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Iterable, Iterator, NamedTuple, Sequence

import numpy as np

from .admission import Envelope, Intent
from .broker import Consumption, Decision, DimSupply, Event, Lease, Quote, Supply
from .errors import BursarError, InvalidArgument, UnknownCampaign, UnknownLease

__all__ = ["BursarClient", "AsyncBursarClient", "ServiceError", "Unauthorized", "Forbidden",
           "RateLimited", "Unavailable", "ServiceTimeout", "EventPage", "Ticket"]

try:  # httpx is the 'service' extra; the module imports without it for type checking
    import httpx
except ImportError:  # pragma: no cover
    httpx = None  # type: ignore[assignment]


class ServiceError(BursarError):
    """The service answered with an error that is not bad input, or could not be reached."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class Unauthorized(ServiceError):
    """401: no token, or a token the service does not know."""


class Forbidden(ServiceError):
    """403: an operator-only endpoint with a campaign token."""


class RateLimited(ServiceError):
    """429 after every retry: ``retry_after`` seconds is when to come back."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message, 429)
        self.retry_after = retry_after


class Unavailable(ServiceError):
    """5xx after every retry, or the service unreachable."""


class ServiceTimeout(Unavailable):
    """No answer within the timeout (the request may or may not have been processed)."""


class EventPage(NamedTuple):
    """Events and the cursor to pass as ``after`` next time (a journal seq)."""

    events: list[Event]
    next: int
    seqs: list[int]


class Ticket(NamedTuple):
    """What became of an intent: ``status`` pending / granted / refused / cancelled."""

    intent_id: int
    campaign: str
    status: str
    reason: str | None
    lease: Lease | None
    expires: float | None


# ---------------------------------------------------------------------------- decoding
def _inf(x: float | None) -> float:
    return math.inf if x is None else float(x)


def lease_from(d: dict) -> Lease:
    return Lease(id=d["id"], campaign=d["campaign"], dim=d["dim"], units=d["units"],
                 state=d["state"], firm=d["firm"], service_class=d["service_class"],
                 granted_at=d["granted_at"], start=d["start"], expiry=d["expiry"],
                 cost=d["cost"], revoke_at=d["revoke_at"], intent=d["intent"],
                 placement=tuple((p["node"], p["units"]) for p in d["placement"]),
                 slots=tuple(d["slots"]))


def decision_from(d: dict) -> Decision:
    return Decision(outcome=d["outcome"], intent_id=d["intent_id"], campaign=d["campaign"],
                    units=d["units"], lease=lease_from(d["lease"]) if d.get("lease") else None,
                    path=d["path"], reason=d["reason"], retry_after=d["retry_after"],
                    cost=d["cost"], wait=d["wait"], seq=d["seq"])


def supply_from(d: dict) -> Supply:
    dims = {k: DimSupply(free=v["free"], reclaimable=v["reclaimable"], capacity=v["capacity"],
                         congestion=v["congestion"], multiplier=v["multiplier"],
                         tokens=_inf(v["tokens"]), bucket=_inf(v["bucket"]), held=v["held"],
                         ceiling=v["ceiling"], price=dict(v["price"]), wait=dict(v["wait"]))
            for k, v in d["dims"].items()}
    return Supply(d["campaign"], d["time"], _inf(d["credits"]), d["service_class"], dims)


def quote_from(d: dict) -> Quote:
    wait = np.array([[_inf(x) for x in row] for row in d["wait"]], dtype=float)
    return Quote(sizes=np.array(d["sizes"], dtype=np.int64),
                 durations=np.array(d["durations"], dtype=float),
                 cost=np.array(d["cost"], dtype=float), path=np.array(d["path"], dtype=str),
                 wait=wait, grantable=np.array(d["grantable"], dtype=bool),
                 reason=np.array(d["reason"], dtype=str))


def consumption_from(d: dict) -> Consumption:
    return Consumption(d["campaign"], d["dim"], d["requested"], d["allowed"],
                       _inf(d["retry_after"]), d["reason"], d["cost"], d["seq"])


def event_from(d: dict) -> Event:
    return Event(d["kind"], d["time"], d["campaign"], lease_id=d["lease_id"],
                 intent_id=d["intent_id"], deadline=d["deadline"], reason=d["reason"],
                 units=d["units"])


def _intent_body(intent: Intent) -> dict:
    if not isinstance(intent, Intent):
        raise InvalidArgument("intent", "must be an Intent", intent)
    lo, hi = intent.bounds
    body: dict[str, Any] = {"dim": intent.dim, "min": lo, "max": hi,
                            "duration": float(intent.duration)}
    for k in ("deadline", "max_spend", "service_class", "ttl"):
        v = getattr(intent, k)
        if v is not None:
            body[k] = float(v) if k != "service_class" else v
    return body


def _envelope_body(env: Envelope) -> dict:
    d = env.to_dict()
    d["credits"] = None if math.isinf(d["credits"]) else d["credits"]
    d["burst"] = {k: (None if math.isinf(v) else v) for k, v in d["burst"].items()}
    return {k: v for k, v in d.items() if v is not None or k == "credits"}


class _SSE:
    """Server-sent events, line by line: ``feed(line)`` returns ``(seq, Event)`` when a
    line ends an event that carries data, else None (comments, ``retry:``, keep-alives)."""

    def __init__(self) -> None:
        self.id: str | None = None
        self.data: list[str] = []

    def feed(self, line: str) -> tuple[int, Event] | None:
        if line == "":
            data, self.data = self.data, []
            if not data:
                return None
            d = json.loads("\n".join(data))
            seq = int(self.id) if self.id is not None else int(d["seq"])
            return seq, event_from(d)
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "data":
            self.data.append(value)
        elif name == "id":
            self.id = value
        return None


# ---------------------------------------------------------------------------- requests
@dataclass
class _Req:
    method: str
    path: str                       # may hold "{campaign}"
    parse: Callable[[Any], Any]
    campaign: str | None = None
    json: Any = None
    params: dict | None = None
    idempotent: bool = False
    timeout: float | None = None
    needs_campaign: bool = field(default=False)
    operator_path: str | None = None  # with no campaign and an operator token: this path


PAGE = 1000
"""Items per page when a client method reads a whole paginated list."""


def _q(s: str) -> str:
    return urllib.parse.quote(str(s), safe="")


class _Base:
    """Request building, response mapping and the retry policy shared by both clients."""

    def __init__(self, base_url: str, token: str, *, campaign: str | None = None,
                 timeout: float = 10.0, retries: int = 4, backoff: float = 0.2,
                 max_wait: float = 30.0) -> None:
        if httpx is None:  # pragma: no cover
            raise ImportError("BursarClient needs httpx: pip install 'bursarcore[service]'")
        if not isinstance(token, str) or not token:
            raise InvalidArgument("token", "must be a non-empty string")
        self.base_url = base_url.rstrip("/")
        self._token = token
        self._campaign = campaign
        self.timeout = float(timeout)
        self.retries = max(0, int(retries))
        self.backoff = float(backoff)
        self.max_wait = float(max_wait)
        self._cursor = -1
        self._server_t: float | None = None
        self._local_t = 0.0
        self.requests = 0           # attempts made, for tests and benchmarks
        self.retried = 0

    def __repr__(self) -> str:  # never the token
        return f"{type(self).__name__}({self.base_url!r}, campaign={self._campaign!r})"

    @property
    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._token}", "Accept": "application/json"}

    def now(self) -> float:
        """Broker time, estimated from the last response's ``X-Bursar-Time``."""
        if self._server_t is None:
            return time.time()
        return self._server_t + (time.monotonic() - self._local_t)

    # -- policy -------------------------------------------------------------------
    def _note_time(self, r: Any) -> None:
        t = r.headers.get("x-bursar-time")
        if t:
            try:
                self._server_t, self._local_t = float(t), time.monotonic()
            except ValueError:
                pass

    def _delay(self, attempt: int, r: Any = None) -> float:
        if r is not None:
            ra = r.headers.get("retry-after")
            if ra is not None:
                try:
                    return min(self.max_wait, max(0.0, float(ra)))
                except ValueError:
                    pass
        base = self.backoff * (2 ** attempt)
        return min(self.max_wait, base * (0.5 + random.random()))

    def _should_retry(self, req: _Req, r: Any = None, exc: BaseException | None = None) -> bool:
        if exc is not None:
            if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout)):
                return True          # never reached the server: safe for any call
            return req.idempotent and isinstance(exc, (httpx.TimeoutException,
                                                       httpx.TransportError))
        if r.status_code == 429:
            return True              # not processed
        return req.idempotent and r.status_code in (502, 503, 504)

    def _url(self, req: _Req, campaign: str | None) -> str:
        path = req.path.replace("{campaign}", _q(campaign)) if campaign is not None else req.path
        return self.base_url + path

    def _result(self, req: _Req, r: Any) -> Any:
        code = r.status_code
        if code < 300:
            return req.parse(r.json() if r.content else None)
        try:
            body = r.json()
            detail = body.get("detail") if isinstance(body, dict) else body
        except ValueError:
            detail = r.text[:200]
        if code == 422:
            item = detail[0] if isinstance(detail, list) and detail else {}
            loc = [str(x) for x in item.get("loc", []) if x not in ("body", "query", "path")]
            raise InvalidArgument(".".join(loc) or "request", item.get("msg", str(detail)))
        if code == 404:
            text = str(detail)
            if text.startswith("campaign"):
                raise UnknownCampaign("campaign", "is not registered (or not yours)",
                                      req.campaign)
            raise UnknownLease(text.split(" ")[0] if text else "id",
                               "is not one of this campaign's", None)
        if code == 401:
            raise Unauthorized(str(detail), code)
        if code == 403:
            raise Forbidden(str(detail), code)
        if code == 429:
            raise RateLimited(str(detail), self._delay(0, r))
        if code == 413:
            raise InvalidArgument("request", f"body too large: {detail}")
        raise Unavailable(f"HTTP {code}: {detail}", code)

    # -- API: each returns a request; the clients execute it -------------------------
    def _r_whoami(self) -> _Req:
        return _Req("GET", "/v1/whoami", lambda d: d, idempotent=True)

    def _r_health(self) -> _Req:
        return _Req("GET", "/v1/health", lambda d: d, idempotent=True)

    def _r_supply(self, campaign: str | None) -> _Req:
        return _Req("GET", "/v1/campaigns/{campaign}/supply", supply_from, campaign,
                    idempotent=True, needs_campaign=True)

    def _r_quote(self, campaign, sizes, durations, dim, service_class) -> _Req:
        body = {"sizes": [int(x) for x in np.asarray(sizes).reshape(-1)],
                "durations": [float(x) for x in np.asarray(durations, float).reshape(-1)]}
        if dim is not None:
            body["dim"] = dim
        if service_class is not None:
            body["service_class"] = service_class
        return _Req("POST", "/v1/campaigns/{campaign}/quote", quote_from, campaign, body,
                    idempotent=True, needs_campaign=True)

    def _r_acquire(self, intent: Intent) -> _Req:
        return _Req("POST", "/v1/campaigns/{campaign}/intents", decision_from, intent.campaign,
                    _intent_body(intent), needs_campaign=True)

    def _r_acquire_batch(self, intents: Sequence[Intent]) -> _Req:
        intents = list(intents)
        if not intents:
            raise InvalidArgument("intents", "must not be empty")
        camps = {i.campaign for i in intents}
        if len(camps) != 1:
            raise InvalidArgument("intents", "a batch is one campaign's", sorted(camps))
        return _Req("POST", "/v1/campaigns/{campaign}/intents/batch",
                    lambda d: [decision_from(x) for x in d["decisions"]], camps.pop(),
                    {"intents": [_intent_body(i) for i in intents]}, needs_campaign=True)

    def _r_pending(self, campaign, after: int = -1) -> _Req:
        return _Req("GET", "/v1/campaigns/{campaign}/intents",
                    lambda d: (d["pending"], d.get("next")), campaign,
                    params={"after": after, "limit": PAGE}, idempotent=True,
                    needs_campaign=True)

    def _r_ticket(self, intent_id: int, campaign) -> _Req:
        def parse(d: dict) -> Ticket:
            return Ticket(d["intent_id"], d["campaign"], d["status"], d["reason"],
                          lease_from(d["lease"]) if d["lease"] else None, d["expires"])
        return _Req("GET", f"/v1/campaigns/{{campaign}}/intents/{int(intent_id)}", parse,
                    campaign, idempotent=True, needs_campaign=True)

    def _r_cancel(self, intent_id: int, campaign) -> _Req:
        return _Req("DELETE", f"/v1/campaigns/{{campaign}}/intents/{int(intent_id)}",
                    lambda d: bool(d["cancelled"]), campaign, idempotent=True,
                    needs_campaign=True)

    def _r_leases(self, campaign, after: int = -1) -> _Req:
        def parse(d: dict) -> tuple[list[Lease], int | None]:
            return [lease_from(x) for x in d["leases"]], d.get("next")
        return _Req("GET", "/v1/campaigns/{campaign}/leases", parse, campaign,
                    params={"after": after, "limit": PAGE}, idempotent=True,
                    needs_campaign=True)

    def _r_lease(self, lease_id: int, campaign) -> _Req:
        return _Req("GET", f"/v1/campaigns/{{campaign}}/leases/{int(lease_id)}", lease_from,
                    campaign, idempotent=True, needs_campaign=True)

    def _r_renew(self, lease_id, duration, max_spend, campaign) -> _Req:
        body: dict[str, Any] = {"duration": float(duration)}
        if max_spend is not None:
            body["max_spend"] = float(max_spend)
        return _Req("POST", f"/v1/campaigns/{{campaign}}/leases/{int(lease_id)}/renew",
                    decision_from, campaign, body, needs_campaign=True)

    def _r_release(self, lease_id, campaign) -> _Req:
        return _Req("POST", f"/v1/campaigns/{{campaign}}/leases/{int(lease_id)}/release",
                    decision_from, campaign, idempotent=True, needs_campaign=True)

    def _r_consume(self, campaign, dim, amount) -> _Req:
        return _Req("POST", "/v1/campaigns/{campaign}/consume", consumption_from, campaign,
                    {"dim": dim, "amount": float(amount)}, needs_campaign=True)

    def _r_consume_many(self, items, campaign) -> _Req:
        body = {"items": [{"dim": d, "amount": float(a)} for d, a in items]}
        return _Req("POST", "/v1/campaigns/{campaign}/consume/batch",
                    lambda d: [consumption_from(x) for x in d["results"]], campaign, body,
                    needs_campaign=True)

    def _r_events(self, after, timeout, limit, campaign) -> _Req:
        def parse(d: dict) -> EventPage:
            return EventPage([event_from(e) for e in d["events"]], d["next"],
                             [e["seq"] for e in d["events"]])
        return _Req("GET", "/v1/campaigns/{campaign}/events", parse, campaign,
                    params={"after": int(after), "timeout": float(timeout), "limit": int(limit)},
                    idempotent=True, timeout=self.timeout + float(timeout),
                    needs_campaign=True, operator_path="/v1/events")

    # -- server-sent events: the request and its retry policy (the clients iterate) -------
    _SSE_CHUNK = 300.0         # seconds a stream is asked to last before a reconnect

    def _stream_args(self, campaign: str, cursor: int, left: float | None
                     ) -> tuple[str, dict, dict, Any]:
        secs = self._SSE_CHUNK if left is None else min(self._SSE_CHUNK, max(left, 1e-3))
        url = f"{self.base_url}/v1/campaigns/{_q(campaign)}/events/stream"
        headers = {**self._headers, "Accept": "text/event-stream",
                   "Last-Event-ID": str(int(cursor))}
        # the server writes at least every 15 s (a keep-alive comment)
        timeout = httpx.Timeout(self.timeout, read=self.timeout + 15.0)
        return url, {"after": int(cursor), "max_seconds": secs}, headers, timeout

    def _stream_error(self, campaign: str, r: Any) -> None:
        """Raise what a non-2xx answer to the stream means (as for any call)."""
        self._result(_Req("GET", "/v1/campaigns/{campaign}/events/stream", lambda d: d,
                          campaign), r)

    def _stream_retry(self, attempt: int, exc: BaseException) -> float:
        """The wait before reconnecting after ``exc``; raises once retries are spent."""
        if attempt >= self.retries:
            if isinstance(exc, httpx.TimeoutException):
                raise ServiceTimeout("GET events/stream: no answer in time") from None
            raise Unavailable(f"GET events/stream: {type(exc).__name__}") from None
        self.retried += 1
        return self._delay(attempt)

    def _r_journal(self, campaign, after, limit, filters) -> _Req:
        params = {"after": int(after), "limit": int(limit)}
        params.update({k: v for k, v in filters.items() if v is not None})
        return _Req("GET", "/v1/campaigns/{campaign}/journal",
                    lambda d: (d["records"], d["next"]), campaign, params=params,
                    idempotent=True, needs_campaign=True)

    def _r_explain(self, seq, campaign) -> _Req:
        return _Req("GET", f"/v1/campaigns/{{campaign}}/journal/{int(seq)}",
                    lambda d: d["explain"], campaign, idempotent=True, needs_campaign=True)

    def _r_state(self) -> _Req:
        return _Req("GET", "/v1/state", lambda d: d, idempotent=True)

    def _r_register(self, name: str, envelope: Envelope) -> _Req:
        return _Req("POST", "/v1/campaigns", lambda d: (d["index"], d["token"]),
                    json={"name": name, "envelope": _envelope_body(envelope)})

    def _r_mint(self, campaign: str) -> _Req:
        return _Req("POST", "/v1/campaigns/{campaign}/tokens", lambda d: d["token"], campaign,
                    needs_campaign=True)

    def _r_add_nodes(self, dim, nodes) -> _Req:
        return _Req("POST", f"/v1/pool/{_q(dim)}/nodes", lambda d: d["slots"],
                    json={"nodes": [{"name": n, "slots": int(k)} for n, k in nodes]})

    def _r_remove_nodes(self, dim, nodes, grace) -> _Req:
        return _Req("POST", f"/v1/pool/{_q(dim)}/nodes/remove", lambda d: d["revoked"],
                    json={"nodes": list(nodes), "grace": float(grace)})


class BursarClient(_Base):
    """Synchronous client. ``BursarClient(base_url, token, campaign=None, timeout=10,
    retries=4, backoff=0.2, max_wait=30, transport=None)``; use as a context manager or
    call :meth:`close`. Thread-safe as far as httpx's ``Client`` is (one connection pool)."""

    def __init__(self, base_url: str, token: str, *, transport: Any = None,
                 verify: Any = True, **kw: Any) -> None:
        super().__init__(base_url, token, **kw)
        self._http = httpx.Client(timeout=self.timeout, transport=transport, verify=verify,
                                  limits=httpx.Limits(max_keepalive_connections=16))

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "BursarClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def campaign(self) -> str | None:
        """The token's campaign (None for an operator token), asked once."""
        if self._campaign is None:
            self._campaign = self.whoami().get("campaign")
        return self._campaign

    def _do(self, req: _Req) -> Any:
        campaign = req.campaign
        if req.needs_campaign and campaign is None:
            campaign = self.campaign
            if campaign is None and req.operator_path is None:
                raise InvalidArgument("campaign", "an operator token must name the campaign")
        req.campaign = campaign
        if campaign is None and req.operator_path is not None:
            url = self.base_url + req.operator_path
        else:
            url = self._url(req, campaign)
        deadline = time.monotonic() + self.max_wait + (req.timeout or self.timeout) * (self.retries + 1)
        attempt = 0
        while True:
            self.requests += 1
            try:
                r = self._http.request(req.method, url, json=req.json, params=req.params,
                                       headers=self._headers, timeout=req.timeout or self.timeout)
            except httpx.HTTPError as e:
                if attempt < self.retries and self._should_retry(req, exc=e) \
                        and time.monotonic() < deadline:
                    time.sleep(self._delay(attempt))
                    attempt += 1
                    self.retried += 1
                    continue
                if isinstance(e, httpx.TimeoutException):
                    raise ServiceTimeout(f"{req.method} {req.path}: no answer in time") from None
                raise Unavailable(f"{req.method} {req.path}: {type(e).__name__}") from None
            self._note_time(r)
            if r.status_code >= 400 and attempt < self.retries and self._should_retry(req, r) \
                    and time.monotonic() + self._delay(attempt, r) < deadline:
                time.sleep(self._delay(attempt, r))
                attempt += 1
                self.retried += 1
                continue
            return self._result(req, r)

    def _all(self, page: Callable[[int], _Req]) -> list:
        """Every item of a paginated list, page after page."""
        out: list = []
        after: int | None = -1
        while after is not None:
            items, after = self._do(page(after))
            out.extend(items)
        return out

    # -- the broker's API ----------------------------------------------------------
    def whoami(self) -> dict:
        return self._do(self._r_whoami())

    def health(self) -> dict:
        return self._do(self._r_health())

    def supply(self, campaign: str | None = None) -> Supply:
        return self._do(self._r_supply(campaign))

    def quote(self, campaign: str | None, sizes: Sequence[int], durations: Sequence[float], *,
              dim: str | None = None, service_class: str | None = None) -> Quote:
        return self._do(self._r_quote(campaign, sizes, durations, dim, service_class))

    def acquire(self, intent: Intent) -> Decision:
        return self._do(self._r_acquire(intent))

    def acquire_batch(self, intents: Iterable[Intent]) -> list[Decision]:
        """Many intents of one campaign in one request (up to 1000)."""
        return self._do(self._r_acquire_batch(list(intents)))

    def pending(self, campaign: str | None = None) -> list[dict]:
        return self._all(lambda after: self._r_pending(campaign, after))

    def ticket(self, intent_id: int, campaign: str | None = None) -> Ticket:
        return self._do(self._r_ticket(intent_id, campaign))

    def cancel(self, intent_id: int, campaign: str | None = None) -> bool:
        return self._do(self._r_cancel(intent_id, campaign))

    def leases(self, campaign: str | None = None) -> list[Lease]:
        return self._all(lambda after: self._r_leases(campaign, after))

    def lease(self, lease_id: int, campaign: str | None = None) -> Lease:
        return self._do(self._r_lease(lease_id, campaign))

    def renew(self, lease_id: int, duration: float, max_spend: float | None = None, *,
              campaign: str | None = None) -> Decision:
        return self._do(self._r_renew(lease_id, duration, max_spend, campaign))

    def release(self, lease_id: int, campaign: str | None = None) -> Decision:
        return self._do(self._r_release(lease_id, campaign))

    def consume(self, campaign: str | None, dim: str, amount: float) -> Consumption:
        return self._do(self._r_consume(campaign, dim, amount))

    def consume_many(self, items: Iterable[tuple[str, float]],
                     campaign: str | None = None) -> list[Consumption]:
        """Many ``(dim, amount)`` consumptions in one request (up to 1000)."""
        return self._do(self._r_consume_many(list(items), campaign))

    def events(self, after: int = -1, timeout: float = 0.0, limit: int = 100,
               campaign: str | None = None) -> EventPage:
        """Events after the cursor ``after``, long-polling up to ``timeout`` s for the
        first; at most ``limit``. An operator token without ``campaign``: every
        campaign's."""
        return self._do(self._r_events(after, timeout, limit, campaign))

    def poll(self, timeout: float = 0.0, limit: int = 100) -> list[Event]:
        """Like :meth:`Broker.poll`: every event since the last poll (the client keeps the
        cursor), of the token's campaign (an operator token: of every campaign), fetched
        ``limit`` a request; waits up to ``timeout`` s for the first. If a request fails
        the cursor stays, so the next poll returns those events again."""
        out: list[Event] = []
        page = self.events(self._cursor, timeout, limit)
        while True:
            out.extend(page.events)
            if len(page.events) < limit:
                self._cursor = page.next
                return out
            page = self.events(page.next, 0.0, limit)

    def stream(self, after: int = -1, max_seconds: float | None = None,
               campaign: str | None = None) -> Iterator[tuple[int, Event]]:
        """Server-sent events (``/events/stream``): yields ``(seq, event)`` as each event
        becomes durable, from the cursor ``after`` on. The server ends a stream after a
        while and a connection may drop: the iterator reconnects from the last seq
        (``Last-Event-ID``; after errors with backoff, up to ``retries`` in a row) until
        ``max_seconds`` have passed (None: for ever; break out of the loop to stop). Pass
        the last seq as ``after`` to resume later."""
        camp = campaign if campaign is not None else self.campaign
        if camp is None:
            raise InvalidArgument("campaign", "an operator token must name the campaign")
        end = None if max_seconds is None else time.monotonic() + float(max_seconds)
        cursor, attempt = int(after), 0
        while True:
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0:
                return
            url, params, headers, timeout = self._stream_args(camp, cursor, left)
            self.requests += 1
            try:
                with self._http.stream("GET", url, params=params, headers=headers,
                                       timeout=timeout) as r:
                    self._note_time(r)
                    if r.status_code >= 400:
                        r.read()
                        if (r.status_code == 429 or r.status_code >= 502) \
                                and attempt < self.retries:
                            time.sleep(self._delay(attempt, r))
                            attempt += 1
                            self.retried += 1
                            continue
                        self._stream_error(camp, r)
                    sse = _SSE()
                    for line in r.iter_lines():
                        got = sse.feed(line)
                        if got is not None:
                            attempt = 0
                            cursor = got[0]
                            yield got
            except httpx.HTTPError as e:
                time.sleep(self._stream_retry(attempt, e))
                attempt += 1

    def journal(self, after: int = -1, limit: int = 100, campaign: str | None = None,
                **filters: Any) -> tuple[list[dict], int]:
        """Journal records (op=, outcome=, reason=, t0=, t1= filters) and the next cursor."""
        return self._do(self._r_journal(campaign, after, limit, filters))

    def explain(self, record: int, campaign: str | None = None) -> str:
        return self._do(self._r_explain(record, campaign))

    # operator
    def state(self) -> dict:
        return self._do(self._r_state())

    def register(self, name: str, envelope: Envelope) -> tuple[int, str]:
        """Register a campaign (operator): its index and its first token."""
        return self._do(self._r_register(name, envelope))

    def mint_token(self, campaign: str) -> str:
        return self._do(self._r_mint(campaign))

    def add_nodes(self, dim: str, nodes: Sequence[tuple[str, int]]) -> list[int]:
        return self._do(self._r_add_nodes(dim, nodes))

    def remove_nodes(self, dim: str, nodes: Sequence[str], grace: float = 0.0) -> list[int]:
        return self._do(self._r_remove_nodes(dim, nodes, grace))


class AsyncBursarClient(_Base):
    """The same API as :class:`BursarClient`, every call a coroutine."""

    def __init__(self, base_url: str, token: str, *, transport: Any = None,
                 verify: Any = True, **kw: Any) -> None:
        super().__init__(base_url, token, **kw)
        self._http = httpx.AsyncClient(timeout=self.timeout, transport=transport, verify=verify,
                                       limits=httpx.Limits(max_keepalive_connections=16))

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> "AsyncBursarClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def campaign(self) -> str | None:
        if self._campaign is None:
            self._campaign = (await self.whoami()).get("campaign")
        return self._campaign

    async def _all(self, page: Callable[[int], _Req]) -> list:
        """Every item of a paginated list, page after page."""
        out: list = []
        after: int | None = -1
        while after is not None:
            items, after = await self._do(page(after))
            out.extend(items)
        return out

    async def _do(self, req: _Req) -> Any:
        campaign = req.campaign
        if req.needs_campaign and campaign is None:
            campaign = await self.campaign()
            if campaign is None and req.operator_path is None:
                raise InvalidArgument("campaign", "an operator token must name the campaign")
        req.campaign = campaign
        if campaign is None and req.operator_path is not None:
            url = self.base_url + req.operator_path
        else:
            url = self._url(req, campaign)
        deadline = time.monotonic() + self.max_wait + (req.timeout or self.timeout) * (self.retries + 1)
        attempt = 0
        while True:
            self.requests += 1
            try:
                r = await self._http.request(req.method, url, json=req.json, params=req.params,
                                             headers=self._headers,
                                             timeout=req.timeout or self.timeout)
            except httpx.HTTPError as e:
                if attempt < self.retries and self._should_retry(req, exc=e) \
                        and time.monotonic() < deadline:
                    await asyncio.sleep(self._delay(attempt))
                    attempt += 1
                    self.retried += 1
                    continue
                if isinstance(e, httpx.TimeoutException):
                    raise ServiceTimeout(f"{req.method} {req.path}: no answer in time") from None
                raise Unavailable(f"{req.method} {req.path}: {type(e).__name__}") from None
            self._note_time(r)
            if r.status_code >= 400 and attempt < self.retries and self._should_retry(req, r) \
                    and time.monotonic() + self._delay(attempt, r) < deadline:
                await asyncio.sleep(self._delay(attempt, r))
                attempt += 1
                self.retried += 1
                continue
            return self._result(req, r)

    async def whoami(self) -> dict:
        return await self._do(self._r_whoami())

    async def health(self) -> dict:
        return await self._do(self._r_health())

    async def supply(self, campaign: str | None = None) -> Supply:
        return await self._do(self._r_supply(campaign))

    async def quote(self, campaign: str | None, sizes: Sequence[int],
                    durations: Sequence[float], *, dim: str | None = None,
                    service_class: str | None = None) -> Quote:
        return await self._do(self._r_quote(campaign, sizes, durations, dim, service_class))

    async def acquire(self, intent: Intent) -> Decision:
        return await self._do(self._r_acquire(intent))

    async def acquire_batch(self, intents: Iterable[Intent]) -> list[Decision]:
        return await self._do(self._r_acquire_batch(list(intents)))

    async def pending(self, campaign: str | None = None) -> list[dict]:
        return await self._all(lambda after: self._r_pending(campaign, after))

    async def ticket(self, intent_id: int, campaign: str | None = None) -> Ticket:
        return await self._do(self._r_ticket(intent_id, campaign))

    async def cancel(self, intent_id: int, campaign: str | None = None) -> bool:
        return await self._do(self._r_cancel(intent_id, campaign))

    async def leases(self, campaign: str | None = None) -> list[Lease]:
        return await self._all(lambda after: self._r_leases(campaign, after))

    async def lease(self, lease_id: int, campaign: str | None = None) -> Lease:
        return await self._do(self._r_lease(lease_id, campaign))

    async def renew(self, lease_id: int, duration: float, max_spend: float | None = None, *,
                    campaign: str | None = None) -> Decision:
        return await self._do(self._r_renew(lease_id, duration, max_spend, campaign))

    async def release(self, lease_id: int, campaign: str | None = None) -> Decision:
        return await self._do(self._r_release(lease_id, campaign))

    async def consume(self, campaign: str | None, dim: str, amount: float) -> Consumption:
        return await self._do(self._r_consume(campaign, dim, amount))

    async def consume_many(self, items: Iterable[tuple[str, float]],
                           campaign: str | None = None) -> list[Consumption]:
        return await self._do(self._r_consume_many(list(items), campaign))

    async def events(self, after: int = -1, timeout: float = 0.0, limit: int = 100,
                     campaign: str | None = None) -> EventPage:
        return await self._do(self._r_events(after, timeout, limit, campaign))

    async def poll(self, timeout: float = 0.0, limit: int = 100) -> list[Event]:
        out: list[Event] = []
        page = await self.events(self._cursor, timeout, limit)
        while True:
            out.extend(page.events)
            if len(page.events) < limit:
                self._cursor = page.next
                return out
            page = await self.events(page.next, 0.0, limit)

    async def stream(self, after: int = -1, max_seconds: float | None = None,
                     campaign: str | None = None) -> AsyncIterator[tuple[int, Event]]:
        """:meth:`BursarClient.stream` as an async iterator (``async for``)."""
        camp = campaign if campaign is not None else await self.campaign()
        if camp is None:
            raise InvalidArgument("campaign", "an operator token must name the campaign")
        end = None if max_seconds is None else time.monotonic() + float(max_seconds)
        cursor, attempt = int(after), 0
        while True:
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0:
                return
            url, params, headers, timeout = self._stream_args(camp, cursor, left)
            self.requests += 1
            try:
                async with self._http.stream("GET", url, params=params, headers=headers,
                                             timeout=timeout) as r:
                    self._note_time(r)
                    if r.status_code >= 400:
                        await r.aread()
                        if (r.status_code == 429 or r.status_code >= 502) \
                                and attempt < self.retries:
                            await asyncio.sleep(self._delay(attempt, r))
                            attempt += 1
                            self.retried += 1
                            continue
                        self._stream_error(camp, r)
                    sse = _SSE()
                    async for line in r.aiter_lines():
                        got = sse.feed(line)
                        if got is not None:
                            attempt = 0
                            cursor = got[0]
                            yield got
            except httpx.HTTPError as e:
                await asyncio.sleep(self._stream_retry(attempt, e))
                attempt += 1

    async def journal(self, after: int = -1, limit: int = 100, campaign: str | None = None,
                      **filters: Any) -> tuple[list[dict], int]:
        return await self._do(self._r_journal(campaign, after, limit, filters))

    async def explain(self, record: int, campaign: str | None = None) -> str:
        return await self._do(self._r_explain(record, campaign))

    async def state(self) -> dict:
        return await self._do(self._r_state())

    async def register(self, name: str, envelope: Envelope) -> tuple[int, str]:
        return await self._do(self._r_register(name, envelope))

    async def mint_token(self, campaign: str) -> str:
        return await self._do(self._r_mint(campaign))

    async def add_nodes(self, dim: str, nodes: Sequence[tuple[str, int]]) -> list[int]:
        return await self._do(self._r_add_nodes(dim, nodes))

    async def remove_nodes(self, dim: str, nodes: Sequence[str], grace: float = 0.0) -> list[int]:
        return await self._do(self._r_remove_nodes(dim, nodes, grace))
