"""``bursar serve --stream-window N --stream-frame N``: the decision stream's window and
frame size, observed on a real server on loopback (bounded waits)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bursarcore.service.testing import ServerProcess
from stream_stall import metric, stalled

websockets = pytest.importorskip("websockets")
msgpack = pytest.importorskip("msgpack")

WINDOW, FRAME = 40, 10


@pytest.fixture(scope="module")
def small(tmp_path_factory, base_config):
    srv = ServerProcess(tmp_path_factory.mktemp("flags"), base_config, extra_args=[
        "--stream-window", str(WINDOW), "--stream-frame", str(FRAME)]).start()
    yield srv
    srv.stop()


def _connect(srv, who="alpha"):
    from websockets.sync.client import connect

    return connect(srv.url.replace("http", "ws") + "/v1/stream?events=false",
                   additional_headers={"Authorization": f"Bearer {srv.tokens[who]}"},
                   compression=None)


def _consume(i: int) -> dict:
    return {"id": i, "op": "consume", "dim": "fs", "amount": 0.0}


def test_the_frame_size_bounds_the_frames_both_ways(small):
    with _connect(small) as ws:
        ws.send(msgpack.packb([_consume(i) for i in range(FRAME + 1)]))
        err = msgpack.unpackb(ws.recv(timeout=10))
        assert err["type"] == "error" and err["status"] == 422
        assert err["detail"][0]["msg"] == f"must hold 1 to {FRAME} messages"
        # frames of FRAME messages, answered in frames of at most FRAME answers
        n = 3
        for k in range(n):
            ws.send(msgpack.packb([_consume(k * FRAME + i) for i in range(FRAME)]))
        ids = []
        while len(ids) < n * FRAME:
            doc = msgpack.unpackb(ws.recv(timeout=10))
            doc = doc if isinstance(doc, list) else [doc]
            assert 1 <= len(doc) <= FRAME
            ids += [d["id"] for d in doc]
        assert ids == list(range(n * FRAME))


def test_the_window_bounds_what_a_client_that_does_not_read_has_in_flight(small):
    """The client sends and never reads: the server stops reading it once the window is
    full, and no more than the window's messages were ever in flight — but as many as
    the window allows (a full frame no longer fits: more than WINDOW - FRAME)."""
    op = small.tokens["operator"]
    ws = _connect(small).__enter__()
    frame = json.dumps([_consume(i) for i in range(FRAME)])
    with stalled(ws, frame, FRAME, small.url, op):
        peak = metric(small.url, op, "bursar_stream_inflight_peak")
        assert WINDOW - FRAME < peak <= WINDOW
        assert metric(small.url, op, "bursar_stream_inflight") <= WINDOW


@pytest.mark.parametrize("args, problem", [
    (["--stream-frame", "50", "--stream-window", "10"],
     "--stream-frame: must be at most --stream-window (10) (got 50)"),
    (["--stream-window", "0"], "argument --stream-window: must be a whole number >= 1"),
    (["--stream-frame", "x"], "argument --stream-frame: must be a whole number"),
])
def test_stream_flags_out_of_range_are_refused(tmp_path, args, problem):
    p = subprocess.run([sys.executable, "-m", "bursarcore", "serve", "--memory",
                        "--tokens", str(tmp_path / "t.json"), *args],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and problem in p.stderr, p.stderr
