"""SPEC §14.2: a decision on a node of a tree records the level of its path whose ceiling,
bucket or budget bound it (the journal's ``level`` and ``level_figure``), and ``explain``
names that level when it is not the node itself. Every backend (``BURSARCORE_BACKEND``,
``BURSARCORE_NO_EXTENSIONS``), the single path and the batch."""

from __future__ import annotations

import math

import pytest

from bursarcore import Broker, Envelope, Intent, ManualClock, Pool
from bursarcore.journal import MemoryJournal, SQLiteJournal, export_jsonl, import_jsonl

pytestmark = pytest.mark.tree

INF = math.inf
TOKEN = 10**9               # unit·ns per unit-second
CREDIT = 10**6              # micro-credits per credit


def broker(cap: int = 1024) -> Broker:
    return Broker(Pool(gpu=cap), clock=ManualClock(0.0), journal=MemoryJournal())


def env(s: int, b: int | None = None, B: float = INF, credits: float = 1e6) -> Envelope:
    return Envelope(credits=credits, sustained={"gpu": s}, ceiling={"gpu": s if b is None else b},
                    burst={"gpu": B})


def ask(b: Broker, name: str, lo: int, hi: int, dur: float = 600.0):
    d = b.acquire(Intent(name, units={"gpu": (lo, hi)}, duration=dur))
    return d, b.journal.record(d.seq)


def survey() -> tuple[Broker, dict[str, int]]:
    """astro (ceiling 512) / astro/survey (1024) / astro/survey/agent-7 (1024)."""
    b = broker()
    ix = {"astro": b.register("astro", env(64, 512)),
          "astro/survey": b.register("astro/survey", env(64, 1024)),
          "astro/survey/agent-7": b.register("astro/survey/agent-7", env(64, 1024))}
    return b, ix


def test_a_grandparents_ceiling_binds_and_explain_names_it():
    b, ix = survey()
    d, r = ask(b, "astro/survey/agent-7", 1, 1024)
    assert (d.outcome, d.units) == ("granted", 512)
    assert (r["level"], r["level_figure"]) == (ix["astro"], 512)
    text = b.explain(d.seq)
    assert "the ceiling of `astro` (512 gpu) binds, not `astro/survey/agent-7`'s own" in text
    assert "allows 512 more" in text
    # the next request pends on astro's ceiling, which its child's record names too
    d, r = ask(b, "astro/survey", 1, 8)
    assert (d.outcome, d.reason) == ("pending", "ceiling")
    assert (r["level"], r["level_figure"]) == (ix["astro"], 512)
    assert "the ceiling of `astro` (512 gpu) binds, not `astro/survey`'s own" in b.explain(d.seq)


def test_a_parents_bucket_binds_its_child():
    """SPEC §14.2's worked numbers: lab's 3,600 GPU-s pay for lab/x's units above 8."""
    b = broker(64)
    lab = b.register("lab", env(8, 64, 3600))
    b.register("lab/x", env(64))
    d, r = ask(b, "lab/x", 1, 64)
    assert d.units == 14
    assert (r["level"], r["level_figure"]) == (lab, 3600 * TOKEN)
    text = b.explain(d.seq)
    assert "the prepaid token bucket of `lab` binds, not `lab/x`'s own" in text
    assert "it holds 3,600 unit-seconds, which pay for at most 14 gpu" in text
    # its bucket now empty, lab's next grant to its child is refused for tokens at lab
    d, r = ask(b, "lab/x", 1, 1)
    assert (d.outcome, d.reason) == ("pending", "tokens")
    assert (r["level"], r["level_figure"]) == (lab, 0)
    assert "the prepaid token bucket of `lab` binds" in b.explain(d.seq)


def test_a_grandparents_budget_binds():
    """ops has 6 credits; its team and bot have no budget of their own: at 3 credits per
    GPU-hour the bot gets 2 GPUs for an hour."""
    b = broker(64)
    ops = b.register("ops", env(8, credits=6))
    b.register("ops/team", env(8, credits=INF))
    b.register("ops/team/bot", env(8, credits=INF))
    d, r = ask(b, "ops/team/bot", 1, 8, dur=3600)
    assert (d.units, d.cost) == (2, 6.0)
    assert (r["level"], r["level_figure"]) == (ops, 6 * CREDIT)
    text = b.explain(d.seq)
    assert "the budget of `ops` binds, not `ops/team/bot`'s own" in text
    assert "6.00 credits left pay for at most 2 gpu" in text


def test_the_nodes_own_rule_binds_and_ties_go_to_the_node():
    b = broker()
    b.register("astro", env(64, 512))
    own = b.register("astro/survey", env(64, 100))
    d, r = ask(b, "astro/survey", 1, 1024)
    assert d.units == 100
    assert (r["level"], r["level_figure"]) == (own, 100)
    text = b.explain(d.seq)
    assert "the ceiling binds — the campaign holds 0 gpu and the ceiling allows 100 more" in text
    assert "not `" not in text
    # astro now allows its subtree 412 more, as does a child whose own ceiling is 412: a tie
    tie = b.register("astro/twin", env(64, 412))
    d, r = ask(b, "astro/twin", 1, 1024)
    assert d.units == 412
    assert (r["level"], r["level_figure"]) == (tie, 412)
    assert "not `" not in b.explain(d.seq)


def test_a_flat_campaign_is_its_own_level_and_a_whole_grant_has_none():
    b = broker()
    c = b.register("solo", env(8, 16))
    d, r = ask(b, "solo", 1, 64)
    assert d.units == 16 and (r["level"], r["level_figure"]) == (c, 16)
    d, r = ask(b, "solo", 1, 1, dur=60)
    assert d.units == 0 and (r["level"], r["level_figure"]) == (c, 16)  # pending: ceiling
    b.register("pair", env(8, 16))
    d, r = ask(b, "pair", 4, 4)
    assert d.outcome == "granted" and (r["level"], r["level_figure"]) == (-1, 0)


def test_the_batch_records_the_level_as_the_single_path_does():
    b, ix = survey()
    b2, _ = survey()
    c = ix["astro/survey/agent-7"]
    b.admit_batch([c, c], [[1, 1024], [1, 1]], 600.0)
    for _ in range(2):
        ask(b2, "astro/survey/agent-7", *((1, 1024) if _ == 0 else (1, 1)))
    rows, rows2 = b.journal.rows(), b2.journal.rows()
    acq = rows[rows["op"] == 2]
    acq2 = rows2[rows2["op"] == 2]
    assert acq["level"].tolist() == acq2["level"].tolist() == [ix["astro"], ix["astro"]]
    assert acq["level_figure"].tolist() == acq2["level_figure"].tolist() == [512, 512]


@pytest.mark.parametrize("sink", ["jsonl", "sqlite"])
def test_levels_round_trip_through_the_journals_and_replay(tmp_path, sink):
    b, ix = survey()
    d, _ = ask(b, "astro/survey/agent-7", 1, 1024)
    src = b.journal
    if sink == "jsonl":
        export_jsonl(src, tmp_path / "j.jsonl")
        j = import_jsonl(tmp_path / "j.jsonl")
    else:
        j = SQLiteJournal(tmp_path / "j.db", create=True)
        j.append(src.rows(), src.payloads())
        j.flush()
        j.close()
        j = SQLiteJournal(tmp_path / "j.db")
    assert j.rows().tobytes() == src.rows().tobytes()
    assert j.record(d.seq)["level"] == ix["astro"]
    again = Broker.replay(j, clock=ManualClock(b.clock.now()), resume=False)
    assert again.state() == b.state()
