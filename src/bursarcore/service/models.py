"""Request and response bodies of the HTTP API (pydantic), and the converters from the
broker's own types. The OpenAPI document at ``/openapi.json`` is generated from these.

JSON has no infinity: wherever the broker says ``inf`` (unlimited credits or bucket, a
consumption that can never pass, the cold path with no estimate) the API says ``null``.
Times are broker times: Unix seconds in the service.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .. import units as U
from ..admission.state import LEASE_STATES
from ..broker import Consumption, Decision, Lease, Quote, Supply
from .nodes import NodePath

__all__ = [
    "IntentIn", "IntentBatchIn", "QuoteIn", "RenewIn", "ConsumeIn", "ConsumeBatchIn",
    "CampaignIn", "EnvelopeIn", "NodesIn", "RemoveNodesIn",
    "LeaseOut", "DecisionOut", "DecisionBatchOut", "SupplyOut", "QuoteOut", "ConsumptionOut",
    "ConsumptionBatchOut", "EventOut", "EventPage", "PendingOut", "TicketOut", "RecordPage",
    "RecordOut", "WhoAmI", "HealthOut", "ErrorOut", "CampaignCreated", "TokenOut", "CancelOut",
    "NodesAdded", "NodesRemoved", "LeaseList", "PendingList", "CampaignList",
    "TokenInfo", "TokenList", "TokenRevoked", "NodePath",
    "lease_out", "decision_out", "supply_out", "quote_out", "consumption_out", "fin",
    "MAX_BATCH", "MAX_GRID", "MAX_TIME", "MAX_PAGE",
]

# Every numeric bound of the schema is the library's (bursarcore.units), read when this
# module is imported: a request the schema accepts is one the broker can represent, and a
# value just outside answers 422 naming the field before it reaches the broker.
MAX_TIME = min(4.0e9, U.MAX_SECONDS)   # Unix seconds (the year 2096): deadlines, filters
MAX_BATCH = 1000
MAX_GRID = 100_000
MAX_PAGE = 1000                        # items per page of a list endpoint
NAME = r"^[A-Za-z0-9][A-Za-z0-9._:@+-]{0,127}$"

Name = Annotated[str, Field(min_length=1, max_length=128, pattern=NAME)]
Seconds = Annotated[float, Field(ge=U.MIN_DURATION, le=U.MAX_DURATION)]
Ttl = Annotated[float, Field(gt=0, le=U.MAX_TTL)]
Units = Annotated[int, Field(ge=1, le=U.MAX_UNITS)]
Credits = Annotated[float, Field(ge=0, le=U.MAX_CREDITS)]
Amount = Annotated[float, Field(ge=0, le=U.MAX_AMOUNT)]
Time = Annotated[float, Field(ge=0, le=MAX_TIME)]


def fin(x: float | None) -> float | None:
    """inf and NaN become None (JSON null)."""
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ---------------------------------------------------------------------------- requests
class IntentIn(_In):
    """An intent: ``min``..``max`` units of one held dimension for ``duration`` seconds."""

    dim: Name | None = Field(None, description="held dimension (default: the pool's first)")
    min: Units | None = Field(None, description="smallest useful grant (default: max)")
    max: Units
    duration: Seconds
    deadline: Time | None = Field(
        None, description="absolute broker time (Unix seconds) by which the lease must start")
    max_spend: Credits | None = Field(None, description="caps the granted size by cost")
    service_class: Name | None = Field(None, description="overrides the envelope's class")
    ttl: Ttl | None = Field(None, description="longest wait in the pending queue, seconds")

    @field_validator("max")
    @classmethod
    def _max_ge_min(cls, v: int, info: Any) -> int:
        lo = info.data.get("min")
        if lo is not None and v < lo:
            raise ValueError(f"must be >= min ({lo})")
        return v


class IntentBatchIn(_In):
    intents: list[IntentIn] = Field(min_length=1, max_length=MAX_BATCH)


class QuoteIn(_In):
    sizes: list[Units] = Field(min_length=1, max_length=1000)
    durations: list[Seconds] = Field(min_length=1, max_length=1000)
    dim: Name | None = None
    service_class: Name | None = None

    @field_validator("durations")
    @classmethod
    def _grid(cls, v: list[float], info: Any) -> list[float]:
        n = len(info.data.get("sizes") or [])
        if n * len(v) > MAX_GRID:
            raise ValueError(f"the grid sizes x durations must have at most {MAX_GRID} cells")
        return v


class RenewIn(_In):
    duration: Seconds
    max_spend: Credits | None = None


class ConsumeIn(_In):
    dim: Name
    amount: Amount


class ConsumeBatchIn(_In):
    items: list[ConsumeIn] = Field(min_length=1, max_length=MAX_BATCH)


# an envelope's values per dimension; the schema cannot tell held from flow dimensions, so
# it takes the larger bound (flow amounts and rates) and :meth:`EnvelopeIn.dim_errors`
# applies the held dimensions' own (units, unit-seconds) once the pool is known
PerDim = Annotated[dict[Name, Amount], Field(max_length=64)]
Burst = Annotated[float, Field(ge=0, le=max(U.MAX_BURST, U.MAX_AMOUNT))]


class EnvelopeIn(_In):
    """A campaign envelope (SPEC §3). ``credits: null`` and a ``burst`` of ``null`` mean
    unlimited."""

    credits: Credits | None
    service_class: Name = "agent-burst"
    guaranteed: PerDim = Field(default_factory=dict)
    sustained: PerDim = Field(default_factory=dict)
    ceiling: PerDim = Field(default_factory=dict)
    burst: Annotated[dict[Name, Burst | None], Field(max_length=64)] = Field(
        default_factory=dict)
    share: Annotated[float, Field(gt=0, le=U.MAX_AMOUNT)] | None = None
    borrow_limit: PerDim = Field(default_factory=dict, description=(
        "units per held dimension it may hold on leases borrowed from its siblings' idle "
        "guarantees (SPEC §14.8); default none"))
    lend_limit: Annotated[dict[Name, Amount | None], Field(max_length=64)] = Field(
        default_factory=dict, description=(
            "units per held dimension of its idle guarantee its siblings may borrow; "
            "null or absent: no limit"))

    def dim_errors(self, held: list[str], flow: list[str],
                   where: tuple = ("body", "envelope")) -> list[dict[str, Any]]:
        """422 items for values outside their dimension's range: a held dimension's
        guaranteed/sustained/ceiling at most ``MAX_UNITS`` units and its burst at most
        ``MAX_BURST`` unit-seconds (or null); a flow dimension's at most ``MAX_AMOUNT``."""
        out = []
        for name in ("guaranteed", "sustained", "ceiling", "burst"):
            for d, v in getattr(self, name).items():
                if v is None or d not in held:
                    continue              # flow dimensions: the schema's bound is theirs
                hi = U.MAX_BURST if name == "burst" else U.MAX_UNITS
                if v > hi:
                    out.append({"loc": (*where, name, d), "type": "less_than_equal",
                                "msg": f"must be <= {hi:.10g} for the held dimension {d!r}"})
        return out


class CampaignIn(_In):
    name: NodePath = Field(description="a node path: 1 to 8 names joined by '/' "
                           "(`astro/survey`), at most 256 characters; the parent of a "
                           "child node is registered first")
    envelope: EnvelopeIn


class NodeIn(_In):
    name: Name
    slots: Units


class NodesIn(_In):
    nodes: list[NodeIn] = Field(min_length=1, max_length=MAX_BATCH)


class RemoveNodesIn(_In):
    nodes: list[Name] = Field(min_length=1, max_length=MAX_BATCH)
    grace: Annotated[float, Field(ge=0, le=U.MAX_DURATION)] = 0.0


# ---------------------------------------------------------------------------- responses
class PlacementOut(_Out):
    node: str
    units: int


class LeaseOut(_Out):
    id: int
    campaign: str
    dim: str
    units: int
    state: Literal[LEASE_STATES]  # type: ignore[valid-type]
    firm: bool
    service_class: str
    granted_at: float
    start: float | None
    expiry: float | None
    cost: float
    revoke_at: float | None
    intent: int
    placement: list[PlacementOut]
    slots: list[int]


class DecisionOut(_Out):
    outcome: Literal["granted", "pending", "refused", "released"]
    intent_id: int
    campaign: str
    units: int
    lease: LeaseOut | None
    path: str | None
    reason: str | None
    retry_after: float | None
    cost: float
    wait: float
    seq: int


class DecisionBatchOut(_Out):
    decisions: list[DecisionOut]


class DimSupplyOut(_Out):
    free: int
    reclaimable: int
    capacity: int
    congestion: float
    multiplier: float
    tokens: float | None
    bucket: float | None = Field(description="null: an unbounded bucket")
    held: int
    ceiling: int
    price: dict[str, float]
    wait: dict[str, float | None]


class SupplyOut(_Out):
    campaign: str
    time: float
    credits: float | None = Field(description="null: unlimited")
    service_class: str
    dims: dict[str, DimSupplyOut]


class QuoteOut(_Out):
    sizes: list[int]
    durations: list[float]
    cost: list[list[float]]
    path: list[list[str]]
    wait: list[list[float | None]]
    grantable: list[list[bool]]
    reason: list[list[str]]


class ConsumptionOut(_Out):
    campaign: str
    dim: str
    requested: float
    allowed: float
    retry_after: float | None = Field(description="0 when all passed; null: never")
    reason: str | None
    cost: float
    seq: int


class ConsumptionBatchOut(_Out):
    results: list[ConsumptionOut]


class EventOut(_Out):
    seq: int = Field(description="journal sequence number: the cursor")
    kind: Literal["expired", "revoked", "activated", "preempt_notice", "granted", "refused"]
    time: float
    campaign: str
    lease_id: int | None
    intent_id: int | None
    deadline: float | None
    reason: str | None
    units: int


class EventPage(_Out):
    events: list[EventOut]
    next: int = Field(description="pass as `after` to get the events that follow")


class PendingOut(_Out):
    intent_id: int
    campaign: str
    dim: str
    min: int
    max: int
    duration: float
    reason: str
    expires: float
    service_class: str


class PendingList(_Out):
    pending: list[PendingOut]
    next: int | None = Field(description="pass as `after` for the next page; null: the last")


class LeaseList(_Out):
    time: float
    leases: list[LeaseOut]
    next: int | None = Field(description="pass as `after` for the next page; null: the last")


class TicketOut(_Out):
    intent_id: int
    campaign: str
    status: Literal["pending", "granted", "refused", "cancelled"]
    reason: str | None
    lease: LeaseOut | None
    expires: float | None


class CancelOut(_Out):
    intent_id: int
    cancelled: bool


class RecordOut(_Out):
    model_config = ConfigDict(extra="allow")
    seq: int
    t: int = Field(description="broker time in ns")
    op: str
    outcome: str
    reason: str
    campaign: str | None = Field(description="the campaign's name (null: broker-wide)")


class RecordPage(_Out):
    records: list[RecordOut]
    next: int


class ExplainOut(_Out):
    record: RecordOut
    explain: str


class WhoAmI(_Out):
    role: Literal["operator", "campaign"]
    campaign: str | None
    token_id: str


class HealthOut(_Out):
    status: Literal["ok", "failed"]
    time: float
    durable_seq: int
    commits: int = Field(description="journal commits (fsyncs) since the service started")


class CampaignCreated(_Out):
    campaign: str
    index: int
    token: str
    token_id: str


class TokenOut(_Out):
    campaign: str
    token: str
    token_id: str


class TokenInfo(_Out):
    id: str
    campaign: str
    created: float


class TokenList(_Out):
    tokens: list[TokenInfo]


class TokenRevoked(_Out):
    token_id: str
    campaign: str
    revoked: bool


class CampaignChanged(_Out):
    campaign: str
    envelope: dict[str, Any]


class CampaignRemoved(_Out):
    campaign: str
    removed: bool
    tokens_revoked: int


class CampaignList(_Out):
    campaigns: list[str]


class NodesAdded(_Out):
    slots: list[int]


class NodesRemoved(_Out):
    revoked: list[int]


class ErrorItem(_Out):
    loc: list[str | int]
    msg: str
    type: str


class ErrorOut(_Out):
    detail: str | list[ErrorItem]


# ---------------------------------------------------------------------------- converters
def lease_out(l: Lease) -> dict[str, Any]:
    return {"id": l.id, "campaign": l.campaign, "dim": l.dim, "units": l.units,
            "state": l.state, "firm": l.firm, "service_class": l.service_class,
            "granted_at": l.granted_at, "start": l.start, "expiry": l.expiry,
            "cost": l.cost, "revoke_at": l.revoke_at, "intent": l.intent,
            "placement": [{"node": n, "units": u} for n, u in l.placement],
            "slots": list(l.slots)}


def decision_out(d: Decision) -> dict[str, Any]:
    # lease_out and fin, written out: this runs once per decision answered
    l = d.lease
    r = d.retry_after
    if l is not None:
        p = l.placement
        # one node (the common case) without a comprehension's frame
        place = [{"node": p[0][0], "units": p[0][1]}] if len(p) == 1 else \
            [{"node": n, "units": u} for n, u in p]
    return {"outcome": d.outcome, "intent_id": d.intent_id, "campaign": d.campaign,
            "units": d.units,
            "lease": None if l is None else {
                "id": l.id, "campaign": l.campaign, "dim": l.dim, "units": l.units,
                "state": l.state, "firm": l.firm, "service_class": l.service_class,
                "granted_at": l.granted_at, "start": l.start, "expiry": l.expiry,
                "cost": l.cost, "revoke_at": l.revoke_at, "intent": l.intent,
                "placement": place, "slots": list(l.slots)},
            "path": d.path, "reason": d.reason,
            "retry_after": None if r is None or not math.isfinite(r) else float(r),
            "cost": d.cost, "wait": d.wait, "seq": d.seq}


def supply_out(s: Supply) -> dict[str, Any]:
    return {"campaign": s.campaign, "time": s.time, "credits": fin(s.credits),
            "service_class": s.service_class,
            "dims": {k: {"free": v.free, "reclaimable": v.reclaimable, "capacity": v.capacity,
                         "congestion": fin(v.congestion) or 0.0,
                         "multiplier": fin(v.multiplier) or 0.0,
                         "tokens": fin(v.tokens), "bucket": fin(v.bucket), "held": v.held,
                         "ceiling": v.ceiling, "price": dict(v.price),
                         "wait": {p: fin(w) for p, w in v.wait.items()}}
                     for k, v in s.dims.items()}}


def quote_out(q: Quote) -> dict[str, Any]:
    return {"sizes": [int(x) for x in q.sizes], "durations": [float(x) for x in q.durations],
            "cost": q.cost.tolist(), "path": q.path.tolist(),
            "wait": [[fin(x) for x in row] for row in q.wait.tolist()],
            "grantable": q.grantable.tolist(), "reason": q.reason.tolist()}


def consumption_out(c: Consumption) -> dict[str, Any]:
    return {"campaign": c.campaign, "dim": c.dim, "requested": c.requested,
            "allowed": c.allowed, "retry_after": fin(c.retry_after), "reason": c.reason,
            "cost": c.cost, "seq": c.seq}
