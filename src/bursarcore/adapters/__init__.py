"""Facility bindings (SPEC §12): scheduler allocations become pool capacity.

``SlurmBinding`` (run against real Slurm 22.05 in the tests), ``PBSBinding`` (run only
against recorded ``qstat``/``pbsnodes`` documents: no PBS server runs here) and
``LocalBinding`` (processes on this host: the default for the simulator and demos), all
behind one interface, :class:`Binding`; :class:`PoolManager` joins a binding to a
:class:`~bursarcore.broker.Broker`. See ``docs/bindings.md``::

    from bursarcore import Broker, MonotonicClock, Pool
    from bursarcore.adapters import PoolManager, SlurmBinding

    broker = Broker(Pool(cpu=0), clock=MonotonicClock())
    pool = PoolManager(broker, SlurmBinding(partition="debug"), walltime=3600,
                       min_pilots=1, max_pilots=8)
    while True:
        pool.tick(); time.sleep(5)
"""

from .handles import Handle, LeaseHandle, ProcessHandle
from .interface import (CANCELLED, COMPLETED, ENDING, FAILED, HELD, PENDING, PILOT_STATES,
                        RUNNING, SUSPENDED, TERMINAL, TIMEOUT, UNKNOWN, Binding, CommandError,
                        Pilot, PilotStatus, SchedulerSupply, map_state, node_name, split_node)
from .local import LocalBinding, SimHandle
from .pbs import PBSBinding
from .pool import COLD_WAIT_MODES, PoolManager, Provision, TickReport
from .slurm import SlurmBinding

__all__ = [
    "Binding", "SlurmBinding", "PBSBinding", "LocalBinding", "PoolManager",
    "Pilot", "PilotStatus", "SchedulerSupply", "Handle", "ProcessHandle", "SimHandle",
    "LeaseHandle", "Provision", "TickReport", "CommandError", "map_state", "node_name",
    "split_node", "COLD_WAIT_MODES",
    "PILOT_STATES", "TERMINAL", "PENDING", "HELD", "RUNNING", "SUSPENDED", "ENDING",
    "COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "UNKNOWN",
]
