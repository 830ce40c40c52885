"""Flow dimensions: throttle at source, as HTB/TBF do (SPEC §5). See docs/flow.md.

``FlowEngine(capacity, window=1.0, now=0.0)`` holds, per flow dimension (filesystem GB/s,
inference tokens/s — ``capacity`` maps each name to the facility's units per second), a
shared **facility** bucket, and per campaign and dimension a **guaranteed**, a
**sustained** and a **peak** bucket. Every operation takes ``now`` (float seconds, never
going backwards across the engine); inside, time is int64 ns and amounts int64 fixed point
(:mod:`bursarcore.units`), so every backend decides identically, bit for bit.

Operations
    ``add_campaign(guaranteed=, sustained=, ceiling=, burst=, now=None) -> int`` — mappings
    of dimension -> g, s, b (units/s) and B (units; ``inf`` for no bound), the envelope
    fields of SPEC §3. Unnamed dimensions get 0 (no access); within a dimension s defaults
    to g, b to s, B to 0, as in :class:`bursarcore.Envelope`. Refused (naming the field,
    e.g. ``guaranteed[fs]``, nothing changed) unless g ≤ s ≤ b and the guarantees of all
    campaigns fit the capacity. Buckets start full. May be called at any time: the
    facility bucket is settled at its old rate, then shrinks to capacity − Σg.
    ``consume(campaign, dim, amount, now) -> (allowed, retry_after)`` — ``dim`` a name or
    an index; ``allowed <= amount`` passes now; ``retry_after`` is 0.0 when all passed,
    else the seconds after which one call for the rest would pass (or, if the rest is more
    than the path can ever pass at once, as much of it as can), ``inf`` if never.
    ``consume_batch(campaigns, dims, amounts, now) -> (allowed, retry_after)`` — arrays
    (``dims``, ``amounts`` and ``now`` may be scalars; ``now`` non-decreasing); sequential
    semantics: identical to single calls in order.
    ``consume_fixed(campaigns, dims, amounts, now_ns) -> (allowed, retry_ns, bound)`` — the
    same on already converted, already validated int64 arrays (for the admission engine);
    ``retry_ns`` is :data:`NEVER` for never, ``bound`` indexes :data:`BOUND_NAMES` (which
    bucket held the rest back: sustained, peak or facility).
    ``tokens(now) -> dict`` — peek at every bucket; ``state`` / ``from_state`` / pickling.

The rule (SPEC §5): the guaranteed bucket (rate g, size g·window) serves first and needs
nothing else; the rest needs the sustained (rate s, size B), peak (rate b, size b·window)
and facility (rate capacity − Σg, size that · window) buckets at once, and debits all
three by the least they hold. What the guaranteed bucket serves is also charged to the
sustained and peak buckets as far as they hold tokens (never blocked by them), so s and b
bound the campaign's whole flow. Guarantees: a campaign within its guaranteed rate is
never throttled, whatever the others do (SPEC §11.9); over any interval T the facility
passes at most capacity·T + Σ bucket sizes, and a campaign at most max(g·window, B) + s·T
and b·window + b·T.

Bad input raises :class:`bursarcore.errors.InvalidArgument` naming the argument, before any
state changes. ``FlowEngine`` is the compiled class unless extensions are disabled
(``BURSARCORE_NO_EXTENSIONS=1``) or unavailable; :data:`FLOW_BACKENDS` has every usable one.
"""

from __future__ import annotations

from . import _backend
from .reference.flow import (BOUND_NAMES, CAMPAIGN_FIELDS, FACILITY_FIELDS, MAX_WAIT, NEVER)
from .reference.flow import FlowEngine as ReferenceFlowEngine

__all__ = ["FlowEngine", "ReferenceFlowEngine", "FLOW_BACKENDS", "BOUND_NAMES", "NEVER",
           "MAX_WAIT", "CAMPAIGN_FIELDS", "FACILITY_FIELDS"]

_ext = _backend.compiled("_flow")
FLOW_BACKENDS: dict[str, type] = {"reference": ReferenceFlowEngine}
if _ext is not None:
    FLOW_BACKENDS = {"compiled": _ext.FlowEngine, **FLOW_BACKENDS}
FlowEngine = _ext.FlowEngine if _ext is not None else ReferenceFlowEngine
