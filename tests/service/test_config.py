"""The configuration file: TOML and JSON alike, closed tables, the library's ranges,
``--check-config``, the precedence of flags over ``[server]``, and docs/config.md
documenting every field (so the reference cannot drift from the models)."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bursarcore import ManualClock
from bursarcore import units as U
from bursarcore.__main__ import build_parser
from bursarcore.service import cli
from bursarcore.service.config import (MODELS, ConfigError, ServeConfig, ServerConfig,
                                       file_form, parse, read_config)
from bursarcore.service.core import DEMO_CONFIG, build_broker

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "config.md"
EXAMPLE = ROOT / "docs" / "deploy" / "bursar.toml"

TOML = """
ttl = 600.0
[pool]
slots_per_node = 4
[pool.capacity]
gpu = 16
cpu = 64
[pool.flow]
fs = 2.5
[pool.slots.gpu]
n1 = 8
n2 = 8
[campaigns.a]
credits = inf
guaranteed = { gpu = 2 }
sustained = { gpu = 4, fs = 1 }
burst = { gpu = inf, fs = 10 }
[campaigns.b]
credits = 100
[server]
port = 9000
rate = 5.0
[metrics]
campaigns = 3
"""

JSON = {"ttl": 600.0,
        "pool": {"slots_per_node": 4, "capacity": {"gpu": 16, "cpu": 64}, "flow": {"fs": 2.5},
                 "slots": {"gpu": {"n1": 8, "n2": 8}}},
        "campaigns": {"a": {"credits": None, "guaranteed": {"gpu": 2},
                            "sustained": {"gpu": 4, "fs": 1}, "burst": {"gpu": None, "fs": 10}},
                      "b": {"credits": 100}},
        "server": {"port": 9000, "rate": 5.0}, "metrics": {"campaigns": 3}}


def test_toml_and_json_describe_the_same_broker(tmp_path):
    (tmp_path / "c.toml").write_text(TOML)
    (tmp_path / "c.json").write_text(json.dumps(JSON))
    t, j = read_config(tmp_path / "c.toml"), read_config(tmp_path / "c.json")
    assert t.broker_config() == j.broker_config()
    assert t.server == j.server and t.metrics == j.metrics
    bc = t.broker_config()
    # unlimited is inf in TOML and null in JSON: the constructor form says None for both
    assert bc["campaigns"]["a"]["credits"] is None and bc["campaigns"]["a"]["burst"]["gpu"] is None
    b = build_broker(bc, ManualClock(0.0))
    assert b.dims == ["gpu", "cpu"] and b.flow_dims == ["fs"] and b.ttl == 600.0
    assert [n for n, _ in b.pool.slot_map["gpu"]] == ["n1", "n2"]
    b.register("a", __import__("bursarcore.service.core", fromlist=["x"])
               .envelope_from_json(bc["campaigns"]["a"]))
    assert math.isinf(b.envelopes["a"].credits)


def test_the_suffix_chooses_the_parser(tmp_path):
    (tmp_path / "c.json").write_text(TOML)            # TOML text in a .json file
    with pytest.raises(ConfigError) as e:
        read_config(tmp_path / "c.json")
    assert e.value.problems[0].startswith("not valid JSON")
    (tmp_path / "c.toml").write_text(json.dumps(JSON))
    with pytest.raises(ConfigError) as e:
        read_config(tmp_path / "c.toml")
    assert e.value.problems[0].startswith("not valid TOML")


def test_the_demo_and_the_file_form_round_trip():
    assert parse(file_form(DEMO_CONFIG)).broker_config() == DEMO_CONFIG


@pytest.mark.parametrize("path,value,rule", [
    ("pool.capacity.gpu", U.MAX_UNITS + 1, f"must be <= {U.MAX_UNITS:,}"),
    ("pool.flow.fs", 0.0, "must be > 0"),
    ("pool.flow.fs", U.MAX_AMOUNT * 2, "must be <="),
    ("pool.slots_per_node", 0, "must be >= 1"),
    ("ttl", U.MAX_TTL + 1, "must be <="),
    ("half_life", 0, "must be > 0"),
    ("price.gpu", U.MAX_PRICE + 1, "must be <="),
    ("campaigns.c.credits", U.MAX_CREDITS * 10, "must be <= 1e+12"),
    ("campaigns.c.guaranteed.gpu", float("nan"), "must be finite"),
    ("campaigns.c.guaranteed.gpu", float("inf"), "must be finite"),
    ("campaigns.c.credits", float("nan"), "must not be NaN"),
    ("campaigns.c.burst.gpu", -1.0, "must be >= 0"),
    ("classes[0].multiplier", U.MAX_MULTIPLIER + 1, "must be <="),
    ("classes[0].grace", U.MAX_DURATION + 1, "must be <="),
    ("congestion.bins", 3601, "must be <= 3,600"),
    ("server.port", -1, "must be >= 0"),
    ("server.synchronous", "OFF", 'must be one of "NORMAL", "FULL" or "EXTRA"'),
    ("server.access_log", 1, "must be true or false"),
    ("metrics.campaigns", 1001, "must be <="),
])
def test_each_range_is_the_librarys_and_names_the_dotted_path(path, value, rule):
    doc = {"pool": {"capacity": {"gpu": 8}, "flow": {"fs": 1.0}},
           "classes": [{"name": "agent-burst", "rank": 0, "multiplier": 1.0}],
           "campaigns": {"c": {"credits": 1}}}
    node: dict = doc
    keys = re.findall(r"[^.\[\]]+|\[\d+\]", path)
    for k in keys[:-1]:
        node = node[int(k[1:-1])] if k.startswith("[") else node.setdefault(k, {})
    node[keys[-1]] = value
    with pytest.raises(ConfigError) as e:
        parse(doc)
    assert len(e.value.problems) == 1, e.value.problems
    assert e.value.problems[0].startswith(f"{path}: {rule}"), e.value.problems


def test_every_mistake_is_reported_not_only_the_first():
    with pytest.raises(ConfigError) as e:
        parse({"pool": {"capacity": {"gpu": -1}, "flw": {}}, "ttl": 0, "server": {"prot": 1}})
    assert e.value.problems == [
        "pool.capacity.gpu: must be >= 0 (got -1)",
        "pool.flw: unknown key (did you mean 'flow'?)",
        "ttl: must be > 0 (got 0)",
        "server.prot: unknown key"]


def test_check_config_prints_one_summary_line_and_exits_0(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text(TOML)
    r = subprocess.run([sys.executable, "-m", "bursarcore", "serve", "--check-config", str(cfg)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stderr == "" and r.stdout.count("\n") == 1
    assert r.stdout.startswith(f"bursar serve: {cfg}: valid: pool gpu=16, cpu=64, fs=2.5/s; "
                               "default classes; 2 campaigns; server 127.0.0.1:9000")


def test_the_shipped_example_is_valid():
    cfg = read_config(EXAMPLE)
    assert cfg.server.journal == "/var/lib/bursar/bursar.db"
    build_broker(cfg.broker_config(), ManualClock(0.0))


def _parse(*argv: str):
    return build_parser().parse_args(["serve", *argv])


def test_the_flags_and_the_server_table_are_the_same_settings():
    assert set(cli.SERVER_FLAGS) == set(ServerConfig.model_fields)
    args = _parse()
    for name, field in ServerConfig.model_fields.items():
        default = field.default
        if name in ("journal", "tokens"):
            assert getattr(args, name) is None and default is None
        else:
            assert getattr(args, name) == default, name


def test_a_flag_given_overrides_the_file_and_a_default_does_not():
    cfg = parse({"server": {"port": 9000, "rate": 5.0, "access_log": True,
                            "log_format": "json"}})
    args = cli._with_file(_parse("--port", "9100", "--burst", "7"), cfg)
    assert args.port == 9100                  # given: the flag wins
    assert args.rate == 5.0 and args.access_log is True and args.log_format == "json"
    assert args.burst == 7.0                  # given, not in the file
    assert args.host == "127.0.0.1"           # neither: the default
    # a flag given with its default value still wins over the file
    assert cli._with_file(_parse("--port", "8000"), cfg).port == 8000
    # each parse has its own record of what was given
    assert _parse().given == frozenset() and _parse("--tick", "1").given == {"tick"}


def test_the_server_table_runs_a_real_server(tmp_path):
    """A TOML file with [server] keys: the token store and the journal at the file's
    paths, the rate limit off as the file says."""
    import httpx

    journal, tokens = tmp_path / "state" / "j.db", tmp_path / "state" / "t.json"
    journal.parent.mkdir()
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[pool.capacity]\ngpu = 8\n[server]\njournal = "{journal}"\n'
                   f'tokens = "{tokens}"\nrate = 0.0\n')
    base = [sys.executable, "-m", "bursarcore", "serve", "--config", str(cfg)]
    minted = subprocess.run([*base, "--mint-operator"], capture_output=True, text=True,
                            timeout=60)
    assert minted.returncode == 0 and tokens.exists(), minted.stderr
    ready = tmp_path / "ready.txt"
    proc = subprocess.Popen([*base, "--init", "--port", "0", "--ready-file", str(ready),
                             "--log-level", "warning"], stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(600):
            if ready.exists() or proc.poll() is not None:
                break
            time.sleep(0.05)
        assert ready.exists(), proc.stderr.read() if proc.poll() is not None else "slow"
        url = ready.read_text().strip()
        who = httpx.get(f"{url}/v1/whoami", timeout=10,
                        headers={"Authorization": f"Bearer {minted.stdout.strip()}"})
        assert who.status_code == 200 and who.json()["role"] == "operator"
        assert journal.exists()
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


def _doc_tables() -> dict[str, dict[str, str]]:
    """``docs/config.md``: section heading -> {key: default cell} from its table."""
    out: dict[str, dict[str, str]] = {}
    section = None
    for line in DOC.read_text().splitlines():
        m = re.match(r"^## `(.+)`$", line)
        if m:
            section = m.group(1)
            out[section] = {}
            continue
        m = re.match(r"^\| `([^`]+)` \| [^|]+ \| ([^|]*) \|", line)
        if m and section is not None:
            out[section][m.group(1)] = m.group(2).strip()
    return out


_HEADING = {"": "(top level)", "pool": "[pool]", "classes[]": "[[classes]]",
            "congestion": "[congestion]", "campaigns.<name>": "[campaigns.<name>]",
            "server": "[server]", "metrics": "[metrics]"}


def _literal(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f'"{v}"'
    return repr(v)


def test_docs_config_md_documents_every_field_with_its_default():
    tables = _doc_tables()
    assert set(MODELS) == set(_HEADING)
    for where, model in MODELS.items():
        documented = tables.get(_HEADING[where])
        assert documented is not None, f"docs/config.md has no section {_HEADING[where]}"
        fields = model.model_fields
        assert set(documented) == set(fields), (where, set(fields) ^ set(documented))
        for name, f in fields.items():
            cell = documented[name]
            if f.is_required():
                assert cell == "required", (where, name, cell)
            elif f.default is None:
                assert cell.startswith("—"), (where, name, cell)
            elif isinstance(f.default, (bool, int, float, str)):
                assert cell.startswith(f"`{_literal(f.default)}`"), (where, name, cell)


def test_a_model_field_missing_from_the_docs_is_caught(monkeypatch):
    """The drift test fails for an undocumented field (it is not vacuous)."""
    from pydantic import create_model

    bigger = create_model("Bigger", __base__=ServerConfig, brand_new=(int, 1))
    monkeypatch.setitem(MODELS, "server", bigger)
    with pytest.raises(AssertionError, match="brand_new"):
        test_docs_config_md_documents_every_field_with_its_default()


def test_the_file_model_is_closed_at_every_level():
    for model in MODELS.values():
        assert model.model_config.get("extra") == "forbid", model
    assert ServeConfig.model_config.get("strict") is True


@pytest.mark.parametrize("flags,line", [
    (["--max-body", "10"], "--max-body: must be >= 1,024 (got 10)"),
    (["--tick", "0"], "--tick: must be > 0 (got 0.0)"),
    (["--rate", "nan"], "--rate: must be finite (got nan)"),
])
def test_a_flag_outside_the_server_tables_range_is_refused(tmp_path, flags, line):
    r = subprocess.run([sys.executable, "-m", "bursarcore", "serve", "--memory",
                        "--tokens", str(tmp_path / "t.json"), *flags],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [f"bursar serve: {line}"], \
        r.stderr
