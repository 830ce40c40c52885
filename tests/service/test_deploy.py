"""docs/deploy: the systemd unit and the Containerfile run ``bursar serve`` with options
the command line accepts, on the shipped configuration, and pass the static checks that
can run here (``systemd-analyze verify`` where systemd is installed; hadolint-like rules
for the Containerfile)."""

from __future__ import annotations

import configparser
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bursarcore.__main__ import build_parser
from bursarcore.service.config import read_config

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "docs" / "deploy"
UNIT = DEPLOY / "bursar.service"
CONTAINERFILE = DEPLOY / "Containerfile"
#: where the unit and the image expect the configuration, and the file shipped for it
CONFIG_AT = {"/etc/bursar/bursar.toml": DEPLOY / "bursar.toml"}


def _unit() -> configparser.ConfigParser:
    cp = configparser.ConfigParser(interpolation=None, strict=True, delimiters=("=",))
    cp.optionxform = str                      # systemd keys are case-sensitive
    cp.read_string(UNIT.read_text())
    return cp


def _serve_args(argv: list[str]) -> object:
    """``argv`` is ``.../bursar serve ...``: parsed by the real parser (exit 2 otherwise)."""
    assert Path(argv[0]).name == "bursar" and argv[1] == "serve", argv
    return build_parser().parse_args(argv[1:])


def test_the_unit_runs_bursar_serve_on_the_shipped_configuration():
    svc = _unit()["Service"]
    args = _serve_args(shlex.split(svc["ExecStart"]))
    assert args.config in CONFIG_AT
    cfg = read_config(CONFIG_AT[args.config])
    # the journal and the token store are in the unit's state directory
    state = "/var/lib/" + svc["StateDirectory"]
    assert cfg.server.journal.startswith(state + "/") and cfg.server.tokens.startswith(state)
    assert state in _unit()["Unit"]["RequiresMountsFor"].split()
    pre = _serve_args(shlex.split(svc["ExecStartPre"]))
    assert pre.check_config == args.config


def test_the_unit_restarts_on_failure_but_not_on_a_refusal():
    svc = _unit()["Service"]
    assert svc["Restart"] in ("on-failure", "always")
    assert re.fullmatch(r"\d+s?", svc["RestartSec"])
    # exit 2 is a refusal (configuration, journal missing, damaged or locked)
    assert "2" in svc["RestartPreventExitStatus"].split()
    assert svc["User"] and svc["User"] != "root"
    assert svc["KillSignal"] == "SIGTERM"
    assert svc["UMask"] == "0077"
    assert int(svc["LimitNOFILE"]) > 2048 + 64  # room for --max-connections' default
    assert _unit()["Install"]["WantedBy"] == "multi-user.target"


def test_a_refusal_is_exit_status_2(tmp_path):
    """What RestartPreventExitStatus=2 relies on: a missing journal exits 2."""
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[server]\njournal = "{tmp_path / "none.db"}"\n')
    r = subprocess.run([sys.executable, "-m", "bursarcore", "serve", "--config", str(cfg)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "does not exist" in r.stderr, r.stderr


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
def test_systemd_analyze_verify_finds_nothing(tmp_path):
    # the unit names the deployed path of bursar; verify needs one that exists here
    bursar = shutil.which("bursar") or str(Path(sys.executable).with_name("bursar"))
    if not os.access(bursar, os.X_OK):
        pytest.skip("no bursar executable to stand for /opt/bursar/bin/bursar")
    unit = tmp_path / "bursar.service"
    unit.write_text(UNIT.read_text().replace("/opt/bursar/bin/bursar", bursar))
    r = subprocess.run(["systemd-analyze", "verify", "--man=no", str(unit)],
                       capture_output=True, text=True, timeout=120)
    # an unknown key or a bad value is only a warning (exit 0): any line naming the unit
    # is a finding
    findings = [ln for ln in (r.stdout + r.stderr).splitlines() if "bursar.service" in ln]
    assert r.returncode == 0 and not findings, r.stdout + r.stderr


def test_systemd_analyze_verify_would_catch_a_mistake(tmp_path):
    if shutil.which("systemd-analyze") is None:
        pytest.skip("no systemd-analyze")
    bursar = shutil.which("bursar") or str(Path(sys.executable).with_name("bursar"))
    unit = tmp_path / "bursar.service"
    unit.write_text(UNIT.read_text().replace("/opt/bursar/bin/bursar", bursar)
                    .replace("RestartSec=", "RestartSek="))
    r = subprocess.run(["systemd-analyze", "verify", "--man=no", str(unit)],
                       capture_output=True, text=True, timeout=120)
    assert "RestartSek" in r.stdout + r.stderr


# ------------------------------------------------------------------ Containerfile
def _instructions() -> list[tuple[str, str, list[str]]]:
    """(INSTRUCTION, arguments, comments just above it), continuation lines joined."""
    out, comments, buf = [], [], ""
    for raw in CONTAINERFILE.read_text().splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            if line.startswith("#"):
                comments.append(line)
            else:
                comments = []
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        full = (buf + line).strip()
        buf = ""
        word, _, rest = full.partition(" ")
        out.append((word.upper(), rest.strip(), comments))
        comments = []
    return out


def _exec_form(text: str) -> list[str]:
    argv = json.loads(text)
    assert isinstance(argv, list) and all(isinstance(a, str) for a in argv), text
    return argv


def test_containerfile_static_checks():
    ins = _instructions()
    stages: list[str] = []
    final_user = None
    for i, (word, rest, comments) in enumerate(ins):
        ignored = {c for cm in comments for c in re.findall(r"DL\d{4}", cm)
                   if "hadolint ignore" in cm}
        if word == "FROM":
            image = rest.split()[0]
            assert ":" in image and not image.endswith(":latest"), f"DL3006/7: {image}"
            stages.append(rest.split()[-1] if " AS " in rest.upper() else "")
            final_user = None
        elif word == "ADD":
            pytest.fail(f"DL3020: use COPY, not ADD: {rest}")
        elif word == "RUN":
            if "apt-get install" in rest:
                assert "--no-install-recommends" in rest, "DL3015"
                assert "-y" in rest.split(), "DL3014"
                assert "rm -rf /var/lib/apt/lists" in rest, "DL3009"
                assert "DL3008" in ignored or "=" in rest, "DL3008: pin apt versions or say why"
            if "pip install" in rest:
                assert "--no-cache-dir" in rest, "DL3042"
            assert not re.search(r"(^|\s)cd\s", rest), "DL3003: use WORKDIR"
            assert "sudo " not in rest, "DL3004"
        elif word == "COPY" and "--from=" in rest:
            src = re.search(r"--from=(\S+)", rest).group(1)
            assert src in stages[:-1], f"COPY --from={src}: no such earlier stage"
        elif word == "COPY":
            for src in rest.split()[:-1]:
                if not src.startswith("--") and src != ".":
                    assert (ROOT / src).exists(), f"COPY {src}: not in the repository"
        elif word == "USER":
            final_user = rest
        elif word in ("ENTRYPOINT", "CMD", "HEALTHCHECK", "VOLUME", "EXPOSE", "WORKDIR",
                      "STOPSIGNAL", "ENV", "ARG", "LABEL"):
            if word in ("ENTRYPOINT", "CMD"):
                _exec_form(rest)              # DL3025: exec form
        else:
            pytest.fail(f"unexpected instruction {word}")
    assert final_user not in (None, "root", "0"), "DL3002: the last USER must not be root"


def test_the_image_runs_bursar_serve_with_accepted_options():
    ins = {w: r for w, r, _ in _instructions()}          # the last of each (final stage)
    argv = _exec_form(ins["ENTRYPOINT"]) + _exec_form(ins["CMD"])
    args = _serve_args(argv)
    assert args.config in CONFIG_AT
    cfg = read_config(CONFIG_AT[args.config])
    port = args.port if "port" in args.given else cfg.server.port
    assert ins["EXPOSE"].split() == [str(port)]
    # the journal is in the volume
    volumes = _exec_form(ins["VOLUME"])
    assert any(cfg.server.journal.startswith(v + "/") for v in volumes)
    # the first start and the token mint are the same entrypoint with one flag more
    for extra in (["--init"], ["--mint-operator"]):
        _serve_args(argv + extra)
    hc = ins["HEALTHCHECK"]
    assert f"127.0.0.1:{port}/v1/health" in hc and "CMD [" in hc
    assert "COPY docs/deploy/bursar.toml /etc/bursar/bursar.toml" in CONTAINERFILE.read_text()


def test_the_healthcheck_command_passes_on_a_live_server(tmp_path, base_config):
    from bursarcore.service.testing import ServerProcess

    ins = {w: r for w, r, _ in _instructions()}
    argv = _exec_form(ins["HEALTHCHECK"].split("CMD", 1)[1].strip())
    assert argv[0] == "/opt/bursar/bin/python"
    with ServerProcess(tmp_path, base_config) as srv:
        port = srv.url.rsplit(":", 1)[1]
        run = [sys.executable, *[a.replace("127.0.0.1:8000", f"127.0.0.1:{port}")
                                 for a in argv[1:]]]
        assert subprocess.run(run, timeout=30).returncode == 0
    # and fails when nothing answers
    assert subprocess.run(run, capture_output=True, timeout=30).returncode != 0
