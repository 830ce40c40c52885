"""Shared by the tests that need the project's real single-node Slurm (scripts/slurm/up.sh):
one check of the cluster, and one rule — skip with the reason, or fail when
BURSAR_REQUIRE_SLURM=1 (as .ci/run sets)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest


def run(*cmd: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def cluster_problem(min_cpus: int = 1) -> str | None:
    """Why the cluster cannot run these tests, or None."""
    if shutil.which("sinfo") is None or shutil.which("sbatch") is None:
        return "Slurm client commands not found (run: bash scripts/slurm/up.sh)"
    try:
        ping = run("scontrol", "ping", timeout=15)
        if "is UP" not in ping.stdout:
            said = (ping.stdout + ping.stderr).strip().splitlines()[:1]
            return f"slurmctld not up: {said} (run: bash scripts/slurm/up.sh)"
        node = run("sinfo", "-h", "-o", "%t %c", timeout=15).stdout.split()
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"Slurm not answering: {exc}"
    if len(node) < 2 or not any(s in ("idle", "mix", "alloc", "comp") for s in node[::2]):
        return f"no usable node (sinfo {node}); run: bash scripts/slurm/up.sh"
    if max(int(c) for c in node[1::2] if c.isdigit()) < min_cpus:
        return f"the node needs at least {min_cpus} CPUs (sinfo {node})"
    return None


def require_cluster(min_cpus: int = 1) -> None:
    """Skip the calling test with the reason, or fail under BURSAR_REQUIRE_SLURM=1."""
    problem = cluster_problem(min_cpus)
    if problem:
        if os.environ.get("BURSAR_REQUIRE_SLURM") == "1":
            pytest.fail(f"BURSAR_REQUIRE_SLURM=1 but {problem}", pytrace=False)
        pytest.skip(problem)
