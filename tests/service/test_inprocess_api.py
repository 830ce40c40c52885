"""The HTTP API in this process on a manual clock: where a 422 says the bad field is (path,
query or body), pagination of the lists that grow without bound, and reason codes passed
through as the broker gives them."""

from __future__ import annotations

import pytest

from bursarcore import Decision, Intent
from bursarcore.client import BursarClient
from bursarcore.journal import records as J
from bursarcore.service.testing import InProcessService

CONFIG = {"pool": {"gpu": 8, "flow": {"fs": 10.0}}, "campaigns": {
    "a": {"credits": 10000, "ceiling": {"gpu": 8}, "sustained": {"gpu": 8},
          "burst": {"gpu": 1e6}},
    "b": {"credits": 10000, "ceiling": {"gpu": 8}, "sustained": {"gpu": 8}}}}


@pytest.fixture
def svc():
    return InProcessService(CONFIG)


@pytest.mark.parametrize("method,url,body,loc", [
    ("post", "/v1/pool/tpu/nodes", {"nodes": [{"name": "n1", "slots": 1}]}, ["path", "dim"]),
    ("post", "/v1/pool/tpu/nodes/remove", {"nodes": ["n1"]}, ["path", "dim"]),
    ("post", "/v1/pool/gpu/nodes/remove", {"nodes": ["nope"]}, ["body", "nodes"]),
    ("get", "/v1/campaigns/a/leases/x", None, ["path", "lease_id"]),
    ("get", "/v1/campaigns/a/intents?limit=0", None, ["query", "limit"]),
    ("get", "/v1/campaigns/a/leases?after=-2", None, ["query", "after"]),
    ("get", "/v1/journal?reason=nonsense", None, ["query", "reason"]),
])
def test_a_422_names_where_the_field_is(svc, method, url, body, loc):
    with svc.client() as http:
        kw = {"json": body} if body is not None else {}
        r = getattr(http, method)(url, headers=svc.headers("operator"), **kw)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == loc, r.text


def _pending(http, svc, n):
    ids = []
    for _ in range(n):
        r = http.post("/v1/campaigns/a/intents", json={"max": 1, "duration": 60},
                      headers=svc.headers("a"))
        assert r.status_code == 202, r.text
        ids.append(r.json()["intent_id"])
    return ids


def test_the_pending_list_and_the_leases_are_paginated(svc):
    h = svc.headers("a")
    with svc.client() as http:
        leases = [http.post("/v1/campaigns/a/intents", json={"max": 1, "duration": 60},
                            headers=h).json()["lease"]["id"] for _ in range(8)]
        ids = _pending(http, svc, 25)
        got, after, pages = [], -1, 0
        while after is not None:
            page = http.get("/v1/campaigns/a/intents", params={"after": after, "limit": 10},
                            headers=h).json()
            assert len(page["pending"]) <= 10
            got += [p["intent_id"] for p in page["pending"]]
            after, pages = page["next"], pages + 1
        assert got == sorted(ids) and pages == 3
        assert len(http.get("/v1/campaigns/a/intents", headers=h).json()["pending"]) == 25
        page = http.get("/v1/campaigns/a/intents", params={"limit": 25}, headers=h).json()
        assert page["next"] is None and len(page["pending"]) == 25
        assert http.get("/v1/campaigns/a/intents", params={"limit": 1001},
                        headers=h).status_code == 422
        got, after = [], -1
        while after is not None:
            page = http.get("/v1/campaigns/a/leases", params={"after": after, "limit": 3},
                            headers=h).json()
            got += [l["id"] for l in page["leases"]]
            after = page["next"]
        assert got == sorted(leases)
        # the client reads every page
        with BursarClient("http://testserver", svc.tokens["a"], transport=http._transport) as c:
            assert [p["intent_id"] for p in c.pending()] == sorted(ids)
            assert [l.id for l in c.leases()] == sorted(leases)


def test_the_default_page_is_bounded(svc):
    h = svc.headers("a")
    with svc.client() as http:
        for _ in range(8):
            http.post("/v1/campaigns/a/intents", json={"max": 1, "duration": 60}, headers=h)
        ids = _pending(http, svc, 105)
        page = http.get("/v1/campaigns/a/intents", headers=h).json()
        assert [p["intent_id"] for p in page["pending"]] == sorted(ids)[:100]
        assert page["next"] == sorted(ids)[99]


def test_a_pending_limit_refusal_passes_through_with_its_retry_after(svc):
    def capped(intent):
        return Decision("refused", 7, intent.campaign, reason="pending_limit",
                        retry_after=2.5)

    svc.broker.acquire = capped
    with svc.client() as http:
        r = http.post("/v1/campaigns/a/intents", json={"max": 1, "duration": 60},
                      headers=svc.headers("a"))
        assert r.status_code == 200, r.text
        assert r.json()["reason"] == "pending_limit" and r.json()["retry_after"] == 2.5
        assert r.headers["retry-after"] == "3"
        with BursarClient("http://testserver", svc.tokens["a"], transport=http._transport) as c:
            d = c.acquire(Intent("a", units={"gpu": 1}, duration=60))
            assert d.reason == "pending_limit" and d.retry_after == 2.5


def test_the_journal_reason_filter_takes_the_journals_reason_codes(svc, monkeypatch):
    """A reason code the journal knows is a filter the API takes, with no list of its own."""
    with svc.client() as http:
        h = svc.headers("operator")
        if "pending_limit" not in J.REASONS:
            assert http.get("/v1/journal", params={"reason": "pending_limit"},
                            headers=h).status_code == 422
            monkeypatch.setattr(J, "REASONS", (*J.REASONS, "pending_limit"))
        r = http.get("/v1/journal", params={"reason": "pending_limit"}, headers=h)
        assert r.status_code == 200 and r.json()["records"] == []
