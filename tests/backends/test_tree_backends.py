"""The tree of envelopes (SPEC §14) in the compiled core, against the reference's rules.

The core keeps, per node and held dimension, its parent, the commitments of its children
(Σ R_ch) and what they add to its load K, its subtree's holding, and per decision walks the
node's path: the reserve rule's capacity limit capacity − Σ_top R + Σ_{v on the path}
slack_v, the "never" bound of an empty pool, and on a grant or an end the change of every
ancestor's load, holding and commitment. Here random trees, registrations and firm and opportunistic grants and
ends run on the kernels of every binding and on plain reference objects, and after each
step the kernels' figures are compared with :mod:`bursarcore.reference.tree`'s, which
recomputes them from their definitions.
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st_

from bursarcore.admission.state import (EngineState, LIM_CAPACITY, MAXV, REASONS, SIB_CHILD,
                                        SIB_NEXT)
from bursarcore.reference import tree
from bursarcore.reference.leases import Campaign, Holding
from bursarcore.reference.rules import excess
from abi_engine import abi_engine

NS = 10**9
FIRM, OPP = 0, 1                      # the two classes of the test's table


def _kernels():
    out = []
    for name in ("bursarcore._engine", "bursarcore._cffi_engine"):
        try:
            out.append(pytest.param(importlib.import_module(name), id=name.rsplit(".", 1)[1]))
        except ImportError:
            pass
    return out


KERNELS = _kernels()
pytestmark = pytest.mark.skipif(not KERNELS, reason="no compiled binding is built")


class Mirror:
    """A pool of one held dimension as both the kernels' state and the reference's nodes."""

    def __init__(self, k, cap: int) -> None:
        self.k, self.cap, self.t, self.intent = k, cap, 0, 0
        self.st = EngineState([cap], [0], [cap],
                              [(0, 10**6, 0, 0, 0, 0), (1, 10**6, 0, 1, 0, 0)],
                              [0], [], [10**6], 10 * NS, 10, False)
        self.camps: list[Campaign] = []
        self.leases: dict[int, tuple[int, int, bool]] = {}      # id -> (node, units, firm)

    def register(self, parent: int | None, g: int) -> bool:
        """Both refuse or both add a node with guarantee g (sustained and ceiling far above
        it, an unlimited bucket and budget)."""
        k, st, cap = self.k, self.st, self.cap
        p = -1 if parent is None else parent
        if parent is None:
            nested = int(st.gsum[0]) + g <= cap
            assert int(st.gsum[0]) == sum(c.hold[0].g for c in self.camps if c.parent is None)
        else:
            kids = sum(self.camps[ch].hold[0].g for ch in self.camps[parent].children)
            assert int(st.gch[parent, 0]) == kids
            nested = kids + g <= self.camps[parent].hold[0].g
        room = k.child_room(st, p, 0)
        assert room == tree.room_for_child(self.camps, cap, parent, 0)
        load_room = room
        if parent is not None:
            load_room = k.child_load_room(st, parent, 0)
            assert load_room == tree.load_room_for_child(self.camps, parent, 0)
        if not nested or g > room or g > load_room:
            return False
        s = self.sustained(g)
        c = st.add_campaign([g], [s], [10 * cap], [MAXV], MAXV, self.t, top=parent is None)
        if parent is not None:
            k.link(st, c, parent, self.t)
        else:
            k.enlist(st, c)
        path = [c] + ([] if parent is None else self.camps[parent].path)
        self.camps.append(Campaign(c, f"n{c}", "x", 1.0, MAXV,
                                   [Holding(g, s, 10 * cap, MAXV, MAXV, self.t)],
                                   parent=parent, path=path))
        if parent is not None:
            self.camps[parent].children.append(c)
        return True

    def sustained(self, g: int) -> int:
        """A sustained rate at least g, some of them tight (so that loads meet them)."""
        return g + (len(self.camps) * 7) % (self.cap + 1)

    def grant(self, c: int, n: int, firm: bool) -> bool:
        """A grant of n units that the reserve rule and the free units allow, committed by
        the kernels' grant (which does not decide) and mirrored."""
        k, st = self.k, self.st
        free = k.free_now(st, 0)
        # a grant that raises no load above a sustained rate: no bucket is drawn (the
        # ancestors' buckets do not bind here yet)
        K = tree.loads(self.camps, 0)
        if any(r > 0 and excess(K[v], r, self.camps[v].hold[0].s) > 0
               for v, r in zip(self.camps[c].path,
                               tree.rises(self.camps, K, self.camps[c], 0, n))):
            return False
        if n > free or (firm and n > tree.firm_room(self.camps, self.cap, self.camps[c], 0)):
            return False
        lid = k.grant(st, c, 0, FIRM if firm else OPP, n, 60 * NS, 0, self.t, False,
                      self.intent)
        self.intent += 1
        self.leases[lid] = (c, n, firm)
        node = self.camps[c]
        node.hold[0].own += n
        node.hold[0].own_firm += n if firm else 0
        for v in node.path:
            self.camps[v].hold[0].H += n
        return True

    def end(self, lid: int) -> None:
        c, n, firm = self.leases.pop(lid)
        self.k.end_lease(self.st, lid, self.t, 3)          # released
        node = self.camps[c]
        node.hold[0].own -= n
        node.hold[0].own_firm -= n if firm else 0
        for v in node.path:
            self.camps[v].hold[0].H -= n

    def check(self) -> None:
        """Every figure of the reserve rule, per node, as the reference computes it."""
        k, st, camps, cap = self.k, self.st, self.camps, self.cap
        R = tree.commitments(camps, 0)
        K = tree.loads(camps, 0)
        F = sum(c.hold[0].own_firm for c in camps)
        assert int(st.F[0]) == F
        assert int(st.U[0]) == tree.reserve(camps, 0) - F        # U = Σ_top R − F
        reach = k.dim_figures(st, 0)[1]         # free, lent to opportunistic leases, revoking
        # the sibling lists a borrower borrows from (SPEC §14.8): each node's children, and
        # the pool's the top-level nodes, each listed once
        for p in [None] + [c.index for c in camps]:
            want = [c.index for c in camps if c.parent == p]
            assert sorted(listed(st, -1 if p is None else p)) == want
        for c in camps:
            i = c.index
            assert int(st.H[i, 0]) == K[i]                          # the load (SPEC §14.2)
            if st.up[i, 0] != 0:                                    # the subtree's holding
                assert int(st.Hsub[i, 0]) == c.hold[0].H
            else:
                assert c.hold[0].H == c.hold[0].own == K[i]
            assert int(st.Xch[i, 0]) == K[i] - c.hold[0].own
            assert int(st.Hf[i, 0]) == c.hold[0].own_firm
            assert int(st.Rch[i, 0]) == sum(R[ch] for ch in c.children)
            assert k.unmet(st, i, 0) == tree.slack(camps, R, i, 0)
            path_slack = sum(tree.slack(camps, R, v, 0) for v in c.path)
            assert k.path_slack(st, i, 0) == path_slack
            room = tree.firm_room(camps, cap, c, 0)
            assert cap - int(st.F[0]) - int(st.U[0]) + path_slack == room
            # the decision's capacity limit for a firm request: the room, within reach
            n, _, _, _, lim = k.decide(st, i, 0, FIRM, 1, cap, 60 * NS, -1, self.t)
            assert lim[LIM_CAPACITY] == min(room, reach)
            assert n == max(0, min(room, reach, cap))
            # "never": an empty pool's bound, and one unit more
            bound = tree.firm_bound(camps, cap, c, 0)
            if bound >= 0:
                assert REASONS[k.never(st, i, 0, FIRM, max(bound, 0), 60 * NS, 0)] == ""
            assert REASONS[k.never(st, i, 0, FIRM, max(bound, 0) + 1, 60 * NS, 0)] == \
                "capacity"


def listed(st: EngineState, p: int) -> list[int]:
    """Node p's children (p < 0: the top-level nodes) as its list in ``st.sib`` holds them."""
    out, v = [], int(st.sib[p + 1, SIB_CHILD]) - 1
    while v >= 0:
        assert v not in out and len(out) <= st.C
        out.append(v)
        v = int(st.sib[v + 1, SIB_NEXT]) - 1
    return out


@st_.composite
def scripts(draw):
    cap = draw(st_.integers(1, 40))
    steps = draw(st_.lists(st_.tuples(st_.sampled_from("rrggge"), st_.integers(0, 10**6),
                                      st_.integers(0, 40), st_.booleans()),
                           min_size=1, max_size=60))
    return cap, steps


@pytest.mark.parametrize("k", KERNELS)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(script=scripts())
def test_the_reserve_rule_of_random_trees_agrees_with_the_reference(k, script):
    cap, steps = script
    m = Mirror(k, cap)
    for op, pick, n, flag in steps:
        m.t += NS
        if op == "r" or not m.camps:
            parent = None if (flag or not m.camps) else pick % len(m.camps)
            # a child's guarantee within its parent's, most of the time
            m.register(parent, n if parent is None else n % (m.camps[parent].hold[0].g + 2))
        elif op == "g":
            m.grant(pick % len(m.camps), 1 + n % (cap // 2 + 1), flag)
        elif m.leases:
            m.end(sorted(m.leases)[pick % len(m.leases)])
        m.check()


@pytest.mark.parametrize("k", KERNELS)
def test_the_worked_numbers(k):
    """SPEC §14.3's worked numbers: `astro/a` storming at its ceiling gets 50 (its 40 and
    the 10 no one is promised); then neither it nor `astro` gets more, while `astro/b`
    still gets its 20 and `bio` its 30."""
    m = Mirror(k, 100)
    m.sustained = lambda g: 100
    assert m.register(None, 60)          # astro
    assert m.register(0, 40)             # astro/a
    assert m.register(0, 20)             # astro/b
    assert m.register(None, 30)          # bio
    assert not m.register(0, 10)         # astro/c: the children would hold 70 of 60
    m.check()
    assert k.path_slack(m.st, 1, 0) == 40
    n, *_ = k.decide(m.st, 1, 0, FIRM, 1, 100, 600 * NS, -1, m.t)
    assert n == 50
    assert m.grant(1, 50, True)
    m.check()
    for c in (1, 0):
        n, reason, *_ = k.decide(m.st, c, 0, FIRM, 1, 5, 600 * NS, -1, m.t)
        assert (n, REASONS[reason]) == (0, "capacity")
    for c, want in ((2, 20), (3, 30)):
        n, *_ = k.decide(m.st, c, 0, FIRM, want, want, 600 * NS, -1, m.t)
        assert n == want
    assert (int(m.st.F[0]), int(m.st.U[0])) == (50, 50)


def test_flat_campaigns_keep_the_tree_columns_at_zero():
    """A flat set of campaigns is a tree of top-level nodes without children: its tree
    columns stay zero, and U is the unmet guarantees of §4.1."""
    k = KERNELS[0].values[0]
    m = Mirror(k, 50)
    m.sustained = lambda g: 50
    for g in (10, 5, 0):
        assert m.register(None, g)
    assert m.grant(0, 15, True) and m.grant(1, 2, True) and m.grant(2, 7, False)
    m.check()
    st = m.st
    assert not st.up[:st.C].any() and not st.Rch[:st.C].any() and not st.Xch[:st.C].any()
    assert int(st.U[0]) == 0 + 3 + 0
    assert not st.Hsub[:st.C].any()


def test_the_abi_registers_nodes():
    """``bc_engine_add_node``: nesting and the room are checked, and the capacity rule of a
    child is the reserve rule (the worked numbers of SPEC §14.3)."""
    ffi, lib, e = abi_engine(100)
    idx = ffi.new("int64_t *")

    def add(parent, g):
        a = [ffi.new("int64_t[]", [x]) for x in (g, 1000, 1000, MAXV)]
        return lib.bc_engine_add_node(e, parent, *a, MAXV, 0, idx)

    assert add(-1, 60) == lib.BC_OK and idx[0] == 0                   # astro
    assert add(0, 40) == lib.BC_OK and idx[0] == 1                    # astro/a
    assert add(0, 20) == lib.BC_OK                                    # astro/b
    assert add(-1, 30) == lib.BC_OK                                   # bio
    assert add(0, 10) == lib.BC_ERANGE                                # 70 of astro's 60
    assert add(9, 0) == lib.BC_EINDEX                                 # no such parent
    assert add(-1, 11) == lib.BC_ERANGE                               # 101 of 100
    dec = ffi.new("bc_decision *")
    assert lib.bc_engine_acquire(e, 1, 0, 0, 1, 100, 600 * NS, -1, 0, 0, dec) == lib.BC_OK
    assert (dec.outcome, dec.units) == (lib.BC_GRANTED, 50)
    assert lib.bc_engine_acquire(e, 0, 0, 0, 1, 5, 600 * NS, -1, 0, 1, dec) == lib.BC_OK
    assert dec.outcome != lib.BC_GRANTED and dec.reason == lib.BC_REASON_CAPACITY
    assert lib.bc_engine_acquire(e, 2, 0, 0, 20, 20, 600 * NS, -1, 0, 2, dec) == lib.BC_OK
    assert (dec.outcome, dec.units) == (lib.BC_GRANTED, 20)
    held = ffi.new("int64_t *")
    assert lib.bc_engine_balance(e, 0, 0, 0, ffi.NULL, held, ffi.NULL) == lib.BC_OK
    assert held[0] == 70                                              # astro's subtree


def test_the_abi_changes_nodes():
    """``bc_engine_change_node`` (SPEC §14.9): nesting, the reserve and the budget are
    checked and a refusal changes nothing; a lowering frees a guarantee for a new
    sibling."""
    ffi, lib, e = abi_engine(100)
    idx = ffi.new("int64_t *")

    def figs(g):
        return [ffi.new("int64_t[]", [x]) for x in (g, 1000, 1000, MAXV)]

    def add(parent, g, credits=MAXV):
        return lib.bc_engine_add_node(e, parent, *figs(g), credits, 0, idx)

    def change(c, g, credits=MAXV):
        return lib.bc_engine_change_node(e, c, *figs(g), credits, 0)

    assert add(-1, 60) == lib.BC_OK                                   # astro 0
    assert add(0, 40) == lib.BC_OK                                    # astro/a 1
    assert add(0, 20) == lib.BC_OK                                    # astro/b 2
    assert add(-1, 30, 10**6) == lib.BC_OK                            # bio 3
    assert change(2, 25) == lib.BC_ERANGE                             # 65 of astro's 60
    assert change(0, 50) == lib.BC_ERANGE                             # children 60 > 50
    assert change(3, 41, 10**6) == lib.BC_ERANGE                      # 101 of 100
    assert change(3, 30) == lib.BC_ERANGE                             # finite to unlimited
    assert change(9, 0) == lib.BC_EINDEX
    assert add(0, 10) == lib.BC_ERANGE
    assert change(2, 10) == lib.BC_OK
    assert add(0, 10) == lib.BC_OK                                    # astro/c 4
    assert change(3, 40, 2 * 10**6) == lib.BC_OK
    left = ffi.new("int64_t *")
    assert lib.bc_engine_balance(e, 3, 0, 0, left, ffi.NULL, ffi.NULL) == lib.BC_OK
    assert left[0] == 2 * 10**6
