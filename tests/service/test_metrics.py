"""``GET /metrics`` scraped over real HTTP from a real ``bursar serve`` and read with
prometheus_client's own parser: decisions by outcome and reason, latency by route
template, pending depth, journal commits, per-campaign series with a bounded number of
campaign labels, and who may scrape."""

from __future__ import annotations

import copy

import httpx
import pytest

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from bursarcore.service.metrics import OTHER, top_campaigns  # noqa: E402
from bursarcore.service.testing import InProcessService, ServerProcess  # noqa: E402


def _scrape(url: str, token: str | None) -> dict[str, list]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    r = httpx.get(f"{url}/metrics", headers=headers, timeout=10)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    return {f.name: f.samples for f in text_string_to_metric_families(r.text)}


def _value(fams: dict, family: str, sample: str | None = None, **labels: str) -> float:
    hits = [s.value for s in fams[family] if (sample is None or s.name == sample)
            and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(hits) == 1, (family, labels, fams.get(family))
    return hits[0]


def _auth(srv: ServerProcess, who: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {srv.tokens[who]}"}


@pytest.fixture(scope="module")
def srv(tmp_path_factory, base_config):
    s = ServerProcess(tmp_path_factory.mktemp("metrics"), base_config).start()
    yield s
    s.stop()


def test_a_scrape_over_http_parses_and_counts_what_happened(srv):
    op = srv.tokens["operator"]
    before = _scrape(srv.url, op)
    granted = sum(s.value for s in before["bursar_decisions"]
                  if (s.labels["op"], s.labels["outcome"]) == ("acquire", "granted"))
    r = httpx.post(f"{srv.url}/v1/campaigns/alpha/intents", headers=_auth(srv, "alpha"),
                   json={"max": 4, "duration": 600}, timeout=10)
    assert r.status_code == 201
    r = httpx.post(f"{srv.url}/v1/campaigns/alpha/intents", headers=_auth(srv, "alpha"),
                   json={"max": 40, "duration": 600}, timeout=10)     # over the ceiling 32
    assert r.json()["outcome"] == "refused" and r.json()["reason"] == "ceiling"
    r = httpx.get(f"{srv.url}/v1/campaigns/alpha/leases/999999", headers=_auth(srv, "alpha"),
                  timeout=10)
    assert r.status_code == 404
    httpx.get(f"{srv.url}/no/such/path", timeout=10)

    fams = _scrape(srv.url, op)
    # decisions: from the durable journal, by op, outcome and reason
    assert _value(fams, "bursar_decisions", "bursar_decisions_total", op="acquire",
                  outcome="granted", reason="none") == granted + 1
    assert _value(fams, "bursar_decisions", "bursar_decisions_total", op="acquire",
                  outcome="refused", reason="ceiling") >= 1
    # latency by route template: never the raw path (no campaign name, no id)
    routes = {s.labels["route"] for s in fams["bursar_http_request_duration_seconds"]}
    assert "/v1/campaigns/{campaign}/intents" in routes
    assert "/v1/campaigns/{campaign}/leases/{lease_id}" in routes
    assert "unmatched" in routes
    assert not any("alpha" in r or "999999" in r or "/no/such" in r for r in routes)
    assert _value(fams, "bursar_http_request_duration_seconds",
                  "bursar_http_request_duration_seconds_count", method="POST",
                  route="/v1/campaigns/{campaign}/intents") >= 2
    assert _value(fams, "bursar_http_responses", "bursar_http_responses_total", method="GET",
                  route="/v1/campaigns/{campaign}/leases/{lease_id}", status="404") >= 1
    # the journal's group commit: every acknowledged write went through a commit
    commits = _value(fams, "bursar_journal_commit_duration_seconds",
                     "bursar_journal_commit_duration_seconds_count")
    assert commits >= 1
    assert _value(fams, "bursar_journal_commit_records",
                  "bursar_journal_commit_records_count") == commits
    assert _value(fams, "bursar_journal_commit_records",
                  "bursar_journal_commit_records_sum") >= 2
    # the broker's state at scrape time
    assert _value(fams, "bursar_campaign_held_units", campaign="alpha", dim="gpu") >= 4
    assert _value(fams, "bursar_pool_units", dim="gpu", state="capacity") == 64
    assert _value(fams, "bursar_campaign_tokens", campaign="gamma", dim="gpu") == float("inf")
    assert _value(fams, "bursar_campaign_credits_left", campaign="gamma") == float("inf")
    assert _value(fams, "bursar_service_failed") == 0
    assert _value(fams, "bursar_campaigns") == 3


def test_pending_depth_is_counted_by_dimension():
    env = {"credits": 1000, "sustained": {"gpu": 8}, "ceiling": {"gpu": 8},
           "burst": {"gpu": 100000}}
    svc = InProcessService({"pool": {"gpu": 8}, "campaigns": {"x": env, "y": env}})

    def depth(c) -> float:
        text = c.get("/metrics", headers=svc.headers("operator")).text
        fams = {f.name: f.samples for f in text_string_to_metric_families(text)}
        return _value(fams, "bursar_pending_intents", dim="gpu")

    with svc.client() as c:
        assert depth(c) == 0
        assert c.post("/v1/campaigns/x/intents", headers=svc.headers("x"),
                      json={"max": 8, "duration": 600}).json()["outcome"] == "granted"
        ids = []
        for _ in range(2):
            d = c.post("/v1/campaigns/y/intents", headers=svc.headers("y"),
                       json={"max": 4, "duration": 600, "ttl": 600}).json()
            assert d["outcome"] == "pending", d
            ids.append(d["intent_id"])
        assert depth(c) == 2
        c.delete(f"/v1/campaigns/y/intents/{ids[0]}", headers=svc.headers("y"))
        assert depth(c) == 1


def test_metrics_need_the_operator_token_by_default(srv):
    assert httpx.get(f"{srv.url}/metrics", timeout=10).status_code == 401
    assert httpx.get(f"{srv.url}/metrics", headers=_auth(srv, "alpha"),
                     timeout=10).status_code == 403
    assert httpx.get(f"{srv.url}/metrics", headers={"Authorization": "Bearer bsr_wrong"},
                     timeout=10).status_code == 401


def test_require_token_false_opens_metrics(tmp_path, base_config):
    cfg = {**copy.deepcopy(base_config), "metrics": {"require_token": False}}
    with ServerProcess(tmp_path, cfg) as s:
        fams = _scrape(s.url, None)
        assert _value(fams, "bursar_campaigns") == 3


def test_campaign_labels_are_capped_with_the_rest_summed_as_other(tmp_path, base_config):
    cfg = copy.deepcopy(base_config)
    env = cfg["campaigns"]["alpha"]
    for i in range(6):
        cfg["campaigns"][f"c{i}"] = copy.deepcopy(env)
    cfg["metrics"] = {"campaigns": 2}
    with ServerProcess(tmp_path, cfg) as s:
        # (each may take its guaranteed 8: the guarantees of all eight fill the pool)
        for who, n in (("c3", 8), ("c5", 6), ("c1", 2), ("c0", 1)):
            r = httpx.post(f"{s.url}/v1/campaigns/{who}/intents", headers=_auth(s, who),
                           json={"max": n, "duration": 600}, timeout=10)
            assert r.status_code == 201, r.text
        fams = _scrape(s.url, s.tokens["operator"])
        held = {x.labels["campaign"]: x.value for x in fams["bursar_campaign_held_units"]
                if x.labels["dim"] == "gpu"}
        assert held == {"c3": 8, "c5": 6, OTHER: 3}           # the top two, the rest summed
        credits = {x.labels["campaign"] for x in fams["bursar_campaign_credits_left"]}
        assert credits == {"c3", "c5", OTHER}
        # the sum over labels is the pool's occupancy either way
        assert sum(held.values()) == _value(fams, "bursar_pool_units", dim="gpu",
                                            state="occupied")


def test_top_campaigns_order_is_held_then_name():
    camps = {n: {"held": h} for n, h in [("b", {"gpu": 1, "cpu": 0}), ("a", {"gpu": 1, "cpu": 5}),
                                         ("c", {"gpu": 3, "cpu": 0}), ("d", {"gpu": 0, "cpu": 0}),
                                         ("e", {"gpu": 1, "cpu": 0})]}
    assert top_campaigns(camps, ["gpu", "cpu"], 3) == (["c", "a", "b"], ["e", "d"])
    assert top_campaigns(camps, ["gpu", "cpu"], 0) == ([], ["c", "a", "b", "e", "d"])


def test_decisions_are_counted_once_across_scrapes_and_from_a_replayed_journal(tmp_path,
                                                                                  base_config):
    """In process: each journal record counts once however often it is scraped, and a
    service reopened on the journal counts the history it replayed."""
    path = tmp_path / "j.db"

    def granted(svc) -> float:
        with svc.client() as c:
            text = c.get("/metrics", headers=svc.headers("operator")).text
        fams = {f.name: f.samples for f in text_string_to_metric_families(text)}
        return sum(s.value for s in fams["bursar_decisions"]
                   if s.labels["outcome"] == "granted" and s.labels["op"] == "acquire")

    svc = InProcessService(base_config, journal=path)
    with svc.client() as c:
        for _ in range(3):
            assert c.post("/v1/campaigns/alpha/intents", headers=svc.headers("alpha"),
                          json={"max": 1, "duration": 600}).status_code == 201
    assert granted(svc) == 3 and granted(svc) == 3
    svc.service.journal.close()
    again = InProcessService(base_config, journal=path)
    assert granted(again) == 3
    again.service.journal.close()
