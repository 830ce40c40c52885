"""Prometheus metrics for ``GET /metrics`` (prometheus_client, text format 0.0.4).

Each app has its own :class:`~prometheus_client.CollectorRegistry` (no process-global
state: tests and embedders may build several apps). Three kinds of series:

* **observed as they happen** — request latency by route *template*
  (``/v1/campaigns/{campaign}/intents``, never the raw path, so campaign names and ids do
  not become labels; a path no route matched is ``route="unmatched"``), responses by status,
  journal commit latency and records per commit (group commit's batch size);
* **counted from the journal** — decisions by ``op``, ``outcome`` and ``reason``: at each
  scrape the durable records since the previous scrape are counted with one numpy pass, so
  the counts are the journal's own (replayed history included after a restart: the counter
  is monotone over the journal's life) and the request path pays nothing;
* **read from the broker at scrape time** — pool units, pending depth, and per campaign
  held units, tokens and credits left.

Cardinality is bounded by construction: op, outcome and reason are the journal's fixed
enumerations, routes are the app's templates, dimensions are the pool's (at most 64 by the
configuration), and per-campaign series are shown for at most ``campaigns`` campaigns
(``[metrics] campaigns``, default 20): the top ones by held units of the pool's primary
dimension (then of every held dimension, then by name), with everything of the rest
summed under ``campaign="other"``. The shown set can change between scrapes as holdings
change; the sum over all labels is the pool's total either way.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Iterable

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ..journal import records as J

__all__ = ["ServiceMetrics", "RouteTimer", "DECISION_OPS", "CONTENT_TYPE", "OTHER"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OTHER = "other"
#: the journal ops that are decisions (each has an outcome, and a reason when refused)
DECISION_OPS = ("acquire", "grant", "refuse", "renew", "consume")
_DECISION_CODES = np.array([J.OP[o] for o in DECISION_OPS], dtype=np.int64)

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                    2.5, 5.0, 10.0, 30.0, 60.0)
# any other method token (a client may send anything) is counted as "other"
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"})
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)


class ServiceMetrics:
    """The metrics of one :class:`~bursarcore.service.core.BrokerService`."""

    def __init__(self, service: Any, *, campaigns: int = 20) -> None:
        self.service = service
        self.top = max(0, int(campaigns))
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.latency = Histogram("bursar_http_request_duration_seconds",
                                 "Time from a request's start to its response's end, by route "
                                 "template", ["method", "route"], registry=r,
                                 buckets=_LATENCY_BUCKETS)
        self.responses = Counter("bursar_http_responses", "Responses by route template and "
                                 "status code", ["method", "route", "status"], registry=r)
        self.commit_seconds = Histogram("bursar_journal_commit_duration_seconds",
                                        "Time to write and sync one journal commit group",
                                        registry=r, buckets=_LATENCY_BUCKETS)
        self.commit_records = Histogram("bursar_journal_commit_records",
                                        "Journal records per commit group (group commit's "
                                        "batch size)", registry=r, buckets=_BATCH_BUCKETS)
        self.stream_answers = Counter("bursar_stream_answers", "Answers sent on decision "
                                      "streams (decisions, consumptions and errors)",
                                      registry=r)
        #: the live decision stream sessions (set by the app)
        self.streams: Iterable[Any] = ()
        self._decisions: dict[tuple[int, int, int], int] = {}
        self._series: dict[tuple[str, str, int], tuple[Any, Any]] = {}
        self._counted = 0              # journal records before this seq are counted
        self._snapshot: dict[str, Any] | None = None
        r.register(_Snapshot(self))
        service.commit_observer = self.observe_commit

    def observe_commit(self, seconds: float, records: int) -> None:
        self.commit_seconds.observe(seconds)
        self.commit_records.observe(records)

    def observe_stream(self, answers: int) -> None:
        if answers:
            self.stream_answers.inc(answers)

    def observe_request(self, method: str, route: str, status: int, seconds: float) -> None:
        # the labelled series, found once per route and status (labels() parses its
        # arguments on every call)
        key = (method, route, status)
        got = self._series.get(key)
        if got is None:
            got = self._series[key] = (self.latency.labels(method, route),
                                       self.responses.labels(method, route, str(status)))
        got[0].observe(seconds)
        got[1].inc()

    async def render(self) -> bytes:
        """Refresh what is read at scrape time and return the text exposition."""
        svc = self.service
        if svc.failed is None:
            # state() may fire expiries (it moves broker time): an operation like any other
            self._snapshot = await svc.call(svc.broker.state, leases=False)   # no lease list
        self._count_decisions()
        return generate_latest(self.registry)

    def _count_decisions(self) -> None:
        svc = self.service
        with svc.lock:
            hi = svc.latest_seq() + 1
            if hi <= self._counted:
                return
            rows = svc.journal.rows()[self._counted:hi]
            op = rows["op"].astype(np.int64)
            m = np.isin(op, _DECISION_CODES)
            key = (op[m] << 16) | (rows["outcome"][m].astype(np.int64) << 8) \
                | rows["reason"][m].astype(np.int64)
        self._counted = hi
        vals, counts = np.unique(key, return_counts=True)
        for v, n in zip(vals.tolist(), counts.tolist()):
            k = (v >> 16, (v >> 8) & 0xFF, v & 0xFF)
            self._decisions[k] = self._decisions.get(k, 0) + n

    # ------------------------------------------------------------------ families
    def families(self) -> Iterable[Any]:
        dec = CounterMetricFamily("bursar_decisions", "Broker decisions in the durable "
                                  "journal, by op, outcome and reason",
                                  labels=["op", "outcome", "reason"])
        for (op, outcome, reason), n in sorted(self._decisions.items()):
            dec.add_metric([J.OPS[op], J.OUTCOMES[outcome], J.REASONS[reason] or "none"], n)
        yield dec
        svc = self.service
        yield GaugeMetricFamily("bursar_service_failed", "1 once the journal cannot be "
                                "written (the service acknowledges nothing more)",
                                value=float(svc.failed is not None))
        yield GaugeMetricFamily("bursar_journal_durable_seq", "Sequence number of the last "
                                "durable journal record", value=float(svc.latest_seq()))
        sessions = list(self.streams)
        yield GaugeMetricFamily("bursar_stream_connections", "Open decision stream "
                                "connections", value=float(len(sessions)))
        yield GaugeMetricFamily("bursar_stream_inflight", "Messages read on decision "
                                "streams and not yet answered, summed over connections",
                                value=float(sum(s.inflight for s in sessions)))
        yield GaugeMetricFamily("bursar_stream_inflight_peak", "The most messages ever in "
                                "flight on one open decision stream connection",
                                value=float(max((s.peak for s in sessions), default=0)))
        yield GaugeMetricFamily("bursar_stream_received", "Messages read on the open "
                                "decision stream connections",
                                value=float(sum(s.received for s in sessions)))
        snap = self._snapshot
        if snap is None:
            return
        pool = GaugeMetricFamily("bursar_pool_units", "Pool units by dimension and state",
                                 labels=["dim", "state"])
        for d, p in snap["pool"].items():
            for state in ("capacity", "occupied", "free", "reclaimable", "revoking"):
                pool.add_metric([d, state], float(p[state]))
        yield pool
        pend = GaugeMetricFamily("bursar_pending_intents", "Intents waiting in the pending "
                                 "queue, by dimension", labels=["dim"])
        depth = {d: 0 for d in snap["pool"]}
        for p in snap["pending"]:
            depth[p["dim"]] = depth.get(p["dim"], 0) + 1
        for d, n in depth.items():
            pend.add_metric([d], float(n))
        yield pend
        camps = snap["campaigns"]
        yield GaugeMetricFamily("bursar_campaigns", "Registered campaigns",
                                value=float(len(camps)))
        yield from self._campaign_families(camps, list(snap["pool"]))

    def _campaign_families(self, camps: dict[str, Any], dims: list[str]) -> Iterable[Any]:
        shown, rest = top_campaigns(camps, dims, self.top)
        held = GaugeMetricFamily("bursar_campaign_held_units", "Units a campaign holds, by "
                                 "dimension (campaign=\"other\": the sum over campaigns not "
                                 "shown)", labels=["campaign", "dim"])
        tokens = GaugeMetricFamily("bursar_campaign_tokens", "A campaign's burst bucket, "
                                   "unit-seconds (+Inf: no bound)", labels=["campaign", "dim"])
        credits = GaugeMetricFamily("bursar_campaign_credits_left", "Credits a campaign has "
                                    "left (+Inf: unlimited)", labels=["campaign"])
        rows = [(c, [camps[c]]) for c in shown]
        if rest:
            rows.append((OTHER, [camps[c] for c in rest]))
        for label, group in rows:
            for d in dims:
                held.add_metric([label, d], float(sum(g["held"][d] for g in group)))
                tokens.add_metric([label, d], _total(g["tokens"][d] for g in group))
            credits.add_metric([label], _total(g["credits_left"] for g in group))
        yield held
        yield tokens
        yield credits


def _total(values: Iterable[float | None]) -> float:
    """A sum where None (unbounded) makes the whole unbounded."""
    s = 0.0
    for v in values:
        if v is None:
            return math.inf
        s += v
    return s


def top_campaigns(camps: dict[str, Any], dims: list[str], k: int) -> tuple[list[str], list[str]]:
    """The ``k`` campaigns shown by name and the rest: by held units of the primary
    dimension, then of all held dimensions, then by name (a stable order for ties)."""
    primary = dims[0] if dims else None

    def key(name: str) -> tuple:
        h = camps[name]["held"]
        return (-(h.get(primary, 0) if primary else 0), -sum(h.values()), name)

    order = sorted(camps, key=key)
    return order[:k], order[k:]


class _Snapshot:
    """The collector of the journal-counted and scrape-time families."""

    def __init__(self, metrics: ServiceMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterable[Any]:
        return self.metrics.families()

    def describe(self) -> list:
        return []           # names are not fixed up front (auto_describe would collect)


class RouteTimer:
    """Pure ASGI middleware, outermost: times every HTTP request from its start to the end
    of its response and records it under the route template the router matched."""

    def __init__(self, app: Any, observe: Callable[[str, str, int, float], None]) -> None:
        self.app, self.observe = app, observe

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        status = 500

        async def send_status(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            r = scope.get("route")
            # the template without converters (a node path is {campaign}, not the raw path)
            route = getattr(r, "path_format", None) or getattr(r, "path", None) \
                or "unmatched"
            method = scope.get("method", "")
            self.observe(method if method in _METHODS else "other", route, status,
                         time.perf_counter() - t0)
