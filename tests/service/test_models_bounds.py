"""The HTTP schema's numeric bounds are the library's (``bursarcore.units``): a value at a
bound is accepted, the next one above is a 422 naming the field; and the models read the
constants themselves (change one before the models are made and the schema follows)."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
from pydantic import ValidationError

from bursarcore import units as U
from bursarcore.service import models as M
from bursarcore.service.models import (ConsumeIn, EnvelopeIn, IntentIn, NodesIn, QuoteIn,
                                       RemoveNodesIn, RenewIn)


def _above(x: float) -> float:
    return x + 1 if isinstance(x, int) else math.nextafter(float(x), math.inf) * (1 + 1e-12)


# (what, build(value) -> model, the bound, the field's loc)
UPPER = [
    ("intent max", lambda v: IntentIn(max=v, duration=60), U.MAX_UNITS, ("max",)),
    ("intent min", lambda v: IntentIn(min=v, max=U.MAX_UNITS, duration=60), U.MAX_UNITS,
     ("min",)),
    ("intent duration", lambda v: IntentIn(max=1, duration=v), U.MAX_DURATION, ("duration",)),
    ("intent ttl", lambda v: IntentIn(max=1, duration=60, ttl=v), U.MAX_TTL, ("ttl",)),
    ("intent max_spend", lambda v: IntentIn(max=1, duration=60, max_spend=v), U.MAX_CREDITS,
     ("max_spend",)),
    ("intent deadline", lambda v: IntentIn(max=1, duration=60, deadline=v), M.MAX_TIME,
     ("deadline",)),
    ("quote size", lambda v: QuoteIn(sizes=[v], durations=[60]), U.MAX_UNITS, ("sizes", 0)),
    ("quote duration", lambda v: QuoteIn(sizes=[1], durations=[v]), U.MAX_DURATION,
     ("durations", 0)),
    ("renew duration", lambda v: RenewIn(duration=v), U.MAX_DURATION, ("duration",)),
    ("renew max_spend", lambda v: RenewIn(duration=1, max_spend=v), U.MAX_CREDITS,
     ("max_spend",)),
    ("consume amount", lambda v: ConsumeIn(dim="fs", amount=v), U.MAX_AMOUNT, ("amount",)),
    ("credits", lambda v: EnvelopeIn(credits=v), U.MAX_CREDITS, ("credits",)),
    ("sustained", lambda v: EnvelopeIn(credits=1, sustained={"fs": v}), U.MAX_AMOUNT,
     ("sustained", "fs")),
    ("burst", lambda v: EnvelopeIn(credits=1, burst={"fs": v}), max(U.MAX_BURST, U.MAX_AMOUNT),
     ("burst", "fs")),
    ("node slots", lambda v: NodesIn(nodes=[{"name": "n1", "slots": v}]), U.MAX_UNITS,
     ("nodes", 0, "slots")),
    ("grace", lambda v: RemoveNodesIn(nodes=["n1"], grace=v), U.MAX_DURATION, ("grace",)),
]

LOWER = [
    ("intent max", lambda v: IntentIn(max=v, duration=60), 1, ("max",)),
    ("intent min", lambda v: IntentIn(min=v, max=4, duration=60), 1, ("min",)),
    ("intent duration", lambda v: IntentIn(max=1, duration=v), U.MIN_DURATION, ("duration",)),
    ("renew duration", lambda v: RenewIn(duration=v), U.MIN_DURATION, ("duration",)),
    ("node slots", lambda v: NodesIn(nodes=[{"name": "n1", "slots": v}]), 1,
     ("nodes", 0, "slots")),
]


@pytest.mark.parametrize("what,build,bound,loc", UPPER, ids=[u[0] for u in UPPER])
def test_a_value_at_the_librarys_upper_bound_is_accepted_and_just_above_is_not(
        what, build, bound, loc):
    build(bound)
    with pytest.raises(ValidationError) as e:
        build(_above(bound))
    assert [tuple(x["loc"]) for x in e.value.errors()] == [loc]


@pytest.mark.parametrize("what,build,bound,loc", LOWER, ids=[u[0] for u in LOWER])
def test_a_value_at_the_lower_bound_is_accepted_and_just_below_is_not(what, build, bound, loc):
    build(bound)
    below = bound - 1 if isinstance(bound, int) else math.nextafter(bound, 0.0) * (1 - 1e-9)
    with pytest.raises(ValidationError) as e:
        build(below)
    assert [tuple(x["loc"]) for x in e.value.errors()] == [loc]


def test_ttl_must_be_positive():
    with pytest.raises(ValidationError, match="ttl"):
        IntentIn(max=1, duration=60, ttl=0)


def test_held_dimensions_take_their_own_bounds_once_the_pool_is_known():
    env = EnvelopeIn(credits=1, ceiling={"gpu": U.MAX_UNITS, "fs": U.MAX_AMOUNT},
                     burst={"gpu": U.MAX_BURST, "fs": U.MAX_AMOUNT})
    assert env.dim_errors(["gpu"], ["fs"]) == []
    env = EnvelopeIn(credits=1, ceiling={"gpu": U.MAX_UNITS + 1},
                     burst={"gpu": _above(U.MAX_BURST), "fs": U.MAX_AMOUNT})
    locs = [e["loc"] for e in env.dim_errors(["gpu"], ["fs"])]
    assert locs == [("body", "envelope", "ceiling", "gpu"), ("body", "envelope", "burst", "gpu")]
    assert EnvelopeIn(credits=1, burst={"gpu": None}).dim_errors(["gpu"], []) == []


def test_over_http_a_zero_unit_intent_and_huge_numbers_are_422_naming_the_field():
    pytest.importorskip("fastapi")
    from bursarcore.service.testing import InProcessService

    svc = InProcessService({"pool": {"gpu": 8}, "campaigns": {"a": {"credits": 100,
                                                                   "ceiling": {"gpu": 8}}}})
    with svc.client() as http:
        h = svc.headers("a")
        for body, field in (({"min": 0, "max": 4, "duration": 60}, "min"),
                            ({"max": 2 ** 40, "duration": 60}, "max"),
                            ({"max": 1, "duration": 60, "max_spend": 9.3e12}, "max_spend"),
                            ({"max": 1, "duration": 60, "ttl": 86401}, "ttl")):
            r = http.post("/v1/campaigns/a/intents", json=body, headers=h)
            assert r.status_code == 422, (body, r.text)
            assert [e["loc"] for e in r.json()["detail"]] == [["body", field]], r.text
        assert svc.broker.leases("a") == []
        op = svc.headers("operator")
        r = http.post("/v1/campaigns", headers=op, json={
            "name": "b", "envelope": {"credits": 1, "ceiling": {"gpu": U.MAX_UNITS + 1}}})
        assert r.status_code == 422
        assert r.json()["detail"][0]["loc"] == ["body", "envelope", "ceiling", "gpu"]
        assert "b" not in svc.broker.campaigns


def test_the_models_read_the_librarys_constants():
    """Change the library's constants before the models are made: their bounds follow."""
    code = ("import bursarcore.units as u\n"
            "u.MAX_DURATION = 1234; u.MAX_UNITS = 77; u.MAX_CREDITS = 55.0; u.MAX_TTL = 9.0\n"
            "from bursarcore.service import models as m\n"
            "s = m.IntentIn.model_json_schema()['properties']\n"
            "assert s['duration']['maximum'] == 1234, s['duration']\n"
            "assert s['max']['maximum'] == 77, s['max']\n"
            "assert s['max_spend']['anyOf'][0]['maximum'] == 55.0, s['max_spend']\n"
            "assert s['ttl']['anyOf'][0]['maximum'] == 9.0, s['ttl']\n"
            "g = m.RemoveNodesIn.model_json_schema()['properties']['grace']\n"
            "assert g['maximum'] == 1234, g\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
