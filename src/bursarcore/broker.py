"""The broker: admission policy over the C core (SPEC §3–§8, held dimensions).

:class:`Broker` owns the policy — validation, service classes, the pending queue and its
order, reclaim victims, events, supply and quotes — and asks the C core, through its
Cython or cffi binding (``broker.ENGINES["compiled"]``), to do the per-decision arithmetic
on an :class:`~bursarcore.admission.state.EngineState`. ``Broker(backend="reference")``
(and every ``Broker`` where the core is not built) is instead the reference broker,
:class:`bursarcore.reference.ReferenceBroker`, written from the specification: the same API
and, bit for bit, the same decisions.

With the Cython binding, ``acquire`` and the expiries first try ``_acquire.FastAcquire``: the
common case — plain intent values, no policy event due — in one C call, building the same
:class:`Decision`, :class:`Lease` and :class:`Event` objects and, with a journal, the same
records (then ``end_op``, as ``@_op`` does); anything else takes the general path.

A denial is a :class:`Decision` with ``outcome="refused"`` and a reason code; only bad input
raises (:class:`~bursarcore.errors.InvalidArgument`, naming the field and rule, before any
state changes).
"""

from __future__ import annotations

import abc
import dataclasses
import heapq
import json
import math
from typing import Any, Iterable, Mapping

import numpy as np

from . import _backend, units
from .admission.classes import DEFAULT_CLASSES, Congestion, ServiceClass
from .admission.envelope import MAX_DURATION, Envelope, Intent, Pool
from .admission.results import (GRANTED_OUT, PENDING_OUT, REFUSED_OUT, BatchResult,
                                Consumption, Decision, DimSupply, Quote, Supply)
from .admission.state import (ACTIVE, CAPACITY, CREDIT, DEADLINE, GRANTED, LEASE_STATES,
                              MAXV, OK, PPM, REASONS, RECLAIM, REFUSED, RELEASED, REVOKED,
                              REVOKING, STARTING, TOKENS, TTL, WARM, CANCELLED,
                              PENDING_LIMIT, REUSE_AFTER, ROW_MASK, EngineState)
from .clock import ManualClock
from .errors import InvalidArgument, TimeWentBackwards, UnknownCampaign, UnknownLease
from .journal import records as J
from .journal.base import Journal
from .journal.replay import replay_common
from .journal.replay import replay as _replay
from .admission.pending import PendingQueue, _Pending
from .leases.types import Event, Lease
from .admission.signals import SignalsMixin
from .admission.batching import BatchMixin
from .admission.consume import FlowMixin
from .leases.nodes import NodesMixin
from ._brokerbase import _EV_ACTIVATE, _EV_PENDING, _EV_REVOKE, NS, _op

__all__ = ["Broker", "Decision", "Lease", "Event", "Supply", "DimSupply", "Quote",
           "BatchResult", "Consumption", "BACKENDS", "ENGINES"]

MAX_PENDING = 1024          # Broker(max_pending=): pending intents per campaign, by default

# the C core's engine through the chosen binding: Cython by default, cffi when asked for
_compiled = (_backend.cffi("_cffi_engine") if _backend.REQUESTED == "cffi"
             else _backend.compiled("_engine"))
#: the C core's binding by backend name (empty where the core is not built)
ENGINES: dict[str, Any] = {"compiled": _compiled} if _compiled is not None else {}
#: the broker backends ``Broker(backend=...)`` takes here: the C core (when built) and the
#: reference broker written from the specification
BACKENDS: tuple[str, ...] = (("compiled",) if _compiled is not None else ()) + ("reference",)




def _wants_reference(backend: str | None) -> bool:
    """Whether ``Broker(backend=...)`` is the reference broker: asked for by name, or the
    only backend there is (no compiled build, or ``BURSARCORE_NO_EXTENSIONS=1``)."""
    if backend is None:
        return "compiled" not in ENGINES
    return backend == "reference"




# release / renew of a stale lease id (an ended lease whose row now holds a later lease): as
# for any ended lease, refused with "invalid" -- but its campaign, intent and record are gone
_STALE = Decision(REFUSED_OUT, -1, "", reason="invalid")




class Broker(SignalsMixin, BatchMixin, FlowMixin, NodesMixin, metaclass=abc.ABCMeta):
    """An agent resource broker over one pool.

    ``Broker(Pool(gpu=512), clock=ManualClock(0.0))``. Every decision is taken at the
    clock's time and is the same on every backend, bit for bit; bad input raises
    :class:`~bursarcore.errors.InvalidArgument` before any state changes, and a denial is
    a :class:`Decision` with a reason.

    Parameters
    ----------
    pool : Pool
        The capacity it hands out.
    clock : object, optional
        Anything with ``now() -> float`` seconds, never running backwards (default: a
        :class:`ManualClock` at 0.0).
    classes : iterable of ServiceClass, optional
        The service class table, names unique (default: SPEC §7's, ``DEFAULT_CLASSES``).
    congestion : Congestion, optional
        Congestion pricing (default: ``Congestion()``).
    price : mapping of str to float, optional
        Credits per unit-hour per held dimension (default 1), per unit per flow dimension
        (default 0).
    ttl : float, optional
        The longest wait of a pending intent, in seconds (default 900).
    half_life : float, optional
        The half-life of fair-share usage, in seconds (default 600; SPEC §6).
    enforcement : str, optional
        ``"prepaid"`` (the default) or, for experiments only, ``"instant"``.
    backend : str, optional
        ``"compiled"`` or ``"reference"`` (default: the first available, compiled first).
    cold_wait : callable, optional
        ``cold_wait(dim) -> seconds`` to a cold start, from a facility binding.
    journal : Journal, optional
        An empty journal to record every decision in (SPEC §9).
    durable : bool, optional
        Sync the journal at the end of every operation (default False).
    reuse_after : int or None, optional
        The rows of ended leases are reused once this many later leases have ended; None
        never reuses them (docs/policy.md, "Memory").
    max_pending : int or None, optional
        The most intents one campaign may have waiting in the pending queue (default
        1024); one more is refused with ``pending_limit``. None: no cap.

    Raises
    ------
    InvalidArgument
        An option breaks its rule, naming it (``"classes"``, ``"price[fs]"``,
        ``"journal"`` when it is not empty, ...).
    """

    def __new__(cls, pool: Any = None, clock: Any = None, *, backend: str | None = None,
                **options: Any) -> Any:
        # the reference backend is the specification's own broker, with the same API
        if cls is Broker and _wants_reference(backend):
            from .reference.broker import ReferenceBroker
            return ReferenceBroker(pool, clock, backend="reference", **options)
        return super().__new__(cls)

    def __init__(self, pool: Pool, clock: Any = None, *, classes: Iterable[ServiceClass] | None = None,
                 congestion: Congestion | None = None, price: Mapping[str, float] | None = None,
                 ttl: float = 900.0, half_life: float = 600.0, enforcement: str = "prepaid",
                 backend: str | None = None, cold_wait: Any = None,
                 journal: Journal | None = None, durable: bool = False,
                 reuse_after: int | None = REUSE_AFTER,
                 max_pending: int | None = MAX_PENDING) -> None:
        if not isinstance(pool, Pool):
            raise InvalidArgument("pool", "must be a Pool", pool)
        self.pool = pool
        self.clock = clock if clock is not None else ManualClock(0.0)
        self.classes = tuple(classes) if classes is not None else DEFAULT_CLASSES
        names = [c.name for c in self.classes]
        if not self.classes or len(set(names)) != len(names):
            raise InvalidArgument("classes", "must be a non-empty table with unique names", names)
        self._cls_index = {c.name: i for i, c in enumerate(self.classes)}
        self.congestion = congestion or Congestion()
        if enforcement not in ("prepaid", "instant"):
            raise InvalidArgument("enforcement", "must be 'prepaid' or 'instant'", enforcement)
        self.enforcement = enforcement
        for name, v, hi in (("ttl", ttl, units.MAX_TTL), ("half_life", half_life, MAX_DURATION)):
            if units.real(v, name, hi=hi, what="a number of seconds") <= 0:
                raise InvalidArgument(name, "must be > 0", v)
        self.ttl, self.half_life = float(ttl), float(half_life)
        if backend is None:
            backend = "compiled"                  # (no core: __new__ made a reference broker)
        if backend not in ENGINES:
            raise InvalidArgument("backend", f"must be one of {list(BACKENDS)}", backend)
        self.backend = backend
        self._k = ENGINES[backend]
        if reuse_after is not None and (not isinstance(reuse_after, int)
                                        or isinstance(reuse_after, bool) or reuse_after < 0):
            raise InvalidArgument("reuse_after", "must be None or an integer >= 0", reuse_after)
        self.reuse_after = reuse_after
        if max_pending is not None and (not isinstance(max_pending, int)
                                        or isinstance(max_pending, bool) or max_pending < 0):
            raise InvalidArgument("max_pending", "must be None or an integer >= 0", max_pending)
        self.max_pending = max_pending
        self.dims = pool.dims
        self._dim_index = {d: i for i, d in enumerate(self.dims)}
        price = dict(price or {})
        self.flow_dims = list(pool.flow)
        for d in price:
            if d not in self._dim_index and d not in pool.flow:
                raise InvalidArgument(f"price[{d}]", "names a dimension the pool lacks", d)
        # held: credits per unit-hour (default 1); flow: credits per unit (default 0)
        self.price = {d: units.real(price.get(d, 1.0), f"price[{d}]", hi=units.MAX_PRICE)
                      for d in self.dims}
        self.price.update({d: units.real(price.get(d, 0.0), f"price[{d}]", hi=units.MAX_PRICE)
                           for d in self.flow_dims})
        self.cold_wait = cold_wait  # callable(dim) -> seconds, from a facility binding
        self._t = units.to_ns(self.clock.now())
        self.st = EngineState(
            capacity=[pool.capacity[d] for d in self.dims],
            headroom=[pool.warm_headroom[d] for d in self.dims],
            slot_counts=[pool.capacity[d] for d in self.dims],
            classes=[(c.rank, round(c.multiplier * PPM), int(c.congestion_priced),
                      int(c.preemptible), units.to_ns(c.grace), int(c.free_when_broke))
                     for c in self.classes],
            price=[round(self.price[d] * CREDIT) for d in self.dims],
            cong_thresholds=[round(x * PPM) for x in self.congestion.thresholds],
            cong_mult=[round(x * PPM) for x in self.congestion.multipliers],
            window_ns=units.to_ns(self.congestion.window), bins=self.congestion.bins,
            instant=enforcement == "instant",
            half_life_ns=max(1, units.to_ns(self.half_life, "half_life")), epoch_ns=self._t,
            reuse_after=reuse_after)
        self.st.scal[0] = self._t // self.st.bin_ns
        self._flow_index = {d: i for i, d in enumerate(self.flow_dims)}
        self._flow_price = np.array([round(self.price[d] * CREDIT) for d in self.flow_dims],
                                    dtype=np.int64)
        self.flow = None
        if self.flow_dims:
            from .flow import FLOW_BACKENDS
            fcls = FLOW_BACKENDS.get(backend, FLOW_BACKENDS["reference"])
            self.flow = fcls(pool.flow, window=1.0, now=self._t / NS)
        self._node_of_slot = []
        self._node_names = []
        for d in self.dims:
            names, owner = [], []
            for j, (node, k) in enumerate(pool.slot_map[d]):
                names.append(node)
                owner.extend([j] * k)
            self._node_names.append(names)
            self._node_of_slot.append(np.array(owner, dtype=np.int64))
        self._slot_alive = [np.ones(pool.capacity[d], dtype=bool) for d in self.dims]
        self._draining = [0] * len(self.dims)  # retired slots still held by leases
        self._names: list[str] = []
        self._cindex: dict[str, int] = {}
        self.envelopes: dict[str, Envelope] = {}
        self._share = np.zeros(0)
        self._queue = PendingQueue(self, len(self.dims))
        self._pyev: list[tuple[int, int, int, int]] = []   # (time, kind, seq, id)
        self._seq = 0
        self._next_intent = 0
        self._events: list[Event] = []
        self._opp_active: list[set[int]] = [set() for _ in self.dims]
        self._revoking: list[set[int]] = [set() for _ in self.dims]
        self._activation: dict[int, int] = {}
        self._expired_buf = np.zeros(4096, dtype=np.int64)
        self._one_buf = np.zeros(1, dtype=np.int64)
        self._buf = np.zeros(4, dtype=np.int64)
        self._t_force: int | None = None      # replay drives exact integer times
        self._subscribers: list[Any] = []
        self._deficit_last = np.zeros(0)
        self._default_cls = np.zeros(0, dtype=np.int64)
        self._opp_default = False     # some campaign's own class is preemptible
        self._one_cls: int | None = None   # the class of every campaign's envelope, if one
        self._consts: dict[int, np.ndarray] = {}   # read-only constant columns (_constant)
        if journal is not None and not isinstance(journal, Journal):
            raise InvalidArgument("journal", "must be a bursarcore.journal.Journal", journal)
        if journal is not None and len(journal):
            raise InvalidArgument("journal", "is not empty: rebuild the broker from it with "
                                  "Broker.replay(journal)", len(journal))
        self.journal = journal
        self.durable = bool(durable)   # sync the journal at the end of every operation
        self._fast = None
        if backend == "compiled" and self._k.backend == "compiled":   # the Cython binding's
            try:                                 # fast path, a module built beside it
                from . import _acquire
            except ImportError:                  # (a build without it: the general path)
                pass
            else:
                self._fast = _acquire.FastAcquire(self, self._queue, Decision, Lease, Event,
                                                  Intent)
        if journal is not None:
            # built only here: the slot map as JSON lists is one list object per node (125k
            # for a 1M-GPU pool), and long-lived container objects make every full
            # collection of the cycle GC traverse them (it was a third of admit_batch's time)
            config = {"pool": pool.to_dict(), "classes": [vars(c) for c in self.classes],
                      "congestion": {"window": self.congestion.window,
                                     "bins": self.congestion.bins,
                                     "thresholds": list(self.congestion.thresholds),
                                     "multipliers": list(self.congestion.multipliers)},
                      "price": self.price, "ttl": self.ttl, "half_life": self.half_life,
                      "enforcement": enforcement, "reuse_after": reuse_after,
                      "max_pending": max_pending}
            row = {}
            row["op"] = J.OP["config"]
            row["t"] = self._t
            journal.add(row, json.dumps(config, sort_keys=True))

    # ------------------------------------------------------------------ registration
    @_op
    def register(self, name: str, envelope: Envelope) -> int:
        """Add a campaign, at any time.

        The sum of guarantees never exceeds the pool (SPEC §3), so a registration that
        would break a promise already made is refused, naming the guarantee.

        Parameters
        ----------
        name : str
            A new, non-empty campaign name.
        envelope : Envelope
            Its envelope; every dimension it names must be one of the pool's.

        Returns
        -------
        int
            The campaign's index, for :meth:`admit_batch` and :meth:`consume_batch`.

        Raises
        ------
        InvalidArgument
            ``name`` is empty or already registered; ``envelope`` is not an Envelope, has
            an unknown ``service_class``, names a dimension the pool lacks
            (``"ceiling[cpu]"``), or its guarantee would exceed the pool's capacity or the
            room firm holdings leave now (``"guaranteed[gpu]"``); with a journal, it is
            not JSON-serialisable.
        """
        if not isinstance(name, str) or not name:
            raise InvalidArgument("name", "must be a non-empty string", name)
        if name in self._cindex:
            raise InvalidArgument("name", "is already registered", name)
        if not isinstance(envelope, Envelope):
            raise InvalidArgument("envelope", "must be an Envelope", envelope)
        if envelope.service_class not in self._cls_index:
            raise InvalidArgument("service_class", f"must be one of {list(self._cls_index)}",
                                  envelope.service_class)
        for label, m in (("guaranteed", envelope.guaranteed), ("sustained", envelope.sustained),
                         ("ceiling", envelope.ceiling), ("burst", envelope.burst)):
            for d in m:
                if d not in self._dim_index and d not in self._flow_index:
                    raise InvalidArgument(f"{label}[{d}]", "names a dimension the pool lacks", d)
        t = self._now()
        g = [units.whole(envelope.g(d), f"guaranteed[{d}]") for d in self.dims]
        s = [units.whole(envelope.s(d), f"sustained[{d}]") for d in self.dims]
        b = [units.whole(envelope.b(d), f"ceiling[{d}]") for d in self.dims]
        for i, d in enumerate(self.dims):
            total_g = int(self.st.g[: self.st.C, i].sum()) + g[i]
            if total_g > self.pool.capacity[d]:
                raise InvalidArgument(f"guaranteed[{d}]", f"sum of guarantees {total_g} would "
                                      f"exceed the pool capacity {self.pool.capacity[d]}", g[i])
            if int(self.st.F[i]) + int(self.st.U[i]) + g[i] > self.pool.capacity[d]:
                raise InvalidArgument(f"guaranteed[{d}]", "firm holdings above guarantees leave "
                                      "no room for it now; retry when they end", g[i])
        Bcap = []
        for d in self.dims:
            B = envelope.B(d)
            if math.isinf(B):
                Bcap.append(MAXV)
            else:
                units.real(B, f"burst[{d}]", hi=units.MAX_BURST, allow_inf=True,
                           what="a number of unit-seconds")
                Bcap.append(round(B * NS))
        credits = envelope.credits
        budget = MAXV if math.isinf(credits) else round(credits * CREDIT)
        payload = None
        if self.journal is not None:
            # built before anything changes: a payload that cannot be written refuses the
            # registration instead of leaving a campaign live but unjournaled
            env = envelope.to_dict()
            env["credits"] = None if math.isinf(env["credits"]) else env["credits"]
            env["burst"] = {k: (None if math.isinf(v) else v) for k, v in env["burst"].items()}
            try:
                payload = json.dumps({"name": name, "envelope": env}, sort_keys=True,
                                     allow_nan=False)
            except (TypeError, ValueError) as e:
                raise InvalidArgument("envelope", f"must be JSON-serialisable ({e})",
                                      envelope) from None
        self._advance(t)
        if self.flow is not None:  # may refuse (naming the field) before anything changes
            fd = [d for d in self.flow_dims if d in envelope.dims()]
            self.flow.add_campaign(
                guaranteed={d: envelope.g(d) for d in fd}, sustained={d: envelope.s(d) for d in fd},
                ceiling={d: envelope.b(d) for d in fd}, burst={d: envelope.B(d) for d in fd},
                now=t / NS)
        c = self.st.add_campaign(g, s, b, Bcap, budget, t)
        self._names.append(name)
        self._cindex[name] = c
        self.envelopes[name] = envelope
        share = envelope.share if envelope.share is not None else (g[0] if g[0] > 0 else 1)
        self._share = np.append(self._share, float(share))
        self._deficit_last = np.append(self._deficit_last, np.nan)
        self._default_cls = np.append(self._default_cls,
                                      self._cls_index[envelope.service_class]).astype(np.int64)
        kc = self._cls_index[envelope.service_class]
        if self.classes[kc].preemptible:
            self._opp_default = True
        self._one_cls = kc if c == 0 or self._one_cls == kc else None
        if self.journal is not None:
            row = {}
            row["op"], row["t"], row["campaign"], row["outcome"] = J.OP["register"], t, c, 4
            self.journal.add(row, payload)
        return c

    def campaign_index(self, name: str) -> int:
        try:
            return self._cindex[name]
        except (KeyError, TypeError):
            raise UnknownCampaign("campaign", "is not registered", name) from None

    @property
    def campaigns(self) -> list[str]:
        return list(self._names)

    # ------------------------------------------------------------------ time
    def _now(self) -> int:
        if self._t_force is not None:
            return self._t_force
        t = units.to_ns(self.clock.now(), "clock")
        if t < self._t:
            raise TimeWentBackwards("clock", f"must not run backwards (last {self._t / NS})",
                                    t / NS)
        return t

    def _advance(self, t: int) -> None:
        """Run every event up to t in time order, then serve the pending queue."""
        k, st = self._k, self.st
        moved = t > self._t
        while self._pyev and self._pyev[0][0] <= t:
            te = self._pyev[0][0]
            self._expire_until(te)
            while self._pyev and self._pyev[0][0] == te:
                _, kind, _, ident = heapq.heappop(self._pyev)
                self._run_pyevent(kind, ident, te)
            self._serve_pending(te)
        # Serving a non-empty queue at a new time moves fair share without a decision of
        # its own: journal the advance (after what it causes) so replay serves it too.
        # Whether the queue is empty is read here, after the events due before t, never
        # before them: those events may have run already (a poll at their instant, which
        # writes no record) or may run only now (replay, at the next input), and both must
        # write the same records.
        note = moved and bool(self._queue.intents) and self.journal is not None
        k.ring_advance(st, t)
        freed = self._expire_until(t)
        if moved or freed:
            self._serve_pending(t)
        self._t = max(self._t, t)
        if note:
            row: dict[str, Any] = {}
            row["op"], row["t"], row["outcome"] = J.OP["advance"], t, 4
            self.journal.add(row)  # type: ignore[union-attr]  # note is set only with a journal

    def _expire_until(self, t: int) -> int:
        """Expire leases due by t. With a journal, one at a time, so each record's "state
        after" is the state right after that expiry, however the calls were spaced."""
        fast = self._fast
        if fast is not None and not self._subscribers and not any(self._draining):
            n: int = fast.expire(t)        # the same, compiled (events and records built in C)
            if n >= 0:                     # -1: a journal it does not write to (nothing done)
                return n
        k, st = self._k, self.st
        # one at a time with a journal, and with subscribers: a callback may grant, and a
        # grant may take the row of a lease ended but not yet reported
        buf = (self._one_buf if self.journal is not None or self._subscribers
               else self._expired_buf)
        total = 0
        while True:
            m: int = k.advance(st, t, buf)
            for lid in buf[:m].tolist():
                r = lid & ROW_MASK
                d = int(st.dim[r])
                self._opp_active[d].discard(lid)
                self._revoking[d].discard(lid)
                self._emit("expired", int(st.t_end[r]), int(st.camp[r]), lid=lid)
            if m:
                self._purge_retired()
            total += m
            if m < buf.shape[0]:
                return total

    _EV_OP = {"expired": "expire", "revoked": "revoke", "activated": "activate",
              "preempt_notice": "preempt", "granted": "grant", "refused": "refuse"}

    def _emit(self, kind: str, t: int, c: int, lid: int | None = None, iid: int | None = None,
              deadline: int | None = None, reason: int = 0, pend: _Pending | None = None,
              path: int = 0) -> None:
        """Queue an event for :meth:`poll` and journal it (a derived record)."""
        st = self.st
        n = 0
        if lid is not None:   # read the lease's row now: a subscriber may grant (and reuse it)
            r = lid & ROW_MASK
            n, d, lk, lintent, lcost = (int(st.units[r]), int(st.dim[r]), int(st.lcls[r]),
                                        int(st.intent[r]), int(st.cost[r]))
        if kind == "expired" or kind == "revoked":
            self._queue.lease_ended(c)
        ev = Event(kind, t / NS, self._names[c], lease_id=lid, intent_id=iid,
                   deadline=None if deadline is None else deadline / NS,
                   reason=REASONS[reason] if reason else None, units=n)
        self._events.append(ev)
        for fn in self._subscribers:
            fn(ev)
        if self.journal is None:
            return
        row: dict[str, Any] = {}
        row["op"], row["t"], row["campaign"], row["reason"] = J.OP[self._EV_OP[kind]], t, c, reason
        if lid is not None:
            row["lease"], row["units"], row["dim"] = lid, n, d
            row["cls"], row["intent"] = lk, lintent
            row["cost"] = lcost
            self._after(row, c, d)
        if pend is not None:
            row["intent"], row["dim"], row["cls"] = pend.intent_id, pend.dim, pend.cls
            row["nmin"], row["nmax"], row["dur"] = pend.nmin, pend.nmax, pend.dur
            row["max_spend"] = pend.max_spend
            row["rank"] = int(st.cls[pend.cls, 0])
            row["outcome"] = 1 if kind == "granted" else 3
            row["path"] = (1 if path == WARM else 2) if kind == "granted" else 0
            self._after(row, c, pend.dim)
        if deadline is not None:
            row["deadline"] = deadline
        self.journal.add(row)

    def _after(self, row: dict[str, Any], c: int, d: int) -> None:
        """The record's "state after" for (c, d), with the bucket settled to the record's
        time: an operation that does not touch the bucket (a refused release, a cancel)
        would otherwise record whatever an earlier, unjournaled read (``state()``,
        ``supply()``) happened to settle it to, and replay would differ. Settling is
        path-independent (refill at the rate H fixes between changes of H), so it changes
        no later figure."""
        st = self.st
        self._k.settle(st, c, d, int(row["t"]))
        row["tokens_after"] = int(st.T[c, d])
        row["credits_after"] = int(st.left[c])
        row["held_after"] = int(st.H[c, d])

    def _push(self, t: int, kind: int, ident: int) -> None:
        self._seq += 1
        heapq.heappush(self._pyev, (t, kind, self._seq, ident))

    def _run_pyevent(self, kind: int, ident: int, t: int) -> None:
        st = self.st
        if kind == _EV_REVOKE:
            r = st.row_of(ident)
            if r < 0:         # ended (and left the revoking set) long ago: its row is reused
                return
            self._revoking[int(st.dim[r])].discard(ident)
            if int(st.state[r]) == REVOKING and int(st.revoke_at[r]) == t:
                self._k.end_lease(st, ident, t, REVOKED)
                self._purge_retired()
                self._emit("revoked", t, int(st.camp[r]), lid=ident)
        elif kind == _EV_ACTIVATE:
            self._activation.pop(ident, None)
            r = st.row_of(ident)
            if r < 0:
                return
            if int(st.state[r]) == STARTING and int(st.top[int(st.dim[r])]) < int(
                    st.units[r]):
                # the pool shrank under a reclaim grant: it cannot be placed any more
                self._k.end_lease(st, ident, t, REVOKED)
                self._emit("revoked", t, int(st.camp[r]), lid=ident, reason=CAPACITY)
            elif int(st.state[r]) == STARTING:
                self._reserve(1, int(st.units[r]))
                self._k.activate(st, ident, t)
                self._emit("activated", t, int(st.camp[r]), lid=ident)
        elif kind == _EV_PENDING:
            p = self._queue.intents.get(ident)
            if p is not None and p.expires == t:
                reason = DEADLINE if p.deadline is not None and p.deadline <= t else TTL
                self._queue.drop(ident)
                self._emit("refused", t, p.campaign, iid=ident, reason=reason, pend=p)

    def _constant(self, value: int, n: int) -> np.ndarray:
        """A read-only int64 array of n copies of value, for the batch kernel's per-item
        inputs that are one value for the whole batch (dimension, duration, class): a
        view of a cached array, so a batch writes no column it does not need. Read-only,
        so a batch started inside another's event callback cannot disturb it."""
        a = self._consts.get(value)
        if a is None or a.shape[0] < n:
            if len(self._consts) >= 8:
                self._consts.clear()
            a = np.full(max(n, 1024), value, dtype=np.int64)
            a.flags.writeable = False
            self._consts[value] = a
        return a[:n]

    def _reserve(self, leases: int, slots: int) -> None:
        st = self.st
        # an operation never places more slot ids than are free now (the rest is refused
        # or waits), so an intent's max of up to 2**40 units does not size the arena
        # (the sum only when the arena could be short: a smaller slots needs no more room)
        n = st.scal.item(2)
        rows_short = (n + leases > st.camp.shape[0]
                      and n + leases > st.camp.shape[0] + st.reusable())
        if rows_short or st.arena_top.item(0) + slots > st.arena.shape[0]:
            slots = min(slots, int(st.top.sum()))
            if rows_short or st.arena_top.item(0) + slots > st.arena.shape[0]:
                st.grow_leases(leases, slots)
        if st.scal.item(3) + leases + 1 > st.heap_t.shape[0]:
            st.grow_heap()

    # ------------------------------------------------------------------ fair share (§6)
    def _fair_share(self, t: int) -> np.ndarray:
        """Usage at t (SPEC §6): ∫ H(τ)·2^(−(t − τ)/half-life) dτ on the primary held
        dimension, in unit-seconds, vectorised over all campaigns. Exact at any t: the
        kernels fold each campaign's holding into ``fs_S`` at every change of it
        (``fs_S`` = ∫ H·2^((τ − E)/half-life) up to its last change, at weight ``fs_G``),
        and H has been constant since. Pure: reads only."""
        st = self.st
        C = st.C
        hl, E = int(st.fs_par[0]), int(st.fs_par[1])
        inv = math.pow(2.0, -(float(t - E) / float(hl)))     # 1 / w(t); 0 once far past E
        H = st.H[:C, 0].astype(np.float64)
        scale = hl / math.log(2) / NS                         # unit-ns of weight -> unit-s
        return (st.fs_S[:C] * inv + H * (1.0 - st.fs_G[:C] * inv)) * scale

    @_op
    def deficits(self) -> dict[str, float]:
        """deficit_c = share_c / Σ share − usage_c / Σ usage (SPEC §6), at the broker time.
        A query: it does not move the fair-share state."""
        t = self._now()
        self._advance(t)
        return dict(zip(self._names, self._deficit_array(t, commit=False).tolist()))

    def _deficit_array(self, t: int, commit: bool = True) -> np.ndarray:
        """Deficits at t. Decisions (queue order, victims) ``commit`` them as the deficits
        their journal records carry (``deficit`` of acquire records)."""
        usage = self._fair_share(t)
        tot_share = self._share.sum()
        share = self._share / tot_share if tot_share > 0 else self._share
        tot = usage.sum()
        deficit = share - (usage / tot if tot > 0 else 0.0)
        if commit:
            self._deficit_last = deficit
        return deficit

    # ------------------------------------------------------------------ acquire
    def _class_of(self, campaign: str, name: str | None) -> int:
        cname = name if name is not None else self.envelopes[campaign].service_class
        try:
            return self._cls_index[cname]
        except KeyError:
            raise InvalidArgument("service_class", f"must be one of {list(self._cls_index)}",
                                  cname) from None

    def acquire(self, intent: Intent) -> Decision:
        """Decide an intent now (SPEC §4).

        Granted, pending or refused with a reason: a denial is a decision, not an
        exception, so only bad input raises, before any state changes.

        Parameters
        ----------
        intent : Intent
            The request.

        Returns
        -------
        Decision
            ``granted`` (with the lease, its path, cost and wait), ``pending`` (queued
            until its TTL or deadline; the binding ``reason`` and ``retry_after``) or
            ``refused`` (``reason``: ``ceiling``, ``capacity``, ``tokens``, ``credits``,
            ``deadline`` or ``pending_limit``).

        Raises
        ------
        UnknownCampaign
            ``intent.campaign`` is not registered.
        InvalidArgument
            ``intent`` is not an Intent, names a dimension the pool does not hold
            (``"units"``) or an unknown ``service_class``.
        TimeWentBackwards
            The clock ran backwards.
        """
        fast = self._fast
        if fast is not None:
            # the compiled common case (nothing unusual to do; with a journal it writes the
            # same records and ends the operation as @_op does); None when it does not
            # apply, with nothing changed
            dec: Decision | None = fast.acquire(intent)
            if dec is not None:
                return dec
        return self._acquire(intent)

    @_op
    def _acquire(self, intent: Intent) -> Decision:
        if not isinstance(intent, Intent):
            raise InvalidArgument("intent", "must be an Intent", intent)
        c = self.campaign_index(intent.campaign)
        d = self._dim_index.get(intent.dim)
        if d is None:
            raise InvalidArgument("units", f"dimension must be one of {self.dims}", intent.dim)
        k = self._class_of(intent.campaign, intent.service_class)
        nmin, nmax = intent.bounds
        dur = units.to_ns(intent.duration, "duration")
        spend = -1 if intent.max_spend is None else round(intent.max_spend * CREDIT)
        deadline = None if intent.deadline is None else units.to_ns(intent.deadline, "deadline")
        ttl = units.to_ns(intent.ttl if intent.ttl is not None else self.ttl, "ttl")
        t = self._now()
        self._advance(t)
        return self._acquire_ns(c, d, k, nmin, nmax, dur, spend, deadline, ttl, t, intent)

    def _acquire_ns(self, c: int, d: int, k: int, nmin: int, nmax: int, dur: int, spend: int,
                    deadline: int | None, ttl: int, t: int, request: Intent | None = None,
                    batch: int = 0, iid: int | None = None) -> Decision:
        """One intent in engine integers, journaled (the entry point replay uses)."""
        if iid is None:
            iid = self._next_intent
            self._next_intent += 1
        if self.journal is None:
            return self._decide_one(iid, c, d, k, nmin, nmax, dur, spend, deadline, ttl, t,
                                    request)
        row = self._request_row(c, d, k, nmin, nmax, dur, spend, deadline, ttl, t, iid, batch)
        dec = self._decide_one(iid, c, d, k, nmin, nmax, dur, spend, deadline, ttl, t, request)
        self._record_decision(row, dec, c, d)
        return dataclasses.replace(dec, seq=self.journal.add(row))

    def _request_row(self, c: int, d: int, k: int, nmin: int, nmax: int, dur: int, spend: int,
                     deadline: int | None, ttl: int, t: int, iid: int,
                     batch: int) -> dict[str, Any]:
        """A journal row with the request and the rule inputs as they stand before the
        decision (SPEC §9): class rank, deficit, tokens, credits, free/unmet capacity and
        the limit each rule sets on the size."""
        st, kern = self.st, self._k
        row: dict[str, Any] = {}
        row["op"], row["t"], row["campaign"], row["dim"], row["cls"] = J.OP["acquire"], t, c, d, k
        row["batch"] = batch
        row["nmin"], row["nmax"], row["dur"], row["max_spend"] = nmin, nmax, dur, spend
        row["deadline"] = J.deadline_field(deadline)
        row["ttl"], row["intent"] = ttl, iid
        row["rank"] = int(st.cls[k, 0])
        row["deficit"] = self._deficit_last[c]
        _, _, _, _, lims = kern.decide(st, c, d, k, nmin, nmax, dur, spend, t)
        row["tokens_before"], row["credits_before"] = int(st.T[c, d]), int(st.left[c])
        row["free"], row["unmet"] = kern.free_now(st, d), int(st.U[d])
        row["lim_ceiling"], row["lim_capacity"], row["lim_tokens"], row["lim_credits"] = \
            (min(x, MAXV) for x in lims)
        return row

    def _record_decision(self, row: dict[str, Any], dec: "Decision", c: int, d: int) -> None:
        row["outcome"] = {GRANTED_OUT: 1, PENDING_OUT: 2, REFUSED_OUT: 3}.get(dec.outcome, 4)
        row["reason"] = REASONS.index(dec.reason) if dec.reason else 0
        row["path"] = {"warm": 1, "reclaim": 2}.get(dec.path or "", 0)
        row["units"] = dec.units
        if dec.lease is not None:
            row["lease"] = dec.lease.id
            row["cost"] = int(self.st.cost[dec.lease.id & ROW_MASK])
        self._after(row, c, d)

    def _decide_one(self, iid: int, c: int, d: int, k: int, nmin: int, nmax: int, dur: int,
                    spend: int, deadline: int | None, ttl: int, t: int,
                    request: Intent | None) -> Decision:
        name = self._names[c]
        if deadline is not None and deadline < t:
            return Decision(REFUSED_OUT, iid, name, reason="deadline")
        self._reserve(1, nmax)
        buf = self._buf
        r = self._k.admit(self.st, c, d, k, nmin, nmax, dur, spend, t, iid, buf)
        if r == GRANTED:
            lid = int(buf[2])
            if not self.st.firm[lid & ROW_MASK]:
                self._opp_active[d].add(lid)
            return Decision(GRANTED_OUT, iid, name, units=int(buf[0]), lease=self.lease(lid),
                            path="warm", cost=int(buf[3]) / CREDIT)
        if r == REFUSED:
            reason = int(buf[1])
            return Decision(REFUSED_OUT, iid, name, reason=REASONS[reason],
                            retry_after=self._retry_after(c, d, nmin, dur, reason))
        return self._slow(iid, c, d, k, nmin, nmax, dur, spend, deadline, ttl, t, request)

    def _slow(self, iid: int, c: int, d: int, k: int, nmin: int, nmax: int, dur: int, spend: int,
              deadline: int | None, ttl: int, t: int, request: Intent | None) -> Decision:
        """Reclaim or pend: the parts of §4 that need policy (victims, queue)."""
        name = self._names[c]
        n, reason, path, pm, lims = self._k.decide(self.st, c, d, k, nmin, nmax, dur, spend, t)
        if n >= nmin and path == RECLAIM:
            plan = self._plan_reclaim(d, n, t)
            if deadline is not None and plan[1] > deadline:
                return Decision(REFUSED_OUT, iid, name, reason="deadline",
                                wait=(plan[1] - t) / NS)
            lid = self._reclaim(c, d, k, n, dur, pm, t, iid, plan)
            return Decision(GRANTED_OUT, iid, name, units=n, lease=self.lease(lid),
                            path="reclaim", cost=int(self.st.cost[lid & ROW_MASK]) / CREDIT,
                            wait=(self._activation[lid] - t) / NS)
        oldest = self._queue.full(c, self.max_pending)
        if oldest is not None:
            # at its cap: a slot frees by the time its oldest waiting intent expires
            return Decision(REFUSED_OUT, iid, name, reason=REASONS[PENDING_LIMIT],
                            retry_after=max(0, oldest.expires - t) / NS)
        if self.max_pending == 0:
            return Decision(REFUSED_OUT, iid, name, reason=REASONS[PENDING_LIMIT])
        expires = t + ttl
        if deadline is not None:
            expires = min(expires, deadline)
        self._queue.add(iid, c, d, k, nmin, nmax, dur, spend, deadline, expires, reason,
                        request, lims, t)
        self._push(expires, _EV_PENDING, iid)
        return Decision(PENDING_OUT, iid, name, reason=REASONS[reason],
                        retry_after=self._retry_after(c, d, nmin, dur, reason))

    def _track_opportunistic(self, d: int, lids: np.ndarray) -> None:
        """Remember leases the compiled loop granted that are opportunistic (victims)."""
        lids = lids[lids >= 0]
        self._opp_active[d].update(lids[self.st.firm[lids & ROW_MASK] == 0].tolist())

    def _plan_reclaim(self, d: int, n: int, t: int) -> tuple[list[int], int]:
        """Victims and activation time for a reclaim grant of n units on d at t: units
        already revoking but not promised come first (at their deadlines), then active
        opportunistic leases in preemption order, each after its class grace."""
        st = self.st
        need = n - max(0, self._k.free_now(st, d))
        at = t
        surplus = max(0, int(st.rev[d]) - int(st.prom[d]))
        if need > 0 and surplus > 0:
            at = max([at] + [int(st.revoke_at[l & ROW_MASK]) for l in self._revoking[d]])
            need -= surplus
        victims = []
        for lid in self._victims(d, t) if need > 0 else ():
            if need <= 0:
                break
            victims.append(lid)
            need -= int(st.units[lid & ROW_MASK])
            at = max(at, t + int(st.cls[int(st.lcls[lid & ROW_MASK]), 4]))
        if need > 0:  # decide() counted reclaimable units that the victim set lacks
            raise RuntimeError(f"bursarcore internal error: reclaim plan short by {need} units")
        return victims, at

    def _victims(self, d: int, t: int) -> list[int]:
        """Active opportunistic leases on d in preemption order: smallest fair-share
        deficit first, then largest lease, then lease id (SPEC §6)."""
        st = self.st
        ids = self._opp_active[d]
        if not ids:
            return []
        deficit = self._deficit_array(t)
        return sorted(ids, key=lambda l: (deficit[int(st.camp[l & ROW_MASK])],
                                          -int(st.units[l & ROW_MASK]), l))

    def _reclaim(self, c: int, d: int, k: int, n: int, dur: int, pm: int, t: int, iid: int,
                 plan: tuple[list[int], int]) -> int:
        """Preempt the planned victims (notice now, revoked after their grace) and grant a
        starting lease that becomes active when they are gone (SPEC §4.1, §4.6)."""
        st = self.st
        victims, at = plan
        for lid in victims:
            grace = int(st.cls[int(st.lcls[lid & ROW_MASK]), 4])
            deadline = self._k.preempt(st, lid, t, grace)
            self._opp_active[d].discard(lid)
            self._revoking[d].add(lid)
            self._push(deadline, _EV_REVOKE, lid)
            self._emit("preempt_notice", t, int(st.camp[lid & ROW_MASK]), lid=lid,
                       deadline=deadline)
        self._reserve(1, n)
        lid = self._k.grant(st, c, d, k, n, dur, pm, t, True, iid)
        self._activation[lid] = at
        self._push(at, _EV_ACTIVATE, lid)
        return lid  # type: ignore[no-any-return]  # the kernel (picked at run time) is untyped

    def _retry_after(self, c: int, d: int, nmin: int, dur: int, reason: int) -> float | None:
        st = self.st
        if reason == TOKENS:
            wait = self._k.token_wait(st, c, d, nmin, dur)
            return wait / NS if wait >= 0 else None
        if reason == CAPACITY:
            nxt = self._k.next_expiry(st)
            return max(0, nxt - self._t) / NS if nxt >= 0 else None
        return None

    # ------------------------------------------------------------------ pending queue (§4.5)
    _queue_by_key = True       # False: every pass intent by intent (tests compare the two)

    def _serve_pending(self, t: int) -> None:
        """Grant what the queue can have at t, in the order of SPEC §4.5."""
        self._queue.serve(t)

    def _wake_due(self, t: int) -> bool:
        """Whether a pass at t has a key to decide (``PendingQueue.wake_due``)."""
        return self._queue.wake_due(t)

    def _grant_pending(self, p: _Pending, n: int, path: int, pm: int, plan: Any,
                       t: int) -> None:
        st = self.st
        self._queue.drop(p.intent_id)
        if path == WARM:
            lid = self._k.grant(st, p.campaign, p.dim, p.cls, n, p.dur, pm, t, False,
                                p.intent_id)
            if not st.firm[lid & ROW_MASK]:
                self._opp_active[p.dim].add(lid)
        else:
            lid = self._reclaim(p.campaign, p.dim, p.cls, n, p.dur, pm, t, p.intent_id, plan)
        self._emit("granted", t, p.campaign, lid=lid, iid=p.intent_id, pend=p, path=path)


    @_op
    def cancel(self, intent_id: int) -> bool:
        """Withdraw a pending intent.

        Parameters
        ----------
        intent_id : int
            The id of an intent this broker decided (``Decision.intent_id``).

        Returns
        -------
        bool
            True if it was pending and is withdrawn; False if it is no longer pending
            (granted, refused, expired or cancelled already).

        Raises
        ------
        UnknownLease
            ``intent_id`` is not an intent of this broker (``field`` is ``"intent_id"``).
        """
        if isinstance(intent_id, (bool, np.bool_)) or not isinstance(intent_id, (int, np.integer)):
            raise UnknownLease("intent_id", "is not an intent of this broker", intent_id)
        intent_id = int(intent_id)
        t = self._now()
        self._advance(t)
        if intent_id not in self._queue.intents:
            if isinstance(intent_id, int) and 0 <= intent_id < self._next_intent:
                return False
            raise UnknownLease("intent_id", "is not an intent of this broker", intent_id)
        p = self._queue.drop(intent_id)
        if self.journal is not None:
            row = {}
            row["op"], row["t"], row["campaign"], row["intent"] = J.OP["cancel"], t, p.campaign, intent_id
            row["dim"], row["cls"], row["outcome"], row["reason"] = p.dim, p.cls, 4, CANCELLED
            self._after(row, p.campaign, p.dim)
            self.journal.add(row)
        return True

    def pending(self, campaign: str | None = None) -> list[dict[str, Any]]:
        """The pending intents, in arrival order, each with the rule that binds it now.

        A read: the reason is worked out from the state as it stands, and nothing moves.

        Parameters
        ----------
        campaign : str, optional
            Only this campaign's (read from its own index); default all.

        Returns
        -------
        list of dict
            One per intent: ``intent_id``, ``campaign``, ``dim``, ``min``, ``max``,
            ``duration``, ``reason``, ``expires`` (broker time) and ``service_class``.

        Raises
        ------
        UnknownCampaign
            ``campaign`` is not registered.
        """
        c = None if campaign is None else self.campaign_index(campaign)
        return self._queue.listing(c)

    # ------------------------------------------------------------------ leases
    def _lease_id(self, lease_id: Any) -> int:
        """``lease_id`` as an int, if this broker issued it (it may have ended since, and
        its row may hold a later lease: see :meth:`_row`)."""
        if isinstance(lease_id, (bool, np.bool_)) or not isinstance(lease_id, (int, np.integer)):
            raise UnknownLease("lease_id", "is not a lease of this broker", lease_id)
        try:
            self.st.row_of(int(lease_id))
        except KeyError:
            raise UnknownLease("lease_id", "is not a lease of this broker", lease_id) from None
        return int(lease_id)

    def _row(self, lid: int) -> int:
        """The row of an issued lease id, or -1 when the lease has ended and its row holds
        a later lease (a stale id: see docs/policy.md, "Memory")."""
        return self.st.row_of(lid)

    def _lease_info(self, r: int) -> tuple[int, int, int, int, int] | None:
        """(campaign, dim, class, intent, units) of the lease in row r (None: stale), read
        before an operation that may end it and let its row be reused."""
        if r < 0:
            return None
        st = self.st
        return (int(st.camp[r]), int(st.dim[r]), int(st.lcls[r]), int(st.intent[r]),
                int(st.units[r]))

    @_op
    def release(self, lease_id: int) -> Decision:
        """End a lease early: its units free now, unused tokens and credits are refunded.

        Parameters
        ----------
        lease_id : int
            A lease this broker issued.

        Returns
        -------
        Decision
            ``released``, with the units, the ended lease and ``cost`` the refund
            (negative); or ``refused`` with reason ``invalid`` if the lease has ended
            already (for an ended lease whose record was reused: intent id -1 and no
            campaign).

        Raises
        ------
        UnknownLease
            ``lease_id`` is not a lease of this broker.
        """
        lid = self._lease_id(lease_id)
        t = self._now()
        self._advance(t)
        r = self._row(lid)          # after the advance: it may have ended (and been reused)
        info = self._lease_info(r)
        return self._journaled(J.OP["release"], lid, info, t, 0, -1, self._release(lid, r, t))

    def _release(self, lid: int, r: int, t: int) -> Decision:
        st = self.st
        if r < 0:
            return _STALE
        state = int(st.state[r])
        c = int(st.camp[r])
        name = self._names[c]
        if state not in (STARTING, ACTIVE, REVOKING):
            return Decision(REFUSED_OUT, int(st.intent[r]), name, reason="invalid",
                            lease=self.lease(lid))
        before = int(st.refunded[c])
        self._k.end_lease(st, lid, t, RELEASED)
        self._queue.lease_ended(c)
        self._purge_retired()
        d = int(st.dim[r])
        self._opp_active[d].discard(lid)
        self._revoking[d].discard(lid)
        self._activation.pop(lid, None)
        refund = int(st.refunded[c]) - before
        # the decision before serving the queue: a grant there may take this row
        dec = Decision("released", int(st.intent[r]), name, units=int(st.units[r]),
                       lease=self.lease(lid), cost=-refund / CREDIT)
        self._serve_pending(t)
        return dec

    def _journaled(self, op: int, lid: int, info: tuple[Any, ...] | None, t: int, ext: int,
                   spend: int,
                   dec: Decision) -> Decision:
        """Journal a release or renew decision on lease ``lid`` (``info``: its
        :meth:`_lease_info` from before the decision; None for a stale id, whose record
        names no campaign and carries no state after)."""
        if self.journal is None:
            return dec
        row = {}
        row["op"], row["t"], row["lease"] = op, t, lid
        if info is not None:
            c, d, k, intent, n = info
            row["campaign"], row["dim"] = c, d
            row["cls"], row["intent"], row["units"] = k, intent, n
        row["dur"], row["max_spend"] = ext, spend
        row["outcome"] = {GRANTED_OUT: 1, REFUSED_OUT: 3}.get(dec.outcome, 4)
        row["reason"] = REASONS.index(dec.reason) if dec.reason else 0
        row["cost"] = round(dec.cost * CREDIT)
        if op == J.OP["renew"] and info is not None:
            row["tokens_before"], row["credits_before"] = self._renew_before
        if info is not None:
            self._after(row, c, d)
        return dataclasses.replace(dec, seq=self.journal.add(row))

    @_op
    def renew(self, lease_id: int, duration: float, max_spend: float | None = None) -> Decision:
        """Extend an active lease by ``duration`` seconds.

        The extension passes SPEC §4.2 and §4.3 (tokens, credits) atomically: granted in
        full or refused with nothing changed.

        Parameters
        ----------
        lease_id : int
            A lease this broker issued.
        duration : float
            Seconds to add, one microsecond to ten years.
        max_spend : float, optional
            The most credits the extension may cost.

        Returns
        -------
        Decision
            ``granted`` (path ``warm``, ``cost`` the extension's price) or ``refused``
            with the rule (``tokens``, ``credits``; ``invalid`` for a lease that is not
            active), with the lease as it stands.

        Raises
        ------
        UnknownLease
            ``lease_id`` is not a lease of this broker.
        InvalidArgument
            ``duration`` or ``max_spend`` is out of range, or the lease would end past
            the engine's time range.
        """
        lid = self._lease_id(lease_id)
        ext = units.to_ns(units.real(duration, "duration", lo=units.MIN_DURATION,
                                     hi=MAX_DURATION, what="a number of seconds"), "duration")
        spend = -1 if max_spend is None else round(
            units.real(max_spend, "max_spend", hi=units.MAX_CREDITS) * CREDIT)
        t = self._now()
        self._advance(t)
        r = self._row(lid)
        if r >= 0 and int(self.st.t_end[r]) + ext > units.MAX_NS:
            raise InvalidArgument("duration", "would end the lease past the engine's time "
                                  f"range ({units.MAX_SECONDS:.6g} s)", duration)
        return self._journaled(J.OP["renew"], lid, self._lease_info(r), t, ext, spend,
                               self._renew(lid, r, ext, spend, t))

    def _renew(self, lid: int, r: int, ext: int, spend: int, t: int) -> Decision:
        st = self.st
        if r < 0:
            return _STALE
        c, d = int(st.camp[r]), int(st.dim[r])
        name = self._names[c]
        self._k.settle(st, c, d, t)
        self._renew_before = (int(st.T[c, d]), int(st.left[c]))
        if int(st.state[r]) != ACTIVE:
            return Decision(REFUSED_OUT, int(st.intent[r]), name, reason="invalid",
                            lease=self.lease(lid))
        self._reserve(1, 0)
        reason, price = self._k.renew(st, lid, ext, t, spend)
        if reason == OK:
            self._queue.lease_ended(c)          # (a renewal can refund tokens)
        if reason != OK:
            return Decision(REFUSED_OUT, int(st.intent[r]), name, reason=REASONS[reason],
                            lease=self.lease(lid), cost=price / CREDIT)
        return Decision(GRANTED_OUT, int(st.intent[r]), name, units=int(st.units[r]),
                        lease=self.lease(lid), path="warm", cost=price / CREDIT)

    def lease(self, lease_id: int) -> Lease:
        """The lease ``lease_id``, live or ended.

        An ended lease's record is kept until its row is reused (after ``reuse_after``
        later leases have ended), so memory stays bounded however many leases end.

        Parameters
        ----------
        lease_id : int
            A lease this broker issued.

        Returns
        -------
        Lease
            A snapshot of it now.

        Raises
        ------
        UnknownLease
            ``lease_id`` is not a lease of this broker, or it has ended and its record was
            reused (the message says so).
        """
        lid = self._lease_id(lease_id)
        r = self._row(lid)
        if r < 0:
            raise UnknownLease("lease_id", "has ended and its record was reused (it keeps no "
                               "record once reuse_after later leases have ended)", lease_id)
        st = self.st
        (camp, d, n, firm, state, k, t_grant, t_start, t_end, cost, off, revoke_at,
         intent) = (a.item(r) for a in (st.camp, st.dim, st.units, st.firm, st.state, st.lcls,
                                        st.t_grant, st.t_start, st.t_end, st.cost,
                                        st.slot_off, st.revoke_at, st.intent))
        slots: tuple[int, ...] = ()
        placement: tuple[tuple[str, int], ...] = ()
        if state == ACTIVE or state == REVOKING:
            slots = tuple(st.arena[off:off + n].tolist())
            owner = self._node_of_slot[d].take(slots).tolist()
            count: dict[int, int] = {}
            for j in owner:  # nodes in order of first appearance
                count[j] = count.get(j, 0) + 1
            names = self._node_names[d]
            placement = tuple([(names[j], c) for j, c in count.items()])
        started = off >= 0  # a reclaim grant released before its activation never started
        return Lease(
            id=lid, campaign=self._names[camp], dim=self.dims[d], units=n,
            state=LEASE_STATES[state], firm=bool(firm), service_class=self.classes[k].name,
            granted_at=t_grant / NS, start=t_start / NS if started else None,
            expiry=t_end / NS if started else None, cost=cost / CREDIT,
            revoke_at=revoke_at / NS if state in (REVOKING, REVOKED) else None,
            intent=intent, placement=placement, slots=slots)

    @_op
    def leases(self, campaign: str | None = None) -> list[Lease]:
        """The live leases: starting, active or revoking.

        Parameters
        ----------
        campaign : str, optional
            Only this campaign's; default all.

        Returns
        -------
        list of Lease
            Snapshots, after advancing to the clock (leases due to expire have ended).

        Raises
        ------
        UnknownCampaign
            ``campaign`` is not registered.
        """
        t = self._now()
        self._advance(t)
        st = self.st
        n = st.nleases
        live = (st.state[:n] == STARTING) | (st.state[:n] == ACTIVE) | (st.state[:n] == REVOKING)
        if campaign is not None:
            live &= st.camp[:n] == self.campaign_index(campaign)
        return [self.lease(st.lease_id(r)) for r in np.flatnonzero(live).tolist()]

    @_op
    def poll(self) -> list[Event]:
        """Advance to the clock and return the events since the last poll.

        Each event is returned once, in the order it happened, so a caller polling in a
        loop sees every expiry, revocation and pending grant exactly once.

        Returns
        -------
        list of Event
            The events, oldest first.
        """
        t = self._now()
        self._advance(t)
        ev, self._events = self._events, []
        if self._fast is not None:         # expiries the compiled path queued unbuilt
            ev = self._fast.events(ev, True)
        return ev

    def _queued_events(self) -> list[Event]:
        """The events the next :meth:`poll` returns so far, without taking them."""
        ev = self._events
        return list(ev if self._fast is None else self._fast.events(ev, False))

    # ------------------------------------------------------------------ journal (§9)
    def sync(self) -> int:
        """Make every journaled decision durable; returns the highest durable seq (-1
        without a journal). A decision is acknowledged once its ``seq`` ≤ this."""
        return self.journal.flush() if self.journal is not None else -1

    @classmethod
    def replay(cls, journal: Journal, *, backend: str | None = None, clock: Any = None,
               resume: bool = True) -> "Broker":
        """Rebuild a broker from its journal (SPEC §9, invariant 8).

        Every input record is re-executed at its recorded time; the records the rebuilt
        broker writes must equal the journal's, field for field, or
        :class:`~bursarcore.errors.JournalCorrupt` names the first that differs. With
        ``resume`` the broker goes on appending to ``journal``.
        """
        if cls is Broker and _wants_reference(backend):
            from .reference.broker import ReferenceBroker
            return ReferenceBroker.replay(journal, clock=clock, resume=resume)  # type: ignore[return-value]
        return _replay(cls, journal, _replay_one, backend=backend, clock=clock, resume=resume,
                       attach=_attach_journal)



def _register_reference() -> None:
    from .reference.broker import ReferenceBroker
    abc.ABCMeta.register(Broker, ReferenceBroker)   # the same API: isinstance(b, Broker) holds for both


_register_reference()


def _attach_journal(b: Broker, journal: Journal) -> None:
    b.journal = journal


def _replay_one(b: Broker, op: int, r: np.ndarray, payload: str | None, t: int) -> None:
    """Re-execute one input record of a journal at its time t (see :meth:`Broker.replay`)."""
    if replay_common(b, op, r, payload, t):
        return
    if op == J.OP["acquire"]:
        b._advance(t)
        deadline = J.deadline_of(int(r["deadline"]))
        b._acquire_ns(int(r["campaign"]), int(r["dim"]), int(r["cls"]), int(r["nmin"]),
                      int(r["nmax"]), int(r["dur"]), int(r["max_spend"]), deadline,
                      int(r["ttl"]), t, None, batch=int(r["batch"]))
    else:                                    # renew
        lid = b._lease_id(int(r["lease"]))
        b._advance(t)
        row = b._row(lid)
        b._journaled(op, lid, b._lease_info(row), t, int(r["dur"]), int(r["max_spend"]),
                     b._renew(lid, row, int(r["dur"]), int(r["max_spend"]), t))
