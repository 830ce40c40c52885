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
Not here: ``replay`` (rebuild a broker with ``bursarcore.Broker.replay``) and nested
envelopes (SPEC §14, not built anywhere).
"""

from __future__ import annotations

from .views import BrokerViews

__all__ = ["ReferenceBroker"]


class ReferenceBroker(BrokerViews):
    """An agent resource broker over one pool, written from the specification.

    ``ReferenceBroker(Pool(gpu=512), clock=ManualClock(0.0))`` takes the parameters of
    :class:`bursarcore.Broker` (``backend`` may only be None or ``"reference"``) and answers
    every call as the specification says, with the same result types: a denial is a
    ``Decision`` with a reason, and bad input raises
    :class:`~bursarcore.errors.InvalidArgument` before anything changes.
    """
