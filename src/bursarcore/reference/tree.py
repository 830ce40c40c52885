"""Envelopes as a tree (SPEC §14): names as paths, the reserve rule of nested guarantees,
the guarantees a new node may have, and the loads that every level's ceiling and bucket
measure, written plainly from their definitions.

A campaign's name is a path: ``astro`` is a top-level node (a child of the facility's pool),
``astro/survey`` a child of ``astro``. Every node's commitment on a held dimension is

    R_v = max(g_v, firm_own_v + Σ_{children ch of v} R_ch)

where firm_own_v counts the firm units of the leases granted to v itself. The pool keeps
Σ_{top-level v} R_v ≤ capacity after every firm grant. For a flat set of campaigns this is
SPEC §4.1: R_c = firm_c + max(0, g_c − firm_c), so Σ R = F + U.

Every node's **load** on a held dimension is

    K_v = own_v + Σ_{children ch of v} max(g_ch, K_ch)

where own_v counts the units (firm and opportunistic) of the leases granted to v itself:
its children's guarantees are reserved in it whether or not they are used. Node v's
ceiling binds K_v and its bucket refills and prepays on K_v (SPEC §14.2); for a node
without children K_v = own_v, its holding, and a flat set of campaigns is SPEC §4.

Everything here is recomputed from the definitions at every call (one pass over the nodes,
children before parents): it is the specification that the incremental form of SPEC §14,
O(depth) per decision, is checked against.
"""

from __future__ import annotations

from typing import Sequence

from ..admission.paths import check_name, parent_name, refuse_change, refuse_guarantee
from .leases import Campaign
from .rules import token_limit

__all__ = ["parent_name", "check_name", "commitments", "slack", "reserve", "firm_room",
           "firm_bound", "loads", "idle_loads", "rises", "absorbed", "load_room_for_child",
           "check_guarantee", "check_change", "binding_levels"]


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


def loads(camps: Sequence[Campaign], d: int, own: Sequence[int] | None = None) -> list[int]:
    """K_v for every node on dimension d, from the definition:
    K_v = own_v + Σ_{children ch} max(g_ch, K_ch), children before parents. ``own``
    replaces every node's own holding (default: the units of its live leases)."""
    K = [0] * len(camps)
    for c in reversed(camps):
        o = c.hold[d].own if own is None else own[c.index]
        K[c.index] = o + sum(max(camps[ch].hold[d].g, K[ch]) for ch in c.children)
    return K


def idle_loads(camps: Sequence[Campaign], d: int) -> list[int]:
    """K_v when no node holds anything (the "never" checks of SPEC §4.4, §14.2): the
    guarantees of v's children, reserved."""
    return loads(camps, d, [0] * len(camps))


def rises(camps: Sequence[Campaign], K: Sequence[int], c: Campaign, d: int,
          n: int) -> list[int]:
    """SPEC §14.2: by how much a grant of n units to c raises K_v at each node v of c's
    path (c first). K_c rises by n; a node's rise δ raises its parent's K by
    max(g_v, K_v + δ) − max(g_v, K_v) = max(0, δ − max(0, g_v − K_v)): each node absorbs
    the part of its guarantee its load does not use."""
    out = []
    x = n
    for v in c.path:
        out.append(x)
        x = max(0, x - max(0, camps[v].hold[d].g - K[v]))
    return out


def absorbed(camps: Sequence[Campaign], K: Sequence[int], c: Campaign, d: int) -> list[int]:
    """SPEC §14.2: E_v for each node v of c's path (c first): Σ over the nodes u of the
    path strictly below v of max(0, g_u − K_u), so that a grant of n to c raises K_v by
    max(0, n − E_v) (the composition of the steps of :func:`rises`). E_c = 0."""
    out, acc = [], 0
    for v in c.path:
        out.append(acc)
        acc += max(0, camps[v].hold[d].g - K[v])
    return out


def load_room_for_child(camps: Sequence[Campaign], parent: int, d: int) -> int:
    """SPEC §14.1: the largest guarantee a new child of ``parent`` may have on d now
    without raising the load of a node on the parent's path above that node's sustained
    rate: the child's reserved g raises K as a grant of g to the parent would, and no
    node's load may rise past its s without tokens paid for it (none are, at a
    registration). The largest g with max(0, g − E_v) ≤ max(0, s_v − K_v) at every v."""
    K = loads(camps, d)
    p = camps[parent]
    E = absorbed(camps, K, p, d)
    return min(e + max(0, camps[v].hold[d].s - K[v]) for v, e in zip(p.path, E))


def check_guarantee(camps: Sequence[Campaign], cap: int, parent: int | None, d: int, g: int,
                    label: str) -> None:
    """SPEC §3, §14, §14.1: a new node under ``parent`` (None: top level) may be guaranteed
    g on dimension d only if guarantees stay never overbooked (Σ of the top-level g ≤
    capacity; Σ of a node's children's g ≤ its own g), if g fits beside the firm holdings
    above guarantees now (:func:`room_for_child`: Σ_top R stays ≤ capacity) and, under a
    parent, if g lifts no load on the parent's path above that node's sustained rate
    (:func:`load_room_for_child`): the rule of ``refuse_guarantee``, over figures computed
    here from their definitions. InvalidArgument naming ``label`` otherwise; nothing is
    changed either way."""
    def room() -> int:
        return room_for_child(camps, cap, parent, d)

    if parent is None:
        total = sum(c.hold[d].g for c in camps if c.parent is None) + g
        refuse_guarantee(label, g, parent=None, total=total, bound=cap, room=room,
                         load_room=None)
        return
    p, under = camps[parent], parent
    total = sum(camps[ch].hold[d].g for ch in p.children) + g
    refuse_guarantee(label, g, parent=p.name, total=total, bound=p.hold[d].g, room=room,
                     load_room=lambda: load_room_for_child(camps, under, d))


def check_change(camps: Sequence[Campaign], cap: int, c: int, d: int, g: int,
                 label: str) -> None:
    """SPEC §14.9: node c's guarantee on d may become g only if its children's guarantees
    nest in it and it nests with its siblings' in its parent's (the pool's capacity at the
    top level); a raise by δ must fit as a new child of its parent guaranteed δ would
    (:func:`room_for_child`, :func:`load_room_for_child`). The rule of ``refuse_change``,
    over figures computed here from their definitions; changes nothing."""
    v = camps[c]
    g0 = v.hold[d].g
    children = sum(camps[ch].hold[d].g for ch in v.children)
    parent = v.parent

    def room() -> int:
        return room_for_child(camps, cap, parent, d)

    if parent is None:
        siblings = sum(x.hold[d].g for x in camps if x.parent is None) - g0
        refuse_change(label, g0, g, name=v.name, children=children, parent=None,
                      siblings=siblings, bound=cap, room=room, load_room=None)
        return
    p = camps[parent]
    siblings = sum(camps[ch].hold[d].g for ch in p.children) - g0
    refuse_change(label, g0, g, name=v.name, children=children, parent=p.name,
                  siblings=siblings, bound=p.hold[d].g, room=room,
                  load_room=lambda: load_room_for_child(camps, parent, d))


def idle(camps: Sequence[Campaign], R: Sequence[int], v: int, d: int) -> int:
    """SPEC §14.8: what node v's subtree leaves idle of its guarantee on d, R_v less the
    firm units its subtree holds (Σ of the slack over the subtree)."""
    return R[v] - camps[v].hold[d].Hf


def borrow_room(camps: Sequence[Campaign], c: Campaign, d: int) -> tuple[int, int]:
    """SPEC §14.8: (what a borrowed lease of node c may take on d beyond its firm room, what
    its borrow limit leaves): its siblings (the other children of its parent, or the other
    top-level nodes) lend what they leave idle of their guarantees, each up to its lend
    limit, less what c and they hold on borrowed leases; never more than c's limit leaves."""
    R = commitments(camps, d)
    siblings = [x for x in camps if x.parent == c.parent and x.index != c.index]
    left = c.hold[d].borrow - c.hold[d].borrowed
    lend = sum(min(x.hold[d].lend, idle(camps, R, x.index, d)) for x in siblings)
    lent = c.hold[d].borrowed + sum(x.hold[d].borrowed for x in siblings)
    return max(0, min(left, lend - lent)), left


def binding_levels(path: Sequence[Campaign], d: int, absorbed: Sequence[int], dur: int,
                   instant: bool, spend: int | None,
                   free_when_broke: bool) -> tuple[list[int], list[int]]:
    """SPEC §14.2: for each rule of a decision on node ``path[0]`` (its path, c first), in
    ``LIMITS`` order, the node of the path whose limit is the rule's (the one with the
    least, the nearest of equals: c itself when its own limit is the least) and that node's
    figure for the rule: its ceiling b_v (units) for the ceiling, whose limit at v is
    E_v + b_v − K_v; its tokens T_v for the bucket, whose limit at v is E_v + the token
    limit at K_v; its credits left for the budget, the least of which binds — unless the
    request's spending cap does (a cap at most that, or a class that runs free when broke:
    c itself). Capacity is the pool's rule: no node (-1, figure 0). Holdings are settled
    to now; ``absorbed`` is E_v per node of the path (:func:`absorbed`)."""
    hs = [v.hold[d] for v in path]

    def nearest_least(values: list[int]) -> int:
        return values.index(min(values))

    ceiling = nearest_least([e + h.b - h.K for h, e in zip(hs, absorbed)])
    tokens = nearest_least([e + token_limit(h.K, h.s, h.T, dur, instant)
                            for h, e in zip(hs, absorbed)])
    budget = nearest_least([v.left for v in path])
    if spend is not None and (free_when_broke or spend <= path[budget].left):
        budget = 0
    return ([path[ceiling].index, -1, path[tokens].index, path[budget].index],
            [hs[ceiling].b, 0, hs[tokens].T, path[budget].left])
