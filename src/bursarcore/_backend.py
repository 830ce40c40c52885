"""Backend selection: compiled extensions unless ``BURSARCORE_NO_EXTENSIONS`` is set or they
fail to import (msgpack's ``MSGPACK_PUREPYTHON`` habit). The public modules ask here."""

from __future__ import annotations

import importlib
import os
import warnings
from types import ModuleType

__all__ = ["NO_EXTENSIONS", "compiled", "available"]

NO_EXTENSIONS = os.environ.get("BURSARCORE_NO_EXTENSIONS", "").strip() not in ("", "0")


def compiled(name: str) -> ModuleType | None:
    """The compiled module ``bursarcore.<name>``, or None on the pure-Python path."""
    if NO_EXTENSIONS:
        return None
    try:
        return importlib.import_module(f"bursarcore.{name}")
    except ImportError as exc:  # a source checkout without a build, or a broken wheel
        warnings.warn(f"bursarcore: compiled {name} unavailable ({exc}); "
                      "using the pure-Python reference", RuntimeWarning, stacklevel=2)
        return None


def available() -> list[str]:
    """Backends usable in this process, compiled first."""
    return (["compiled"] if compiled("_buckets") is not None else []) + ["reference"]
