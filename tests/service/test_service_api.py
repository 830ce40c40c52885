"""The HTTP API end to end, over real HTTP on loopback, through :mod:`bursarcore.client`:
the same answers as the in-process broker, status codes and headers, validation that
names the field, limits, events, the journal, and token hygiene."""

from __future__ import annotations

import asyncio
import json
import math
import time

import httpx
import numpy as np
import pytest

from bursarcore import Decision, Event, Intent, Lease, Quote, Supply
from bursarcore.broker import Consumption
from bursarcore.client import AsyncBursarClient, BursarClient, RateLimited, Unauthorized
from bursarcore.errors import InvalidArgument, UnknownCampaign, UnknownLease


def _h(token):
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture(scope="module")
def shared(tmp_path_factory, base_config):
    from bursarcore.service.testing import ServerProcess

    srv = ServerProcess(tmp_path_factory.mktemp("api"), base_config).start()
    yield srv
    srv.stop()


@pytest.fixture
def server(shared):
    """The module's server; every lease and pending intent is given back afterwards."""
    yield shared
    op = _h(shared.tokens["operator"])
    with httpx.Client(base_url=shared.url, headers=op) as http:
        for c in http.get("/v1/campaigns").json()["campaigns"]:
            for l in http.get(f"/v1/campaigns/{c}/leases").json()["leases"]:
                http.post(f"/v1/campaigns/{c}/leases/{l['id']}/release")
            for p in http.get(f"/v1/campaigns/{c}/intents").json()["pending"]:
                http.delete(f"/v1/campaigns/{c}/intents/{p['intent_id']}")


@pytest.fixture
def fresh(server_factory):
    return server_factory(name="fresh")


def test_full_loop_returns_the_brokers_types(fresh):
    with BursarClient(fresh.url, fresh.tokens["alpha"]) as c:
        assert c.campaign == "alpha"
        s = c.supply()
        assert isinstance(s, Supply) and s.dims["gpu"].capacity == 64
        assert s.credits == 10000 and s.dims["gpu"].wait["cold"] is None
        q = c.quote(None, [1, 8, 64], [60, 600])
        assert isinstance(q, Quote) and q.cost.shape == (3, 2) and q.path.dtype.kind == "U"
        assert q.grantable[0, 0] and not q.grantable[2, 0] and q.reason[2, 0] == "ceiling"
        d = c.acquire(Intent("alpha", units={"gpu": (4, 16)}, duration=600))
        assert isinstance(d, Decision) and d.granted and isinstance(d.lease, Lease)
        assert d.units == 16 and d.lease.placement and d.seq >= 0
        assert [l.id for l in c.leases()] == [d.lease.id]
        r = c.renew(d.lease.id, 60)
        assert r.outcome == "granted" and r.lease.expiry == pytest.approx(d.lease.expiry + 60)
        rel = c.release(d.lease.id)
        assert rel.outcome == "released" and rel.cost < 0
        again = c.release(d.lease.id)             # idempotent: already ended
        assert again.outcome == "refused" and again.reason == "invalid"
        cons = c.consume(None, "fs", 0.5)
        assert isinstance(cons, Consumption) and cons.allowed == 0.5 and cons.retry_after == 0
        many = c.consume_many([("fs", 0.5), ("fs", 1000.0)])
        assert many[0].allowed == 0.5 and many[1].allowed < 1000 and many[1].reason == "tokens"
        assert 0 < many[1].retry_after < math.inf
        records, nxt = c.journal(op="acquire")
        assert [r["intent"] for r in records] == [d.intent_id] and nxt >= d.seq
        assert "alpha asked for" in c.explain(d.seq)


def test_intent_status_codes_and_headers(fresh):
    http = httpx.Client(base_url=fresh.url, headers=_h(fresh.tokens["alpha"]))
    r = http.post("/v1/campaigns/alpha/intents", json={"max": 8, "duration": 60})
    assert r.status_code == 201 and r.headers["location"].endswith(
        f"/leases/{r.json()['lease']['id']}")
    # ceiling 32: 8 held + 30 can only wait for alpha's own release -> pending with a ticket
    r = http.post("/v1/campaigns/alpha/intents", json={"min": 30, "max": 30, "duration": 60})
    assert r.status_code == 202, r.text
    iid = r.json()["intent_id"]
    assert r.headers["location"].endswith(f"/intents/{iid}")
    t = http.get(f"/v1/campaigns/alpha/intents/{iid}").json()
    assert t["status"] == "pending" and t["reason"] == "ceiling"
    assert [p["intent_id"] for p in http.get("/v1/campaigns/alpha/intents").json()["pending"]] == [iid]
    # refused, with the reason and (tokens) a Retry-After
    r = http.post("/v1/campaigns/alpha/intents", json={"max": 40, "min": 40, "duration": 60})
    assert r.status_code == 200 and r.json()["outcome"] == "refused"
    assert r.json()["reason"] == "ceiling"
    c = BursarClient(fresh.url, fresh.tokens["beta"])
    c.acquire(Intent("beta", units={"gpu": 16}, duration=3600))
    big = c.acquire(Intent("beta", units={"gpu": (16, 16)}, duration=3600))
    assert big.outcome in ("refused", "pending") and big.reason == "tokens"
    raw = http.post("/v1/campaigns/beta/intents", json={"min": 16, "max": 16, "duration": 3600},
                    headers=_h(fresh.tokens["beta"]))
    if raw.json()["retry_after"] is not None:
        assert int(raw.headers["retry-after"]) >= 1
    # cancel the pending one; the ticket says so; cancelling again is false
    assert http.delete(f"/v1/campaigns/alpha/intents/{iid}").json() == {
        "intent_id": iid, "cancelled": True}
    assert http.get(f"/v1/campaigns/alpha/intents/{iid}").json()["status"] == "cancelled"
    assert http.delete(f"/v1/campaigns/alpha/intents/{iid}").json()["cancelled"] is False
    c.close()


def test_pending_ticket_is_granted_when_capacity_frees(fresh):
    c = BursarClient(fresh.url, fresh.tokens["alpha"])
    d1 = c.acquire(Intent("alpha", units={"gpu": 16}, duration=3600))
    p = c.acquire(Intent("alpha", units={"gpu": (20, 20)}, duration=600))
    assert p.outcome == "pending"
    assert c.ticket(p.intent_id).status == "pending"
    c.release(d1.lease.id)
    t = c.ticket(p.intent_id)
    assert t.status == "granted" and t.lease.units == 20
    page = c.events(timeout=5)
    assert any(e.kind == "granted" and e.intent_id == p.intent_id for e in page.events)
    c.close()


def test_batch_endpoints(server):
    with BursarClient(server.url, server.tokens["alpha"]) as c:
        ds = c.acquire_batch([Intent("alpha", units={"gpu": 1}, duration=60) for _ in range(20)])
        assert [d.outcome for d in ds] == ["granted"] * 20
        assert len({d.lease.id for d in ds}) == 20 and ds[0].seq < ds[-1].seq
        out = c.consume_many([("fs", 0.01)] * 50)
        assert all(o.allowed == 0.01 for o in out)
    http = httpx.Client(base_url=server.url, headers=_h(server.tokens["alpha"]))
    r = http.post("/v1/campaigns/alpha/intents/batch",
                  json={"intents": [{"max": 1, "duration": 60}, {"max": 1, "duration": 60,
                                                                "dim": "tpu"}]})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "intents", 1, "dim"]
    r = http.post("/v1/campaigns/alpha/intents/batch",
                  json={"intents": [{"max": 1, "duration": 60}] * 1001})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "intents"]


@pytest.mark.parametrize("path,body,field", [
    ("intents", {"max": 0, "duration": 60}, "max"),
    ("intents", {"max": 4, "min": 5, "duration": 60}, "max"),
    ("intents", {"max": 4, "duration": -1}, "duration"),
    ("intents", {"max": 4, "duration": "60"}, "duration"),
    ("intents", {"max": 4, "duration": 60, "colour": "red"}, "colour"),
    ("intents", {"max": 4, "duration": 60, "dim": "tpu"}, "dim"),
    ("intents", {"max": 4, "duration": 60, "service_class": "vip"}, "service_class"),
    ("intents", {"duration": 60}, "max"),
    ("quote", {"sizes": [], "durations": [60]}, "sizes"),
    ("quote", {"sizes": list(range(1, 1001)), "durations": [1.0] * 101}, "durations"),
    ("consume", {"dim": "gpu", "amount": 1}, "dim"),
    ("consume", {"dim": "fs", "amount": -1}, "amount"),
])
def test_invalid_input_is_422_naming_the_field(server, path, body, field):
    r = httpx.post(f"{server.url}/v1/campaigns/alpha/{path}", json=body,
                   headers=_h(server.tokens["alpha"]))
    assert r.status_code == 422, r.text
    locs = [e["loc"] for e in r.json()["detail"]]
    assert any(field in loc for loc in locs), locs


def test_invalid_json_and_nan_are_422(server):
    h = {**_h(server.tokens["alpha"]), "content-type": "application/json"}
    for raw in (b"{", b'{"max": 1, "duration": NaN}', b'{"max": 1, "duration": Infinity}',
                b"[]", b'"x"'):
        r = httpx.post(f"{server.url}/v1/campaigns/alpha/intents", content=raw, headers=h)
        assert r.status_code == 422, (raw, r.text)


def test_the_client_raises_what_the_broker_raises(server):
    with BursarClient(server.url, server.tokens["alpha"]) as c:
        with pytest.raises(InvalidArgument) as e:
            c.acquire(Intent("alpha", units={"tpu": 1}, duration=60))
        assert e.value.field == "dim"
        with pytest.raises(UnknownLease):
            c.lease(424242)
        with pytest.raises(UnknownCampaign):
            c.supply("beta")
    with pytest.raises(Unauthorized):
        BursarClient(server.url, "bsr_not-a-token").supply("alpha")


def test_body_size_limit_is_413(server):
    big = {"sizes": [1] * 700_000, "durations": [1.0]}   # 1.4 MB > 1 MiB
    r = httpx.post(f"{server.url}/v1/campaigns/alpha/quote", json=big,
                   headers=_h(server.tokens["alpha"]))
    assert r.status_code == 413

    def chunks():
        for _ in range(40):
            yield b" " * 65536
    r = httpx.post(f"{server.url}/v1/campaigns/alpha/quote", content=chunks(),
                   headers={**_h(server.tokens["alpha"]), "content-type": "application/json"})
    assert r.status_code == 413


def test_rate_limit_429_and_the_client_honours_retry_after(server_factory):
    srv = server_factory(rate=1, burst=3, name="limited")
    http = httpx.Client(base_url=srv.url, headers=_h(srv.tokens["alpha"]))
    codes = [http.get("/v1/campaigns/alpha/supply").status_code for _ in range(6)]
    assert codes[:3] == [200] * 3 and 429 in codes
    r = next(r for r in (http.get("/v1/campaigns/alpha/supply") for _ in range(5))
             if r.status_code == 429)
    assert int(r.headers["retry-after"]) >= 1
    # another token has its own bucket
    assert httpx.get(f"{srv.url}/v1/campaigns/beta/supply",
                     headers=_h(srv.tokens["beta"])).status_code == 200
    c = BursarClient(srv.url, srv.tokens["alpha"], campaign="alpha", retries=3)
    while http.get("/v1/campaigns/alpha/supply").status_code != 429:
        pass
    t0 = time.monotonic()
    s = c.supply()                      # waits out the Retry-After, then succeeds
    assert isinstance(s, Supply) and c.retried >= 1 and time.monotonic() - t0 >= 0.5
    c2 = BursarClient(srv.url, srv.tokens["alpha"], campaign="alpha", retries=0)
    with pytest.raises(RateLimited) as e:
        for _ in range(10):
            c2.supply()
    assert e.value.retry_after >= 1


def test_failed_authentication_is_rate_limited(fresh):
    codes = []
    with httpx.Client(base_url=fresh.url) as http:
        for i in range(400):          # 10/s with a burst of 20: a 429 comes quickly
            codes.append(http.get("/v1/whoami", headers=_h("bsr_guess%d" % i)).status_code)
            if codes[-1] == 429:
                break
    assert codes[0] == 401 and codes[-1] == 429


def test_events_long_poll_and_sse(server):
    c = BursarClient(server.url, server.tokens["alpha"])
    page = c.events()
    cursor = page.next
    d = c.acquire(Intent("alpha", units={"gpu": 2}, duration=0.5))
    t0 = time.monotonic()
    page = c.events(after=cursor, timeout=10)
    assert time.monotonic() - t0 < 8
    assert [(e.kind, e.lease_id) for e in page.events] == [("expired", d.lease.id)]
    assert isinstance(page.events[0], Event) and page.next > cursor
    assert c.events(after=page.next).events == []          # the cursor moves on
    # an event's cursor is its own journal record
    rec = httpx.get(f"{server.url}/v1/campaigns/alpha/journal/{page.seqs[0]}",
                    headers=_h(server.tokens["alpha"])).json()["record"]
    assert rec["op"] == "expire" and rec["lease"] == d.lease.id
    # SSE: the same event, and the stream resumes from Last-Event-ID
    with httpx.stream("GET", f"{server.url}/v1/campaigns/alpha/events/stream",
                      params={"after": cursor, "max_seconds": 1},
                      headers=_h(server.tokens["alpha"])) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        text = "".join(r.iter_text())
    assert f"id: {page.seqs[0]}" in text and "event: expired" in text
    data = json.loads(text.split("data: ")[1].split("\n")[0])
    assert data["lease_id"] == d.lease.id
    with httpx.stream("GET", f"{server.url}/v1/campaigns/alpha/events/stream",
                      params={"max_seconds": 0.5},
                      headers={**_h(server.tokens["alpha"]),
                               "Last-Event-ID": str(page.seqs[0])}) as r:
        assert "event: expired" not in "".join(r.iter_text())
    c.close()


def test_async_client(server):
    async def main():
        async with AsyncBursarClient(server.url, server.tokens["beta"]) as c:
            s = await c.supply()
            d = await c.acquire(Intent("beta", units={"gpu": (1, 4)}, duration=60))
            got = await asyncio.gather(*(c.lease(d.lease.id) for _ in range(10)))
            rel = await c.release(d.lease.id)
            return s, d, got, rel
    s, d, got, rel = asyncio.run(main())
    assert isinstance(s, Supply) and d.granted and all(g == d.lease for g in got)
    assert rel.outcome == "released"


def test_operator_registers_a_campaign_and_its_token_works(server):
    from bursarcore import Envelope
    op = BursarClient(server.url, server.tokens["operator"])
    idx, token = op.register("delta", Envelope(credits=100, sustained={"gpu": 4},
                                               ceiling={"gpu": 8}, burst={"gpu": 0}))
    assert idx == 3 and token.startswith("bsr_")
    with BursarClient(server.url, token) as c:
        assert c.campaign == "delta" and c.acquire(Intent("delta", units={"gpu": 4},
                                                          duration=60)).granted
    with pytest.raises(InvalidArgument) as e:
        op.register("delta", Envelope(credits=1))
    assert e.value.field == "name"
    with pytest.raises(InvalidArgument) as e:
        op.register("eps", Envelope(credits=1, guaranteed={"gpu": 60}, sustained={"gpu": 60},
                                    ceiling={"gpu": 60}))
    assert "guaranteed" in e.value.field
    st = op.state()
    assert "delta" in st["campaigns"]
    with pytest.raises(InvalidArgument):
        op.supply()                      # an operator must name the campaign


def test_tokens_stored_hashed_and_never_logged(server):
    store = server.tokens_path.read_text()
    for t in server.tokens.values():
        assert t not in store
        assert t[4:] not in store
    # exercise success, failure and errors, then look for any token in the log
    for t in list(server.tokens.values()) + ["bsr_wrong"]:
        httpx.get(f"{server.url}/v1/whoami", headers=_h(t))
        httpx.post(f"{server.url}/v1/campaigns/alpha/intents", json={"bad": 1}, headers=_h(t))
    log = server.log()
    for t in server.tokens.values():
        assert t not in log
    c = BursarClient(server.url, server.tokens["alpha"])
    assert server.tokens["alpha"] not in repr(c)


def test_openapi_is_generated_and_documents_security(server):
    spec = httpx.get(f"{server.url}/openapi.json").json()
    assert spec["info"]["title"] == "bursar"
    paths = spec["paths"]
    assert "/v1/campaigns/{campaign}/intents" in paths
    post = paths["/v1/campaigns/{campaign}/intents"]["post"]
    assert {"200", "201", "202", "401", "404", "422", "429"} <= set(post["responses"])
    assert "HTTPBearer" in spec["components"]["securitySchemes"]


def test_broker_time_header_and_client_clock(server):
    c = BursarClient(server.url, server.tokens["alpha"])
    s = c.supply()
    assert abs(c.now() - time.time()) < 5 and abs(s.time - time.time()) < 5
    c.close()


def test_in_process_and_remote_decide_alike(fresh, base_config):
    """The same intents against an embedded broker built from the same config and the
    remote one: same outcomes, units, paths and reasons."""
    from bursarcore.service.core import build_broker, envelope_from_json
    from bursarcore import ManualClock

    b = build_broker(base_config, ManualClock(time.time()))
    for name, env in base_config["campaigns"].items():
        b.register(name, envelope_from_json(env))
    c = BursarClient(fresh.url, fresh.tokens["alpha"])
    script = [((1, 4), 600), ((8, 16), 600), ((30, 30), 60), ((1, 32), 60), ((2, 2), 10)]
    for (lo, hi), dur in script:
        i = Intent("alpha", units={"gpu": (lo, hi)}, duration=dur)
        local, remote = b.acquire(i), c.acquire(i)
        assert (local.outcome, local.units, local.path, local.reason) == \
            (remote.outcome, remote.units, remote.path, remote.reason)
        assert type(local) is type(remote)
        if local.lease:
            assert local.lease.placement == remote.lease.placement
    q1 = b.quote("alpha", [1, 8, 32], [60, 3600])
    q2 = c.quote("alpha", [1, 8, 32], [60, 3600])
    assert np.array_equal(q1.grantable, q2.grantable) and np.array_equal(q1.path, q2.path)
    assert np.allclose(q1.cost, q2.cost)
    c.close()
