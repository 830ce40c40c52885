"""SPEC §6 and §14.6: fair share, written from the definitions.

deficit_c = share_c / Σ share − usage_c / Σ usage over every campaign; with a tree of
envelopes each node's level deficit among its siblings, on its subtree's usage, and the
Fair Tree order the queue and the victims follow. Sums run in registration order.
"""

from __future__ import annotations

import math
from typing import Sequence

from .leases import Campaign

__all__ = ["is_tree", "deficits", "subtree_usage", "level_deficits", "fair_tree_rank"]


def is_tree(camps: Sequence[Campaign]) -> bool:
    """Whether any node has a parent (SPEC §14)."""
    return any(c.parent is not None for c in camps)


def deficits(camps: Sequence[Campaign], usage: Sequence[float]) -> list[float]:
    """SPEC §6 (§14.6 with a tree)."""
    if is_tree(camps):
        return level_deficits(camps, usage)
    tot_share = 0.0
    for c in camps:
        tot_share += c.share
    tot = 0.0
    for u in usage:
        tot += u
    return [(c.share / tot_share if tot_share > 0 else c.share) - (u / tot if tot > 0 else 0.0)
            for c, u in zip(camps, usage)]


def subtree_usage(camps: Sequence[Campaign], usage: Sequence[float], v: int) -> float:
    """U_v: v's own usage plus each child's subtree usage, in registration order."""
    u = usage[v]
    for ch in camps[v].children:
        u += subtree_usage(camps, usage, ch)
    return u


def level_deficits(camps: Sequence[Campaign], usage: Sequence[float]) -> list[float]:
    """λ_v = share_v / Σ_{siblings u} share_u − U_v / Σ_{siblings u} U_u, the siblings of
    v (v among them) being its parent's children, or every top-level node."""
    out = []
    for c in camps:
        sibs = ([x.index for x in camps if x.parent is None] if c.parent is None
                else camps[c.parent].children)
        tot_share = tot_use = 0.0
        for u in sibs:
            tot_share += camps[u].share
            tot_use += subtree_usage(camps, usage, u)
        mine = subtree_usage(camps, usage, c.index)
        out.append((c.share / tot_share if tot_share > 0 else c.share)
                   - (mine / tot_use if tot_use > 0 else 0.0))
    return out


def fair_tree_rank(camps: Sequence[Campaign], deficit: Sequence[float]) -> list[int]:
    """Each node's place in the Fair Tree order, 0 first (equal paths share a place):
    nodes compare by their ancestors' level deficits from the top, the larger first, at
    the first level where their paths part; a node before its descendants; a NaN deficit
    after every number."""
    def key(c: Campaign) -> tuple[float, ...]:
        return tuple(math.inf if deficit[v] != deficit[v] else -deficit[v]
                     for v in reversed(c.path))
    keys = [key(c) for c in camps]
    order = sorted(set(keys))
    return [order.index(k) for k in keys]
