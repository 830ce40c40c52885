"""Running the compiled engine and the reference side by side on equal states: value and
state comparison (bit for bit, arrays by dtype, shape and content), the outcome of one call
(a value or the exception type), and hypothesis strategies for random engine
configurations. Shared by the suites that diff the two kernels
(backends/test_engine_kernel_diff.py, backends/test_batch_limits_agree.py).

``cmp`` is the compiled engine module, or None when it is not built; a suite using it skips
itself then."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from bursarcore.admission.state import MAXV, PPM, EngineState
from bursarcore.broker import ENGINES

__all__ = ["cmp", "NS", "same_value", "same_state", "run", "durations", "steps", "configs",
           "campaigns", "build"]

# the C core's engine through the binding the backend chose (Cython, or cffi under
# BURSARCORE_BACKEND=cffi); None on the reference backend
cmp = ENGINES.get("compiled")

NS = 1_000_000_000

# -- comparison helpers ----------------------------------------------------------------------


def same_value(a: object, b: object, where: str) -> None:
    """Equal values of the same Python type (tuples compared item by item)."""
    if isinstance(a, tuple):
        assert isinstance(b, tuple) and len(a) == len(b), (where, a, b)
        for i, (x, y) in enumerate(zip(a, b)):
            same_value(x, y, f"{where}[{i}]")
        return
    assert type(a) is type(b) and a == b, (where, a, b)


def same_state(a: EngineState, b: EngineState, where: str = "") -> None:
    va = {k: v for k, v in vars(a).items() if k != "_cctx"}
    vb = {k: v for k, v in vars(b).items() if k != "_cctx"}
    assert va.keys() == vb.keys(), where
    for k, x in va.items():
        y = vb[k]
        if isinstance(x, np.ndarray):
            assert isinstance(y, np.ndarray), (where, k)
            assert x.dtype == y.dtype and x.shape == y.shape, (where, k, x.shape, y.shape)
            if not np.array_equal(x, y):
                bad = np.flatnonzero((x != y).ravel())[:5]
                raise AssertionError(f"{where}: {k} differs at {bad}: "
                                     f"{x.ravel()[bad]} vs {y.ravel()[bad]}")
        else:
            assert x == y, (where, k, x, y)


def run(fn, *args):
    """("ok", value) or ("raise", exception type)."""
    try:
        return "ok", fn(*args)
    except (IndexError, ValueError, ZeroDivisionError, OverflowError, TypeError) as exc:
        return "raise", type(exc)


# -- configurations --------------------------------------------------------------------------
durations = st.sampled_from([1, NS, 10 * NS, 60 * NS, 3600 * NS]) | st.integers(1, 10**13)
steps = st.sampled_from([0, 0, 1, NS // 2, NS, 5 * NS, 61 * NS, 900 * NS]) | st.integers(0, 10**11)


@st.composite
def configs(draw):
    D = draw(st.integers(1, 3))
    cap = [draw(st.integers(1, 48)) for _ in range(D)]
    headroom = [draw(st.sampled_from([0, 0, 1, c // 4])) for c in cap]
    ncls = draw(st.integers(2, 4))
    classes = []
    for i in range(ncls):
        pre = i == ncls - 1          # the last class is preemptible (opportunistic)
        classes.append((i, draw(st.sampled_from([0, 250_000, PPM, 2 * PPM, 3 * PPM, 4 * PPM])),
                        int(not pre and draw(st.booleans())), int(pre),
                        draw(st.sampled_from([NS, 60 * NS])) if pre else 0,
                        int(pre or draw(st.booleans()) and draw(st.booleans()))))
    price = [draw(st.sampled_from([0, PPM, PPM, 2 * PPM, 7_300_000])) for _ in range(D)]
    thr = sorted(draw(st.lists(st.sampled_from([0, 500_000, PPM, 2 * PPM, 5 * PPM]),
                               min_size=3, max_size=3)))
    mult = [PPM, 1_500_000, 2_250_000, 3 * PPM]
    bins = draw(st.sampled_from([1, 4, 60]))
    instant = draw(st.sampled_from([False, False, False, True]))
    t0 = draw(st.sampled_from([0, NS, 10**15]))
    camps = [draw(campaigns(cap)) for _ in range(draw(st.integers(1, 5)))]
    # rows of ended leases: reused at once, after a few later ends, or never
    reuse = draw(st.sampled_from([0, 0, 1, 3, None]))
    return dict(D=D, cap=cap, headroom=headroom, classes=classes, price=price, thr=thr,
                mult=mult, bins=bins, instant=instant, t0=t0, camps=camps, reuse=reuse)


@st.composite
def campaigns(draw, cap):
    g, s, b, B = [], [], [], []
    for c in cap:
        gd = draw(st.integers(0, max(0, c // 4)))
        sd = draw(st.integers(gd, max(gd, c // 2)))
        bd = draw(st.integers(sd, c + 2))
        g.append(gd)
        s.append(sd)
        b.append(bd)
        B.append(draw(st.sampled_from([MAXV, 0, 60 * NS, 3600 * NS]) | st.integers(0, 10**14)))
    budget = draw(st.sampled_from([MAXV, 0, 1, 10**6, 10**9]) | st.integers(0, 10**10))
    return g, s, b, B, budget


def build(cfg) -> EngineState:
    s = EngineState(capacity=cfg["cap"], headroom=cfg["headroom"], slot_counts=cfg["cap"],
                    classes=cfg["classes"], price=cfg["price"], cong_thresholds=cfg["thr"],
                    cong_mult=cfg["mult"], window_ns=60 * NS, bins=cfg["bins"],
                    instant=cfg["instant"], reuse_after=cfg.get("reuse", 1024))
    s.scal[0] = cfg["t0"] // s.bin_ns
    for g, sd, b, B, budget in cfg["camps"]:
        s.add_campaign(g, sd, b, B, budget, cfg["t0"])
    return s
