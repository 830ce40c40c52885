"""The compiled ``admit_batch`` commits a full warm grant in a fused pass (``k_batch_fast``:
limits compared with the item's max, a cached price, one settle), and sends every other
item through the general decision. These tests put batch items exactly at, one below and
one above each limit that decides between the two (ceiling, warm capacity, tokens,
credits, room in the lease store) and require the reference's outputs and state, bit for
bit. The random walk of ``test_engine_kernel_diff`` seldom lands on a boundary."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bursarcore.reference.engine import PREEMPT
from bursarcore.reference import engine as ref

from kernel_pairs import build, cmp, configs, durations, run, same_state, steps

if cmp is None:     # pragma: no cover - no compiled engine: nothing to compare
    pytest.skip("compiled engine not built", allow_module_level=True)

SLOW = 2


def limits(s, c: int, d: int, k: int, dur: int, t: int) -> list[int]:
    """The limits of (c, d, k) at t that are finite and small enough to ask for: the
    ceiling, the warm capacity, the reclaim capacity, tokens, credits (a copy of the
    state is settled, not ``s``)."""
    s = copy.deepcopy(s)
    n, _, _, _, (ceil, cap, tok, cred) = ref.decide(s, c, d, k, 0, 10**9, dur, -1, t)
    free = ref.free_now(s, d)
    if s.cls[k, PREEMPT]:
        warm = max(0, free - int(s.headroom[d]))
    else:
        warm = min(free, int(s.cap[d]) - int(s.F[d]) - int(s.U[d]) + ref.unmet(s, c, d))
    top = int(s.cap[d]) + 3
    return [v for v in (ceil, warm, cap, tok, cred, n) if 0 <= v <= top]


def batch(a, b, cols, t: int, intent: int) -> None:
    """admit_batch on both states, a SLOW item skipped as a broker would; equal outputs
    and equal states after every call."""
    camps, ks, dims, nmins, nmaxs, durs = cols
    m = len(camps)
    for s in (a, b):
        s.grow_leases(m, int(nmaxs.sum()))
    outs = {x: (np.zeros(m, np.int64), np.zeros(m, np.int64), np.full(m, -1, np.int64))
            for x in "ab"}
    j = 0
    while j < m:
        ra = run(ref.admit_batch, a, camps, ks, dims, nmins, nmaxs, durs, t, intent,
                 *outs["a"], j)
        rb = run(cmp.admit_batch, b, camps, ks, dims, nmins, nmaxs, durs, t, intent,
                 *outs["b"], j)
        assert ra == rb, (ra, rb)
        for x, y in zip(outs["a"], outs["b"]):
            assert np.array_equal(x, y), (x, y)
        same_state(a, b, f"after admit_batch from item {j}")
        if ra[0] != "ok":
            return
        j = ra[1] + 1


@st.composite
def items(draw, s, t: int, at_limits: bool):
    """(c, d, k, nmin, nmax, dur); with ``at_limits`` nmax is a limit of the item's own
    (campaign, dim, class) at t, or one off it."""
    c = draw(st.integers(0, s.C - 1))
    d = draw(st.integers(0, s.D - 1))
    k = draw(st.integers(0, s.cls.shape[0] - 1))
    dur = draw(durations)
    lims = limits(s, c, d, k, dur, t) if at_limits else []
    if lims:
        nmax = max(1, draw(st.sampled_from(lims)) + draw(st.sampled_from([-1, 0, 0, 1])))
    else:
        nmax = draw(st.integers(1, int(s.cap[d]) + 3))
    nmin = draw(st.sampled_from([nmax, nmax, 0, 1, max(0, nmax - 1)]))
    return c, d, k, min(nmin, nmax), nmax, dur


@given(cfg=configs(), data=st.data())
def test_batch_items_at_each_limit_decide_as_the_reference(cfg, data):
    a, b = build(cfg), build(cfg)
    t = cfg["t0"]
    intent = 0
    for r in range(data.draw(st.integers(1, 4))):
        t += data.draw(steps)
        at = r > 0 or data.draw(st.booleans())   # a random batch first, now and then
        m = data.draw(st.integers(1, 10))
        rows = [data.draw(items(a, t, at)) for _ in range(m)]
        cols = [np.array([row[i] for row in rows], dtype=np.int64) for i in (0, 2, 1, 3, 4, 5)]
        batch(a, b, cols, t, intent)
        intent += m


@given(cfg=configs(), data=st.data())
def test_a_full_lease_store_or_arena_sends_items_to_the_general_path(cfg, data):
    """No room grown first: the fused pass must leave a grant it has no room for (lease
    row, slots, heap) to k_admit, which raises or grows exactly as the reference."""
    a, b = build(cfg), build(cfg)
    t = cfg["t0"] + data.draw(steps)
    m = data.draw(st.integers(1, 6))
    rows = [data.draw(items(a, t, True)) for _ in range(m)]
    cols = [np.array([row[i] for row in rows], dtype=np.int64) for i in (0, 2, 1, 3, 4, 5)]
    camps, ks, dims, nmins, nmaxs, durs = cols
    outs = {x: (np.zeros(m, np.int64), np.zeros(m, np.int64), np.full(m, -1, np.int64))
            for x in "ab"}
    ra = run(ref.admit_batch, a, camps, ks, dims, nmins, nmaxs, durs, t, 0, *outs["a"], 0)
    rb = run(cmp.admit_batch, b, camps, ks, dims, nmins, nmaxs, durs, t, 0, *outs["b"], 0)
    assert ra == rb, (ra, rb)
    for x, y in zip(outs["a"], outs["b"]):
        assert np.array_equal(x, y), (x, y)
    same_state(a, b, "admit_batch without room")
