"""The SPEC §11 invariants that any state of a broker must satisfy (1, 4, 5, 6), checked on
what a user can read of it (``state()``: the pool's figures, every campaign's holdings and
balances, every lease with its slots), so that they hold the compiled broker and the
reference broker to the same account. On the compiled broker the engine's own ledgers
(token mints, debits and refunds; the lease store's counters) are checked as well. Shared
by the suites that drive a broker and want every step to leave a consistent state: the
state machines of spec/test_invariants.py (which check invariants 2, 3 and 7 over
histories themselves), flow dimensions, journal replay and pool resizing."""

from __future__ import annotations

import math
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import rule

from bursarcore.admission.state import ACTIVE, CREDIT, MAXV, REVOKING, STARTING

__all__ = ["LeaseOps", "apply_lease_op", "check_invariants"]

_LIVE = ("active", "revoking", "starting")
_PLACED = ("active", "revoking")


class LeaseOps:
    """The state machines' rules on a broker's leases and pending intents, for a
    RuleBasedStateMachine that keeps its broker in ``self.b`` and applies an operation with
    ``self._do(op)``: release, renew and cancel one chosen by index among those live."""

    b: Any

    def _do(self, op: tuple) -> Any:
        raise NotImplementedError

    @rule(k=st.integers(0, 10_000))
    def release(self, k: int) -> None:
        live = [l.id for l in self.b.leases()]
        if live:
            self._do(("release", live[k % len(live)]))

    @rule(k=st.integers(0, 10_000), ext=st.sampled_from([1.0, 60.0, 600.0]))
    def renew(self, k: int, ext: float) -> None:
        live = [l.id for l in self.b.leases() if l.state == "active"]
        if live:
            self._do(("renew", live[k % len(live)], ext))

    @rule(k=st.integers(0, 10_000))
    def cancel(self, k: int) -> None:
        pend = [p["intent_id"] for p in self.b.pending()]
        if pend:
            self._do(("cancel", pend[k % len(pend)]))


def apply_lease_op(b: Any, op: tuple, released: dict) -> Any:
    """Apply one of LeaseOps' operations (or an ``("advance", dt)``) to broker `b` and return
    what a user observes of it; a release's instant goes to `released`. NotImplemented for
    any other operation (the machine's own)."""
    kind = op[0]
    if kind == "release":
        d = b.release(op[1])
        if d.outcome == "released":
            released[op[1]] = b.clock.now()
        return d.to_dict()
    if kind == "renew":
        return b.renew(op[1], op[2]).to_dict()
    if kind == "cancel":
        return b.cancel(op[1])
    if kind == "advance":
        b.clock.advance(op[1])
        return [e.to_dict() for e in b.poll()]
    return NotImplemented


def _credits(x: float | None) -> int:
    return round(x * CREDIT) if x is not None else 0


def check_invariants(b: Any) -> None:
    """Capacity (1), guarantees' unmet sum, held within ceilings (6), tokens and credits
    within their bounds (4) and balanced (5), slots unique and counted."""
    s = b.state()
    leases = s["leases"]
    for dn, p in s["pool"].items():
        mine = [l for l in leases if l["dim"] == dn]
        placed = [l for l in mine if l["state"] in _PLACED]
        # invariant 1: capacity, and the firm holdings plus unmet guarantees within it
        assert sum(l["units"] for l in placed) == p["occupied"] <= p["capacity"]
        assert p["firm"] + p["unmet_guarantees"] <= p["capacity"]
        assert p["firm"] == sum(l["units"] for l in mine if l["state"] in _LIVE and l["firm"])
        assert p["free"] >= 0
        slots = [x for l in placed for x in l["slots"]]
        assert len(set(slots)) == len(slots) == p["occupied"]
        assert all(sum(n for _, n in l["placement"]) == l["units"] for l in placed)
        unmet = 0
        for name, c in s["campaigns"].items():
            env = c["envelope"]
            held = sum(l["units"] for l in mine if l["campaign"] == name and l["state"] in _LIVE)
            assert c["held"][dn] == held
            ceiling = env["ceiling"].get(dn, env["sustained"].get(dn,
                                                                env["guaranteed"].get(dn, 0)))
            assert ceiling is None or held <= ceiling                       # invariant 6
            assert c["tokens"][dn] is None or c["tokens"][dn] >= 0          # invariant 4 (None: unmetered)
            unmet += max(0, env["guaranteed"].get(dn, 0) - c["firm_held"][dn])
        assert unmet == p["unmet_guarantees"]
    for name, c in s["campaigns"].items():
        live = [l for l in leases if l["campaign"] == name and l["state"] in _LIVE]
        escrow = _credits(c["credits_escrowed"])
        assert abs(escrow - sum(_credits(l["cost"]) for l in live)) <= len(live)
        budget = c["envelope"]["credits"]
        if c["credits_left"] is not None:
            assert c["credits_left"] >= 0                                   # invariant 4
            if budget is not None and not math.isinf(budget):              # invariant 5
                total = _credits(c["credits_left"]) + escrow + _credits(c["credits_spent"])
                assert abs(total - _credits(budget)) <= 2
    if hasattr(b, "st"):
        _check_engine(b)


def _check_engine(b: Any) -> None:
    """The compiled engine's ledgers, exactly: what the figures above are sums of."""
    st = b.st
    n = st.nleases
    state = st.state[:n]
    units = st.units[:n]
    live = (state == ACTIVE) | (state == REVOKING) | (state == STARTING)
    placed = (state == ACTIVE) | (state == REVOKING)
    for d in range(st.D):
        on = st.dim[:n] == d
        assert int(units[placed & on].sum()) == int(st.occ[d])
        assert int(st.top[d]) == int(st.cap[d]) - int(st.occ[d])
    for c in range(st.C):
        for d in range(st.D):
            assert 0 <= int(st.T[c, d]) <= int(st.Bcap[c, d])           # invariant 4
            if int(st.Bcap[c, d]) < MAXV:                                # invariant 5 (tokens)
                assert int(st.T[c, d]) == (int(st.Bcap[c, d]) + int(st.tok_minted[c, d])
                                           + int(st.tok_refunded[c, d]) - int(st.tok_debited[c, d]))
        assert int(st.escrow[c]) == int(st.cost[:n][live & (st.camp[:n] == c)].sum())
        if int(st.budget[c]) < MAXV:                                     # invariant 5 (credits)
            assert int(st.left[c]) + int(st.escrow[c]) + int(st.spent[c]) == int(st.budget[c])
    U = sum(max(0, int(st.g[c, d]) - int(st.Hf[c, d])) for c in range(st.C) for d in range(st.D))
    assert U == int(st.U.sum())


def next_intent(b) -> int:
    """The id the broker's next intent gets (the compiled broker keeps it in its cursor)."""
    cur = getattr(b, "_cur", None)
    return cur.next_intent if cur is not None else b._next_intent


def set_pass_by_key(b, by_key: bool) -> None:
    """Serve the pending queue key by key (True, the default) or intent by intent (False,
    the specification's procedure, which the reference broker always follows)."""
    q = getattr(b, "_queue", None)
    if q is not None and hasattr(q, "by_key"):
        q.by_key = by_key
