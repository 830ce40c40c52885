"""Scenarios are data: TOML, validated with errors that name the field path."""

from __future__ import annotations

import copy
import math

import pytest

from bursarcore.errors import InvalidArgument
from bursarcore.sim import ScenarioError, builtin_scenarios, load_scenario, parse_scenario


def raw():
    return copy.deepcopy(load_scenario("default").raw)


def test_default_is_spec_10():
    sc = load_scenario()
    assert sc.name == "default" and sc.duration == 7200 and sc.seed == 7
    assert sc.pool.capacity == {"gpu": 512}
    assert sc.pool.flow == {"fs": 28.0, "inference": 5000.0}
    assert sc.broker["grace"] == 60.0
    assert sc.tasksets["science"].params["count"] == 3000
    env = {c.name: c.envelope for c in sc.campaigns}
    assert (env["victim"].g("gpu"), env["victim"].s("gpu"), env["victim"].b("gpu"),
            env["victim"].B("gpu")) == (32, 32, 64, 60000)
    for n in ("adaptive-sci", "naive-sci"):
        e = env[n]
        assert (e.credits, e.g("gpu"), e.s("gpu"), e.b("gpu"), e.B("gpu")) == (20000, 64, 128, 384, 300000)
        assert (e.s("fs"), e.B("fs"), e.b("fs")) == (6.0, 3600.0, 16.0)
        assert (e.s("inference"), e.B("inference"), e.b("inference")) == (500.0, 100000.0, 2000.0)
    s = env["storm"]
    assert (s.credits, s.g("gpu"), s.s("gpu"), s.b("gpu"), s.B("gpu")) == (8000, 16, 64, 384, 150000)
    assert (s.s("inference"), s.B("inference"), s.b("inference")) == (50.0, 5000.0, 500.0)
    bf = sc.campaign("backfill")
    assert math.isinf(bf.envelope.credits) and math.isinf(bf.envelope.B("gpu"))
    assert bf.behaviour["headroom"] == 160 and bf.service_class == "opportunistic"
    st = sc.campaign("storm").behaviour
    assert (st["start"], st["end"]) == (3600.0, 5400.0)


def test_builtin_scenarios_all_load():
    names = builtin_scenarios()
    assert {"default", "large", "no-backfill", "overbooked"} <= set(names)
    for n in names:
        load_scenario(n)


@pytest.mark.parametrize("path, value, field, rule", [
    ("scenario.duration", -5, "scenario.duration", "must be > 0"),
    ("scenario.duration", "long", "scenario.duration", "must be a number"),
    ("scenario.colour", 1, "scenario.colour", "unknown field"),
    ("pool.gpu", 0, "pool.gpu", "must be >= 1"),
    ("pool.gpu", 2.5, "pool.gpu", "whole number"),
    ("pool.flow.fs", 0, "pool.flow.fs", "must be > 0"),
    ("broker.enforcement", "eventual", "broker.enforcement", "must be one of"),
    ("broker.grace", 0, "broker.grace", "must be > 0"),
    ("broker.price.disk", 1.0, "broker.price.disk", "lacks"),
    ("campaigns.storm.envelope.ceiling.gpu", 32, "campaigns[3].envelope.ceiling.gpu",
     "must be >= sustained"),
    ("campaigns.victim.envelope.guaranteed.gpu", 600, "campaigns[0].envelope.sustained.gpu",
     "must be >= guaranteed"),
    ("campaigns.storm.class", "vip", "campaigns[3].class", "must be one of"),
    ("campaigns.storm.agent", "hacker", "campaigns[3].agent", "must be one of"),
    ("campaigns.storm.credits", -1, "campaigns[3].credits", "must be >= 0"),
    ("campaigns.storm.behaviour.end", 100.0, "campaigns[3].behaviour.end", "must be >= start"),
    ("campaigns.storm.behaviour.speed", 3, "campaigns[3].behaviour.speed", "unknown field"),
    ("campaigns.victim.behaviour.units", [8, 4], "campaigns[0].behaviour.units", "min <= max"),
    ("campaigns.naive-sci.behaviour.taskset", "other", "campaigns[2].behaviour.taskset",
     "names no [tasksets.other]"),
    ("tasksets.science.gpu_weights", [1, 1], "tasksets.science.gpu_weights", "one weight"),
    ("tasksets.science.count", 0, "tasksets.science.count", "must be >= 1"),
])
def test_errors_name_the_field(path, value, field, rule):
    sc = load_scenario("default")
    with pytest.raises(ScenarioError) as ei:
        sc.with_changes(**{path: value})
    e = ei.value
    assert isinstance(e, InvalidArgument) and isinstance(e, ValueError)
    assert e.field == field, str(e)
    assert rule in e.rule, str(e)
    assert field in str(e)


def test_guarantees_are_never_overbooked():
    doc = raw()
    env = doc["campaigns"][3]["envelope"]          # the storm
    env["guaranteed"]["gpu"] = env["sustained"]["gpu"] = env["ceiling"]["gpu"] = 400
    with pytest.raises(ScenarioError) as ei:
        parse_scenario(doc)
    assert ei.value.field == "campaigns[3].envelope.guaranteed.gpu"
    assert "above the pool" in ei.value.rule


def test_missing_and_duplicate_fields():
    doc = raw()
    del doc["campaigns"][1]["agent"]
    with pytest.raises(ScenarioError, match=r"campaigns\[1\]\.agent: is required"):
        parse_scenario(doc)
    doc = raw()
    doc["campaigns"][1]["name"] = "victim"
    with pytest.raises(ScenarioError, match=r"campaigns\[1\]\.name: is already used"):
        parse_scenario(doc)
    doc = raw()
    del doc["scenario"]["duration"]
    with pytest.raises(ScenarioError, match="scenario.duration: is required"):
        parse_scenario(doc)
    doc = raw()
    doc["campaigns"] = []
    with pytest.raises(ScenarioError, match="needs at least one campaign"):
        parse_scenario(doc)


def test_file_errors_carry_the_source(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[scenario]\nduration = 10\n[pool]\ngpu = 8\n[[campaigns]]\nname = 'x'\n"
                   "agent = 'storm'\ncredits = 1\n[campaigns.envelope]\nsustained = { gpu = 6 }\n"
                   "ceiling = { gpu = 4 }\n")
    with pytest.raises(ScenarioError) as ei:
        load_scenario(str(bad))
    assert str(bad) in str(ei.value)
    broken = tmp_path / "broken.toml"
    broken.write_text("[scenario\n")
    with pytest.raises(ScenarioError, match="not valid TOML"):
        load_scenario(str(broken))
    with pytest.raises(ScenarioError, match="no such file"):
        load_scenario(str(tmp_path / "missing.toml"))


def test_unlimited_spellings():
    doc = raw()
    doc["campaigns"][4]["credits"] = math.inf
    doc["campaigns"][4]["envelope"]["burst"]["gpu"] = "inf"
    sc = parse_scenario(doc)
    assert math.isinf(sc.campaign("backfill").envelope.B("gpu"))
