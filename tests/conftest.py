"""Shared fixtures: one parametrisation over every usable backend (propcache's habit).

``backend`` yields a broker backend *name* ("compiled": the C core; "reference": the
broker written from the specification); with ``BURSARCORE_NO_EXTENSIONS=1`` only
"reference" exists. Suites (admission, leases, flow)
take ``backend`` and pick their own class for that name. ``TB`` is the token-bucket class of
every usable bucket backend ("cython" and "cffi", the two bindings of the C core, and
"reference").

Hypothesis profiles, chosen by ``HYPOTHESIS_PROFILE``:

* ``default`` — deterministic (``derandomize``), no deadline, modest example counts, so the
  whole suite stays fast and a failure reproduces on every machine;
* ``ci`` — deterministic too, several times more examples;
* ``thorough`` — random seeds and many examples, for a long local soak.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

from bursarcore.broker import BACKENDS as ENGINE_BACKENDS
from bursarcore.buckets import BACKENDS

settings.register_profile("default", derandomize=True, deadline=None, database=None,
                          max_examples=60, print_blob=True)
settings.register_profile("ci", derandomize=True, deadline=None, database=None,
                          max_examples=300, print_blob=True)
settings.register_profile("thorough", derandomize=False, deadline=None, max_examples=3000,
                          print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


@pytest.fixture(params=sorted(ENGINE_BACKENDS), scope="session")
def backend(request: pytest.FixtureRequest) -> str:
    """The name of a usable engine backend; every test taking it runs once per backend."""
    return request.param


@pytest.fixture(params=list(BACKENDS), scope="session")
def TB(request: pytest.FixtureRequest) -> type:  # noqa: N802 - a class, named like one
    """A usable ``TokenBuckets`` class; every test taking it runs once per bucket backend."""
    return BACKENDS[request.param]



@pytest.fixture(params=list(ENGINE_BACKENDS))
def eb(request: pytest.FixtureRequest) -> str:
    """The name of a usable policy-engine backend (``Broker(backend=eb)``); every test
    taking it runs once per engine."""
    return request.param
