"""What a lease is to the broker's callers (SPEC §5, §6): the :class:`Lease` snapshot and the
:class:`Event` that reports what time did to leases and pending intents.

A :class:`Lease` is a frozen, slotted dataclass whose slots the compiled engine fills in place
(``_results``, for ``_acquire.FastAcquire``); an :class:`Event` is a named tuple, the
cheapest immutable record to build by the thousand in plain Python (the cffi and reference
backends build expiries' events so) as in compiled code. Their fields and order are part of
the contract with ``_results``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from itertools import repeat
from typing import Any, Iterable, NamedTuple

__all__ = ["Lease", "Event", "expired_events"]


@dataclass(frozen=True, slots=True)
class Lease:
    """A snapshot of a lease, as it stood when read.

    Frozen: the broker's state moves on, the snapshot does not; read the lease again
    (:meth:`Broker.lease`) for its state now.

    Attributes
    ----------
    id : int
        The lease id.
    campaign : str
        The campaign holding it.
    dim : str
        The held dimension.
    units : int
        How many units.
    state : str
        ``starting`` (a reclaim grant waiting for its grace), ``active``, ``revoking``
        (notified, revoked at ``revoke_at``), ``released``, ``expired`` or ``revoked``.
    firm : bool
        False for an opportunistic lease, which may be revoked after its class's grace,
        and for a borrowed one (SPEC §14.8), after the broker's ``borrow_grace``.
    service_class : str
        The class it was granted under.
    granted_at : float
        The broker time of the grant.
    start : float or None
        When it became (or becomes) active; None for a reclaim grant released before it
        started.
    expiry : float or None
        When it ends unless renewed or released; None as for ``start``.
    cost : float
        The credits escrowed for it.
    revoke_at : float or None
        When a revoking or revoked lease is (was) revoked; None otherwise.
    intent : int
        The id of the intent it was granted for.
    placement : tuple of (str, int)
        ``(node, units)`` per node it is placed on, while active or revoking.
    slots : tuple of int
        Its slot ids, while active or revoking.
    """

    id: int
    campaign: str
    dim: str
    units: int
    state: str
    firm: bool
    service_class: str
    granted_at: float
    start: float | None
    expiry: float | None
    cost: float
    revoke_at: float | None
    intent: int
    placement: tuple[tuple[str, int], ...] = ()
    slots: tuple[int, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """The fields by name, placement and slots as lists (JSON's shapes); what
        ``dataclasses.asdict`` gives, without its recursive copy of every atom."""
        d = {name: getattr(self, name) for name in _LEASE_FIELDS}
        d["placement"] = [list(p) for p in self.placement]
        d["slots"] = list(self.slots)
        return d


class Event(NamedTuple):
    """Something that happened between calls (an immutable named tuple).

    Events are how the broker reports what time did (expiries, revocations, pending
    grants): :meth:`Broker.poll` returns them in order, and :meth:`Broker.subscribe`
    callbacks get each as it happens.

    Attributes
    ----------
    kind : str
        ``expired``, ``preempt_notice``, ``revoked``, ``activated``, ``granted`` (a pending
        intent), ``refused`` (a pending intent's TTL or deadline) or ``released``.
    time : float
        The broker time it happened at.
    campaign : str
        The campaign it concerns.
    lease_id : int or None
        The lease, for a lease's event.
    intent_id : int or None
        The intent, for a pending intent's event.
    deadline : float or None
        For a preemption notice, when the lease is revoked.
    reason : str or None
        Why, when there is a rule to name (``ttl``, ``deadline``, ``capacity``).
    units : int
        The lease's units; 0 when there is no lease.
    """

    kind: str
    time: float
    campaign: str
    lease_id: int | None = None
    intent_id: int | None = None
    deadline: float | None = None
    reason: str | None = None
    units: int = 0

    def to_dict(self) -> dict[str, Any]:
        """The fields by name (every one an atom)."""
        return dict(zip(_EVENT_FIELDS, self))


_LEASE_FIELDS = tuple(f.name for f in fields(Lease))
_EVENT_FIELDS = Event._fields
_tuple_new = tuple.__new__


def expired_events(times: Iterable[float], campaigns: Iterable[str], lease_ids: Iterable[int],
                   units: Iterable[int]) -> list[Event]:
    """``Event("expired", time, campaign, lease_id=lease_id, units=units)`` for each of the
    zipped columns, in order: one C-level loop, without the keyword handling of
    ``Event.__new__`` (expiries come by the thousand)."""
    return list(map(_tuple_new, repeat(Event), zip(repeat("expired"), times, campaigns,
                                                   lease_ids, repeat(None), repeat(None),
                                                   repeat(None), units)))
