"""Many intents at one instant (:meth:`Broker.admit_batch`): the same decisions as the
same sequence of acquires, columns in and out."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from .. import units
from ..admission.batch import batch_units as _batch_units
from ..admission.envelope import Intent, intent_inputs
from ..admission.results import BatchResult, Decision
from ..admission.state import CAPACITY, LIMITS, REASONS, ROW_MASK, TOKENS
from ..batchprep import finish, minmax
from ..clock import ManualClock
from ..errors import InvalidArgument, TimeWentBackwards
from ..journal.base import Journal
from ..journal.fill import REC_WIDTH
from .paths import refuse_removed
from .._brokerbase import (_DUR_RULE, _MAX_DURATION, _MIN_DURATION, _OUTCOME_CODE, NS,
                           BrokerBase, _op)

__all__ = ["BatchMixin", "RUN_MIN"]

#: the shortest run of like intents ``_acquire_many`` hands to the compiled
#: loop (a shorter one takes the single path: the loop's setup would cost more)
RUN_MIN = 4
# columns of the loop's per-item record (journal/fill.py): tokens and held after the item
_T_AFTER, _H_AFTER = 4 + len(LIMITS), 6 + len(LIMITS)


class BatchMixin(BrokerBase):
    """The broker's batch admission."""

    if TYPE_CHECKING:      # acquire's decision builders (admission.acquire)
        def _warm_decision(self, iid: int, c: int, n: int, lid: int, cost: int,
                           seq: int = -1) -> Decision: ...
        def _refusal(self, iid: int, c: int, reason: int, retry_after: float | None,
                     seq: int = -1) -> Decision: ...
        def _retry_after(self, c: int, d: int, nmin: int, dur: int, reason: int,
                         nxt: int | None = None) -> float | None: ...

    # ------------------------------------------------------------------ batch
    @_op
    def admit_batch(self, campaign_idx: Any, units_: Any, durations: Any, now: float | None = None,
                    *, service_class: str | int | None = None, dim: str | None = None,
                    ttl: float | None = None) -> BatchResult:
        """Decide many intents at one instant, exactly as the same sequence of
        :meth:`acquire` calls would.

        Warm grants and certain refusals run in the compiled loop; reclaim and pending
        items drop to the policy layer one at a time. The whole batch is checked before
        any item is decided.

        Parameters
        ----------
        campaign_idx : array_like of int
            Campaign indices (from :meth:`register`), shape (n,).
        units_ : array_like of int
            Shape (n,) (min = max) or (n, 2) (min, max); 1 <= min <= max.
        durations : float or array_like of float
            Seconds, a scalar or shape (n,).
        now : float, optional
            The instant, >= the broker time (default: the clock's); a
            :class:`ManualClock` behind it is moved forward to it.
        service_class : str, optional
            A class name (default: each campaign's).
        dim : str, optional
            A held dimension (default: the primary one).
        ttl : float, optional
            The longest wait in the pending queue for the items that go pending (default:
            the broker's, as ``Intent.ttl``).

        Returns
        -------
        BatchResult
            Units granted, reason codes, lease ids, outcome codes and intent ids.

        Raises
        ------
        InvalidArgument
            An argument breaks its rule, naming it and the first bad position
            (``"units"``, ``"durations"``, ``"campaign_idx"``, ``"dim"``,
            ``"service_class"``, ``"ttl"``).
        TimeWentBackwards
            ``now`` is before the broker time.
        """
        st, cur = self.st, self._cur
        ci = units.index_array(campaign_idx, st.C, "campaign_idx")
        if self._removed:                           # SPEC §14.9
            refuse_removed(ci, self._removed)
        n = ci.shape[0]
        nmin, nmax, top = _batch_units(units_, n)
        if isinstance(durations, (int, float)) and not isinstance(durations, bool):
            # one duration for the batch: validated once (the same rounding as ns_array)
            one = units.to_ns(durations, "durations")
            if not _MIN_DURATION <= one <= _MAX_DURATION:
                raise InvalidArgument("durations", _DUR_RULE, durations)
            dur = self._constant(one, n)
        else:
            dur = units.ns_array(durations, "durations", n)     # a new contiguous column
            lo, hi = minmax(dur) if n else (_MIN_DURATION, _MIN_DURATION)
            if not _MIN_DURATION <= lo <= hi <= _MAX_DURATION:
                bad = int(np.flatnonzero((dur < _MIN_DURATION) | (dur > _MAX_DURATION))[0])
                raise InvalidArgument("durations", _DUR_RULE,
                                      f"{int(dur[bad]) / NS!r} at position {bad}")
        d = self._dim_index.get(dim if dim is not None else self.dims[0])
        if d is None:
            raise InvalidArgument("dim", f"must be one of {self.dims}", dim)
        if service_class is None and self._one_cls is not None:
            ks = self._constant(self._one_cls, n)       # every campaign has this class
            opp = self._opp_default
        elif service_class is None:
            ks = cur.default_cls.take(ci)
            opp = self._opp_default
        else:
            name = service_class if isinstance(service_class, str) else None
            kk = self._cls_index.get(name) if name else None
            if kk is None:
                raise InvalidArgument("service_class", f"must be one of {list(self._cls_index)}",
                                      service_class)
            ks = self._constant(kk, n)
            opp = self.classes[kk].preemptible
        if ttl is not None and units.real(ttl, "ttl", hi=units.MAX_TTL,
                                          what="a number of seconds") <= 0:  # as Intent.ttl
            raise InvalidArgument("ttl", "must be > 0", ttl)
        ttl_ns = units.to_ns(ttl if ttl is not None else cur.ttl, "ttl")
        t = self._now() if now is None else units.to_ns(now)
        if t < cur.t:
            raise TimeWentBackwards("now", f"must be >= the broker time {cur.t / NS}", t / NS)
        clock = cur.clock
        if isinstance(clock, ManualClock) and t / NS > clock.now():
            clock.set(t / NS)
        self._advance(t)
        return self._admit_batch_loop(ci, ks, d, nmin, nmax, dur, t, ttl_ns, opp, top)

    def _admit_batch_loop(self, ci: np.ndarray, ks: np.ndarray, d: int, nmin: np.ndarray,
                          nmax: np.ndarray, dur: np.ndarray, t: int, ttl: int, opp: bool = True,
                          top: int | None = None) -> BatchResult:
        """Warm grants and certain refusals in the compiled loop; a slow item (reclaim or
        pending) goes through the single path, flagged as part of the batch. With a
        journal, the loop also returns each item's rule inputs and state after, and its
        records go in as one columnar append, equal field for field to what the single
        path (which replay uses) writes. ``opp`` is False when no item's class is
        preemptible: the loop's grants are then all firm and none needs tracking as a
        reclaim victim. ``top`` (the largest max, if known) bounds the batch's slots, so
        their exact sum is needed only when the bound does not fit the arena."""
        st = self.st
        n = ci.shape[0]
        # every item is written by the loop or by the single path (np.empty, not zeros)
        out_n = np.empty(n, dtype=np.int64)
        out_r = np.empty(n, dtype=np.int64)
        out_l = np.empty(n, dtype=np.int64)
        slow = []                        # (item, outcome code) decided by the single path
        cur = self._cur
        rec = np.empty((n, REC_WIDTH), dtype=np.int64) if cur.journal is not None else None
        dims = self._constant(d, n)
        iid0 = cur.next_intent
        cur.next_intent += n
        slots = n * top if top is not None else None
        if slots is None or st.arena_top.item(0) + slots > st.arena.shape[0]:
            slots = int(nmax.sum()) if n else 0
        self._reserve(n, slots)
        private = False
        j = 0
        while j < n:
            j0 = j
            j = self._k.admit_batch(st, ci, ks, dims, nmin, nmax, dur, t, iid0, out_n, out_r,
                                    out_l, j, rec)
            if j > j0:
                if opp:
                    self._track_opportunistic(d, out_l[j0:j])
                if rec is not None:
                    self._journal_batch(j0, j, ci, ks, d, nmin, nmax, dur, t, iid0, ttl,
                                        out_n, out_r, out_l, rec)
            if j >= n:
                break
            if not private:
                # campaign_idx and units may be the caller's arrays, checked once; the single
                # path can run event callbacks, so the rest of the batch reads copies
                private = True
                same = nmax is nmin
                ci, nmin = ci.copy(), nmin.copy()
                nmax = nmin if same else nmax.copy()
            dec = self._acquire_ns(int(ci[j]), d, int(ks[j]), int(nmin[j]), int(nmax[j]),
                                   int(dur[j]), -1, None, ttl, t, None,
                                   batch=1 if j == 0 else 2, iid=iid0 + j)
            slow.append((j, _OUTCOME_CODE[dec.outcome]))
            out_n[j] = dec.units if dec.granted else 0
            out_r[j] = REASONS.index(dec.reason) if dec.reason else 0
            out_l[j] = dec.lease.id if dec.lease else -1
            j += 1
        # no lease: refused (units 0), unless the single path said pending
        out_o, iids = finish(out_n, out_l, iid0)
        for j, code in slow:
            out_o[j] = code
        return BatchResult(out_n, out_r, out_l, out_o, iids)

    def _journal_batch(self, j0: int, j: int, ci: np.ndarray, ks: np.ndarray, d: int,
                       nmin: np.ndarray, nmax: np.ndarray, dur: np.ndarray, t: int, iid0: int,
                       ttl: int, out_n: np.ndarray, out_r: np.ndarray, out_l: np.ndarray,
                       rec: np.ndarray, batch: bool = True) -> int:
        """Items j0..j of the compiled loop as ``acquire`` records, written in one pass
        from the loop's outputs straight into the journal's storage (journal/fill.py);
        flagged as a batch's items unless ``batch`` is False (the records of single
        acquires). Returns the seq of the first."""
        from ..journal.fill import fill_acquire
        jn: Journal = self.journal  # type: ignore[assignment]  # called only with a journal
        rows = jn.reserve(j - j0)
        seq0 = jn.next_seq
        fill_acquire(rows, seq0, j0, t, d, ttl, iid0, ci, ks, nmin, nmax, dur, out_n,
                     out_r, out_l, rec, self.st.cls[:, 0], self._cur.deficit_last, self.st.cost)
        if not batch:
            rows["batch"] = 0
        jn.append_reserved(rows)
        return seq0

    # ------------------------------------------------------------------ many acquires
    @_op
    def _acquire_many(self, intents: Sequence[Intent]) -> list[Decision]:
        """Decide intents in order at one instant, each exactly as :meth:`acquire` decides
        it at that instant: the same :class:`Decision`, the same journal records and the
        same state as that sequence of acquires with the clock read once.

        A run of consecutive intents of one held dimension and TTL without a deadline or
        a ``max_spend`` (what :meth:`admit_batch` expresses) goes through the compiled
        batch loop, and each decision is built from what the loop returns and the lease
        it created, as :meth:`acquire` builds it; reclaims, pending items and every other
        intent take the single path. Every intent is checked before any is decided.

        Parameters
        ----------
        intents : sequence of Intent
            The requests, in the order they are decided.

        Returns
        -------
        list of Decision
            One per intent, in order.

        Raises
        ------
        UnknownCampaign, InvalidArgument, TimeWentBackwards
            As :meth:`acquire`, for the first intent that breaks a rule; nothing changed.
        """
        # an intent's inputs read only what deciding leaves alone (the registry, the
        # classes, the default TTL), and are all read before any is decided: an intent
        # object sent again (the stream's shapes) is read once, and is one row of `table`
        # (read in compiled code, as acquire reads it, where the Cython binding can)
        read = self._fast.inputs if self._fast is not None else None
        seen: dict[int, int] = {}
        uniq: list[tuple[Any, ...]] = []
        at = []                          # each intent's row
        for x in intents:
            r = seen.get(id(x))
            if r is None:
                r = seen[id(x)] = len(uniq)
                got = read(x) if read is not None else None
                uniq.append(got if got is not None else intent_inputs(self, x))
            at.append(r)
        # what a run is of (held dimension, TTL), None for an intent no run may hold
        like = [(x[1], x[8]) if x[6] is None and x[7] is None else None for x in uniq]
        kinds = [like[r] for r in at]
        table = np.array([x[:6] for x in uniq], dtype=np.int64)
        rows = np.array(at, dtype=np.intp)
        t = self._now()
        n = len(at)
        out: list[Decision] = []
        i = 0
        while i < n:
            kind = kinds[i]
            j = i + 1
            if kind is not None:
                while j < n and kinds[j] == kind:
                    j += 1
            if j - i >= RUN_MIN and kind is not None:
                self._advance(t)
                out.extend(self._acquire_run(table[rows[i:j]], intents[i:j], kind[0], kind[1],
                                             t))
            else:
                for q in range(i, j):
                    c, d, k, nmin, nmax, dur, spend, deadline, ttl = uniq[at[q]]
                    self._advance(t)          # each acquire runs what is due first
                    out.append(self._acquire_ns(c, d, k, nmin, nmax, dur,
                                                -1 if spend is None else spend, deadline,
                                                ttl, t, intents[q]))
            i = j
        return out

    def _acquire_run(self, cols: np.ndarray, intents: Sequence[Intent], d: int, ttl: int,
                     t: int) -> list[Decision]:
        """A run of :meth:`_acquire_many` (one dimension and TTL, no deadline or
        max_spend; ``cols``: each intent's campaign row, dimension, class row, min and max
        units and duration) through the compiled loop at t; a slow item (reclaim or
        pending) through the single path, as an acquire. Each segment the loop decides gets
        its decisions before the next item runs, so every lease is read as it stood after
        its grant."""
        st, cur = self.st, self._cur
        m = len(cols)
        ci = np.ascontiguousarray(cols[:, 0])
        ks = np.ascontiguousarray(cols[:, 2])
        nmin = np.ascontiguousarray(cols[:, 3])
        nmax = np.ascontiguousarray(cols[:, 4])
        dur = np.ascontiguousarray(cols[:, 5])
        out_n = np.empty(m, dtype=np.int64)
        out_r = np.empty(m, dtype=np.int64)
        out_l = np.empty(m, dtype=np.int64)
        rec = np.empty((m, REC_WIDTH), dtype=np.int64)
        dims = self._constant(d, m)
        iid0 = cur.next_intent
        cur.next_intent += m
        self._reserve(m, int(nmax.sum()))
        decs: list[Decision] = []
        j = 0
        while j < m:
            j0 = j
            nxt = self._k.next_expiry(st)       # as it stands before the segment
            j = self._k.admit_batch(st, ci, ks, dims, nmin, nmax, dur, t, iid0, out_n, out_r,
                                    out_l, j, rec)
            if j > j0:
                self._track_opportunistic(d, out_l[j0:j])
                seq0 = -1
                if cur.journal is not None:
                    seq0 = self._journal_batch(j0, j, ci, ks, d, nmin, nmax, dur, t, iid0, ttl,
                                               out_n, out_r, out_l, rec, batch=False)
                self._segment_decisions(decs, j0, j, ci, d, nmin, dur, iid0, out_n, out_r,
                                        out_l, rec, nxt, seq0)
            if j >= m:
                break
            c, _, k, a, b, du = (int(x) for x in cols[j])
            decs.append(self._acquire_ns(c, d, k, a, b, du, -1, None, ttl, t, intents[j],
                                         iid=iid0 + j))
            j += 1
            self._advance(t)                  # what the slow item made due at t, if anything
        return decs

    def _segment_decisions(self, decs: list[Decision], j0: int, j: int, ci: np.ndarray,
                           d: int, nmin: np.ndarray, dur: np.ndarray, iid0: int,
                           out_n: np.ndarray, out_r: np.ndarray, out_l: np.ndarray,
                           rec: np.ndarray, nxt: int, seq0: int) -> None:
        """The decisions on items j0..j of the compiled loop, built by acquire's own
        builders (those of its compiled common case, ``FastAcquire.grants``, for a segment
        of grants only, with the Cython binding). A refusal's ``retry_after`` reads the
        state as it stood at the refusal (a refusal changes neither): the bucket from the
        item's record when a later grant moved it, the next expiry from the one before the
        segment and the leases granted since."""
        fast = self._fast
        if fast is not None and fast.grants(decs, iid0, j0, j, ci, out_n, out_l, seq0) == j:
            return                       # every item a grant: built in compiled code
        st = self.st
        cost, t_end = st.cost, st.t_end
        n_l, n_n, n_r, n_c = (out_l[j0:j].tolist(), out_n[j0:j].tolist(),
                              out_r[j0:j].tolist(), ci[j0:j].tolist())
        last = -1                        # the segment's last grant
        if TOKENS in n_r or CAPACITY in n_r:
            last = max((q for q, lid in enumerate(n_l) if lid >= 0), default=-1)
        first = -1                       # the earliest expiry of the grants so far
        for q in range(j - j0):
            i = j0 + q
            lid = n_l[q]
            seq = seq0 + q if seq0 >= 0 else -1
            if lid >= 0:
                decs.append(self._warm_decision(iid0 + i, n_c[q], n_n[q], lid,
                                                int(cost[lid & ROW_MASK]), seq))
                if last > q:
                    e = int(t_end[lid & ROW_MASK])
                    first = e if first < 0 else min(first, e)
                continue
            c, reason = n_c[q], n_r[q]
            a, du = int(nmin[i]), int(dur[i])
            if last > q and reason == TOKENS:
                ra = self._tokens_then(c, d, a, du, int(rec[i, _T_AFTER]), int(rec[i, _H_AFTER]))
            elif last > q and reason == CAPACITY:
                at = first if nxt < 0 else nxt if first < 0 else min(nxt, first)
                ra = self._retry_after(c, d, a, du, reason, at)
            else:
                ra = self._retry_after(c, d, a, du, reason)
            decs.append(self._refusal(iid0 + i, c, reason, ra, seq))

    def _tokens_then(self, c: int, d: int, nmin: int, dur: int, tokens: int,
                     held: int) -> float | None:
        """The ``tokens`` retry_after of a refusal with c's bucket on d as it stood then
        (``tokens``, ``held``): the engine's own wait, read with those two put back for
        the call."""
        st = self.st
        now = int(st.T[c, d]), int(st.H[c, d])
        st.T[c, d], st.H[c, d] = tokens, held
        try:
            return self._retry_after(c, d, nmin, dur, TOKENS)
        finally:
            st.T[c, d], st.H[c, d] = now
