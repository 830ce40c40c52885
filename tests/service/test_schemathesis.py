"""Schemathesis against the live server's ``/openapi.json`` on loopback: generated and
boundary requests to every operation, as the operator and as a campaign; no 5xx, and
every response (status code, content type, headers, body) matches the schema.

The columnar batches are sent in both their forms (JSON, and the same fields packed as
MessagePack). The server-sent-events stream is left out (its response is a stream, not a document);
``test_service_api.py`` reads it."""

from __future__ import annotations

import os

import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, settings  # noqa: E402
from schemathesis.checks import (  # noqa: E402
    content_type_conformance,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

msgpack = pytest.importorskip("msgpack")


def _packable(v):
    """``v`` with integers MessagePack cannot hold (beyond 64 bits) as doubles: still out
    of every range the API accepts, so the server must refuse them, but sendable."""
    if isinstance(v, bool):
        return v
    if isinstance(v, int):
        return v if -(1 << 63) <= v < (1 << 64) else float(v)
    if isinstance(v, dict):
        return {k: _packable(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_packable(x) for x in v]
    return v


@schemathesis.serializer("application/msgpack")
def _msgpack(ctx, value):
    """The columnar batches' binary form: the generated fields packed as MessagePack
    (bytes, where the generator made them, go as they are: malformed bodies)."""
    if isinstance(value, bytes):
        return value
    return msgpack.packb(_packable(value), use_bin_type=True)


CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_headers_conformance, response_schema_conformance]


@pytest.fixture(scope="module")
def live(tmp_path_factory, base_config):
    from bursarcore.service.testing import ServerProcess

    srv = ServerProcess(tmp_path_factory.mktemp("fuzz"), base_config,
                        extra_args=["--auth-fail-rate", "0", "--max-longpoll", "0.2"]).start()
    yield srv
    srv.stop()
    log = srv.log()
    assert "Traceback" not in log, log[-3000:]


@pytest.fixture(scope="module")
def api_schema(live):
    return schemathesis.openapi.from_url(f"{live.url}/openapi.json", timeout=10)


schema = schemathesis.pytest.from_fixture("api_schema").exclude(path_regex=r"/events/stream$")


# a handful of generated cases per operation keeps the default run short; raise it with
# BURSAR_FUZZ_EXAMPLES (schemathesis' boundary-value cases come on top)
_SETTINGS = settings(max_examples=int(os.environ.get("BURSAR_FUZZ_EXAMPLES", "6")), deadline=None, derandomize=True, database=None,
                     suppress_health_check=list(HealthCheck))


def _run(case, live, who):
    case.call_and_validate(base_url=live.url,
                           headers={"Authorization": f"Bearer {live.tokens[who]}"},
                           checks=CHECKS, timeout=30)


@schema.parametrize()
@_SETTINGS
def test_api_conforms_as_operator(case, live):
    _run(case, live, "operator")


@schema.parametrize()
@_SETTINGS
def test_api_conforms_as_a_campaign(case, live):
    _run(case, live, "alpha")
