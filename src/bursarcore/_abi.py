"""The codes the C core's public header declares (``core/include/bursarcore.h``), read
from the header itself, so each code is written once for the core, its bindings, the
policy layer and the journal.

- :data:`REASONS`: each reason's name by code (``BC_REASON_X = code``: ``"x"``; code 0,
  none, is ``""``);
- :data:`LIMITS`: the names of the rules with a limit, in the order a refusal names them
  (``BC_LIMIT_X = i``); :data:`LIMIT_REASONS` the reason code each is decided as;
- :data:`TREE_DEPTH`: the most levels of a tree of envelopes (``BC_TREE_DEPTH``).
"""

from __future__ import annotations

import os
import re

__all__ = ["HEADER", "REASONS", "LIMITS", "LIMIT_REASONS", "TREE_DEPTH"]

HEADER = os.path.join(os.path.dirname(__file__), "core", "include", "bursarcore.h")


def _enum(text: str, prefix: str) -> tuple[str, ...]:
    """The names of ``prefix``'s enumerators, lower-cased, by value (0, 1, ... each once)."""
    found = {int(v): name.lower()
             for name, v in re.findall(rf"^\s*{prefix}_([A-Z0-9_]+)\s*=\s*(\d+)\s*,?",
                                       text, re.M)}
    if sorted(found) != list(range(len(found))):
        raise ImportError(f"{HEADER}: the values of {prefix}_* must be 0, 1, ... each once")
    return tuple(found[i] for i in range(len(found)))


with open(HEADER, encoding="utf-8") as _f:
    _TEXT = _f.read()

REASONS: tuple[str, ...] = ("",) + _enum(_TEXT, "BC_REASON")[1:]
LIMITS: tuple[str, ...] = _enum(_TEXT, "BC_LIMIT")
LIMIT_REASONS: tuple[int, ...] = tuple(REASONS.index(name) for name in LIMITS)


def _define(text: str, name: str) -> int:
    """The integer a ``#define name N`` of the header gives."""
    m = re.search(rf"^#define\s+{name}\s+(\d+)\b", text, re.M)
    if m is None:
        raise ImportError(f"{HEADER}: no #define {name}")
    return int(m.group(1))


TREE_DEPTH: int = _define(_TEXT, "BC_TREE_DEPTH")
