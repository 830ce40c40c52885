"""A tree of envelopes over HTTP, in this process on a manual clock: node paths in URLs
(``/`` and ``%2F`` alike), the reserved route words, subtree-scoped tokens (delegation:
registering nodes below one's own, minting, listing and revoking the subtree's tokens),
the stream and the columnar batches on node paths, and the client's methods for them.
Every refused request names the field and the rule, and changes nothing."""

from __future__ import annotations

import copy
import json

import pytest

from bursarcore import Envelope, Intent
from bursarcore.client import AsyncBursarClient, BursarClient, Forbidden
from bursarcore.errors import InvalidArgument, UnknownCampaign
from bursarcore.service.app import ServiceSettings
from bursarcore.service.auth import Principal, in_subtree
from bursarcore.service.nodes import CAMPAIGN_ROUTE, MAX_PATH, route_words
from bursarcore.service.testing import InProcessService

ENV = {"credits": 10000, "ceiling": {"gpu": 16, "fs": 4}, "sustained": {"gpu": 16, "fs": 2},
       "burst": {"gpu": 1e6, "fs": 10}}
TREE = {"pool": {"gpu": 32, "flow": {"fs": 10.0}}, "campaigns": {
    "astro": {**ENV, "guaranteed": {"gpu": 8}},
    "astro/survey": {**ENV, "guaranteed": {"gpu": 4}},
    "astro/other": {**ENV, "guaranteed": {"gpu": 2}},
    "astro2": ENV,
    "bio": ENV}}


@pytest.fixture(params=[True, False], ids=["direct", "routed"])
def svc(request):
    return InProcessService(copy.deepcopy(TREE), settings=ServiceSettings(
        rate=0, auth_fail_rate=0, direct=request.param))


def _h(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _state(svc) -> tuple:
    """What a refused request must leave as it was."""
    return (list(svc.broker.campaigns), len(svc.service.journal),
            sorted((t["id"], t["campaign"]) for t in svc.store.listing()))


# ---------------------------------------------------------------------------- the rule
@pytest.mark.parametrize("name,node,inside", [
    ("astro", "astro", True), ("astro/survey", "astro", True),
    ("astro/survey/a", "astro", True), ("astro2", "astro", False),
    ("astro2/x", "astro", False), ("astr", "astro", False), ("bio", "astro", False),
    ("astro", "astro/survey", False), ("astro/other", "astro/survey", False),
    ("astro/survey2", "astro/survey", False), ("astro/survey/x", "astro/survey", True),
])
def test_the_subtree_rule(name, node, inside):
    assert in_subtree(name, node) is inside
    assert Principal("t", "campaign", node).may_act_for(name) is inside
    assert Principal("t", "operator").may_act_for(name)


def test_reserved_words_are_the_routes_own(svc):
    words = svc.app.state.reserved_segments
    expect = set()
    for r in svc.app.routes:
        path = getattr(r, "path", "")
        if path.startswith(CAMPAIGN_ROUTE + "/"):
            expect |= {s for s in path[len(CAMPAIGN_ROUTE) + 1:].split("/") if "{" not in s}
    assert words == expect == route_words(svc.app.routes)
    assert {"supply", "quote", "intents", "batch", "leases", "renew", "release", "consume",
            "events", "stream", "journal", "tokens"} <= words


# ---------------------------------------------------------------------------- node URLs
@pytest.mark.parametrize("sep", ["/", "%2F", "%2f"])
def test_every_campaign_route_takes_a_node_path(svc, sep):
    node = "astro/survey"
    url = f"/v1/campaigns/astro{sep}survey"
    h = _h(svc.tokens["astro"])            # the parent's token acts for its child
    with svc.client() as http:
        assert http.get(f"{url}/supply", headers=h).json()["campaign"] == node
        assert http.post(f"{url}/quote", json={"sizes": [1], "durations": [60]},
                         headers=h).status_code == 200
        r = http.post(f"{url}/intents", json={"max": 2, "duration": 60}, headers=h)
        assert r.status_code == 201, r.text
        d = r.json()
        lid = d["lease"]["id"]
        assert d["campaign"] == node and d["lease"]["campaign"] == node
        assert r.headers["location"] == f"/v1/campaigns/{node}/leases/{lid}"
        assert http.get(r.headers["location"], headers=h).json()["id"] == lid
        r = http.post(f"{url}/intents/batch", json={"intents": [{"max": 1, "duration": 60}]},
                      headers=h)
        assert r.json()["decisions"][0]["campaign"] == node
        # above the ceiling with what it holds: it waits
        r = http.post(f"{url}/intents", json={"max": 14, "duration": 60}, headers=h)
        assert r.status_code == 202, r.text
        iid = r.json()["intent_id"]
        assert r.headers["location"] == f"/v1/campaigns/{node}/intents/{iid}"
        assert [p["intent_id"] for p in http.get(f"{url}/intents", headers=h).json()[
            "pending"]] == [iid]
        assert http.get(f"{url}/intents/{iid}", headers=h).json()["status"] == "pending"
        assert http.delete(f"{url}/intents/{iid}", headers=h).json()["cancelled"] is True
        assert lid in [l["id"] for l in http.get(f"{url}/leases", headers=h).json()["leases"]]
        assert http.post(f"{url}/leases/{lid}/renew", json={"duration": 30},
                         headers=h).json()["outcome"] == "granted"
        assert http.post(f"{url}/leases/{lid}/release",
                         headers=h).json()["outcome"] == "released"
        assert http.post(f"{url}/consume", json={"dim": "fs", "amount": 0.5},
                         headers=h).json()["campaign"] == node
        assert http.post(f"{url}/consume/batch", json={"items": [{"dim": "fs", "amount": 0.1}]},
                         headers=h).status_code == 200
        # short leases of the node and of its parent expire: each node's events are its own
        short = http.post(f"{url}/intents", json={"max": 1, "duration": 5},
                          headers=h).json()["lease"]["id"]
        theirs = http.post("/v1/campaigns/astro/intents", json={"max": 1, "duration": 5},
                           headers=h).json()["lease"]["id"]
        svc.clock.advance(10)
        assert http.get(f"{url}/leases/{short}", headers=h).json()["state"] == "expired"
        ev = http.get(f"{url}/events", headers=h).json()["events"]
        assert any(e["kind"] == "expired" and e["lease_id"] == short for e in ev)
        assert all(e["campaign"] == node for e in ev)
        ev = http.get("/v1/campaigns/astro/events", headers=h).json()["events"]
        assert [e["lease_id"] for e in ev if e["kind"] == "expired"] == [theirs]
        recs = http.get(f"{url}/journal", params={"limit": 1000}, headers=h).json()["records"]
        assert recs and all(r["campaign"] == node for r in recs)
        assert {"acquire", "renew", "release", "consume"} <= {r["op"] for r in recs}
        seq = recs[0]["seq"]
        assert http.get(f"{url}/journal/{seq}", headers=h).json()["record"]["seq"] == seq
        r = http.get(f"{url}/events/stream", params={"max_seconds": 0.05}, headers=h)
        assert r.status_code == 200 and r.text.startswith("retry:")
        # the parent's own records are not its child's: each node's URL is its own
        parent = http.get("/v1/campaigns/astro/journal", params={"limit": 1000},
                          headers=h).json()["records"]
        assert all(r["campaign"] == "astro" for r in parent)


def test_a_lease_is_reached_only_through_its_own_nodes_url(svc):
    h = _h(svc.tokens["astro"])
    with svc.client() as http:
        lid = http.post("/v1/campaigns/astro/survey/intents", json={"max": 1, "duration": 60},
                        headers=h).json()["lease"]["id"]
        for method, suffix, body in (("GET", "", None), ("POST", "/renew", {"duration": 5}),
                                     ("POST", "/release", None)):
            wrong = http.request(method, f"/v1/campaigns/astro/leases/{lid}{suffix}",
                                 json=body, headers=h)
            missing = http.request(method, f"/v1/campaigns/astro/leases/987654{suffix}",
                                   json=body, headers=h)
            assert wrong.status_code == 404 and wrong.content == missing.content
        assert svc.broker.lease(lid).state == "active"


@pytest.mark.parametrize("who,node", [
    ("astro", "astro2"), ("astro", "bio"), ("astro", "astr"),
    ("astro/survey", "astro"), ("astro/survey", "astro/other"),
    ("astro/survey", "astro/survey2")])
def test_outside_the_subtree_looks_exactly_like_missing(svc, who, node):
    h = _h(svc.tokens[who])
    before = _state(svc)
    with svc.client() as http:
        for method, suffix, body in (
                ("GET", "supply", None), ("POST", "intents", {"max": 1, "duration": 60}),
                ("GET", "leases", None), ("GET", "journal", None), ("GET", "events", None),
                ("POST", "tokens", None), ("GET", "tokens", None),
                ("DELETE", f"tokens/{svc.store.listing()[0]['id']}", None)):
            theirs = http.request(method, f"/v1/campaigns/{node}/{suffix}", json=body,
                                  headers=h)
            missing = http.request(method, f"/v1/campaigns/{node}/nosuch/{suffix}",
                                   json=body, headers=h)
            assert theirs.status_code == 404, (method, suffix, theirs.text)
            assert theirs.content == missing.content, (method, suffix)
    assert _state(svc) == before


def test_a_token_lists_its_subtree(svc):
    with svc.client() as http:
        got = {who: http.get("/v1/campaigns", headers=_h(svc.tokens[who])).json()["campaigns"]
               for who in ("operator", "astro", "astro/survey", "astro2")}
    assert got["operator"] == ["astro", "astro/survey", "astro/other", "astro2", "bio"]
    assert got["astro"] == ["astro", "astro/survey", "astro/other"]
    assert got["astro/survey"] == ["astro/survey"]
    assert got["astro2"] == ["astro2"]


# ---------------------------------------------------------------------------- registering
def test_a_token_registers_below_its_own_node(svc):
    h = _h(svc.tokens["astro"])
    with svc.client() as http:
        r = http.post("/v1/campaigns", json={"name": "astro/survey/a", "envelope": {
            "credits": 100, "guaranteed": {"gpu": 1}, "sustained": {"gpu": 4},
            "ceiling": {"gpu": 4}}}, headers=h)
        assert r.status_code == 201, r.text
        body = r.json()
        assert body["campaign"] == "astro/survey/a" and body["index"] == 5
        assert svc.broker.campaigns[-1] == "astro/survey/a"
        assert svc.broker.envelopes["astro/survey/a"].guaranteed == {"gpu": 1}
        # journaled by the broker
        rec = http.get("/v1/campaigns/astro/survey/a/journal", headers=h).json()["records"]
        assert [x["op"] for x in rec] == ["register"]
        # its first token acts for it and below, never above or beside
        ha = _h(body["token"])
        assert http.get("/v1/whoami", headers=ha).json()["campaign"] == "astro/survey/a"
        assert http.get("/v1/campaigns/astro/survey/a/supply", headers=ha).status_code == 200
        for node in ("astro/survey", "astro", "astro/other"):
            assert http.get(f"/v1/campaigns/{node}/supply", headers=ha).status_code == 404
        # the new node's token delegates further down
        r = http.post("/v1/campaigns", json={"name": "astro/survey/a/b",
                                             "envelope": {"credits": 1}}, headers=ha)
        assert r.status_code == 201, r.text
        # a grandchild of the token's node, by a token of its grandparent
        r = http.post("/v1/campaigns", json={"name": "astro/other/z",
                                             "envelope": {"credits": 1}}, headers=h)
        assert r.status_code == 201, r.text


def test_a_delegated_node_borrows_over_http(svc):
    """SPEC §14.8 over HTTP: a node registered with a borrow limit by its parent's token
    borrows its idle sibling's guarantee (a lend limit of null is unlimited); a bad limit
    is refused naming its field."""
    h = _h(svc.tokens["astro"])
    with svc.client() as http:
        for name, env in (("astro/survey/x", {"credits": 100, "guaranteed": {"gpu": 2},
                                              "sustained": {"gpu": 8}, "ceiling": {"gpu": 8},
                                              "borrow_limit": {"gpu": 2}}),
                          ("astro/survey/y", {"credits": 100, "guaranteed": {"gpu": 2},
                                              "lend_limit": {"gpu": None}})):
            r = http.post("/v1/campaigns", json={"name": name, "envelope": env}, headers=h)
            assert r.status_code == 201, r.text
        assert svc.broker.envelopes["astro/survey/x"].borrow_limit == {"gpu": 2}
        # the 24 GPUs promised to no one are taken: bio 16, astro2 8
        for who, n in (("bio", 16), ("astro2", 8)):
            r = http.post(f"/v1/campaigns/{who}/intents", headers=svc.headers(who),
                          json={"max": n, "duration": 600})
            assert r.json()["units"] == n, r.text

        def ask():
            r = http.post("/v1/campaigns/astro/survey/x/intents", headers=h,
                          json={"min": 1, "max": 8, "duration": 600})
            assert r.status_code == 201, r.text
            return r.json()

        d = ask()            # its firm room: its own 2 and astro's unused 2
        assert (d["units"], d["path"], d["lease"]["firm"]) == (4, "warm", True)
        d = ask()            # then y's idle 2, borrowed
        assert (d["units"], d["path"], d["lease"]["firm"]) == (2, "borrow", False)
        r = http.post("/v1/campaigns", json={"name": "astro/survey/z", "envelope": {
            "credits": 1, "borrow_limit": {"gpu": -1}}}, headers=h)
        assert r.status_code == 422 and "borrow_limit" in r.text


@pytest.mark.parametrize("who,name", [
    ("astro", "astro"),              # its own node: not below it
    ("astro", "delta"),              # top level
    ("astro", "astro2/x"),           # shares a prefix only
    ("astro", "bio/x"),
    ("astro/survey", "astro/other/x"),   # a sibling's subtree
    ("astro/survey", "astro/x"),         # beside it
])
def test_registering_outside_the_subtree_is_forbidden(svc, who, name):
    before = _state(svc)
    with svc.client() as http:
        r = http.post("/v1/campaigns", json={"name": name, "envelope": {"credits": 1}},
                      headers=_h(svc.tokens[who]))
    assert r.status_code == 403 and r.json() == {"detail": "operator token required"}
    assert _state(svc) == before


@pytest.mark.parametrize("who,name,envelope,loc,msg", [
    ("astro", "astro/leases", {"credits": 1}, ["body", "name"], "'leases' is a word"),
    ("astro", "astro/x/tokens", {"credits": 1}, ["body", "name"], "'tokens' is a word"),
    ("operator", "supply", {"credits": 1}, ["body", "name"], "'supply' is a word"),
    ("operator", "astro/survey/journal", {"credits": 1}, ["body", "name"], "'journal'"),
    ("astro", "astro/nope/x", {"credits": 1}, ["body", "name"], "parent 'astro/nope'"),
    ("astro", "astro/survey", {"credits": 1}, ["body", "name"], "already registered"),
    ("astro", "astro//x", {"credits": 1}, ["body", "name"], "pattern"),
    ("astro", "astro/-x", {"credits": 1}, ["body", "name"], "pattern"),
    ("astro", "astro/x/", {"credits": 1}, ["body", "name"], "pattern"),
    ("operator", "/".join(["n"] * 9), {"credits": 1}, ["body", "name"], "pattern"),
    ("operator", "x" * 128 + "/" + "y" * 128, {"credits": 1}, ["body", "name"], "256"),
    # the broker's own rule: a child's guarantees nest within its parent's
    ("astro", "astro/big", {"credits": 1, "guaranteed": {"gpu": 3}},
     ["body", "guaranteed[gpu]"], "more than its own guarantee 8"),
    ("astro/survey", "astro/survey/big", {"credits": 1, "guaranteed": {"gpu": 5}},
     ["body", "guaranteed[gpu]"], "guarantee 4"),
    ("astro", "astro/x", {"credits": 1, "ceiling": {"tpu": 1}},
     ["body", "ceiling[tpu]"], ""),
])
def test_a_refused_registration_names_the_field_and_changes_nothing(svc, who, name,
                                                                     envelope, loc, msg):
    before = _state(svc)
    with svc.client() as http:
        r = http.post("/v1/campaigns", json={"name": name, "envelope": envelope},
                      headers=_h(svc.tokens[who]))
    assert r.status_code == 422, r.text
    item = r.json()["detail"][0]
    assert item["loc"][:2] == loc, item
    assert msg in item["msg"], item
    assert _state(svc) == before


def test_a_deep_path_is_the_trees_depth():
    cfg = copy.deepcopy(TREE)
    name = "astro"
    for i in range(2, 9):
        name += f"/n{i}"
        cfg["campaigns"][name] = {"credits": 1}
    s = InProcessService(cfg)
    assert len(name.split("/")) == 8
    with s.client() as http:
        h = _h(s.tokens["astro"])
        assert http.get(f"/v1/campaigns/{name}/supply", headers=h).status_code == 200
        r = http.post("/v1/campaigns", json={"name": name + "/n9", "envelope": {"credits": 1}},
                      headers=h)
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "name"]
    assert len(name) < MAX_PATH


# ---------------------------------------------------------------------------- tokens
def test_a_token_mints_lists_and_revokes_its_subtrees_tokens(svc):
    h = _h(svc.tokens["astro"])
    with svc.client() as http:
        r = http.post("/v1/campaigns/astro/survey/tokens", headers=h)
        assert r.status_code == 201 and r.json()["campaign"] == "astro/survey"
        child, child_id = r.json()["token"], r.json()["token_id"]
        # the minted token is scoped to the node it names
        assert http.get("/v1/campaigns/astro/survey/supply", headers=_h(child)).status_code \
            == 200
        assert http.get("/v1/campaigns/astro/supply", headers=_h(child)).status_code == 404
        listed = http.get("/v1/campaigns/astro/tokens", headers=h).json()["tokens"]
        assert sorted(t["campaign"] for t in listed) == [
            "astro", "astro/other", "astro/survey", "astro/survey"]
        assert all(set(t) == {"id", "campaign", "created"} for t in listed)
        mine = http.get("/v1/campaigns/astro/survey/tokens", headers=_h(child)).json()
        assert sorted(t["id"] for t in mine["tokens"]) == sorted(
            t["id"] for t in listed if t["campaign"] == "astro/survey")
        # the child's token cannot reach its parent's tokens
        parent_id = next(t["id"] for t in listed if t["campaign"] == "astro")
        before = _state(svc)
        for url in (f"/v1/campaigns/astro/survey/tokens/{parent_id}",
                    f"/v1/campaigns/astro/tokens/{parent_id}"):
            r = http.delete(url, headers=_h(child))
            assert r.status_code == 404, r.text
        # nor another subtree's, from its own node's URL
        bio_id = next(t["id"] for t in svc.store.listing() if t["campaign"] == "bio")
        r = http.delete(f"/v1/campaigns/astro/tokens/{bio_id}", headers=h)
        missing = http.delete("/v1/campaigns/astro/tokens/nosuchtoken", headers=h)
        assert r.status_code == 404 and r.content == missing.content
        assert r.json() == {"detail": "token not found"}
        assert _state(svc) == before
        # the parent revokes the child's token: it stops working now
        r = http.delete(f"/v1/campaigns/astro/tokens/{child_id}", headers=h)
        assert r.json() == {"token_id": child_id, "campaign": "astro/survey", "revoked": True}
        assert http.get("/v1/whoami", headers=_h(child)).status_code == 401
        assert http.delete(f"/v1/campaigns/astro/tokens/{child_id}",
                           headers=h).status_code == 404
        # the operator sees every campaign token of any node, and operator tokens never
        every = http.get("/v1/campaigns/astro/tokens",
                         headers=_h(svc.tokens["operator"])).json()["tokens"]
        assert sorted(t["id"] for t in every) == sorted(
            t["id"] for t in svc.store.listing() if t["campaign"] is not None
            and in_subtree(t["campaign"], "astro"))


# ---------------------------------------------------------------------------- batches, stream
def test_the_columnar_batches_take_node_paths(svc):
    msgpack = pytest.importorskip("msgpack")
    h = _h(svc.tokens["astro"])
    with svc.client() as http:
        r = http.post("/v1/batch/intents", content=msgpack.packb({
            "campaigns": ["astro", "astro/survey"], "campaign": [0, 1],
            "max_units": [1, 1], "duration": 60}),
            headers={**h, "content-type": "application/msgpack"})
        assert r.status_code == 200, r.text
        assert [l.campaign for l in svc.broker.leases()] == ["astro", "astro/survey"]
        for c in ("astro2", "astro/survey/nosuch", "bio"):
            r = http.post("/v1/batch/consume", json={"campaigns": [c], "dims": ["fs"],
                                                     "amount": [0.1]}, headers=h)
            assert r.status_code == 404 and r.json() == {"detail": "campaign not found"}


def test_the_decision_stream_takes_node_paths(svc):
    pytest.importorskip("websockets")
    with svc.client() as c:
        with c.websocket_connect("/v1/stream?campaign=astro/survey",
                                 headers=_h(svc.tokens["astro"])) as ws:
            ws.send_text(json.dumps([
                {"id": 1, "op": "acquire", "max": 1, "duration": 60},
                {"id": 2, "op": "acquire", "campaign": "astro/other", "max": 1, "duration": 60},
                {"id": 3, "op": "acquire", "campaign": "astro2", "max": 1, "duration": 60}]))
            got = []
            while len(got) < 3:
                doc = json.loads(ws.receive_text())
                got += [m for m in (doc if isinstance(doc, list) else [doc])
                        if m["type"] != "event"]
        assert got[0]["decision"]["campaign"] == "astro/survey"
        assert got[1]["decision"]["campaign"] == "astro/other"
        assert got[2]["status"] == 404
    assert sorted(l.campaign for l in svc.broker.leases()) == ["astro/other", "astro/survey"]


# ---------------------------------------------------------------------------- the clients
def test_the_client_works_on_node_paths_and_delegates(svc):
    with svc.client() as http, BursarClient("http://testserver", svc.tokens["astro"],
                                            transport=http._transport) as c:
        assert c.supply("astro/survey").campaign == "astro/survey"
        d = c.acquire(Intent("astro/survey", units={"gpu": 2}, duration=60))
        assert d.outcome == "granted" and d.lease.campaign == "astro/survey"
        assert [l.id for l in c.leases("astro/survey")] == [d.lease.id]
        assert c.renew(d.lease.id, 30, campaign="astro/survey").outcome == "granted"
        assert c.release(d.lease.id, campaign="astro/survey").outcome == "released"
        assert c.consume("astro/survey", "fs", 0.5).allowed == 0.5
        recs, _ = c.journal(campaign="astro/survey")
        assert recs and all(r["campaign"] == "astro/survey" for r in recs)
        assert "astro/survey" in c.explain(recs[-1]["seq"], campaign="astro/survey")
        with pytest.raises(UnknownCampaign):
            c.supply("astro2")
        # delegation
        index, token = c.register_child("survey/a", Envelope(credits=10, ceiling={"gpu": 2}))
        assert index == 5 and svc.broker.campaigns[index] == "astro/survey/a"
        with pytest.raises(Forbidden):
            c.register("delta", Envelope(credits=1))
        with pytest.raises(InvalidArgument) as e:
            c.register_child("big", Envelope(credits=1, guaranteed={"gpu": 9}))
        assert e.value.field == "guaranteed[gpu]"
        with pytest.raises(InvalidArgument) as e:
            c.register_child("x/supply", Envelope(credits=1))
        assert e.value.field == "name"
        minted = c.mint_token("astro/survey/a")
        ids = {t["id"]: t["campaign"] for t in c.tokens()}
        assert sorted(ids.values()).count("astro/survey/a") == 2
        with BursarClient("http://testserver", minted, transport=http._transport) as sub:
            assert sub.campaign == "astro/survey/a"
            assert sub.campaigns() == ["astro/survey/a"]
            tid = sub.whoami()["token_id"]
            assert sub.tokens() == [t for t in c.tokens("astro/survey/a")]
            with pytest.raises(UnknownCampaign):
                sub.mint_token("astro/survey")
        assert c.revoke_token(tid) is True and c.revoke_token(tid) is False
        assert tid not in {t["id"] for t in c.tokens()}
        with BursarClient("http://testserver", token, transport=http._transport) as sub:
            assert sub.register_child("b", Envelope(credits=1))[0] == 6
            assert sub.campaigns() == ["astro/survey/a", "astro/survey/a/b"]


def test_the_async_client_delegates(svc):
    import asyncio

    import httpx

    async def run() -> None:
        transport = httpx.ASGITransport(app=svc.app)
        async with AsyncBursarClient("http://testserver", svc.tokens["astro/survey"],
                                     transport=transport) as c:
            idx, token = await c.register_child("deep", Envelope(credits=5))
            assert svc.broker.campaigns[idx] == "astro/survey/deep"
            assert (await c.supply("astro/survey/deep")).campaign == "astro/survey/deep"
            t = await c.mint_token("astro/survey/deep")
            listed = await c.tokens("astro/survey/deep")
            assert len(listed) == 2
            tid = next(x["id"] for x in listed if x["id"] != _id_of(svc, token))
            assert await c.revoke_token(tid, "astro/survey/deep") is True
            assert svc.store.authenticate(t) is None
            with pytest.raises(Forbidden):
                await c.register_child("x", Envelope(credits=1), parent="astro")

    asyncio.run(run())


def _id_of(svc, token: str) -> str:
    p = svc.store.authenticate(token)
    assert p is not None
    return p.token_id


def test_the_documented_reserved_words_are_the_routes(svc):
    """docs/service.md lists the reserved segment words; the routes are the source."""
    import pathlib
    import re

    doc = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "service.md").read_text()
    m = re.search(r"may be ((?:`[a-z]+`,?\s+(?:or\s+)?)+)so a URL", doc)
    assert m is not None
    assert set(re.findall(r"`([a-z]+)`", m.group(1))) == svc.app.state.reserved_segments


# ---------------------------------------------------------------------------- rate limits
def test_request_limits_share_one_bucket_per_tenant():
    """A tenant (a top-level node and its subtree) has one bucket, whatever its tokens; a
    refusal debits neither bucket; operators and other tenants are apart."""
    from bursarcore.service.ratelimit import RequestLimits
    now = [0.0]
    lim = RequestLimits(100.0, 10.0, 1.0, 3.0, clock=lambda: now[0])
    a, b = Principal("ta", "campaign", "astro"), Principal("tb", "campaign", "astro/survey/x")
    bio, op = Principal("tc", "campaign", "bio"), Principal("to", "operator")
    assert [lim.check(p) for p in (a, b, a)] == [0.0, 0.0, 0.0]
    wait = lim.check(b)
    assert wait == pytest.approx(1.0)            # the tenant's bucket, refilling 1/s
    assert lim.token.check("tb", 10.0) == pytest.approx(0.01)   # b's own: 1 debited, not 2
    assert lim.check(bio) == 0.0 and all(lim.check(op) == 0.0 for _ in range(10))
    now[0] += 1.0
    assert lim.check(a) == 0.0 and lim.check(b) > 0
    off = RequestLimits(100.0, 10.0, 0.0, 0.0)   # 0: no tenant limit
    assert all(off.check(a) == 0.0 for _ in range(10))


def test_minted_tokens_do_not_multiply_a_tenants_rate():
    """A token mints more tokens and registers nodes; together they get the tenant's
    burst and no more, while another tenant is served as before."""
    svc = InProcessService(copy.deepcopy(TREE), settings=ServiceSettings(
        rate=1000, burst=1000, tenant_rate=1e-6, tenant_burst=12, auth_fail_rate=0))
    h = _h(svc.tokens["astro"])
    with svc.client() as http:
        minted = [http.post("/v1/campaigns/astro/survey/tokens", headers=h).json()["token"]
                  for _ in range(3)]
        r = http.post("/v1/campaigns", headers=h, json={
            "name": "astro/survey/a1",
            "envelope": {**ENV, "ceiling": {"gpu": 2, "fs": 2}, "sustained": {"gpu": 2, "fs": 2}}})
        assert r.status_code == 201, r.text
        codes = [http.get("/v1/campaigns/astro/survey/supply", headers=_h(t)).status_code
                 for t in minted * 4 + [r.json()["token"]] * 4]
        assert codes.count(200) == 12 - 4 and set(codes[8:]) == {429}
        assert http.get("/v1/campaigns/bio/supply",
                        headers=_h(svc.tokens["bio"])).status_code == 200
        ok = http.get("/v1/campaigns/astro/supply", headers=_h(svc.tokens["operator"]))
        assert ok.status_code == 200


# ---------------------------------------------------------------------------- change, remove
def test_a_token_changes_and_removes_nodes_below_its_own_only(svc):
    """SPEC §14.9 over HTTP: ``astro``'s token changes and removes ``astro/survey`` (below
    its node); its own node is 403; ``bio`` and ``astro2`` (outside) answer exactly as a
    missing node, changing nothing; the operator changes and removes any node."""
    h, op = _h(svc.tokens["astro"]), _h(svc.tokens["operator"])
    env = {**ENV, "guaranteed": {"gpu": 3}}
    with svc.client() as http:
        r = http.patch("/v1/campaigns/astro/survey", json=env, headers=h)
        assert r.status_code == 200, r.text
        assert svc.broker.envelopes["astro/survey"].g("gpu") == 3
        assert http.patch("/v1/campaigns/astro", json=env, headers=h).status_code == 403
        assert http.delete("/v1/campaigns/astro", headers=h).status_code == 403
        missing = http.patch("/v1/campaigns/astro/nosuch", json=env, headers=h)
        before = _state(svc)
        for name in ("bio", "astro2"):
            for r in (http.patch(f"/v1/campaigns/{name}", json=env, headers=h),
                      http.delete(f"/v1/campaigns/{name}", headers=h)):
                assert r.status_code == 404 and r.content == missing.content, r.text
        assert _state(svc) == before
        # a refused change names its field and changes nothing
        r = http.patch("/v1/campaigns/astro/survey",
                       json={**ENV, "guaranteed": {"gpu": 7}}, headers=h)
        assert r.status_code == 422 and "guaranteed[gpu]" in r.text, r.text
        assert svc.broker.envelopes["astro/survey"].g("gpu") == 3 and _state(svc) == before
        # removal: the node's tokens stop working, its name is unknown, then registered anew
        sub = http.post("/v1/campaigns/astro/survey/tokens", headers=h).json()["token"]
        assert http.get("/v1/campaigns/astro/survey/supply", headers=_h(sub)).status_code \
            == 200
        r = http.delete("/v1/campaigns/astro/survey", headers=h)
        assert r.status_code == 200 and r.json()["removed"] is True, r.text
        assert http.get("/v1/campaigns/astro/survey/supply", headers=_h(sub)).status_code \
            in (401, 404)
        assert http.get("/v1/campaigns/astro/survey/supply", headers=h).status_code == 404
        assert "astro/survey" not in http.get("/v1/campaigns", headers=op).json()["campaigns"]
        r = http.post("/v1/campaigns", json={"name": "astro/survey", "envelope": ENV},
                      headers=h)
        assert r.status_code == 201, r.text
        # the operator: any node
        assert http.patch("/v1/campaigns/bio", json=ENV, headers=op).status_code == 200
        assert http.delete("/v1/campaigns/astro2", headers=op).status_code == 200
        assert "astro2" not in svc.broker.campaigns


def _env(g: int) -> Envelope:
    """ENV (whose flow figures are fixed at registration) guaranteeing g GPUs."""
    return Envelope(credits=10, guaranteed={"gpu": g}, sustained=ENV["sustained"],
                    ceiling=ENV["ceiling"], burst=ENV["burst"])


def test_the_client_changes_and_removes_nodes(svc):
    with svc.client() as http, BursarClient("http://testserver", svc.tokens["astro"],
                                            transport=http._transport) as c:
        c.change_campaign("astro/other", _env(1))
        assert svc.broker.envelopes["astro/other"].g("gpu") == 1
        with pytest.raises(Forbidden):
            c.change_campaign("astro", _env(0))
        with pytest.raises(UnknownCampaign):
            c.remove_campaign("bio")
        with pytest.raises(InvalidArgument) as e:
            c.change_campaign("astro/other", _env(9))
        assert e.value.field == "guaranteed[gpu]"
        c.remove_campaign("astro/other")
        assert "astro/other" not in svc.broker.campaigns


def test_the_async_client_changes_and_removes_nodes(svc):
    import asyncio

    import httpx

    async def run() -> None:
        transport = httpx.ASGITransport(app=svc.app)
        async with AsyncBursarClient("http://testserver", svc.tokens["astro"],
                                     transport=transport) as c:
            await c.change_campaign("astro/other", _env(1))
            assert svc.broker.envelopes["astro/other"].g("gpu") == 1
            with pytest.raises(Forbidden):
                await c.remove_campaign("astro")
            await c.remove_campaign("astro/other")
            assert "astro/other" not in svc.broker.campaigns

    asyncio.run(run())


def test_a_restart_keeps_changes_and_removals(tmp_path):
    """The journal replays a change and a removal; the configuration does not bring a
    removed node back."""
    path = tmp_path / "journal.db"
    s = InProcessService(copy.deepcopy(TREE), journal=path)
    with s.client() as http:
        op = _h(s.tokens["operator"])
        assert http.patch("/v1/campaigns/astro/survey", json={**ENV, "guaranteed": {"gpu": 3}},
                          headers=op).status_code == 200
        assert http.delete("/v1/campaigns/astro2", headers=op).status_code == 200
    state = s.broker.state()
    s.service.flush()
    s.service.journal.close()
    again = InProcessService(copy.deepcopy(TREE), journal=path)
    assert "astro2" not in again.broker.campaigns
    assert again.broker.envelopes["astro/survey"].g("gpu") == 3
    assert again.broker.state()["campaigns"] == state["campaigns"]
