"""Scenario simulator: agents under load against the real broker, the source document's
experiments, and a self-contained report (SPEC §10). See docs/simulator.md.

    from bursarcore.sim import load_scenario, Simulation
    res = Simulation(load_scenario("default")).run()     # SPEC §10's default scenario
    res.claims                                           # §10's claims beside this run
    write_outputs(res, "out/")                           # report.html, journal.jsonl, summary.json

``bursar simulate [SCENARIO] [--out DIR]`` and ``bursar experiments [--seeds N] [--jobs N]``
are the command-line faces (:mod:`bursarcore.sim.cli`). Matplotlib (the ``sim`` extra)
draws the figures; numba (the ``numba`` extra) compiles the population kernels.
"""

from .engine import Ledger, Simulation, run_scenario
from .metrics import CLAIMS, SimResult
from .report import render_html, write_outputs
from .scenario import (Scenario, ScenarioError, builtin_scenarios, load_scenario,
                       parse_scenario)

__all__ = ["Simulation", "Ledger", "run_scenario", "SimResult", "CLAIMS", "render_html",
           "write_outputs", "Scenario", "ScenarioError", "load_scenario", "parse_scenario",
           "builtin_scenarios"]
