"""Real Parsl (HighThroughputExecutor) on bursar leases. Parsl is an optional extra:
without it these tests skip."""

from __future__ import annotations

import pytest

pytest.importorskip("parsl")


def htex_config(provider, run_dir, *, workers: int = 2, retries: int = 2,
                strategy_period: float = 0.5, max_idletime: float = 2.0):
    """An HTEX config for tests: loopback only, quick heartbeats (a block torn down loses
    its manager within ~3 s, and Parsl retries its tasks elsewhere)."""
    from parsl.config import Config
    from parsl.executors import HighThroughputExecutor

    htex = HighThroughputExecutor(label="htex", provider=provider, max_workers_per_node=workers,
                                  heartbeat_period=1, heartbeat_threshold=3,
                                  address="127.0.0.1", loopback_address="127.0.0.1")
    return Config(executors=[htex], strategy="htex_auto_scale", strategy_period=strategy_period,
                  max_idletime=max_idletime, retries=retries, run_dir=str(run_dir),
                  usage_tracking=0)


@pytest.fixture
def make_config():
    return htex_config
