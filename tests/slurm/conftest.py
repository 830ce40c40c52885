"""Fixtures of the real-Slurm runtime tests."""

from __future__ import annotations

import os

import pytest

from runtime_slurm import cli
from slurm_cluster import require_cluster


@pytest.fixture
def queues():
    """Queue directories whose recorded arrays (and resubmitted jobs) are cancelled after
    the test."""
    require_cluster(min_cpus=1)
    made: list[str] = []
    yield made
    for q in made:
        if os.path.exists(os.path.join(q, "jobs.json")):
            cli("cancel", "--queue", q)
