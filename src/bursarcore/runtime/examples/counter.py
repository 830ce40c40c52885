"""An example stateful agent: counts ``--steps`` steps of ``--step-seconds`` each.

Run by the ``counter`` plugin (:class:`bursarcore.runtime.plugins.CounterPlugin`) as
``python -m bursarcore.runtime.examples.counter --steps N --step-seconds S`` in the task's
workspace. After every step it rewrites ``state.json`` atomically (``{"step": k, ...}``,
``k`` = steps completed), so whatever moment a checkpoint is taken it holds a whole step.
On start it continues from the step in ``state.json``. On SIGTERM it stops within one
sleep slice (at most 50 ms), writes its state and exits 143 (128 + SIGTERM).

It uses only the standard library (``python -m`` still imports the ``bursarcore``
package it lives in).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from typing import Any

__all__ = ["write_state", "read_state", "main"]

SLICE = 0.05


def write_state(path: str, state: dict[str, Any]) -> None:
    """Replace ``path`` with ``state`` as JSON (temp file + rename: never half-written)."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(json.dumps(state))
    os.replace(tmp, path)


def read_state(path: str) -> dict[str, Any]:
    """The state in ``path``, or a fresh one if the file is absent."""
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        return {"step": 0, "resumed_at_step": None, "checkpoints_resumed": 0}
    if not isinstance(data, dict) or not isinstance(data.get("step"), int):
        raise SystemExit(f"counter: {path} is not a counter state")
    return data


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bursarcore.runtime.examples.counter")
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--step-seconds", type=float, default=0.1)
    ap.add_argument("--state", default="state.json")
    a = ap.parse_args(argv)
    if a.steps < 0 or a.step_seconds < 0:
        ap.error("--steps and --step-seconds must be >= 0")
    stop = False

    def on_term(signum, frame):
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    state = read_state(a.state)
    state.setdefault("checkpoints_resumed", 0)
    state.setdefault("resumed_at_step", None)
    state["steps"] = a.steps
    print(f"counter: starting at step {state['step']} of {a.steps}", flush=True)
    while state["step"] < a.steps and not stop:
        end = time.monotonic() + a.step_seconds
        while not stop and (left := end - time.monotonic()) > 0:
            time.sleep(min(SLICE, left))
        if stop:
            break
        state["step"] += 1
        write_state(a.state, state)
    write_state(a.state, state)
    if stop:
        print(f"counter: SIGTERM at step {state['step']}; state saved", file=sys.stderr, flush=True)
        return 128 + signal.SIGTERM
    print(f"counter: done, {state['step']} steps", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
