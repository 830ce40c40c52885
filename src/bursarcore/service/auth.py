"""Bearer tokens: campaign-scoped tokens and operator tokens, stored hashed.

A token is ``bsr_`` + 43 URL-safe characters (256 random bits from :mod:`secrets`). The
store keeps only ``sha256(token)``: with 256-bit random secrets a slow password hash
(scrypt, argon2) buys nothing against guessing and would cost every request milliseconds
of CPU, so a fast cryptographic hash is the right tool (it is what GitHub-style API tokens
use). A presented token is hashed and compared with **every** stored digest using
:func:`hmac.compare_digest`, without stopping at a match, so the time taken says nothing
about which token, or which prefix, matched. Tokens never appear in logs, errors or reprs.

The store is a JSON file (written atomically, mode 0600)::

    {"version": 1, "tokens": [{"id": "3f9a...", "role": "campaign", "campaign": "storm",
                              "sha256": "<hex>", "created": 1700000000.0}]}
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidArgument

__all__ = ["Principal", "TokenStore", "hash_token", "in_subtree", "OPERATOR", "CAMPAIGN",
           "MAX_TOKEN_LEN"]

OPERATOR, CAMPAIGN = "operator", "campaign"
PREFIX = "bsr_"
MAX_TOKEN_LEN = 256


def hash_token(token: str) -> str:
    """Hex sha256 of a token (what the store keeps)."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def in_subtree(name: str, node: str) -> bool:
    """Whether ``name`` is ``node`` or a node below it in a tree of envelopes
    (``astro/survey`` is in the subtree of ``astro``; ``astro2`` is not)."""
    return name == node or (name.startswith(node) and name[len(node):len(node) + 1] == "/")


@dataclass(frozen=True)
class Principal:
    """Who is calling: an operator (every campaign) or one node's subtree (a campaign token
    acts for its node and every node below it, never above or beside it). ``token_id``
    names the token (not the secret) for rate limiting and audit."""

    token_id: str
    role: str
    campaign: str | None = None

    @property
    def operator(self) -> bool:
        return self.role == OPERATOR

    def may_act_for(self, campaign: str) -> bool:
        """The access rule, written once: the operator acts for every campaign, a campaign
        token for its node's subtree."""
        return self.operator or (self.campaign is not None
                                 and in_subtree(campaign, self.campaign))


@dataclass
class _Entry:
    id: str
    role: str
    campaign: str | None
    digest: bytes
    created: float

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "role": self.role, "campaign": self.campaign,
                "sha256": self.digest.hex(), "created": self.created}


class TokenStore:
    """Hashed bearer tokens, optionally persisted to ``path``.

    ``mint(role, campaign)`` returns a new token (the only time the secret exists outside
    the caller) and stores its digest; ``authenticate(token)`` returns the
    :class:`Principal` or None.
    """

    def __init__(self, path: str | os.PathLike | None = None) -> None:
        self.path = os.fspath(path) if path is not None else None
        self._entries: list[_Entry] = []
        self._lock = threading.Lock()
        if self.path is not None and os.path.exists(self.path):
            self._load()

    def __repr__(self) -> str:  # never the digests
        return f"TokenStore(path={self.path!r}, tokens={len(self._entries)})"

    def __len__(self) -> int:
        return len(self._entries)

    def _load(self) -> None:
        assert self.path is not None
        try:
            with open(self.path, encoding="utf-8") as f:
                data = json.load(f)
            entries = []
            for e in data["tokens"]:
                if e["role"] not in (OPERATOR, CAMPAIGN):
                    raise ValueError(f"role {e['role']!r}")
                digest = bytes.fromhex(e["sha256"])
                if len(digest) != 32:
                    raise ValueError("sha256 must be 64 hex digits")
                entries.append(_Entry(str(e["id"]), e["role"], e.get("campaign"), digest,
                                      float(e.get("created", 0.0))))
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise InvalidArgument("tokens", f"token store {self.path} is not readable: {e}") \
                from None
        self._entries = entries

    def save(self) -> None:
        if self.path is None:
            return
        data = {"version": 1, "tokens": [e.to_json() for e in self._entries]}
        d = os.path.dirname(os.path.abspath(self.path))
        fd, tmp = tempfile.mkstemp(prefix=".tokens-", dir=d)
        try:
            os.fchmod(fd, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(data, f, indent=1)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    def mint(self, role: str, campaign: str | None = None) -> str:
        """A new token for ``role`` (``"operator"`` or ``"campaign"`` with ``campaign``)."""
        token = PREFIX + secrets.token_urlsafe(32)
        self.add_digest(role, campaign, hash_token(token))
        return token

    def add_digest(self, role: str, campaign: str | None, sha256_hex: str) -> str:
        """Register a token by its digest (tokens handed out elsewhere). Returns its id."""
        if role not in (OPERATOR, CAMPAIGN):
            raise InvalidArgument("role", "must be 'operator' or 'campaign'", role)
        if role == CAMPAIGN and (not isinstance(campaign, str) or not campaign):
            raise InvalidArgument("campaign", "a campaign token names its campaign", campaign)
        try:
            digest = bytes.fromhex(sha256_hex)
        except (TypeError, ValueError):
            raise InvalidArgument("sha256", "must be 64 hex digits") from None
        if len(digest) != 32:
            raise InvalidArgument("sha256", "must be 64 hex digits")
        with self._lock:
            entry = _Entry(secrets.token_hex(6), role, campaign if role == CAMPAIGN else None,
                           digest, time.time())
            self._entries.append(entry)
            self.save()
        return entry.id

    def revoke(self, token_id: str) -> bool:
        with self._lock:
            n = len(self._entries)
            self._entries = [e for e in self._entries if e.id != token_id]
            changed = len(self._entries) != n
            if changed:
                self.save()
        return changed

    def revoke_campaign(self, campaign: str) -> int:
        with self._lock:
            n = len(self._entries)
            self._entries = [e for e in self._entries if e.campaign != campaign]
            if len(self._entries) != n:
                self.save()
        return n - len(self._entries)

    def listing(self, subtree: str | None = None) -> list[dict[str, Any]]:
        """Token ids, roles and campaigns (never digests); with ``subtree`` only the
        campaign tokens of that node and the nodes below it."""
        return [{"id": e.id, "role": e.role, "campaign": e.campaign, "created": e.created}
                for e in self._entries
                if subtree is None or (e.campaign is not None
                                       and in_subtree(e.campaign, subtree))]

    def campaign_of(self, token_id: str) -> str | None:
        """The campaign of the campaign token ``token_id`` (None: no such campaign token)."""
        with self._lock:
            for e in self._entries:
                if e.id == token_id and e.role == CAMPAIGN:
                    return e.campaign
        return None

    def authenticate(self, token: str | None) -> Principal | None:
        if not token or len(token) > MAX_TOKEN_LEN:
            return None
        digest = hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()
        found: _Entry | None = None
        for e in self._entries:          # no early exit: the time does not depend on which
            if hmac.compare_digest(e.digest, digest):
                found = e
        if found is None:
            return None
        return Principal(found.id, found.role, found.campaign)
