"""The direct path of ``POST /v1/campaigns/{campaign}/intents`` (service/fastpath.py)
answers exactly as the FastAPI route does: two services on the same configuration and
the same manual clock, one with the direct path and one without, get the same requests
and must give the same answers, byte for byte (status, body, headers)."""

from __future__ import annotations

import asyncio
import copy

import httpx
import pytest

from bursarcore.service.app import ServiceSettings
from bursarcore.service.testing import InProcessService


HEADERS = ("content-type", "content-length", "location", "retry-after", "x-bursar-time",
           "cache-control", "www-authenticate")


def _requests(tokens: dict[str, str]) -> list[tuple[str, dict, bytes | None]]:
    """(path, headers, body) of every kind of single-intent request."""
    a = {"Authorization": f"Bearer {tokens['alpha']}", "Content-Type": "application/json"}
    op = {"Authorization": f"Bearer {tokens['operator']}", "Content-Type": "application/json"}
    alpha = "/v1/campaigns/alpha/intents"
    return [
        (alpha, a, b'{"max": 8, "duration": 60}'),                       # granted
        (alpha, a, b'{"min": 1, "max": 4, "duration": 600.5}'),
        (alpha, {**a, "Content-Type": "application/json; charset=utf-8"},
         b'{"max": 2, "duration": 60, "max_spend": 1000}'),
        (alpha, a, b'{"max": 64, "duration": 60}'),                      # refused: ceiling
        ("/v1/campaigns/gamma/intents", op, b'{"max": 60, "duration": 60}'),
        (alpha, a, b'{"max": 30, "duration": 60, "ttl": 30}'),
        (alpha, a, b'{"max": 1, "duration": 60, "deadline": 1.0}'),        # refused: deadline
        (alpha, a, b'{"max": 0, "duration": 60}'),                       # 422: the model
        (alpha, a, b'{"max": 1, "duration": 60, "bogus": 1}'),
        (alpha, a, b'{"max": 1.0, "duration": 60}'),
        (alpha, a, b'{"max": 1, "duration": NaN}'),
        (alpha, a, b'{"max": 1, '),                                      # not JSON
        (alpha, a, b'[1, 2]'),
        (alpha, a, b''),
        (alpha, a, b'{"max": 1, "duration": 60, "dim": "cpu"}'),         # 422: intent_of
        (alpha, a, b'{"max": 1, "duration": 60, "service_class": "nope"}'),
        (alpha, a, b'{"max": 1, "duration": 60, "max_spend": 9.3e12}'),
        (alpha, {**a, "Content-Type": "text/plain"}, b'{"max": 1, "duration": 60}'),
        (alpha, {"Authorization": a["Authorization"]}, b'{"max": 1, "duration": 60}'),
        ("/v1/campaigns/beta/intents", a, b'{"max": 1, "duration": 60}'),   # not theirs
        ("/v1/campaigns/nope/intents", op, b'{"max": 1, "duration": 60}'),  # none such
        ("/v1/campaigns/" + "x" * 129 + "/intents", op, b'{"max": 1, "duration": 60}'),
        (alpha, {**a, "Authorization": "Bearer wrong"}, b'{"max": 1, "duration": 60}'),
        (alpha, {**a, "Authorization": "Basic abc"}, b'{"max": 1, "duration": 60}'),
        (alpha, {"Content-Type": "application/json"}, b'{"max": 1, "duration": 60}'),
        (alpha + "/", a, b'{"max": 1, "duration": 60}'),
        (alpha, a, b'{"max": 1, "duration": 60}' + b" " * (1 << 20)),    # 413
        ("/v1/campaigns/beta/intents", op, b'{"max": 16, "duration": 60}'),
        (alpha, a, b'{"max": 32, "duration": 60, "min": 2}'),
    ]


def _answers(svc: InProcessService, requests: list) -> list[tuple]:
    async def run() -> list[tuple]:
        out = []
        transport = httpx.ASGITransport(app=svc.app)
        async with svc.app.router.lifespan_context(svc.app), \
                httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            for path, headers, body in requests:
                r = await http.post(path, headers=headers, content=body)
                out.append((r.status_code, r.content,
                            {h: r.headers.get(h) for h in HEADERS}))
        return out

    return asyncio.run(run())


def _pair(config: dict, tmp_path=None, **settings):
    """Two services on the same configuration and clock, with the same tokens: the first
    answers on the direct path, the second through the FastAPI route only."""
    from bursarcore.service.app import create_app

    settings = {"rate": 0, "auth_fail_rate": 0, **settings}
    made = []
    for direct in (True, False):
        journal = None if tmp_path is None else tmp_path / f"{direct}.db"
        svc = InProcessService(copy.deepcopy(config), journal=journal)
        if made:
            svc.store, svc.tokens = made[0].store, made[0].tokens
        svc.app = create_app(svc.service, svc.store,
                             ServiceSettings(direct=direct, **settings))
        made.append(svc)
    return made


@pytest.mark.parametrize("journal", ["memory", "sqlite"])
def test_the_direct_path_answers_as_the_route_does(base_config, tmp_path, journal):
    direct, routed = _pair(base_config, tmp_path if journal == "sqlite" else None)
    reqs = _requests(direct.tokens)
    ours, theirs = _answers(direct, reqs), _answers(routed, reqs)
    assert {200, 201, 202, 401, 404, 413, 422} <= {s for s, _, _ in ours}
    for i, (a, b) in enumerate(zip(ours, theirs)):
        assert a == b, (i, reqs[i][2][:60], a, b)


def test_the_direct_path_answers_the_plain_case_and_hands_on_the_rest(base_config, tmp_path):
    svc, _ = _pair(base_config, tmp_path)
    seen = []
    real = svc.app.direct._decide

    async def spy(scope, *a, **k):
        seen.append(scope["path"])
        return await real(scope, *a, **k)

    svc.app.direct._decide = spy
    reqs = _requests(svc.tokens)
    got = _answers(svc, reqs[:3] + reqs[7:9])
    assert [s for s, _, _ in got] == [201, 201, 201, 422, 422]
    assert len(seen) == 3                # the two invalid bodies went to the route


def test_the_rate_limit_holds_on_the_direct_path(base_config, tmp_path):
    direct, routed = _pair(base_config, tmp_path, rate=0.001, burst=2.0)
    reqs = _requests(direct.tokens)
    reqs = [reqs[0]] * 4 + [reqs[7]]
    ours, theirs = _answers(direct, reqs), _answers(routed, reqs)
    assert [s for s, _, _ in ours] == [201, 201, 429, 429, 429]
    assert ours == theirs


def test_the_direct_path_is_timed_under_its_route(base_config, tmp_path):
    svc, _ = _pair(base_config, tmp_path)
    _answers(svc, _requests(svc.tokens)[:2])
    n = svc.app.state.metrics.registry.get_sample_value(
        "bursar_http_responses_total",
        {"method": "POST", "route": "/v1/campaigns/{campaign}/intents", "status": "201"})
    assert n == 2.0
