"""Columnar batches (``POST /v1/batch/intents``, ``/v1/batch/consume``) in this process on a
manual clock: JSON and MessagePack answer what ``Broker.admit_batch`` and
``consume_batch`` answer on the same input; who may batch for which campaign; the limits;
and every malformed request is a 4xx naming the column and row that changes nothing."""

from __future__ import annotations

import json

import numpy as np
import pytest

msgpack = pytest.importorskip("msgpack")

from bursarcore.broker import BatchResult  # noqa: E402
from bursarcore.client import BursarClient  # noqa: E402
from bursarcore.errors import InvalidArgument, UnknownCampaign  # noqa: E402
from bursarcore.journal import records as J  # noqa: E402
from bursarcore.service import wire as W  # noqa: E402
from bursarcore.service.app import ServiceSettings  # noqa: E402
from bursarcore.service.testing import InProcessService  # noqa: E402

CAMPS = ["alpha", "beta", "gamma"]
JSON_H = {"content-type": W.JSON}
MSG_H = {"content-type": W.MSGPACK}


def _inputs(seed: int, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Rows over three campaigns, sized so that some are granted, some refused or pending
    (ceilings of 32 GPUs, a 64-GPU pool), with one duration per row."""
    rng = np.random.default_rng(seed)
    ci = rng.integers(0, 3, n)
    lo = rng.integers(1, 5, n)
    hi = lo + rng.integers(0, 6, n)
    dur = rng.uniform(1.0, 600.0, n).round(3)
    return ci, lo, hi, dur


def _pair(config):
    """Two identical services (the same configuration and clock): one is asked over HTTP,
    the other's broker directly."""
    return InProcessService(config), InProcessService(config)


def _post(http, svc, path, doc, form, who="operator"):
    return http.post(path, content=W.encode_body(doc, form),
                     headers={**svc.headers(who), "content-type": form})


def _cols(r) -> dict:
    doc = W.decode_body(r.content, W.media_type_of(r.headers["content-type"]))
    out = {}
    for k, v in doc.items():
        if isinstance(v, dict) or (isinstance(v, list) and v and not isinstance(v[0], str)):
            if isinstance(v, list):
                v = [np.inf if x is None else x for x in v]
            out[k] = W.column(v, k, "float", finite=False)
        else:
            out[k] = v
    return out


def _equal(got: dict, want: BatchResult) -> None:
    for f in BatchResult._fields:
        assert np.array_equal(np.asarray(got[f], np.int64), getattr(want, f)), f


@pytest.mark.parametrize("form", [W.JSON, W.MSGPACK])
def test_intents_agree_with_admit_batch_in_process(form, base_config):
    svc, ref = _pair(base_config)
    seen: set = set()
    with svc.client() as http:
        lut = np.array([ref.broker.campaign_index(c) for c in CAMPS])
        for seed in range(3):                 # three batches: later ones meet the earlier
            ci, lo, hi, dur = _inputs(seed, 120)
            doc = {"campaigns": CAMPS, "campaign": ci, "min_units": lo, "max_units": hi,
                   "duration": dur}
            r = _post(http, svc, "/v1/batch/intents", doc, form)
            assert r.status_code == 200, r.text
            assert r.headers["content-type"].startswith(form)
            got = _cols(r)
            want = ref.broker.admit_batch(lut[ci], np.stack([lo, hi], 1), dur)
            _equal(got, want)
            seen |= set(want.outcome.tolist())
    assert len(seen) >= 2 and 0 in seen          # grants and refusals or pending items
    # the same state afterwards: leases, balances, pending queue
    a, b = svc.broker.state(), ref.broker.state()
    assert a["leases"] == b["leases"] and a["pending"] == b["pending"]
    assert a["campaigns"] == b["campaigns"]


@pytest.mark.parametrize("form", [W.JSON, W.MSGPACK])
def test_costs_and_seqs_are_each_decisions_journal_record(form, base_config):
    svc = InProcessService(base_config)
    with svc.client() as http:
        ci, lo, hi, dur = _inputs(7, 60)
        r = _post(http, svc, "/v1/batch/intents", {"campaigns": CAMPS, "campaign": ci,
                                                   "min_units": lo, "max_units": hi,
                                                   "duration": dur}, form)
        got = _cols(r)
    rows = svc.service.journal.rows()
    recs = rows[got["seq"].astype(np.int64)]
    assert (recs["op"] == J.OP["acquire"]).all()
    assert np.array_equal(recs["intent"], got["intent"].astype(np.int64))
    assert np.array_equal(recs["units"][got["outcome"] == 0], got["granted"][got["outcome"] == 0])
    assert np.allclose(recs["cost"] / 1e6, got["cost"])
    assert (got["cost"][got["outcome"] == 0] > 0).all()
    assert got["seq"].max() <= svc.service.durable_seq   # answered once durable
    assert got["time"] == svc.clock.now()


@pytest.mark.parametrize("form", [W.JSON, W.MSGPACK])
def test_consumptions_agree_with_consume_batch_in_process(form, base_config):
    svc, ref = _pair(base_config)
    rng = np.random.default_rng(3)
    with svc.client() as http:
        lut = np.array([ref.broker.campaign_index(c) for c in CAMPS[:2]])
        for _ in range(3):
            for x in (svc, ref):              # the buckets fill as time passes
                x.clock.advance(0.7)
            ci = rng.integers(0, 2, 80)
            amt = rng.uniform(0, 1.5, 80).round(3)
            r = _post(http, svc, "/v1/batch/consume",
                      {"campaigns": CAMPS[:2], "campaign": ci, "dims": ["fs"], "amount": amt},
                      form)
            assert r.status_code == 200, r.text
            got = _cols(r)
            allowed, retry = ref.broker.consume_batch(lut[ci], "fs", amt)
            assert np.array_equal(got["allowed"], allowed)
            assert np.array_equal(got["retry_after"], retry)
            assert (got["allowed"] < amt).any() and (got["allowed"] == amt).any()
            short = got["allowed"] < amt
            assert (got["reason"][short] == J.REASONS.index("tokens")).all()
            recs = svc.service.journal.rows()[got["seq"].astype(np.int64)]
            assert (recs["op"] == J.OP["consume"]).all()


@pytest.mark.parametrize("binary", [True, False])
def test_client_returns_what_the_broker_returns(binary, base_config):
    svc, ref = _pair(base_config)
    with svc.client() as http, BursarClient("http://testserver", svc.tokens["operator"],
                                            transport=http._transport) as c:
        assert c.campaigns() == ref.broker.campaigns          # registration order
        ci, lo, hi, dur = _inputs(11, 90)
        got = c.admit_batch(ci, np.stack([lo, hi], 1), dur, binary=binary)
        want = ref.broker.admit_batch(ci, np.stack([lo, hi], 1), dur)
        assert isinstance(got, BatchResult)
        for f in BatchResult._fields:
            g, w = getattr(got, f), getattr(want, f)
            assert g.dtype == w.dtype and np.array_equal(g, w), f
        # names per row, one name for the batch, one scalar duration, min = max
        names = np.array(CAMPS)[ci[:20]]
        got = c.admit_batch(names, hi[:20], 30.0, binary=binary)
        lut = {n: ref.broker.campaign_index(n) for n in CAMPS}
        want = ref.broker.admit_batch([lut[x] for x in names], hi[:20], 30.0)
        assert all(np.array_equal(g, w) for g, w in zip(got, want))
        got = c.admit_batch("beta", [1, 2], 5.0, service_class="interactive", binary=binary)
        want = ref.broker.admit_batch([1, 1], [1, 2], 5.0, service_class="interactive")
        assert all(np.array_equal(g, w) for g, w in zip(got, want))
        for x in (svc, ref):
            x.clock.advance(1.0)
        amt = np.linspace(0, 3, 25)
        ga, gr = c.consume_batch(names[:25] if len(names) >= 25 else np.resize(names, 25),
                                 "fs", amt, binary=binary)
        wa, wr = ref.broker.consume_batch([lut[x] for x in np.resize(names, 25)], "fs", amt)
        assert np.array_equal(ga, wa) and np.array_equal(gr, wr)
        assert np.isinf(gr).any() or (gr > 0).any()


def test_a_campaign_token_batches_for_its_own_campaign_only(base_config):
    svc = InProcessService(base_config)
    doc = {"max_units": [1, 1], "duration": 60.0}
    with svc.client() as http:
        before = len(svc.service.journal)
        ok = _post(http, svc, "/v1/batch/intents", {"campaigns": ["alpha"], **doc}, W.JSON,
                   "alpha")
        assert ok.status_code == 200, ok.text
        before = len(svc.service.journal)
        for path, body in (("/v1/batch/intents", doc),
                           ("/v1/batch/consume", {"dims": ["fs"], "amount": [0.5]})):
            answers = []
            for names in (["beta"], ["alpha", "beta"], ["nosuch"], ["alpha", "nosuch"]):
                full = {"campaigns": names, **body}
                if len(names) > 1:
                    full["campaign"] = [0, 1] if "max_units" in body else [1]
                for form in (W.JSON, W.MSGPACK):
                    r = _post(http, svc, path, full, form, "alpha")
                    assert r.status_code == 404, (path, names, r.text)
                    answers.append(r.content)
            assert len(set(answers)) == 1            # another's looks exactly like none
            r = http.post(path, content=json.dumps({"campaigns": ["alpha"], **body}),
                          headers=JSON_H)
            assert r.status_code == 401
            r = http.post(path, content=json.dumps({"campaigns": ["alpha"], **body}),
                          headers={**JSON_H, "Authorization": "Bearer bsr_nope"})
            assert r.status_code == 401
        assert len(svc.service.journal) == before     # nothing changed
        # the operator mixes campaigns in one batch
        r = _post(http, svc, "/v1/batch/intents",
                  {"campaigns": ["alpha", "beta"], "campaign": [0, 1], **doc}, W.MSGPACK)
        assert r.status_code == 200
        recs = svc.service.journal.rows()[_cols(r)["seq"].astype(np.int64)]
        assert list(recs["campaign"]) == [svc.broker.campaign_index("alpha"),
                                          svc.broker.campaign_index("beta")]


GOOD = {"campaigns": ["alpha", "beta"], "campaign": [0, 1, 0], "min_units": [1, 1, 2],
        "max_units": [2, 3, 4], "duration": [60.0, 30.0, 10.0]}


def _typed(a, dt):
    a = np.asarray(a, dtype=dt)
    return {"dtype": a.dtype.str, "n": a.shape[0], "data": a.tobytes()}


@pytest.mark.parametrize("change,form,loc,msg", [
    ({"min_units": [1, -1, 2]}, W.JSON, ["body", "min_units", 1], ">= 1"),
    ({"min_units": [1, 1, 0]}, W.MSGPACK, ["body", "min_units", 2], ">= 1"),
    ({"min_units": [1, 5, 2]}, W.JSON, ["body", "min_units", 1], "<= max_units[1]"),
    ({"max_units": [2, 3, 1 << 30]}, W.JSON, ["body", "max_units", 2], "<= 16777216"),
    ({"duration": [60.0, -1.0, 10.0]}, W.JSON, ["body", "duration", 1], ">="),
    ({"duration": 0}, W.JSON, ["body", "duration", 0], ">="),
    ({"campaign": [0, 2, 0]}, W.JSON, ["body", "campaign", 1], "a position in campaigns"),
    ({"campaign": None}, W.JSON, ["body", "campaign"], "required"),
    ({"min_units": [1, 1]}, W.JSON, ["body", "min_units"], "has 2 items; the batch has 3"),
    ({"duration": [60.0]}, W.MSGPACK, ["body", "duration"], "has 1 items"),
    ({"max_units": [2, 3.5, 4]}, W.JSON, ["body", "max_units", 1], "must be an integer"),
    ({"max_units": [2, True, 4]}, W.JSON, ["body", "max_units", 1], "must be an integer"),
    ({"max_units": [2, "3", 4]}, W.JSON, ["body", "max_units", 1], "must be an integer"),
    ({"max_units": _typed([2, 3, 4], "<f8")}, W.MSGPACK, ["body", "max_units"], "dtype"),
    ({"max_units": _typed([2, 3, 4], ">i8")}, W.MSGPACK, ["body", "max_units"], "dtype"),
    ({"max_units": {"dtype": "<i4", "n": 3, "data": b"\0" * 11}}, W.MSGPACK,
     ["body", "max_units"], "holds 11 bytes"),
    ({"max_units": {"dtype": "<i4", "n": 3}}, W.MSGPACK, ["body", "max_units"], "typed"),
    ({"max_units": []}, W.JSON, ["body", "max_units"], "at least one"),
    ({"max_units": None}, W.JSON, ["body", "max_units"], "required"),
    ({"duration": [60.0, float("nan"), 1.0]}, W.MSGPACK, ["body", "duration", 1], "finite"),
    ({"dim": "tpu"}, W.JSON, ["body", "dim"], "one of"),
    ({"service_class": "vip"}, W.JSON, ["body", "service_class"], "one of"),
    ({"ttl": 0}, W.JSON, ["body", "ttl"], "> 0"),
    ({"bogus": 1}, W.JSON, ["body", "bogus"], "not a field"),
    ({"campaigns": []}, W.JSON, ["body", "campaigns"], "non-empty"),
    ({"campaigns": ["alpha", 7]}, W.JSON, ["body", "campaigns", 1], "a name"),
])
def test_a_bad_intents_request_names_column_and_row_and_changes_nothing(change, form, loc, msg, base_config):
    svc = InProcessService(base_config)
    doc = {**GOOD, **change}
    doc = {k: v for k, v in doc.items() if v is not None}
    with svc.client() as http:
        before = len(svc.service.journal)
        r = _post(http, svc, "/v1/batch/intents", doc, form)
        assert r.status_code == 422, r.text
        item = r.json()["detail"][0]
        assert item["loc"] == loc and msg in item["msg"], item
        assert len(svc.service.journal) == before
        assert svc.broker.leases() == []


@pytest.mark.parametrize("change,loc,msg", [
    ({"amount": [0.5, -1.0]}, ["body", "amount", 1], ">= 0"),
    ({"amount": [0.5, None]}, ["body", "amount", 1], "must be a number"),
    ({"dims": ["fs", "gpu"], "dim": [0, 1]}, ["body", "dims", 1], "flow dimension"),
    ({"dims": ["fs", "fs"]}, ["body", "dim"], "required"),
    ({"dim": [0, 1]}, ["body", "dim", 1], "a position in dims"),
    ({"campaign": [0, 0, 0]}, ["body", "campaign"], "has 3 items"),
])
def test_a_bad_consume_request_names_column_and_row_and_changes_nothing(change, loc, msg, base_config):
    svc = InProcessService(base_config)
    doc = {"campaigns": ["alpha", "beta"], "campaign": [0, 1], "dims": ["fs"],
           "amount": [0.5, 0.5], **change}
    with svc.client() as http:
        before = len(svc.service.journal)
        r = http.post("/v1/batch/consume", content=json.dumps(doc),
                      headers={**svc.headers("operator"), **JSON_H})
        assert r.status_code == 422, r.text
        item = r.json()["detail"][0]
        assert item["loc"] == loc and msg in item["msg"], item
        assert len(svc.service.journal) == before


def test_bodies_that_are_not_a_columnar_map(base_config):
    svc = InProcessService(base_config)
    h = svc.headers("operator")
    with svc.client() as http:
        before = len(svc.service.journal)
        for body, ct, status in ((b"\xc1\x00", W.MSGPACK, 422), (b"{", W.JSON, 422),
                                 (b"[1, 2]", W.JSON, 422), (msgpack.packb([1]), W.MSGPACK, 422),
                                 (json.dumps(GOOD).encode(), "text/plain", 415),
                                 (json.dumps(GOOD).encode(), None, 415)):
            headers = {**h, "content-type": ct} if ct else h
            r = http.post("/v1/batch/intents", content=body, headers=headers)
            assert r.status_code == status, (body, ct, r.text)
        assert len(svc.service.journal) == before


def test_limits_in_bytes_and_items(base_config):
    settings = ServiceSettings(rate=0, auth_fail_rate=0, max_batch_items=50,
                               max_batch_body=4096, max_body=2048)
    svc = InProcessService(base_config, settings=settings)
    h = {**svc.headers("operator"), **MSG_H}
    with svc.client() as http:
        before = len(svc.service.journal)
        # items: 51 rows of a small body
        doc = {"campaigns": ["alpha"], "max_units": np.ones(51, np.int32), "duration": 1.0}
        r = http.post("/v1/batch/intents", content=W.encode_body(doc, W.MSGPACK), headers=h)
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "max_units"]
        assert "at most 50 items" in r.json()["detail"][0]["msg"]
        doc = {"campaigns": ["alpha"], "dims": ["fs"], "amount": np.zeros(51)}
        r = http.post("/v1/batch/consume", content=W.encode_body(doc, W.MSGPACK), headers=h)
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "amount"]
        # bytes: the columnar limit, not the general one, applies under /v1/batch/
        doc = {"campaigns": ["alpha"], "max_units": np.ones(50, np.int64), "duration": 1.0,
               "service_class": "x" * 3000}
        body = W.encode_body(doc, W.MSGPACK)
        assert 2048 < len(body) < 4096
        r = http.post("/v1/batch/intents", content=body, headers=h)
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "service_class"]
        body = W.encode_body({**doc, "service_class": "x" * 5000}, W.MSGPACK)
        r = http.post("/v1/batch/intents", content=body, headers=h)
        assert r.status_code == 413
        assert len(svc.service.journal) == before
        r = http.post("/v1/batch/intents", content=W.encode_body(
            {"campaigns": ["alpha"], "max_units": np.ones(50, np.int8), "duration": 1.0},
            W.MSGPACK), headers=h)
        assert r.status_code == 200 and len(_cols(r)["granted"]) == 50


def test_a_batch_costs_rate_as_the_batch_endpoint_does(base_config):
    # burst 12, no refill to speak of: a 1000-item batch costs 1 + 1000 // 100 = 11
    settings = ServiceSettings(rate=1e-6, burst=12, auth_fail_rate=0)
    svc = InProcessService(base_config, settings=settings)
    h = {**svc.headers("operator"), **JSON_H}
    doc = json.dumps({"campaigns": ["gamma"], "max_units": [1] * 1000, "duration": 1.0})
    with svc.client() as http:
        assert http.post("/v1/batch/intents", content=doc, headers=h).status_code == 200
        before = len(svc.service.journal)
        r = http.post("/v1/batch/intents", content=doc, headers=h)
        assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
        assert len(svc.service.journal) == before


def test_the_client_raises_what_the_broker_raises(base_config):
    svc = InProcessService(base_config)
    with svc.client() as http, BursarClient("http://testserver", svc.tokens["alpha"],
                                            transport=http._transport) as c:
        with pytest.raises(InvalidArgument) as e:
            c.admit_batch("alpha", np.array([[1, 2], [3, 1]]), 5.0)
        assert e.value.field == "min_units[1]"
        with pytest.raises(InvalidArgument, match="units"):
            c.admit_batch("alpha", np.ones((2, 3), np.int64), 5.0)
        with pytest.raises(UnknownCampaign):
            c.admit_batch("beta", [1], 5.0)
        with pytest.raises(UnknownCampaign):
            c.consume_batch("beta", "fs", [1.0])
        assert c.admit_batch([0, 0], [1, 1], 5.0).granted.tolist() == [1, 1]   # own list
        assert len(svc.broker.leases("alpha")) == 2


def test_the_openapi_document_describes_both_forms(base_config):
    svc = InProcessService(base_config)
    with svc.client() as http:
        doc = http.get("/openapi.json").json()
    for path in ("/v1/batch/intents", "/v1/batch/consume"):
        op = doc["paths"][path]["post"]
        assert set(op["requestBody"]["content"]) == {W.JSON, W.MSGPACK}
        assert set(op["responses"]["200"]["content"]) == {W.JSON, W.MSGPACK}
        assert {"401", "404", "413", "415", "422", "429"} <= set(op["responses"])


def test_serve_takes_the_columnar_limits_from_its_flags(server_factory):
    """``--max-batch-items`` and ``--max-batch-body`` reach the running server, and the
    client speaks to it over real HTTP in both forms."""
    srv = server_factory(name="limits", extra_args=["--max-batch-items", "5",
                                                    "--max-batch-body", "2048"])
    with BursarClient(srv.url, srv.tokens["alpha"]) as c:
        for binary in (True, False):
            r = c.admit_batch("alpha", [1] * 5, 60.0, binary=binary)
            assert r.outcome.tolist() == [0] * 5
            with pytest.raises(InvalidArgument, match="at most 5 items"):
                c.admit_batch("alpha", [1] * 6, 60.0, binary=binary)
        with pytest.raises(InvalidArgument, match="too large"):
            c.admit_batch("alpha", [1] * 5, 60.0, service_class="x" * 3000)
        assert len(c.leases()) == 10
