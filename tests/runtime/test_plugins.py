"""Plugins (SPEC §13): hook defaults, the built-in plugins, entry-point loading, the
example counter agent, secrets files and redaction. No subprocesses, no sleeps."""

from __future__ import annotations

import json
import logging
import os
import sys
from importlib import metadata

import pytest

from bursarcore.errors import InvalidArgument
from bursarcore.runtime import plugins
from bursarcore.runtime.examples import counter
from bursarcore.runtime.plugins import (
    ENTRY_POINT_GROUP,
    CommandPlugin,
    CounterPlugin,
    Plugin,
    SecretRedactor,
    TaskContext,
    load_plugin,
    load_secrets,
)


def _ctx(tmp_path, payload, **kw):
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    return TaskContext("t1", payload, str(ws), **kw)


# ---------------------------------------------------------------------- hooks
def test_base_plugin_defaults(tmp_path):
    p, ctx = Plugin(), _ctx(tmp_path, {})
    assert p.setup(ctx) is None
    assert dict(p.environment(ctx)) == {}
    assert p.heartbeat(ctx) is None
    assert p.save(ctx) == b""
    assert p.restore(ctx, b"x") is None
    assert p.result(ctx, 0) == {"returncode": 0}
    with pytest.raises(NotImplementedError):
        p.command(ctx)


def test_context_repr_hides_secrets(tmp_path):
    ctx = _ctx(tmp_path, {}, secrets={"TOKEN": "s3cr3t-value"})
    assert "s3cr3t-value" not in repr(ctx)


def test_command_plugin(tmp_path):
    p = load_plugin("command")
    assert isinstance(p, CommandPlugin)
    ctx = _ctx(tmp_path, {"plugin": "command", "argv": ["echo", "hi"], "env": {"A": "1"},
                          "result_file": "out/r.json"})
    p.setup(ctx)
    assert p.command(ctx) == ["echo", "hi"] and dict(p.environment(ctx)) == {"A": "1"}
    os.makedirs(os.path.join(ctx.workspace, "out"))
    with open(os.path.join(ctx.workspace, "out", "r.json"), "w") as f:
        json.dump({"patch": "diff"}, f)
    assert p.result(ctx, 0) == {"returncode": 0, "output": {"patch": "diff"}}


@pytest.mark.parametrize("payload, field", [
    ({"argv": []}, "payload.argv"),
    ({"argv": "echo hi"}, "payload.argv"),
    ({"argv": ["echo", 3]}, "payload.argv"),
    ({"argv": ["echo"], "env": {"A": 1}}, "payload.env"),
    ({"argv": ["echo"], "env": {"BAD-NAME": "1"}}, "payload.env"),
    ({"argv": ["echo"], "result_file": "/etc/passwd"}, "payload.result_file"),
    ({"argv": ["echo"], "result_file": "../x"}, "payload.result_file"),
    (["echo"], "payload"),
])
def test_command_plugin_rejects_bad_payloads(tmp_path, payload, field):
    with pytest.raises(InvalidArgument) as e:
        CommandPlugin().setup(_ctx(tmp_path, payload))
    assert e.value.field == field


@pytest.mark.parametrize("payload, field", [
    ({"steps": -1}, "payload.steps"),
    ({"steps": True}, "payload.steps"),
    ({}, "payload.steps"),
    ({"steps": 3, "step_seconds": -0.1}, "payload.step_seconds"),
])
def test_counter_plugin_rejects_bad_payloads(tmp_path, payload, field):
    with pytest.raises(InvalidArgument) as e:
        CounterPlugin().setup(_ctx(tmp_path, payload))
    assert e.value.field == field


def test_counter_plugin_save_restore_marks_the_resume(tmp_path):
    p = load_plugin("counter")
    ctx = _ctx(tmp_path, {"plugin": "counter", "steps": 10, "step_seconds": 0})
    p.setup(ctx)
    argv = p.command(ctx)
    assert argv[:3] == [sys.executable, "-m", "bursarcore.runtime.examples.counter"]
    assert plugins.runtime_dir() in p.environment(ctx)["PYTHONPATH"].split(os.pathsep)
    assert p.heartbeat(ctx) is None and p.save(ctx) == b""
    # the agent ran four steps, then was stopped
    counter.write_state(os.path.join(ctx.workspace, "state.json"),
                        {"step": 4, "resumed_at_step": None, "checkpoints_resumed": 0})
    assert p.heartbeat(ctx) == {"step": 4, "steps": 10}
    state = p.save(ctx)
    # a later worker: the workspace comes back from the checkpoint, then restore()
    os.unlink(os.path.join(ctx.workspace, "state.json"))
    p2 = load_plugin("counter")
    ctx2 = _ctx(tmp_path, ctx.payload, resumed_from=1)
    p2.restore(ctx2, state)
    assert counter.main(["--steps", "10", "--step-seconds", "0",
                         "--state", os.path.join(ctx2.workspace, "state.json")]) == 0
    assert p2.result(ctx2, 0) == {"steps": 10, "resumed_at_step": 4, "checkpoints_resumed": 1}
    # a second preemption and resume counts again
    p2.restore(ctx2, p2.save(ctx2))
    assert p2.result(ctx2, 0)["checkpoints_resumed"] == 2


def test_counter_restore_of_empty_state_is_a_fresh_start(tmp_path):
    p = CounterPlugin()
    ctx = _ctx(tmp_path, {"steps": 2})
    p.restore(ctx, b"")
    assert not os.path.exists(os.path.join(ctx.workspace, "state.json"))


def test_counter_agent_counts_and_continues(tmp_path):
    st = str(tmp_path / "state.json")
    assert counter.main(["--steps", "3", "--step-seconds", "0", "--state", st]) == 0
    assert counter.read_state(st)["step"] == 3
    assert counter.main(["--steps", "5", "--step-seconds", "0", "--state", st]) == 0
    assert counter.read_state(st)["step"] == 5


# ---------------------------------------------------------------------- loading
class _EP:
    """Stands in for importlib.metadata.EntryPoint (name, value, load)."""

    def __init__(self, name, value, target=None, error=None):
        self.name, self.value, self.group = name, value, ENTRY_POINT_GROUP
        self._target, self._error = target, error

    def load(self):
        if self._error:
            raise self._error
        return self._target


def _patch_eps(monkeypatch, eps, calls=None):
    def fake(**kw):
        if calls is not None:
            calls.append(kw)
        assert kw == {"group": ENTRY_POINT_GROUP}
        return eps
    monkeypatch.setattr(plugins.metadata, "entry_points", fake)


def test_entry_point_plugin_is_loaded(monkeypatch, tmp_path):
    mod = tmp_path / "my_agent_plugin.py"
    mod.write_text("from bursarcore.runtime.plugins import Plugin\n"
                   "class Mine(Plugin):\n"
                   "    name = 'mine'\n"
                   "    def command(self, ctx):\n"
                   "        return ['mine', ctx.task_id]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    ep = metadata.EntryPoint(name="mine", value="my_agent_plugin:Mine", group=ENTRY_POINT_GROUP)
    calls = []
    _patch_eps(monkeypatch, [ep], calls)
    p = load_plugin("mine")
    assert type(p).__name__ == "Mine" and p.command(_ctx(tmp_path, {})) == ["mine", "t1"]
    assert calls and plugins.available_plugins() == ["command", "counter", "mine"]


def test_builtins_work_without_metadata(monkeypatch):
    _patch_eps(monkeypatch, [])
    assert isinstance(load_plugin("command"), CommandPlugin)
    assert isinstance(load_plugin("counter"), CounterPlugin)


def test_broken_entry_point_of_a_builtin_falls_back(monkeypatch, caplog):
    _patch_eps(monkeypatch, [_EP("counter", "gone:Counter", error=ImportError("no module gone"))])
    caplog.set_level(logging.WARNING, "bursarcore.runtime.plugins")
    assert isinstance(load_plugin("counter"), CounterPlugin)
    assert "failed to load" in caplog.text


def test_plugin_errors_are_clear(monkeypatch):
    _patch_eps(monkeypatch, [_EP("broken", "gone:X", error=ImportError("no module gone")),
                             _EP("notaplugin", "m:f", target=lambda: object())])
    with pytest.raises(InvalidArgument, match="unknown plugin; available: broken, command, counter"):
        load_plugin("nope")
    with pytest.raises(InvalidArgument, match="failed to load"):
        load_plugin("broken")
    with pytest.raises(InvalidArgument, match="must give a bursarcore"):
        load_plugin("notaplugin")
    with pytest.raises(InvalidArgument):
        load_plugin("")


# ---------------------------------------------------------------------- secrets
def _secrets_file(tmp_path, text, mode=0o600):
    p = tmp_path / "secrets.env"
    p.write_text(text)
    os.chmod(p, mode)
    return p


def test_load_secrets_parses(tmp_path):
    p = _secrets_file(tmp_path, "# api keys\n\nOPENAI_API_KEY=sk-abc=def\nexport B = 'quoted value'\n"
                                "C=\"dq\"\nEMPTY=\n")
    assert load_secrets(p) == {"OPENAI_API_KEY": "sk-abc=def", "B": "quoted value", "C": "dq",
                               "EMPTY": ""}


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o620, 0o602, 0o660])
def test_load_secrets_refuses_group_or_other_access(tmp_path, mode):
    p = _secrets_file(tmp_path, "K=very-secret\n", mode)
    with pytest.raises(InvalidArgument, match="chmod 600") as e:
        load_secrets(p)
    assert e.value.field == "secrets" and "very-secret" not in str(e.value)


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_load_secrets_refuses_a_file_owned_by_someone_else(tmp_path):
    p = _secrets_file(tmp_path, "K=v\n")
    os.chown(p, 12345, 12345)
    with pytest.raises(InvalidArgument, match="must be owned by uid"):
        load_secrets(p)


def test_load_secrets_refuses_links_missing_files_and_bad_lines(tmp_path):
    real = _secrets_file(tmp_path, "K=v\n")
    link = tmp_path / "link.env"
    os.symlink(real, link)
    with pytest.raises(InvalidArgument, match="cannot open"):
        load_secrets(link)
    with pytest.raises(InvalidArgument, match="cannot open"):
        load_secrets(tmp_path / "absent")
    bad = tmp_path / "bad.env"
    bad.write_text("GOOD=1\nthis line leaks-the-value\n")
    os.chmod(bad, 0o600)
    with pytest.raises(InvalidArgument) as e:
        load_secrets(bad)
    assert e.value.field == "secrets line 2" and "leaks-the-value" not in str(e.value)


def test_redactor_scrubs_log_records(caplog):
    red = SecretRedactor(["s3cr3t-token", "tok", ""])
    logger = logging.getLogger("bursarcore.test.redact")
    handler_records = []

    class Keep(logging.Handler):
        def emit(self, record):
            handler_records.append(self.format(record))

    h = Keep()
    red.install(logging.getLogger())  # idempotent, harmless for pytest's handlers
    logging.getLogger().addHandler(h)
    red.install()
    try:
        logger.warning("key %s and %s", "s3cr3t-token", "tok")
        try:
            raise RuntimeError("bad key s3cr3t-token")
        except RuntimeError:
            logger.exception("failed with %r", {"k": "s3cr3t-token"})
    finally:
        logging.getLogger().removeHandler(h)
        for x in logging.getLogger().handlers:
            x.removeFilter(red)
    text = "\n".join(handler_records)
    assert "s3cr3t-token" not in text and "tok" not in text.replace("Traceback", "")
    assert "key *** and ***" in text and "RuntimeError: bad key ***" in text


def test_redact_json():
    red = SecretRedactor(["hunter2"])
    obj = {"out": ["password hunter2", 3, None], "hunter2": {"x": "hunter2hunter2"}}
    assert red.redact_json(obj) == {"out": ["password ***", 3, None], "***": {"x": "******"}}
    assert SecretRedactor().redact_json(obj) is obj


def test_load_secrets_refuses_binary(tmp_path):
    p = tmp_path / "bin.env"
    p.write_bytes(b"K=\xff\xfe\n")
    os.chmod(p, 0o600)
    with pytest.raises(InvalidArgument, match="UTF-8"):
        load_secrets(p)


def test_plugin_name_of_a_payload():
    from bursarcore.runtime.plugins import plugin_name

    assert plugin_name({"plugin": "counter"}) == "counter"
    assert plugin_name({"argv": ["true"]}) == "command"
    assert plugin_name(["not", "an", "object"]) == "command"
    assert plugin_name(None) == "command"
    assert plugin_name({"plugin": 5}) == 5        # refused where it is checked
