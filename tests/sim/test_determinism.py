"""Same seed → the same journal, byte for byte; every backend decides the same."""

from __future__ import annotations

import pytest

from bursarcore.broker import BACKENDS, Broker
from bursarcore.sim import Simulation



TINY = {"scenario.duration": 800.0, "campaigns.storm.behaviour.start": 300.0,
        "campaigns.storm.behaviour.end": 600.0}


def _run(sc, backend=None):
    return Simulation(sc, backend=backend).run()


def _bytes(res):
    rows = res.journal.rows()
    return rows.tobytes(), dict(res.journal.payloads())


def test_same_seed_same_journal(short):
    sc = short(**TINY)
    a, b = _run(sc), _run(sc)
    assert _bytes(a) == _bytes(b)
    assert a.summary["campaigns"] == b.summary["campaigns"]


def test_other_seed_other_journal(short):
    sc = short(**TINY)
    a = _run(sc)
    b = _run(sc.with_changes(**{"scenario.seed": 8}))
    assert _bytes(a)[0] != _bytes(b)[0]


@pytest.mark.skipif(len(BACKENDS) < 2, reason="compiled engine not built (extensions off)")
def test_backends_write_the_same_journal(short):
    sc = short(**TINY, **{"tasksets.science.count": 300})
    assert _bytes(_run(sc, "compiled")) == _bytes(_run(sc, "reference"))


def test_journal_replays(short_result):
    """SPEC §9: replaying the run's journal into a fresh broker reproduces it."""
    b = Broker.replay(short_result.journal, resume=False)
    st = b.state()
    for name, d in short_result.summary["campaigns"].items():
        spent = st["campaigns"][name]["credits_spent"] + st["campaigns"][name]["credits_escrowed"]
        assert spent == pytest.approx(d["credits_spent"])
