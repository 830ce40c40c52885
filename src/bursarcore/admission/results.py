"""The broker's answers (SPEC §4, §7, §8): the :class:`Decision` on an intent, a renewal or a
release, the supply signals (:class:`Supply`, :class:`DimSupply`), the what-if grid of a
:class:`Quote`, a flow dimension's :class:`Consumption` and the arrays of a batch
(:class:`BatchResult`).

A denial is one of these values with a reason code, never an exception. ``Decision`` is a
frozen, slotted dataclass the compiled engine fills slot by slot (``_results``, for
``_acquire.FastAcquire``): its fields, order and slots are part of the contract with it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

import numpy as np

from ..leases.types import Lease

__all__ = ["Decision", "DimSupply", "Supply", "Quote", "Consumption", "BatchResult",
           "GRANTED_OUT", "REFUSED_OUT", "PENDING_OUT"]

#: the outcomes of a :class:`Decision`
GRANTED_OUT, REFUSED_OUT, PENDING_OUT = "granted", "refused", "pending"


@dataclass(frozen=True, slots=True)
class Decision:
    """The answer to an intent, a renewal or a release.

    A denial is a decision with a reason, never an exception: the caller reads why and
    when to retry, and nothing was changed by a refusal.

    Attributes
    ----------
    outcome : str
        ``granted``, ``pending`` or ``refused``; ``released`` for :meth:`Broker.release`.
    intent_id : int
        The intent's id (for :meth:`Broker.cancel`); -1 for a stale lease id.
    campaign : str
        The campaign asking.
    units : int
        Units granted (or released); 0 otherwise.
    lease : Lease or None
        The lease granted, renewed or released, as it stands after the decision.
    path : str or None
        The grant path: ``warm`` (free units), ``reclaim`` (after revoking opportunistic
        or borrowed leases) or ``borrow`` (free units borrowed from siblings' idle
        guarantees, on a revocable lease: SPEC §14.8); None unless granted.
    reason : str or None
        The binding rule of a refusal or a pending intent: ``ceiling``, ``capacity``,
        ``tokens``, ``credits``, ``deadline``, ``pending_limit``, ``invalid`` (an ended
        lease); None for a grant.
    retry_after : float or None
        Seconds after which a retry may succeed, when known.
    cost : float
        The credits escrowed by a grant or renewal; negative for the refund of a release.
    wait : float
        Expected seconds until the lease is active (a reclaim's grace); 0.0 for a warm
        grant.
    seq : int
        The journal record's seq; -1 without a journal.
    """

    outcome: str
    intent_id: int
    campaign: str
    units: int = 0
    lease: Lease | None = None
    path: str | None = None
    reason: str | None = None
    retry_after: float | None = None
    cost: float = 0.0
    wait: float = 0.0
    seq: int = -1

    @property
    def granted(self) -> bool:
        return self.outcome == GRANTED_OUT

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["lease"] = self.lease.to_dict() if self.lease else None
        return d


@dataclass(frozen=True)
class DimSupply:
    """Supply signals for one campaign on one held dimension (SPEC §8).

    Attributes
    ----------
    free : int
        Units free now.
    reclaimable : int
        Units held by opportunistic leases (or being revoked, not yet promised) that a
        reclaim could free.
    capacity : int
        The dimension's capacity.
    congestion : float
        The congestion index κ.
    multiplier : float
        The congestion multiplier κ selects.
    tokens : float
        The campaign's tokens in unit-seconds (``inf`` for an unbounded bucket).
    bucket : float
        The campaign's bucket size in unit-seconds (``inf`` for unbounded).
    held : int
        Units the campaign holds.
    ceiling : int
        The campaign's ceiling.
    price : dict of str to float
        The credit price per service class now.
    wait : dict of str to float or None
        Expected seconds to activity per grant path: ``warm`` 0, ``reclaim`` the grace,
        ``cold`` what the facility binding says (None without one).
    """

    free: int
    reclaimable: int
    capacity: int
    congestion: float
    multiplier: float
    tokens: float
    bucket: float
    held: int
    ceiling: int
    price: dict[str, float]
    wait: dict[str, float | None]


@dataclass(frozen=True)
class Supply:
    """Supply signals for one campaign (SPEC §8).

    What an agent reads to size its next intent without asking one: a read, not a
    reservation.

    Attributes
    ----------
    campaign : str
        The campaign.
    time : float
        The broker time the signals are of.
    credits : float
        Credits left (``inf`` for an unlimited budget).
    service_class : str
        The campaign's default class.
    dims : dict of str to DimSupply
        The signals per held dimension.
    """

    campaign: str
    time: float
    credits: float
    service_class: str
    dims: dict[str, DimSupply]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Quote:
    """A grid of what-ifs: cell ``[i, j]`` is an intent for ``sizes[i]`` units over
    ``durations[j]``.

    Each cell is what exactly that intent would meet now (SPEC §4.4, §7); the grid is
    computed at once, and asking it grants nothing.

    Attributes
    ----------
    sizes : numpy.ndarray
        The sizes, int64 (rows).
    durations : numpy.ndarray
        The durations in seconds (columns).
    cost : numpy.ndarray
        Credits each cell would cost.
    path : numpy.ndarray
        ``warm``, ``reclaim`` or ``cold`` per cell.
    wait : numpy.ndarray
        Expected seconds to activity per cell (the path's wait).
    grantable : numpy.ndarray
        True where no rule is broken.
    reason : numpy.ndarray
        The first rule the cell breaks (``ceiling``, ``capacity``, ``tokens``,
        ``credits``); ``""`` where grantable.
    """

    sizes: np.ndarray
    durations: np.ndarray
    cost: np.ndarray
    path: np.ndarray
    wait: np.ndarray
    grantable: np.ndarray
    reason: np.ndarray

    def to_dict(self) -> dict[str, Any]:
        return {k: np.asarray(v).tolist() for k, v in asdict(self).items()}


@dataclass(frozen=True)
class Consumption:
    """The answer to :meth:`Broker.consume`.

    Like a :class:`Decision`, throttling is a value: part of an amount may pass and the
    rest be retried later.

    Attributes
    ----------
    campaign : str
        The campaign.
    dim : str
        The flow dimension.
    requested : float
        Units asked for.
    allowed : float
        Units that pass now.
    retry_after : float
        Seconds after which the rest may pass: 0.0 when all passed, ``inf`` when never.
    reason : str or None
        What held the rest back: ``tokens`` (the campaign's sustained or peak bucket),
        ``capacity`` (the facility's shared bucket) or ``credits``; None when all passed.
    cost : float
        Credits charged (priced dimensions only).
    seq : int
        The journal record's seq; -1 without a journal.
    """

    campaign: str
    dim: str
    requested: float
    allowed: float
    retry_after: float
    reason: str | None = None
    cost: float = 0.0
    seq: int = -1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class BatchResult(NamedTuple):
    """The arrays :meth:`Broker.admit_batch` returns, one entry per item.

    Codes instead of objects, so a batch of a million items is five arrays.

    Attributes
    ----------
    granted : numpy.ndarray
        Units granted; 0 unless granted.
    reason : numpy.ndarray
        Reason codes: indices into ``bursarcore.admission.state.REASONS`` (0: none).
    lease : numpy.ndarray
        Lease ids; -1 if none.
    outcome : numpy.ndarray
        Outcome codes: 0 granted, 1 refused, 2 pending.
    intent : numpy.ndarray
        Intent ids.
    """

    granted: np.ndarray
    reason: np.ndarray
    lease: np.ndarray
    outcome: np.ndarray
    intent: np.ndarray
