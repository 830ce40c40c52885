"""Admission policy: envelopes, service classes, pools and intents (SPEC §3, §4, §7)."""

from .classes import DEFAULT_CLASSES, Congestion, ServiceClass
from .envelope import Envelope, Intent, Pool

__all__ = ["Envelope", "Intent", "Pool", "ServiceClass", "Congestion", "DEFAULT_CLASSES"]
