"""Envelopes as a tree (SPEC §14): names as paths, and the reserve rule of nested guarantees,
written plainly from their definitions.

A campaign's name is a path: ``astro`` is a top-level node (a child of the facility's pool),
``astro/survey`` a child of ``astro``. Every node's commitment on a held dimension is

    R_v = max(g_v, firm_own_v + Σ_{children ch of v} R_ch)

where firm_own_v counts the firm units of the leases granted to v itself. The pool keeps
Σ_{top-level v} R_v ≤ capacity after every firm grant. For a flat set of campaigns this is
SPEC §4.1: R_c = firm_c + max(0, g_c − firm_c), so Σ R = F + U.

Everything here is recomputed from the definitions at every call (one pass over the nodes,
children before parents): it is the specification that the incremental form of SPEC §14,
O(depth) per decision, is checked against.
"""

from __future__ import annotations

from typing import Sequence

from ..errors import InvalidArgument
from .leases import Campaign

__all__ = ["parent_name", "check_name", "commitments", "slack", "reserve", "firm_room",
           "firm_bound"]


def parent_name(name: str) -> str | None:
    """The parent's path of ``name`` (None for a top-level node)."""
    head, sep, _ = name.rpartition("/")
    return head if sep else None


def check_name(name: str, registered: dict[str, int]) -> int | None:
    """SPEC §14: a path's segments are non-empty and its parent is registered. Returns the
    parent's index (None for a top-level node); InvalidArgument naming ``name`` otherwise."""
    if any(seg == "" for seg in name.split("/")):
        raise InvalidArgument("name", "must be a path of non-empty segments separated by '/'",
                              name)
    parent = parent_name(name)
    if parent is None:
        return None
    if parent not in registered:
        raise InvalidArgument("name", f"its parent {parent!r} must be registered first", name)
    return registered[parent]


def commitments(camps: Sequence[Campaign], d: int) -> list[int]:
    """R_v for every node on dimension d, from the definition. A child is registered
    after its parent, so a pass in reverse registration order sees children first."""
    R = [0] * len(camps)
    for c in reversed(camps):
        h = c.hold[d]
        R[c.index] = max(h.g, h.own_firm + sum(R[ch] for ch in c.children))
    return R


def slack(camps: Sequence[Campaign], R: Sequence[int], v: int, d: int) -> int:
    """slack_v = R_v − (firm_own_v + Σ R_ch) ≥ 0: the part of v's guarantee that neither
    v's own firm leases nor its children's commitments use."""
    c = camps[v]
    return R[v] - (c.hold[d].own_firm + sum(R[ch] for ch in c.children))


def reserve(camps: Sequence[Campaign], d: int) -> int:
    """Σ over top-level nodes of R_v: what the pool has committed on dimension d (F + U of
    SPEC §4.1 in a flat set of campaigns)."""
    R = commitments(camps, d)
    return sum(R[c.index] for c in camps if c.parent is None)


def firm_room(camps: Sequence[Campaign], cap: int, c: Campaign, d: int) -> int:
    """SPEC §14: the most firm units the reserve rule lets node c be granted on d:
    capacity − Σ_top R + Σ_{v on c's path} slack_v. (A grant of n raises Σ_top R by
    max(0, n − Σ_path slack_v).) In a flat set this is capacity − F − U + c's unmet
    guarantee, SPEC §4.1."""
    R = commitments(camps, d)
    top = sum(R[x.index] for x in camps if x.parent is None)
    return cap - top + sum(slack(camps, R, v, d) for v in c.path)


def room_for_child(camps: Sequence[Campaign], cap: int, parent: int | None, d: int) -> int:
    """SPEC §14: the largest guarantee a new node under ``parent`` (None: top level) may
    have on d now: a new child of R = g raises Σ_top R as a firm grant of g to its parent
    would."""
    R = commitments(camps, d)
    top = sum(R[x.index] for x in camps if x.parent is None)
    if parent is None:
        return cap - top
    return cap - top + sum(slack(camps, R, v, d) for v in camps[parent].path)


def firm_bound(camps: Sequence[Campaign], cap: int, c: Campaign, d: int) -> int:
    """SPEC §4.4, §14: the most firm units node c could ever be granted on d, in an
    otherwise empty pool (no firm leases anywhere, so R_v = g_v):
    capacity − Σ_top g + Σ_{v on c's path} (g_v − Σ_{children ch of v} g_ch). In a flat
    set this is the capacity less the other campaigns' guarantees."""
    top = sum(x.hold[d].g for x in camps if x.parent is None)
    free_g = sum(camps[v].hold[d].g - sum(camps[ch].hold[d].g for ch in camps[v].children)
                 for v in c.path)
    return cap - top + free_g
