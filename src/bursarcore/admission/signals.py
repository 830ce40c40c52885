"""Supply signals and quotes (SPEC §8), the picture of the broker and the explanation
of a journaled decision: what a broker tells its agents and its operators without
deciding anything."""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from ..admission.envelope import quote_grid
from ..admission.results import DimSupply, Quote, Supply
from ..admission.state import BOR_HELD, CREDIT, MAXV, PPM, REASONS
from ..errors import InvalidArgument
from ..journal.explain import explain as _explain
from .._brokerbase import _PATHS, NS, BrokerBase, _op

__all__ = ["SignalsMixin"]


class SignalsMixin(BrokerBase):
    """The broker's reads: ``supply``, ``quote``, ``state``, ``explain``."""

    # ------------------------------------------------------------------ supply (§8)
    @_op
    def supply(self, campaign: str) -> Supply:
        """Supply signals for one campaign now (SPEC §8).

        Parameters
        ----------
        campaign : str
            A registered campaign.

        Returns
        -------
        Supply
            Credits left and, per held dimension, free and reclaimable units,
            congestion, tokens, prices and waits.

        Raises
        ------
        UnknownCampaign
            ``campaign`` is not registered.
        """
        c = self.campaign_index(campaign)
        t = self._now()
        self._advance(t)
        st, k = self.st, self._k
        dims = {}
        grace = self._reclaim_wait()
        for d, dname in enumerate(self.dims):
            k.settle(st, c, d, t)
            free = k.free_now(st, d)
            kappa = k.congestion_ppm(st, d) / PPM
            mult = k.congestion_mult(st, d) / PPM
            prices = {cl.name: k.price_pm(st, d, i) / CREDIT for i, cl in enumerate(self.classes)}
            cold = self.cold_wait(dname) if self.cold_wait is not None else None
            Bc = int(st.Bcap[c, d])
            dims[dname] = DimSupply(
                free=max(0, free), capacity=int(st.cap[d]),
                reclaimable=int(k.dim_figures(st, d)[1]) - free,
                congestion=kappa, multiplier=mult,
                # an unbounded bucket holds "unlimited" tokens, whatever the sentinel's
                # count after debits (as state() says None for it)
                tokens=math.inf if Bc >= MAXV else int(st.T[c, d]) / NS,
                bucket=math.inf if Bc >= MAXV else Bc / NS,
                held=st.held(c, d), ceiling=int(st.b[c, d]), price=prices,
                wait={"warm": 0.0, "reclaim": grace, "cold": cold})
        left = int(st.left[c])
        return Supply(campaign, t / NS, math.inf if left >= MAXV else left / CREDIT,
                      self.envelopes[campaign].service_class, dims)

    @_op
    def quote(self, campaign: str, sizes: Sequence[int], durations: Sequence[float], *,
              dim: str | None = None, service_class: str | None = None) -> Quote:
        """Cost, path and wait for every (size, duration) pair, in one vectorised call.

        A what-if: each cell is what an intent for exactly that size and duration would
        meet now (SPEC §4.4, §7), and nothing is granted or debited.

        Parameters
        ----------
        campaign : str
            A registered campaign.
        sizes : sequence of int
            Sizes in [1, ``units.MAX_UNITS``]; non-empty.
        durations : sequence of float
            Seconds, one microsecond to ten years; non-empty. At most 1,000,000 cells
            in all.
        dim : str, optional
            A held dimension (default: the primary one).
        service_class : str, optional
            The class to price at (default: the campaign's).

        Returns
        -------
        Quote
            The grid, ``len(sizes)`` rows by ``len(durations)`` columns.

        Raises
        ------
        UnknownCampaign
            ``campaign`` is not registered.
        InvalidArgument
            ``dim``, ``service_class``, ``sizes`` or ``durations`` breaks its rule, or
            the grid is too large (``"sizes"``).
        """
        c = self.campaign_index(campaign)
        dname = dim if dim is not None else self.dims[0]
        if dname not in self._dim_index:
            raise InvalidArgument("dim", f"must be one of {self.dims}", dname)
        d = self._dim_index[dname]
        kc = self._class_of(campaign, service_class)
        sz, du = quote_grid(sizes, durations)
        sz = sz.astype(np.int64)
        t = self._now()
        self._advance(t)
        cost, path_code, reason_code = self._k.quote(self.st, c, d, kc, sz, du, t)
        path = np.array(_PATHS, dtype=object)[np.asarray(path_code, dtype=np.int64)]
        reason = np.array(REASONS, dtype=object)[np.asarray(reason_code, dtype=np.int64)]
        grace = self._reclaim_wait()
        cold = self.cold_wait(dname) if self.cold_wait is not None else math.inf
        wait = np.where(path == "warm", 0.0, np.where(path == "reclaim", grace, cold))
        return Quote(sizes=sz, durations=du / NS,
                     cost=np.asarray(cost, dtype=np.float64) / CREDIT,
                     path=path.astype(str), wait=wait.astype(float), grantable=(reason == ""),
                     reason=reason.astype(str))


    def _reclaim_wait(self) -> float:
        """SPEC §8: the reclaim path's wait, the longest grace a victim may have: the
        preemptible classes', and ``borrow_grace`` once a campaign may borrow (SPEC §14.8)."""
        graces = [cl.grace for cl in self.classes if cl.preemptible]
        if any(e.borrow_limit for e in self.envelopes.values()):
            graces.append(self.borrow_grace)
        return max(graces or [0.0])

    def explain(self, record: int | dict[str, Any]) -> str:
        """Why a decision came out as it did, in one paragraph.

        The paragraph is built from the record's rule inputs (SPEC §9), so it explains the
        decision as it was taken, not the state now.

        Parameters
        ----------
        record : int or dict
            A journal seq (``Decision.seq``), or a record itself.

        Returns
        -------
        str
            The explanation.

        Raises
        ------
        InvalidArgument
            ``record`` is a seq and the broker has no journal.
        """
        if self.journal is None and not isinstance(record, dict):
            raise InvalidArgument("record", "needs a journal: Broker(..., journal=...)", record)
        rec = dict(self.journal.record(record)  # type: ignore[union-attr]  # (checked above)
                   if not isinstance(record, dict) else record)
        if 0 <= rec.get("dim", -1) < len(self.dims):
            rec.setdefault("dim_name", self.dims[rec["dim"]])
        if 0 <= rec.get("cls", -1) < len(self.classes):
            rec.setdefault("class_name", self.classes[rec["cls"]].name)
        if 0 <= rec.get("campaign", -1) < len(self._names):
            rec.setdefault("campaign_name", self._names[rec["campaign"]])
        if 0 <= rec.get("level", -1) < len(self._names):                 # SPEC §14.2
            rec.setdefault("level_name", self._names[rec["level"]])
        return _explain(rec)

    @_op
    def state(self, *, leases: bool = True) -> dict[str, Any]:
        """A JSON-serialisable picture of the broker: pool, campaigns, leases (an empty list
        with ``leases=False``: what a metrics scrape reads, whatever the number of leases),
        pending."""
        t = self._now()
        self._advance(t)
        st, k = self.st, self._k
        deficit = self._deficit_array(t, commit=False)
        pool = {}
        for d, dn in enumerate(self.dims):
            pool[dn] = {"capacity": int(st.cap[d]), "occupied": int(st.occ[d]),
                        "free": int(k.free_now(st, d)), "firm": int(st.F[d]),
                        "unmet_guarantees": int(st.U[d]), "reclaimable": int(st.oppa[d]),
                        "revoking": int(st.rev[d]), "promised": int(st.prom[d]),
                        "reserved": int(st.cap[d]) - int(st.occ[d]) - int(k.free_now(st, d)),
                        "congestion": k.congestion_ppm(st, d) / PPM,
                        "warm_headroom": int(st.headroom[d])}
        camps: dict[str, dict[str, Any]] = {}
        # SPEC §14.2: a node reports its subtree's holdings (its own, for a flat campaign)
        held = st.subtree_sums(st.H[:st.C] - st.Xch[:st.C])
        firm_held = st.subtree_sums(st.Hf)
        for c, name in enumerate(self._names):
            if c in self._removed:          # SPEC §14.9
                continue
            for d in range(len(self.dims)):
                k.settle(st, c, d, t)
            left = int(st.left[c])
            camps[name] = {
                "credits_left": None if left >= MAXV else left / CREDIT,
                "credits_escrowed": int(st.escrow[c]) / CREDIT,
                "credits_spent": int(st.spent[c]) / CREDIT,
                "credits_refunded": int(st.refunded[c]) / CREDIT,
                "deficit": float(deficit[c]),
                "held": {dn: int(held[c, d]) for d, dn in enumerate(self.dims)},
                "firm_held": {dn: int(firm_held[c, d]) for d, dn in enumerate(self.dims)},
                "borrowed": {dn: int(st.bor[c, d, BOR_HELD]) for d, dn in enumerate(self.dims)},
                "tokens": {dn: (None if int(st.Bcap[c, d]) >= MAXV else int(st.T[c, d]) / NS)
                           for d, dn in enumerate(self.dims)},
                "tokens_refilled": {dn: (None if int(st.Bcap[c, d]) >= MAXV
                                         else int(st.tok_minted[c, d]) / NS)
                                    for d, dn in enumerate(self.dims)},
                "envelope": self.envelopes[name].to_json(),
            }
        return {"time": t / NS, "backend": self.backend, "pool": pool, "campaigns": camps,
                "leases": [l.to_dict() for l in self.leases()] if leases else [],
                "pending": self.pending()}
