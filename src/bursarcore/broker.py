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
import heapq
import json
import math
from typing import Any, Iterable, Mapping

import numpy as np

from . import _backend, units
from .admission.acquire import AcquireMixin
from .admission.batching import BatchMixin
from .admission.classes import DEFAULT_CLASSES, Congestion, ServiceClass
from .admission.consume import FlowMixin
from .admission.envelope import MAX_DURATION, Envelope, Intent, Pool
from .admission.fairshare import fair_tree_keys, level_deficits
from .admission.paths import (EnvelopeFigures, change_budget, check_change, check_guarantees,
                               check_name, envelope_figures, flow_unchanged)
from .admission.pending import PendingQueue
from .admission.results import (BatchResult, Consumption, Decision, DimSupply, Quote,
                                Supply)
from .admission.signals import SignalsMixin
from .admission.state import BOR_LEND, BOR_LIMIT, CREDIT, MAXV, PPM, REUSE_AFTER, EngineState
from .clock import ManualClock
from .errors import InvalidArgument, TimeWentBackwards, UnknownCampaign
from .journal import records as J
from .journal.base import Journal
from .journal.replay import replay as _replay
from .journal.replay import replay_common
from .leases.lifecycle import LifecycleMixin
from .leases.nodes import NodesMixin
from .leases.types import Event, Lease
from ._brokerbase import NS, Cursor, _op

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


def _sum_in_order(x: np.ndarray) -> float:
    """Σ x added left to right, as SPEC §6 sums (numpy's ``sum`` adds in pairs and rounds
    differently once there are more than eight terms)."""
    return float(np.cumsum(x)[-1]) if len(x) else 0.0


class Broker(AcquireMixin, LifecycleMixin, SignalsMixin, BatchMixin, FlowMixin, NodesMixin,
             metaclass=abc.ABCMeta):
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
    borrow_grace : float, optional
        Seconds between the notice to a borrowed lease and its revocation when the pool
        needs its units back (default 60; SPEC §14.8), > 0.

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
                 max_pending: int | None = MAX_PENDING, borrow_grace: float = 60.0) -> None:
        if not isinstance(pool, Pool):
            raise InvalidArgument("pool", "must be a Pool", pool)
        self.pool = pool
        clock = clock if clock is not None else ManualClock(0.0)
        self._cur = Cursor(journal=None, durable=False, clock=clock, ttl=900.0,
                           t=units.to_ns(clock.now()))
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
        if units.real(borrow_grace, "borrow_grace", hi=MAX_DURATION,
                      what="a number of seconds") <= 0:
            raise InvalidArgument("borrow_grace", "must be > 0", borrow_grace)
        self.borrow_grace = float(borrow_grace)
        self._borrow_grace_ns = units.to_ns(self.borrow_grace, "borrow_grace")
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
            half_life_ns=max(1, units.to_ns(self.half_life, "half_life")), epoch_ns=self._cur.t,
            reuse_after=reuse_after)
        self.st.scal[0] = self._cur.t // self.st.bin_ns
        self._flow_index = {d: i for i, d in enumerate(self.flow_dims)}
        self._flow_price = np.array([round(self.price[d] * CREDIT) for d in self.flow_dims],
                                    dtype=np.int64)
        self.flow = None
        if self.flow_dims:
            from .flow import FLOW_BACKENDS
            fcls = FLOW_BACKENDS.get(backend, FLOW_BACKENDS["reference"])
            self.flow = fcls(pool.flow, window=1.0, now=self._cur.t / NS)
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
        self._removed: set[int] = set()       # SPEC §14.9: removed nodes' indices
        self.envelopes: dict[str, Envelope] = {}
        self._share = np.zeros(0)
        self._queue = PendingQueue(self, len(self.dims))
        self._pyev: list[tuple[int, int, int, int]] = []   # (time, kind, seq, id)
        self._seq = 0
        self._opp_active: list[set[int]] = [set() for _ in self.dims]
        self._revoking: list[set[int]] = [set() for _ in self.dims]
        self._activation: dict[int, int] = {}
        self._expired_buf = np.zeros(4096, dtype=np.int64)
        self._one_buf = np.zeros(1, dtype=np.int64)
        self._buf = np.zeros(4, dtype=np.int64)
        self._subscribers: list[Any] = []
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
                self._fast = _acquire.FastAcquire(self._acquire_port(), Decision, Lease, Event,
                                                  Intent, Cursor)
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
                      "max_pending": max_pending, "borrow_grace": self.borrow_grace}
            row = {}
            row["op"] = J.OP["config"]
            row["t"] = self._cur.t
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
            A new, non-empty campaign name; ``"parent/child"`` registers a node of a
            tree of envelopes under the registered node ``parent`` (SPEC §14).
        envelope : Envelope
            Its envelope; every dimension it names must be one of the pool's.

        Returns
        -------
        int
            The campaign's index, for :meth:`admit_batch` and :meth:`consume_batch`.

        Raises
        ------
        InvalidArgument
            ``name`` is empty or already registered, or a path (``"astro/survey"``, a node
            of a tree of envelopes, SPEC §14) whose parent is not registered, with an
            empty segment or more than ``TREE_DEPTH`` levels; ``envelope`` is not an
            Envelope, has an unknown ``service_class``, names a dimension the pool lacks
            (``"ceiling[cpu]"``), or its guarantee would exceed the pool's capacity (a
            child's: its parent's, with its siblings') or the room holdings leave now
            (``"guaranteed[gpu]"``); with a journal, it is not JSON-serialisable.
        """
        if not isinstance(name, str) or not name:
            raise InvalidArgument("name", "must be a non-empty string", name)
        if name in self._cindex:
            raise InvalidArgument("name", "is already registered", name)
        parent = check_name(name, self._cindex)                           # SPEC §14.1
        t = self._now()
        bl, ll, g, s, b, Bcap, budget = self._figures(envelope)
        check_guarantees(self.st, self._k, self.dims, self._names, parent, g)
        payload = None
        if self.journal is not None:
            # built before anything changes: a payload that cannot be written refuses the
            # registration instead of leaving a campaign live but unjournaled
            try:
                payload = json.dumps({"name": name, "envelope": envelope.to_json()},
                                     sort_keys=True,
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
        c = self.st.add_campaign(g, s, b, Bcap, budget, t, top=parent is None)
        if parent is None:                  # SPEC §14.8: a sibling of the top-level nodes
            self._k.enlist(self.st, c)
        self.st.bor[c, :, BOR_LIMIT] = bl
        self.st.bor[c, :, BOR_LEND] = ll
        if parent is None and any(bl):      # SPEC §14.8: decided through the tree's walk
            self._make_root(c)
        if parent is not None:              # SPEC §14.1: its guarantee joins its parent's path
            if not self.st.in_tree(parent):
                self._queue.wake_campaign(parent)   # its pending keys: decided at every pass
            self._k.link(self.st, c, parent, t)
        self._names.append(name)
        self._cindex[name] = c
        self.envelopes[name] = envelope
        share = envelope.share if envelope.share is not None else (g[0] if g[0] > 0 else 1)
        self._share = np.append(self._share, float(share))
        self._cur.deficit_last = np.append(self._cur.deficit_last, np.nan)
        self._cur.default_cls = np.append(self._cur.default_cls,
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

    def _figures(self, envelope: Envelope) -> EnvelopeFigures:
        """An envelope's figures in engine units (:func:`envelope_figures`)."""
        return envelope_figures(envelope, self._cls_index, self._dim_index, self._flow_index,
                                MAXV)

    def change(self, name: str, envelope: Envelope) -> None:
        """Replace a registered node's envelope (SPEC §14.9), as a journaled decision.

        Live leases keep running as granted; the new figures bind later decisions.

        Parameters
        ----------
        name : str
            A registered campaign (a node of a tree of envelopes, or a flat campaign).
        envelope : Envelope
            Its new envelope.

        Raises
        ------
        UnknownCampaign
            ``name`` is not registered.
        InvalidArgument
            Naming the field and the rule, changing nothing: the new guarantee would not
            nest (its children's guarantees above it, or it with its siblings above its
            parent's guarantee or the pool's capacity), a raise would not fit the reserve
            or the loads on its parent's path now (``"guaranteed[gpu]"``, as a
            registration's); a figure of a flow dimension changes; the budget changes
            between unlimited and finite, or would leave its credits left below 0
            (``"credits"``); anything :meth:`register` refuses of an envelope.
        """
        c = self.campaign_index(name)
        t = self._now()
        bl, ll, g, s, b, Bcap, budget = self._figures(envelope)
        old = self.envelopes[name]
        flow_unchanged(old, envelope, self.flow_dims)
        check_change(self.st, self._k, self.dims, self._names, c, g)      # SPEC §14.9
        change_budget(old.credits, envelope.credits, int(self.st.budget[c]), budget,
                      int(self.st.left[c]))
        payload = None
        if self.journal is not None:
            try:
                payload = json.dumps({"name": name, "envelope": envelope.to_json()},
                                     sort_keys=True, allow_nan=False)
            except (TypeError, ValueError) as e:
                raise InvalidArgument("envelope", f"must be JSON-serialisable ({e})",
                                      envelope) from None
        self._advance(t)
        i64 = np.int64
        self._k.change_node(self.st, c, np.array(g, i64), np.array(s, i64), np.array(b, i64),
                            np.array(Bcap, i64), budget, t)
        self.st.bor[c, :, BOR_LIMIT] = bl
        self.st.bor[c, :, BOR_LEND] = ll
        if any(bl) and self.st.parent(c) < 0:   # SPEC §14.8: decided through the tree's walk
            self._make_root(c)
        self.envelopes[name] = envelope
        self._share[c] = float(envelope.share if envelope.share is not None
                               else (g[0] if g[0] > 0 else 1))
        kc = self._cls_index[envelope.service_class]
        self._cur.default_cls[c] = kc
        if self.classes[kc].preemptible:
            self._opp_default = True
        if self._one_cls != kc:
            self._one_cls = None
        self._queue._wake_all()     # the new figures bind its pending keys and their paths
        if self.journal is not None:
            row = {}
            row["op"], row["t"], row["campaign"], row["outcome"] = J.OP["change"], t, c, 4
            self.journal.add(row, payload)

    def remove(self, name: str) -> None:
        """Remove a node (SPEC §14.9), as a journaled decision: one with no children, no
        live leases (starting, active or revoking) and no pending intents. Its guarantee
        leaves its parent's and the pool's figures as a change of it to 0 would; its index
        is never reused; its name becomes unknown and may be registered again as a new
        node. Its past usage still counts in its parent's subtree usage (SPEC §14.6).

        Raises
        ------
        UnknownCampaign
            ``name`` is not registered.
        InvalidArgument
            Naming ``name``: it has children, live leases or pending intents.
        """
        c = self.campaign_index(name)
        t = self._now()
        self._advance(t)
        st = self.st
        up = st.up[:st.C, 0] if st.D else np.zeros(st.C, np.int64)
        if any(int(v) not in self._removed for v in np.flatnonzero(up == c + 1)):
            raise InvalidArgument("name", "has children: remove them first", name)
        if self.leases(name):
            raise InvalidArgument("name", "has live leases (starting, active or revoking): "
                                  "remove it when they end", name)
        if self._queue.by_campaign.get(c):
            raise InvalidArgument("name", "has pending intents: remove it when they are "
                                  "decided or cancelled", name)
        D = len(self.dims)
        self._k.change_node(st, c, np.zeros(D, np.int64), np.array(st.s[c, :D]),
                            np.array(st.b[c, :D]), np.array(st.Bcap[c, :D]),
                            int(st.budget[c]), t)
        st.bor[c, :, BOR_LIMIT] = 0
        st.bor[c, :, BOR_LEND] = 0
        self._share[c] = 0.0
        self._removed.add(c)
        del self._cindex[name]
        del self.envelopes[name]
        self._queue._wake_all()     # its guarantee left its parent's and the pool's
        if self.journal is not None:
            row = {}
            row["op"], row["t"], row["campaign"], row["outcome"] = J.OP["remove"], t, c, 4
            self.journal.add(row, json.dumps({"name": name}, sort_keys=True))

    def campaign_index(self, name: str) -> int:
        try:
            return self._cindex[name]
        except (KeyError, TypeError):
            raise UnknownCampaign("campaign", "is not registered", name) from None

    @property
    def campaigns(self) -> list[str]:
        if self._removed:
            return [n for c, n in enumerate(self._names) if c not in self._removed]
        return list(self._names)

    # ------------------------------------------------------------------ time
    def _now(self) -> int:
        if self._cur.t_force is not None:
            return self._cur.t_force
        t = units.to_ns(self.clock.now(), "clock")
        if t < self._cur.t:
            raise TimeWentBackwards("clock", f"must not run backwards (last {self._cur.t / NS})",
                                    t / NS)
        return t

    def _make_root(self, c: int) -> None:
        """SPEC §14.8: flat campaign c becomes the root of a tree of its own, decided through
        the tree's walk (the core's ``make_root``)."""
        self.st.keep_ancestor_excess()
        self._k.make_root(self.st, c)

    def _advance(self, t: int) -> None:
        """Run every event up to t in time order, then serve the pending queue."""
        k, st = self._k, self.st
        moved = t > self._cur.t
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
        self._cur.t = max(self._cur.t, t)
        if note:
            row: dict[str, Any] = {}
            row["op"], row["t"], row["outcome"] = J.OP["advance"], t, 4
            self.journal.add(row)  # type: ignore[union-attr]  # note is set only with a journal

    # replay's hold on time (journal.replay): each input re-executed at its recorded ns
    def _start_time(self, t: int) -> None:
        """Replay: the broker's time is ``t`` ns exactly (the journal's first record)."""
        self._cur.t = t

    def _pin_time(self, t: int | None) -> None:
        """Replay: take the next operations at ``t`` ns (None: at the clock's time again)."""
        self._cur.t_force = t

    def _end_replay(self) -> int:
        """Replay is over: time is the clock's again, and the events the replayed inputs
        queued are dropped (the original delivered them). Returns the broker's time (ns)."""
        self._cur.t_force = None
        self._cur.events = []
        return self._cur.t

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
        H = (st.H[:C, 0] - st.Xch[:C, 0]).astype(np.float64)   # own units (SPEC §14.2)
        scale = hl / math.log(2) / NS                         # unit-ns of weight -> unit-s
        return (st.fs_S[:C] * inv + H * (1.0 - st.fs_G[:C] * inv)) * scale

    @_op
    def deficits(self) -> dict[str, float]:
        """deficit_c = share_c / Σ share − usage_c / Σ usage (SPEC §6), at the broker time;
        with a tree of envelopes each node's level deficit among its siblings (SPEC §14.6).
        A query: it does not move the fair-share state."""
        t = self._now()
        self._advance(t)
        deficit = self._deficit_array(t, commit=False).tolist()
        return {n: deficit[c] for c, n in enumerate(self._names) if c not in self._removed}

    def _deficit_array(self, t: int, commit: bool = True) -> np.ndarray:
        """Deficits at t. Decisions (queue order, victims) ``commit`` them as the deficits
        their journal records carry (``deficit`` of acquire records)."""
        usage = self._fair_share(t)
        if self.st.has_tree():          # SPEC §14.6: each node among its siblings
            deficit = level_deficits(self._share, usage, self._parents())
        else:
            tot_share = _sum_in_order(self._share)
            share = self._share / tot_share if tot_share > 0 else self._share
            tot = _sum_in_order(usage)
            deficit = share - (usage / tot if tot > 0 else 0.0)
        if commit:
            self._cur.deficit_last = deficit
        return deficit

    def _fair_keys(self, t: int) -> np.ndarray:
        """The fair-share order of decisions (queue §4.5, victims §6), larger first: the
        deficits, or with a tree the Fair Tree order (SPEC §14.6). Commits the deficits
        the decisions' records carry."""
        deficit = self._deficit_array(t)
        return fair_tree_keys(deficit, self._parents()) if self.st.has_tree() else deficit

    def _parents(self) -> list[int]:
        """Each node's parent's index, -1 for a top-level node (``EngineState.parent`` for
        every node at once)."""
        st = self.st
        if not st.D:
            return [-1] * st.C
        up = st.up[:st.C, 0]
        parents: list[int] = np.where(up > 0, up - 1, -1).tolist()
        return parents

    # ------------------------------------------------------------------ pending queue (§4.5)

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
