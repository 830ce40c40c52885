"""Names as paths and the registration rules of a tree of envelopes (SPEC §14.1).

``astro`` is a top-level node (a child of the facility's pool), ``astro/survey`` a child of
``astro``: a name's path is its segments, and a node is registered after its parent. Every
broker backend checks a name here; the compiled broker also checks a new node's guarantees
here, against the figures its core keeps (Σ of a node's children's guarantees, the reserve
rule's room and the loads' room, SPEC §14.1).
"""

from __future__ import annotations

from typing import Any, Sequence

from .._abi import TREE_DEPTH
from ..errors import InvalidArgument

__all__ = ["TREE_DEPTH", "parent_name", "check_name", "check_guarantees"]


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


def check_guarantees(st: Any, k: Any, dims: Sequence[str], names: Sequence[str],
                     parent: int | None, g: Sequence[int]) -> None:
    """SPEC §3, §14.1: a new node's guarantees g (one per held dimension) are not overbooked
    — Σ of the top-level guarantees ≤ capacity, or Σ of the parent's children's ≤ the
    parent's — and fit now: beside the commitments above guarantees (the reserve rule's
    room, ``k.child_room``) and, under a parent, without lifting a load on its path above
    that node's sustained rate (``k.child_load_room``). ``st`` is the compiled broker's
    EngineState, ``k`` its kernels. InvalidArgument naming ``guaranteed[d]``; changes
    nothing."""
    for i, d in enumerate(dims):
        if parent is None:
            total_g = int(st.gsum[i]) + g[i]
            if total_g > int(st.cap[i]):
                raise InvalidArgument(f"guaranteed[{d}]", f"sum of guarantees {total_g} would "
                                      f"exceed the pool capacity {int(st.cap[i])}", g[i])
        else:
            total_g = int(st.gch[parent, i]) + g[i]
            if total_g > int(st.g[parent, i]):
                raise InvalidArgument(f"guaranteed[{d}]", f"the children of "
                                      f"{names[parent]!r} would be guaranteed {total_g} in "
                                      f"all, more than its own guarantee "
                                      f"{int(st.g[parent, i])}", g[i])
        if g[i] > k.child_room(st, -1 if parent is None else parent, i):
            raise InvalidArgument(f"guaranteed[{d}]", "firm holdings above guarantees leave "
                                  "no room for it now; retry when they end", g[i])
        if parent is not None and g[i] > k.child_load_room(st, parent, i):
            raise InvalidArgument(f"guaranteed[{d}]", "it would raise a load on its parent's "
                                  "path above that node's sustained rate: holdings above "
                                  "guarantees leave no room for it now; retry when they end",
                                  g[i])
