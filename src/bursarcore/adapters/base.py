"""Facility bindings (SPEC §12): the interface, pilots, handles, status tables and the pool
manager, under one name.

The parts live in their own modules — :mod:`.interface` (state tables, the records a
binding reports, :class:`Binding`, :func:`run_command`), :mod:`.handles` (what is launched
for a lease) and :mod:`.pool` (:class:`PoolManager`); this module re-exports their public
names, so ``from bursarcore.adapters.base import X`` names the same object as the module
that defines it.
"""

from __future__ import annotations

from .handles import Handle, LeaseHandle, ProcessHandle, exit_code_of
from .interface import (CANCELLED, COMPLETED, ENDING, FAILED, HELD, NODE_BUSY, NODE_DOWN,
                        NODE_FREE, NODE_PARTIAL, NODE_STATES, NODE_UNKNOWN, PENDING,
                        PILOT_STATES, RUNNING, SUSPENDED, TERMINAL, TIMEOUT, UNKNOWN, Binding,
                        CommandError, Pilot, PilotStatus, SchedulerSupply, log, map_state,
                        node_name, run_command, split_node)
from .pool import COLD_WAIT_MODES, PoolManager, Provision, TickReport

__all__ = [
    "PENDING", "HELD", "RUNNING", "SUSPENDED", "ENDING", "COMPLETED", "CANCELLED", "FAILED",
    "TIMEOUT", "UNKNOWN", "PILOT_STATES", "TERMINAL", "NODE_FREE", "NODE_PARTIAL",
    "NODE_BUSY", "NODE_DOWN", "NODE_UNKNOWN", "NODE_STATES", "CommandError", "map_state",
    "PilotStatus", "Pilot", "SchedulerSupply", "Handle", "ProcessHandle", "LeaseHandle",
    "Binding", "PoolManager", "Provision", "TickReport", "node_name", "split_node",
    "exit_code_of", "COLD_WAIT_MODES", "run_command",
]
