"""What both clients share: the errors, the decoding of answers into the broker's
types, request building and the retry policy."""

from __future__ import annotations

import json
import math
import random
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np

from ..admission import Envelope, Intent
from ..broker import Consumption, Decision, DimSupply, Event, Lease, Quote, Supply
from ..errors import BursarError, InvalidArgument, UnknownCampaign, UnknownLease

__all__ = ["ServiceError", "Unauthorized", "Forbidden", "RateLimited", "Unavailable",
           "ServiceTimeout", "EventPage", "Ticket", "httpx"]

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
    d = env.to_json()
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
    parse: Callable[..., Any]
    campaign: str | None = None
    json: Any = None
    params: dict | None = None
    idempotent: bool = False
    timeout: float | None = None
    needs_campaign: bool = field(default=False)
    operator_path: str | None = None  # with no campaign and an operator token: this path
    content: bytes | None = None    # a body already encoded (the columnar batches) ...
    content_type: str | None = None  # ... of this media type; parse then takes
    #                                   (body bytes, the answer's media type)

    def headers(self, base: dict[str, str]) -> dict[str, str]:
        if self.content_type is None:
            return base
        return {**base, "Content-Type": self.content_type, "Accept": self.content_type}


def _needs_table(campaign_idx: Any, campaigns: Any) -> bool:
    """Whether a columnar batch's ``campaign_idx`` are positions with no name table given
    (the client then asks for the campaign list)."""
    if campaigns is not None or isinstance(campaign_idx, str):
        return False
    return np.asarray(campaign_idx).dtype.kind not in "USO"


PAGE = 1000
"""Items per page when a client method reads a whole paginated list."""


def _q(s: str) -> str:
    return urllib.parse.quote(str(s), safe="")


def _node(campaign: str) -> str:
    """A campaign's node path for a URL: each segment quoted, the '/' between them kept
    (the service reads ``%2F`` as ``/`` as well)."""
    return urllib.parse.quote(str(campaign), safe="/")


def child_name(parent: str | None, child: str) -> str:
    """The node path of ``child`` below ``parent``: ``"astro" + "survey"`` is
    ``"astro/survey"``; ``child`` may itself be a path below ``parent``."""
    if not isinstance(child, str) or not child or child.startswith("/") \
            or child.endswith("/"):
        raise InvalidArgument("child", "must be a node name or path below the parent "
                              "(no leading or trailing '/')", child)
    if not parent:
        raise InvalidArgument("parent", "an operator token must name the parent node", parent)
    return f"{parent}/{child}"


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
        path = req.path.replace("{campaign}", _node(campaign)) if campaign is not None \
            else req.path
        return self.base_url + path

    def _result(self, req: _Req, r: Any) -> Any:
        code = r.status_code
        if code < 300:
            if req.content_type is not None:
                return req.parse(r.content, r.headers.get("content-type"))
            return req.parse(r.json() if r.content else None)
        try:
            body = r.json()
            detail = body.get("detail") if isinstance(body, dict) else body
        except ValueError:
            detail = r.text[:200]
        if code == 422:
            item = detail[0] if isinstance(detail, list) and detail else {}
            loc = [str(x) for x in item.get("loc", []) if x not in ("body", "query", "path")]
            if req.content_type is not None and len(loc) == 2 and loc[1].isdigit():
                loc = [f"{loc[0]}[{loc[1]}]"]     # a column and its row
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

    def _r_campaigns(self) -> _Req:
        return _Req("GET", "/v1/campaigns", lambda d: list(d["campaigns"]), idempotent=True)

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
        url = f"{self.base_url}/v1/campaigns/{_node(campaign)}/events/stream"
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

    def _r_mint(self, campaign: str | None) -> _Req:
        return _Req("POST", "/v1/campaigns/{campaign}/tokens", lambda d: d["token"], campaign,
                    needs_campaign=True)

    def _r_tokens(self, campaign: str | None) -> _Req:
        return _Req("GET", "/v1/campaigns/{campaign}/tokens", lambda d: list(d["tokens"]),
                    campaign, idempotent=True, needs_campaign=True)

    def _r_revoke(self, token_id: str, campaign: str | None) -> _Req:
        if not isinstance(token_id, str) or not token_id:
            raise InvalidArgument("token_id", "must be a token id (a non-empty string)",
                                  token_id)
        return _Req("DELETE", f"/v1/campaigns/{{campaign}}/tokens/{_q(token_id)}",
                    lambda d: bool(d["revoked"]), campaign, idempotent=True,
                    needs_campaign=True)

    def _r_change(self, campaign: str, envelope: Envelope) -> _Req:
        if not isinstance(campaign, str) or not campaign:
            raise InvalidArgument("campaign", "must be a node path", campaign)
        return _Req("PATCH", "/v1/campaigns/{campaign}", lambda d: None, campaign,
                    json=_envelope_body(envelope), needs_campaign=True)

    def _r_remove(self, campaign: str) -> _Req:
        if not isinstance(campaign, str) or not campaign:
            raise InvalidArgument("campaign", "must be a node path", campaign)
        return _Req("DELETE", "/v1/campaigns/{campaign}", lambda d: None, campaign,
                    needs_campaign=True)

    def _r_add_nodes(self, dim, nodes) -> _Req:
        return _Req("POST", f"/v1/pool/{_q(dim)}/nodes", lambda d: d["slots"],
                    json={"nodes": [{"name": n, "slots": int(k)} for n, k in nodes]})

    def _r_remove_nodes(self, dim, nodes, grace) -> _Req:
        return _Req("POST", f"/v1/pool/{_q(dim)}/nodes/remove", lambda d: d["revoked"],
                    json={"nodes": list(nodes), "grace": float(grace)})

