"""Checkpoints (SPEC §13): atomic saves, verified loads, fallback past damage, pruning,
safe extraction. Manual clock; no sleeps."""

from __future__ import annotations

import io
import json
import logging
import os
import tarfile

import pytest

from bursarcore.errors import InvalidArgument
from bursarcore.runtime.checkpoint import Checkpoint, CheckpointError, CheckpointStore


def _workspace(path, files):
    path.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        p = path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return path


def _tree(path):
    out = {}
    for dirpath, dirnames, filenames in os.walk(path):
        for n in filenames:
            p = os.path.join(dirpath, n)
            rel = os.path.relpath(p, path)
            if os.path.islink(p):
                out[rel] = os.readlink(p)
            elif os.path.isfile(p):
                out[rel] = open(p, "rb").read()
            else:
                out[rel] = "special"
        for n in dirnames:
            p = os.path.join(dirpath, n)
            if os.path.islink(p):
                out[os.path.relpath(p, path)] = os.readlink(p)
    return out


@pytest.fixture
def store(tmp_path, clock):
    return CheckpointStore(tmp_path / "ck", clock=clock)


def test_round_trip_restores_files_links_and_state(tmp_path, store, clock):
    ws = _workspace(tmp_path / "ws", {"a.txt": b"alpha", "sub/deep/b.bin": os.urandom(70_000),
                                      "empty": b""})
    os.symlink("/usr/bin/python3", ws / "python")  # a venv-style link leaving the workspace
    os.symlink("a.txt", ws / "rel")
    os.mkfifo(ws / "fifo")  # not archivable: skipped, never restored
    before = _tree(ws)
    ck = store.save(str(ws), b"\x00agent state\xff")
    assert isinstance(ck, Checkpoint) and ck.seq == 1 and ck.created_at == clock.t
    assert ck.size == os.path.getsize(ck.archive) and len(ck.sha256) == 64
    # the agent goes on writing; restore must bring back exactly the saved workspace
    (ws / "a.txt").write_bytes(b"changed")
    (ws / "new-file").write_bytes(b"x")
    got = store.restore(str(ws))
    assert got is not None
    ck2, state = got
    assert ck2 == ck and state == b"\x00agent state\xff"
    after = _tree(ws)
    assert after == {k: v for k, v in before.items() if k != "fifo"}
    assert not os.path.exists(ws / "fifo") and not os.path.exists(ws / "new-file")
    assert [n for n in os.listdir(ws) if n.startswith(".restore")] == []


def test_latest_none_and_restore_leaves_workspace_alone(tmp_path, store):
    ws = _workspace(tmp_path / "ws", {"keep": b"1"})
    assert store.latest() is None
    assert store.restore(str(ws)) is None
    assert (ws / "keep").read_bytes() == b"1"


def _three(tmp_path, store, clock):
    ws = _workspace(tmp_path / "ws", {"f": b"v1"})
    cks = []
    for v in (b"v1", b"v2", b"v3"):
        (ws / "f").write_bytes(v)
        clock.advance(10)
        cks.append(store.save(str(ws), v))
    return ws, cks


def test_prune_keeps_newest(tmp_path, clock):
    store = CheckpointStore(tmp_path / "ck", keep=2, clock=clock)
    _three(tmp_path, store, clock)
    assert store.seqs() == [2, 3]
    store1 = CheckpointStore(tmp_path / "ck", keep=1, clock=clock)
    assert store1.prune() == [2]
    assert store1.seqs() == [3]


@pytest.mark.parametrize("damage", ["flip", "truncate", "no-manifest", "bad-manifest", "no-data"])
def test_broken_newest_falls_back_to_previous_and_is_logged(tmp_path, clock, caplog, damage):
    store = CheckpointStore(tmp_path / "ck", keep=3, clock=clock)
    ws, cks = _three(tmp_path, store, clock)
    newest = cks[-1]
    data, manifest = newest.archive, os.path.join(newest.path, "manifest.json")
    if damage == "flip":
        with open(data, "r+b") as f:
            f.seek(700)
            b = f.read(1)
            f.seek(700)
            f.write(bytes([b[0] ^ 0xFF]))
    elif damage == "truncate":
        os.truncate(data, newest.size // 2)
    elif damage == "no-manifest":
        os.unlink(manifest)
    elif damage == "bad-manifest":
        with open(manifest, "w") as f:
            f.write("{not json")
    else:
        os.unlink(data)
    caplog.set_level(logging.ERROR, "bursarcore.runtime.checkpoint")
    got = store.restore(str(ws))
    assert got is not None and got[0].seq == 2 and got[1] == b"v2"
    assert (ws / "f").read_bytes() == b"v2"
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "seq 3 is broken" in errors[0].getMessage()
    broken = os.listdir(tmp_path / "ck" / "broken")
    assert len(broken) == 1 and broken[0].startswith("ckpt-000003.")
    assert store.seqs() == [1, 2]
    # sequence numbers are never reused: a record that named 3 never meets another 3
    assert store.save(str(ws), b"v4").seq == 4


def test_all_broken_gives_none(tmp_path, clock, caplog):
    store = CheckpointStore(tmp_path / "ck", clock=clock)
    ws, cks = _three(tmp_path, store, clock)
    for ck in cks[-2:]:
        os.truncate(ck.archive, 10)
    assert store.latest() is None
    assert len(os.listdir(tmp_path / "ck" / "broken")) == 2


def test_verify_says_what_is_wrong(tmp_path, store, clock):
    ws, cks = _three(tmp_path, store, clock)
    os.truncate(cks[-1].archive, 100)
    with pytest.raises(CheckpointError, match="truncated"):
        store.verify(3)


def test_interrupted_save_is_never_published_and_is_cleaned(tmp_path, store, monkeypatch):
    ws = _workspace(tmp_path / "ws", {"f": b"v1"})
    store.save(str(ws), b"s1")
    real_fsync = os.fsync
    calls = []

    def failing_fsync(fd):
        calls.append(fd)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(OSError):
        store.save(str(ws), b"s2")
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert calls and store.seqs() == [1]
    assert [n for n in os.listdir(store.root) if n.startswith(".tmp")] == []
    # a crash (not an exception) leaves a temporary behind: latest ignores it, save removes it
    os.mkdir(os.path.join(store.root, ".tmp-000002-deadbeef"))
    assert store.latest().seq == 1
    assert store.save(str(ws), b"s2").seq == 2
    assert [n for n in os.listdir(store.root) if n.startswith(".tmp")] == []


def _forge(store, seq, members):
    """A checkpoint whose manifest matches its (hostile) archive."""
    import hashlib
    d = os.path.join(store.root, f"ckpt-{seq:06d}")
    os.makedirs(d)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for ti, data in members:
            tar.addfile(ti, io.BytesIO(data) if data is not None else None)
    raw = buf.getvalue()
    with open(os.path.join(d, "data.tar"), "wb") as f:
        f.write(raw)
    with open(os.path.join(d, "manifest.json"), "w") as f:
        json.dump({"format": 1, "seq": seq, "created_at": 0.0, "size": len(raw),
                   "sha256": hashlib.sha256(raw).hexdigest(), "state_size": 0,
                   "files": ["data.tar"]}, f)


def _member(name, data=b"", **kw):
    ti = tarfile.TarInfo(name)
    ti.size = len(data)
    for k, v in kw.items():
        setattr(ti, k, v)
    return ti, data


@pytest.mark.parametrize("hostile", [
    [_member("workspace/../../escaped", b"x")],
    [_member("/abs-escaped", b"x")],
    [_member("workspace/link", type=tarfile.SYMTYPE, linkname="/tmp"),
     _member("workspace/link/escaped", b"x")],
])
def test_hostile_archive_is_refused(tmp_path, store, hostile, caplog):
    ws = _workspace(tmp_path / "ws", {})
    os.makedirs(store.root)
    top = _member("workspace", type=tarfile.DIRTYPE, mode=0o755)[0]
    _forge(store, 1, [(top, None), *hostile, _member("agent-state", b"")])
    caplog.set_level(logging.ERROR, "bursarcore.runtime.checkpoint")
    assert store.restore(str(ws)) is None
    assert not (tmp_path / "escaped").exists() and not os.path.exists("/abs-escaped")
    assert not os.path.exists("/tmp/escaped")
    assert os.listdir(ws) == []
    assert any("cannot be extracted" in r.getMessage() for r in caplog.records)


def test_bad_arguments(tmp_path, store):
    with pytest.raises(InvalidArgument) as e:
        CheckpointStore(tmp_path, keep=0)
    assert e.value.field == "keep"
    ws = _workspace(tmp_path / "ws", {})
    with pytest.raises(InvalidArgument) as e:
        store.save(str(ws), "not bytes")  # type: ignore[arg-type]
    assert e.value.field == "state"
    with pytest.raises(CheckpointError, match="not a directory"):
        store.save(str(tmp_path / "missing"), b"")


def test_disk_error_during_restore_keeps_the_checkpoint(tmp_path, store, monkeypatch):
    ws = _workspace(tmp_path / "ws", {"f": b"v1"})
    store.save(str(ws), b"s")

    def full(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tarfile.TarFile, "extract", full)
    with pytest.raises(OSError):
        store.restore(str(ws))
    monkeypatch.undo()
    assert store.seqs() == [1] and not os.path.exists(os.path.join(store.root, "broken"))
    assert store.restore(str(ws))[1] == b"s"
