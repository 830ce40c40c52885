"""``bursar serve --host/--port``: the address the service binds (default loopback:8000),
parsed, checked, and a real start on the address asked for."""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time

import httpx
import pytest

from bursarcore.__main__ import build_parser
from bursarcore.service import cli


def _standalone(argv):
    p = argparse.ArgumentParser(prog="bursar serve")
    cli._arguments(p)
    return p.parse_args(argv)


@pytest.mark.parametrize("parse", [lambda a: build_parser().parse_args(["serve", *a]),
                                   _standalone], ids=["bursar serve", "python -m service"])
def test_host_and_port_are_parsed_with_loopback_defaults(parse):
    a = parse([])
    assert (a.host, a.port) == ("127.0.0.1", 8000)
    a = parse(["--host", "0.0.0.0", "--port", "9001"])
    assert (a.host, a.port) == ("0.0.0.0", 9001)
    assert parse(["--host", "::1", "--port", "0"]).port == 0


@pytest.mark.parametrize("port", ["-1", "65536", "http", "80.5"])
def test_a_port_outside_0_65535_is_a_usage_error(port, capsys):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["serve", "--port", port])
    assert e.value.code == 2
    assert "argument --port: must be" in capsys.readouterr().err


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(tmp_path, *args):
    cfg = tmp_path / "broker.json"
    cfg.write_text(json.dumps({"pool": {"capacity": {"gpu": 8}}}))
    ready = tmp_path / "ready.txt"
    argv = [sys.executable, "-m", "bursarcore", "serve", "--memory", "--config", str(cfg),
            "--tokens", str(tmp_path / "tokens.json"), "--ready-file", str(ready),
            "--log-level", "warning", *args]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), ready


def _wait(proc, ready, timeout=30.0) -> str:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if ready.exists():
            return ready.read_text().strip()
        if proc.poll() is not None:
            pytest.fail(f"bursar serve exited with {proc.returncode}: {proc.stderr.read()}")
        time.sleep(0.05)
    pytest.fail("bursar serve did not start")


def test_serve_listens_on_the_host_and_port_asked_for(tmp_path):
    port = _free_port()
    proc, ready = _serve(tmp_path, "--host", "127.0.0.1", "--port", str(port))
    try:
        url = _wait(proc, ready)
        assert url == f"http://127.0.0.1:{port}"
        r = httpx.get(f"{url}/v1/health", timeout=10)
        assert r.status_code == 200 and r.json()["status"] == "ok"
        # the address is taken now: a second server says so and exits, no traceback
        (tmp_path / "second").mkdir()
        other, _ = _serve(tmp_path / "second", "--port", str(port))
        _, err = other.communicate(timeout=30)
        assert other.returncode != 0
        assert f"cannot listen on 127.0.0.1 port {port}" in err and "Traceback" not in err
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


def test_serve_on_an_ephemeral_port_reports_its_url(tmp_path):
    proc, ready = _serve(tmp_path, "--port", "0")
    try:
        url = _wait(proc, ready)
        host, port = url.removeprefix("http://").rsplit(":", 1)
        assert host == "127.0.0.1" and 0 < int(port) < 65536
        assert httpx.get(f"{url}/v1/health", timeout=10).status_code == 200
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


P = '"pool": {"capacity": {"gpu": 8}}'


@pytest.mark.parametrize("text,problems", [
    (None, ["cannot read it: No such file or directory"]),
    ("{bad json", ["not valid JSON: Expecting property name"]),
    ("[1, 2]", ["(top level): must be a table/object (got list)"]),
    ('"pool"', ["(top level): must be a table/object (got str)"]),
    ('{"pool": [8]}', ["pool: must be a table (an object)"]),
    ('{"pool": {"capacity": {"gpu": "8"}}}', ["pool.capacity.gpu: must be a whole number (got '8')"]),
    ('{"pool": {"capacity": {"gpu": 8.5}}}', ["pool.capacity.gpu: must be a whole number (got 8.5)"]),
    ('{"pool": {"capacity": {"gpu": 16777217}}}', ["pool.capacity.gpu: must be <= 16,777,216 (got 16777217)"]),
    ('{"pool": {"capacity": {}}}', ["pool.capacity: must have at least 1 item(s)"]),
    ("{%s, \"colour\": 1}" % P, ["colour: unknown key"]),
    ('{%s, "ttl": "x"}' % P, ["ttl: must be a number (got 'x')"]),
    ('{%s, "ttl": 86401}' % P, ["ttl: must be <= 86400 (got 86401)"]),
    ('{"pool": {"capacity": {"gpu": 8}, "slots_per_nodes": 4}}',
     ["pool.slots_per_nodes: unknown key (did you mean 'slots_per_node'?)"]),
    ('{"pool": {"gpu": 8}}', ["pool.gpu: unknown key (a held dimension goes under pool.capacity"]),
    ('{"pool": {"capacity": {"gpu": 8}, "warm_headrom": {"gpu": 1}}}',
     ["pool.warm_headrom: unknown key (did you mean 'warm_headroom'?)"]),
    ('{%s, "campaigns": [1]}' % P, ["campaigns: must be a table (an object)"]),
    ('{%s, "campaigns": {"a": {"credits": 1, "wat": 1}}}' % P, ["campaigns.a.wat: unknown key"]),
    ('{%s, "campaigns": {"a": {"credits": -1}}}' % P,
     ["campaigns.a.credits: must be >= 0 (got -1)"]),
    ('{%s, "campaigns": {"a": {"credits": 1e13}}}' % P,
     ["campaigns.a.credits: must be <= 1e+12 or unlimited"]),
    ('{%s, "campaigns": {"a": {"credits": 1, "guaranteed": {"gpu": 4}, '
     '"sustained": {"gpu": 2}}}}' % P, ["campaigns.a.sustained.gpu: must be >= guaranteed"]),
    ('{%s, "campaigns": {"a": {"credits": 1, "service_class": "gold"}}}' % P,
     ["campaigns.a.service_class: must be one of"]),
    ('{%s, "classes": [{"name": "x"}]}' % P,
     ["classes[0].rank: required key is missing", "classes[0].multiplier: required key"]),
    ('{%s, "server": {"port": 70000, "hots": "::"}}' % P,
     ["server.port: must be <= 65,535 (got 70000)", "server.hots: unknown key"]),
    ('{%s, "metrics": {"campaigns": -1}}' % P, ["metrics.campaigns: must be >= 0 (got -1)"]),
])
def test_config_mistakes_are_one_line_each_and_exit_2(tmp_path, text, problems):
    """At start (--config) and with --check-config alike: every mistake, one line each
    naming the dotted path, exit 2, no traceback, and nothing started."""
    cfg = tmp_path / "broker.json"
    if text is not None:
        cfg.write_text(text)
    for flag, prefix in (("--config", f"bursar serve: --config {cfg}: "),
                         ("--check-config", f"bursar serve: {cfg}: ")):
        r = subprocess.run([sys.executable, "-m", "bursarcore", "serve", "--memory", flag,
                            str(cfg), "--tokens", str(tmp_path / "t.json")],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 2, (r.returncode, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == len(problems) and "Traceback" not in r.stderr, r.stderr
        for line, problem in zip(lines, problems):
            assert line.startswith(prefix) and problem in line, (line, problem)
    assert not (tmp_path / "t.json").exists()


def test_dimension_names_beside_the_pool_options_are_kept_apart(tmp_path):
    cfg = tmp_path / "broker.json"
    cfg.write_text(json.dumps({"pool": {"capacity": {"gpu": 8, "cpu_slots": 64},
                                        "slots_per_node": 4, "flow": {"fs": 2.0}}}))
    config = cli.load_config(str(cfg)).broker_config()
    from bursarcore.service.core import build_broker
    from bursarcore import ManualClock
    b = build_broker(config, ManualClock(0))
    assert b.dims == ["gpu", "cpu_slots"] and b.flow_dims == ["fs"]
    assert len(b.pool.slot_map["gpu"]) == 2        # 8 slots in nodes of 4
