"""Random trees of envelopes (SPEC §14) for the tree tests: 2–20 nodes, depth 1–4, nested
guarantees within a pool of ``CAP`` units, some nodes adversaries that storm at their
ceilings, some borrowers of their siblings' idle guarantees and some lenders of less than
all of theirs (SPEC §14.8)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from hypothesis import strategies as st

from bursarcore import Envelope

INF = math.inf
CAP = 64


def env(g: int = 0, s: int | None = None, b: int | None = None, B: float = 0,
        credits: float = 1e6, cls: str = "agent-burst") -> Envelope:
    """A one-dimension (gpu) envelope: sustained defaults to g, the ceiling to s."""
    s = g if s is None else s
    b = s if b is None else b
    return Envelope(credits=credits, service_class=cls, guaranteed={"gpu": g},
                    sustained={"gpu": s}, ceiling={"gpu": b}, burst={"gpu": B})


@dataclass
class Node:
    name: str
    parent: int | None
    env: Envelope
    storm: bool             # an adversary: asks for its ceiling, again and again


@st.composite
def trees(draw) -> list[Node]:
    """2–20 nodes, depth 1–4, guarantees nested (Σ children g ≤ parent g, Σ top g ≤ CAP)."""
    n = draw(st.integers(2, 20))
    max_depth = draw(st.integers(1, 4))
    nodes: list[Node] = []
    depth: list[int] = []
    room: list[int] = []            # guarantee not yet given to children
    top_room = CAP
    for i in range(n):
        choices = [None] + [j for j in range(i) if depth[j] < max_depth]
        parent = draw(st.sampled_from(choices))
        avail = top_room if parent is None else room[parent]
        g = draw(st.integers(0, min(avail, 24)))
        if parent is None:
            top_room -= g
        else:
            room[parent] -= g
        storm = draw(st.booleans())
        s = g + draw(st.sampled_from([0, 4, 16, 48]))
        b = s + draw(st.sampled_from([0, 8, 32, 64]))
        B = draw(st.sampled_from([0, 1_000, 30_000, INF]))
        credits = draw(st.sampled_from([INF, INF, 20.0, 500.0]))
        cls = draw(st.sampled_from(["agent-burst", "agent-burst", "interactive",
                                    "opportunistic"]))
        # SPEC §14.8: some nodes borrow their siblings' idle guarantees, some lend less
        borrow = draw(st.sampled_from([0, 0, 8, 32]))
        lend = draw(st.sampled_from([INF, INF, 4, 0]))
        name = f"n{i}" if parent is None else f"{nodes[parent].name}/n{i}"
        nodes.append(Node(name, parent, Envelope(
            credits=credits, service_class=cls, guaranteed={"gpu": g}, sustained={"gpu": s},
            ceiling={"gpu": b}, burst={"gpu": B}, borrow_limit={"gpu": borrow},
            lend_limit={"gpu": lend}), storm))
        depth.append(1 if parent is None else depth[parent] + 1)
        room.append(g)
    return nodes
