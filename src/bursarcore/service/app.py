"""The HTTP API (FastAPI): ``create_app(service, tokens)``.

Access rule, one for the whole API (:meth:`Principal.may_act_for`): a campaign names a
node of the tree of envelopes (``astro``, ``astro/survey``; :mod:`.nodes`), and a campaign
token reads and acts on its node's subtree only — its node and every node below it, never
a node above or beside it. Anything of another campaign — its supply, intents, leases,
tokens, events, journal records — answers **404 with the same body as something that does
not exist**, so a token learns nothing about other campaigns, not even whether they exist.
Within its subtree a token may register nodes strictly below its own (``POST
/v1/campaigns``), and mint, list and revoke tokens. Operator-only endpoints (the
whole-broker state, registering a node outside one's subtree, pool changes, the unfiltered
journal) answer **403** to a campaign token: that reveals a role, not a resource. No or a
wrong token answers 401. A lease is reached only through its own node's URL.

Status codes: an intent answers 201 (granted; ``Location`` of the lease), 202 (pending,
``Location`` of the ticket) or 200 (refused: a decision, not an error; ``Retry-After``
when the broker knows when to retry). 422 names the field; 413 a body over the limit;
429 the per-token rate limit (``Retry-After``); 500 an operation that failed inside the
broker (that request only: nothing was journaled, the service goes on); 503 a journal that
cannot be written (the service stops acknowledging until restarted) or a commit slower than
``commit_timeout``.
"""

import asyncio
import contextlib
import json
import logging
import math
import re
from typing import Annotated, Any, AsyncIterator, Callable

from fastapi import Depends, FastAPI, Header, HTTPException, Path, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException as StarletteHTTPException

from .. import __version__
from ..admission import Intent
from ..errors import InvalidArgument, UnknownCampaign, UnknownLease
from ..journal import records as J
from . import batch, stream
from . import models as M
from .auth import CAMPAIGN, OPERATOR, Principal, TokenStore, in_subtree
from .core import (BrokerService, OperationFailed, ServiceUnavailable, envelope_from_json,
                   json_safe)
from .asgi import BursarAPI, Limits
from .fastpath import DirectIntents
from .metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from .metrics import RouteTimer, ServiceMetrics
from .nodes import MAX_PATH, reserved_segment, route_words
from .ratelimit import RateLimiter, RequestLimits, retry_after_header

__all__ = ["create_app", "ServiceSettings"]

log = logging.getLogger("bursarcore.service")


class ServiceSettings:
    """Limits: ``rate``/``burst`` requests per token (0 disables), ``tenant_rate`` /
    ``tenant_burst`` per tenant (a top-level node and the subtree under it, whatever its
    tokens: :class:`~bursarcore.service.ratelimit.RequestLimits`), ``auth_fail_rate`` failed
    authentications per second per client address, ``max_body`` bytes per request body,
    ``batch_unit`` batch items per extra request of rate cost, ``max_batch_items`` items
    and ``max_batch_body`` bytes per columnar batch (``/v1/batch/...``), ``commit_timeout`` the
    longest wait for a journal commit before a request answers 503; ``metrics_campaigns``
    campaigns shown by name in ``/metrics`` (the rest summed as ``other``) and
    ``metrics_require_token`` whether ``/metrics`` needs the operator token;
    ``stream_window`` messages at most in flight (read, not yet answered) on one decision
    stream connection and ``stream_frame`` messages at most in one of its frames (a frame
    is at most ``max_body`` bytes); ``direct`` whether a plain single intent is answered
    on the direct path (:mod:`~bursarcore.service.fastpath`; False: every request goes
    through FastAPI's routing, which answers the same)."""

    def __init__(self, *, rate: float = 100.0, burst: float = 200.0,
                 tenant_rate: float = 1000.0, tenant_burst: float = 2000.0,
                 auth_fail_rate: float = 10.0, auth_fail_burst: float = 20.0,
                 max_body: int = 1 << 20, batch_unit: int = 100,
                 max_batch_items: int = 100_000, max_batch_body: int = 64 << 20,
                 max_longpoll: float = 60.0, commit_timeout: float | None = 30.0,
                 metrics_campaigns: int = 20, metrics_require_token: bool = True,
                 stream_window: int = 4096, stream_frame: int = 1000,
                 direct: bool = True) -> None:
        self.rate, self.burst = rate, burst
        self.tenant_rate, self.tenant_burst = tenant_rate, tenant_burst
        self.auth_fail_rate, self.auth_fail_burst = auth_fail_rate, auth_fail_burst
        self.max_body = int(max_body)
        self.batch_unit = max(1, int(batch_unit))
        self.max_batch_items = max(1, int(max_batch_items))
        self.max_batch_body = int(max_batch_body)
        self.max_longpoll = float(max_longpoll)
        self.commit_timeout = None if commit_timeout is None else float(commit_timeout)
        self.metrics_campaigns = int(metrics_campaigns)
        self.metrics_require_token = bool(metrics_require_token)
        self.stream_window = max(1, int(stream_window))
        self.stream_frame = max(1, min(int(stream_frame), self.stream_window))
        self.direct = bool(direct)


# ---------------------------------------------------------------------------- the app
# typed as FastAPI's ``responses=`` parameter takes them
_Responses = dict[int | str, dict[str, Any]]
_ERR: dict[str, Any] = {"model": M.ErrorOut}
_COMMON: _Responses = {401: {**_ERR, "description": "missing or invalid bearer token"},
           422: {**_ERR, "description": "invalid input; `loc` names the field"},
           429: {**_ERR, "description": "rate limited; see Retry-After"},
           500: {**_ERR, "description": "the operation failed inside the broker; nothing "
                                        "was journaled"},
           503: {**_ERR, "description": "the journal cannot be written"}}
_SCOPED: _Responses = {**_COMMON,
                       404: {**_ERR, "description": "not found (or not yours: the same answer)"}}
_OPERATOR: _Responses = {**_COMMON, 403: {**_ERR, "description": "operator token required"}}
_RETRY_HDR = {"Retry-After": {"description": "seconds", "schema": {"type": "string"}}}
_LOC_HDR = {"Location": {"description": "the lease or the ticket", "schema": {"type": "string"}}}


DEFAULT_PAGE = 100


def _paginate(items: list, key: Callable[[Any], int], after: int,
              limit: int) -> tuple[list, int | None]:
    """The ``limit`` items with the smallest keys above ``after``, and the cursor of the
    next page (the last key shown) or None when nothing follows."""
    rest = sorted((x for x in items if key(x) > after), key=key)
    page = rest[:limit]
    return page, (key(page[-1]) if len(rest) > limit else None)


def _where(request: Request, field: str) -> str:
    """Where a field the broker refused came from: ``path``, ``query`` or ``body``."""
    head = re.split(r"[.\[]", field, maxsplit=1)[0]
    if head in request.path_params:
        return "path"
    if head in request.query_params:
        return "query"
    return "body"


def _not_found(what: str) -> HTTPException:
    return HTTPException(404, f"{what} not found")


def create_app(service: BrokerService, tokens: TokenStore,
               settings: ServiceSettings | None = None, *, lifespan: bool = True) -> FastAPI:
    """The FastAPI application over ``service``. With ``lifespan`` the app starts and
    stops the service (committer, ticker) with the server."""
    st = settings or ServiceSettings()
    limiter = RequestLimits(st.rate, st.burst, st.tenant_rate, st.tenant_burst)
    fail_limiter = RateLimiter(st.auth_fail_rate, st.auth_fail_burst)
    broker = service.broker
    service.expected_errors = (*BrokerService.expected_errors, StarletteHTTPException,
                               RequestValidationError)
    service.commit_timeout = st.commit_timeout

    @contextlib.asynccontextmanager
    async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
        if lifespan:
            await service.start()
        try:
            yield
        finally:
            if lifespan:
                await service.stop()

    app = BursarAPI(
        title="bursar", version=__version__, lifespan=_lifespan,
        description="An agent resource broker: campaign envelopes, short-lived leases, "
                    "supply signals, an auditable journal (SPEC §8, §9, §12). "
                    "Authenticate with `Authorization: Bearer <token>`.")
    app.state.service = service
    app.state.tokens = tokens
    app.state.limiter = limiter
    app.add_middleware(Limits, max_body=st.max_body, clock=broker.clock.now,
                       batch_body=st.max_batch_body)
    metrics = ServiceMetrics(service, campaigns=st.metrics_campaigns)
    app.state.metrics = metrics
    app.add_middleware(RouteTimer, observe=metrics.observe_request)   # outermost: times all
    bearer = HTTPBearer(auto_error=False, description="a campaign token or an operator token")

    # ------------------------------------------------------------------ errors
    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        items = [{"loc": [str(x) if not isinstance(x, int) else x for x in e.get("loc", ())],
                  "msg": str(e.get("msg", "invalid")), "type": str(e.get("type", "value_error"))}
                 for e in exc.errors()]
        return JSONResponse({"detail": items}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400:   # a body that is not JSON (or not UTF-8): the body is bad
            return JSONResponse({"detail": [{"loc": ["body"], "msg": str(exc.detail),
                                             "type": "json_invalid"}]}, status_code=422)
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))

    @app.exception_handler(UnknownCampaign)
    async def _unknown_campaign(request: Request, exc: UnknownCampaign) -> JSONResponse:
        return JSONResponse({"detail": "campaign not found"}, status_code=404)

    @app.exception_handler(UnknownLease)
    async def _unknown_lease(request: Request, exc: UnknownLease) -> JSONResponse:
        what = "intent" if "intent" in exc.field else "lease"
        return JSONResponse({"detail": f"{what} not found"}, status_code=404)

    @app.exception_handler(InvalidArgument)
    async def _invalid(request: Request, exc: InvalidArgument) -> JSONResponse:
        return JSONResponse({"detail": [{"loc": [_where(request, exc.field), exc.field],
                                         "msg": exc.rule, "type": "invalid_argument"}]},
                            status_code=422)

    @app.exception_handler(ServiceUnavailable)
    async def _unavailable(request: Request, exc: ServiceUnavailable) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=503, headers={"Retry-After": "5"})

    @app.exception_handler(OperationFailed)
    async def _operation_failed(request: Request, exc: OperationFailed) -> JSONResponse:
        # logged with its traceback where it was raised (BrokerService.call)
        return JSONResponse({"detail": str(exc)}, status_code=500)

    # ------------------------------------------------------------------ auth
    async def principal(request: Request,
                        cred: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
                        ) -> Principal:
        p = tokens.authenticate(cred.credentials) if cred is not None else None
        if p is None:
            host = request.client.host if request.client else "?"
            wait = fail_limiter.check(host)
            if wait:
                raise HTTPException(429, "too many failed authentications",
                                    headers={"Retry-After": retry_after_header(wait)})
            raise HTTPException(401, "missing or invalid bearer token",
                                headers={"WWW-Authenticate": "Bearer"})
        wait = limiter.check(p)
        if wait:
            raise HTTPException(429, "rate limit exceeded",
                                headers={"Retry-After": retry_after_header(wait)})
        return p

    Who = Annotated[Principal, Depends(principal)]

    def operator(p: Who) -> Principal:
        if not p.operator:
            raise HTTPException(403, "operator token required")
        return p

    Op = Annotated[Principal, Depends(operator)]
    IdAfter = Annotated[int, Query(ge=-1, le=1 << 62, description="an id (cursor): the "
                                   "page starts after it")]
    PageLimit = Annotated[int, Query(ge=1, le=M.MAX_PAGE, description="items per page")]
    Camp = Annotated[str, Path(min_length=1, max_length=MAX_PATH,
                               description="a campaign: a node path (`astro/survey`)")]
    TokenId = Annotated[str, Path(min_length=1, max_length=64)]
    # the words a node segment may not be: the routes' own, read once they all exist
    reserved: set[str] = set()
    LeaseId = Annotated[int, Path(ge=0, le=1 << 62)]
    Seq = Annotated[int, Path(ge=0, le=1 << 62)]

    def scope(p: Principal, campaign: str) -> str:
        """The access rule: someone else's campaign looks exactly like a missing one."""
        if not p.may_act_for(campaign) or campaign not in broker.envelopes:
            raise _not_found("campaign")
        return campaign

    def charge(p: Principal, n: int) -> None:
        extra = n // st.batch_unit
        if extra:
            wait = limiter.check(p, extra)
            if wait:
                raise HTTPException(429, "rate limit exceeded",
                                    headers={"Retry-After": retry_after_header(wait)})

    def own_lease(campaign: str, lease_id: int):
        lease = broker.lease(lease_id)          # UnknownLease -> 404
        if lease.campaign != campaign:
            raise _not_found("lease")
        return lease

    def intent_of(campaign: str, body: M.IntentIn, where: tuple = ("body",)) -> Intent:
        dim = body.dim if body.dim is not None else broker.dims[0]
        if dim not in broker.dims:
            raise RequestValidationError([{"loc": (*where, "dim"), "type": "invalid_argument",
                                           "msg": f"must be one of {broker.dims}"}])
        if body.service_class is not None and body.service_class not in {
                c.name for c in broker.classes}:
            raise RequestValidationError([{
                "loc": (*where, "service_class"), "type": "invalid_argument",
                "msg": f"must be one of {[c.name for c in broker.classes]}"}])
        lo = body.min if body.min is not None else body.max
        return Intent(campaign, units={dim: (lo, body.max)}, duration=body.duration,
                      deadline=body.deadline, max_spend=body.max_spend,
                      service_class=body.service_class, ttl=body.ttl)

    # ------------------------------------------------------------------ metrics
    async def scraper(request: Request,
                      cred: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
                      ) -> None:
        # campaign names and holdings are every campaign's: the operator's to see
        if st.metrics_require_token:
            operator(await principal(request, cred))

    @app.get("/metrics", include_in_schema=False, dependencies=[Depends(scraper)])
    async def prometheus() -> Response:
        """Prometheus text exposition (docs/operations.md, Metrics)."""
        return Response(await metrics.render(), media_type=METRICS_CONTENT_TYPE)

    # ------------------------------------------------------------------ open endpoints
    @app.get("/v1/health", response_model=M.HealthOut, tags=["service"])
    async def health() -> dict:
        """Liveness; no token needed."""
        return {"status": "failed" if service.failed is not None else "ok",
                "time": broker.clock.now(), "durable_seq": service.durable_seq,
                "commits": service.commits}

    @app.get("/v1/whoami", response_model=M.WhoAmI, responses=_COMMON, tags=["service"])
    async def whoami(p: Who) -> dict:
        return {"role": p.role, "campaign": p.campaign, "token_id": p.token_id}

    # ------------------------------------------------------------------ campaigns
    @app.get("/v1/campaigns", response_model=M.CampaignList, responses=_COMMON,
             tags=["campaigns"])
    async def campaigns(p: Who) -> dict:
        """Every campaign for an operator; a campaign token sees its node's subtree (its
        node and every node below it), in registration order."""
        if p.operator:
            return {"campaigns": broker.campaigns}
        return {"campaigns": [c for c in broker.campaigns if p.may_act_for(c)]}

    def _new_token(campaign: str) -> tuple[str, str]:
        token = tokens.mint(CAMPAIGN, campaign)
        return token, tokens.authenticate(token).token_id  # type: ignore[union-attr]

    @app.post("/v1/campaigns", response_model=M.CampaignCreated, status_code=201,
              responses={**_COMMON, 403: {**_ERR, "description": "a campaign token "
                                          "registers only below its own node"}},
              tags=["campaigns"])
    async def register(body: M.CampaignIn, p: Who) -> dict:
        """Register a campaign — a node of the tree of envelopes — and mint its first token
        (shown once, stored hashed). The operator registers any node; a campaign token
        registers nodes strictly below its own (delegation); anywhere else it is 403."""
        name = body.name
        if not p.operator and (name == p.campaign or not p.may_act_for(name)):
            raise HTTPException(403, "operator token required")
        word = reserved_segment(name, frozenset(reserved))
        if word is not None:
            raise RequestValidationError([{
                "loc": ("body", "name"), "type": "invalid_argument",
                "msg": f"the segment {word!r} is a word of the API's routes; a node's "
                       f"segments may not be any of {sorted(reserved)}"}])
        errors = body.envelope.dim_errors(broker.dims, list(broker.flow_dims))
        if errors:
            raise RequestValidationError(errors)
        env = envelope_from_json(body.envelope.model_dump(), "envelope")
        if name in broker.envelopes:
            raise RequestValidationError([{"loc": ("body", "name"), "type": "invalid_argument",
                                           "msg": "is already registered"}])
        index = await service.call(broker.register, name, env)
        token, tid = _new_token(name)
        return {"campaign": name, "index": index, "token": token, "token_id": tid}

    @app.post("/v1/campaigns/{campaign:path}/tokens", response_model=M.TokenOut,
              status_code=201, responses=_SCOPED, tags=["tokens"])
    async def mint(campaign: Camp, p: Who) -> dict:
        """A new token for the campaign (shown once, stored hashed): it acts for the
        campaign and every node below it. A campaign token mints for its own subtree."""
        scope(p, campaign)
        token, tid = _new_token(campaign)
        return {"campaign": campaign, "token": token, "token_id": tid}

    @app.get("/v1/campaigns/{campaign:path}/tokens", response_model=M.TokenList,
             responses=_SCOPED, tags=["tokens"])
    async def token_list(campaign: Camp, p: Who) -> dict:
        """The tokens of the campaign and of every node below it (ids, never secrets)."""
        scope(p, campaign)
        return {"tokens": [{"id": t["id"], "campaign": t["campaign"], "created": t["created"]}
                           for t in tokens.listing(subtree=campaign)]}

    @app.delete("/v1/campaigns/{campaign:path}/tokens/{token_id}",
                response_model=M.TokenRevoked, responses=_SCOPED, tags=["tokens"])
    async def token_revoke(campaign: Camp, token_id: TokenId, p: Who) -> dict:
        """Revoke a token of the campaign or of a node below it; it stops working now."""
        scope(p, campaign)
        owner = tokens.campaign_of(token_id)
        if owner is None or not in_subtree(owner, campaign) or not tokens.revoke(token_id):
            raise _not_found("token")
        return {"token_id": token_id, "campaign": owner, "revoked": True}

    # ------------------------------------------------------------------ supply, quote
    @app.get("/v1/campaigns/{campaign:path}/supply", response_model=M.SupplyOut, responses=_SCOPED,
             tags=["supply"])
    async def supply(campaign: Camp, p: Who) -> dict:
        """Free and reclaimable units, congestion and prices, tokens, credits, waits per
        grant path (SPEC §8)."""
        scope(p, campaign)
        return M.supply_out(await service.call(broker.supply, campaign))

    @app.post("/v1/campaigns/{campaign:path}/quote", response_model=M.QuoteOut, responses=_SCOPED,
              tags=["supply"])
    async def quote(campaign: Camp, body: M.QuoteIn, p: Who) -> dict:
        """Cost, path, wait and grantability for every (size, duration) pair."""
        scope(p, campaign)
        charge(p, len(body.sizes) * len(body.durations) // 10)
        q = await service.call(broker.quote, campaign, body.sizes, body.durations,
                               dim=body.dim, service_class=body.service_class)
        return M.quote_out(q)

    # ------------------------------------------------------------------ intents
    @app.post("/v1/campaigns/{campaign:path}/intents", response_model=M.DecisionOut,
              responses={**_SCOPED,
                         200: {"description": "refused (a decision, not an error)",
                               "headers": _RETRY_HDR},
                         201: {"model": M.DecisionOut, "description": "granted",
                               "headers": _LOC_HDR},
                         202: {"model": M.DecisionOut, "description": "pending: a ticket",
                               "headers": _LOC_HDR}},
              tags=["intents"])
    async def acquire(campaign: Camp, body: M.IntentIn, p: Who, response: Response) -> dict:
        """State an intent: granted now, pending with a ticket, or refused with a reason."""
        scope(p, campaign)
        intent = intent_of(campaign, body)
        d = await service.call(broker.acquire, intent)
        if d.outcome == "granted":
            response.status_code = 201
            response.headers["Location"] = f"/v1/campaigns/{campaign}/leases/{d.lease.id}"
        elif d.outcome == "pending":
            response.status_code = 202
            response.headers["Location"] = f"/v1/campaigns/{campaign}/intents/{d.intent_id}"
        if d.retry_after is not None and math.isfinite(d.retry_after):
            response.headers["Retry-After"] = retry_after_header(d.retry_after)
        return M.decision_out(d)

    @app.post("/v1/campaigns/{campaign:path}/intents/batch", response_model=M.DecisionBatchOut,
              responses=_SCOPED, tags=["intents"])
    async def acquire_batch(campaign: Camp, body: M.IntentBatchIn, p: Who) -> dict:
        """Many intents in one request, decided in order (each as a single intent would
        be) and acknowledged together. An item the broker rejects as invalid comes back
        refused with reason ``invalid``; the others stand."""
        scope(p, campaign)
        charge(p, len(body.intents))
        intents = [intent_of(campaign, it, ("body", "intents", i))
                   for i, it in enumerate(body.intents)]

        def run() -> list:
            out = []
            for it in intents:
                try:
                    out.append(M.decision_out(broker.acquire(it)))
                except InvalidArgument:
                    out.append({"outcome": "refused", "intent_id": -1, "campaign": campaign,
                                "units": 0, "lease": None, "path": None,
                                "reason": "invalid", "retry_after": None, "cost": 0.0,
                                "wait": 0.0, "seq": -1})
            return out

        return {"decisions": await service.call(run)}

    @app.get("/v1/campaigns/{campaign:path}/intents", response_model=M.PendingList,
             responses=_SCOPED, tags=["intents"])
    async def pending(campaign: Camp, p: Who, after: IdAfter = -1,
                      limit: PageLimit = DEFAULT_PAGE) -> dict:
        """The campaign's pending intents, by intent id: ``limit`` of them after the
        intent id ``after``; ``next`` is the cursor of the next page (null: the last)."""
        scope(p, campaign)
        items, nxt = _paginate(service.query(broker.pending, campaign),
                               lambda x: x["intent_id"], after, limit)
        return {"pending": items, "next": nxt}

    @app.get("/v1/campaigns/{campaign:path}/intents/{intent_id}", response_model=M.TicketOut,
             responses=_SCOPED, tags=["intents"])
    async def ticket(campaign: Camp, intent_id: LeaseId, p: Who) -> dict:
        """What became of an intent: pending, granted (with its lease), refused, cancelled."""
        scope(p, campaign)
        await service.call(broker.poll)
        t = service.ticket(campaign, intent_id)
        if t is None:
            raise _not_found("intent")
        if t["lease"] is not None:
            t["lease"] = M.lease_out(t["lease"])
        return t

    @app.delete("/v1/campaigns/{campaign:path}/intents/{intent_id}", response_model=M.CancelOut,
                responses=_SCOPED, tags=["intents"])
    async def cancel(campaign: Camp, intent_id: LeaseId, p: Who) -> dict:
        """Withdraw a pending intent (``cancelled: false`` if it is no longer pending)."""
        scope(p, campaign)

        def run() -> bool | None:
            if any(x["intent_id"] == intent_id for x in broker.pending(campaign)):
                return broker.cancel(intent_id)
            return None

        done = await service.call(run)
        if done is None:
            if service.ticket(campaign, intent_id) is None:
                raise _not_found("intent")
            done = False
        return {"intent_id": intent_id, "cancelled": bool(done)}

    # ------------------------------------------------------------------ leases
    @app.get("/v1/campaigns/{campaign:path}/leases", response_model=M.LeaseList, responses=_SCOPED,
             tags=["leases"])
    async def leases(campaign: Camp, p: Who, after: IdAfter = -1,
                     limit: PageLimit = DEFAULT_PAGE) -> dict:
        """Live leases (starting, active, revoking) and the broker time, by lease id:
        ``limit`` of them after the lease id ``after``; ``next`` is the cursor of the next
        page (null: the last)."""
        scope(p, campaign)

        def run() -> tuple:
            return broker.clock.now(), broker.leases(campaign)

        now, ls = await service.call(run)
        page, nxt = _paginate(ls, lambda l: l.id, after, limit)
        return {"time": now, "leases": [M.lease_out(l) for l in page], "next": nxt}

    @app.get("/v1/campaigns/{campaign:path}/leases/{lease_id}", response_model=M.LeaseOut,
             responses=_SCOPED, tags=["leases"])
    async def lease(campaign: Camp, lease_id: LeaseId, p: Who) -> dict:
        """One lease, live or ended."""
        scope(p, campaign)

        def run():
            broker.poll()
            return own_lease(campaign, lease_id)

        return M.lease_out(await service.call(run))

    @app.post("/v1/campaigns/{campaign:path}/leases/{lease_id}/renew",
              response_model=M.DecisionOut,
              responses={**_SCOPED, 200: {"description": "granted or refused",
                                          "headers": _RETRY_HDR}}, tags=["leases"])
    async def renew(campaign: Camp, lease_id: LeaseId, body: M.RenewIn, p: Who,
                    response: Response) -> dict:
        """Extend an active lease by ``duration`` seconds (tokens and credits re-checked,
        atomically); refused changes nothing."""
        scope(p, campaign)

        def run():
            own_lease(campaign, lease_id)
            return broker.renew(lease_id, body.duration, body.max_spend)

        d = await service.call(run)
        if d.retry_after is not None and math.isfinite(d.retry_after):
            response.headers["Retry-After"] = retry_after_header(d.retry_after)
        return M.decision_out(d)

    @app.post("/v1/campaigns/{campaign:path}/leases/{lease_id}/release",
              response_model=M.DecisionOut, responses=_SCOPED, tags=["leases"])
    async def release(campaign: Camp, lease_id: LeaseId, p: Who) -> dict:
        """End a lease now; unused tokens and credits come back. Releasing a lease that has
        already ended answers ``refused`` with reason ``invalid`` (idempotent)."""
        scope(p, campaign)

        def run():
            own_lease(campaign, lease_id)
            return broker.release(lease_id)

        return M.decision_out(await service.call(run))

    # columnar batches (batch.py): intents and consumptions as columns, JSON or MessagePack
    batch.install(app, service, principal, charge, max_items=st.max_batch_items,
                  common=_SCOPED)

    # the decision stream (stream.py): one WebSocket per agent, answers in order once durable
    app.state.streams = stream.install(
        app, service, tokens, limiter, fail_limiter, batch_unit=st.batch_unit,
        window=st.stream_window, frame=st.stream_frame, max_frame_bytes=st.max_body,
        intent_of=intent_of, own_lease=own_lease, on_sent=metrics.observe_stream)
    metrics.streams = app.state.streams.sessions
    if st.direct:
        app.direct = DirectIntents(app, service, tokens, limiter, max_body=st.max_body,
                                   intent_of=intent_of, observe=metrics.observe_request)

    # ------------------------------------------------------------------ flow dimensions
    @app.post("/v1/campaigns/{campaign:path}/consume", response_model=M.ConsumptionOut,
              responses={**_SCOPED, 200: {"description": "the amount allowed now",
                                          "headers": _RETRY_HDR}}, tags=["flow"])
    async def consume(campaign: Camp, body: M.ConsumeIn, p: Who, response: Response) -> dict:
        """Consume units of a flow dimension (throttle at source, SPEC §5)."""
        scope(p, campaign)
        c = await service.call(broker.consume, campaign, body.dim, body.amount)
        if c.allowed < c.requested and math.isfinite(c.retry_after):
            response.headers["Retry-After"] = retry_after_header(c.retry_after)
        return M.consumption_out(c)

    @app.post("/v1/campaigns/{campaign:path}/consume/batch", response_model=M.ConsumptionBatchOut,
              responses=_SCOPED, tags=["flow"])
    async def consume_batch(campaign: Camp, body: M.ConsumeBatchIn, p: Who) -> dict:
        """Many consumptions, decided in order and acknowledged together."""
        scope(p, campaign)
        charge(p, len(body.items))
        for i, it in enumerate(body.items):
            if it.dim not in broker.flow_dims:
                raise RequestValidationError([{
                    "loc": ("body", "items", i, "dim"), "type": "invalid_argument",
                    "msg": f"must be a flow dimension, one of {broker.flow_dims}"}])

        def run() -> list:
            return [M.consumption_out(broker.consume(campaign, it.dim, it.amount))
                    for it in body.items]

        return {"results": await service.call(run)}

    # ------------------------------------------------------------------ events
    After = Annotated[int, Query(ge=-1, le=1 << 62, description="a journal seq (cursor)")]
    Limit = Annotated[int, Query(ge=1, le=1000)]

    async def _page(campaign: str | None, after: int, timeout: float, limit: int) -> dict:
        timeout = min(timeout, st.max_longpoll)
        evs = await service.wait_events(campaign, after, limit, timeout)
        nxt = evs[-1]["seq"] if len(evs) == limit else max(after, service.durable_seq)
        return {"events": evs, "next": nxt}

    @app.get("/v1/campaigns/{campaign:path}/events", response_model=M.EventPage, responses=_SCOPED,
             tags=["events"])
    async def events(campaign: Camp, p: Who, after: After = -1,
                     timeout: Annotated[float, Query(ge=0, le=60)] = 0.0,
                     limit: Limit = 100) -> dict:
        """Long-poll: the campaign's events (preempt notices, revocations, expiries,
        activations, grants and refusals of pending intents) after ``after``, waiting up
        to ``timeout`` seconds for the first one. Only durable events are delivered."""
        scope(p, campaign)
        return await _page(campaign, after, timeout, limit)

    @app.get("/v1/events", response_model=M.EventPage, responses=_OPERATOR, tags=["operator"])
    async def all_events(p: Op, after: After = -1,
                         timeout: Annotated[float, Query(ge=0, le=60)] = 0.0,
                         limit: Limit = 100) -> dict:
        """Every campaign's events (operator)."""
        return await _page(None, after, timeout, limit)

    @app.get("/v1/campaigns/{campaign:path}/events/stream", responses={
        **_SCOPED, 200: {"description": "server-sent events: `id` is the seq, `event` the "
                                        "kind, `data` the event as JSON",
                         "content": {"text/event-stream": {"schema": {
                             "type": "object", "description": "one server-sent event",
                             "properties": {"id": {"type": "string"},
                                            "event": {"type": "string"},
                                            "data": {"type": "string"},
                                            "retry": {"type": "string"}}}}}}},
             response_class=StreamingResponse, tags=["events"])
    async def event_stream(campaign: Camp, p: Who, after: After = -1,
                           max_seconds: Annotated[float, Query(gt=0, le=3600)] = 300.0,
                           last_event_id: Annotated[str | None, Header(max_length=32)] = None
                           ) -> StreamingResponse:
        """Server-sent events (``text/event-stream``); resumes from ``Last-Event-ID``.
        The stream ends after ``max_seconds``; reconnect to go on."""
        scope(p, campaign)
        if last_event_id is not None:
            try:
                after = max(after, int(last_event_id))
            except ValueError:
                pass

        async def gen() -> AsyncIterator[bytes]:
            cursor = after
            loop = asyncio.get_running_loop()
            end = loop.time() + max_seconds
            yield b"retry: 1000\n\n"
            while True:
                left = end - loop.time()
                if left <= 0:
                    return
                evs = await service.wait_events(campaign, cursor, 100, min(15.0, left))
                if not evs:
                    yield b": keep-alive\n\n"
                    continue
                for e in evs:
                    cursor = e["seq"]
                    yield (f"id: {e['seq']}\nevent: {e['kind']}\n"
                           f"data: {json.dumps(e)}\n\n").encode()

        return StreamingResponse(gen(), media_type="text/event-stream",
                                 headers={"X-Accel-Buffering": "no"})

    # ------------------------------------------------------------------ journal
    OpName = Annotated[str | None, Query(max_length=32, description=f"one of {list(J.OPS)}")]
    Outcome = Annotated[str | None, Query(max_length=16)]
    Reason = Annotated[str | None, Query(max_length=32)]
    Time = Annotated[float | None, Query(ge=0, le=M.MAX_TIME)]

    def _check_filters(op: str | None, outcome: str | None, reason: str | None) -> None:
        for name, v, allowed in (("op", op, J.OPS), ("outcome", outcome, J.OUTCOMES[1:]),
                                 ("reason", reason, J.REASONS[1:])):
            if v is not None and v not in allowed:
                raise RequestValidationError([{"loc": ("query", name), "type": "enum",
                                               "msg": f"must be one of {list(allowed)}"}])

    def _records(campaign: str | None, after: int, t0, t1, op, outcome, reason, limit) -> dict:
        _check_filters(op, outcome, reason)
        recs = service.journal_records(campaign, after=after, t0=t0, t1=t1,
                                       ops=[op] if op else None, outcome=outcome,
                                       reason=reason, limit=limit)
        nxt = recs[-1]["seq"] if len(recs) == limit else max(after, service.durable_seq)
        return {"records": recs, "next": nxt}

    @app.get("/v1/campaigns/{campaign:path}/journal", response_model=M.RecordPage,
             responses=_SCOPED, tags=["journal"])
    async def journal(campaign: Camp, p: Who, after: After = -1, t0: Time = None,
                      t1: Time = None, op: OpName = None, outcome: Outcome = None,
                      reason: Reason = None, limit: Limit = 100) -> dict:
        """The campaign's journal records (durable ones), oldest first, after ``after``."""
        scope(p, campaign)
        return _records(campaign, after, t0, t1, op, outcome, reason, limit)

    @app.get("/v1/campaigns/{campaign:path}/journal/{seq}", response_model=M.ExplainOut,
             responses=_SCOPED, tags=["journal"])
    async def explain(campaign: Camp, seq: Seq, p: Who) -> dict:
        """One record of the campaign and why, in words."""
        scope(p, campaign)
        got = service.record(seq)
        if got is None or got[0].get("campaign") != campaign:
            raise _not_found("record")
        return {"record": got[0], "explain": got[1]}

    @app.get("/v1/journal", response_model=M.RecordPage, responses=_OPERATOR,
             tags=["operator"])
    async def journal_all(p: Op, after: After = -1, t0: Time = None, t1: Time = None,
                          op: OpName = None, outcome: Outcome = None, reason: Reason = None,
                          limit: Limit = 100) -> dict:
        """Every journal record (operator)."""
        return _records(None, after, t0, t1, op, outcome, reason, limit)

    @app.get("/v1/journal/{seq}", response_model=M.ExplainOut,
             responses={**_OPERATOR, 404: _SCOPED[404]}, tags=["operator"])
    async def explain_any(seq: Seq, p: Op) -> dict:
        got = service.record(seq)
        if got is None:
            raise _not_found("record")
        return {"record": got[0], "explain": got[1]}

    # ------------------------------------------------------------------ operator
    @app.get("/v1/state", responses=_OPERATOR, tags=["operator"],
             response_model=dict[str, Any])
    async def state(p: Op, leases: Annotated[bool, Query(
            description="list every live lease (false: an empty list; what a dashboard "
                        "polling a broker with many leases asks for)")] = True) -> dict:
        """The whole broker: pool, campaigns, leases, pending (operator)."""
        return json_safe(await service.call(broker.state, leases=leases))

    @app.post("/v1/pool/{dim}/nodes", response_model=M.NodesAdded, responses=_OPERATOR,
              tags=["operator"])
    async def add_nodes(dim: Annotated[str, Path(min_length=1, max_length=128)],
                        body: M.NodesIn, p: Op) -> dict:
        """Grow the pool: nodes join dimension ``dim`` now (a pilot allocation started)."""
        ids = await service.call(broker.add_nodes, dim, [(n.name, n.slots) for n in body.nodes])
        return {"slots": ids}

    @app.post("/v1/pool/{dim}/nodes/remove", response_model=M.NodesRemoved,
              responses=_OPERATOR, tags=["operator"])
    async def remove_nodes(dim: Annotated[str, Path(min_length=1, max_length=128)],
                           body: M.RemoveNodesIn, p: Op) -> dict:
        """Shrink the pool: the leases holding the nodes' slots are revoked with notice."""
        ids = await service.call(broker.remove_nodes, dim, list(body.nodes), grace=body.grace)
        return {"revoked": ids}

    # ------------------------------------------------------------------ changing the tree
    # (after every other route: a node path may end in a route's words, and the routes
    # below it are matched first)
    def below(p: Principal, campaign: str) -> str:
        """The delegation rule for changing and removing nodes: the operator any node, a
        campaign token only the nodes strictly below its own (its own node: 403; outside
        its subtree: exactly like a missing node)."""
        scope(p, campaign)
        if not p.operator and campaign == p.campaign:
            raise HTTPException(403, "a campaign token changes and removes only the nodes "
                                "below its own")
        return campaign

    @app.patch("/v1/campaigns/{campaign:path}", response_model=M.CampaignChanged,
               responses={**_SCOPED, 403: {**_ERR, "description": "a campaign token changes "
                                           "only the nodes below its own"}},
               tags=["campaigns"])
    async def change_campaign(campaign: Camp, body: M.EnvelopeIn, p: Who) -> dict:
        """Replace a node's envelope (SPEC §14.9): its guarantee still nests, a raise fits
        the reserve now, a budget moves between finite values. Live leases keep running
        as granted. The operator changes any node; a campaign token the nodes strictly
        below its own (delegation)."""
        below(p, campaign)
        errors = body.dim_errors(broker.dims, list(broker.flow_dims))
        if errors:
            raise RequestValidationError(errors)
        env = envelope_from_json(body.model_dump(), "envelope")
        await service.call(broker.change, campaign, env)
        return {"campaign": campaign, "envelope": json_safe(env.to_json())}

    @app.delete("/v1/campaigns/{campaign:path}", response_model=M.CampaignRemoved,
                responses={**_SCOPED, 403: {**_ERR, "description": "a campaign token removes "
                                            "only the nodes below its own"}},
                tags=["campaigns"])
    async def remove_campaign(campaign: Camp, p: Who) -> dict:
        """Remove a node with no children, no live leases and no pending intents (SPEC
        §14.9); its tokens stop working and its name may be registered again. The operator
        removes any node; a campaign token the nodes strictly below its own."""
        below(p, campaign)
        await service.call(broker.remove, campaign)
        return {"campaign": campaign, "removed": True,
                "tokens_revoked": tokens.revoke_campaign(campaign)}

    reserved.update(route_words(app.routes))
    app.state.reserved_segments = frozenset(reserved)
    # a node registered before (by the configuration or an older journal) whose path holds
    # a route word: served, but a URL may read as another node and route
    clash = [c for c in broker.campaigns if reserved_segment(c, app.state.reserved_segments)]
    if clash:
        log.warning("campaigns %s have a segment that is a route word %s: their URLs may "
                    "be ambiguous; register such nodes under other names", clash,
                    sorted(reserved))
    return app


__all__ += ["OPERATOR", "CAMPAIGN"]
