"""``bursar bench --quick``: the command runs, and its table has the rows it promises.

``--tiny`` (hidden) shrinks every size so this stays well under a few seconds; the figures
themselves are not checked, only that each row is there with a rate or a reason.
"""

from __future__ import annotations

import re
import time

import pytest

from bursarcore import bench
from bursarcore.__main__ import build_parser, main
from bursarcore.buckets import BACKENDS

RATE = re.compile(r"\d[\d.]* [kM]/s")


def test_bench_quick_tiny_prints_the_table(capsys):
    t0 = time.perf_counter()
    assert main(["bench", "--quick", "--tiny"]) == 0
    assert time.perf_counter() - t0 < 3.0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith("bursarcore bench: ")

    def rows(label):
        return [line for line in lines if line.startswith(label)]

    compiled = "cython" in BACKENDS
    assert len(rows("compiled try_debit, single calls")) == 1
    batch = rows("compiled try_debit_batch")
    assert len(batch) == 2                                  # the small and the large table
    buckets = [bench.TINY.small_buckets, bench.TINY.large_buckets]
    for line, n in zip(batch, buckets):
        assert f"{n:,}" in line or not compiled
    for line in rows("compiled"):
        assert bool(RATE.search(line)) == compiled
        assert compiled or "unavailable" in line
    for label in ("reference try_debit, single calls", "reference try_debit_batch"):
        (line,) = rows(label)
        assert RATE.search(line)
    for peer in bench.PEERS.values():
        (line,) = rows(peer.label)
        assert RATE.search(line) or "not installed" in line or "failed" in line
    assert "compiled / reference, batched" in out


def test_bench_no_peers_skips_them(capsys):
    assert main(["bench", "--quick", "--tiny", "--no-peers"]) == 0
    out = capsys.readouterr().out
    assert all(peer.label not in out for peer in bench.PEERS.values())


def test_missing_peer_is_reported_not_raised(monkeypatch, capsys):
    monkeypatch.setattr(bench, "peer_version", lambda dist: None)
    rep = bench.run(bench.TINY)
    for name, peer in bench.PEERS.items():
        row = rep.get(f"peer:{name}")
        assert row.rate is None and row.note == f"not installed (pip install {peer.dist})"


def test_a_command_is_required():
    with pytest.raises(SystemExit):
        build_parser().parse_args([])
