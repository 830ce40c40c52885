"""Backend selection (msgpack's ``MSGPACK_PUREPYTHON`` habit). The public modules ask here.

Three backends implement the one public API:

``cython``
    the C core (``core/``) bound by Cython, plus the Cython engine modules: CPython's
    fast path;
``cffi``
    the same C core through its C ABI, bound by cffi (runs where cffi runs, PyPy
    included). What the C ABI does not cover yet (the admission engine, flow
    dimensions) is served by the Cython build;
``reference``
    the plain-Python specification, always importable.

``BURSARCORE_BACKEND=cython|cffi|reference`` picks one (an unusable choice is an error at
import, naming it); unset, the fastest that imports. ``BURSARCORE_NO_EXTENSIONS=1`` is the
reference switch and wins over the rest.
"""

from __future__ import annotations

import importlib
import os
import warnings
from types import ModuleType
from typing import Mapping, TypeVar

__all__ = ["NAMES", "NO_EXTENSIONS", "REQUESTED", "available", "cffi", "compiled", "pick"]

#: every backend, fastest first
NAMES = ("cython", "cffi", "reference")

NO_EXTENSIONS = os.environ.get("BURSARCORE_NO_EXTENSIONS", "").strip() not in ("", "0")
REQUESTED = "reference" if NO_EXTENSIONS else (
    os.environ.get("BURSARCORE_BACKEND", "").strip().lower() or None)
if REQUESTED is not None and REQUESTED not in NAMES:
    raise ImportError(f"BURSARCORE_BACKEND: must be one of {', '.join(NAMES)} "
                      f"(got {os.environ.get('BURSARCORE_BACKEND')!r})")

T = TypeVar("T")


def _load(name: str, what: str) -> ModuleType | None:
    try:
        return importlib.import_module(f"bursarcore.{name}")
    except ImportError as exc:  # a source checkout without a build, or a broken wheel
        if REQUESTED not in (None, "reference"):
            raise ImportError(f"BURSARCORE_BACKEND={REQUESTED}: {what} {name} does not "
                              f"import ({exc})") from exc
        warnings.warn(f"bursarcore: {what} {name} unavailable ({exc}); "
                      "using the pure-Python reference", RuntimeWarning, stacklevel=3)
        return None


def compiled(name: str) -> ModuleType | None:
    """The Cython module ``bursarcore.<name>``, or None on the reference backend."""
    if REQUESTED == "reference":
        return None
    return _load(name, "compiled")


def cffi(name: str) -> ModuleType | None:
    """The cffi-bound module ``bursarcore.<name>``, or None where it cannot be used: on the
    reference backend, or when cffi or the build is missing (unless cffi was asked for)."""
    if REQUESTED in ("reference", "cython"):
        return None
    try:
        importlib.import_module("_cffi_backend")
    except ImportError as exc:
        if REQUESTED == "cffi":
            raise ImportError(f"BURSARCORE_BACKEND=cffi: cffi is not installed ({exc}); "
                              "pip install 'bursarcore[cffi]'") from exc
        return None
    return _load(name, "cffi binding")


def pick(impls: Mapping[str, T]) -> T:
    """The implementation of the requested backend, or the fastest one present."""
    if REQUESTED is not None:
        return impls[REQUESTED]
    return next(impls[name] for name in NAMES if name in impls)


def available() -> list[str]:
    """Backends usable in this process, fastest first."""
    from .buckets import BACKENDS
    return [name for name in NAMES if name in BACKENDS]
