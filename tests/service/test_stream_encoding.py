"""The decision stream's answer frames: answers are encoded a slice at a time and joined
into frames without decoding them again; a frame is the one message alone or an array,
in MessagePack or JSON, with msgspec or with msgpack and json when msgspec is missing."""

from __future__ import annotations

import json
import math

import pytest

from bursarcore.service import stream

msgpack = pytest.importorskip("msgpack")


def _docs(n: int) -> list[dict]:
    return [{"id": i, "type": "decision", "decision": {"units": i, "cost": i / 3,
                                                       "retry_after": math.inf if i % 7 == 0
                                                       else None, "name": "é" * (i % 3)}}
            for i in range(n)]


def _decoded(frame, binary):
    return msgpack.unpackb(frame) if binary else json.loads(frame)


@pytest.fixture(params=["msgspec", "fallback"])
def encoders(request, monkeypatch):
    if request.param == "fallback":
        monkeypatch.setattr(stream, "_MP", None)
        monkeypatch.setattr(stream, "_JS", None)
    elif stream._MP is None:
        pytest.skip("msgspec is not installed")
    return request.param


@pytest.mark.parametrize("binary", [True, False])
@pytest.mark.parametrize("sizes", [[1], [2], [15], [16], [1, 15], [15, 1, 1], [200, 3],
                                   [70_000], [1, 65_535, 1]])
def test_chunks_join_into_one_frame(encoders, binary, sizes):
    docs = _docs(sum(sizes))
    bodies, at = [], 0
    for k in sizes:
        bodies.append(stream._body(docs[at:at + k], binary))
        at += k
    frame = stream._array(bodies, len(docs), binary)
    assert isinstance(frame, bytes if binary else str)
    want = docs[0] if len(docs) == 1 else docs
    if not binary:      # JSON has no infinity: null
        want = json.loads(json.dumps(stream.json_safe(want)))
    assert _decoded(frame, binary) == want


@pytest.mark.parametrize("binary", [True, False])
def test_an_unacknowledged_chunk_answers_503_for_its_decisions(encoders, binary):
    docs = _docs(3) + [{"id": 9, "type": "error", "status": 422, "detail": "x"}]
    c = stream._Chunk(stream._body(docs, binary), 4, 4, 10, binary)
    stream._unacknowledged(c, "the journal cannot be written")
    got = _decoded(stream._array([c.body], c.n, binary), binary)
    assert [d["status"] for d in got] == [503, 503, 503, 422]
    assert [d["id"] for d in got] == [0, 1, 2, 9]
