"""A stateful fuzz of the HTTP API in this process, on a manual clock: random sequences of
valid and invalid requests from several campaigns (and the operator), with extreme numbers
and wrong types. After every request: never a 5xx; a 4xx changes nothing (the operator's
``/v1/state`` is the same before and after); a request with campaign A's token that is
refused or rejected changes nothing of any other campaign. At the end the journal replays
(:meth:`Broker.replay`) to the same state.

Bounded for the default run: ``BURSAR_FUZZ_EXAMPLES`` sequences (default 25) of at most 30
requests each."""

from __future__ import annotations

import copy
import json
import math
import os

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from bursarcore import Broker, ManualClock
from bursarcore import units as U
from bursarcore.service.core import json_safe
from bursarcore.service.testing import InProcessService
from service_classes import CLASSES

CONFIG = {
    "pool": {"gpu": 32, "flow": {"fs": 10.0}},
    "classes": copy.deepcopy(CLASSES),
    "campaigns": {
        "a": {"credits": 500, "service_class": "agent-burst", "guaranteed": {"gpu": 4},
              "sustained": {"gpu": 8, "fs": 2}, "ceiling": {"gpu": 16, "fs": 4},
              "burst": {"gpu": 20000, "fs": 10}},
        "b": {"credits": 500, "service_class": "interactive", "guaranteed": {"gpu": 4},
              "sustained": {"gpu": 8, "fs": 2}, "ceiling": {"gpu": 16, "fs": 4},
              "burst": {"gpu": 20000, "fs": 10}},
        "c": {"credits": None, "service_class": "opportunistic", "sustained": {"gpu": 32},
              "ceiling": {"gpu": 32}, "burst": {"gpu": None}},
    },
}
CAMPAIGNS = ("a", "b", "c")

# numbers at and past every bound, and values of the wrong type; none is left out (the
# schema refuses each out-of-range number before the broker sees it)
EXTREME = st.sampled_from([
    0, -0.0, -1, 1, 0.5, 1e-9, U.MIN_DURATION, 1e308, -1e308, 2 ** 63, -(2 ** 63), 2 ** 64,
    U.MAX_UNITS, U.MAX_UNITS + 1, U.MAX_CREDITS, U.MAX_CREDITS * 1.0001, U.MAX_TTL,
    U.MAX_TTL + 1, U.MAX_DURATION, U.MAX_DURATION + 1, U.MAX_AMOUNT, U.MAX_AMOUNT * 2,
    4.0e9, 4.1e9, True, False, None, "60", "x" * 5000, [], {}, [1], {"a": 1}])
SMALL = st.one_of(st.integers(1, 40), st.floats(0.001, 4000, allow_nan=False))
VALUE = st.one_of(SMALL, SMALL, SMALL, EXTREME)
DIM = st.sampled_from(["gpu", "gpu", "gpu", "fs", "tpu", "", None, 5, "g" * 300])
FLOW = st.sampled_from(["fs", "fs", "fs", "gpu", "tpu", None, 5])
CLASS = st.sampled_from([None, None, "interactive", "opportunistic", "vip", 3])


def _maybe(strategy):
    return st.one_of(st.just(None), strategy)


@st.composite
def intent_body(draw):
    """Mostly a valid intent; often one or two of its fields replaced by an extreme value,
    a wrong type or an unknown name; now and then an unknown field."""
    hi = draw(st.integers(1, 16))
    body = {"max": hi, "duration": draw(st.sampled_from([1.0, 60.0, 600.0, 3600.0]))}
    if draw(st.booleans()):
        body["min"] = draw(st.integers(1, hi))
    if draw(st.integers(0, 3)) == 0:
        body["ttl"] = draw(st.sampled_from([1.0, 30.0, 3600.0]))
    if draw(st.integers(0, 3)) == 0:
        body["max_spend"] = draw(st.sampled_from([0.0, 1.0, 50.0, 1000.0]))
    if draw(st.integers(0, 3)) == 0:
        body["service_class"] = draw(CLASS)
    for _ in range(draw(st.sampled_from([0, 0, 1, 2]))):
        key = draw(st.sampled_from(["max", "min", "duration", "deadline", "max_spend", "ttl",
                                    "dim", "service_class"]))
        body[key] = draw(DIM if key == "dim" else CLASS if key == "service_class" else EXTREME)
    if draw(st.integers(0, 20)) == 0:
        body["colour"] = "red"
    return body


class ServiceFuzz(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.svc = InProcessService(CONFIG)
        self.http = self.svc.client().__enter__()
        self.leases: list[int] = []
        self.intents: list[int] = []
        self.requests = 0

    def teardown(self) -> None:
        try:
            state = self._state()
            replayed = Broker.replay(self.svc.service.journal,
                                     clock=ManualClock(self.svc.clock.now()))
            assert json.loads(json.dumps(json_safe(replayed.state()))) == state
        finally:
            self.http.__exit__(None, None, None)

    # ------------------------------------------------------------------ helpers
    def _state(self) -> dict:
        r = self.http.get("/v1/state", headers=self.svc.headers("operator"))
        assert r.status_code == 200, r.text
        return r.json()

    @staticmethod
    def _of(state: dict, campaign: str) -> dict:
        return {"campaign": state["campaigns"][campaign],
                "leases": [l for l in state["leases"] if l["campaign"] == campaign],
                "pending": [p for p in state["pending"] if p["campaign"] == campaign]}

    def _send(self, who: str, method: str, url: str, body=None, **kw):
        before = self._state()
        args = {"headers": self.svc.headers(who), **kw}
        if body is not None:
            args["content"] = json.dumps(body, allow_nan=True)
            args["headers"] = {**args["headers"], "content-type": "application/json"}
        r = getattr(self.http, method)(url, **args) if method != "post" and method != "put" \
            else self.http.request(method.upper(), url, **args)
        self.requests += 1
        assert r.status_code < 500, (method, url, body, r.status_code, r.text)
        after = self._state()
        if 400 <= r.status_code < 500:
            assert after == before, (method, url, body, r.status_code, r.text)
        elif who != "operator":
            doc = r.json() if r.headers.get("content-type", "").startswith("application/json") \
                else {}
            refused = isinstance(doc, dict) and doc.get("outcome") == "refused"
            for other in CAMPAIGNS:
                if other != who and (refused or r.status_code >= 400):
                    assert self._of(after, other) == self._of(before, other), (url, body)
        return r

    # ------------------------------------------------------------------ rules
    @rule(who=st.sampled_from(CAMPAIGNS), where=st.sampled_from(CAMPAIGNS),
          body=intent_body())
    def acquire(self, who, where, body):
        r = self._send(who, "post", f"/v1/campaigns/{where}/intents", body)
        if r.status_code in (201, 202):
            d = r.json()
            assert who == where
            self.intents.append(d["intent_id"])
            if d["lease"] is not None:
                self.leases.append(d["lease"]["id"])
        elif who != where:
            assert r.status_code in (404, 422), r.text

    @rule(who=st.sampled_from(CAMPAIGNS), where=st.sampled_from(CAMPAIGNS),
          bodies=st.lists(intent_body(), min_size=1, max_size=4))
    def acquire_batch(self, who, where, bodies):
        self._send(who, "post", f"/v1/campaigns/{where}/intents/batch", {"intents": bodies})

    @precondition(lambda self: self.leases)
    @rule(who=st.sampled_from(CAMPAIGNS), data=st.data(),
          action=st.sampled_from(["release", "renew", "get"]),
          duration=VALUE, max_spend=_maybe(VALUE))
    def lease_op(self, who, data, action, duration, max_spend):
        lid = data.draw(st.one_of(st.sampled_from(self.leases), st.sampled_from(
            [-1, 10 ** 6, 2 ** 62, 2 ** 63])))
        base = f"/v1/campaigns/{who}/leases/{lid}"
        if action == "release":
            self._send(who, "post", base + "/release")
        elif action == "renew":
            body = {"duration": duration}
            if max_spend is not None:
                body["max_spend"] = max_spend
            self._send(who, "post", base + "/renew", body)
        else:
            self._send(who, "get", base)

    @precondition(lambda self: self.intents)
    @rule(who=st.sampled_from(CAMPAIGNS), data=st.data(), cancel=st.booleans())
    def intent_op(self, who, data, cancel):
        iid = data.draw(st.one_of(st.sampled_from(self.intents), st.sampled_from([-5, 2 ** 63])))
        url = f"/v1/campaigns/{who}/intents/{iid}"
        self._send(who, "delete" if cancel else "get", url)

    @rule(who=st.sampled_from(CAMPAIGNS), dim=FLOW, amount=VALUE)
    def consume(self, who, dim, amount):
        self._send(who, "post", f"/v1/campaigns/{who}/consume", {"dim": dim, "amount": amount})

    @rule(who=st.sampled_from(CAMPAIGNS),
          sizes=st.lists(VALUE, min_size=0, max_size=3),
          durations=st.lists(VALUE, min_size=0, max_size=3), cls=CLASS)
    def quote(self, who, sizes, durations, cls):
        body = {"sizes": sizes, "durations": durations}
        if cls is not None:
            body["service_class"] = cls
        self._send(who, "post", f"/v1/campaigns/{who}/quote", body)

    @rule(who=st.sampled_from(CAMPAIGNS), where=st.sampled_from(CAMPAIGNS),
          after=st.sampled_from([-1, 0, 5, 2 ** 62, 2 ** 63, "x"]),
          limit=st.sampled_from([1, 3, 1000, 0, 1001, "y"]),
          what=st.sampled_from(["intents", "leases", "supply", "events", "journal"]))
    def reads(self, who, where, after, limit, what):
        params = {} if what == "supply" else {"after": after, "limit": limit}
        self._send(who, "get", f"/v1/campaigns/{where}/{what}", params=params)

    @rule(body=st.one_of(st.just("not json"), st.just([]), st.just({"max": float("nan"),
                                                                     "duration": 60}),
                         st.just({"max": 1, "duration": float("inf")})),
          who=st.sampled_from(CAMPAIGNS))
    def garbage(self, who, body):
        before = self._state()
        content = body if isinstance(body, str) else json.dumps(body, allow_nan=True)
        r = self.http.post(f"/v1/campaigns/{who}/intents", content=content,
                           headers={**self.svc.headers(who), "content-type": "application/json"})
        assert r.status_code == 422, r.text
        assert self._state() == before

    @rule(dim=DIM, slots=VALUE, grace=VALUE, remove=st.booleans())
    def pool_change(self, dim, slots, grace, remove):
        if remove:
            self._send("operator", "post", f"/v1/pool/{dim}/nodes/remove",
                       {"nodes": ["fuzz-node"], "grace": grace})
        else:
            self._send("operator", "post", f"/v1/pool/{dim}/nodes",
                       {"nodes": [{"name": "fuzz-node", "slots": slots}]})

    @rule(seconds=st.sampled_from([0.5, 1.0, 30.0, 700.0, 4000.0]))
    def advance(self, seconds):
        self.svc.clock.advance(seconds)
        self._send("operator", "get", "/v1/events", params={"limit": 10})

    @invariant()
    def healthy(self):
        if self.requests:
            assert self.svc.service.failed is None


ServiceFuzz.TestCase.settings = settings(
    max_examples=int(os.environ.get("BURSAR_FUZZ_EXAMPLES", "25")), stateful_step_count=30,
    deadline=None, derandomize=True, database=None,
    suppress_health_check=list(HealthCheck))
TestServiceFuzz = ServiceFuzz.TestCase
