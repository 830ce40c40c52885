"""The SPEC §11 invariants that any state of a broker must satisfy (1, 4, 5, 6), checked on
its engine state as it stands. Shared by the suites that drive a broker and want every step
to leave a consistent state: the state machines of spec/test_invariants.py (which check
invariants 2, 3 and 7 over histories themselves), flow dimensions, journal replay and pool
resizing."""

from __future__ import annotations

import numpy as np

from bursarcore import Broker
from bursarcore.admission.state import ACTIVE, MAXV, REVOKING, STARTING

__all__ = ["check_invariants"]


def check_invariants(b: Broker) -> None:
    """Capacity (1), guarantees' unmet sum, held within ceilings (6), tokens and credits
    within their bounds (4) and balanced by their ledgers (5), slots unique and counted."""
    st = b.st
    n = st.nleases
    state = st.state[:n]
    units = st.units[:n]
    live = (state == ACTIVE) | (state == REVOKING) | (state == STARTING)
    placed = (state == ACTIVE) | (state == REVOKING)
    for d in range(st.D):
        on = st.dim[:n] == d
        # invariant 1: capacity
        assert int(units[placed & on].sum()) == int(st.occ[d]) <= int(st.cap[d])
        assert int(st.F[d]) + int(st.U[d]) <= int(st.cap[d])
        assert int(st.F[d]) == int(units[live & on & (st.firm[:n] == 1)].sum())
        assert b._k.free_now(st, d) >= 0
        slots = np.concatenate([st.arena[int(st.slot_off[l]):int(st.slot_off[l]) + int(st.units[l])]
                                for l in np.flatnonzero(placed & on)] or [np.zeros(0, np.int32)])
        assert len(set(slots.tolist())) == slots.size == int(st.occ[d])
        assert int(st.top[d]) == int(st.cap[d]) - int(st.occ[d])
    for c in range(st.C):
        for d in range(st.D):
            mine = live & (st.camp[:n] == c) & (st.dim[:n] == d)
            assert int(st.H[c, d]) == int(units[mine].sum())
            assert int(st.H[c, d]) <= int(st.b[c, d])                    # invariant 6
            assert 0 <= int(st.T[c, d]) <= int(st.Bcap[c, d])           # invariant 4
            if int(st.Bcap[c, d]) < MAXV:                                # invariant 5 (tokens)
                assert int(st.T[c, d]) == (int(st.Bcap[c, d]) + int(st.tok_minted[c, d])
                                           + int(st.tok_refunded[c, d]) - int(st.tok_debited[c, d]))
        assert int(st.left[c]) >= 0                                      # invariant 4
        assert int(st.escrow[c]) == int(st.cost[:n][live & (st.camp[:n] == c)].sum())
        if int(st.budget[c]) < MAXV:                                     # invariant 5 (credits)
            assert int(st.left[c]) + int(st.escrow[c]) + int(st.spent[c]) == int(st.budget[c])
    U = sum(max(0, int(st.g[c, d]) - int(st.Hf[c, d])) for c in range(st.C) for d in range(st.D))
    assert U == int(st.U.sum())
