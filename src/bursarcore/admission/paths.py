"""Names as paths and the registration rules of a tree of envelopes (SPEC §14.1).

``astro`` is a top-level node (a child of the facility's pool), ``astro/survey`` a child of
``astro``: a name's path is its segments, and a node is registered after its parent. Every
broker backend checks a name here; the compiled broker also checks a new node's guarantees
here, against the figures its core keeps (Σ of a node's children's guarantees, the reserve
rule's room and the loads' room, SPEC §14.1).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .. import units
from .._abi import TREE_DEPTH
from .state import CREDIT
from ..errors import InvalidArgument

__all__ = ["TREE_DEPTH", "parent_name", "check_name", "refuse_guarantee", "check_guarantees",
           "refuse_change", "check_change", "change_budget", "refuse_removed",
           "borrowing_limits"]


def parent_name(name: str) -> str | None:
    """The parent's path of ``name`` (None for a top-level node)."""
    head, sep, _ = name.rpartition("/")
    return head if sep else None


def check_name(name: str, registered: dict[str, int]) -> int | None:
    """SPEC §14.1: a path's segments are non-empty, there are at most ``TREE_DEPTH`` of
    them, and its parent is registered. Returns the parent's index (None for a top-level
    node); InvalidArgument naming ``name`` otherwise."""
    segments = name.split("/")
    if any(seg == "" for seg in segments):
        raise InvalidArgument("name", "must be a path of non-empty segments separated by '/'",
                              name)
    if len(segments) > TREE_DEPTH:
        raise InvalidArgument("name", f"a tree of envelopes has at most {TREE_DEPTH} levels, "
                              f"and this path has {len(segments)}", name)
    parent = parent_name(name)
    if parent is None:
        return None
    if parent not in registered:
        raise InvalidArgument("name", f"its parent {parent!r} must be registered first", name)
    return registered[parent]


def refuse_guarantee(label: str, g: int, *, parent: str | None, total: int, bound: int,
                     room: Callable[[], int], load_room: Callable[[], int] | None) -> None:
    """SPEC §3, §14.1, the rule itself: a new node's guarantee g on one dimension, ``total``
    the guarantees of its would-be siblings with it (Σ top-level g, or Σ of ``parent``'s
    children's g) and ``bound`` what they nest in (the pool's capacity, or the parent's g);
    ``room()`` the reserve rule's room now (Σ_top R stays ≤ capacity) and ``load_room()``
    the loads' room on the parent's path (None at the top level). InvalidArgument naming
    ``label`` at the first rule broken; the figures are the caller's (the compiled broker
    reads its core's, the reference recomputes them from their definitions)."""
    if total > bound:
        if parent is None:
            why = f"sum of guarantees {total} would exceed the pool capacity {bound}"
        else:
            why = (f"the children of {parent!r} would be guaranteed {total} in all, more "
                   f"than its own guarantee {bound}")
        raise InvalidArgument(label, why, g)
    if g > room():
        raise InvalidArgument(label, "firm holdings above guarantees leave no room for it "
                              "now; retry when they end", g)
    if load_room is not None and g > load_room():
        raise InvalidArgument(label, "it would raise a load on its parent's path above that "
                              "node's sustained rate: holdings above guarantees leave no "
                              "room for it now; retry when they end", g)


def check_guarantees(st: Any, k: Any, dims: Sequence[str], names: Sequence[str],
                     parent: int | None, g: Sequence[int]) -> None:
    """:func:`refuse_guarantee` for a new node of the compiled broker, on every held
    dimension, from the figures its core keeps: ``st`` its EngineState, ``k`` its
    kernels. Changes nothing."""
    p = -1 if parent is None else parent
    for i, d in enumerate(dims):
        if parent is None:
            total, bound = int(st.gsum[i]) + g[i], int(st.cap[i])
        else:
            total, bound = int(st.gch[parent, i]) + g[i], int(st.g[parent, i])
        refuse_guarantee(f"guaranteed[{d}]", g[i], parent=None if parent is None
                         else names[parent], total=total, bound=bound,
                         room=lambda: k.child_room(st, p, i),
                         load_room=None if parent is None
                         else (lambda: k.child_load_room(st, p, i)))


def refuse_change(label: str, g0: int, g: int, *, name: str, children: int,
                  parent: str | None, siblings: int, bound: int, room: Callable[[], int],
                  load_room: Callable[[], int] | None) -> None:
    """SPEC §14.9, the rule itself: node ``name``'s guarantee on one dimension changes from
    g0 to g. ``children`` is Σ of its children's guarantees (they must nest in g),
    ``siblings`` Σ of its siblings' (Σ of the other top-level g at the top level) and
    ``bound`` what they nest in with it (the pool's capacity, or ``parent``'s g). A raise
    must fit as a registration of a new child of ``parent`` of g − g0 would: ``room()`` the
    reserve rule's room now and ``load_room()`` the loads' room on the parent's path (None
    at the top level). InvalidArgument naming ``label`` at the first rule broken."""
    if children > g:
        raise InvalidArgument(label, f"the children of {name!r} are guaranteed {children} in "
                              f"all, more than the new guarantee {g}", g)
    if g <= g0:
        return
    refuse_guarantee(label, g, parent=parent, total=siblings + g, bound=bound,
                     room=lambda: room() + g0, load_room=None if load_room is None
                     else (lambda: load_room() + g0))


def check_change(st: Any, k: Any, dims: Sequence[str], names: Sequence[str], c: int,
                 g: Sequence[int]) -> None:
    """:func:`refuse_change` for node c of the compiled broker, on every held dimension,
    from the figures its core keeps. Changes nothing."""
    parent = st.parent(c)
    for i, d in enumerate(dims):
        g0 = int(st.g[c, i])
        if parent < 0:
            siblings, bound = int(st.gsum[i]) - g0, int(st.cap[i])
        else:
            siblings, bound = int(st.gch[parent, i]) - g0, int(st.g[parent, i])
        refuse_change(f"guaranteed[{d}]", g0, g[i], name=names[c], children=int(st.gch[c, i]),
                      parent=None if parent < 0 else names[parent], siblings=siblings,
                      bound=bound, room=lambda: k.child_room(st, parent, i),
                      load_room=None if parent < 0
                      else (lambda: k.child_load_room(st, parent, i)))


def change_budget(old: float, new: float, old_budget: int, new_budget: int, left: int) -> None:
    """SPEC §14.9: a budget may change between finite values, its credits left moving by
    the difference (never below 0), but not between unlimited and finite. InvalidArgument
    naming ``credits`` otherwise."""
    if math.isinf(old) != math.isinf(new):
        raise InvalidArgument("credits", "cannot change between unlimited and finite", new)
    if not math.isinf(new) and left + (new_budget - old_budget) < 0:
        raise InvalidArgument("credits", "would leave the credits left below 0 (the new "
                              "budget must cover what was spent and is escrowed)", new)


def refuse_removed(ci: Any, removed: set[int] | frozenset[int]) -> None:
    """SPEC §14.9: a batch's campaign indices may not name a removed node (its index is
    never reused, and it decides nothing more). InvalidArgument naming ``campaign_idx``."""
    if removed:
        hit = np.isin(ci, np.fromiter(removed, np.int64, len(removed)))
        if hit.any():
            raise InvalidArgument("campaign_idx", "names a removed campaign",
                                  int(ci[int(np.flatnonzero(hit)[0])]))


def borrowing_limits(envelope: Any, dim_index: Mapping[str, int],
                     unlimited: int) -> tuple[list[int], list[int]]:
    """SPEC §14.8: an envelope's borrow and lend limits per held dimension, in the order of
    ``dim_index`` (whole units; an unlimited lend as ``unlimited``). Borrowing is of held
    units: a limit naming another dimension is refused (InvalidArgument naming it)."""
    for label, m in (("borrow_limit", envelope.borrow_limit),
                     ("lend_limit", envelope.lend_limit)):
        for d in m:
            if d not in dim_index:
                raise InvalidArgument(f"{label}[{d}]", "must name a held dimension of the "
                                      "pool (borrowing is of held units)", d)
    dims = sorted(dim_index, key=dim_index.__getitem__)
    borrow = [units.whole(envelope.borrow(d), f"borrow_limit[{d}]") for d in dims]
    lend = [unlimited if math.isinf(envelope.lend(d))
            else units.whole(envelope.lend(d), f"lend_limit[{d}]") for d in dims]
    return borrow, lend


#: an envelope's figures per held dimension in engine units: borrow and lend limits,
#: g, s, b, bucket sizes (unit·ns), and its budget (micro-credits)
EnvelopeFigures = tuple[list[int], list[int], list[int], list[int], list[int], list[int], int]


def envelope_figures(envelope: Any, classes: Mapping[str, int], dim_index: Mapping[str, int],
                     flow_index: Mapping[str, int], unlimited: int) -> EnvelopeFigures:
    """SPEC §3, §14.8: an envelope's figures in engine units, per held dimension in the
    order of ``dim_index`` (an unlimited bucket, budget or lend as ``unlimited``), checked
    against the broker it is for: an Envelope, a class of the table, dimensions of the
    pool, whole units. InvalidArgument naming the field otherwise; changes nothing."""
    from .envelope import Envelope
    if not isinstance(envelope, Envelope):
        raise InvalidArgument("envelope", "must be an Envelope", envelope)
    if envelope.service_class not in classes:
        raise InvalidArgument("service_class", f"must be one of {list(classes)}",
                              envelope.service_class)
    for label, m in (("guaranteed", envelope.guaranteed), ("sustained", envelope.sustained),
                     ("ceiling", envelope.ceiling), ("burst", envelope.burst)):
        for d in m:
            if d not in dim_index and d not in flow_index:
                raise InvalidArgument(f"{label}[{d}]", "names a dimension the pool lacks", d)
    bl, ll = borrowing_limits(envelope, dim_index, unlimited)
    dims = sorted(dim_index, key=dim_index.__getitem__)
    g = [units.whole(envelope.g(d), f"guaranteed[{d}]") for d in dims]
    s = [units.whole(envelope.s(d), f"sustained[{d}]") for d in dims]
    b = [units.whole(envelope.b(d), f"ceiling[{d}]") for d in dims]
    bucket = []
    for d in dims:
        B = envelope.B(d)
        if math.isinf(B):
            bucket.append(unlimited)
        else:
            units.real(B, f"burst[{d}]", hi=units.MAX_BURST, allow_inf=True,
                       what="a number of unit-seconds")
            bucket.append(round(B * units.NS))
    credits = envelope.credits
    budget = unlimited if math.isinf(credits) else round(credits * CREDIT)
    return bl, ll, g, s, b, bucket, budget


def flow_unchanged(old: Any, new: Any, flow_dims: Sequence[str]) -> None:
    """SPEC §14.9: a change keeps a flow dimension's figures (the flow engine fixes them at
    registration): InvalidArgument naming the first that differs."""
    for d in flow_dims:
        for label, get in (("guaranteed", "g"), ("sustained", "s"), ("ceiling", "b"),
                           ("burst", "B")):
            if getattr(old, get)(d) != getattr(new, get)(d):
                raise InvalidArgument(f"{label}[{d}]", "a flow dimension's figures are fixed "
                                      "at registration", getattr(new, get)(d))
