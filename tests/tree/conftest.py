"""Envelopes as a tree (SPEC §14): every test here that builds a tree carries the ``tree``
marker; they run on every backend, as the rest of the suite does."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "tree: builds a tree of envelopes (SPEC §14)")
