"""Open report.html in headless Chromium: the timeline runs and every figure decodes,
with no console error. Skipped (with the reason) only when Chromium is absent and
BURSAR_REQUIRE_CHROMIUM is unset; .ci/run installs Debian's ``chromium`` and sets it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from bursarcore.sim import write_outputs

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "chrome")


def _chromium() -> str | None:
    for name in CANDIDATES:
        p = shutil.which(name)
        if p:
            return p
    return None


@pytest.fixture(scope="module")
def browser():
    path = _chromium()
    if path is None:
        if os.environ.get("BURSAR_REQUIRE_CHROMIUM"):
            pytest.fail("BURSAR_REQUIRE_CHROMIUM is set but no chromium is on PATH "
                        "(apt-get install -y chromium)")
        pytest.skip("chromium not installed (apt-get install -y chromium); "
                    "set BURSAR_REQUIRE_CHROMIUM=1 to make this a failure")
    return path


def test_report_renders_in_chromium(browser, short_result, tmp_path):
    paths = write_outputs(short_result, tmp_path, journal=False)
    url = "file://" + os.path.abspath(paths["report"])
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-extensions",
           "--no-first-run", "--disable-dev-shm-usage", "--enable-logging=stderr", "--v=0",
           f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=5000",
           "--dump-dom", url]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    except subprocess.TimeoutExpired:
        pytest.fail("chromium did not finish within 90 s")
    dom, log = p.stdout, p.stderr
    assert p.returncode == 0, log[-2000:]
    console = [ln for ln in log.splitlines() if ":CONSOLE" in ln]
    assert not console, "console messages:\n" + "\n".join(console)
    assert 'data-timeline="ready"' in dom, dom[:500]
    rows = dom.count('class="tl-row"')
    assert rows == len(short_result.summary["campaigns"])
    assert re.search(r'id="tl-time">t = \d+ min', dom)
    m = re.search(r'data-figures-rendered="(\d+)/(\d+)"', dom)
    assert m, "the figure check did not run"
    try:
        import matplotlib  # noqa: F401
        assert int(m.group(2)) >= 6 and m.group(1) == m.group(2), m.group(0)
    except ImportError:
        assert m.group(2) == "0"
