"""The synchronous client."""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np

from ..admission import Envelope, Intent
from ..broker import BatchResult, Consumption, Decision, Event, Lease, Quote, Supply
from ..errors import InvalidArgument, UnknownLease
from . import _batch
from ._base import (EventPage, ServiceTimeout, Ticket, Unavailable, _Base, _needs_table, _Req,
                    _SSE, child_name, httpx)
from ._stream import DecisionStream, stream_url


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
                r = self._http.request(req.method, url, json=req.json, content=req.content,
                                       params=req.params, headers=req.headers(self._headers),
                                       timeout=req.timeout or self.timeout)
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

    # -- columnar batches (numpy in, numpy out) ------------------------------------
    def campaigns(self) -> list[str]:
        """The campaigns the token may see (an operator's: every campaign, in the
        broker's registration order, so a position is the broker's campaign index)."""
        return self._do(self._r_campaigns())

    def admit_columns(self, campaign_idx: Any, units: Any, durations: Any, *,
                      campaigns: Sequence[str] | None = None, service_class: str | None = None,
                      dim: str | None = None, ttl: float | None = None,
                      binary: bool = True) -> dict[str, Any]:
        """:meth:`admit_batch`, answering every column: those of
        :class:`~bursarcore.broker.BatchResult`, ``cost`` (credits), ``seq`` (each
        decision's journal record), the ``reasons`` and ``outcomes`` code tables and the
        broker ``time``."""
        default = self.campaigns() if _needs_table(campaign_idx, campaigns) else None
        return self._do(_batch.intents_request(
            campaign_idx, units, durations, campaigns=campaigns, default=default,
            service_class=service_class, dim=dim, ttl=ttl, binary=binary))

    def admit_batch(self, campaign_idx: Any, units: Any, durations: Any, *,
                    campaigns: Sequence[str] | None = None, service_class: str | None = None,
                    dim: str | None = None, ttl: float | None = None,
                    binary: bool = True) -> BatchResult:
        """Many intents as columns, decided as :meth:`Broker.admit_batch` decides them
        and acknowledged once durable (``POST /v1/batch/intents``, MessagePack typed
        columns unless ``binary=False``). ``campaign_idx`` holds positions in
        ``campaigns`` (default: :meth:`campaigns`), campaign names (one per row), or one
        name for the whole batch; ``units`` has shape (n,) or (n, 2) (min, max);
        ``durations`` is seconds, a scalar or shape (n,)."""
        return _batch.batch_result(self.admit_columns(
            campaign_idx, units, durations, campaigns=campaigns, service_class=service_class,
            dim=dim, ttl=ttl, binary=binary))

    def consume_columns(self, campaign_idx: Any, dims: Any, amounts: Any, *,
                        campaigns: Sequence[str] | None = None,
                        flow_dims: Sequence[str] | None = None,
                        binary: bool = True) -> dict[str, Any]:
        """:meth:`consume_batch`, answering every column: ``allowed``, ``retry_after``,
        ``reason`` (codes into ``reasons``), ``cost``, ``seq`` and ``time``."""
        default = self.campaigns() if _needs_table(campaign_idx, campaigns) else None
        return self._do(_batch.consume_request(
            campaign_idx, dims, amounts, campaigns=campaigns, default=default,
            flow_dims=flow_dims, binary=binary))

    def consume_batch(self, campaign_idx: Any, dims: Any, amounts: Any, *,
                      campaigns: Sequence[str] | None = None,
                      flow_dims: Sequence[str] | None = None,
                      binary: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Many consumptions as columns, as :meth:`Broker.consume_batch` (``POST
        /v1/batch/consume``): ``(allowed, retry_after)``. ``dims`` by name (a scalar or
        one per row), or by index into ``flow_dims``."""
        return _batch.consumptions(self.consume_columns(
            campaign_idx, dims, amounts, campaigns=campaigns, flow_dims=flow_dims,
            binary=binary))

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

    def stream(self, campaign: str | None = None, *, after: int | None = None,
               events: bool = True, binary: bool = False, frame: int = 100,
               window: int = 2048) -> DecisionStream:
        """Open the decision stream (``/v1/stream``, one WebSocket): send intents,
        renewals, releases and consumptions without waiting, read the answers in the
        order sent (each once its journal record is durable) and ``campaign``'s events
        (the token's own by default; an operator token without one: every campaign's
        events, and each message names its campaign). ``after``: the event cursor (a
        journal seq; default: events from now on); ``events=False``: none; ``binary``:
        MessagePack frames; ``frame``: messages per frame at most; ``window``: messages
        unanswered at most before a send reads answers first. Use as a context manager;
        see :class:`~bursarcore.client.DecisionStream`."""
        return DecisionStream(stream_url(self.base_url, campaign, after, events), self._token,
                              campaign=campaign if campaign is not None else self._campaign,
                              binary=binary, frame=frame, window=window, timeout=self.timeout)

    def event_stream(self, after: int = -1, max_seconds: float | None = None,
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
        """Register a campaign — a node of the tree of envelopes, ``name`` its path — and
        return its index and its first token. The operator registers any node; a campaign
        token registers only strictly below its own node (else :class:`Forbidden`)."""
        return self._do(self._r_register(name, envelope))

    def register_child(self, child: str, envelope: Envelope, *,
                       parent: str | None = None) -> tuple[int, str]:
        """Register the node ``parent/child`` (``parent`` defaults to the token's own node:
        delegation) and return its index and its first token, which acts for the new
        node and the nodes below it."""
        parent = parent if parent is not None else self.campaign
        return self._do(self._r_register(child_name(parent, child), envelope))

    def change_campaign(self, campaign: str, envelope: Envelope) -> None:
        """Replace the envelope of ``campaign`` (SPEC §14.9). The operator changes any node;
        a campaign token only the nodes strictly below its own (its own node:
        :class:`Forbidden`; outside its subtree: :class:`UnknownCampaign`, as a missing
        node). A change the rules refuse raises :class:`InvalidArgument` naming its field."""
        return self._do(self._r_change(campaign, envelope))

    def remove_campaign(self, campaign: str) -> None:
        """Remove ``campaign`` (SPEC §14.9): a node with no children, no live leases and no
        pending intents; its tokens stop working and its name may be registered again.
        Delegation as :meth:`change_campaign`'s."""
        return self._do(self._r_remove(campaign))

    def mint_token(self, campaign: str | None = None) -> str:
        """A new token for ``campaign`` (default: the token's own node) — any node of the
        token's subtree; it acts for that node and the nodes below it."""
        return self._do(self._r_mint(campaign))

    def tokens(self, campaign: str | None = None) -> list[dict]:
        """The tokens of ``campaign``'s subtree (default: the token's own node): dicts of
        ``id``, ``campaign``, ``created`` (never secrets)."""
        return self._do(self._r_tokens(campaign))

    def revoke_token(self, token_id: str, campaign: str | None = None) -> bool:
        """Revoke the token ``token_id`` of ``campaign``'s subtree (default: the token's
        own node). False if no token of that subtree has that id."""
        try:
            return self._do(self._r_revoke(token_id, campaign))
        except UnknownLease as e:       # "token not found": nothing to revoke
            if e.field != "token":
                raise
            return False

    def add_nodes(self, dim: str, nodes: Sequence[tuple[str, int]]) -> list[int]:
        return self._do(self._r_add_nodes(dim, nodes))

    def remove_nodes(self, dim: str, nodes: Sequence[str], grace: float = 0.0) -> list[int]:
        return self._do(self._r_remove_nodes(dim, nodes, grace))

