"""``--log-format json``: bursar's own lines and uvicorn's error and access lines are all
one JSON object a line; the text format is one format for all of them too."""

from __future__ import annotations

import json
import logging
import re
import sys

import httpx

from bursarcore.service.logs import JsonFormatter, log_config
from bursarcore.service.testing import ServerProcess


def _run(tmp_path, base_config, fmt: str) -> tuple[ServerProcess, str]:
    srv = ServerProcess(tmp_path, base_config,
                        extra_args=["--log-format", fmt, "--access-log", "--log-level", "info"])
    with srv:
        h = {"Authorization": f"Bearer {srv.tokens['alpha']}"}
        assert httpx.get(f"{srv.url}/v1/campaigns/alpha/supply", headers=h,
                         timeout=10).status_code == 200
        assert httpx.get(f"{srv.url}/v1/campaigns/beta/supply", headers=h,
                         timeout=10).status_code == 404
    return srv, srv.log()


def test_json_logs_one_object_a_line_for_bursar_and_uvicorn(tmp_path, base_config):
    srv, text = _run(tmp_path, base_config, "json")
    lines = [ln for ln in text.splitlines() if ln.strip()]
    docs = [json.loads(ln) for ln in lines]          # every line is JSON
    for d in docs:
        assert {"time", "level", "logger", "message"} <= set(d), d
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", d["time"]), d
    by = {d["logger"] for d in docs}
    assert {"bursarcore.service", "uvicorn.error", "uvicorn.access"} <= by, by
    assert any(d["message"].startswith("bursar serving on http://127.0.0.1:") for d in docs)
    access = [d for d in docs if d["logger"] == "uvicorn.access"]
    assert {(d["method"], d["path"], d["status"]) for d in access} >= {
        ("GET", "/v1/campaigns/alpha/supply", 200), ("GET", "/v1/campaigns/beta/supply", 404)}
    assert all(d["client"].startswith("127.0.0.1:") for d in access)
    # tokens are never logged
    assert not any(tok in text for tok in srv.tokens.values())


def test_text_logs_share_one_format(tmp_path, base_config):
    srv, text = _run(tmp_path, base_config, "text")
    lines = [ln for ln in text.splitlines() if ln.strip()]
    pattern = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ "
                         r"(bursarcore[\w.]*|uvicorn\.error|uvicorn\.access): ")
    assert lines and all(pattern.match(ln) for ln in lines), lines
    assert any(" uvicorn.access: " in ln and "/v1/campaigns/alpha/supply" in ln for ln in lines)


def test_an_exception_stays_on_one_line():
    rec = logging.LogRecord("bursarcore.service", logging.ERROR, __file__, 1, "failed %s",
                            ("x",), None)
    try:
        raise ValueError("a\nb")
    except ValueError:
        rec.exc_info = sys.exc_info()
    line = JsonFormatter().format(rec)
    assert "\n" not in line
    d = json.loads(line)
    assert d["message"] == "failed x" and "ValueError: a\nb" in d["exc_info"]
    assert d["level"] == "error"


def test_the_log_config_covers_every_logger_and_refuses_an_unknown_format():
    cfg = log_config("debug", "json")
    assert {"bursarcore", "uvicorn", "uvicorn.error", "uvicorn.access"} <= set(cfg["loggers"])
    assert cfg["loggers"]["bursarcore"]["level"] == "DEBUG"
    try:
        log_config("info", "xml")
    except ValueError as e:
        assert "xml" in str(e)
    else:
        raise AssertionError("an unknown format was accepted")
