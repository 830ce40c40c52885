"""The decision stream (``/v1/stream``): round trips, order, errors naming the field,
access, rate limits, events, back pressure — in process (Starlette's ``TestClient``, a
memory journal, a manual clock) and on a real server on loopback (bounded waits)."""

from __future__ import annotations

import asyncio
import collections
import json
import threading
import time

import pytest

from bursarcore import Intent
from bursarcore.broker import Consumption, Decision, Event
from bursarcore.client import AsyncBursarClient, BursarClient, RateLimited, Unauthorized
from bursarcore.errors import InvalidArgument, UnknownCampaign, UnknownLease
from bursarcore.service.app import ServiceSettings
from bursarcore.service.auth import Principal
from bursarcore.service.stream import StreamSession
from bursarcore.service.testing import InProcessService
from stream_stall import metric, stalled

websockets = pytest.importorskip("websockets")
msgpack = pytest.importorskip("msgpack")


def _acq(i, **kw):
    return {"id": i, "op": "acquire", "max": 1, "duration": 60, **kw}


@pytest.fixture
def svc(base_config):
    return InProcessService(base_config)


def _answers(ws, n):
    """``n`` answers (events skipped), whatever the frames hold."""
    out = []
    while len(out) < n:
        msg = ws.receive()
        doc = msgpack.unpackb(msg["bytes"]) if msg.get("bytes") is not None \
            else json.loads(msg["text"])
        for m in doc if isinstance(doc, list) else [doc]:
            if m.get("type") != "event":
                out.append(m)
    return out


# ---------------------------------------------------------------------------- in process
def test_round_trip_of_every_operation_in_order(svc):
    with svc.client() as c, c.websocket_connect("/v1/stream",
                                                headers=svc.headers("alpha")) as ws:
        ws.send_text(json.dumps(_acq("a", min=2, max=4)))
        (d,) = _answers(ws, 1)
        assert d["id"] == "a" and d["type"] == "decision"
        dec = d["decision"]
        assert dec["outcome"] == "granted" and dec["units"] == 4 and dec["campaign"] == "alpha"
        lid = dec["lease"]["id"]
        ws.send_text(json.dumps([{"id": 1, "op": "renew", "lease": lid, "duration": 30},
                                 {"id": 2, "op": "consume", "dim": "fs", "amount": 0.5},
                                 {"id": 3, "op": "release", "lease": lid},
                                 {"id": 4, "op": "release", "lease": lid}]))
        r = _answers(ws, 4)
        assert [m["id"] for m in r] == [1, 2, 3, 4]
        assert r[0]["decision"]["outcome"] == "granted"
        assert r[0]["decision"]["lease"]["expiry"] == dec["lease"]["expiry"] + 30
        assert r[1]["type"] == "consumption" and r[1]["consumption"]["allowed"] == 0.5
        assert r[2]["decision"]["outcome"] == "released"
        assert r[3]["decision"]["outcome"] == "refused" and r[3]["decision"]["reason"] == "invalid"
        # each answer is the journal's record
        for m in (d, *r):
            seq = (m.get("decision") or m.get("consumption"))["seq"]
            rec = c.get(f"/v1/campaigns/alpha/journal/{seq}", headers=svc.headers("alpha"))
            assert rec.status_code == 200
    assert svc.broker.leases("alpha") == []


def test_answers_follow_the_order_of_the_messages_across_frames_and_forms(svc):
    rng = __import__("random").Random(3)
    msgs = []
    for i in range(600):
        r = rng.random()
        if r < 0.5:
            msgs.append(_acq(i, max=rng.randint(1, 3)))
        elif r < 0.8:
            msgs.append({"id": i, "op": "consume", "dim": "fs", "amount": 0.01})
        else:
            msgs.append(_acq(i, max=0))                   # refused as invalid: an error
    with svc.client() as c, c.websocket_connect("/v1/stream?events=false",
                                                headers=svc.headers("alpha")) as ws:
        k = 0
        binary = False
        while k < len(msgs):
            n = rng.randint(1, 40)
            chunk = msgs[k:k + n]
            if binary:
                ws.send_bytes(msgpack.packb(chunk if n > 1 else chunk[0]))
            else:
                ws.send_text(json.dumps(chunk if n > 1 else chunk[0]))
            binary = not binary
            k += n
        got = []
        while len(got) < len(msgs):
            m = ws.receive()
            doc = msgpack.unpackb(m["bytes"]) if m.get("bytes") is not None \
                else json.loads(m["text"])
            got.extend(doc if isinstance(doc, list) else [doc])
    assert [m["id"] for m in got] == list(range(len(msgs)))
    seqs = [(m.get("decision") or m.get("consumption"))["seq"] for m in got
            if m["type"] != "error"]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    assert {m["type"] for m in got} == {"decision", "consumption", "error"}


@pytest.mark.parametrize("message,loc,status", [
    (_acq(1, max=0), ["max"], 422),
    (_acq(1, duration=-1), ["duration"], 422),
    (_acq(1, duration=float("nan")), ["duration"], 422),
    (_acq(1, dim="nosuch"), ["dim"], 422),
    (_acq(1, service_class="gold"), ["service_class"], 422),
    (_acq(1, min=3, max=2), ["max"], 422),
    (_acq(1, colour="red"), ["colour"], 422),
    (_acq(1, max="2"), ["max"], 422),
    ({"id": 1, "op": "teleport"}, ["op"], 422),
    ({"id": 1, "op": "renew", "lease": -1, "duration": 5}, ["lease"], 422),
    ({"id": 1, "op": "renew", "lease": True, "duration": 5}, ["lease"], 422),
    ({"id": 1, "op": "renew", "lease": 0, "duration": 0}, ["duration"], 422),
    ({"id": 1, "op": "release"}, ["lease"], 422),
    ({"id": 1, "op": "consume", "dim": "gpu", "amount": 1}, ["dim"], 422),
    ({"id": 1, "op": "consume", "dim": "fs", "amount": -1}, ["amount"], 422),
    ({"id": [1], "op": "consume", "dim": "fs", "amount": 1}, ["id"], 422),
    ({"id": "x" * 65, "op": "consume", "dim": "fs", "amount": 1}, ["id"], 422),
    (_acq(1, campaign=7), ["campaign"], 422),
    ({"id": 1, "op": "release", "lease": 987654}, None, 404),
])
def test_bad_messages_answer_an_error_naming_the_field_and_change_nothing(svc, message,
                                                                          loc, status):
    with svc.client() as c, c.websocket_connect("/v1/stream",
                                                headers=svc.headers("alpha")) as ws:
        before = len(svc.service.journal)
        ws.send_text(json.dumps(message, allow_nan=True))
        ws.send_text(json.dumps({"id": "next", "op": "consume", "dim": "fs", "amount": 0.1}))
        err, nxt = _answers(ws, 2)
        assert err["type"] == "error" and err["status"] == status, err
        if loc is not None:
            assert err["detail"][0]["loc"] == loc, err
            assert err["detail"][0]["msg"]
        assert err["id"] == (message["id"] if loc != ["id"] else None)
        assert len(svc.service.journal) == before + 1       # only the next message's record
        assert nxt["id"] == "next" and nxt["type"] == "consumption"   # the stream goes on


def test_a_frame_that_cannot_be_read_answers_one_error(base_config):
    settings = ServiceSettings(rate=0, auth_fail_rate=0, stream_frame=10)
    s = InProcessService(base_config, settings=settings)
    with s.client() as c, c.websocket_connect("/v1/stream", headers=s.headers("alpha")) as ws:
        ws.send_text("{not json")
        ws.send_bytes(b"\xc1")                                # never valid MessagePack
        ws.send_text(json.dumps([_acq(i) for i in range(11)]))  # over stream_frame
        ws.send_text("[]")
        errs = _answers(ws, 4)
        assert [(e["id"], e["status"], e["detail"][0]["loc"]) for e in errs] == \
            [(None, 422, ["frame"])] * 4
        assert "JSON" in errs[0]["detail"][0]["msg"]
        assert "MessagePack" in errs[1]["detail"][0]["msg"]
        assert "1 to 10" in errs[2]["detail"][0]["msg"]
    assert s.broker.leases("alpha") == []


def test_access_rule_on_messages_and_on_the_upgrade(svc):
    from starlette.testclient import WebSocketDenialResponse

    beta = svc.broker.acquire(Intent("beta", units={"gpu": 2}, duration=600)).lease.id
    with svc.client() as c:
        for headers in ({}, {"Authorization": "Bearer bsr_nosuch"},
                        {"Authorization": f"Basic {svc.tokens['alpha']}"}):
            with pytest.raises(WebSocketDenialResponse) as e:
                with c.websocket_connect("/v1/stream", headers=headers):
                    pass
            assert e.value.status_code == 401
            assert e.value.headers["www-authenticate"] == "Bearer"
        bodies = []
        for q in ("campaign=beta", "campaign=nosuch"):
            with pytest.raises(WebSocketDenialResponse) as e:
                with c.websocket_connect(f"/v1/stream?{q}", headers=svc.headers("alpha")):
                    pass
            assert e.value.status_code == 404
            bodies.append(e.value.content)
        assert bodies[0] == bodies[1] == b'{"detail":"campaign not found"}'
        before = svc.broker.lease(beta)
        with c.websocket_connect("/v1/stream", headers=svc.headers("alpha")) as ws:
            pairs = [(_acq(1, campaign="beta"), _acq(1, campaign="nosuch")),
                     ({"id": 1, "op": "consume", "campaign": "beta", "dim": "fs", "amount": 1},
                      {"id": 1, "op": "consume", "campaign": "nosuch", "dim": "fs",
                       "amount": 1}),
                     ({"id": 1, "op": "renew", "lease": beta, "duration": 60},
                      {"id": 1, "op": "renew", "lease": 987654, "duration": 60}),
                     ({"id": 1, "op": "release", "lease": beta},
                      {"id": 1, "op": "release", "lease": 987654})]
            for theirs, missing in pairs:
                ws.send_text(json.dumps([theirs, missing]))
                a, b = _answers(ws, 2)
                assert a == b and a["status"] == 404, (a, b)
        assert svc.broker.lease(beta) == before and svc.broker.leases("alpha") == []
        # the operator acts for any campaign, naming it (or the stream's)
        with c.websocket_connect("/v1/stream", headers=svc.headers("operator")) as ws:
            ws.send_text(json.dumps([_acq(1), _acq(2, campaign="beta"),
                                     {"id": 3, "op": "release", "lease": beta,
                                      "campaign": "beta"}]))
            a, b, r = _answers(ws, 3)
            assert a["status"] == 422 and a["detail"][0]["loc"] == ["campaign"]
            assert b["decision"]["campaign"] == "beta" and b["decision"]["outcome"] == "granted"
            assert r["decision"]["outcome"] == "released"
        with c.websocket_connect("/v1/stream?campaign=gamma",
                                 headers=svc.headers("operator")) as ws:
            ws.send_text(json.dumps(_acq(1)))
            assert _answers(ws, 1)[0]["decision"]["campaign"] == "gamma"


def test_rate_limit_answers_429_for_each_message_of_the_frame_and_decides_nothing(base_config):
    s = InProcessService(base_config, settings=ServiceSettings(rate=0.001, burst=2,
                                                          auth_fail_rate=0))
    with s.client() as c, c.websocket_connect("/v1/stream", headers=s.headers("alpha")) as ws:
        ws.send_text(json.dumps(_acq(1)))
        ws.send_text(json.dumps(_acq(2)))
        ws.send_text(json.dumps([_acq(3), _acq(4)]))
        a, b, e3, e4 = _answers(ws, 4)
        assert a["type"] == b["type"] == "decision"
        assert (e3["id"], e3["status"], e4["id"], e4["status"]) == (3, 429, 4, 429)
        assert e3["retry_after"] > 0
    assert len(s.broker.leases("alpha")) == 2


def test_events_of_the_streams_campaign_arrive_on_it(svc):
    with svc.client() as c, \
            c.websocket_connect("/v1/stream", headers=svc.headers("alpha")) as wa, \
            c.websocket_connect("/v1/stream", headers=svc.headers("beta")) as wb:
        wa.send_text(json.dumps(_acq(1, duration=5)))
        lid = _answers(wa, 1)[0]["decision"]["lease"]["id"]
        svc.clock.advance(10)
        wa.send_text(json.dumps({"id": 2, "op": "consume", "dim": "fs", "amount": 0.1}))
        wb.send_text(json.dumps({"id": 9, "op": "consume", "dim": "fs", "amount": 0.1}))
        seen_a, seen_b = [], []
        while not any(m.get("type") == "consumption" for m in seen_a) or \
                not any(m.get("type") == "event" for m in seen_a):
            doc = json.loads(wa.receive_text())
            seen_a.extend(doc if isinstance(doc, list) else [doc])
        while not any(m.get("type") == "consumption" for m in seen_b):
            doc = json.loads(wb.receive_text())
            seen_b.extend(doc if isinstance(doc, list) else [doc])
        ev = [m["event"] for m in seen_a if m["type"] == "event"]
        assert ev[0]["kind"] == "expired" and ev[0]["lease_id"] == lid
        assert ev[0]["campaign"] == "alpha"
        assert all(m["type"] != "event" for m in seen_b)
    # with events=false none come, and after= replays from a cursor
    with svc.client() as c, c.websocket_connect(f"/v1/stream?after={ev[0]['seq'] - 1}",
                                                headers=svc.headers("alpha")) as ws:
        doc = json.loads(ws.receive_text())
        first = doc[0] if isinstance(doc, list) else doc
        assert first["type"] == "event" and first["event"]["seq"] == ev[0]["seq"]


class _StalledSocket:
    """A client that sends ``frames`` as fast as it is read and never reads an answer."""

    def __init__(self, frames):
        self.frames = collections.deque(frames)
        self.reads = 0
        self.unblock = asyncio.Event()
        self.sent = []

    async def receive(self):
        if not self.frames:
            await asyncio.Event().wait()
        self.reads += 1
        return {"type": "websocket.receive", "text": self.frames.popleft()}

    async def send_text(self, text):
        await self.unblock.wait()
        self.sent.append(text)

    send_bytes = send_text

    async def close(self, code=1000, reason=None):
        pass


def test_back_pressure_a_client_that_does_not_read_is_not_read(base_config):
    window, frame, total = 64, 16, 2000
    s = InProcessService(base_config, settings=ServiceSettings(
        rate=0, auth_fail_rate=0, stream_window=window, stream_frame=frame))
    ctx = s.app.state.streams
    msgs = [json.dumps({"id": i, "op": "consume", "dim": "fs", "amount": 0.0})
            for i in range(total)]

    async def main():
        ws = _StalledSocket(msgs)
        session = StreamSession(ws, ctx, Principal("t", "campaign", "alpha"), "alpha", -1,
                                events=False)
        task = asyncio.create_task(session.run())
        for _ in range(2000):                 # the loop settles: nothing more can happen
            await asyncio.sleep(0)
        stalled = (ws.reads, session.inflight, session.peak, len(s.service.journal))
        for _ in range(200):
            await asyncio.sleep(0)
        assert (ws.reads, session.inflight, session.peak, len(s.service.journal)) == stalled
        ws.unblock.set()                      # the client reads again: everything flows
        for _ in range(100_000):
            if session.answered == total:
                break
            await asyncio.sleep(0)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return stalled, session, ws

    journal0 = len(s.service.journal)
    (reads, inflight, peak, journal), session, ws = asyncio.run(main())
    assert reads <= window - frame + 1 and inflight == reads and peak <= window
    assert journal - journal0 == reads          # nothing decided beyond what was read
    assert session.answered == total and session.peak <= window
    ids = []
    for text in ws.sent:
        doc = json.loads(text)
        ids.extend(m["id"] for m in (doc if isinstance(doc, list) else [doc]))
    assert ids == list(range(total))


# ---------------------------------------------------------------------------- real server
@pytest.fixture(scope="module")
def live(tmp_path_factory, base_config):
    from bursarcore.service.testing import ServerProcess

    srv = ServerProcess(tmp_path_factory.mktemp("stream"), base_config,
                        extra_args=["--auth-fail-rate", "0"]).start()
    yield srv
    srv.stop()


def test_client_stream_round_trip_is_durable_and_in_order(live):
    with BursarClient(live.url, live.tokens["alpha"]) as c, c.stream(events=False) as s:
        ids = [s.acquire(Intent("alpha", units={"gpu": (1, 2)}, duration=60))
               for _ in range(50)]
        ids += [s.consume("fs", 0.01) for _ in range(50)]
        got = [s.receive() for _ in range(100)]
        assert [a.id for a in got] == ids
        assert all(isinstance(a.value, Decision) for a in got[:50])
        assert all(isinstance(a.value, Consumption) for a in got[50:])
        seqs = [a.value.seq for a in got]
        assert seqs == sorted(seqs)
        durable = c.health()["durable_seq"]
        assert max(seqs) <= durable                 # answered only once durable
        lids = [a.value.lease.id for a in got[:50] if a.value.granted]
        for lid in lids:
            s.release(lid)
        assert all(x.outcome == "released" for x in [next(s) for _ in lids])
        # an error answer raises what the HTTP client raises, and the stream goes on
        s.renew(987654, 10)
        s.consume("nosuch", 1.0)
        s.consume("fs", 0.0)
        with pytest.raises(UnknownLease):
            next(s)
        with pytest.raises(InvalidArgument, match="dim") as e:
            next(s)
        assert e.value.message_id == ids[-1] + len(lids) + 2
        assert isinstance(next(s), Consumption)
        assert not {l.id for l in c.leases()} & set(lids)


def test_async_client_stream_binary_with_events(live):
    async def main():
        async with AsyncBursarClient(live.url, live.tokens["beta"]) as c:
            async with c.stream(binary=True) as s:
                mid = await s.acquire(Intent("beta", units={"gpu": 1}, duration=0.5))
                first = await s.receive()
                assert first.id == mid
                end = time.monotonic() + 15
                async for x in s:
                    if isinstance(x, Event) and x.lease_id == first.value.lease.id:
                        return first.value, x
                    assert time.monotonic() < end
        raise AssertionError("no event")

    d, ev = asyncio.run(main())
    assert d.granted and (ev.kind, ev.campaign) == ("expired", "beta")


def test_client_stream_refusals_at_the_upgrade(live):
    with BursarClient(live.url, "bsr_nosuch") as c:
        with pytest.raises(Unauthorized):
            c.stream()
    with BursarClient(live.url, live.tokens["alpha"]) as c:
        with pytest.raises(UnknownCampaign):
            c.stream("beta")
        with pytest.raises(UnknownCampaign):
            c.stream("nosuch")


def test_a_client_that_does_not_read_holds_at_most_the_window_and_stalls_no_one(live):
    """A real socket: the client sends frames of 100 messages and never reads. The server
    stops reading it once its window (4096) is in flight and its answers fill the TCP
    buffers; its in-flight count stays within the window while the client is blocked,
    and the service answers others meanwhile."""
    from websockets.sync.client import connect

    op = live.tokens["operator"]
    window = ServiceSettings().stream_window
    ws = connect(live.url.replace("http", "ws") + "/v1/stream?events=false",
                 additional_headers={"Authorization": f"Bearer {live.tokens['alpha']}"},
                 compression=None).__enter__()
    frame = json.dumps([{"id": i, "op": "consume", "dim": "fs", "amount": 0.0}
                        for i in range(100)])
    with stalled(ws, frame, 100, live.url, op) as (t, got, sent):
        assert t.is_alive() and got < sent[0]         # the client is blocked in send
        assert metric(live.url, op, "bursar_stream_inflight") <= window
        assert 0 < metric(live.url, op, "bursar_stream_inflight_peak") <= window
        # another tenant is served meanwhile
        with BursarClient(live.url, live.tokens["beta"], timeout=5) as b:
            t0 = time.monotonic()
            assert b.consume("beta", "fs", 0.0).allowed == 0.0
            with b.stream(events=False) as s:
                s.consume("fs", 0.0)
                assert isinstance(next(s), Consumption)
            assert time.monotonic() - t0 < 5
    end = time.monotonic() + 20
    while metric(live.url, op, "bursar_stream_connections") > 0:
        assert time.monotonic() < end, "the server kept a closed stream open"
        time.sleep(0.2)


def test_stream_rate_limit_is_the_tokens_http_limit(tmp_path, base_config):
    from bursarcore.service.testing import ServerProcess

    srv = ServerProcess(tmp_path / "rl", base_config, rate=0.01, burst=3).start()
    try:
        with BursarClient(srv.url, srv.tokens["alpha"], retries=0) as c:
            c.whoami()                                   # one request of the burst of 3
            with c.stream(events=False, frame=1) as s:
                s.consume("fs", 0.0)
                s.consume("fs", 0.0)
                s.consume("fs", 0.0)
                assert isinstance(next(s), Consumption) and isinstance(next(s), Consumption)
                with pytest.raises(RateLimited) as e:
                    next(s)
                assert e.value.retry_after > 0
    finally:
        srv.stop()


def test_an_intent_shape_seen_before_is_no_way_around_the_checks(svc):
    """The server remembers the intents a connection sent (by value and type): a value
    equal in Python but of another type (true for 1) is checked as new and refused."""
    with svc.client() as c, c.websocket_connect("/v1/stream",
                                                headers=svc.headers("alpha")) as ws:
        ws.send_text(json.dumps([_acq(1), _acq(2), _acq(3, max=True), _acq(4, max=1.0),
                                 _acq(5, campaign="beta"), _acq(6, campaign="alpha")]))
        a = _answers(ws, 6)
        assert [m["type"] for m in a] == ["decision", "decision", "error", "error", "error",
                                          "decision"]
        assert a[2]["detail"][0]["loc"] == ["max"] and a[3]["detail"][0]["loc"] == ["max"]
        assert a[4]["status"] == 404


def test_a_stream_outlives_the_request_timeout(tmp_path, base_config):
    """``--request-timeout`` times the upgrade request only: an open stream that is idle
    longer still answers (the WebSocket's own pings keep time from the upgrade on)."""
    from bursarcore.service.testing import ServerProcess

    srv = ServerProcess(tmp_path / "rt", base_config,
                        extra_args=["--request-timeout", "0.5"]).start()
    try:
        with BursarClient(srv.url, srv.tokens["alpha"]) as c, c.stream(events=False) as s:
            s.consume("fs", 0.0)
            assert isinstance(next(s), Consumption)
            time.sleep(1.2)                     # idle past the request timeout
            s.consume("fs", 0.0)
            assert isinstance(next(s), Consumption)
    finally:
        srv.stop()


def test_an_unexpected_exception_fails_that_message_only(base_config, tmp_path):
    s = InProcessService(base_config, journal=tmp_path / "j.db")
    real = s.broker.acquire
    calls = []

    def boom(intent):
        calls.append(intent)
        if len(calls) == 1:
            raise OverflowError("Python int too large to convert to C long")
        return real(intent)

    s.broker.acquire = boom
    with s.client() as c, c.websocket_connect("/v1/stream", headers=s.headers("alpha")) as ws:
        ws.send_text(json.dumps([_acq(1), _acq(2)]))
        bad, good = _answers(ws, 2)
        assert (bad["id"], bad["status"]) == (1, 500) and "nothing was journaled" in bad["detail"]
        assert good["type"] == "decision" and good["decision"]["outcome"] == "granted"
    assert s.service.failed is None


def test_a_journal_failure_answers_503_and_closes_the_stream(base_config, tmp_path):
    import sqlite3

    s = InProcessService(base_config, journal=tmp_path / "j.db")

    def disk(intent):
        raise sqlite3.OperationalError("disk I/O error")

    with s.client() as c, c.websocket_connect("/v1/stream", headers=s.headers("alpha")) as ws:
        ws.send_text(json.dumps({"id": 0, "op": "consume", "dim": "fs", "amount": 0.1}))
        assert _answers(ws, 1)[0]["type"] == "consumption"
        s.broker.acquire = disk
        ws.send_text(json.dumps([_acq(1), _acq(2)]))
        (err,) = _answers(ws, 1)                  # the rest of the frame is not decided
        assert (err["id"], err["status"]) == (1, 503)
        assert ws.receive() == {"type": "websocket.close", "code": 1011,
                                "reason": "the journal cannot be written"}
    assert s.service.failed is not None


def test_a_busy_stream_does_not_stall_other_tenants(live):
    """alpha floods its stream with 1000-message frames, reading as fast as it can;
    beta's single HTTP requests meanwhile are answered within a bound (the stream's
    frames are decided a slice at a time, with the event loop free between slices)."""
    stop = threading.Event()
    done = [0]

    def flood():
        with BursarClient(live.url, live.tokens["alpha"], timeout=30) as c, \
                c.stream(events=False, binary=True, frame=1000, window=4000) as s:
            while not stop.is_set():
                for _ in range(1000):
                    s.consume("fs", 0.0)
                for _ in range(1000):
                    next(s)
                done[0] += 1000

    t = threading.Thread(target=flood, daemon=True)
    t.start()
    try:
        end = time.monotonic() + 30
        while done[0] < 2000:                    # the flood is running
            assert time.monotonic() < end and t.is_alive()
            time.sleep(0.05)
        worst = 0.0
        with BursarClient(live.url, live.tokens["beta"], timeout=10) as b:
            for _ in range(20):
                t0 = time.monotonic()
                assert b.consume("beta", "fs", 0.0).seq >= 0
                worst = max(worst, time.monotonic() - t0)
        assert t.is_alive()                      # still flooding while beta was served
        assert worst < 2.0, worst
    finally:
        stop.set()
        t.join(30)


def test_preempt_notice_and_revocation_arrive_on_the_holders_stream(svc):
    with svc.client() as c, \
            c.websocket_connect("/v1/stream", headers=svc.headers("gamma")) as wg, \
            c.websocket_connect("/v1/stream", headers=svc.headers("alpha")) as wa:
        wg.send_text(json.dumps(_acq(1, max=64, duration=600)))
        lid = _answers(wg, 1)[0]["decision"]["lease"]["id"]
        wa.send_text(json.dumps(_acq(2, max=8, duration=600)))     # within its guarantee
        d = _answers(wa, 1)[0]["decision"]
        assert d["path"] == "reclaim"
        svc.clock.advance(2)                                       # past the 1 s grace
        wa.send_text(json.dumps({"id": 3, "op": "consume", "dim": "fs", "amount": 0.1}))
        _answers(wa, 1)
        kinds = []
        while "revoked" not in kinds:
            msg = json.loads(wg.receive_text())
            for m in msg if isinstance(msg, list) else [msg]:
                assert m["type"] == "event" and m["event"]["lease_id"] == lid
                kinds.append(m["event"]["kind"])
        assert kinds == ["preempt_notice", "revoked"]
