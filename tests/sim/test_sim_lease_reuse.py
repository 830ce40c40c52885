"""The simulator reads a lease when the broker announces it, not when it gets round to the
event: lease rows are reused after ``reuse_after`` ended leases (docs/policy.md, "Memory"),
and one poll that covers several event times can grant a lease, end it and give its row to
a later grant before the simulator looks at the ``granted`` or ``activated`` event. With
``reuse_after=0`` the row goes at once, and ``broker.lease(id)`` of the first lease raises
``UnknownLease``."""

from __future__ import annotations

import tomllib

import pytest

from bursarcore.errors import UnknownLease
from bursarcore.sim import Simulation
from bursarcore.sim.scenario import parse_scenario

# a 16-GPU pool and passive campaigns (probes that would start after the end): the test
# makes every request itself, through the simulator's own calls
_TOML = """
[scenario]
name = "reuse"
duration = 100
[pool]
gpu = 16
[broker]
grace = 5.0
ttl = 900.0
journal = false
[facility]
slots_per_node = 8
"""
_CAMPAIGN = """
[[campaigns]]
name = "{name}"
agent = "probe"
class = "{cls}"
credits = "unlimited"
[campaigns.envelope]
guaranteed = {{ gpu = 0 }}
sustained = {{ gpu = 16 }}
ceiling = {{ gpu = 16 }}
burst = {{ gpu = 100000 }}
[campaigns.behaviour]
start = 1000.0
size = 1
"""


def _sim(classes, backend):
    doc = _TOML + "".join(_CAMPAIGN.format(name=n, cls=c) for n, c in classes.items())
    sim = Simulation(parse_scenario(tomllib.loads(doc)), backend=backend, reuse_after=0)
    assert sim.broker.reuse_after == 0
    return sim, {a.name: a for a in sim.named_agents}


def _at(sim, t):
    """One poll at ``t``, however many event times lie between the last call and ``t``."""
    sim.clock.set(t)
    sim.now = t
    sim._poll()


def _ask(sim, agent, units, duration, ttl=None):
    d = sim.acquire(agent, units, duration, ttl=ttl)
    sim._drain()                 # as the loop does after every action
    return d


def test_granted_lease_ended_and_reused_within_one_poll(eb):
    sim, ag = _sim({"a": "agent-burst", "b": "agent-burst", "c": "agent-burst",
                    "d": "agent-burst"}, eb)
    assert _ask(sim, ag["a"], 16, 10.0).outcome == "granted"       # the pool, until 10
    db = _ask(sim, ag["b"], 1, 1.0)                                # granted at 12, ends 13
    dc = _ask(sim, ag["c"], 16, 5.0, ttl=12.0)                     # its TTL: an event at 12
    dd = _ask(sim, ag["d"], 16, 5.0)                               # granted at 20
    assert (db.outcome, dc.outcome, dd.outcome) == ("pending",) * 3
    # one poll at 20: a expires (10); c's TTL (12) serves the queue: b's lease X (1 GPU,
    # 12..13), d does not fit; X expires (13); at 20 d's grant takes X's row
    evs = []
    sim.broker.subscribe(evs.append)
    _at(sim, 20.0)
    kinds = [(e.kind, e.campaign, e.time) for e in evs]
    assert kinds == [("expired", "a", 10.0), ("refused", "c", 12.0), ("granted", "b", 12.0),
                     ("expired", "b", 13.0), ("granted", "d", 20.0)]
    x = evs[2].lease_id
    assert (evs[4].lease_id ^ x) & 0xFFFFFFFF == 0                 # the same row, reused
    with pytest.raises(UnknownLease, match="reused"):
        sim.broker.lease(x)
    led = sim.ledger
    rb = led.requests[1]
    assert (rb.outcome, rb.units, rb.path, rb.t_active) == ("granted", 1, "warm", 12.0)
    assert x not in led.leases and x not in led.starting            # it ended, and is known to
    assert led.held.tolist() == [0, 0, 0, 16]
    t, c, dl, _ = led.changes()
    b = sim.index["b"]
    assert [(float(ti), int(di)) for ti, ci, di in zip(t, c, dl) if ci == b] == [(12.0, 1),
                                                                                (13.0, -1)]
    assert ag["b"].held == 0 and ag["d"].held == 16
    assert x not in sim.work and evs[4].lease_id in sim.work     # d's work runs, not X's


def test_activated_lease_ended_and_reused_within_one_poll(eb):
    sim, ag = _sim({"o": "opportunistic", "a": "agent-burst", "e": "agent-burst",
                    "f": "agent-burst"}, eb)
    assert _ask(sim, ag["o"], 16, 100.0).outcome == "granted"      # backfill on every GPU
    da = _ask(sim, ag["a"], 16, 1.0)                               # reclaim: active 5..6
    assert (da.outcome, da.path, da.lease.state) == ("granted", "reclaim", "starting")
    z = da.lease.id
    assert _ask(sim, ag["e"], 8, 5.0).outcome == "pending"
    assert _ask(sim, ag["f"], 8, 5.0).outcome == "pending"
    evs = []
    sim.broker.subscribe(evs.append)
    # one poll at 20: o revoked and z activated (5), z expires (6); at 20 e takes o's row
    # and f takes z's
    _at(sim, 20.0)
    kinds = [(e.kind, e.campaign, e.time) for e in evs]
    assert kinds == [("revoked", "o", 5.0), ("activated", "a", 5.0), ("expired", "a", 6.0),
                     ("granted", "e", 20.0), ("granted", "f", 20.0)]
    assert any((e.lease_id ^ z) & 0xFFFFFFFF == 0 and e.lease_id != z for e in evs[3:])
    with pytest.raises(UnknownLease, match="reused"):
        sim.broker.lease(z)
    led = sim.ledger
    assert led.requests[1].t_active == 5.0 and z not in led.leases
    assert led.held.tolist() == [0, 0, 8, 8]
    t, c, dl, _ = led.changes()
    a = sim.index["a"]
    assert [(float(ti), int(di)) for ti, ci, di in zip(t, c, dl) if ci == a] == [(5.0, 16),
                                                                                (6.0, -16)]
    # it ended in the call that started it: no work was launched for it (the binding heard
    # the expiry before any work existed, and would never have stopped it)
    assert z not in sim.work and not sim.binding.handles(z)
