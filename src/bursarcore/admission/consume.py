"""Flow dimensions (SPEC §5): consumption metered by rate, one call or a batch."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import units
from ..admission.results import Consumption
from ..admission.state import CAPACITY, CREDIT, CREDITS, MAXV, REASONS, TOKENS, wrap
from ..errors import InvalidArgument
from ..journal import records as J
from .paths import refuse_removed
from .._brokerbase import NS, BrokerBase, _op

__all__ = ["FlowMixin"]


class FlowMixin(BrokerBase):
    """The broker's flow consumption: ``consume`` and ``consume_batch``."""

    # ------------------------------------------------------------------ flow dimensions (§5)
    @_op
    def consume(self, campaign: str, dim: str, amount: float) -> Consumption:
        """Consume ``amount`` units of a flow dimension now (throttle at source, SPEC §5).

        The guaranteed bucket serves first; the rest must pass the campaign's sustained and
        peak buckets and the facility's shared bucket. A priced dimension (``price=``, in
        credits per unit) also charges credits, and is limited by them. What does not pass
        is a value to retry, not an error.

        Parameters
        ----------
        campaign : str
            A registered campaign.
        dim : str
            A flow dimension of the pool.
        amount : float
            Units to consume, >= 0.

        Returns
        -------
        Consumption
            The units allowed now, and when and why the rest may be retried.

        Raises
        ------
        UnknownCampaign
            ``campaign`` is not registered.
        InvalidArgument
            ``dim`` is not a flow dimension, or ``amount`` is out of range.
        """
        c = self.campaign_index(campaign)
        fd = self._flow_index.get(dim) if isinstance(dim, str) else None
        if fd is None:
            raise InvalidArgument("dim", f"must be a flow dimension, one of {self.flow_dims}", dim)
        a = units.to_fixed(amount, "amount")
        t = self._now()
        self._advance(t)
        return self._consume_ns(c, fd, a, t)

    def _consume_ns(self, c: int, fd: int, a: int, t: int) -> Consumption:
        st = self.st
        price = int(self._flow_price[fd])
        path = st.path(c)               # SPEC §5, §14.2: every budget on the path binds
        left = min(int(st.left[v]) for v in path)
        ask = a
        if price:       # an unlimited budget (left = MAXV) bounds the cost by MAXV, as decide
            ask = min(a, min(left, MAXV) * units.SCALE // price)
        # (only flow dimensions get here, and a broker with flow dimensions has self.flow)
        allowed, retry, bound = self.flow.consume_fixed(
            np.array([c], np.int64), np.array([fd], np.int64), np.array([ask], np.int64),
            np.array([t], np.int64))
        got, wait = int(allowed[0]), int(retry[0])
        reason = 0
        if got < a:
            reason = CREDITS if got == ask and ask < a else (CAPACITY if int(bound[0]) == 3 else TOKENS)
        cost = -(-got * price // units.SCALE) if price else 0
        for v in path if cost else ():
            if int(st.left[v]) < MAXV:
                st.left[v] -= cost
            st.spent[v] = wrap(int(st.spent[v]) + cost)
            st.cred_debited[v] = wrap(int(st.cred_debited[v]) + cost)
        from ..flow import NEVER
        retry_s = 0.0 if got >= a else (math.inf if wait == NEVER or reason == CREDITS else wait / NS)
        seq = -1
        if self.journal is not None:
            row = {}
            row["op"], row["t"], row["campaign"] = J.OP["consume"], t, c
            row["dim"], row["nmax"], row["units"] = len(self.dims) + fd, a, got
            row["cost"], row["reason"], row["outcome"] = cost, reason, 1 if got >= a else 3
            row["dur"] = -1 if wait == NEVER else wait
            row["credits_after"] = int(st.left[c])
            seq = self.journal.add(row)
        return Consumption(self._names[c], self.flow_dims[fd], a / units.SCALE,
                           got / units.SCALE, retry_s, REASONS[reason] or None,
                           cost / CREDIT, seq)

    @_op
    def consume_batch(self, campaign_idx: Any, dims: Any, amounts: Any) -> tuple[np.ndarray, np.ndarray]:
        """Many consumptions at this instant, exactly as the same sequence of
        :meth:`consume` calls.

        The compiled loop decides them at once when no priced dimension is involved, and
        their journal records are then written as one block.

        Parameters
        ----------
        campaign_idx : array_like of int
            Campaign indices (from :meth:`register`), shape (n,).
        dims : str, int or array_like
            Flow dimensions by name or index, a scalar or shape (n,).
        amounts : float or array_like of float
            Units to consume, a scalar or shape (n,).

        Returns
        -------
        allowed : numpy.ndarray
            Units allowed now, per item.
        retry_after : numpy.ndarray
            Seconds after which the rest may pass: 0.0 when all passed, ``inf`` when never.

        Raises
        ------
        InvalidArgument
            The pool has no flow dimensions, or an argument breaks its rule, naming it
            (``"dims"``, ``"campaign_idx"``, ``"amounts"``).
        """
        if self.flow is None:
            raise InvalidArgument("dims", "the pool has no flow dimensions")
        st = self.st
        ci = units.index_array(campaign_idx, st.C, "campaign_idx")
        if self._removed:                           # SPEC §14.9
            refuse_removed(ci, self._removed)
        n = ci.shape[0]
        di = units.dim_column(dims, self._flow_index, n)
        amt = units.fixed_array(amounts, "amounts", n)
        t = self._now()
        self._advance(t)
        priced = bool(self._flow_price[di].any()) if n else False
        if priced:
            out = [self._consume_ns(int(ci[j]), int(di[j]), int(amt[j]), t) for j in range(n)]
            return (np.array([o.allowed for o in out], dtype=float),
                    np.array([o.retry_after for o in out], dtype=float))
        from ..flow import NEVER
        allowed, retry, bound = self.flow.consume_fixed(ci, di, amt, np.array([t], np.int64))
        if self.journal is not None and n:
            # the records _consume_ns writes, one per item, as one block (unpriced: no
            # cost, no budget moved, so a refusal is the tokens' or the capacity's)
            rows = J.new_rows(n)
            rows["op"], rows["t"], rows["campaign"] = J.OP["consume"], t, ci
            rows["dim"], rows["nmax"], rows["units"] = len(self.dims) + di, amt, allowed
            short = allowed < amt
            rows["reason"] = np.where(short, np.where(bound == 3, CAPACITY, TOKENS), 0)
            rows["outcome"] = np.where(short, 3, 1)
            rows["dur"] = np.where(retry == NEVER, -1, retry)
            rows["credits_after"] = st.left[ci]
            self.journal.append(rows)
        secs = retry / NS
        secs[retry == NEVER] = math.inf
        secs[allowed >= amt] = 0.0
        return allowed / units.SCALE, secs

    def subscribe(self, callback: Any) -> None:
        """Call ``callback(event)`` for every event as it happens (a facility binding
        enforces revocations this way), in addition to queueing it for :meth:`poll`."""
        if not callable(callback):
            raise InvalidArgument("callback", "must be callable", callback)
        self._subscribers.append(callback)
