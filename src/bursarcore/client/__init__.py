"""A client for ``bursar serve``: the broker's API over HTTP, returning the broker's types.

``BursarClient(base_url, token)`` (sync) and ``AsyncBursarClient`` (async) answer with the
same :class:`~bursarcore.Decision`, :class:`~bursarcore.Lease`, :class:`~bursarcore.Supply`,
:class:`~bursarcore.Quote`, :class:`~bursarcore.broker.Consumption` and
:class:`~bursarcore.Event` the in-process :class:`~bursarcore.Broker` returns, and take the
same arguments (an :class:`~bursarcore.Intent` for ``acquire``), so an agent switches from
embedded to remote by changing the line that makes the broker::

    broker = Broker(Pool(gpu=512), clock=MonotonicClock())      # embedded
    broker = BursarClient("http://127.0.0.1:8000", token)         # remote

A campaign argument may be left out: it defaults to the token's own campaign.

``stream()`` opens the decision stream (``/v1/stream``, one WebSocket): intents, renewals,
releases and consumptions sent without waiting, answered in order once durable, with the
campaign's events on the same connection (:class:`DecisionStream`). ``event_stream()``
iterates over the campaign's events alone (server-sent events).

Errors: bad input raises :class:`~bursarcore.errors.InvalidArgument` naming the field (HTTP
422); another campaign's or a missing lease raises :class:`~bursarcore.errors.UnknownLease`
(404), a campaign :class:`~bursarcore.errors.UnknownCampaign`; a refusal is a value, as in
process. Transport trouble raises :class:`ServiceError` subclasses.

Retries: a 429 (rate limit) is retried after its ``Retry-After`` (the request was not
processed). Idempotent calls (reads, ``cancel``, ``release``) are also retried with
exponential backoff and jitter on connection errors, timeouts and 502/503/504. Calls that
change state (``acquire``, ``renew``, ``consume``) are retried only when the request never
reached the server (a refused connection). Every call is bounded: ``timeout`` seconds per
attempt, ``retries`` extra attempts, waits capped at ``max_wait``.
"""

from __future__ import annotations

from ._async import AsyncBursarClient
from ._base import (EventPage, Forbidden, RateLimited, ServiceError, ServiceTimeout, Ticket,
                    Unauthorized, Unavailable)
from ._stream import Answer, AsyncDecisionStream, DecisionStream
from ._sync import BursarClient

__all__ = ["BursarClient", "AsyncBursarClient", "ServiceError", "Unauthorized", "Forbidden",
           "RateLimited", "Unavailable", "ServiceTimeout", "EventPage", "Ticket",
           "DecisionStream", "AsyncDecisionStream", "Answer"]

# the public names are documented (and printed) as this package's
for _name in __all__:
    globals()[_name].__module__ = __name__
del _name
