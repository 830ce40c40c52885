"""bursarcore: the policy core of an agent resource broker above Slurm or PBS Pro.

See README.md and docs/ for the model; SPEC.md sections are cited in the docstrings.
"""

from . import errors, units
from ._backend import available as available_backends
from .buckets import TokenBuckets

__all__ = ["TokenBuckets", "errors", "units", "available_backends", "__version__"]
__version__ = "0.1.0"

from .admission import DEFAULT_CLASSES, Congestion, Envelope, Intent, Pool, ServiceClass  # noqa: E402
from .broker import BatchResult, Broker, Decision, Event, Lease, Quote, Supply  # noqa: E402
from .clock import ManualClock, MonotonicClock  # noqa: E402

__all__ += ["Broker", "Pool", "Envelope", "Intent", "ManualClock", "MonotonicClock",
            "ServiceClass", "Congestion", "DEFAULT_CLASSES", "Decision", "Event", "Lease",
            "Quote", "Supply", "BatchResult"]
