"""Connection bounds of ``bursar serve`` with real sockets against a real server: idle
keep-alive connections, connections that never send a request, half-sent headers and
half-sent bodies are closed; open connections are capped; a complete request (a long-poll)
is not cut short. Every wait is bounded."""

from __future__ import annotations

import socket
import time

import httpx
import pytest

ARGS = ["--keep-alive", "1", "--request-timeout", "1", "--max-connections", "12",
        "--max-longpoll", "3"]


@pytest.fixture(scope="module")
def srv(tmp_path_factory, base_config):
    from bursarcore.service.testing import ServerProcess

    s = ServerProcess(tmp_path_factory.mktemp("conn"), base_config, extra_args=ARGS).start()
    yield s
    s.stop()


def _connect(srv) -> socket.socket:
    host, port = srv.url.removeprefix("http://").rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=10)
    s.settimeout(10)
    return s


def _response(s: socket.socket) -> bytes:
    """One small JSON response, read whole."""
    got = b""
    while not (b"\r\n\r\n" in got and got.rstrip().endswith(b"}")):
        chunk = s.recv(65536)
        if not chunk:
            break
        got += chunk
    return got


def _closed_within(s: socket.socket, bound: float) -> tuple[float, bytes]:
    """Read until the server closes; the seconds it took and what it sent."""
    t0, got = time.monotonic(), b""
    s.settimeout(bound)
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk
    except socket.timeout:
        pytest.fail(f"the server kept the connection open over {bound} s (got {got[:80]!r})")
    except ConnectionResetError:
        pass
    return time.monotonic() - t0, got


def test_a_connection_that_never_sends_is_closed(srv):
    with _connect(srv) as s:
        took, got = _closed_within(s, 8)
    assert 0.5 < took < 4 and got.startswith(b"HTTP/1.1 408")


def test_half_sent_headers_are_answered_408_and_closed(srv):
    with _connect(srv) as s:
        s.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        took, got = _closed_within(s, 8)
    assert took < 4 and got.startswith(b"HTTP/1.1 408")


def test_a_stalled_body_is_closed(srv):
    tok = srv.tokens["alpha"].encode()
    with _connect(srv) as s:
        s.sendall(b"POST /v1/campaigns/alpha/intents HTTP/1.1\r\nHost: x\r\n"
                  b"Authorization: Bearer " + tok + b"\r\ncontent-type: application/json\r\n"
                  b"content-length: 100\r\n\r\n{\"max\": 1,")
        took, got = _closed_within(s, 8)
    assert took < 4 and b" 201 " not in got


def test_a_keep_alive_connection_idle_after_a_response_is_closed(srv):
    with _connect(srv) as s:
        s.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _response(s).startswith(b"HTTP/1.1 200")
        took, _ = _closed_within(s, 8)
    assert 0.5 < took < 4


def test_a_slow_but_steady_request_on_a_kept_connection_is_timed_per_request(srv):
    """Each request gets its own time: two requests on one connection, each inside it."""
    with _connect(srv) as s:
        for _ in range(2):
            s.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n")
            time.sleep(0.5)
            s.sendall(b"\r\n")
            assert _response(s).startswith(b"HTTP/1.1 200")
            time.sleep(0.5)


def test_a_long_poll_outlives_the_request_timeout(srv):
    h = {"Authorization": f"Bearer {srv.tokens['beta']}"}
    t0 = time.monotonic()
    r = httpx.get(f"{srv.url}/v1/campaigns/beta/events", params={"after": 1 << 40,
                                                                 "timeout": 2.5},
                  headers=h, timeout=10)
    assert r.status_code == 200 and time.monotonic() - t0 > 2


def test_open_connections_are_capped(srv):
    held = [_connect(srv) for _ in range(12)]
    try:
        time.sleep(0.2)                 # all accepted
        extra = _connect(srv)
        took, got = _closed_within(extra, 5)
        extra.close()
        assert took < 2 and got.startswith(b"HTTP/1.1 503")
    finally:
        for s in held:
            s.close()
    # the cap frees as connections close
    end = time.monotonic() + 5
    while True:
        r = httpx.get(f"{srv.url}/v1/health", timeout=5)
        if r.status_code == 200 or time.monotonic() > end:
            break
        time.sleep(0.05)
    assert r.status_code == 200
