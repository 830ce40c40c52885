"""What the parts of :class:`~bursarcore.broker.Broker` share: the operation boundary
(``_op``), the units of its edges, and the declared state and steps each part relies on.

The broker is one class assembled from parts by concern — supply signals and quotes
(:mod:`.admission.signals`), single admission (:mod:`.admission.acquire`), batch
admission (:mod:`.admission.batching`), flow consumption (:mod:`.admission.consume`), the
lease lifecycle (:mod:`.leases.lifecycle`), pool resizing (:mod:`.leases.nodes`) — over the
pending queue (:mod:`.admission.pending`) and the C core. :class:`BrokerBase` declares, for
the type checker, the fields and the steps (``_now``, ``_advance``, ...) that
:mod:`bursarcore.broker` defines and every part may use.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING, Any, Callable, Concatenate, ParamSpec, TypeVar

import numpy as np

from . import units
from .admission.envelope import MAX_DURATION
from .admission.results import GRANTED_OUT, PENDING_OUT, REFUSED_OUT

if TYPE_CHECKING:
    from .admission.classes import ServiceClass
    from .admission.envelope import Envelope, Intent, Pool
    from .admission.pending import PendingQueue, _Pending
    from .admission.results import Decision
    from .admission.state import EngineState
    from .journal.base import Journal
    from .leases.types import Lease

__all__ = ["BrokerBase", "Cursor", "NS"]

NS = units.NS
_MAX_DURATION = MAX_DURATION * NS           # the longest lease (ns): Intent.duration's bound
_MIN_DURATION = round(units.MIN_DURATION * NS)
_DUR_RULE = f"must be seconds in [{units.MIN_DURATION:g}, {MAX_DURATION:,}] (one microsecond to ten years)"
_PATHS = ("warm", "reclaim", "cold", "borrow")  # indexed by WARM, RECLAIM, COLD, BORROW
_OUTCOME_CODE = {GRANTED_OUT: 0, REFUSED_OUT: 1, PENDING_OUT: 2}
# python-side event kinds, in the order they run at equal times
_EV_REVOKE, _EV_ACTIVATE, _EV_PENDING = 0, 1, 2

_B = TypeVar("_B", bound="BrokerBase")
_P = ParamSpec("_P")
_R = TypeVar("_R")


def _op(method: Callable[Concatenate[_B, _P], _R]) -> Callable[Concatenate[_B, _P], _R]:
    """A public operation: when it returns, the journal may commit a group (group commit
    happens only between operations, so a durable journal always ends on an operation
    boundary and replays to a consistent state). The method keeps its signature."""
    @functools.wraps(method)
    def wrapper(self: _B, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return method(self, *args, **kwargs)
        finally:
            cur = self._cur
            if cur.journal is not None:
                cur.journal.end_op(cur.durable)
    return wrapper


@dataclasses.dataclass(slots=True, eq=False, repr=False)
class Cursor:
    """Where the broker stands between operations: the fields that both its Python steps
    and the compiled common case of ``acquire`` (``_acquire.FastAcquire``) read and write.
    They live here and nowhere else, so the two paths see one state; the compiled path
    reads and writes them at this slotted class's slot offsets (checked when it is built),
    never through the broker. The field order is part of that contract."""

    journal: Any                      # the Journal every decision is recorded in, or None
    durable: bool                     # sync the journal at the end of every operation
    clock: Any                        # now() -> seconds
    ttl: float                        # the longest wait of a pending intent (s), by default
    t: int                            # the time of the last operation (ns)
    t_force: int | None = None        # replay: the time of the input re-executed (ns)
    next_intent: int = 0              # the id of the next intent
    events: list[Any] = dataclasses.field(default_factory=list)   # not yet polled, in order
    # per campaign: the class row of its envelope's service class, and its fair-share
    # deficit at its last decision (both replaced, never resized in place, on register)
    default_cls: np.ndarray = dataclasses.field(
        default_factory=lambda: np.zeros(0, dtype=np.int64))
    deficit_last: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))


class BrokerBase:
    """The broker's fields and steps, declared for the parts (defined by ``Broker``).

    ``journal``, ``durable``, ``clock`` and ``ttl`` are the broker's public attributes,
    kept in its :class:`Cursor`."""

    _cur: Cursor

    @property
    def journal(self) -> Journal | None:
        """The journal every decision is recorded in (SPEC §9), or None."""
        return self._cur.journal

    @journal.setter
    def journal(self, value: Journal | None) -> None:
        self._cur.journal = value

    @property
    def durable(self) -> bool:
        """Whether the journal is synced at the end of every operation."""
        return self._cur.durable

    @durable.setter
    def durable(self, value: bool) -> None:
        self._cur.durable = value

    @property
    def clock(self) -> Any:
        """The clock decisions are taken at (``now() -> seconds``)."""
        return self._cur.clock

    @clock.setter
    def clock(self, value: Any) -> None:
        self._cur.clock = value

    @property
    def ttl(self) -> float:
        """The longest wait of a pending intent, in seconds, unless the intent says."""
        return self._cur.ttl

    @ttl.setter
    def ttl(self, value: float) -> None:
        self._cur.ttl = value

    if TYPE_CHECKING:
        pool: Pool
        classes: tuple[ServiceClass, ...]
        backend: str
        dims: list[str]
        flow_dims: list[str]
        flow: Any
        cold_wait: Any
        envelopes: dict[str, Envelope]
        st: EngineState
        _k: Any
        _names: list[str]
        _removed: set[int]
        _cindex: dict[str, int]
        _cls_index: dict[str, int]
        _dim_index: dict[str, int]
        _flow_index: dict[str, int]
        _flow_price: np.ndarray
        _one_cls: int | None
        _opp_default: bool
        _opp_active: list[set[int]]
        _revoking: list[set[int]]
        _draining: list[int]
        _slot_alive: list[np.ndarray]
        _node_names: list[list[str]]
        _node_of_slot: list[np.ndarray]
        _subscribers: list[Any]
        _queue: PendingQueue
        max_pending: int | None
        _fast: Any                       # the compiled common case of acquire, or None
        _pyev: list[tuple[int, int, int, int]]
        _seq: int
        _activation: dict[int, int]
        _borrow_grace_ns: int
        borrow_grace: float
        _expired_buf: np.ndarray
        _one_buf: np.ndarray
        _buf: np.ndarray


        def _acquire_ns(self, c: int, d: int, k: int, nmin: int, nmax: int, dur: int, spend: int,
                        deadline: int | None, ttl: int, t: int, request: Intent | None = None,
                        batch: int = 0, iid: int | None = None) -> Decision: ...
        def _advance(self, t: int) -> None: ...
        def _class_of(self, campaign: str, name: str | None) -> int: ...
        def _constant(self, value: int, n: int) -> np.ndarray: ...
        def _deficit_array(self, t: int, commit: bool = True) -> np.ndarray: ...
        def _fair_keys(self, t: int) -> np.ndarray: ...
        def _emit(self, kind: str, t: int, c: int, lid: int | None = None, iid: int | None = None,
                  deadline: int | None = None, reason: int = 0, pend: _Pending | None = None,
                  path: int = 0) -> None: ...
        def _now(self) -> int: ...
        def _after(self, row: dict[str, Any], c: int, d: int) -> None: ...
        def _plan_reclaim(self, d: int, n: int, t: int) -> tuple[list[int], int]: ...
        def _set_reserve(self, d: int) -> None: ...
        def _reclaim(self, c: int, d: int, k: int, n: int, dur: int, pm: int, t: int, iid: int,
                     plan: tuple[list[int], int]) -> int: ...
        def _purge_retired(self) -> None: ...
        def lease(self, lease_id: int) -> Lease: ...
        def _push(self, t: int, kind: int, ident: int) -> None: ...
        def _reserve(self, leases: int, slots: int) -> None: ...
        def _serve_pending(self, t: int) -> None: ...
        def _track_opportunistic(self, d: int, lids: np.ndarray) -> None: ...
        def campaign_index(self, name: str) -> int: ...
        def leases(self, campaign: str | None = None) -> list[Lease]: ...
        def pending(self, campaign: str | None = None) -> list[dict[str, Any]]: ...
