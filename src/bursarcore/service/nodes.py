"""Node paths in the service: the shape of a name, the subtree rule, the reserved words.

A campaign is a node of a tree of envelopes (SPEC §14): ``astro`` a top-level node,
``astro/survey`` its child. In the service a node path is 1 to :data:`TREE_DEPTH`
segments joined by ``/``, each segment a name (:data:`SEGMENT`: a letter or digit, then
letters, digits and ``._:@+-``, at most 128 characters), the whole at most
:data:`MAX_PATH` characters. In a URL the path is written as it is
(``/v1/campaigns/astro/survey/supply``); ``%2F`` is the same as ``/``.

The literal words of the routes that follow a campaign's path (``supply``, ``leases``,
``tokens``, ...) are reserved: no segment of a node registered over HTTP may be one of
them, so a URL always names one node and one route. :func:`route_words` reads them from
the app's routes.

The subtree rule (:func:`in_subtree`): a node's subtree is the node and every node below
it; ``astro2`` is not below ``astro``.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Iterable

from pydantic import Field

from ..admission.paths import TREE_DEPTH
from .auth import in_subtree

__all__ = ["SEGMENT", "NODE_PATH", "MAX_PATH", "TREE_DEPTH", "NodePath", "in_subtree",
           "route_words", "reserved_segment", "CAMPAIGN_ROUTE"]

#: one segment of a node path (a flat campaign name is one segment)
SEGMENT = r"[A-Za-z0-9][A-Za-z0-9._:@+-]{0,127}"
#: a node path: 1 to TREE_DEPTH segments joined by '/'
NODE_PATH = rf"^{SEGMENT}(?:/{SEGMENT}){{0,{TREE_DEPTH - 1}}}$"
#: the longest node path, in characters
MAX_PATH = 256
#: the prefix of every route that names a campaign (a node path: Starlette's path converter)
CAMPAIGN_ROUTE = "/v1/campaigns/{campaign:path}"

NodePath = Annotated[str, Field(min_length=1, max_length=MAX_PATH, pattern=NODE_PATH)]

_NODE_RE = re.compile(NODE_PATH)


def route_words(routes: Iterable[Any]) -> frozenset[str]:
    """The literal segments of every route below a campaign's path: the words a node
    segment may not be."""
    words: set[str] = set()
    prefix = CAMPAIGN_ROUTE + "/"
    for r in routes:
        path = getattr(r, "path", "")
        if path.startswith(prefix):
            words.update(s for s in path[len(prefix):].split("/")
                         if s and not s.startswith("{"))
    return frozenset(words)


def reserved_segment(name: str, words: frozenset[str]) -> str | None:
    """The first segment of ``name`` that is a reserved word, or None."""
    for seg in name.split("/"):
        if seg in words:
            return seg
    return None


def is_node_path(name: str) -> bool:
    return len(name) <= MAX_PATH and _NODE_RE.match(name) is not None
