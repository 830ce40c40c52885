"""The asynchronous client."""

from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncIterator, Callable, Iterable, Sequence

import numpy as np

from ..admission import Envelope, Intent
from ..broker import BatchResult, Consumption, Decision, Event, Lease, Quote, Supply
from ..errors import InvalidArgument, UnknownLease
from . import _batch
from ._base import (EventPage, ServiceTimeout, Ticket, Unavailable, _Base, _needs_table, _Req,
                    _SSE, child_name, httpx)
from ._stream import AsyncDecisionStream, stream_url


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
                r = await self._http.request(req.method, url, json=req.json,
                                             content=req.content, params=req.params,
                                             headers=req.headers(self._headers),
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

    # -- columnar batches (numpy in, numpy out) ------------------------------------
    async def campaigns(self) -> list[str]:
        """The campaigns the token may see (an operator's: every campaign, in the
        broker's registration order, so a position is the broker's campaign index)."""
        return await self._do(self._r_campaigns())

    async def admit_columns(self, campaign_idx: Any, units: Any, durations: Any, *,
                      campaigns: Sequence[str] | None = None, service_class: str | None = None,
                      dim: str | None = None, ttl: float | None = None,
                      binary: bool = True) -> dict[str, Any]:
        """:meth:`admit_batch`, answering every column: those of
        :class:`~bursarcore.broker.BatchResult`, ``cost`` (credits), ``seq`` (each
        decision's journal record), the ``reasons`` and ``outcomes`` code tables and the
        broker ``time``."""
        default = await self.campaigns() if _needs_table(campaign_idx, campaigns) else None
        return await self._do(_batch.intents_request(
            campaign_idx, units, durations, campaigns=campaigns, default=default,
            service_class=service_class, dim=dim, ttl=ttl, binary=binary))

    async def admit_batch(self, campaign_idx: Any, units: Any, durations: Any, *,
                    campaigns: Sequence[str] | None = None, service_class: str | None = None,
                    dim: str | None = None, ttl: float | None = None,
                    binary: bool = True) -> BatchResult:
        """Many intents as columns, decided as :meth:`Broker.admit_batch` decides them
        and acknowledged once durable (``POST /v1/batch/intents``, MessagePack typed
        columns unless ``binary=False``). ``campaign_idx`` holds positions in
        ``campaigns`` (default: :meth:`campaigns`), campaign names (one per row), or one
        name for the whole batch; ``units`` has shape (n,) or (n, 2) (min, max);
        ``durations`` is seconds, a scalar or shape (n,)."""
        return _batch.batch_result(await self.admit_columns(
            campaign_idx, units, durations, campaigns=campaigns, service_class=service_class,
            dim=dim, ttl=ttl, binary=binary))

    async def consume_columns(self, campaign_idx: Any, dims: Any, amounts: Any, *,
                        campaigns: Sequence[str] | None = None,
                        flow_dims: Sequence[str] | None = None,
                        binary: bool = True) -> dict[str, Any]:
        """:meth:`consume_batch`, answering every column: ``allowed``, ``retry_after``,
        ``reason`` (codes into ``reasons``), ``cost``, ``seq`` and ``time``."""
        default = await self.campaigns() if _needs_table(campaign_idx, campaigns) else None
        return await self._do(_batch.consume_request(
            campaign_idx, dims, amounts, campaigns=campaigns, default=default,
            flow_dims=flow_dims, binary=binary))

    async def consume_batch(self, campaign_idx: Any, dims: Any, amounts: Any, *,
                      campaigns: Sequence[str] | None = None,
                      flow_dims: Sequence[str] | None = None,
                      binary: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Many consumptions as columns, as :meth:`Broker.consume_batch` (``POST
        /v1/batch/consume``): ``(allowed, retry_after)``. ``dims`` by name (a scalar or
        one per row), or by index into ``flow_dims``."""
        return _batch.consumptions(await self.consume_columns(
            campaign_idx, dims, amounts, campaigns=campaigns, flow_dims=flow_dims,
            binary=binary))

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

    def stream(self, campaign: str | None = None, *, after: int | None = None,
               events: bool = True, binary: bool = False, frame: int = 100,
               window: int = 2048) -> AsyncDecisionStream:
        """:meth:`BursarClient.stream` for asyncio: ``async with client.stream() as s``,
        then ``await s.acquire(...)`` and ``async for item in s`` (decisions,
        consumptions and events, the broker's types)."""
        return AsyncDecisionStream(stream_url(self.base_url, campaign, after, events),
                                   self._token,
                                   campaign=campaign if campaign is not None else self._campaign,
                                   binary=binary, frame=frame, window=window,
                                   timeout=self.timeout)

    async def event_stream(self, after: int = -1, max_seconds: float | None = None,
                           campaign: str | None = None) -> AsyncIterator[tuple[int, Event]]:
        """:meth:`BursarClient.event_stream` as an async iterator (``async for``)."""
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
        """Register a campaign — a node of the tree of envelopes, ``name`` its path — and
        return its index and its first token. The operator registers any node; a campaign
        token registers only strictly below its own node (else :class:`Forbidden`)."""
        return await self._do(self._r_register(name, envelope))

    async def register_child(self, child: str, envelope: Envelope, *,
                       parent: str | None = None) -> tuple[int, str]:
        """Register the node ``parent/child`` (``parent`` defaults to the token's own node:
        delegation) and return its index and its first token, which acts for the new
        node and the nodes below it."""
        parent = parent if parent is not None else await self.campaign()
        return await self._do(self._r_register(child_name(parent, child), envelope))

    async def change_campaign(self, campaign: str, envelope: Envelope) -> None:
        """Replace the envelope of ``campaign`` (SPEC §14.9). The operator changes any node;
        a campaign token only the nodes strictly below its own (its own node:
        :class:`Forbidden`; outside its subtree: :class:`UnknownCampaign`, as a missing
        node). A change the rules refuse raises :class:`InvalidArgument` naming its field."""
        return await self._do(self._r_change(campaign, envelope))

    async def remove_campaign(self, campaign: str) -> None:
        """Remove ``campaign`` (SPEC §14.9): a node with no children, no live leases and no
        pending intents; its tokens stop working and its name may be registered again.
        Delegation as :meth:`change_campaign`'s."""
        return await self._do(self._r_remove(campaign))

    async def mint_token(self, campaign: str | None = None) -> str:
        """A new token for ``campaign`` (default: the token's own node) — any node of the
        token's subtree; it acts for that node and the nodes below it."""
        return await self._do(self._r_mint(campaign))

    async def tokens(self, campaign: str | None = None) -> list[dict]:
        """The tokens of ``campaign``'s subtree (default: the token's own node): dicts of
        ``id``, ``campaign``, ``created`` (never secrets)."""
        return await self._do(self._r_tokens(campaign))

    async def revoke_token(self, token_id: str, campaign: str | None = None) -> bool:
        """Revoke the token ``token_id`` of ``campaign``'s subtree (default: the token's
        own node). False if no token of that subtree has that id."""
        try:
            return await self._do(self._r_revoke(token_id, campaign))
        except UnknownLease as e:       # "token not found": nothing to revoke
            if e.field != "token":
                raise
            return False

    async def add_nodes(self, dim: str, nodes: Sequence[tuple[str, int]]) -> list[int]:
        return await self._do(self._r_add_nodes(dim, nodes))

    async def remove_nodes(self, dim: str, nodes: Sequence[str], grace: float = 0.0) -> list[int]:
        return await self._do(self._r_remove_nodes(dim, nodes, grace))

