"""A broker written from docs/spec.md in plain Python: the specification as code.

:class:`ReferenceBroker` has the constructor and the public methods of
:class:`bursarcore.Broker` and returns the same value types (``Decision``, ``Lease``,
``Event``, ``Supply``, ``Quote``, ``Consumption``, ``BatchResult``), but keeps its state as
records with named fields (:mod:`.leases`, :mod:`.pending`) and decides with the rules of
:mod:`.rules`, each written once and citing its section of the specification. It shares no
code with the compiled admission engine, so a test that drives both with the same
operations and compares what a user sees catches a rule either one gets wrong
(``tests/test_reference_broker.py``).

The pending queue is decided intent by intent over the whole queue at every pass
(SPEC §4.5), the plain form of the compiled broker's pass over woken keys. Its journal
(SPEC §9) writes the compiled broker's records through the same sinks (:mod:`.journaling`).
Flow dimensions (SPEC §5) use the reference flow model, :mod:`bursarcore.reference.flow`.
``replay`` re-executes a journal's inputs (:mod:`.replay`). Campaigns are the nodes of a
tree of envelopes (SPEC §14, :mod:`.tree`), registered, changed and removed by
:mod:`.nodes`: a flat set of campaigns is its special case.
"""

from __future__ import annotations

from typing import Any

from ..journal.base import Journal
from .nodes import BrokerNodes
from .replay import replay as _replay
from .views import BrokerViews

__all__ = ["ReferenceBroker"]


class ReferenceBroker(BrokerNodes, BrokerViews):
    """An agent resource broker over one pool, written from the specification.

    ``ReferenceBroker(Pool(gpu=512), clock=ManualClock(0.0))`` takes the parameters of
    :class:`bursarcore.Broker` (``backend`` may only be None or ``"reference"``) and answers
    every call as the specification says, with the same result types: a denial is a
    ``Decision`` with a reason, and bad input raises
    :class:`~bursarcore.errors.InvalidArgument` before anything changes.
    """

    @classmethod
    def replay(cls, journal: Journal, *, backend: str | None = None, clock: Any = None,
               resume: bool = True) -> "ReferenceBroker":
        """Rebuild a broker from its journal (SPEC §9, invariant 8): every input record is
        re-executed at its recorded time, and the records the rebuilt broker writes must
        equal the journal's, field for field, or
        :class:`~bursarcore.errors.JournalCorrupt` names the first that differs. With
        ``resume`` the broker goes on appending to ``journal``. (``backend``: as for the
        constructor.)"""
        if backend not in (None, "reference"):
            from ..errors import InvalidArgument
            raise InvalidArgument("backend", "must be 'reference' (or None)", backend)
        return _replay(cls, journal, clock=clock, resume=resume)
