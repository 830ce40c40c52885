"""The client's ways to receive events, against the real service over loopback:
``poll()`` (every event since the last poll, like ``Broker.poll``; an operator's covers
every campaign), ``events()`` pages, and ``event_stream()`` over server-sent events, which
reconnects from the last seq."""

from __future__ import annotations

import asyncio
import time

import pytest

from bursarcore import Event, Intent
from bursarcore.client import AsyncBursarClient, BursarClient
from bursarcore.errors import InvalidArgument, UnknownCampaign


@pytest.fixture(scope="module")
def srv(tmp_path_factory, base_config):
    from bursarcore.service.testing import ServerProcess

    s = ServerProcess(tmp_path_factory.mktemp("events"), base_config).start()
    yield s
    s.stop()


def _expire(c, campaign, n, duration=0.3):
    """``n`` short leases; returns their ids once all have expired (and been journaled)."""
    ids = [c.acquire(Intent(campaign, units={"gpu": 1}, duration=duration)).lease.id
           for _ in range(n)]
    end = time.monotonic() + 10
    while any(l.id in ids for l in c.leases(campaign)) and time.monotonic() < end:
        time.sleep(0.05)
    return ids


def _settle(c):
    """Wait until no more events arrive (earlier tests' expiries)."""
    while c.events(after=c._cursor, timeout=0.5).events:
        c.poll()


def test_poll_returns_every_event_since_the_last_poll_across_pages(srv):
    with BursarClient(srv.url, srv.tokens["alpha"]) as c:
        c.poll()
        _settle(c)
        assert c.poll() == []
        ids = _expire(c, "alpha", 3)
        got = []
        end = time.monotonic() + 10
        while len(got) < 3 and time.monotonic() < end:
            got += c.poll(timeout=2, limit=1)      # one event a request: all still come
        assert [(e.kind, e.lease_id) for e in got] == [("expired", i) for i in ids]
        assert all(isinstance(e, Event) and e.campaign == "alpha" for e in got)
        assert c.poll() == []                      # the cursor moved past them


def test_an_operators_poll_covers_every_campaign(srv):
    with BursarClient(srv.url, srv.tokens["operator"]) as op, \
            BursarClient(srv.url, srv.tokens["alpha"]) as a, \
            BursarClient(srv.url, srv.tokens["beta"]) as b:
        op.poll()
        _settle(op)
        la = _expire(a, "alpha", 1)[0]
        lb = _expire(b, "beta", 1)[0]
        got = []
        end = time.monotonic() + 10
        while len(got) < 2 and time.monotonic() < end:
            got += op.poll(timeout=2)
        assert sorted((e.campaign, e.lease_id) for e in got) == [("alpha", la), ("beta", lb)]
        page = op.events(after=-1, limit=1000)
        assert {e.campaign for e in page.events} >= {"alpha", "beta"}
        assert [e.lease_id for e in op.events(after=-1, campaign="beta", limit=1000).events
                ].count(lb) == 1
        with pytest.raises(InvalidArgument, match="campaign"):
            next(op.event_stream())                # no broker-wide stream: name one


def test_stream_yields_events_as_they_happen_and_resumes_from_a_seq(srv):
    with BursarClient(srv.url, srv.tokens["beta"]) as c:
        start = c.events(after=-1, limit=1000)
        cursor = start.next
        while start.events:
            start = c.events(after=cursor, limit=1000)
            cursor = start.next
        lid = c.acquire(Intent("beta", units={"gpu": 1}, duration=0.3)).lease.id
        t0 = time.monotonic()
        seq, ev = next(iter(c.event_stream(after=cursor, max_seconds=10)))
        assert time.monotonic() - t0 < 8
        assert (ev.kind, ev.lease_id, ev.campaign) == ("expired", lid, "beta")
        page = c.events(after=cursor)
        assert page.seqs[0] == seq and page.events[0] == ev    # the same event, same cursor
        # resuming from its seq: nothing more (the stream ends at max_seconds)
        t0 = time.monotonic()
        assert list(c.event_stream(after=seq, max_seconds=0.5)) == []
        assert 0.4 < time.monotonic() - t0 < 5
        # another campaign's stream is not there for this token
        with pytest.raises(UnknownCampaign):
            next(c.event_stream(campaign="alpha"))


def test_stream_reconnects_when_the_server_ends_it(srv):
    with BursarClient(srv.url, srv.tokens["alpha"]) as c:
        c._SSE_CHUNK = 0.4                 # the server closes every stream after 0.4 s
        cursor = c.events(after=-1, limit=1000)
        after = cursor.next
        while cursor.events:
            cursor = c.events(after=after, limit=1000)
            after = cursor.next
        lid = c.acquire(Intent("alpha", units={"gpu": 1}, duration=1.5)).lease.id
        before = c.requests
        got = []
        for seq, ev in c.event_stream(after=after, max_seconds=10):
            got.append(ev)
            if ev.lease_id == lid:
                break
        assert got[-1].kind == "expired" and got[-1].lease_id == lid
        assert c.requests - before >= 3    # 1.5 s of 0.4 s streams: it reconnected


def test_async_stream_and_poll(srv):
    async def main():
        async with AsyncBursarClient(srv.url, srv.tokens["beta"]) as c:
            await c.poll()
            while (await c.events(after=c._cursor, timeout=0.5)).events:
                await c.poll()
            d = await c.acquire(Intent("beta", units={"gpu": 1}, duration=0.3))
            start = c._cursor
            streamed = None
            async for seq, ev in c.event_stream(after=start, max_seconds=10):
                streamed = (seq, ev)
                break
            polled = []
            end = time.monotonic() + 10
            while not polled and time.monotonic() < end:
                polled = await c.poll(timeout=2)
            return d.lease.id, streamed, polled

    lid, (seq, ev), polled = asyncio.run(main())
    assert (ev.kind, ev.lease_id) == ("expired", lid)
    assert polled == [ev]


def test_the_event_log_window_and_the_journal_agree():
    """The service keeps the newest ``event_log`` events and reads older ones from the
    journal's rows: both give the same events, across the window's edge and when the log
    is filled in one scan or several."""
    from bursarcore import Broker, Envelope, Intent, ManualClock, Pool
    from bursarcore.journal.memory import MemoryJournal
    from bursarcore.service.core import BrokerService

    b = Broker(Pool(gpu=64), clock=ManualClock(0.0), journal=MemoryJournal())
    b.register("c", Envelope(credits=1e9, sustained={"gpu": 64}, ceiling={"gpu": 64},
                             burst={"gpu": float("inf")}))
    svc = BrokerService(b, event_log=16)
    seen = []
    for step in range(5):
        for _ in range(10):
            b.acquire(Intent("c", units={"gpu": 1}, duration=1.0))
        b.clock.advance(2.0)
        b.poll()
        svc._durable = len(b.journal) - 1
        if step % 2:
            seen = svc.events_since(None, -1, 10_000)   # scans now and then, not every step
    every = svc.events_since(None, -1, 10_000)
    assert len(every) == 50 and [e["kind"] for e in every] == ["expired"] * 50
    assert seen == every[:len(seen)]
    assert len(svc._events) == 16 and svc._log_start == every[-16]["seq"]
    for after in (-1, every[20]["seq"], every[-17]["seq"], every[-5]["seq"]):
        assert svc.events_since(None, after, 10_000) == [e for e in every if e["seq"] > after]
