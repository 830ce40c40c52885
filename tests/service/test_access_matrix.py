"""The cross-campaign access matrix, over real HTTP on loopback.

The rule: a campaign token reads and acts on its node's subtree only (its own campaign and
every node below it); anything of another campaign answers 404 with exactly the body a
missing thing gets (existence is never revealed); operator-only endpoints answer 403 to a
campaign token; no or a wrong token answers 401; the operator may do everything. After
every forbidden attempt the other campaign's state is unchanged.
"""

from __future__ import annotations

import httpx
import pytest

NOSUCH_ID = 987654321
NOSUCH_TOKEN = "0123456789ab"

# (method, path, json body): {c} campaign, {l} lease, {i} intent, {s} journal seq,
# {t} a token id of the campaign
SCOPED = [
    ("GET", "/v1/campaigns/{c}/supply", None),
    ("POST", "/v1/campaigns/{c}/quote", {"sizes": [1, 2], "durations": [60]}),
    ("POST", "/v1/campaigns/{c}/intents", {"max": 1, "duration": 60}),
    ("POST", "/v1/campaigns/{c}/intents/batch", {"intents": [{"max": 1, "duration": 60}]}),
    ("GET", "/v1/campaigns/{c}/intents", None),
    ("GET", "/v1/campaigns/{c}/intents/{i}", None),
    ("DELETE", "/v1/campaigns/{c}/intents/{i}", None),
    ("GET", "/v1/campaigns/{c}/leases", None),
    ("GET", "/v1/campaigns/{c}/leases/{l}", None),
    ("POST", "/v1/campaigns/{c}/leases/{l}/renew", {"duration": 5}),
    ("POST", "/v1/campaigns/{c}/leases/{l}/release", None),
    ("POST", "/v1/campaigns/{c}/consume", {"dim": "fs", "amount": 0.5}),
    ("POST", "/v1/campaigns/{c}/consume/batch", {"items": [{"dim": "fs", "amount": 0.5}]}),
    ("GET", "/v1/campaigns/{c}/events", None),
    ("GET", "/v1/campaigns/{c}/events/stream?max_seconds=0.3", None),
    ("GET", "/v1/campaigns/{c}/journal", None),
    ("GET", "/v1/campaigns/{c}/journal/{s}", None),
    ("POST", "/v1/campaigns/{c}/tokens", None),
    ("GET", "/v1/campaigns/{c}/tokens", None),
    ("DELETE", "/v1/campaigns/{c}/tokens/{t}", None),
]
# endpoints that name an object inside the campaign
BY_ID = [e for e in SCOPED if any(k in e[1] for k in ("{l}", "{i}", "{s}", "{t}"))]

# the columnar batches name their campaigns in the body ({c}: the campaign)
COLUMNAR = [
    ("/v1/batch/intents", {"campaigns": ["{c}"], "max_units": [1, 1], "duration": 60}),
    ("/v1/batch/consume", {"campaigns": ["{c}"], "dims": ["fs"], "amount": [0.1, 0.1]}),
]


def _columnar(http: httpx.Client, token: str | None, path: str, body: dict, c: str, *,
              binary: bool = False) -> httpx.Response:
    import msgpack

    doc = {**body, "campaigns": [x.format(c=c) for x in body["campaigns"]]}
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    if binary:
        return http.post(path, content=msgpack.packb(doc),
                         headers={**headers, "content-type": "application/msgpack"})
    return http.post(path, json=doc, headers=headers)


OPERATOR_ONLY = [
    ("GET", "/v1/state", None),
    ("GET", "/v1/journal", None),
    ("GET", "/v1/journal/0", None),
    ("GET", "/v1/events", None),
    ("POST", "/v1/campaigns", {"name": "delta", "envelope": {"credits": 10}}),
    ("POST", "/v1/pool/gpu/nodes", {"nodes": [{"name": "extra-0", "slots": 4}]}),
    ("POST", "/v1/pool/gpu/nodes/remove", {"nodes": ["gpu-node0000"], "grace": 0}),
]


def _call(http: httpx.Client, token: str | None, method: str, path: str, body, **ids):
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    return http.request(method, path.format(**ids), json=body, headers=headers)


@pytest.fixture(scope="module")
def server(tmp_path_factory, base_config):
    from bursarcore.service.testing import ServerProcess

    srv = ServerProcess(tmp_path_factory.mktemp("matrix"), base_config,
                        extra_args=["--auth-fail-rate", "0"]).start()
    yield srv
    srv.stop()


@pytest.fixture
def world(server):
    """alpha and beta each hold a lease, have a pending intent and journal records."""
    http = httpx.Client(base_url=server.url, timeout=10)
    tok = server.tokens
    ids = {}
    for c in ("alpha", "beta"):
        h = {"Authorization": f"Bearer {tok[c]}"}
        r = http.post(f"/v1/campaigns/{c}/intents", json={"min": 4, "max": 4, "duration": 3600},
                      headers=h)
        assert r.status_code == 201, r.text
        lease = r.json()["lease"]
        # a deadline-free intent that cannot be met now but may later: pending
        r2 = http.post(f"/v1/campaigns/{c}/intents", json={"min": 30, "max": 30,
                                                         "duration": 3600}, headers=h)
        assert r2.status_code in (200, 202), r2.text
        t = http.post(f"/v1/campaigns/{c}/tokens",
                      headers={"Authorization": f"Bearer {tok['operator']}"})
        assert t.status_code == 201, t.text
        ids[c] = {"l": lease["id"], "i": r2.json()["intent_id"], "s": r.json()["seq"],
                  "t": t.json()["token_id"], "pending": r2.status_code == 202}
    yield http, tok, ids
    op = {"Authorization": f"Bearer {tok['operator']}"}
    for c in ("alpha", "beta"):   # leave the module's server as it was found
        for l in http.get(f"/v1/campaigns/{c}/leases", headers=op).json()["leases"]:
            http.post(f"/v1/campaigns/{c}/leases/{l['id']}/release", headers=op)
        for p in http.get(f"/v1/campaigns/{c}/intents", headers=op).json()["pending"]:
            http.delete(f"/v1/campaigns/{c}/intents/{p['intent_id']}", headers=op)
    http.close()


def _snapshot(http, token, c):
    h = {"Authorization": f"Bearer {token}"}
    leases = http.get(f"/v1/campaigns/{c}/leases", headers=h).json()["leases"]
    pending = http.get(f"/v1/campaigns/{c}/intents", headers=h).json()["pending"]
    journal = http.get(f"/v1/campaigns/{c}/journal", params={"limit": 1000}, headers=h).json()
    supply = http.get(f"/v1/campaigns/{c}/supply", headers=h).json()
    return ([(l["id"], l["units"], l["state"], l["expiry"]) for l in leases],
            [p["intent_id"] for p in pending],
            [(r["seq"], r["op"]) for r in journal["records"] if r["op"] != "advance"],
            supply["credits"], supply["dims"]["gpu"]["held"])


def test_other_campaign_is_indistinguishable_from_missing(world):
    http, tok, ids = world
    before = _snapshot(http, tok["beta"], "beta")
    for method, path, body in SCOPED:
        theirs = _call(http, tok["alpha"], method, path, body, c="beta", **ids["beta"])
        missing = _call(http, tok["alpha"], method, path, body, c="nosuch",
                        l=NOSUCH_ID, i=NOSUCH_ID, s=NOSUCH_ID, t=NOSUCH_TOKEN)
        assert theirs.status_code == 404, (method, path, theirs.text)
        assert missing.status_code == 404, (method, path, missing.text)
        assert theirs.content == missing.content, (method, path)
    assert _snapshot(http, tok["beta"], "beta") == before


def test_other_campaigns_objects_under_own_path_are_missing(world):
    http, tok, ids = world
    before = _snapshot(http, tok["beta"], "beta")
    for method, path, body in BY_ID:
        theirs = _call(http, tok["alpha"], method, path, body, c="alpha", **ids["beta"])
        missing = _call(http, tok["alpha"], method, path, body, c="alpha",
                        l=NOSUCH_ID, i=NOSUCH_ID, s=NOSUCH_ID, t=NOSUCH_TOKEN)
        assert theirs.status_code == 404, (method, path, theirs.text)
        assert theirs.content == missing.content, (method, path)
    assert _snapshot(http, tok["beta"], "beta") == before


def test_own_campaign_and_operator_succeed(world):
    http, tok, ids = world
    for who, c in (("alpha", "alpha"), ("operator", "beta")):
        for method, path, body in SCOPED:
            if path.endswith("/release") or method == "DELETE":
                continue  # below, last
            r = _call(http, tok[who], method, path, body, c=c, **ids[c])
            assert 200 <= r.status_code < 300, (who, method, path, r.status_code, r.text)
    for who, c in (("alpha", "alpha"), ("operator", "beta")):
        r = _call(http, tok[who], "DELETE", "/v1/campaigns/{c}/tokens/{t}", None, c=c, **ids[c])
        assert r.status_code == 200 and r.json()["revoked"] is True
        r = _call(http, tok[who], "DELETE", "/v1/campaigns/{c}/intents/{i}", None, c=c, **ids[c])
        assert r.status_code == 200 and r.json()["cancelled"] == ids[c]["pending"]
        r = _call(http, tok[who], "POST", "/v1/campaigns/{c}/leases/{l}/release", None,
                  c=c, **ids[c])
        assert r.status_code == 200 and r.json()["outcome"] == "released"


def test_operator_only_endpoints_forbid_campaign_tokens(world):
    http, tok, ids = world
    for method, path, body in OPERATOR_ONLY:
        for c in ("alpha", "beta", "nosuch"):
            r = _call(http, tok["alpha"], method, path, body, c=c)
            assert r.status_code == 403, (method, path, r.text)
            assert r.json() == {"detail": "operator token required"}
    r = _call(http, tok["operator"], "GET", "/v1/state", None)
    assert r.status_code == 200 and set(r.json()["campaigns"]) == {"alpha", "beta", "gamma"}
    full = r.json()
    r = _call(http, tok["operator"], "GET", "/v1/state?leases=false", None)
    assert r.status_code == 200 and r.json()["leases"] == [] and full["leases"]
    r = _call(http, tok["alpha"], "GET", "/v1/state?leases=false", None)
    assert r.status_code == 403


def test_missing_or_wrong_token_is_401(world):
    http, tok, ids = world
    wrong = tok["alpha"][:-4] + ("AAAA" if not tok["alpha"].endswith("AAAA") else "BBBB")
    for method, path, body in SCOPED + OPERATOR_ONLY + [("GET", "/v1/whoami", None)]:
        for token in (None, wrong, "x" * 300, "bsr_"):
            r = _call(http, token, method, path, body, c="alpha", **ids["alpha"])
            assert r.status_code == 401, (method, path, token, r.text)
            assert r.headers.get("www-authenticate") == "Bearer"
    # a token in another scheme is no token
    r = http.get("/v1/whoami", headers={"Authorization": f"Basic {tok['alpha']}"})
    assert r.status_code == 401


def test_listing_and_events_show_only_own_campaign(world, server):
    http, tok, ids = world
    h = {"Authorization": f"Bearer {tok['alpha']}"}
    assert http.get("/v1/campaigns", headers=h).json() == {"campaigns": ["alpha"]}
    # beta's short lease expires: an event beta sees and alpha does not
    hb = {"Authorization": f"Bearer {tok['beta']}"}
    r = http.post("/v1/campaigns/beta/intents", json={"max": 1, "duration": 0.3}, headers=hb)
    lid = r.json()["lease"]["id"]
    page = http.get("/v1/campaigns/beta/events", params={"timeout": 10}, headers=hb).json()
    assert any(e["kind"] == "expired" and e["lease_id"] == lid for e in page["events"])
    mine = http.get("/v1/campaigns/alpha/events", headers=h).json()
    assert all(e["campaign"] == "alpha" for e in mine["events"])
    journal = http.get("/v1/campaigns/alpha/journal", params={"limit": 1000}, headers=h).json()
    assert journal["records"] and all(r["campaign"] == "alpha" for r in journal["records"])
    ops = http.get("/v1/events", headers={"Authorization": f"Bearer {tok['operator']}"}).json()
    assert any(e["campaign"] == "beta" for e in ops["events"])


def test_columnar_batches_follow_the_access_rule(world):
    """A campaign token batches for its own campaign only: another's, or one that does
    not exist, answers the same 404 and changes nothing; the operator batches for any
    (and mixes them); no or a wrong token is 401."""
    pytest.importorskip("msgpack")
    http, tok, ids = world
    wrong = tok["alpha"][:-4] + ("AAAA" if not tok["alpha"].endswith("AAAA") else "BBBB")
    before = _snapshot(http, tok["beta"], "beta")
    for path, body in COLUMNAR:
        for binary in (False, True):
            theirs = _columnar(http, tok["alpha"], path, body, "beta", binary=binary)
            missing = _columnar(http, tok["alpha"], path, body, "nosuch", binary=binary)
            both = _columnar(http, tok["alpha"], path, {**body, "campaigns": ["alpha", "beta"],
                                                        "campaign": [0, 1]}, "", binary=binary)
            assert theirs.status_code == missing.status_code == both.status_code == 404
            assert theirs.content == missing.content == both.content
            for token in (None, wrong):
                r = _columnar(http, token, path, body, "alpha", binary=binary)
                assert r.status_code == 401 and r.headers.get("www-authenticate") == "Bearer"
    assert _snapshot(http, tok["beta"], "beta") == before
    for path, body in COLUMNAR:
        for who, c in (("alpha", "alpha"), ("operator", "beta")):
            r = _columnar(http, tok[who], path, body, c, binary=True)
            assert r.status_code == 200, (who, path, r.text)
            assert r.headers["content-type"].startswith("application/msgpack")
        r = _columnar(http, tok["operator"], path, {**body, "campaigns": ["alpha", "beta"],
                                                    "campaign": [0, 1]}, "")
        assert r.status_code == 200 and len(r.json()["seq"]) == 2, r.text


# the decision stream: messages name their campaign ({c}), leases by id ({l})
STREAM = [
    {"op": "acquire", "campaign": "{c}", "max": 1, "duration": 60},
    {"op": "consume", "campaign": "{c}", "dim": "fs", "amount": 0.1},
    {"op": "renew", "lease": "{l}", "duration": 5},
    {"op": "release", "lease": "{l}"},
]


def _ws(server, token: str | None, query: str = ""):
    """A raw WebSocket to ``/v1/stream``: the connection, or the refused upgrade's
    (status, headers, body)."""
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    try:
        return connect(server.url.replace("http", "ws", 1) + "/v1/stream" + query,
                       additional_headers=headers, compression=None).__enter__()
    except InvalidStatus as e:
        return e.response.status_code, e.response.headers, e.response.body


def _ask(ws, messages: list[dict]) -> list[dict]:
    import json

    ws.send(json.dumps([{**m, "id": i} for i, m in enumerate(messages)]))
    out: list[dict] = []
    while len(out) < len(messages):
        doc = json.loads(ws.recv(timeout=10))
        out += [m for m in (doc if isinstance(doc, list) else [doc]) if m["type"] != "event"]
    return out


def _fill(m: dict, c: str, l: int) -> dict:
    return {k: (v.format(c=c) if v == "{c}" else l if v == "{l}" else v) for k, v in m.items()}


def test_decision_stream_follows_the_access_rule(world, server):
    """On the stream, a message for another campaign, or for another campaign's lease,
    answers exactly what one for a missing campaign or lease answers, and changes
    nothing; so does opening a stream on another campaign; no or a wrong token is 401 at
    the upgrade; the token's own campaign and the operator succeed."""
    pytest.importorskip("websockets")
    http, tok, ids = world
    wrong = tok["alpha"][:-4] + ("AAAA" if not tok["alpha"].endswith("AAAA") else "BBBB")
    for token in (None, wrong, "x" * 300, "bsr_"):
        status, headers, _ = _ws(server, token)
        assert status == 401 and headers.get("www-authenticate") == "Bearer", token
    theirs, missing = _ws(server, tok["alpha"], "?campaign=beta"), \
        _ws(server, tok["alpha"], "?campaign=nosuch")
    assert theirs[0] == missing[0] == 404 and theirs[2] == missing[2]
    before = _snapshot(http, tok["beta"], "beta")
    ws = _ws(server, tok["alpha"])
    try:
        for m in STREAM:
            a, b = _ask(ws, [_fill(m, "beta", ids["beta"]["l"]),
                             _fill(m, "nosuch", NOSUCH_ID)])
            assert a["status"] == 404 and a == {**b, "id": a["id"]}, (m, a, b)
        own = _ask(ws, [_fill(m, "alpha", ids["alpha"]["l"]) for m in STREAM])
        assert [x["type"] for x in own] == ["decision", "consumption", "decision", "decision"]
        assert own[3]["decision"]["outcome"] == "released"
    finally:
        ws.close()
    assert _snapshot(http, tok["beta"], "beta") == before
    ws = _ws(server, tok["operator"])
    try:
        got = _ask(ws, [_fill(m, "beta", ids["beta"]["l"]) for m in STREAM[:2]]
                   + [{**_fill(STREAM[3], "beta", ids["beta"]["l"]), "campaign": "beta"}])
        assert [x["type"] for x in got] == ["decision", "consumption", "decision"]
        assert got[2]["decision"]["outcome"] == "released"
    finally:
        ws.close()


# ---------------------------------------------------------------------------- subtrees
# A tree beside the flat campaigns: a token of a node acts for its node and every node
# below it, and for nothing else (not its parent, not a sibling, not a name that merely
# shares a prefix).
# each node's ceiling of GPUs (a parent's holds its children's holdings too)
TREE_NODES = {"astro": 8, "astro/survey": 4, "astro/survey/a": 2, "astro/other": 2,
              "astro2": 2, "bio": 2}


def _node_env(ceiling: int) -> dict:
    return {"credits": 1000, "service_class": "agent-burst", "sustained": {"gpu": 2, "fs": 1},
            "ceiling": {"gpu": ceiling, "fs": 1}, "burst": {"gpu": 100000, "fs": 10}}


# (principal, target) -> allowed: every endpoint answers as the operator's would, or 404
SUBTREE = [("astro", "astro", True), ("astro", "astro/survey", True),
           ("astro", "astro/survey/a", True), ("astro", "astro2", False),
           ("astro", "bio", False),
           ("astro/survey", "astro", False), ("astro/survey", "astro/other", False),
           ("astro/survey", "astro/survey/a", True)]
# the exact status of each scoped endpoint when allowed (the rest answer 200)
ALLOWED_STATUS = {("POST", "/v1/campaigns/{c}/intents"): 201,
                  ("POST", "/v1/campaigns/{c}/tokens"): 201}


@pytest.fixture(scope="module")
def tree_server(tmp_path_factory, base_config):
    from bursarcore.service.testing import ServerProcess

    cfg = dict(base_config)
    cfg["campaigns"] = {**base_config["campaigns"], **{n: _node_env(k) for n, k in TREE_NODES.items()}}
    srv = ServerProcess(tmp_path_factory.mktemp("tree-matrix"), cfg,
                        extra_args=["--auth-fail-rate", "0"]).start()
    yield srv
    srv.stop()


def _tree_world(server, http: httpx.Client, node: str) -> dict:
    """A lease (1 unit), a pending intent (the node's ceiling: waits while the lease
    holds), a journal record and a token of ``node``, made by the operator."""
    op = {"Authorization": f"Bearer {server.tokens['operator']}"}
    r = http.post(f"/v1/campaigns/{node}/intents", json={"max": 1, "duration": 3600},
                  headers=op)
    assert r.status_code == 201, r.text
    r2 = http.post(f"/v1/campaigns/{node}/intents",
                   json={"max": TREE_NODES[node], "duration": 3600}, headers=op)
    assert r2.status_code == 202, r2.text
    t = http.post(f"/v1/campaigns/{node}/tokens", headers=op)
    assert t.status_code == 201, t.text
    return {"l": r.json()["lease"]["id"], "i": r2.json()["intent_id"], "s": r.json()["seq"],
            "t": t.json()["token_id"]}


def _tree_clean(server, http: httpx.Client, node: str) -> None:
    op = {"Authorization": f"Bearer {server.tokens['operator']}"}
    # the pending intents first: a release would let them be granted
    for p in http.get(f"/v1/campaigns/{node}/intents", headers=op).json()["pending"]:
        http.delete(f"/v1/campaigns/{node}/intents/{p['intent_id']}", headers=op)
    for l in http.get(f"/v1/campaigns/{node}/leases", headers=op).json()["leases"]:
        http.post(f"/v1/campaigns/{node}/leases/{l['id']}/release", headers=op)


@pytest.mark.parametrize("who,node,allowed", SUBTREE,
                         ids=[f"{w}->{n}" for w, n, _ in SUBTREE])
def test_subtree_tokens_on_every_endpoint(tree_server, who, node, allowed):
    """Every campaign endpoint, a token of ``who`` against ``node``: inside its subtree the
    exact status the operator gets; outside, the 404 a missing campaign gets, changing
    nothing. Registering below ``node``: 201 inside the subtree, 403 outside."""
    http = httpx.Client(base_url=tree_server.url, timeout=10)
    tok = tree_server.tokens
    try:
        ids = _tree_world(tree_server, http, node)
        before = (_snapshot(http, tok["operator"], node),
                  _call(http, tok["operator"], "GET", "/v1/campaigns/{c}/tokens", None,
                        c=node).json())
        # release and the deletions last: they end what the others use
        last = [e for e in SCOPED if e[0] == "DELETE" or e[1].endswith("/release")]
        for method, path, body in [e for e in SCOPED if e not in last] + last:
            r = _call(http, tok[who], method, path, body, c=node, **ids)
            if allowed:
                want = ALLOWED_STATUS.get((method, path), 200)
                assert r.status_code == want, (who, node, method, path, r.text)
            else:
                missing = _call(http, tok[who], method, path, body, c=f"{who}/nosuch",
                                l=NOSUCH_ID, i=NOSUCH_ID, s=NOSUCH_ID, t=NOSUCH_TOKEN)
                assert r.status_code == 404, (who, node, method, path, r.text)
                assert r.content == missing.content, (who, node, method, path)
        if not allowed:
            assert (_snapshot(http, tok["operator"], node),
                    _call(http, tok["operator"], "GET", "/v1/campaigns/{c}/tokens", None,
                          c=node).json()) == before
        # registering a node below the target
        child = f"{node}/by-{who.replace('/', '-')}"
        r = _call(http, tok[who], "POST", "/v1/campaigns",
                  {"name": child, "envelope": {"credits": 1}})
        if allowed:
            assert r.status_code == 201 and r.json()["campaign"] == child, r.text
        else:
            assert r.status_code == 403 and r.json() == {"detail": "operator token required"}
        listed = _call(http, tok["operator"], "GET", "/v1/campaigns", None).json()["campaigns"]
        assert (child in listed) is allowed
        # the listing of campaigns shows the token's subtree
        mine = _call(http, tok[who], "GET", "/v1/campaigns", None).json()["campaigns"]
        assert (node in mine) is allowed
        assert all(c == who or c.startswith(who + "/") for c in mine)
    finally:
        _tree_clean(tree_server, http, node)
        http.close()


def test_subtree_tokens_cannot_reach_the_operator_endpoints(tree_server):
    http = httpx.Client(base_url=tree_server.url, timeout=10)
    try:
        for who in ("astro", "astro/survey"):
            for method, path, body in OPERATOR_ONLY:
                r = _call(http, tree_server.tokens[who], method, path, body)
                assert r.status_code == 403, (who, method, path, r.text)
            # a top-level node, its own node, or a prefix-sharing name: never
            for name in ("delta", who, who + "2/x"):
                r = _call(http, tree_server.tokens[who], "POST", "/v1/campaigns",
                          {"name": name, "envelope": {"credits": 1}})
                assert r.status_code == 403, (who, name, r.text)
    finally:
        http.close()


# changing and removing a node (SPEC §14.9): strictly below the token's own node
TREE_CHANGE = [("PATCH", "/v1/campaigns/{c}"), ("DELETE", "/v1/campaigns/{c}")]


@pytest.mark.parametrize("who,node,allowed", SUBTREE,
                         ids=[f"{w}->{n}" for w, n, _ in SUBTREE])
def test_subtree_tokens_change_and_remove_only_below_their_node(tree_server, who, node,
                                                                allowed):
    """PATCH and DELETE of a node: a token of ``who`` on a leaf below ``node`` answers 200
    inside its subtree and exactly the 404 of a missing node outside it, changing nothing;
    on its own node 403; the operator changes and removes any node."""
    http = httpx.Client(base_url=tree_server.url, timeout=10)
    tok = tree_server.tokens
    op = tok["operator"]
    leaf = f"{node}/leaf-{who.replace('/', '-')}"
    body = {"credits": 1}
    try:
        r = _call(http, op, "POST", "/v1/campaigns", {"name": leaf, "envelope": body})
        assert r.status_code == 201, r.text
        for method, path in TREE_CHANGE:
            r = _call(http, tok[who], method, path, body if method == "PATCH" else None, c=leaf)
            if allowed:
                assert r.status_code == 200, (who, leaf, method, r.text)
            else:
                missing = _call(http, tok[who], method, path,
                                body if method == "PATCH" else None, c=f"{who}/nosuch")
                assert r.status_code == 404 and r.content == missing.content, (who, leaf)
        listed = _call(http, op, "GET", "/v1/campaigns", None).json()["campaigns"]
        assert (leaf in listed) is not allowed
        # its own node: never (403), and nothing changes
        own = _call(http, tok[who], "PATCH", "/v1/campaigns/{c}", _node_env(TREE_NODES[who]),
                    c=who)
        assert own.status_code == 403, own.text
        assert _call(http, tok[who], "DELETE", "/v1/campaigns/{c}", None,
                     c=who).status_code == 403
        # the operator: any node
        if not allowed:
            assert _call(http, op, "PATCH", "/v1/campaigns/{c}", body, c=leaf).status_code \
                == 200
            assert _call(http, op, "DELETE", "/v1/campaigns/{c}", None, c=leaf).status_code \
                == 200
        assert leaf not in _call(http, op, "GET", "/v1/campaigns", None).json()["campaigns"]
    finally:
        http.close()


def test_tree_change_routes_answer_401_without_a_token(tree_server):
    http = httpx.Client(base_url=tree_server.url, timeout=10)
    try:
        for method, path in TREE_CHANGE:
            for token in (None, "bsr_wrong"):
                r = _call(http, token, method, path, {"credits": 1} if method == "PATCH"
                          else None, c="astro/survey")
                assert r.status_code == 401, (method, token, r.text)
    finally:
        http.close()
