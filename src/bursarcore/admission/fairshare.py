"""Fair share over a tree of envelopes (SPEC §14.6, after Slurm's Fair Tree).

A flat set of campaigns ranks by one deficit each (SPEC §6). In a tree, siblings compete
for what their parent holds, so each node's **level deficit** compares it with its
siblings only (the children of one parent; the top-level nodes are siblings under the
pool):

    λ_v = share_v / Σ_{u ∈ S(v)} share_u − U_v / Σ_{u ∈ S(v)} U_u

where U_v is its subtree's usage (its own plus its children's subtrees', added in
registration order). The order (pending queue §4.5, victims §6) compares two nodes by the
level deficits of their ancestors from the top, at the first level where their paths
part; a node's own intents rank before its descendants'. With no tree every node is a
top-level sibling, λ is §6's deficit and the order is §6's.

Every sum runs left to right in registration order, so the figures are the same bit for
bit however the backend stores the tree.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["level_deficits", "fair_tree_keys"]


def _children(parent: list[int]) -> list[list[int]]:
    kids: list[list[int]] = [[] for _ in parent]
    for v, p in enumerate(parent):
        if p >= 0:
            kids[p].append(v)
    return kids


def level_deficits(share: np.ndarray, usage: np.ndarray, parent: list[int]) -> np.ndarray:
    """λ_v for every node (``parent[v]`` is -1 for a top-level node; a child's index is
    larger than its parent's)."""
    n = len(parent)
    kids = _children(parent)
    own = usage.tolist()
    sub = [0.0] * n
    for v in range(n - 1, -1, -1):          # children (larger indices) first
        u = own[v]
        for ch in kids[v]:
            u += sub[ch]
        sub[v] = u
    groups: dict[int, list[int]] = {}
    for v, p in enumerate(parent):
        groups.setdefault(p, []).append(v)
    sh = share.tolist()
    out = [0.0] * n
    for members in groups.values():
        tot_share = tot_use = 0.0
        for v in members:
            tot_share += sh[v]
            tot_use += sub[v]
        for v in members:
            out[v] = ((sh[v] / tot_share if tot_share > 0 else sh[v])
                      - (sub[v] / tot_use if tot_use > 0 else 0.0))
    return np.array(out, dtype=np.float64)


def fair_tree_keys(deficit: np.ndarray, parent: list[int]) -> np.ndarray:
    """The Fair Tree order as one figure per node, larger first (where a flat broker
    orders by its deficits): minus the node's dense rank among the paths of level
    deficits compared from the top (a NaN deficit ranks after every number)."""
    lam = [-math.inf if x != x else x for x in deficit.tolist()]
    keys: list[tuple[float, ...]] = []
    for v, p in enumerate(parent):
        keys.append((keys[p] if p >= 0 else ()) + (-lam[v],))
    ranks = {k: i for i, k in enumerate(sorted(set(keys)))}
    return -np.array([ranks[k] for k in keys], dtype=np.float64)
