"""The pool's size (SPEC §12): nodes join and leave; the leases on a leaving node's slots
are revoked with notice."""

from __future__ import annotations

import json
from typing import Any, Sequence

import numpy as np

from .. import units
from ..admission.state import ACTIVE, CAPACITY, REVOKING, ROW_MASK
from ..errors import InvalidArgument
from ..journal import records as J
from .._brokerbase import _EV_REVOKE, BrokerBase, _op

__all__ = ["NodesMixin"]


class NodesMixin(BrokerBase):
    """The broker's pool resizing: ``add_nodes`` and ``remove_nodes``."""

    # ------------------------------------------------------------------ pool size (§12)
    @_op
    def add_nodes(self, dim: str, nodes: Sequence[tuple[str, int]]) -> list[int]:
        """Grow the pool: ``nodes`` is a list of ``(name, slots)`` joining dimension
        ``dim`` now (a facility binding calls this when a pilot allocation starts).
        Returns the new slot ids."""
        d = self._dim_arg(dim)
        if not isinstance(nodes, (list, tuple)) or not nodes or not all(
                isinstance(x, (list, tuple)) and len(x) == 2 for x in nodes):
            raise InvalidArgument("nodes", "must be a non-empty list of (name, slots)", nodes)
        nodes = [(str(n), units.whole(k, f"nodes[{n}]", lo=1)) for n, k in nodes]
        live = {self._node_names[d][int(j)] for j in
                np.unique(self._node_of_slot[d][self._slot_alive[d]])} if self._slot_alive[d].any() else set()
        seen = set()
        for name, k in nodes:
            if not name or name in live or name in seen:
                raise InvalidArgument("nodes", "names must be non-empty, unique and not in the pool",
                                      name)
            seen.add(name)
        grown = self._node_of_slot[d].shape[0] + sum(k for _, k in nodes)
        if grown > units.MAX_UNITS:
            raise InvalidArgument("nodes", f"the dimension's slots would number {grown:,}, "
                                  f"more than {units.MAX_UNITS:,}", len(nodes))
        t = self._now()
        self._advance(t)
        st = self.st
        start = self._node_of_slot[d].shape[0]
        total = sum(k for _, k in nodes)
        ids = np.arange(start, start + total, dtype=np.int32)
        # the stack holds every slot of the dimension once they are all free again: the
        # held ones come back to it when their leases end
        need = start + total
        if need > st.free_slots.shape[1]:
            wider = np.zeros((st.D, max(need, 2 * st.free_slots.shape[1])), dtype=np.int32)
            wider[:, : st.free_slots.shape[1]] = st.free_slots
            st.free_slots = wider
        top = int(st.top[d])
        st.free_slots[d, top:top + total] = ids[::-1]
        st.top[d] = top + total
        st.cap[d] += total
        owner = []
        for name, k in nodes:
            self._node_names[d].append(name)
            owner.extend([len(self._node_names[d]) - 1] * k)
        self._node_of_slot[d] = np.concatenate([self._node_of_slot[d], np.array(owner, np.int64)])
        self._slot_alive[d] = np.concatenate([self._slot_alive[d], np.ones(total, bool)])
        self.pool.capacity[self.dims[d]] = int(st.cap[d])
        self.pool.slot_map[self.dims[d]].extend(nodes)
        self._journal_nodes("add_nodes", t, d, {"dim": self.dims[d], "nodes": nodes})
        self._serve_pending(t)
        return ids.tolist()  # type: ignore[no-any-return]  # numpy types tolist() as Any

    @_op
    def remove_nodes(self, dim: str, nodes: Sequence[str], grace: float = 0.0) -> list[int]:
        """Shrink the pool: ``nodes`` leave dimension ``dim`` (a pilot ends or fails).
        Their free slots go at once; every lease holding one of their slots is revoked
        with notice, ``grace`` seconds from now (0: at once), and its slots leave the pool
        when it ends. Returns the ids of the leases revoked."""
        d = self._dim_arg(dim)
        if not isinstance(nodes, (list, tuple)) or not nodes:
            raise InvalidArgument("nodes", "must be a non-empty list of node names", nodes)
        g = units.to_ns(grace, "grace", allow_negative=False)
        names = self._node_names[d]
        index = {n: j for j, n in enumerate(names)}
        alive_nodes = set(np.unique(self._node_of_slot[d][self._slot_alive[d]]).tolist())
        js = []
        for n in nodes:
            j = index.get(n)
            if j is None or j not in alive_nodes:
                raise InvalidArgument("nodes", "each must be a node in the pool", n)
            js.append(j)
        t = self._now()
        self._advance(t)
        st = self.st
        gone = np.isin(self._node_of_slot[d], js) & self._slot_alive[d]
        self._slot_alive[d] &= ~gone
        self._draining[d] += int(gone.sum())
        self._purge_retired()
        # leases holding a retired slot: revoke with notice
        n = st.nleases
        live = np.flatnonzero(((st.state[:n] == ACTIVE) | (st.state[:n] == REVOKING))
                              & (st.dim[:n] == d))
        hit = [st.lease_id(l) for l in live.tolist()
               if gone[st.arena[int(st.slot_off[l]):int(st.slot_off[l]) + int(st.units[l])]].any()]
        for lid in hit:
            r = lid & ROW_MASK
            if int(st.state[r]) == REVOKING and int(st.revoke_at[r]) <= t + g:
                continue
            if int(st.state[r]) == ACTIVE:
                st.rev[d] += int(st.units[r])
                if not st.firm[r]:
                    st.oppa[d] -= int(st.units[r])
                st.state[r] = REVOKING
            self._opp_active[d].discard(lid)
            self._revoking[d].add(lid)
            st.revoke_at[r] = t + g
            self._emit("preempt_notice", t, int(st.camp[r]), lid=lid, deadline=t + g,
                       reason=CAPACITY)
            self._push(t + g, _EV_REVOKE, lid)
        if hit:
            self._set_reserve(d)
        self.pool.capacity[self.dims[d]] = int(st.cap[d])
        gone_names = {names[j] for j in js}
        self.pool.slot_map[self.dims[d]] = [(nm, k) for nm, k in self.pool.slot_map[self.dims[d]]
                                            if nm not in gone_names]
        self._journal_nodes("remove_nodes", t, d, {"dim": self.dims[d], "nodes": list(nodes),
                                                   "grace": g})
        if g == 0:
            self._advance(t)  # revocations due now run now
        return hit

    def _purge_retired(self) -> None:
        """Drop retired slots (of removed nodes) from the free stacks; the pool shrinks
        by each one as it comes free."""
        st = self.st
        for d in range(st.D):
            if not self._draining[d]:
                continue
            top = int(st.top[d])
            ids = st.free_slots[d, :top]
            keep = self._slot_alive[d][ids]
            r = int((~keep).sum())
            if r:
                kept = ids[keep].copy()
                st.free_slots[d, : kept.shape[0]] = kept
                st.top[d] = kept.shape[0]
                st.cap[d] -= r
                self._draining[d] -= r
                self.pool.capacity[self.dims[d]] = int(st.cap[d])

    def _dim_arg(self, dim: str) -> int:
        d = self._dim_index.get(dim) if isinstance(dim, str) else None
        if d is None:
            raise InvalidArgument("dim", f"must be one of {self.dims}", dim)
        return d

    def _journal_nodes(self, op: str, t: int, d: int, payload: dict[str, Any]) -> None:
        if self.journal is None:
            return
        row = {}
        row["op"], row["t"], row["dim"], row["outcome"] = J.OP[op], t, d, 4
        row["units"] = int(self.st.cap[d])
        self.journal.add(row, json.dumps(payload, sort_keys=True))
