"""Fixtures for the binding tests (helpers in ``bindings_helpers``)."""

from __future__ import annotations

import pytest

from bindings_helpers import Script


@pytest.fixture
def script() -> Script:
    return Script()
