"""The ``bursar serve --config`` file: pydantic models, TOML or JSON by suffix.

Every table is closed (``extra="forbid"``): a key the model does not know is an error
naming its dotted path (``pool.slots_per_nodes: unknown key``), never a new resource
dimension or a silently ignored option. Numbers are checked against the ranges of
:mod:`bursarcore.units`, the same constants the broker and the HTTP schema use, so a file
that validates is one the broker can represent; the rules that relate fields (sustained >=
guaranteed, a slot map summing to the capacity, an envelope's class in the class table)
are then checked by building the broker itself on a scratch clock, so the file and the
library cannot disagree. ``docs/config.md`` documents every field;
``tests/service/test_config.py`` fails when a field is missing there.

The file's shape differs from the broker's constructor arguments in one place: held
dimensions go under ``pool.capacity`` (``[pool.capacity] gpu = 512``) rather than beside
the pool's options, which is what lets an unknown pool key be refused.
:meth:`ServeConfig.broker_config` gives the constructor form
(:func:`~bursarcore.service.core.build_broker`), :func:`file_form` the reverse.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import re
import tomllib
from typing import Annotated, Any, Literal, Mapping

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from .. import units as U
from ..admission.classes import DEFAULT_CLASSES
from .models import NAME
from .nodes import NodePath

__all__ = ["ServeConfig", "ServerConfig", "MetricsConfig", "PoolConfig", "ClassConfig",
           "CongestionConfig", "EnvelopeConfig", "ConfigError", "read_config", "file_form",
           "parse", "problems", "MODELS"]



def _not_nan(x: object) -> object:
    # before the range check, which would say "must be >= 0" of a NaN
    if isinstance(x, float) and math.isnan(x):
        raise ValueError("must not be NaN")
    return x


Name = Annotated[str, Field(min_length=1, max_length=128, pattern=NAME)]
HeldUnits = Annotated[int, Field(ge=0, le=U.MAX_UNITS)]
Rate = Annotated[float, Field(gt=0, le=U.MAX_AMOUNT)]
Amount = Annotated[float, Field(ge=0, le=U.MAX_AMOUNT)]
# JSON has no infinity and TOML no null: unlimited is ``null`` (JSON) or ``inf`` (TOML,
# or JSON's Infinity); a finite value keeps its range
Unlimited = Annotated[float, Field(ge=0, allow_inf_nan=True),
                      BeforeValidator(_not_nan)] | None
MAX_DIMS = 64


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False,
                              validate_default=False)


class PoolConfig(_Closed):
    """The pool: held dimensions with their capacity, flow dimensions with their rate."""

    capacity: Annotated[dict[Name, HeldUnits], Field(min_length=1, max_length=MAX_DIMS)] = \
        Field(default_factory=lambda: {"gpu": 64},
              description="held dimension -> whole units (0 for a pool fed by pilots)")
    flow: Annotated[dict[Name, Rate], Field(max_length=MAX_DIMS)] = Field(
        default_factory=dict, description="flow dimension -> units per second (> 0)")
    slots_per_node: Annotated[int, Field(ge=1, le=U.MAX_UNITS)] = Field(
        8, description="default slot map: nodes of this many slots")
    slots: dict[Name, dict[Name, Annotated[int, Field(ge=0, le=U.MAX_UNITS)]]] = Field(
        default_factory=dict, description="dimension -> {node: slots}, summing to the capacity")
    warm_headroom: dict[Name, HeldUnits] = Field(
        default_factory=dict, description="dimension -> units kept free of opportunistic leases")

    @model_validator(mode="after")
    def _dims(self) -> "PoolConfig":
        for d in self.flow:
            if d in self.capacity:
                raise ValueError(f"flow.{d}: is already a held dimension")
        for key in ("slots", "warm_headroom"):
            for d in getattr(self, key):
                if d not in self.capacity:
                    raise ValueError(f"{key}.{d}: names no held dimension of pool.capacity")
        for d, nodes in self.slots.items():
            if sum(nodes.values()) != self.capacity[d]:
                raise ValueError(f"slots.{d}: must sum to the capacity {self.capacity[d]} "
                                 f"(got {sum(nodes.values())})")
        for d, h in self.warm_headroom.items():
            if self.capacity[d] and h > self.capacity[d]:
                raise ValueError(f"warm_headroom.{d}: must be <= the capacity "
                                 f"{self.capacity[d]} (got {h})")
        return self


class ClassConfig(_Closed):
    """A row of the service-class table (SPEC §7)."""

    name: Name
    rank: Annotated[int, Field(ge=0, le=1 << 30)]
    multiplier: Annotated[float, Field(ge=0, le=U.MAX_MULTIPLIER)]
    congestion_priced: bool = True
    preemptible: bool = False
    grace: Annotated[float, Field(ge=0, le=U.MAX_DURATION)] = 0.0
    free_when_broke: bool = False

    @model_validator(mode="after")
    def _grace(self) -> "ClassConfig":
        if self.preemptible and self.grace <= 0:
            raise ValueError("grace: must be > 0 for a preemptible class")
        return self


class CongestionConfig(_Closed):
    """The congestion index's window and its price steps (SPEC §7)."""

    window: Annotated[float, Field(gt=0, le=U.MAX_DURATION)] = 60.0
    bins: Annotated[int, Field(ge=1, le=3600)] = 60
    thresholds: Annotated[list[Annotated[float, Field(ge=0, le=1e6)]],
                          Field(min_length=3, max_length=3)] = [0.5, 1.0, 2.0]
    multipliers: Annotated[list[Annotated[float, Field(ge=0, le=U.MAX_MULTIPLIER)]],
                           Field(min_length=4, max_length=4)] = [1.0, 1.5, 2.25, 3.0]

    @model_validator(mode="after")
    def _increasing(self) -> "CongestionConfig":
        if self.thresholds != sorted(self.thresholds):
            raise ValueError("thresholds: must be increasing")
        return self


class EnvelopeConfig(_Closed):
    """A campaign's envelope (SPEC §3); ``credits`` or a ``burst`` value unlimited is
    ``null`` in JSON, ``inf`` in TOML."""

    credits: Unlimited
    service_class: Name = "agent-burst"
    guaranteed: Annotated[dict[Name, Amount], Field(max_length=MAX_DIMS)] = Field(
        default_factory=dict)
    sustained: Annotated[dict[Name, Amount], Field(max_length=MAX_DIMS)] = Field(
        default_factory=dict)
    ceiling: Annotated[dict[Name, Amount], Field(max_length=MAX_DIMS)] = Field(
        default_factory=dict)
    burst: Annotated[dict[Name, Unlimited], Field(max_length=MAX_DIMS)] = Field(
        default_factory=dict)
    share: Annotated[float, Field(gt=0, le=U.MAX_AMOUNT)] | None = None
    borrow_limit: Annotated[dict[Name, Amount], Field(max_length=MAX_DIMS)] = Field(
        default_factory=dict)
    lend_limit: Annotated[dict[Name, Unlimited], Field(max_length=MAX_DIMS)] = Field(
        default_factory=dict)

    @model_validator(mode="after")
    def _finite_ranges(self) -> "EnvelopeConfig":
        if self.credits is not None and math.isfinite(self.credits) \
                and self.credits > U.MAX_CREDITS:
            raise ValueError(f"credits: must be <= {U.MAX_CREDITS:g} or unlimited "
                             f"(got {self.credits:g})")
        for d, v in self.burst.items():
            if v is not None and math.isfinite(v) and v > U.MAX_AMOUNT:
                raise ValueError(f"burst.{d}: must be <= {U.MAX_AMOUNT:g} or unlimited")
        return self

    def to_broker(self) -> dict[str, Any]:
        d = self.model_dump(exclude_none=False)
        d["credits"] = None if self.credits is None or math.isinf(self.credits) else self.credits
        d["burst"] = {k: (None if v is None or math.isinf(v) else v)
                      for k, v in self.burst.items()}
        if d["share"] is None:
            del d["share"]
        for f in ("borrow_limit", "lend_limit"):     # (SPEC §14.8) only when set
            if not d[f]:
                del d[f]
        if "lend_limit" in d:
            d["lend_limit"] = {k: (None if v is None or math.isinf(v) else v)
                               for k, v in self.lend_limit.items()}
        return d


Seconds = Annotated[float, Field(ge=0, le=86400)]
Count = Annotated[int, Field(ge=0, le=1 << 31)]


class ServerConfig(_Closed):
    """The server's own settings; a command-line flag given explicitly overrides its key."""

    host: Annotated[str, Field(min_length=1, max_length=255)] = "127.0.0.1"
    port: Annotated[int, Field(ge=0, le=65535)] = 8000
    journal: str | None = None
    tokens: str | None = None
    synchronous: Literal["NORMAL", "FULL", "EXTRA"] = "FULL"
    rate: Annotated[float, Field(ge=0, le=1e6)] = 100.0
    burst: Annotated[float, Field(ge=0, le=1e9)] = 200.0
    tenant_rate: Annotated[float, Field(ge=0, le=1e6)] = 1000.0
    tenant_burst: Annotated[float, Field(ge=0, le=1e9)] = 2000.0
    auth_fail_rate: Annotated[float, Field(ge=0, le=1e6)] = 10.0
    max_longpoll: Annotated[float, Field(ge=0, le=86400)] = 60.0
    max_body: Annotated[int, Field(ge=1024, le=1 << 30)] = 1 << 20
    keep_alive: Seconds = 5.0
    request_timeout: Seconds = 10.0
    max_connections: Count = 2048
    limit_concurrency: Count = 1024
    commit_timeout: Seconds = 30.0
    tick: Annotated[float, Field(gt=0, le=3600)] = 0.5
    backend: Literal["compiled", "reference"] | None = None
    log_level: Literal["critical", "error", "warning", "info", "debug"] = "info"
    log_format: Literal["text", "json"] = "text"
    access_log: bool = False


class MetricsConfig(_Closed):
    """``GET /metrics`` (Prometheus text format)."""

    campaigns: Annotated[int, Field(ge=0, le=1000)] = 20
    require_token: bool = True


class ServeConfig(_Closed):
    """The whole file. ``pool``, ``classes``, ``congestion``, ``price``, ``ttl``,
    ``half_life``, ``enforcement`` and ``borrow_grace`` make a new broker (``--init``; a replayed journal
    keeps its own); ``campaigns`` are registered when missing from the journal."""

    pool: PoolConfig | None = None
    classes: Annotated[list[ClassConfig], Field(min_length=1, max_length=64)] | None = None
    congestion: CongestionConfig | None = None
    price: Annotated[dict[Name, Annotated[float, Field(ge=0, le=U.MAX_PRICE)]],
                     Field(max_length=2 * MAX_DIMS)] = Field(default_factory=dict)
    ttl: Annotated[float, Field(gt=0, le=U.MAX_TTL)] = 900.0
    half_life: Annotated[float, Field(gt=0, le=U.MAX_DURATION)] = 600.0
    enforcement: Literal["prepaid", "instant"] = "prepaid"
    borrow_grace: Annotated[float, Field(gt=0, le=U.MAX_DURATION)] = 60.0
    campaigns: dict[NodePath, EnvelopeConfig] = Field(default_factory=dict)
    server: ServerConfig = Field(default_factory=ServerConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)

    @model_validator(mode="after")
    def _names(self) -> "ServeConfig":
        classes = self.classes if self.classes is not None else DEFAULT_CLASSES
        names = [c.name for c in classes]
        for i, n in enumerate(names):
            if n in names[:i]:
                raise ValueError(f"classes[{i}].name: {n!r} is already a class")
        for camp, env in self.campaigns.items():
            if env.service_class not in names:
                raise ValueError(f"campaigns.{camp}.service_class: must be one of {names}")
        if self.pool is not None:
            dims = set(self.pool.capacity) | set(self.pool.flow)
            for d in self.price:
                if d not in dims:
                    raise ValueError(f"price.{d}: names no dimension of the pool")
        return self

    def broker_config(self) -> dict[str, Any]:
        """The constructor form :func:`~bursarcore.service.core.build_broker` takes; keys
        left out of the file stay out (the broker's own defaults apply)."""
        given = self.model_fields_set
        out: dict[str, Any] = {}
        if self.pool is not None:
            p = self.pool
            out["pool"] = dict(p.capacity)
            for k in ("flow", "slots_per_node", "warm_headroom"):
                if k in p.model_fields_set:
                    out["pool"][k] = getattr(p, k)
            if p.slots:
                out["pool"]["slots"] = {d: [[n, k] for n, k in m.items()]
                                        for d, m in p.slots.items()}
        if self.classes is not None:
            out["classes"] = [c.model_dump() for c in self.classes]
        if self.congestion is not None:
            out["congestion"] = self.congestion.model_dump()
        for k in ("price", "ttl", "half_life", "enforcement", "borrow_grace"):
            if k in given:
                out[k] = getattr(self, k)
        if self.campaigns:
            out["campaigns"] = {n: e.to_broker() for n, e in self.campaigns.items()}
        return out

    def summary(self) -> str:
        """One line: what the file configures."""
        parts = []
        if self.pool is not None:
            held = ", ".join(f"{d}={c}" for d, c in self.pool.capacity.items())
            flow = "".join(f", {d}={r:g}/s" for d, r in self.pool.flow.items())
            parts.append(f"pool {held}{flow}")
        else:
            parts.append("no pool (the journal's)")
        parts.append(f"{len(self.classes) if self.classes is not None else 'default'} classes")
        parts.append(f"{len(self.campaigns)} campaigns")
        s = self.server
        parts.append(f"server {s.host}:{s.port}")
        parts.append(f"journal {s.journal or 'from the command line'}")
        return "; ".join(parts)


#: every model of the file, the table it documents (for docs/config.md and its test)
MODELS: dict[str, type[BaseModel]] = {
    "": ServeConfig, "pool": PoolConfig, "classes[]": ClassConfig,
    "congestion": CongestionConfig, "campaigns.<name>": EnvelopeConfig,
    "server": ServerConfig, "metrics": MetricsConfig,
}


class ConfigError(ValueError):
    """The file could not be read or does not validate; ``problems`` are lines of
    ``dotted.path: rule``, one per mistake."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def _loc(parts: tuple) -> str:
    out = ""
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        elif p in ("function-after", "float", "none", "nullable", "constrained-float"):
            continue
        else:
            out += ("." if out else "") + str(p)
    return out


_RULES = {
    "dict_type": "must be a table (an object)", "model_type": "must be a table (an object)",
    "model_attributes_type": "must be a table (an object)", "list_type": "must be an array",
    "int_type": "must be a whole number", "int_from_float": "must be a whole number",
    "float_type": "must be a number", "bool_type": "must be true or false",
    "string_type": "must be a string", "finite_number": "must be finite",
    "greater_than_equal": "must be >= {ge}", "less_than_equal": "must be <= {le}",
    "greater_than": "must be > {gt}", "less_than": "must be < {lt}",
    "string_pattern_mismatch": "must be a name: letters, digits and ._:@+- (not first); a "
                               "campaign is a path of at most 8 such names joined by '/'",
    "too_short": "must have at least {min_length} item(s)",
    "too_long": "must have at most {max_length} item(s)",
    "string_too_short": "must not be empty", "string_too_long": "too long",
}


def _rule(err: Any) -> str:
    """The rule an error broke, in the words of the file (tables, arrays, numbers)."""
    if err["type"] == "literal_error":
        return "must be one of " + err["ctx"]["expected"].replace("'", '"')
    text = _RULES.get(err["type"])
    if text is None:
        return err["msg"][0].lower() + err["msg"][1:]
    ctx = {k: (f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else f"{v:g}"
               if isinstance(v, float) else v) for k, v in (err.get("ctx") or {}).items()}
    try:
        return text.format(**ctx)
    except (KeyError, ValueError):
        return text


def problems(e: ValidationError) -> list[str]:
    """Each error of ``e`` as one ``dotted.path: rule`` line, in the file's words."""
    lines: list[str] = []
    for err in e.errors(include_url=False):
        # a union of number and null reports each branch: the number's rule is the one
        loc = tuple(p for p in err["loc"] if p not in ("float", "none", "int"))
        path = _loc(loc)
        if err["type"] == "extra_forbidden":
            rule = "unknown key"
            if len(loc) == 2 and loc[0] == "pool":
                near = difflib.get_close_matches(str(loc[1]), PoolConfig.model_fields, 1, 0.8)
                rule += (f" (did you mean {near[0]!r}?)" if near else
                         f" (a held dimension goes under pool.capacity: "
                         f"pool.capacity.{loc[1]})")
        elif err["type"] == "missing":
            rule = "required key is missing"
        elif err["type"] == "value_error":
            rule = str(err["ctx"]["error"]) if "ctx" in err else err["msg"]
            # a model's cross-field rule names its field first: "slots.gpu: must ..."
            head, _, rest = rule.partition(": ")
            if rest and re.fullmatch(r"[\w.\[\]<>:@+-]+", head):
                path = f"{path}.{head}" if path else head
                rule = rest
        else:
            got = err.get("input")
            shown = "" if isinstance(got, (dict, list)) else f" (got {got!r:.60})"
            rule = _rule(err) + shown
        line = f"{path or '(top level)'}: {rule}"
        if line not in lines:
            lines.append(line)
    return lines


def parse(data: object) -> ServeConfig:
    """Validate an already-read document; :class:`ConfigError` lists every mistake."""
    if not isinstance(data, Mapping):
        raise ConfigError([f"(top level): must be a table/object (got {type(data).__name__})"])
    try:
        cfg = ServeConfig.model_validate(dict(data))
    except ValidationError as e:
        raise ConfigError(problems(e)) from None
    _check_with_the_broker(cfg)
    return cfg


def _check_with_the_broker(cfg: ServeConfig) -> None:
    """Build the broker the file describes (scratch clock, no journal) and register its
    campaigns: the library's own cross-field rules, reported at the dotted path."""
    from ..clock import ManualClock
    from ..errors import InvalidArgument
    from .core import build_broker, envelope_from_json

    bc = cfg.broker_config()
    where = ""
    try:
        broker = build_broker(bc, ManualClock(0.0)) if "pool" in bc else None
        for name, env in (bc.get("campaigns") or {}).items():
            where = f"campaigns.{name}"
            envelope = envelope_from_json(env, where)
            if broker is not None:
                broker.register(name, envelope)
    except InvalidArgument as e:
        field = re.sub(r"\[([^\]\d][^\]]*)\]", r".\1", e.field)
        if where and not field.startswith(where):
            field = f"{where}.{field}"
        got = "" if e.value is None else f" (got {repr(e.value)[:60]})"
        raise ConfigError([f"{field}: {e.rule}{got}"]) from None


def read_config(path: str | os.PathLike) -> ServeConfig:
    """Read and validate the file at ``path``: TOML for ``.toml``, JSON for ``.json`` (and
    any other suffix). :class:`ConfigError` on any mistake; nothing else is touched."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise ConfigError([f"cannot read it: {e.strerror or e}"]) from None
    if path.endswith(".toml"):
        try:
            data: object = tomllib.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
            raise ConfigError([f"not valid TOML: {e}"]) from None
    else:
        try:
            data = json.loads(raw)
        except (UnicodeDecodeError, ValueError) as e:
            raise ConfigError([f"not valid JSON: {e}"]) from None
    return parse(data)


def file_form(config: Mapping[str, Any]) -> dict[str, Any]:
    """The file form of a constructor-form configuration (the inverse of
    :meth:`ServeConfig.broker_config`): held dimensions move under ``pool.capacity``,
    slot maps become ``{node: slots}`` tables."""
    out = json.loads(json.dumps(dict(config)))
    pool = out.get("pool")
    if isinstance(pool, dict) and "capacity" not in pool:
        options = {k: pool.pop(k) for k in ("flow", "slots", "slots_per_node", "warm_headroom")
                   if k in pool}
        if "slots" in options:
            options["slots"] = {d: {str(n): k for n, k in m} for d, m in options["slots"].items()}
        out["pool"] = {"capacity": pool, **options}
    return out
