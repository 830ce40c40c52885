"""Journal records: one per decision (SPEC §9), columnar.

A record is one row of :data:`RECORD_DTYPE` plus an optional JSON ``payload`` (the
envelope of a ``register`` or a ``change``, the name of a ``remove``, the broker configuration of the ``config`` header). Times are
int ns, amounts are the engine's integers (tokens in unit·ns, credits in micro-credits),
so a journal replays bit for bit. :func:`to_dict` gives the float view people read.

Input records (``config``, ``register``, ``acquire``, ``release``, ``renew``, ``cancel``,
``advance``, ``consume``, ``add_nodes``, ``remove_nodes``, ``change``, ``remove``) drive :meth:`bursarcore.Broker.replay`; derived records
(``grant`` of a pending intent, ``refuse`` at TTL or deadline, ``preempt``, ``revoke``,
``expire``, ``activate``) are what the engine did on its own and are checked on replay.

The ``deadline`` of an ``acquire`` record is -1 when the intent has none; every deadline
is stored as is, negative ones included, except a deadline of exactly -1 ns, which is
stored as INT64_MIN (outside the +/-2**62 ns every time is validated to, so no real
deadline collides with it or with -1). Write it with :func:`deadline_field`, read it with
:func:`deadline_of`. (Journals written before this escape hold -1 for "none" too, and
read the same; there the -1 ns deadline was indistinguishable from none.) A ``preempt``
record's ``deadline`` is the revocation instant, always present, stored as is.

An ``acquire`` record names the level of a tree of envelopes whose rule decided it (SPEC
§14.2): ``level`` is the campaign index of the node of the path whose ceiling, bucket or
budget bound it (:func:`binding_rule` picks the rule; the node itself when its own limit is
the least, as always for a flat campaign) and ``level_figure`` that node's ceiling (units),
tokens (unit·ns) or credits left (micro-credits) before the decision; ``level`` is -1 when
no such rule decided (a grant of the whole request, capacity, a deadline) and in every other
record. The two fields come last: a journal written before them (SQLite rows of the shorter
:data:`RECORD_DTYPE_UNLEVELLED`, JSON lines without them) reads with ``level``
:data:`LEVEL_UNRECORDED`, which names no level and which replay does not compare.
"""

from __future__ import annotations

import json
import math
from operator import itemgetter
from typing import Any, Sequence

import numpy as np

from ..admission.state import LIMITS, REASONS   # the core's reason codes and rules, by code

__all__ = ["RECORD_DTYPE", "OPS", "OP", "INPUT_OPS", "OUTCOMES", "PATH_CODE", "REASONS",
           "LIMIT_FIELDS", "to_dict", "from_dict", "new_rows", "deadline_field", "deadline_of",
           "LEVEL_FIELDS", "LEVEL_UNRECORDED", "RECORD_DTYPE_UNLEVELLED", "from_unlevelled",
           "binding_rule", "level_of"]

OPS = ("config", "register", "acquire", "grant", "refuse", "preempt", "revoke", "expire",
       "activate", "release", "renew", "cancel", "advance", "consume", "add_nodes",
       "remove_nodes", "change", "remove")
OP = {name: i for i, name in enumerate(OPS)}
INPUT_OPS = frozenset(OP[o] for o in ("config", "register", "acquire", "release", "renew",
                                      "cancel", "advance", "consume", "add_nodes",
                                      "remove_nodes", "change", "remove"))
OUTCOMES = ("", "granted", "pending", "refused", "ok")
#: a granted record's ``path``: warm (free units), reclaim (after preemptions), borrow (free
#: units borrowed from siblings' idle guarantees, SPEC §14.8); 0 for no grant
PATH_CODE = {"warm": 1, "reclaim": 2, "borrow": 3}

RECORD_DTYPE = np.dtype([
    ("seq", "i8"), ("t", "i8"), ("op", "i1"), ("outcome", "i1"), ("reason", "i1"),
    ("path", "i1"), ("rank", "i1"), ("batch", "i1"), ("dim", "i2"), ("cls", "i2"),
    ("campaign", "i4"),
    # request
    ("nmin", "i8"), ("nmax", "i8"), ("dur", "i8"), ("max_spend", "i8"), ("deadline", "i8"),
    ("ttl", "i8"),
    # result
    ("units", "i8"), ("lease", "i8"), ("intent", "i8"), ("cost", "i8"),
    # rule inputs
    ("deficit", "f8"), ("tokens_before", "i8"), ("credits_before", "i8"), ("free", "i8"),
    ("unmet", "i8"),
    # the limit each rule with one set on the size, in the order a refusal names them
    *[(f"lim_{name}", "i8") for name in LIMITS],
    # state after
    ("tokens_after", "i8"), ("credits_after", "i8"), ("held_after", "i8"),
    # the level of a tree of envelopes whose rule bound the decision (SPEC §14.2): the
    # campaign index of that node, -1 when none did, and its figure for that rule
    ("level", "i8"), ("level_figure", "i8"),
])
LEVEL_FIELDS = ("level", "level_figure")
LEVEL_UNRECORDED = -2    # the level of a record written before records named one (no level)
# the records of journals written before they named the binding level: the same fields, in
# the same order, without LEVEL_FIELDS (the new fields come last, so an old record's bytes
# are a prefix of a new one's)
RECORD_DTYPE_UNLEVELLED = np.dtype([(f, RECORD_DTYPE.fields[f][0])  # type: ignore[index]
                                    for f in RECORD_DTYPE.names  # type: ignore[union-attr]
                                    if f not in LEVEL_FIELDS])
# a structured dtype always has both (numpy's stubs type them as optional)
assert RECORD_DTYPE.names is not None and RECORD_DTYPE.fields is not None
FIELDS: tuple[str, ...] = RECORD_DTYPE.names
LIMIT_FIELDS: tuple[str, ...] = tuple(f"lim_{name}" for name in LIMITS)
RECORD_FIELDS = RECORD_DTYPE.fields     # name -> (dtype, byte offset)
_NS = 1e9
_MICRO = 1e6


DEFAULTS: dict[str, int | float] = {f: 0 for f in FIELDS}
DEFAULTS.update({f: -1 for f in ("campaign", "dim", "cls", "lease", "intent", "max_spend",
                                 "deadline", "ttl", "level")})
DEFAULTS["deficit"] = math.nan

NO_DEADLINE = -1
DEADLINE_MINUS_1NS = -(1 << 63)   # INT64_MIN: how a deadline of exactly -1 ns is stored


def deadline_field(deadline: int | None) -> int:
    """An acquire record's ``deadline`` for a deadline in ns, or None (see the module doc)."""
    if deadline is None:
        return NO_DEADLINE
    return DEADLINE_MINUS_1NS if deadline == -1 else deadline


def deadline_of(field: int) -> int | None:
    """Inverse of :func:`deadline_field`."""
    if field == NO_DEADLINE:
        return None
    return -1 if field == DEADLINE_MINUS_1NS else field


_IN_ORDER = itemgetter(*FIELDS)


def as_tuple(fields: dict) -> tuple:
    """One record, from a dict of the fields that differ from :data:`DEFAULTS` (other
    keys are ignored)."""
    return _IN_ORDER({**DEFAULTS, **fields})


def new_rows(n: int) -> np.ndarray:
    """n blank records: -1 in ids and optional request fields, 0 elsewhere."""
    r = np.zeros(n, dtype=RECORD_DTYPE)
    for f in ("campaign", "dim", "cls", "lease", "intent", "max_spend", "deadline", "ttl",
              "level"):
        r[f] = -1
    r["deficit"] = np.nan
    return r


def from_unlevelled(old: np.ndarray) -> np.ndarray:
    """Records of the earlier layout (:data:`RECORD_DTYPE_UNLEVELLED`) as records of this
    one: every field kept, and no binding level (``level`` :data:`LEVEL_UNRECORDED`,
    ``level_figure`` 0; replay does not compare what was not recorded)."""
    rows = new_rows(old.shape[0])
    for f in RECORD_DTYPE_UNLEVELLED.names:  # type: ignore[union-attr]
        rows[f] = old[f]
    rows["level"] = LEVEL_UNRECORDED
    return rows


def binding_rule(outcome: str, reason: str, units: int, nmax: int,
                 lims: Sequence[int]) -> int:
    """The rule that decided a decision, as an index of ``LIMITS`` (-1: none): the rule a
    refusal or a pending intent names, or for a grant sized down (and a refusal naming no
    rule) the rule with the smallest limit (the first of equals, in ``LIMITS`` order); a
    grant of the whole request, or a reason that is not a rule (deadline, ttl...), has none.
    ``lims``: the record's ``lim_*``, in ``LIMITS`` order."""
    if outcome == "granted":
        if units >= nmax:
            return -1
    elif reason:
        return LIMITS.index(reason) if reason in LIMITS else -1
    return min(range(len(lims)), key=lambda q: lims[q])


def level_of(rule: int, levels: Sequence[int], figures: Sequence[int]) -> tuple[int, int]:
    """A record's ``level`` and ``level_figure`` for the rule that decided (:func:`binding_rule`)
    given, per rule in ``LIMITS`` order, the node whose limit it was and that node's figure:
    none (-1, 0) for no rule and for capacity, the pool's rule."""
    if rule < 0 or LIMITS[rule] == "capacity":
        return -1, 0
    return levels[rule], figures[rule]


def to_dict(row: Any, payload: str | None = None, names: list[str] | None = None,
            dims: list[str] | None = None, classes: list[str] | None = None) -> dict:
    """A record as plain JSON-able values (ints kept exact; names resolved when given)."""
    d = {f: (row[f].item() if hasattr(row[f], "item") else row[f]) for f in FIELDS}
    d["op"] = OPS[d["op"]]
    d["outcome"] = OUTCOMES[d["outcome"]]
    d["reason"] = REASONS[d["reason"]] if 0 <= d["reason"] < len(REASONS) else str(d["reason"])
    if isinstance(d["deficit"], float) and math.isnan(d["deficit"]):
        d["deficit"] = None
    if names is not None and 0 <= d["campaign"] < len(names):
        d["campaign_name"] = names[d["campaign"]]
    if dims is not None and 0 <= d["dim"] < len(dims):
        d["dim_name"] = dims[d["dim"]]
    if classes is not None and 0 <= d["cls"] < len(classes):
        d["class_name"] = classes[d["cls"]]
    d["payload"] = json.loads(payload) if payload else None
    return d


def from_dict(d: dict) -> tuple[np.ndarray, str | None]:
    """Inverse of :func:`to_dict` (extra keys ignored)."""
    row = new_rows(1)
    for f in FIELDS:
        if f in LEVEL_FIELDS and f not in d:    # a record written before levels: none
            row[f] = LEVEL_UNRECORDED if f == "level" else 0
            continue
        v = d[f]
        if f == "op":
            v = OP[v]
        elif f == "outcome":
            v = OUTCOMES.index(v)
        elif f == "reason":
            v = REASONS.index(v)
        elif f == "deficit" and v is None:
            v = math.nan
        row[f] = v
    p = d.get("payload")
    return row, (json.dumps(p, sort_keys=True) if p is not None else None)
