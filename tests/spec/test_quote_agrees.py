"""``quote`` is asked of the engine, which decides each (size, duration) cell with the
same rules ``acquire`` uses (SPEC §4.4, §7, §8): a cell is grantable exactly when an
intent for that many units for that long would be granted at that moment, on the path
and at the cost the grant then has; a cell that is not names a rule the full size breaks.
Checked on every engine and both token enforcements, on random broker histories: each
cell is compared with an acquire on a broker rebuilt from the same history."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from bursarcore import Broker, Envelope, Intent, ManualClock, Pool
from bursarcore.broker import BACKENDS

INF = math.inf
CLASSES = ["agent-burst", "interactive", "deadline", "opportunistic"]

campaigns = st.lists(st.tuples(st.integers(0, 4), st.integers(1, 8), st.integers(0, 12),
                               st.sampled_from([0.0, 600.0, 3600.0, INF]),
                               st.sampled_from([INF, 50.0, 5.0, 0.5]),
                               st.sampled_from(CLASSES)),
                     min_size=1, max_size=3)
steps = st.lists(st.tuples(st.integers(0, 2), st.integers(1, 8),
                           st.sampled_from([60.0, 600.0, 3600.0]),
                           st.sampled_from([0.0, 1.0, 30.0, 700.0])),
                 max_size=6)


def build(engine, enforcement, camps, history):
    b = Broker(Pool(gpu=16), clock=ManualClock(0.0), backend=engine, enforcement=enforcement)
    names = []
    for j, (g, s, extra, burst, credits, cls) in enumerate(camps):
        g = 0 if cls == "opportunistic" else min(g, 16 // len(camps))
        s = max(s, g)
        names.append(f"c{j}")
        b.register(names[-1], Envelope(credits=credits, service_class=cls,
                                       guaranteed={"gpu": g}, sustained={"gpu": s},
                                       ceiling={"gpu": s + extra}, burst={"gpu": burst}))
    for who, n, dur, wait in history:
        b.clock.advance(wait)
        b.acquire(Intent(names[who % len(names)], units={"gpu": n}, duration=dur))
        b.poll()
    return b, names


@settings(max_examples=40)
@given(camps=campaigns, history=steps, who=st.integers(0, 2),
       enforcement=st.sampled_from(["prepaid", "instant"]))
def test_every_quote_cell_is_what_acquire_decides(camps, history, who, enforcement):
    sizes, durations = [1, 3, 9, 17], [60.0, 3600.0]
    for engine in BACKENDS:
        b, names = build(engine, enforcement, camps, history)
        name = names[who % len(names)]
        q = b.quote(name, sizes, durations)
        for i, n in enumerate(sizes):
            for j, dur in enumerate(durations):
                a, _ = build(engine, enforcement, camps, history)
                d = a.acquire(Intent(name, units={"gpu": n}, duration=dur))
                where = (engine, enforcement, n, dur, d, q.reason[i, j])
                assert bool(q.grantable[i, j]) == (d.outcome == "granted"), where
                if d.outcome == "granted":
                    assert (q.path[i, j], q.cost[i, j]) == (d.path, d.cost), where
                else:
                    assert q.reason[i, j] in ("ceiling", "capacity", "tokens", "credits"), where
