"""The service's bound on durations is the engine's (``admission.envelope.MAX_DURATION``),
one constant: an intent the API accepts is one the broker accepts, and no longer."""

from __future__ import annotations

import subprocess
import sys

import pytest
from pydantic import ValidationError

from bursarcore import Intent
from bursarcore.admission.envelope import MAX_DURATION
from bursarcore.errors import InvalidArgument
from bursarcore.service.models import IntentIn, QuoteIn, RemoveNodesIn, RenewIn


def test_the_api_accepts_durations_up_to_the_engines_bound_and_no_further():
    Intent("c", units={"gpu": 1}, duration=MAX_DURATION)
    with pytest.raises(InvalidArgument, match="duration"):
        Intent("c", units={"gpu": 1}, duration=MAX_DURATION + 1)
    assert IntentIn(max=1, duration=MAX_DURATION, ttl=MAX_DURATION).duration == MAX_DURATION
    assert RenewIn(duration=MAX_DURATION).duration == MAX_DURATION
    assert QuoteIn(sizes=[1], durations=[MAX_DURATION]).durations == [MAX_DURATION]
    assert RemoveNodesIn(nodes=["n1"], grace=MAX_DURATION).grace == MAX_DURATION
    for bad in (lambda: IntentIn(max=1, duration=MAX_DURATION + 1),
                lambda: IntentIn(max=1, duration=60, ttl=MAX_DURATION + 1),
                lambda: RenewIn(duration=MAX_DURATION + 1),
                lambda: QuoteIn(sizes=[1], durations=[MAX_DURATION + 1]),
                lambda: RemoveNodesIn(nodes=["n1"], grace=MAX_DURATION + 1)):
        with pytest.raises(ValidationError, match="less than or equal to"):
            bad()


def test_the_models_read_the_one_constant():
    """Change the engine's constant before the models are made: their bounds follow."""
    code = ("import bursarcore.admission.envelope as e\n"
            "e.MAX_DURATION = 1234\n"
            "from bursarcore.service import models as m\n"
            "s = m.IntentIn.model_json_schema()['properties']\n"
            "assert s['duration']['maximum'] == 1234, s['duration']\n"
            "g = m.RemoveNodesIn.model_json_schema()['properties']['grace']\n"
            "assert g['maximum'] == 1234, g\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
