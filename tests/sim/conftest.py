"""Shared short scenarios: the default scenario compressed to 2,400 simulated seconds (the
storm from 600 s to 1,800 s, a third of the tasks), so the suite stays fast."""

from __future__ import annotations

import pytest

from bursarcore.sim import load_scenario

SHORT = {
    "scenario.duration": 2400.0,
    "tasksets.science.count": 1000,
    "tasksets.science.arrival_window": 2000.0,
    "campaigns.storm.behaviour.start": 600.0,
    "campaigns.storm.behaviour.end": 1800.0,
}


def short_default(**more):
    return load_scenario("default").with_changes(**{**SHORT, **more})


@pytest.fixture(scope="session")
def short():
    """``short(**changes)``: the shortened default scenario, with more changes."""
    return short_default


@pytest.fixture(scope="session")
def short_result():
    from bursarcore.sim import Simulation

    return Simulation(short_default()).run()
