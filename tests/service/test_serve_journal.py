"""What ``bursar serve`` refuses at start, and how: a missing, empty, damaged, locked or
short journal, ``--init`` where a journal is, and ``--mint`` for a campaign nobody
registered. Each is one line on stderr and exit status 2, before the token store is read
or written; ``--demo`` makes its own journal when there is none and replays it after."""

from __future__ import annotations

import copy
import json
import os
import sqlite3
import subprocess
import sys
import time

import pytest

import bursarcore
from bursarcore import Intent
from bursarcore.client import BursarClient
from bursarcore.journal import SQLiteJournal
from bursarcore.service.auth import OPERATOR, TokenStore
from bursarcore.service.config import file_form
from bursarcore.service.core import BrokerService

WAIT = 30.0          # the longest any start or refusal may take here, seconds
# the package under test, wherever the server runs from (some run in another directory)
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(
    [os.path.dirname(os.path.dirname(os.path.abspath(bursarcore.__file__))),
     os.environ.get("PYTHONPATH", "")])}


def _cmd(tmp_path, *args):
    ready = tmp_path / "ready.txt"
    if ready.exists():
        ready.unlink()
    return [sys.executable, "-m", "bursarcore", "serve", "--port", "0", "--ready-file",
            str(ready), "--log-level", "warning", *map(str, args)], ready


def _refused(tmp_path, *args, cwd=None) -> str:
    """Run ``bursar serve``; it must exit 2 within WAIT with one line on stderr (never a
    traceback), without ever accepting connections. Returns the line."""
    argv, ready = _cmd(tmp_path, *args)
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         cwd=cwd, env=ENV)
    end = time.monotonic() + WAIT
    while p.poll() is None and time.monotonic() < end:
        if ready.exists():
            p.kill()
            p.communicate(timeout=WAIT)
            pytest.fail("bursar serve started instead of refusing")
        time.sleep(0.05)
    if p.poll() is None:
        p.kill()
        p.communicate(timeout=WAIT)
        pytest.fail(f"bursar serve neither started nor exited within {WAIT} s")
    out, err = p.communicate(timeout=WAIT)
    assert p.returncode == 2, (p.returncode, err)
    assert "Traceback" not in err and err.count("\n") == 1 and err.startswith("bursar serve: ")
    return err.strip()


def _started(tmp_path, *args, cwd=None) -> subprocess.Popen:
    argv, ready = _cmd(tmp_path, *args)
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         cwd=cwd, env=ENV)
    end = time.monotonic() + WAIT
    while time.monotonic() < end:
        if ready.exists():
            return p
        if p.poll() is not None:
            pytest.fail(f"bursar serve exited with {p.returncode}: {p.communicate()[1]}")
        time.sleep(0.05)
    p.kill()
    p.communicate(timeout=WAIT)
    pytest.fail(f"bursar serve did not start within {WAIT} s")


def _stop(p: subprocess.Popen) -> None:
    p.terminate()
    p.communicate(timeout=WAIT)


def _journal(path, config) -> int:
    """A service journal at ``path`` (made in this process, then closed); its length."""
    svc = BrokerService.open(copy.deepcopy(config), str(path), create=True, tick=0)
    n = len(svc.journal)
    svc.journal.close()
    return n


def _tokens(path) -> bytes:
    TokenStore(path).mint(OPERATOR)
    return path.read_bytes()


# ------------------------------------------------------------------ made only when asked
def test_a_missing_journal_is_refused_and_nothing_is_made(tmp_path):
    j, tok = tmp_path / "bursar.db", tmp_path / "tokens.json"
    line = _refused(tmp_path, "--journal", j, "--tokens", tok)
    assert f"journal {j} does not exist" in line and "--init" in line
    assert not j.exists() and not tok.exists()
    assert not (tmp_path / "bursar.db.lock").exists()


def test_an_empty_journal_is_refused_not_started_afresh(tmp_path):
    j, tok = tmp_path / "bursar.db", tmp_path / "tokens.json"
    j.write_bytes(b"")
    before = _tokens(tok)
    line = _refused(tmp_path, "--journal", j, "--tokens", tok)
    assert f"journal {j} holds no records" in line and "--init" in line
    assert j.stat().st_size == 0 and tok.read_bytes() == before


def test_init_makes_a_journal_and_refuses_where_one_is(tmp_path, base_config):
    j, tok = tmp_path / "bursar.db", tmp_path / "tokens.json"
    cfg = tmp_path / "broker.json"
    cfg.write_text(json.dumps(file_form(base_config)))
    p = _started(tmp_path, "--journal", j, "--tokens", tok, "--config", cfg, "--init")
    _stop(p)
    assert j.stat().st_size > 0
    line = _refused(tmp_path, "--journal", j, "--tokens", tok, "--init")
    assert f"journal {j} already holds" in line and "without --init" in line
    _stop(_started(tmp_path, "--journal", j, "--tokens", tok))    # and it replays
    line = _refused(tmp_path, "--memory", "--init")
    assert "--init" in line and "--memory" in line


# ------------------------------------------------------------------ damage
def test_a_damaged_journal_is_refused_naming_the_record(tmp_path, base_config):
    j, tok = tmp_path / "bursar.db", tmp_path / "tokens.json"
    _journal(j, base_config)
    db = sqlite3.connect(j)
    db.execute("UPDATE journal SET crc = crc + 1 WHERE seq = 2")
    db.commit()
    db.close()
    before = _tokens(tok)
    line = _refused(tmp_path, "--journal", j, "--tokens", tok)
    assert f"journal {j} is damaged at record 2: checksum mismatch" in line
    assert tok.read_bytes() == before
    g = tmp_path / "garbage.db"
    g.write_bytes(b"not a journal at all " * 500)
    line = _refused(tmp_path, "--journal", g, "--tokens", tok)
    assert f"journal {g} is not a readable SQLite journal" in line


def test_a_lost_wal_file_is_refused_at_start(server_factory):
    srv = server_factory(name="wal")
    with BursarClient(srv.url, srv.tokens["alpha"], campaign="alpha") as c:
        seqs = [c.acquire(Intent("alpha", units={"gpu": 1}, duration=600)).seq
                for _ in range(20)]
    srv.kill()                                  # the -wal file holds what was committed
    wal = srv.journal_path.with_name(srv.journal_path.name + "-wal")
    assert wal.exists()
    wal.unlink()
    p = subprocess.run(srv.args, capture_output=True, text=True, timeout=WAIT, env=ENV)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert p.stderr.count("\n") == 1
    assert f"journal {srv.journal_path} ends at record" in p.stderr
    assert f"but {seqs[-1] + 1} records were acknowledged" in p.stderr


# ------------------------------------------------------------------ one server per journal
def test_one_server_per_journal_and_demo_makes_its_own(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    first = _started(tmp_path, "--demo", cwd=run)          # no journal yet: --demo makes one
    try:
        files = {n: (run / n).read_bytes() for n in
                 ("bursar-demo.db.tokens.json", "bursar-demo-credentials.json")}
        line = _refused(tmp_path, "--demo", cwd=run)
        assert f"journal bursar-demo.db is in use by another process (pid {first.pid})" in line
        # the second start touched neither the token store nor the demo credentials
        assert {n: (run / n).read_bytes() for n in files} == files
        line = _refused(tmp_path, "--journal", "bursar-demo.db", "--mint-operator", cwd=run)
        assert "in use by another process" in line and "POST /v1/campaigns" in line
        assert (run / "bursar-demo.db.tokens.json").read_bytes() == files[
            "bursar-demo.db.tokens.json"]
    finally:
        _stop(first)
    _stop(_started(tmp_path, "--demo", cwd=run))            # once it stopped: replayed


# ------------------------------------------------------------------ --mint
def test_mint_refuses_a_campaign_nobody_registered(tmp_path, base_config):
    j, tok = tmp_path / "bursar.db", tmp_path / "tokens.json"
    line = _refused(tmp_path, "--journal", j, "--tokens", tok, "--mint", "alpha")
    assert "--mint alpha: no such campaign" in line     # no journal, no configuration
    n = _journal(j, base_config)
    line = _refused(tmp_path, "--journal", j, "--tokens", tok, "--mint", "nosuch")
    assert "--mint nosuch: no such campaign" in line and str(j) in line
    assert not tok.exists()
    ok = subprocess.run([sys.executable, "-m", "bursarcore", "serve", "--journal", str(j),
                         "--tokens", str(tok), "--mint", "alpha"],
                        capture_output=True, text=True, timeout=WAIT, env=ENV)
    assert ok.returncode == 0 and ok.stdout.startswith("bsr_"), ok.stderr
    assert TokenStore(tok).authenticate(ok.stdout.strip()).campaign == "alpha"
    # a campaign the configuration would register is known too
    cfg = tmp_path / "more.json"
    cfg.write_text(json.dumps({"campaigns": {"delta": base_config["campaigns"]["alpha"]}}))
    ok = subprocess.run([sys.executable, "-m", "bursarcore", "serve", "--journal", str(j),
                         "--tokens", str(tok), "--config", str(cfg), "--mint", "delta"],
                        capture_output=True, text=True, timeout=WAIT, env=ENV)
    assert ok.returncode == 0 and ok.stdout.startswith("bsr_"), ok.stderr
    # and the journal was only read: it opens as it was
    again = SQLiteJournal(j)
    assert len(again) == n
    again.close()


def test_the_service_opens_only_what_was_made(tmp_path, base_config):
    from bursarcore.errors import JournalUnavailable

    j = tmp_path / "svc.db"
    with pytest.raises(JournalUnavailable) as e:
        BrokerService.open(copy.deepcopy(base_config), str(j), tick=0)
    assert e.value.kind == "missing" and not j.exists()
    n = _journal(j, base_config)
    svc = BrokerService.open(copy.deepcopy(base_config), str(j), tick=0)
    assert len(svc.journal) == n and sorted(svc.broker.campaigns) == sorted(base_config["campaigns"])
    with pytest.raises(JournalUnavailable) as e:                # while it is open
        BrokerService.open(copy.deepcopy(base_config), str(j), tick=0)
    assert e.value.kind == "locked"
    svc.journal.close()
    bad = copy.deepcopy(base_config)
    bad["campaigns"]["zeta"] = {"credits": -1}
    with pytest.raises(ValueError):
        BrokerService.open(bad, str(j), tick=0)
    # the failed start committed nothing and let go of the journal
    svc = BrokerService.open(copy.deepcopy(base_config), str(j), tick=0)
    assert len(svc.journal) == n and "zeta" not in svc.broker.campaigns
    svc.journal.close()
    os.unlink(j)
