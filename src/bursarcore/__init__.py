"""bursarcore: the policy core of an agent resource broker above Slurm or PBS Pro.

See README.md and docs/ for the model; "SPEC §x.y" in the docstrings cites docs/spec.md.

The public names below are loaded on first use (PEP 562), so a process that needs only a
light part — a runtime worker or an agent (``bursarcore.runtime``), which start by the
thousand — does not import numpy and the compiled engine.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

import os

from . import errors
from ._version import __version__

# public name -> (submodule, attribute; None: the submodule itself)
_LAZY: dict[str, tuple[str, str | None]] = {
    "units": ("units", None),
    "available_backends": ("_backend", "available"),
    "TokenBuckets": ("buckets", "TokenBuckets"),
    **{n: ("admission", n) for n in ("DEFAULT_CLASSES", "Congestion", "Envelope", "Intent",
                                     "Pool", "ServiceClass")},
    **{n: ("broker", n) for n in ("BatchResult", "Broker", "Decision", "Event", "Lease",
                                  "Quote", "Supply")},
    **{n: ("clock", n) for n in ("ManualClock", "MonotonicClock")},
}

__all__ = ["errors", "__version__", "get_include", "get_library", *_LAZY]

_CORE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "core")


def get_include() -> str:
    """The folder holding ``bursarcore.h``, the C core's public ABI (``cc -I``)."""
    return os.path.join(_CORE, "include")


def get_library() -> str:
    """The path of ``libbursarcore.so``, the C core as a shared library C programs link
    against (docs/c-api.md). Raises FileNotFoundError on a source checkout that was not
    built (``python setup.py build_ext --inplace``)."""
    path = os.path.join(_CORE, "libbursarcore.so")
    if not os.path.exists(path):
        raise FileNotFoundError(f"bursarcore: {path} is not built; build the package "
                                "(pip install . or python setup.py build_ext --inplace)")
    return path


def __getattr__(name: str) -> Any:
    try:
        module, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'bursarcore' has no attribute {name!r}") from None
    mod = importlib.import_module(f".{module}", __name__)
    value = mod if attr is None else getattr(mod, attr)
    globals()[name] = value            # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs
    # ("x as x": the explicit re-export a strict checker needs, since __all__ is built)
    from . import units as units
    from ._backend import available as _available
    from .admission import DEFAULT_CLASSES as DEFAULT_CLASSES
    from .admission import Congestion as Congestion
    from .admission import Envelope as Envelope
    from .admission import Intent as Intent
    from .admission import Pool as Pool
    from .admission import ServiceClass as ServiceClass
    from .broker import BatchResult as BatchResult
    from .broker import Broker as Broker
    from .broker import Decision as Decision
    from .broker import Event as Event
    from .broker import Lease as Lease
    from .broker import Quote as Quote
    from .broker import Supply as Supply
    from .buckets import TokenBuckets as TokenBuckets
    from .clock import ManualClock as ManualClock
    from .clock import MonotonicClock as MonotonicClock

    available_backends = _available
