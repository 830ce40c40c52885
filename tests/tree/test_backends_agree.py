"""The compiled broker and the reference broker, an independent reading of SPEC §14, see the
same operations on the same envelopes and give the same decisions, leases, events,
balances, holdings and journal, byte for byte: on flat sets of campaigns (no '/' in any
name: exactly the broker of SPEC §3–§4) and on random trees of envelopes, with adversaries
storming at their ceilings.

Runs where the compiled engine is built (the default run, and with
``BURSARCORE_BACKEND=cffi``, whose binding the compiled broker then uses); skipped with
``BURSARCORE_NO_EXTENSIONS=1``.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bursarcore import Broker, Envelope, Intent, ManualClock, Pool
from bursarcore.broker import ENGINES
from bursarcore.errors import BursarError
from bursarcore.journal.memory import MemoryJournal
from treegen import trees

if "compiled" not in ENGINES:      # pragma: no cover - nothing to compare against
    pytest.skip("compiled engine not built", allow_module_level=True)

INF = math.inf
BACKENDS = ("compiled", "reference")


@st.composite
def flat_envelopes(draw):
    """2–6 flat campaigns whose guarantees fit a pool of 64."""
    n = draw(st.integers(2, 6))
    room = 64
    out = []
    for i in range(n):
        g = draw(st.integers(0, min(room, 24)))
        room -= g
        s = g + draw(st.integers(0, 24))
        b = s + draw(st.integers(0, 40))
        B = draw(st.sampled_from([0, 500, 20_000, INF]))
        credits = draw(st.sampled_from([INF, 5.0, 200.0]))
        cls = draw(st.sampled_from(["agent-burst", "interactive", "opportunistic"]))
        out.append((f"c{i}", Envelope(credits=credits, service_class=cls, guaranteed={"gpu": g},
                                      sustained={"gpu": s}, ceiling={"gpu": b},
                                      burst={"gpu": B})))
    return out


OPS = st.lists(st.one_of(
    st.tuples(st.just("acquire"), st.integers(0, 19), st.integers(1, 40), st.integers(0, 30),
              st.sampled_from([1.0, 60.0, 600.0]), st.booleans()),
    st.tuples(st.just("storm"), st.integers(0, 19), st.sampled_from([5.0, 60.0, 900.0]),
              st.booleans()),
    st.tuples(st.just("release"), st.integers(0, 1000)),
    st.tuples(st.just("renew"), st.integers(0, 1000), st.sampled_from([1.0, 120.0])),
    st.tuples(st.just("cancel"), st.integers(0, 1000)),
    st.tuples(st.just("quote"), st.integers(0, 19)),
    st.tuples(st.just("advance"), st.sampled_from([0.5, 1.0, 30.0, 61.0, 700.0])),
    # SPEC §14.9: a node's envelope changes (g, s, b moved; a bucket size; the budget
    # moved), or it is removed
    st.tuples(st.just("change"), st.integers(0, 19), st.integers(-8, 8), st.integers(-8, 8),
              st.integers(-16, 16), st.sampled_from([0, 500, 20_000, INF]),
              st.sampled_from([0.0, -10.0, 100.0])),
    st.tuples(st.just("remove"), st.integers(0, 19))),
    max_size=40)


def _changed(env: Envelope, dg: int, ds: int, db: int, B: float, dc: float) -> Envelope:
    g = max(0, int(env.g("gpu")) + dg)
    s = max(g, int(env.s("gpu")) + ds)
    b = max(s, int(env.b("gpu")) + db)
    credits = env.credits if math.isinf(env.credits) else max(0.0, env.credits + dc)
    return Envelope(credits=credits, service_class=env.service_class, guaranteed={"gpu": g},
                    sustained={"gpu": s}, ceiling={"gpu": b}, burst={"gpu": B},
                    share=env.share, borrow_limit=env.borrow_limit, lend_limit=env.lend_limit)


def _run(backend: str, camps, ops) -> tuple[list, dict, bytes]:
    j = MemoryJournal()
    b = Broker(Pool(gpu=64, warm_headroom={"gpu": 4}), clock=ManualClock(0.0), backend=backend,
               journal=j, ttl=120.0)
    out: list = []
    for name, env in camps:
        out.append(b.register(name, env))
    for op in ops:
        kind = op[0]
        try:
            if kind == "acquire":
                _, c, lo, span, dur, opp = op
                name = camps[c % len(camps)][0]
                out.append(b.acquire(Intent(name, units={"gpu": (lo, lo + span)}, duration=dur,
                                            service_class="opportunistic" if opp else None)
                                     ).to_dict())
            elif kind == "storm":           # a node asks for all its ceiling allows
                _, c, dur, opp = op
                name, env = camps[c % len(camps)]
                top = int(b.envelopes.get(name, env).b("gpu"))
                if top >= 1:
                    out.append(b.acquire(Intent(name, units={"gpu": (1, top)}, duration=dur,
                                                service_class="opportunistic" if opp else None)
                                         ).to_dict())
            elif kind == "quote":
                out.append(b.quote(camps[op[1] % len(camps)][0], [1, 8], [60.0]).to_dict())
            elif kind in ("release", "renew"):
                live = [x.id for x in b.leases()]
                if live:
                    lid = live[op[1] % len(live)]
                    d = b.release(lid) if kind == "release" else b.renew(lid, op[2])
                    out.append(d.to_dict())
            elif kind == "change":
                name, env = camps[op[1] % len(camps)]
                b.change(name, _changed(b.envelopes.get(name, env), *op[2:]))
                out.append(("changed", name))
            elif kind == "remove":
                name = camps[op[1] % len(camps)][0]
                b.remove(name)
                out.append(("removed", name))
            elif kind == "cancel":
                pend = [p["intent_id"] for p in b.pending()]
                if pend:
                    out.append(b.cancel(pend[op[1] % len(pend)]))
            else:
                b.clock.advance(op[1])
                out.append([e.to_dict() for e in b.poll()])
        except BursarError as e:
            out.append(("error", type(e).__name__, str(e)))
    state = b.state()
    state.pop("backend")
    return out, state, j.rows().tobytes()


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(camps=flat_envelopes(), ops=OPS)
def test_a_flat_set_decides_and_journals_as_before(camps, ops):
    compiled, reference = (_run(be, camps, ops) for be in BACKENDS)
    assert compiled[0] == reference[0]            # decisions, leases, events
    assert compiled[1] == reference[1]            # balances, holdings, pool figures
    assert compiled[2] == reference[2]            # the journal, byte for byte


def test_the_worked_storm_of_spec_4_1_is_the_same_flat():
    """SPEC §4.1's numbers, on both backends, journal included."""
    camps = [("g", Envelope(credits=1e6, guaranteed={"gpu": 30})),
             ("a", Envelope(credits=1e6, sustained={"gpu": 100}))]
    ops = [("acquire", 1, 1, 99, 600.0, False), ("acquire", 1, 1, 99, 600.0, False),
           ("acquire", 0, 30, 0, 600.0, False), ("advance", 700.0)]
    compiled, reference = (_run(be, camps, ops) for be in BACKENDS)
    assert compiled == reference


@settings(max_examples=200, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(nodes=trees(), ops=OPS)
def test_a_tree_decides_and_journals_as_the_reference(nodes, ops):
    camps = [(x.name, x.env) for x in nodes]
    compiled, reference = (_run(be, camps, ops) for be in BACKENDS)
    assert compiled[0] == reference[0]            # decisions, leases, events, quotes
    assert compiled[1] == reference[1]            # balances, holdings, pool figures
    assert compiled[2] == reference[2]            # the journal, byte for byte
