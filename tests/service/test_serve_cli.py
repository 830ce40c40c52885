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
    cfg.write_text(json.dumps({"pool": {"gpu": 8}}))
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
