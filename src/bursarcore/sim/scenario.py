"""Scenarios are data: a TOML file, loaded with the standard library and validated here.

Every error is a :class:`ScenarioError` (an :class:`~bursarcore.errors.InvalidArgument`,
so also a ``ValueError``) whose ``field`` is the path of the offending value, e.g.
``campaigns[2].envelope.ceiling.gpu``, and whose ``rule`` says what was required. Envelope
rules (g ≤ s ≤ b, Σ g ≤ capacity) are checked by building the real
:class:`~bursarcore.Envelope` and :class:`~bursarcore.Pool`, so a scenario that loads is a
scenario the broker accepts.

The format (see ``sim/scenarios/default.toml`` and docs/simulator.md)::

    [scenario]  name, description, duration (s), seed, sample_every (s)
    [pool]      gpu = 512, warm_headroom = 0, [pool.flow] fs = 28.0, inference = 5000.0
    [broker]    enforcement, grace, ttl, half_life, journal, backend, [broker.price]
    [tasksets.NAME]   the task distribution shared by the science agents that name it
    [[nodes]]         name, class, credits, [nodes.envelope]: interior nodes of a tree of
                      envelopes (SPEC §14), no agent; names are paths (``astro/survey``)
    [[campaigns]]     name, agent, class, credits, [campaigns.envelope], [campaigns.behaviour]
                      (a campaign named ``astro/survey/agent-0`` is a leaf under a node)
    [[populations]]   count campaigns of the vectorised population agent (large runs)
    [facility]  how pilots of the local binding provide the pool's first dimension (SPEC §12):
                slots_per_node, nodes_per_pilot, walltime, start_delay, tick, launch,
                on_notice, drain_lead, drain_margin, [[facility.failures]] at, pilots
"""

from __future__ import annotations

import copy
import math
from math import gcd
import os
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Mapping

from ..admission.classes import DEFAULT_CLASSES
from ..admission.envelope import Envelope, Pool
from ..errors import InvalidArgument

__all__ = ["Scenario", "CampaignSpec", "NodeSpec", "PopulationSpec", "TaskSetSpec", "ScenarioError",
           "load_scenario", "parse_scenario", "scenario_path", "builtin_scenarios",
           "AGENTS", "AGENT_DEFAULTS", "FACILITY_DEFAULTS", "MAX_SIM_SECONDS", "MAX_SEED"]


MAX_SIM_SECONDS = 30 * 86400.0
"""The longest simulated run (thirty days): a scenario's duration, the demo's seconds."""
MAX_SEED = 2**63 - 1
"""Seeds are integers in ``[0, MAX_SEED]``."""


class ScenarioError(InvalidArgument):
    """A scenario broke a rule; ``field`` is the path of the value (``campaigns[1].name``)."""

    def __init__(self, field: str, rule: str, value: object = None, source: str | None = None):
        self.source = source
        super().__init__(field, rule, value)
        if source:
            self.args = (f"{source}: {self.args[0]}",)

    def __reduce__(self):
        return (type(self), (self.field, self.rule, self.value, self.source))


_CLASS_NAMES = tuple(c.name for c in DEFAULT_CLASSES)

# -- agent behaviours and their parameters (defaults; a scenario overrides any of them) ----
AGENT_DEFAULTS: dict[str, dict[str, Any]] = {
    # demands its ceiling from start to end, every `every` s, in leases of `lease` s; asks
    # `inference` tokens every second from `inference_start` (default: start) to end
    "storm": {"start": 3600.0, "end": 5400.0, "every": 1.0, "lease": 60.0,
              "inference": 2000.0, "inference_start": -1.0},
    # small latency-sensitive requests within its guarantee, Poisson arrivals
    "interactive": {"mean_interval": 30.0, "units": [4, 16], "duration": [30.0, 120.0],
                    "start": 0.0},
    # requests what its queue wants when it wants, fixed leases, FIFO, blind to I/O
    "naive": {"taskset": "science", "lease": 600.0, "min_units": 1},
    # reads supply and quotes; value-ranked; stages I/O before holding GPUs
    "adaptive": {"taskset": "science", "lease": 300.0, "plan_every": 30.0,
                 "prefetch": 120.0, "value_quantile": 0.5, "idle_grace": 30.0},
    # opportunistic filler: every `every` s takes free GPUs above `headroom`
    "backfill": {"headroom": 160, "every": 10.0, "lease": 300.0},
    # a standardized probe: asks exactly `size` GPUs every `every` s, holds them `hold` s
    "probe": {"size": 128, "every": 300.0, "start": 600.0, "hold": 30.0, "ttl": 1800.0},
    # idle until `start`, then asks for `units` GPUs (0: its guarantee) in `lease`-second
    # leases, firm, and keeps them (renewing) until `end` (0: the end of the run)
    "waker": {"start": 1800.0, "units": 0, "lease": 600.0, "end": 0.0},
}
AGENTS = tuple(AGENT_DEFAULTS)
_DEFAULT_CLASS = {"storm": "agent-burst", "interactive": "interactive", "naive": "agent-burst",
                  "adaptive": "agent-burst", "backfill": "opportunistic", "probe": "deadline",
                  "waker": "agent-burst"}

POPULATION_DEFAULTS: dict[str, Any] = {
    "arrival_rate": 1.0 / 600,   # jobs per second per campaign
    "job_gpus": [1, 16],         # uniform integer range
    "job_seconds": [120.0, 900.0],
    "io_per_gpu_second": 0.002,  # GB per GPU-second (flow dimension `fs`, when the pool has it)
    "lease": 300.0,
    "step": 10.0,
    "greedy_fraction": 0.5,      # share of campaigns that ignore supply (the rest read it)
}

# -- the facility: pilots of the local binding (simulated execution) feed the pool --------
FACILITY_DEFAULTS: dict[str, Any] = {
    "slots_per_node": 0,     # units of the pool's first dimension per node; 0: 8, or the
                             # largest divisor of the capacity below 8
    "nodes_per_pilot": 0,    # 0: at most 64 pilots of whole nodes
    "walltime": 0.0,         # s; 0: the pilots outlive the run (duration + 3600 s); given,
                             # the first pilots' walltimes are staggered over [w/2, w]
    "start_delay": 0.0,      # s a pilot submitted during the run waits in the queue
    "tick": 300.0,           # s between pool manager rounds (it also runs at its own events)
    "submit_rate": 1.0,      # pilot submissions per second at most (replacements)
    "launch": True,          # every active lease's work is launched (simulated) on its slots
    "launch_populations": False,   # ... population campaigns' too (arrays: ~5x slower)
    "on_notice": "ignore",   # simulated work at the notice signal: "ignore" or "exit"
    "drain_lead": -1.0,      # s before its walltime a pilot is drained; < 0: the manager's
    "drain_margin": 5.0,     # the drained leases' deadline, s before the walltime
}

TASKSET_DEFAULTS: dict[str, Any] = {
    "count": 3000,
    "arrival_window": 6000.0,      # arrivals uniform over [0, window)
    "gpus": [1, 2, 4, 8],
    "gpu_weights": [0.3, 0.3, 0.25, 0.15],
    "seconds_median": 300.0, "seconds_sigma": 0.6,
    "io_per_gpu_second": 0.05, "io_sigma": 1.0,     # GB per GPU-second, lognormal
    "value_sigma": 1.0,                              # value per GPU-second, lognormal
    "tokens_median": 400.0, "tokens_sigma": 0.5,     # inference tokens per task
    "seed_offset": 0,
}


@dataclass
class TaskSetSpec:
    name: str
    params: dict[str, Any]


@dataclass
class CampaignSpec:
    name: str
    agent: str
    service_class: str
    envelope: Envelope
    behaviour: dict[str, Any]
    index: int = -1


@dataclass
class NodeSpec:
    """An interior node of a tree of envelopes (SPEC §14): registered, never asks."""

    name: str
    service_class: str
    envelope: Envelope


@dataclass
class PopulationSpec:
    name: str
    count: int
    service_class: str
    envelope: Envelope
    behaviour: dict[str, Any]


@dataclass
class Scenario:
    """A validated scenario. ``raw`` keeps the parsed document (for the report)."""

    name: str
    description: str
    duration: float
    seed: int
    sample_every: float
    pool: Pool
    pool_spec: dict[str, Any]
    broker: dict[str, Any]
    tasksets: dict[str, TaskSetSpec]
    campaigns: list[CampaignSpec]
    populations: list[PopulationSpec] = field(default_factory=list)
    facility: dict[str, Any] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict)
    source: str = "<string>"
    nodes: list[NodeSpec] = field(default_factory=list)

    @property
    def is_tree(self) -> bool:
        """Some name is a path: the campaigns form a tree of envelopes (SPEC §14)."""
        return bool(self.nodes) or any("/" in c.name for c in self.campaigns)

    def campaign(self, name: str) -> CampaignSpec:
        for c in self.campaigns:
            if c.name == name:
                return c
        raise KeyError(name)

    def by_agent(self, agent: str) -> list[CampaignSpec]:
        return [c for c in self.campaigns if c.agent == agent]

    def with_changes(self, **changes: Any) -> "Scenario":
        """A copy with dotted-path overrides applied to the raw document and re-validated:
        ``sc.with_changes(**{"broker.grace": 30, "scenario.seed": 3})``."""
        raw = copy.deepcopy(self.raw)
        for path, value in changes.items():
            set_path(raw, path, value)
        return parse_scenario(raw, source=self.source)


def set_path(doc: dict, path: str, value: Any) -> None:
    """Set ``a.b[2].c`` in a parsed document (campaigns may be named: ``campaigns.storm.x``)."""
    parts = path.replace("]", "").replace("[", ".").split(".")
    cur: Any = doc
    for i, p in enumerate(parts[:-1]):
        if isinstance(cur, list):
            if p.isdigit():
                cur = cur[int(p)]
            else:
                match = [c for c in cur if isinstance(c, dict) and c.get("name") == p]
                if not match:
                    raise ScenarioError(".".join(parts[:i + 1]), "no such campaign", p)
                cur = match[0]
        else:
            cur = cur.setdefault(p, {})
    last = parts[-1]
    if value is None:
        cur.pop(last, None)
    else:
        cur[last] = value


# -- checking helpers ----------------------------------------------------------------------

class _Ctx:
    def __init__(self, source: str):
        self.source = source

    def err(self, path: str, rule: str, value: object = None) -> ScenarioError:
        return ScenarioError(path, rule, value, self.source)


def _table(ctx: _Ctx, doc: Any, path: str, allowed: tuple[str, ...] | None = None) -> dict:
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ctx.err(path, "must be a table", doc)
    if allowed is not None:
        for k in doc:
            if k not in allowed:
                raise ctx.err(f"{path}.{k}" if path else k,
                              f"unknown field; expected one of {', '.join(allowed)}", doc[k])
    return doc


def _num(ctx: _Ctx, v: Any, path: str, *, lo: float | None = 0.0, lo_open: bool = False,
         hi: float | None = None, allow_inf: bool = False, integer: bool = False) -> Any:
    if isinstance(v, str) and allow_inf and v.lower() in ("inf", "unlimited"):
        return math.inf
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ctx.err(path, "must be a number" + (" or \"unlimited\"" if allow_inf else ""), v)
    if math.isnan(v) or (math.isinf(v) and not allow_inf):
        raise ctx.err(path, "must be finite", v)
    if integer and not math.isinf(v) and v != int(v):
        raise ctx.err(path, "must be a whole number", v)
    if lo is not None and (v < lo or (lo_open and v == lo)):
        raise ctx.err(path, f"must be {'>' if lo_open else '>='} {lo:g}", v)
    if hi is not None and v > hi:
        raise ctx.err(path, f"must be <= {hi:g}", v)
    if integer and not math.isinf(v):
        return int(v)
    return float(v) if not integer else v


def _str(ctx: _Ctx, v: Any, path: str, choices: tuple[str, ...] | None = None) -> str:
    if not isinstance(v, str) or not v:
        raise ctx.err(path, "must be a non-empty string", v)
    if choices is not None and v not in choices:
        raise ctx.err(path, f"must be one of {', '.join(choices)}", v)
    return v


def _params(ctx: _Ctx, doc: Any, path: str, defaults: dict[str, Any]) -> dict[str, Any]:
    """Overlay ``doc`` on ``defaults``, checking each value against its default's type."""
    doc = _table(ctx, doc, path, tuple(defaults))
    out = copy.deepcopy(defaults)
    for k, v in doc.items():
        p = f"{path}.{k}"
        d = defaults[k]
        if isinstance(d, bool):
            if not isinstance(v, bool):
                raise ctx.err(p, "must be true or false", v)
            out[k] = v
        elif isinstance(d, str):
            out[k] = _str(ctx, v, p)
        elif isinstance(d, list):
            if not isinstance(v, list) or len(v) != len(d) and k not in ("gpus", "gpu_weights"):
                raise ctx.err(p, f"must be a list of {len(d)} numbers", v)
            if not v:
                raise ctx.err(p, "must not be empty", v)
            integer = all(isinstance(x, int) for x in d)
            out[k] = [_num(ctx, x, f"{p}[{i}]", integer=integer) for i, x in enumerate(v)]
        elif isinstance(d, int):
            out[k] = _num(ctx, v, p, integer=True, lo=-1 if k == "seed_offset" else 0)
        else:
            out[k] = _num(ctx, v, p, lo=None if k == "inference_start" else 0.0)
    return out


def _check_range(ctx: _Ctx, params: dict, key: str, path: str) -> None:
    lo, hi = params[key]
    if lo > hi:
        raise ctx.err(f"{path}.{key}", "needs [min, max] with min <= max", params[key])


def _envelope(ctx: _Ctx, doc: Any, path: str, credits: float, cls: str,
              share: float | None) -> Envelope:
    keys = ("guaranteed", "sustained", "ceiling", "burst", "borrow_limit", "lend_limit")
    doc = _table(ctx, doc, path, keys)
    maps: dict[str, dict[str, float]] = {}
    for key in keys:
        m = _table(ctx, doc.get(key), f"{path}.{key}")
        maps[key] = {d: _num(ctx, v, f"{path}.{key}.{d}",
                             allow_inf=key in ("burst", "lend_limit"))
                     for d, v in m.items()}
    try:
        return Envelope(credits=credits, service_class=cls, share=share, **maps)
    except InvalidArgument as e:  # e.field is "ceiling[gpu]" or "credits"
        f = e.field.replace("[", ".").replace("]", "")
        raise ctx.err(f"{path}.{f}" if f not in ("credits", "share") else
                      f"{path.rsplit('.', 1)[0]}.{f}", e.rule, e.value) from None


# -- the loader ----------------------------------------------------------------------------

_TOP = ("scenario", "pool", "broker", "tasksets", "nodes", "campaigns", "populations",
        "facility")
MAX_TREE_DEPTH = 8
"""Levels of a tree of envelopes (SPEC §14.1)."""
_BROKER = ("enforcement", "grace", "ttl", "half_life", "journal", "backend", "price",
           "warm_headroom")


def parse_scenario(doc: Mapping[str, Any], source: str = "<string>") -> Scenario:
    """Validate a parsed TOML document (a dict) into a :class:`Scenario`."""
    ctx = _Ctx(source)
    doc = _table(ctx, dict(doc), "", _TOP)
    raw = copy.deepcopy(doc)

    sc = _table(ctx, doc.get("scenario"), "scenario",
                ("name", "description", "duration", "seed", "sample_every"))
    name = _str(ctx, sc.get("name", os.path.splitext(os.path.basename(source))[0] or "scenario"),
                "scenario.name")
    description = sc.get("description", "")
    if not isinstance(description, str):
        raise ctx.err("scenario.description", "must be a string", description)
    if "duration" not in sc:
        raise ctx.err("scenario.duration", "is required (simulated seconds)")
    duration = _num(ctx, sc["duration"], "scenario.duration", lo=0.0, lo_open=True,
                    hi=MAX_SIM_SECONDS)
    seed = _num(ctx, sc.get("seed", 7), "scenario.seed", integer=True, hi=MAX_SEED)
    sample_every = _num(ctx, sc.get("sample_every", 10.0), "scenario.sample_every", lo=0.0,
                        lo_open=True, hi=duration)

    # pool
    pd = _table(ctx, doc.get("pool"), "pool")
    if not pd:
        raise ctx.err("pool", "is required, e.g. [pool] gpu = 512")
    held, flow, headroom = {}, {}, {}
    for k, v in pd.items():
        if k == "flow":
            for fd, rate in _table(ctx, v, "pool.flow").items():
                flow[fd] = _num(ctx, rate, f"pool.flow.{fd}", lo=0.0, lo_open=True)
        elif k == "warm_headroom":
            if isinstance(v, dict):
                for hd, h in v.items():
                    headroom[hd] = _num(ctx, h, f"pool.warm_headroom.{hd}", integer=True)
            else:
                headroom["__first__"] = _num(ctx, v, "pool.warm_headroom", integer=True)
        else:
            held[k] = _num(ctx, v, f"pool.{k}", lo=1, integer=True, hi=float(1 << 40))
    if not held:
        raise ctx.err("pool", "needs at least one held dimension, e.g. gpu = 512")
    first = next(iter(held))
    if "__first__" in headroom:
        headroom[first] = headroom.pop("__first__")
    for hd, h in headroom.items():
        if hd not in held:
            raise ctx.err(f"pool.warm_headroom.{hd}", "names a dimension the pool lacks", hd)
        if h > held[hd]:
            raise ctx.err(f"pool.warm_headroom.{hd}", f"must be <= the capacity {held[hd]}", h)
    pool = Pool(flow=flow or None, warm_headroom=headroom or None, **held)

    # broker
    bd = _table(ctx, doc.get("broker"), "broker", _BROKER)
    broker: dict[str, Any] = {
        "enforcement": _str(ctx, bd.get("enforcement", "prepaid"), "broker.enforcement",
                            ("prepaid", "instant")),
        "grace": _num(ctx, bd.get("grace", 60.0), "broker.grace", lo=0.0, lo_open=True,
                      hi=86400.0),
        "ttl": _num(ctx, bd.get("ttl", 900.0), "broker.ttl", lo=0.0, lo_open=True),
        "half_life": _num(ctx, bd.get("half_life", 600.0), "broker.half_life", lo=0.0,
                          lo_open=True),
        "journal": bd.get("journal", True),
        "backend": bd.get("backend"),
        "price": {},
    }
    if not isinstance(broker["journal"], bool):
        raise ctx.err("broker.journal", "must be true or false", broker["journal"])
    if broker["backend"] is not None:
        _str(ctx, broker["backend"], "broker.backend", ("compiled", "reference"))
    for d, p in _table(ctx, bd.get("price"), "broker.price").items():
        if d not in held and d not in flow:
            raise ctx.err(f"broker.price.{d}", "names a dimension the pool lacks", d)
        broker["price"][d] = _num(ctx, p, f"broker.price.{d}")
    if "warm_headroom" in bd:
        raise ctx.err("broker.warm_headroom", "belongs in [pool] (pool.warm_headroom)")

    facility = _facility(ctx, doc.get("facility"), held[first], duration)

    # task sets
    tasksets = {}
    for tname, tdoc in _table(ctx, doc.get("tasksets"), "tasksets").items():
        p = f"tasksets.{tname}"
        params = _params(ctx, tdoc, p, TASKSET_DEFAULTS)
        if params["count"] < 1:
            raise ctx.err(f"{p}.count", "must be >= 1", params["count"])
        if len(params["gpus"]) != len(params["gpu_weights"]):
            raise ctx.err(f"{p}.gpu_weights", f"needs one weight per entry of gpus "
                          f"({len(params['gpus'])})", params["gpu_weights"])
        if sum(params["gpu_weights"]) <= 0:
            raise ctx.err(f"{p}.gpu_weights", "must sum to > 0", params["gpu_weights"])
        if min(params["gpus"]) < 1:
            raise ctx.err(f"{p}.gpus", "every entry must be >= 1", params["gpus"])
        for k in ("seconds_median", "tokens_median"):
            if params[k] <= 0:
                raise ctx.err(f"{p}.{k}", "must be > 0", params[k])
        tasksets[tname] = TaskSetSpec(tname, params)

    # interior nodes of a tree (SPEC §14): registered before every campaign, parents first
    seen: set[str] = set()
    total_g: dict[str, float] = {}
    tree_g: dict[str, Envelope] = {}          # every registered name -> its envelope
    ndocs = doc.get("nodes", [])
    if not isinstance(ndocs, list):
        raise ctx.err("nodes", "must be an array of tables ([[nodes]])", ndocs)
    nodes: list[NodeSpec] = []
    for i, nd in enumerate(ndocs):
        p = f"nodes[{i}]"
        nd = _table(ctx, nd, p, ("name", "class", "credits", "share", "envelope"))
        if "name" not in nd:
            raise ctx.err(f"{p}.name", "is required (a path: project or project/campaign)")
        nname = _str(ctx, nd["name"], f"{p}.name")
        _tree_name(ctx, nname, f"{p}.name", seen, tree_g)
        seen.add(nname)
        cls = _str(ctx, nd.get("class", "agent-burst"), f"{p}.class", _CLASS_NAMES)
        env = _node_envelope(ctx, nd, p, nname, cls, held, flow, total_g, tree_g)
        nodes.append(NodeSpec(nname, cls, env))

    # campaigns
    cdocs = doc.get("campaigns", [])
    if not isinstance(cdocs, list):
        raise ctx.err("campaigns", "must be an array of tables ([[campaigns]])", cdocs)
    campaigns: list[CampaignSpec] = []
    for i, cd in enumerate(cdocs):
        p = f"campaigns[{i}]"
        cd = _table(ctx, cd, p, ("name", "agent", "class", "credits", "share", "envelope",
                                 "behaviour"))
        if "name" not in cd:
            raise ctx.err(f"{p}.name", "is required")
        cname = _str(ctx, cd["name"], f"{p}.name")
        if cname in seen:
            raise ctx.err(f"{p}.name", "is already used by another campaign", cname)
        if "/" in cname:
            _tree_name(ctx, cname, f"{p}.name", seen, tree_g)
        seen.add(cname)
        if "agent" not in cd:
            raise ctx.err(f"{p}.agent", f"is required: one of {', '.join(AGENTS)}")
        agent = _str(ctx, cd["agent"], f"{p}.agent", AGENTS)
        cls = _str(ctx, cd.get("class", _DEFAULT_CLASS[agent]), f"{p}.class", _CLASS_NAMES)
        env = _node_envelope(ctx, cd, p, cname, cls, held, flow, total_g, tree_g)
        beh = _params(ctx, cd.get("behaviour"), f"{p}.behaviour", AGENT_DEFAULTS[agent])
        bp = f"{p}.behaviour"
        if agent == "interactive":
            _check_range(ctx, beh, "units", bp)
            _check_range(ctx, beh, "duration", bp)
            if beh["units"][0] < 1:
                raise ctx.err(f"{bp}.units", "must be >= 1", beh["units"])
            if beh["mean_interval"] <= 0:
                raise ctx.err(f"{bp}.mean_interval", "must be > 0", beh["mean_interval"])
        if agent == "storm" and beh["end"] < beh["start"]:
            raise ctx.err(f"{bp}.end", f"must be >= start ({beh['start']:g})", beh["end"])
        if agent in ("naive", "adaptive"):
            if beh["taskset"] not in tasksets:
                raise ctx.err(f"{bp}.taskset", f"names no [tasksets.{beh['taskset']}] table",
                              beh["taskset"])
            if not 0 <= beh.get("value_quantile", 0) < 1:
                raise ctx.err(f"{bp}.value_quantile", "must be in [0, 1)", beh["value_quantile"])
        if agent == "waker":
            units = beh["units"] or env.g(first)
            if units < 1:
                raise ctx.err(f"{bp}.units", "must be >= 1 (0 asks for the guarantee, which "
                              "is 0 here)", beh["units"])
            if units > env.b(first):
                raise ctx.err(f"{bp}.units", f"must be <= the campaign's ceiling "
                              f"({env.b(first):g})", units)
            if beh["end"] and beh["end"] < beh["start"]:
                raise ctx.err(f"{bp}.end", f"must be >= start ({beh['start']:g}), or 0",
                              beh["end"])
        if agent == "probe" and beh["size"] > env.b(first):
            raise ctx.err(f"{bp}.size", f"must be <= the campaign's ceiling ({env.b(first):g})",
                          beh["size"])
        for k in ("lease", "every", "plan_every", "hold"):
            if k in beh and beh[k] <= 0:
                raise ctx.err(f"{bp}.{k}", "must be > 0", beh[k])
        campaigns.append(CampaignSpec(cname, agent, cls, env, beh, index=i))

    # populations
    pdocs = doc.get("populations", [])
    if not isinstance(pdocs, list):
        raise ctx.err("populations", "must be an array of tables ([[populations]])", pdocs)
    populations: list[PopulationSpec] = []
    for i, pdoc in enumerate(pdocs):
        p = f"populations[{i}]"
        pdoc = _table(ctx, pdoc, p, ("name", "count", "class", "credits", "envelope",
                                     "behaviour"))
        pname = _str(ctx, pdoc.get("name", f"pop{i}"), f"{p}.name")
        if pname in seen:
            raise ctx.err(f"{p}.name", "is already used", pname)
        seen.add(pname)
        count = _num(ctx, pdoc.get("count", 0), f"{p}.count", lo=1, integer=True, hi=1e6)
        cls = _str(ctx, pdoc.get("class", "agent-burst"), f"{p}.class", _CLASS_NAMES)
        credits = _num(ctx, pdoc.get("credits", math.inf), f"{p}.credits", allow_inf=True)
        env = _envelope(ctx, pdoc.get("envelope"), f"{p}.envelope", credits, cls, None)
        for d in env.dims():
            if d not in held and d not in flow:
                raise ctx.err(f"{p}.envelope", f"names dimension {d!r} the pool lacks", d)
            total_g[d] = total_g.get(d, 0.0) + env.g(d) * count
            cap = held[d] if d in held else flow[d]
            if total_g[d] > cap:
                raise ctx.err(f"{p}.envelope.guaranteed.{d}", f"guarantees ({count} campaigns) "
                              f"would sum to {total_g[d]:g}, above the pool's {cap:g}",
                              env.g(d))
        beh = _params(ctx, pdoc.get("behaviour"), f"{p}.behaviour", POPULATION_DEFAULTS)
        _check_range(ctx, beh, "job_gpus", f"{p}.behaviour")
        _check_range(ctx, beh, "job_seconds", f"{p}.behaviour")
        if beh["job_gpus"][0] < 1:
            raise ctx.err(f"{p}.behaviour.job_gpus", "must be >= 1", beh["job_gpus"])
        if not 0 <= beh["greedy_fraction"] <= 1:
            raise ctx.err(f"{p}.behaviour.greedy_fraction", "must be in [0, 1]",
                          beh["greedy_fraction"])
        for k in ("lease", "step"):
            if beh[k] <= 0:
                raise ctx.err(f"{p}.behaviour.{k}", "must be > 0", beh[k])
        populations.append(PopulationSpec(pname, count, cls, env, beh))
    if not campaigns and not populations:
        raise ctx.err("campaigns", "a scenario needs at least one campaign or population")

    return Scenario(name=name, description=description, duration=duration, seed=seed,
                    sample_every=sample_every, pool=pool,
                    pool_spec={"held": held, "flow": flow, "warm_headroom": headroom},
                    broker=broker, tasksets=tasksets, campaigns=campaigns,
                    populations=populations, facility=facility, raw=raw, source=source,
                    nodes=nodes)


def _tree_name(ctx: _Ctx, name: str, path: str, seen: set[str],
               tree: dict[str, Envelope]) -> None:
    """A path names a node under a registered one (SPEC §14.1): no empty segment, at most
    :data:`MAX_TREE_DEPTH` levels, its parent declared before it (in ``[[nodes]]``)."""
    parts = name.split("/")
    if any(not x for x in parts):
        raise ctx.err(path, "a path must not have an empty segment", name)
    if len(parts) > MAX_TREE_DEPTH:
        raise ctx.err(path, f"a path has at most {MAX_TREE_DEPTH} levels", name)
    if name in seen:
        raise ctx.err(path, "is already used by another node", name)
    parent = name.rpartition("/")[0]
    if parent and parent not in tree:
        raise ctx.err(path, f"its parent {parent!r} must be declared first, in [[nodes]]",
                      name)


def _node_envelope(ctx: _Ctx, doc: dict, p: str, name: str, cls: str, held: dict,
                   flow: dict, total_g: dict[str, float],
                   tree: dict[str, Envelope]) -> Envelope:
    """The envelope of table ``p`` (a node or a campaign) of class ``cls``: its credits
    (required), share and envelope, its guarantees nested in the tree."""
    if "credits" not in doc:
        raise ctx.err(f"{p}.credits", "is required (a number or \"unlimited\")")
    credits = _num(ctx, doc["credits"], f"{p}.credits", allow_inf=True)
    share = None if "share" not in doc else _num(ctx, doc["share"], f"{p}.share", lo=0.0,
                                                 lo_open=True)
    env = _envelope(ctx, doc.get("envelope"), f"{p}.envelope", credits, cls, share)
    _tree_guarantees(ctx, name, env, f"{p}.envelope", held, flow, total_g, tree)
    return env


def _tree_guarantees(ctx: _Ctx, name: str, env: Envelope, path: str, held: dict,
                     flow: dict, total_g: dict[str, float],
                     tree: dict[str, Envelope]) -> None:
    """Guarantees nest (SPEC §14.1): a node's children's guarantees sum to at most its own,
    and the top-level nodes' to at most the pool's capacity (never overbooked)."""
    parent = name.rpartition("/")[0]
    for d in env.dims():
        if d not in held and d not in flow:
            raise ctx.err(path, f"names dimension {d!r} the pool lacks", d)
        g = env.g(d)
        if parent:
            sib = sum(e.g(d) for n, e in tree.items() if n.rpartition("/")[0] == parent)
            if sib + g > tree[parent].g(d):
                raise ctx.err(f"{path}.guaranteed.{d}", f"the children of {parent!r} would be "
                              f"guaranteed {sib + g:g}, above its own {tree[parent].g(d):g}",
                              g)
            continue
        total_g[d] = total_g.get(d, 0.0) + g
        cap = held[d] if d in held else flow[d]
        if total_g[d] > cap:
            raise ctx.err(f"{path}.guaranteed.{d}", f"guarantees would sum to "
                          f"{total_g[d]:g}, above the pool's {cap:g} (never overbooked)", g)
    tree[name] = env


def _facility(ctx: _Ctx, doc: Any, capacity: int, duration: float) -> dict[str, Any]:
    """``[facility]``: the pilot shape and the pool manager's settings, resolved (pilot
    count, nodes per pilot, walltime) so that the pilots sum to the pool's capacity."""
    doc = dict(_table(ctx, doc, "facility", tuple(FACILITY_DEFAULTS) + ("failures",)))
    failures_doc = doc.pop("failures", [])
    f = _params(ctx, doc, "facility", FACILITY_DEFAULTS)
    if f["on_notice"] not in ("ignore", "exit"):
        raise ctx.err("facility.on_notice", "must be one of ignore, exit", f["on_notice"])
    spn = f["slots_per_node"] or gcd(capacity, 8)
    if capacity % spn:
        raise ctx.err("facility.slots_per_node", f"must divide the pool's capacity {capacity}",
                      spn)
    nodes = capacity // spn
    npp = f["nodes_per_pilot"]
    if npp == 0:
        pilots = max(p for p in range(1, min(64, nodes) + 1) if nodes % p == 0)
        npp = nodes // pilots
    elif nodes % npp:
        raise ctx.err("facility.nodes_per_pilot", f"must divide the pool's {nodes} nodes of "
                      f"{spn}", npp)
    for k in ("tick", "submit_rate"):
        if f[k] <= 0:
            raise ctx.err(f"facility.{k}", "must be > 0", f[k])
    # walltime 0 stays 0: the simulator resolves it to its run's duration + 3600 s
    f.update(slots_per_node=spn, nodes_per_pilot=npp, pilots=nodes // npp)
    if not isinstance(failures_doc, list):
        raise ctx.err("facility.failures", "must be an array of tables ([[facility.failures]])",
                      failures_doc)
    failures = []
    for i, fd in enumerate(failures_doc):
        p = f"facility.failures[{i}]"
        fd = _table(ctx, fd, p, ("at", "pilots"))
        if "at" not in fd:
            raise ctx.err(f"{p}.at", "is required (simulated seconds)")
        at = _num(ctx, fd["at"], f"{p}.at", hi=duration)
        n = _num(ctx, fd.get("pilots", 1), f"{p}.pilots", lo=1, integer=True, hi=f["pilots"])
        failures.append({"at": at, "pilots": n})
    f["failures"] = sorted(failures, key=lambda x: x["at"])
    return f


def builtin_scenarios() -> list[str]:
    """Names of the scenarios shipped with the package (``default``, ``large``, ...)."""
    d = resources.files(__package__).joinpath("scenarios")
    return sorted(p.name[:-5] for p in d.iterdir() if p.name.endswith(".toml"))


def scenario_path(name_or_path: str | os.PathLike | None) -> str:
    """A file path for a scenario: an existing path, or the name of a shipped scenario."""
    if name_or_path is None:
        name_or_path = "default"
    s = os.fspath(name_or_path)
    if os.path.exists(s):
        return s
    stem = s[:-5] if s.endswith(".toml") else s
    if os.sep not in stem and stem in builtin_scenarios():
        return str(resources.files(__package__).joinpath("scenarios", stem + ".toml"))
    raise ScenarioError("scenario", f"no such file, nor a shipped scenario (one of "
                        f"{', '.join(builtin_scenarios())})", s)


def load_scenario(name_or_path: str | os.PathLike | None = None) -> Scenario:
    """Load and validate a scenario: a TOML file path or a shipped name (default:
    ``default``, SPEC §10's scenario)."""
    path = scenario_path(name_or_path)
    if os.path.isdir(path):
        raise ScenarioError("scenario", "is a directory, not a scenario file (.toml)", path)
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise ScenarioError("toml", f"not valid TOML: {e}", None, path) from None
    except UnicodeDecodeError as e:
        raise ScenarioError("toml", f"not valid TOML: not UTF-8 text (byte {e.start})", None,
                            path) from None
    except OSError as e:
        raise ScenarioError("scenario", f"cannot be read ({e.strerror})", path) from None
    return parse_scenario(doc, source=path)
