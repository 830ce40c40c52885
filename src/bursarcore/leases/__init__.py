"""Leases (SPEC §5, §6): what a grant holds, and the events that report what time did to it."""

from .types import Event, Lease

__all__ = ["Lease", "Event"]
