"""Columnar batches: ``POST /v1/batch/intents`` and ``POST /v1/batch/consume``.

A request carries one column per argument of :meth:`~bursarcore.Broker.admit_batch` (or
:meth:`~bursarcore.Broker.consume_batch`), as JSON lists or as MessagePack typed columns
(raw little-endian arrays, :mod:`bursarcore.service.wire`), and is answered in the same
form with one column per result. The columns go from the request body into numpy and on
to the broker's batch call without a Python object per item, and come back the same way.

Campaigns are named once per request: ``campaigns`` is the list of names the batch
touches and ``campaign`` a column of positions in that list (left out when the list has
one name). A campaign token may name only its own campaign; a name that is not the
token's answers 404 exactly as a name that does not exist. The operator may mix
campaigns.

Every check runs before the broker is called — the form of each column, its length, its
range, row by row — and a failure answers 422 naming the column and the first bad row
(``loc: ["body", "min_units", 17]``), so a bad request changes no state. The answer is
sent once every record the batch journaled is durable (:meth:`BrokerService.call`).
"""


from typing import Annotated, Any, Callable

import numpy as np
from fastapi import Depends, FastAPI, HTTPException, Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field

from .. import units as U
from ..admission.state import REASONS
from ..journal import records as J
from .auth import Principal
from .core import BrokerService
from .nodes import MAX_PATH
from .wire import JSON, MSGPACK, ColumnError, column, decode_body, encode_body, media_type_of

__all__ = ["install", "INTENT_FIELDS", "CONSUME_FIELDS", "OUTCOMES", "MAX_NAMES"]

#: the fields of a columnar intents request
INTENT_FIELDS = ("campaigns", "campaign", "min_units", "max_units", "duration", "dim",
                 "service_class", "ttl")
#: the fields of a columnar consumptions request
CONSUME_FIELDS = ("campaigns", "campaign", "dims", "dim", "amount")
#: outcome codes of :class:`~bursarcore.broker.BatchResult`
OUTCOMES = ("granted", "refused", "pending")
#: names at most in a request's ``campaigns`` or ``dims`` list
MAX_NAMES = 4096
_ACQUIRE, _CONSUME = J.OP["acquire"], J.OP["consume"]

# ---------------------------------------------------------------------------- schema
# The JSON form, for the OpenAPI document (requests are read by wire.py and the checks
# below, not by these models: no pydantic object per item).
_Name = Annotated[str, Field(min_length=1, max_length=MAX_PATH)]   # a node path
_Names = Annotated[list[_Name], Field(min_length=1, max_length=MAX_NAMES)]
_Codes = list[Annotated[int, Field(ge=0, lt=MAX_NAMES)]]
_UnitsCol = list[Annotated[int, Field(ge=1, le=U.MAX_UNITS)]]
_Dur = Annotated[float, Field(ge=U.MIN_DURATION, le=U.MAX_DURATION)]
_Amount = Annotated[float, Field(ge=0, le=U.MAX_AMOUNT)]


class _Doc(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)


class IntentColumnsIn(_Doc):
    """Intents as columns (JSON form). ``campaign[i]`` is a position in ``campaigns``."""

    campaigns: _Names
    campaign: _Codes | None = Field(None, description="positions in campaigns (default: "
                                    "all 0, when campaigns has one name)")
    min_units: _UnitsCol | None = Field(None, description="smallest useful grant per row "
                                        "(default: max_units)")
    max_units: Annotated[_UnitsCol, Field(min_length=1)]
    duration: _Dur | list[_Dur] = Field(description="seconds: one for the batch, or a column")
    dim: _Name | None = Field(None, description="held dimension (default: the pool's first)")
    service_class: _Name | None = Field(None, description="default: each campaign's own")
    ttl: Annotated[float, Field(gt=0, le=U.MAX_TTL)] | None = None


class IntentColumnsOut(BaseModel):
    """One column per result, row for row (JSON form)."""

    granted: list[int] = Field(description="units granted; 0 unless granted")
    reason: list[int] = Field(description="positions in reasons; 0: none")
    reasons: list[str]
    lease: list[int] = Field(description="lease ids; -1 if none")
    outcome: list[int] = Field(description="positions in outcomes")
    outcomes: list[str]
    intent: list[int] = Field(description="intent ids")
    cost: list[float] = Field(description="credits charged now (prepaid)")
    seq: list[int] = Field(description="each decision's journal record")
    time: float = Field(description="broker time of the decisions")


class ConsumeColumnsIn(_Doc):
    """Consumptions as columns (JSON form). ``dim[i]`` is a position in ``dims``."""

    campaigns: _Names
    campaign: _Codes | None = None
    dims: _Names = Field(description="flow dimensions")
    dim: _Codes | None = Field(None, description="positions in dims (default: all 0, "
                               "when dims has one name)")
    amount: Annotated[list[_Amount], Field(min_length=1)]


class ConsumeColumnsOut(BaseModel):
    allowed: list[float] = Field(description="units allowed now")
    retry_after: list[float | None] = Field(description="seconds until the rest may pass; "
                                            "0 when all passed, null never")
    reason: list[int]
    reasons: list[str]
    cost: list[float] = Field(description="credits charged (priced dimensions)")
    seq: list[int]
    time: float


def _body_doc(model: type[BaseModel]) -> dict[str, Any]:
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    binary = {**schema, "description": "the same fields as the JSON form; each numeric "
              "column may also be a typed column, a map {dtype, n, data} whose data (bin) "
              "holds n little-endian items of dtype (docs/service.md)"}
    return {"requestBody": {"required": True, "content": {JSON: {"schema": schema},
                                                           MSGPACK: {"schema": binary}}}}


def _answers(model: type[BaseModel], common: dict) -> dict:
    return {**common,
            200: {"model": model, "content": {MSGPACK: {"schema": {"type": "string",
                                                                   "format": "binary"}}},
                  "description": "the results, in the request's form"},
            413: {**common[422], "description": "body over max_batch_body bytes"},
            415: {**common[422], "description": "not application/json nor "
                                                "application/msgpack"}}


# ---------------------------------------------------------------------------- checks
def _bad(field: str, rule: str, row: int | None = None) -> RequestValidationError:
    loc: tuple = ("body", field) if row is None else ("body", field, row)
    return RequestValidationError([{"loc": loc, "msg": rule, "type": "invalid_argument"}])


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _range(a: np.ndarray, field: str, lo: float, hi: float, what: str = "") -> None:
    if a.shape[0]:
        bad = (a < lo) | (a > hi)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise _bad(field, f"must be {what}>= {_num(lo)} and <= {_num(hi)}", i)


def _names(doc: dict, field: str) -> list[str]:
    v = doc.get(field)
    if not isinstance(v, list) or not v:
        raise _bad(field, "must be a non-empty list of names")
    if len(v) > MAX_NAMES:
        raise _bad(field, f"must have at most {MAX_NAMES} names")
    for i, x in enumerate(v):
        if not isinstance(x, str) or not 1 <= len(x) <= MAX_PATH:
            raise _bad(field, f"must be a name (1 to {MAX_PATH} characters)", i)
    return v


def _codes(doc: dict, field: str, table: str, k: int, n: int) -> np.ndarray:
    """Positions in a name table, one per row; all 0 when left out and the table has one
    name."""
    if doc.get(field) is None:
        if k != 1:
            raise _bad(field, f"is required when {table} has more than one name")
        return np.zeros(n, np.int64)
    c = column(doc[field], field, "int", n=n)
    _range(c, field, 0, k - 1, f"a position in {table}: ")
    return c


class _Reader:
    """The checks both batch endpoints share, bound to one app."""

    def __init__(self, service: BrokerService, max_items: int) -> None:
        self.service, self.broker, self.max_items = service, service.broker, max_items

    def doc(self, request: Request, body: bytes, allowed: tuple[str, ...]) -> tuple[dict, str]:
        form = media_type_of(request.headers.get("content-type"))
        if form is None:
            raise HTTPException(415, f"Content-Type must be {JSON} or {MSGPACK}")
        try:
            doc = decode_body(body, form)
        except ColumnError as e:
            raise _bad("body", e.rule) from None
        extra = sorted(set(doc) - set(allowed), key=str)
        if extra:
            raise _bad(str(extra[0]), f"is not a field; the fields are {list(allowed)}")
        return doc, form

    def campaigns(self, doc: dict, p: Principal) -> np.ndarray:
        """The broker's index of each name in ``campaigns``; a name the token may not act
        for, or that is not registered, answers 404 (the same answer for both)."""
        names = _names(doc, "campaigns")
        lut = np.empty(len(names), np.int64)
        for i, name in enumerate(names):
            if not p.may_act_for(name) or name not in self.broker.envelopes:
                raise HTTPException(404, "campaign not found")
            lut[i] = self.broker.campaign_index(name)
        return lut

    def read(self, fn: Callable[[dict, Principal], dict[str, Any]], doc: dict,
             p: Principal) -> dict[str, Any]:
        """``fn(doc, p)``, a column that cannot be read answering 422 like any bad value."""
        try:
            return fn(doc, p)
        except ColumnError as e:
            raise _bad(e.field, e.rule, e.row) from None

    def count(self, n: int, field: str) -> None:
        if n < 1:
            raise _bad(field, "must have at least one item")
        if n > self.max_items:
            raise _bad(field, f"must have at most {self.max_items} items (max_batch_items)")

    def intents(self, doc: dict, p: Principal) -> dict[str, Any]:
        lut = self.campaigns(doc, p)
        if "max_units" not in doc:
            raise _bad("max_units", "is required")
        hi = column(doc["max_units"], "max_units", "int")
        n = hi.shape[0]
        self.count(n, "max_units")
        _range(hi, "max_units", 1, U.MAX_UNITS)
        if doc.get("min_units") is None:
            units = hi
        else:
            lo = column(doc["min_units"], "min_units", "int", n=n)
            _range(lo, "min_units", 1, U.MAX_UNITS)
            over = lo > hi
            if over.any():
                i = int(np.flatnonzero(over)[0])
                raise _bad("min_units", f"must be <= max_units[{i}] ({int(hi[i])})", i)
            units = np.stack([lo, hi], axis=1)
        codes = _codes(doc, "campaign", "campaigns", lut.shape[0], n)
        dur = doc.get("duration")
        if dur is None:
            raise _bad("duration", "is required")
        if isinstance(dur, (int, float)) and not isinstance(dur, bool):
            d = column([dur], "duration", "float")
            _range(d, "duration", U.MIN_DURATION, U.MAX_DURATION)
            durations: Any = float(d[0])
        else:
            durations = column(dur, "duration", "float", n=n)
            _range(durations, "duration", U.MIN_DURATION, U.MAX_DURATION)
        kw: dict[str, Any] = {}
        dim = doc.get("dim")
        if dim is not None:
            if dim not in self.broker.dims:
                raise _bad("dim", f"must be one of {self.broker.dims}")
            kw["dim"] = dim
        cls = doc.get("service_class")
        if cls is not None:
            names = [c.name for c in self.broker.classes]
            if cls not in names:
                raise _bad("service_class", f"must be one of {names}")
            kw["service_class"] = cls
        ttl = doc.get("ttl")
        if ttl is not None:
            if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) \
                    or not 0 < ttl <= U.MAX_TTL:
                raise _bad("ttl", f"must be a number > 0 and <= {U.MAX_TTL:g}")
            kw["ttl"] = float(ttl)
        return {"campaign_idx": lut[codes], "units_": units, "durations": durations, **kw}

    def consumptions(self, doc: dict, p: Principal) -> dict[str, Any]:
        lut = self.campaigns(doc, p)
        dims = _names(doc, "dims")
        flow = self.broker.flow_dims
        for i, d in enumerate(dims):
            if d not in flow:
                raise _bad("dims", f"must be a flow dimension, one of {flow}", i)
        if "amount" not in doc:
            raise _bad("amount", "is required")
        amt = column(doc["amount"], "amount", "float")
        n = amt.shape[0]
        self.count(n, "amount")
        _range(amt, "amount", 0, U.MAX_AMOUNT)
        codes = _codes(doc, "campaign", "campaigns", lut.shape[0], n)
        dcodes = _codes(doc, "dim", "dims", len(dims), n)
        dlut = np.array([flow.index(d) for d in dims], np.int64)
        return {"campaign_idx": lut[codes], "dims": dlut[dcodes], "amounts": amt}


def _by_row(rows: np.ndarray, op: int, n: int, first: int | None = None
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Cost (credits), reason code and seq of each item's journal record: the records of
    ``op`` the batch appended, placed by intent id (``first``: the batch's first) or, for
    consumptions, in order; -1 / NaN where a row has none. Reads only the fields needed
    (the records of expiries and other events in between are never copied)."""
    idx = np.flatnonzero(rows["op"] == op)
    cost = np.full(n, np.nan)
    reason = np.zeros(n, np.int8)
    seq = np.full(n, -1, np.int64)
    if first is not None:
        pos = rows["intent"][idx] - first
        ok = (pos >= 0) & (pos < n)
        if not ok.all():  # pragma: no cover - every item journals its own record
            pos, idx = pos[ok], idx[ok]
    elif idx.shape[0] == n:
        pos = np.arange(n)
    else:  # pragma: no cover - each consumption journals one record
        return cost, reason, seq
    cost[pos] = rows["cost"][idx] / 1e6
    reason[pos] = rows["reason"][idx]
    seq[pos] = rows["seq"][idx]
    return cost, reason, seq


def install(app: FastAPI, service: BrokerService, who: Callable[..., Any],
            charge: Callable[[Principal, int], None], *, max_items: int,
            common: dict) -> None:
    """Add the two columnar routes to ``app``; ``who`` is the app's authentication
    dependency, ``charge`` its rate-limit charge for a batch of n items."""
    reader = _Reader(service, max_items)
    broker, journal = service.broker, service.journal
    Who = Annotated[Principal, Depends(who)]

    def _answer(doc: dict[str, Any], form: str) -> Response:
        return Response(encode_body(doc, form), media_type=form)

    @app.post("/v1/batch/intents", response_model=None, tags=["batch"],
              openapi_extra=_body_doc(IntentColumnsIn),
              responses=_answers(IntentColumnsOut, common))
    async def batch_intents(request: Request, p: Who) -> Response:
        """Intents as columns, decided in order as :meth:`Broker.admit_batch` decides them
        (each as a single intent would be) and acknowledged together once durable."""
        doc, form = reader.doc(request, await request.body(), INTENT_FIELDS)
        args = reader.read(reader.intents, doc, p)
        n = args["campaign_idx"].shape[0]
        charge(p, n)

        def run() -> tuple:
            before = len(journal)
            res = broker.admit_batch(**args)
            # the batch's records (a view: records never change once appended), read
            # after the call so that nothing past the broker's own work can fail inside it
            return res, broker.clock.now(), journal.rows()[before:]

        res, now, rows = await service.call(run)
        cost, _, seq = _by_row(rows, _ACQUIRE, n, int(res.intent[0]) if n else 0)
        return _answer({"granted": res.granted, "reason": res.reason.astype(np.int8),
                        "reasons": list(REASONS), "lease": res.lease,
                        "outcome": res.outcome.astype(np.int8),
                        "outcomes": list(OUTCOMES), "intent": res.intent, "cost": cost,
                        "seq": seq, "time": now}, form)

    @app.post("/v1/batch/consume", response_model=None, tags=["batch"],
              openapi_extra=_body_doc(ConsumeColumnsIn),
              responses=_answers(ConsumeColumnsOut, common))
    async def batch_consume(request: Request, p: Who) -> Response:
        """Consumptions as columns, decided in order as :meth:`Broker.consume_batch`
        decides them and acknowledged together once durable."""
        doc, form = reader.doc(request, await request.body(), CONSUME_FIELDS)
        args = reader.read(reader.consumptions, doc, p)
        n = args["amounts"].shape[0]
        charge(p, n)

        def run() -> tuple:
            before = len(journal)
            allowed, retry = broker.consume_batch(**args)
            return allowed, retry, broker.clock.now(), journal.rows()[before:]

        allowed, retry, now, rows = await service.call(run)
        cost, reason, seq = _by_row(rows, _CONSUME, n)
        return _answer({"allowed": np.asarray(allowed, np.float64),
                        "retry_after": np.asarray(retry, np.float64), "reason": reason,
                        "reasons": list(REASONS), "cost": cost, "seq": seq, "time": now}, form)

