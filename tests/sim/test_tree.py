"""The `tree` scenario: a tree of envelopes (SPEC §14) under a storm inside one project, a
lender waking mid-run, and another project whose guarantees must never move."""

from __future__ import annotations

import copy
import dataclasses

import pytest

from bursarcore.broker import BACKENDS
from bursarcore.sim import ScenarioError, Simulation, builtin_scenarios, load_scenario
from bursarcore.sim import parse_scenario, render_html
from bursarcore.sim.metrics import guarantee_violations


def _run(backend=None, sc=None):
    sim = Simulation(sc or load_scenario("tree"), backend=backend)
    return sim, sim.run()


@pytest.fixture(scope="module", params=BACKENDS)
def tree_run(request):
    return _run(request.param)


def _bytes(res):
    return res.journal.rows().tobytes(), dict(res.journal.payloads())


def test_tree_is_shipped_and_listed(capsys):
    from bursarcore.__main__ import main

    assert "tree" in builtin_scenarios()
    assert main(["simulate", "--list"]) == 0
    assert "tree " in capsys.readouterr().out
    sc = load_scenario("tree")
    assert sc.is_tree and [n.name for n in sc.nodes][:3] == ["astro", "astro/survey",
                                                             "astro/transient"]
    # guarantees nest: every node's children within it, the projects within the pool
    envs = {n.name: n.envelope for n in sc.nodes} | {c.name: c.envelope for c in sc.campaigns}
    for name, env in envs.items():
        kids = [e.g("gpu") for n, e in envs.items() if n.rpartition("/")[0] == name]
        assert sum(kids) <= env.g("gpu"), name
    assert sum(e.g("gpu") for n, e in envs.items() if "/" not in n) <= 256


def test_the_checks_hold_on_every_backend(tree_run):
    sim, res = tree_run
    tree = res.summary["tree"]
    assert tree["checks"] == {"isolation": True, "wakers_within_grace": True, "ceilings": True}
    bio = tree["projects"]["bio"]
    assert not bio["storm_inside"] and tree["projects"]["astro"]["storm_inside"]
    assert bio["within_guarantee"] > 100 and bio["violations"] == 0
    # the storm was denied at every rule a tree binds it by: the pool's capacity (its firm
    # leases above the unpromised units), astro's ceiling, astro's bucket
    denied: dict[str, int] = {}
    for d in tree["storm"].values():
        for k, n in d["denied"].items():
            denied[k] = denied.get(k, 0) + n
    assert {"capacity", "ceiling", "tokens"} <= set(denied)
    assert set(tree["storm"]) == {"agent-burst", "opportunistic"}
    # the lenders woke (astro/transient's at 30 min, astro/survey/agent-4, whose guarantee
    # was lent, at 40) and were granted their guarantees within the grace
    assert {n: w["asked_at"] for n, w in tree["wakers"].items()} == {
        "astro/survey/agent-4": 2400.0, "astro/transient/agent-0": 1800.0,
        "astro/transient/agent-1": 1800.0}
    for w in tree["wakers"].values():
        assert w["units"] == w["guaranteed"] == 32
        assert w["answer"] == "granted" and w["wait"] <= sim.sc.broker["grace"]
    # SPEC §14.8: agent-4's was taken back from the borrowers, on the reclaim path
    assert tree["wakers"]["astro/survey/agent-4"]["path"] == "reclaim"


def test_holdings_per_level_add_up(tree_run):
    sim, res = tree_run
    nodes = res.summary["tree"]["nodes"]
    assert len(res.summary["tree"]["checkpoints"]) == len(nodes["astro"]["held_at"])
    for name, d in nodes.items():
        kids = [k for k, x in nodes.items() if x["parent"] == name]
        if kids:      # interior nodes hold no leases of their own here
            sums = [sum(nodes[k]["held_at"][i] for k in kids) for i in range(len(d["held_at"]))]
            assert d["held_at"] == sums, name
        assert d["max_held"] <= d["ceiling"]
        grid = res.series["t"]
        at = [int(res.series["tree_held"][name][abs(grid - t).argmin()])
              for t in res.summary["tree"]["checkpoints"]]
        assert d["held_at"] == at, name
    # the waker's guarantee stayed reserved in astro's ceiling: astro/survey never held
    # more than astro's ceiling less astro/transient's guarantee
    astro, tr = nodes["astro"], nodes["astro/transient"]
    assert nodes["astro/survey"]["max_held"] <= astro["ceiling"] - tr["guaranteed"]
    # SPEC §14.8: the firm storm agents borrowed agent-4's idle guarantee (16 each beyond
    # their own 16) until agent-4 woke, when each borrowed lease was preempted
    for a in ("astro/survey/agent-0", "astro/survey/agent-1"):
        assert nodes[a]["borrowed"] > 0 and nodes[a]["borrowed_preempted"] >= 1, a
        assert nodes[a]["max_held"] == 32, a
    assert nodes["astro/survey/agent-4"]["borrowed"] == 0
    assert nodes["astro/transient/agent-0"]["borrowed"] == 0      # not a sibling
    # and astro/transient held its guarantee from the wake-up to the end
    cps = res.summary["tree"]["checkpoints"]
    assert all(h == tr["guaranteed"] for t, h in zip(cps, tr["held_at"]) if 1800 <= t < 3600)


def test_isolation_is_read_from_the_decisions(tree_run):
    """The check counts what the broker answered: a within-guarantee request of bio answered
    `pending` for a ceiling, or never active, is a violation."""
    sim, res = tree_run
    grace, T = sim.sc.broker["grace"], sim.duration
    reqs = sim.ledger.requests
    n, bad = guarantee_violations(reqs, sim.names, grace, T, under="bio")
    assert n == res.summary["tree"]["projects"]["bio"]["within_guarantee"] and bad == []
    i = next(k for k, r in enumerate(reqs) if r.within_guarantee
             and sim.names[r.campaign].startswith("bio/") and r.t < T / 2)
    for change, why in ((dict(answer="pending", answer_reason="ceiling"), "pending (ceiling)"),
                        (dict(answer="refused", answer_reason="capacity"), "refused (capacity)"),
                        (dict(t_active=None), "not active within the grace"),
                        (dict(t_active=reqs[i].t + grace + 1.0), "active after")):
        forged = copy.copy(reqs)
        forged[i] = dataclasses.replace(reqs[i], **change)
        n2, bad = guarantee_violations(forged, sim.names, grace, T, under="bio")
        assert n2 == n and len(bad) == 1 and bad[0]["why"].startswith(why), bad
    # a budget that cannot pay is not a squeeze (SPEC §14.3 claim 1 excepts credits)
    forged = copy.copy(reqs)
    forged[i] = dataclasses.replace(reqs[i], answer="refused", answer_reason="credits")
    assert guarantee_violations(forged, sim.names, grace, T, under="bio")[1] == []


def test_same_seed_same_report_other_seed_other_journal():
    a, b = _run()[1], _run()[1]
    assert _bytes(a) == _bytes(b)
    assert a.to_json()["summary"] == b.to_json()["summary"]
    c = _run(sc=load_scenario("tree").with_changes(**{"scenario.seed": 8}))[1]
    assert _bytes(a)[0] != _bytes(c)[0]


@pytest.mark.skipif(len(BACKENDS) < 2, reason="compiled engine not built (extensions off)")
def test_backends_write_the_same_journal_and_tree():
    a, b = _run("compiled")[1], _run("reference")[1]
    assert _bytes(a) == _bytes(b)
    assert a.to_json()["summary"]["tree"] == b.to_json()["summary"]["tree"]


def test_report_and_command_line_show_the_tree(tree_run, tmp_path, capsys):
    from bursarcore.__main__ import main

    _, res = tree_run
    page = render_html(res, figs={})
    assert "Tree of envelopes" in page and "astro/transient" in page
    assert main(["simulate", "tree", "--out", str(tmp_path / "o"), "--duration", "1200"]) == 0
    out = capsys.readouterr().out
    assert "tree check isolation: holds" in out and "project bio:" in out
    assert "storm (agent-burst, 2 agents)" in out


@pytest.mark.parametrize("change, field, rule", [
    (lambda d: d["nodes"].pop(1), "campaigns[0].name", "must be declared first"),
    (lambda d: d["nodes"][1]["envelope"].update(guaranteed={"gpu": 130}, sustained={"gpu": 130},
                                                ceiling={"gpu": 200}),
     "nodes[1].envelope.guaranteed.gpu", "children of 'astro'"),
    (lambda d: d["campaigns"][0].update(name="astro//x"), "campaigns[0].name", "empty segment"),
    (lambda d: d["nodes"][3]["envelope"].update(guaranteed={"gpu": 160}, sustained={"gpu": 160},
                                                ceiling={"gpu": 160}),
     "nodes[3].envelope.guaranteed.gpu", "above the pool"),
    (lambda d: d["campaigns"][4]["behaviour"].update(units=40), "campaigns[4].behaviour.units",
     "ceiling"),
])
def test_tree_errors_name_the_field(change, field, rule):
    doc = copy.deepcopy(load_scenario("tree").raw)
    change(doc)
    with pytest.raises(ScenarioError) as ei:
        parse_scenario(doc)
    assert ei.value.field == field and rule in ei.value.rule, str(ei.value)


def test_flat_scenarios_are_not_trees():
    for name in ("default", "overbooked"):
        sc = load_scenario(name)
        assert not sc.is_tree and sc.nodes == []


def test_guarantees_hold_with_backfill_filling_the_pool():
    """The same tree with opportunistic backfill keeping the pool full, so that guarantees
    are granted on the reclaim path: every one must still be active within the grace."""
    doc = copy.deepcopy(load_scenario("tree").raw)
    doc["campaigns"].append({
        "name": "backfill", "agent": "backfill", "credits": "unlimited",
        "envelope": {"sustained": {"gpu": 256}, "ceiling": {"gpu": 256},
                     "burst": {"gpu": "unlimited"}},
        "behaviour": {"headroom": 0}})
    sim, res = _run(sc=parse_scenario(doc))
    tree = res.summary["tree"]
    assert tree["projects"]["bio"]["granted_reclaim"] > 0
    assert tree["checks"]["isolation"], tree["projects"]["bio"]["first_violations"]
