"""What one failing request does to the service: an unexpected exception inside a broker
operation is a 500 for that request only; a journal failure (an I/O error, records of a
half-done operation, the committer failing) stops the service with 503s; no request waits
forever for a commit."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time

import httpx
import pytest

from bursarcore.broker import BACKENDS
from bursarcore.service.app import ServiceSettings
from bursarcore.service.testing import InProcessService

CONFIG = {"pool": {"gpu": 16}, "campaigns": {
    "a": {"credits": 1000, "ceiling": {"gpu": 16}, "sustained": {"gpu": 16}},
    "b": {"credits": 1000, "ceiling": {"gpu": 16}, "sustained": {"gpu": 16}}}}
INTENT = {"max": 1, "duration": 60}


BACKENDS = list(BACKENDS)


@pytest.fixture(params=BACKENDS)
def svc(request, tmp_path):
    return InProcessService(CONFIG, journal=tmp_path / "j.db", backend=request.param,
                            settings=ServiceSettings(rate=0, auth_fail_rate=0,
                                                     commit_timeout=0.5))


def _run(svc: InProcessService, script, bound: float = 20.0):
    """Run ``await script(http)`` against the app in this event loop (lifespan by hand),
    bounded: a request that hangs fails the test instead of hanging it."""
    async def main():
        await svc.service.start()
        transport = httpx.ASGITransport(app=svc.app)
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
                return await asyncio.wait_for(script(http), bound)
        finally:
            await svc.service.stop()
    return asyncio.run(main())


def test_an_unexpected_exception_fails_that_request_only(svc, caplog):
    real = svc.broker.acquire
    calls = []

    def boom(intent):
        calls.append(intent)
        if len(calls) == 1:
            raise OverflowError("Python int too large to convert to C long")
        return real(intent)

    svc.broker.acquire = boom

    async def script(http):
        bad = await http.post("/v1/campaigns/a/intents", json=INTENT, headers=svc.headers("a"))
        good = await http.post("/v1/campaigns/b/intents", json=INTENT, headers=svc.headers("b"))
        health = await http.get("/v1/health")
        return bad, good, health

    bad, good, health = _run(svc, script)
    assert bad.status_code == 500 and bad.json() == {
        "detail": "internal error in boom; nothing was journaled"}
    assert good.status_code == 201, good.text
    assert health.json()["status"] == "ok"
    assert svc.service.failed is None
    assert "OverflowError" in caplog.text and "Traceback" in caplog.text


def test_a_journal_io_error_inside_an_operation_stops_the_service(svc):
    def disk(intent):
        raise sqlite3.OperationalError("disk I/O error")

    svc.broker.acquire = disk

    async def script(http):
        first = await http.post("/v1/campaigns/a/intents", json=INTENT, headers=svc.headers("a"))
        later = await http.get("/v1/campaigns/b/supply", headers=svc.headers("b"))
        return first, later, await http.get("/v1/health")

    first, later, health = _run(svc, script)
    assert first.status_code == 503 and later.status_code == 503
    assert health.json()["status"] == "failed"


def test_an_operation_that_fails_after_journaling_stops_the_service(svc):
    real = svc.broker.acquire

    def half(intent):
        real(intent)                 # journaled a decision...
        raise RuntimeError("...and failed after it")

    svc.broker.acquire = half

    async def script(http):
        first = await http.post("/v1/campaigns/a/intents", json=INTENT, headers=svc.headers("a"))
        return first, await http.get("/v1/health")

    first, health = _run(svc, script)
    assert first.status_code == 503 and health.json()["status"] == "failed"


def test_a_failing_committer_answers_503_instead_of_leaving_requests_waiting(svc):
    """A batch that cannot be taken (a record the journal cannot encode) used to end the
    committer task silently: every request then waited for a commit forever while the
    health check said ok."""
    def bad_take():
        raise OverflowError("Python int too large to convert to C long")

    async def script(http):
        svc.service.journal.take = bad_take
        t0 = time.monotonic()
        first = await http.post("/v1/campaigns/a/intents", json=INTENT, headers=svc.headers("a"))
        later = await http.post("/v1/campaigns/b/intents", json=INTENT, headers=svc.headers("b"))
        return first, later, await http.get("/v1/health"), time.monotonic() - t0

    first, later, health, took = _run(svc, script, bound=10.0)
    assert first.status_code == 503 and later.status_code == 503
    assert health.json()["status"] == "failed"
    assert took < 5


def test_a_commit_slower_than_the_timeout_answers_503_and_the_service_goes_on(svc):
    release = threading.Event()
    real_commit = svc.service.journal.commit
    stalled = []

    def slow(batch):
        if not stalled:
            stalled.append(len(batch))
            release.wait(10)
        return real_commit(batch)

    async def script(http):
        svc.service.journal.commit = slow
        t0 = time.monotonic()
        first = await http.post("/v1/campaigns/a/intents", json=INTENT, headers=svc.headers("a"))
        took = time.monotonic() - t0
        release.set()
        second = await http.post("/v1/campaigns/a/intents", json=INTENT,
                                 headers=svc.headers("a"))
        return first, took, second, await http.get("/v1/health")

    first, took, second, health = _run(svc, script)
    assert first.status_code == 503 and "did not commit within 0.5 s" in first.json()["detail"]
    assert 0.4 < took < 5
    assert second.status_code == 201 and health.json()["status"] == "ok"
    # the first operation was not acknowledged, but it did commit in the end
    assert len(svc.broker.leases("a")) == 2


def test_an_unexpected_exception_outside_an_operation_is_a_500_with_a_json_body(svc):
    def broken(*a, **k):
        raise KeyError("boom")

    svc.service.ticket = broken

    async def script(http):
        r = await http.get("/v1/campaigns/a/intents/0", headers=svc.headers("a"))
        return r, await http.get("/v1/health")

    r, health = _run(svc, script)
    assert r.status_code == 500 and r.json() == {"detail": "internal error; this request failed"}
    assert health.json()["status"] == "ok"


def test_a_tick_that_raises_is_logged_and_the_ticks_go_on(tmp_path):
    svc = InProcessService(CONFIG, journal=tmp_path / "j.db")
    svc.service.tick = 0.01
    real = svc.broker.poll
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) <= 3:
            raise ZeroDivisionError("a bad tick")
        return real()

    svc.broker.poll = flaky

    async def script(http):
        end = time.monotonic() + 10
        while len(calls) < 6 and time.monotonic() < end:
            await asyncio.sleep(0.01)
        return await http.get("/v1/health")

    health = _run(svc, script)
    assert len(calls) >= 6 and svc.service.failed is None
    assert health.json()["status"] == "ok"


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_real_server_survives_an_out_of_range_request(server_factory, backend):
    """The request that used to stop the service (compiled) or hang it (reference)."""
    srv = server_factory({"pool": {"gpu": 16}, "campaigns": {"storm": {
        "credits": 8000, "ceiling": {"gpu": 16}, "sustained": {"gpu": 16}}}},
        name=backend, extra_args=["--backend", backend])
    h = {"Authorization": f"Bearer {srv.tokens['storm']}"}
    with httpx.Client(base_url=srv.url, headers=h, timeout=10) as http:
        r = http.post("/v1/campaigns/storm/intents",
                      json={"max": 1, "duration": 60, "max_spend": 9.3e12})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "max_spend"]
        r = http.post("/v1/campaigns/storm/intents", json={"max": 1, "duration": 60})
        assert r.status_code == 201, r.text
        assert http.get("/v1/health").json()["status"] == "ok"
