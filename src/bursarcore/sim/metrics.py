"""What a run measured: exact integrals of the ledger's step functions, latencies, claims.

:func:`collect` turns a finished :class:`~bursarcore.sim.engine.Simulation` into a
:class:`SimResult`: ``summary`` (JSON-ready numbers per campaign and for the pool),
``series`` (arrays on the sample grid, for figures and the timeline) and ``claims`` (SPEC
§10's six claims, each beside the value this run measured and a verdict).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np

from .. import __version__
from ..units import NS, to_ns

__all__ = ["SimResult", "collect", "step_at", "step_integral", "CLAIMS", "tree_summary",
           "guarantee_violations"]


def step_at(t_knots: np.ndarray, values: np.ndarray, t: np.ndarray) -> np.ndarray:
    """A right-continuous step function (``values[i]`` from ``t_knots[i]``) at times ``t``;
    0 before the first knot."""
    if len(t_knots) == 0:
        return np.zeros(np.shape(t), dtype=np.asarray(values).dtype if len(values) else float)
    i = np.searchsorted(t_knots, t, side="right") - 1
    out = np.where(i >= 0, values[np.maximum(i, 0)], 0)
    return out


def step_integral(t_knots: np.ndarray, values: np.ndarray, a: float, b: float) -> float:
    """∫ from a to b of the step function (0 before its first knot)."""
    if b <= a or len(t_knots) == 0:
        return 0.0
    inside = (t_knots > a) & (t_knots < b)
    pts = np.concatenate([[a], t_knots[inside], [b]])
    v = step_at(t_knots, values, pts[:-1])
    return float(np.sum(v * np.diff(pts)))


def step_integral_ns(t_knots: np.ndarray, values: np.ndarray, a: float, b: float) -> Fraction:
    """:func:`step_integral` exactly, in value × nanoseconds: the knots are times the broker
    reported (whole nanoseconds) and each piece is its value (an exact binary fraction)
    times a whole number of nanoseconds, so no rounding enters the sum."""
    if b <= a or len(t_knots) == 0:
        return Fraction(0)
    inside = (t_knots > a) & (t_knots < b)
    pts = np.concatenate([[a], t_knots[inside], [b]])
    v = step_at(t_knots, values, pts[:-1])
    ns = [to_ns(float(x)) for x in pts]
    return sum((Fraction(float(vi)) * (n1 - n0) for vi, n0, n1 in zip(v, ns, ns[1:])),
               Fraction(0))


def _pct(x: list[float] | np.ndarray, q: float) -> float | None:
    x = np.asarray(x, float)
    return None if x.size == 0 else float(np.percentile(x, q))


def _clean(o: Any) -> Any:
    """JSON-ready: numpy scalars to Python, inf/nan to None."""
    if isinstance(o, dict):
        return {str(k): _clean(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_clean(v) for v in o]
    if isinstance(o, np.ndarray):
        return _clean(o.tolist())
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (float, np.floating)):
        f = float(o)
        return None if not math.isfinite(f) else round(f, 6)
    return o


@dataclass
class SimResult:
    scenario: Any
    summary: dict
    series: dict
    claims: list[dict]
    timing: dict
    journal: Any = None
    events: list = field(default_factory=list)

    def to_json(self) -> dict:
        return _clean({"summary": self.summary, "claims": self.claims, "timing": self.timing})


# SPEC §10's claims: (number, what, the source's value)
CLAIMS = [
    (1, "storm held between sustained and ceiling; average hold", "148 GPUs (s 64, b 384); "
        "never above what its tokens pay for"),
    (2, "interactive p95 grant latency during the storm", "1 s"),
    (3, "adaptive vs naive: science and credit cost per unit", "~2.2x science, ~2.5x lower "
        "cost per unit"),
    (4, "mean utilisation with preemptible backfill", "~82%"),
    (5, "naive science lost to I/O throttling; storm inference", "~40%; pinned to its "
        "sustained rate"),
    (6, "every decision journaled", "all"),
]


def collect(sim: Any) -> SimResult:
    sc = sim.sc
    T = sim.duration
    step = sc.sample_every
    grid = np.arange(0.0, T + step / 2, step)
    led = sim.ledger
    ct, cc, cd, cf = led.changes()
    order = np.argsort(ct, kind="stable")
    ct, cc, cd, cf = ct[order], cc[order], cd[order], cf[order]
    cap = sim.capacity

    def held_fn(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        t = ct[mask]
        v = np.cumsum(cd[mask])
        # collapse equal times to the last value
        if t.size:
            last = np.r_[t[1:] != t[:-1], True]
            t, v = t[last], v[last]
        return t, v

    total_t, total_v = held_fn(np.ones_like(cc, bool))
    firm_t, firm_v = held_fn(cf)
    util = step_integral(total_t, total_v, 0.0, T) / (cap * T)
    util_firm = step_integral(firm_t, firm_v, 0.0, T) / (cap * T)
    state = sim.state
    camp_state = state["campaigns"]
    classes = {a.name: a.cls for a in sim.named_agents}

    series: dict[str, Any] = {"t": grid, "capacity": cap,
                              "occupied": step_at(total_t, total_v, grid),
                              "occupied_firm": step_at(firm_t, firm_v, grid), "held": {}}
    per: dict[str, dict] = {}
    lat_by_class: dict[str, list[float]] = {}
    reqs = led.requests
    grace = sc.broker["grace"]
    storms = []
    named = {a.name: a for a in sim.named_agents}
    for a in sim.named_agents:
        c = a.index
        t, v = held_fn(cc == c)
        series["held"][a.name] = step_at(t, v, grid)
        held_s = step_integral(t, v, 0.0, T)
        cs = camp_state[a.name]
        spent = cs["credits_spent"] + cs["credits_escrowed"]
        mine = [r for r in reqs if r.campaign == c]
        lats = [r.latency for r in mine if r.latency is not None]
        lat_by_class.setdefault(a.cls, []).extend(lats)
        d = {"agent": a.kind, "class": a.cls, "gpu_hours_held": held_s / 3600.0,
             "mean_held": held_s / T, "credits_spent": spent,
             "requests": len(mine), "granted": sum(r.outcome == "granted" for r in mine),
             "refused": {reason: n for (cc_, reason), n in sorted(led.refusals.items())
                         if cc_ == c},
             "preempted": int(led.preemptions[c]),
             "latency_p50": _pct(lats, 50), "latency_p95": _pct(lats, 95),
             "latency_max": max(lats) if lats else None}
        d.update(a.summary())
        if hasattr(a, "series"):
            lt, lb, lr = a.series()
            busy = step_integral(lt, lb, 0.0, T)
            run = step_integral(lt, lr, 0.0, T)
            d.update({"busy_gpu_hours": busy / 3600.0, "running_gpu_hours": run / 3600.0,
                      "stalled_share": (busy - run) / busy if busy > 0 else 0.0,
                      "idle_share_of_held": (held_s - busy) / held_s if held_s > 0 else 0.0,
                      "science_per_credit": d["science"] / spent if spent > 0 else None,
                      "credits_per_science": spent / d["science"] if d["science"] > 0 else None})
            series.setdefault("busy", {})[a.name] = step_at(lt, lb, grid)
            series.setdefault("running", {})[a.name] = step_at(lt, lr, grid)
        for dim, (ft, fa, fg) in a.flow.items():
            ft, fa, fg = np.asarray(ft), np.asarray(fa), np.asarray(fg)
            edges = np.r_[grid, grid[-1] + step]
            series.setdefault("flow", {}).setdefault(a.name, {})[dim] = {
                "asked": np.histogram(ft, edges, weights=fa)[0] / step,
                "allowed": np.histogram(ft, edges, weights=fg)[0] / step}
            d.setdefault("flow", {})[dim] = {"asked": float(fa.sum()), "allowed": float(fg.sum())}
        if a.kind == "storm":
            storms.append((a, t, v, d))
        if a.kind == "interactive":
            win = _storm_window(sim)
            within = [r for r in mine if r.within_guarantee]
            lw = [r.latency for r in within if r.latency is not None
                  and (win is None or win[0] <= r.t < win[1])]
            grace_ns = to_ns(grace, "broker.grace")
            viol = sum(1 for r in within if r.t + grace <= T and
                       (r.latency_ns is None or r.latency_ns > grace_ns))
            d.update({"within_guarantee": len(within), "violations": viol,
                      "storm_latency_p95": _pct(lw, 95), "storm_requests": len(lw),
                      "storm_latency_p50": _pct(lw, 50)})
        if a.kind == "probe":
            d["time_to_capacity_median"] = _pct(lats, 50)
            d["probes"] = len(mine)
            d["probes_unserved"] = sum(1 for r in mine if r.latency is None)
        per[a.name] = d
    for a, t, v, d in storms:
        s, b = a.s, a.b
        # the part of the storm's window inside the run: what its averages are over
        w0, w1 = min(a.p["start"], T), min(a.p["end"], T)
        span = w1 - w0
        B = a.env.B(sim.dim)
        refill = _minted(sim, a.index)
        above = step_integral(t, np.maximum(0, v - s), 0.0, T)
        # the claim compares these exactly, in unit-nanoseconds: the engine's token balances
        # (the bucket, what it minted) are whole unit-nanoseconds
        above_ns = step_integral_ns(t, np.maximum(0, v - s), 0.0, T)
        minted_ns = _minted_ns(sim, a.index)
        if not math.isfinite(B):
            within_bound: bool | None = True          # no finite bucket: nothing to exceed
        elif minted_ns is None:
            within_bound = None                       # the engine keeps no refill counter
        else:
            within_bound = above_ns <= to_ns(B, "bucket") + minted_ns
        d.update({"window": [w0, w1], "window_in_run": span > 0, "sustained": s,
                  "ceiling": b, "bucket": B, "avg_hold_window": None, "predicted_hold": None,
                  "hold_last_quarter": None,
                  "extracted_above_sustained": above, "refill": refill,
                  "bound": B + refill if math.isfinite(B) else None,
                  "within_bound": within_bound})
        if span <= 0:       # the storm never stormed in this run: no window to average over
            continue
        tail0 = w0 + 0.75 * span
        d.update({"avg_hold_window": step_integral(t, v, w0, w1) / span,
                  "predicted_hold": predicted_hold(s, b, B, span),
                  "hold_last_quarter": step_integral(t, v, tail0, w1) / (w1 - tail0)})
        if "inference" in d.get("flow", {}):
            ft, fa, fg = (np.asarray(x) for x in a.flow["inference"])
            late = ft >= w0 + 0.5 * span
            d["inference_rate_window"] = float(fg.sum()) / span
            d["inference_rate_second_half"] = float(fg[late].sum()) / (0.5 * span)
            d["inference_sustained"] = a.env.s("inference")
            d["inference_asked_rate"] = float(fa.sum()) / span
    # pool signals
    smp = sim.samples
    series["pool"] = {k: np.asarray(v, float) for k, v in smp.items()}
    series["tokens"] = {k: np.asarray(v, float).reshape(-1, 2) for k, v in sim.tokens.items()}
    series["latency"] = {k: np.asarray(v, float) for k, v in lat_by_class.items()}
    series["classes"] = classes
    series["campaign_caps"] = {a.name: {"g": a.g, "s": a.s, "b": a.b} for a in sim.named_agents}
    # a population's campaigns as one band: what its members held together
    series["groups_held"] = {}
    for g in sim.groups:
        t, v = held_fn((cc >= g.first) & (cc < g.first + g.n))
        series["groups_held"][g.spec.name] = step_at(t, v, grid)
    jcount, jops = _journal_counts(sim)
    decisions = dict(sim.decision_counts)
    groups = [g.summary() for g in sim.groups]
    summary = {
        "scenario": sc.name, "source": sc.source, "seed": sc.seed, "duration": T,
        "backend": sim.broker.backend, "enforcement": sc.broker["enforcement"],
        "version": __version__, "capacity": cap,
        "utilisation": util, "utilisation_firm_only": util_firm,
        "campaigns": per, "populations": groups,
        "journal": {"records": jcount, "ops": jops} if sim.journal is not None else None,
        "decisions": decisions,
        "facility": sim.facility_summary(),
    }
    timing = {"wall_seconds": sim.timing.wall, "engine_seconds": sim.timing.engine,
              "agents_seconds": sim.timing.agents, "broker_calls": sim.timing.calls}
    if sc.is_tree:
        summary["tree"], series["tree_held"] = tree_summary(sim, grid, held_fn, cc)
    claims = _claims(sim, summary, per, named)
    return SimResult(scenario=sc, summary=summary, series=series, claims=claims,
                     timing=timing, journal=sim.journal)


# -- a tree of envelopes (SPEC §14) -----------------------------------------------------------

_SQUEEZE = ("capacity", "ceiling", "tokens")


def guarantee_violations(requests: list, names: list[str], grace: float, T: float,
                         under: str | None = None) -> tuple[int, list[dict]]:
    """The within-guarantee requests (of ``under``'s subtree, or all) and those the broker
    did not serve as SPEC §14.3 promises: answered other than ``granted`` (pending or
    refused; a budget that cannot pay, reason ``credits``, excepted), or not active within
    the grace (a request made less than a grace before the run's end is not judged on its
    latency). Returns (how many were within the guarantee, the violations)."""
    grace_ns = to_ns(grace, "broker.grace")
    n, bad = 0, []
    for r in requests:
        if not r.within_guarantee:
            continue
        name = names[r.campaign]
        if under is not None and name != under and not name.startswith(under + "/"):
            continue
        n += 1
        why = None
        if r.answer not in (None, "granted") and r.answer_reason != "credits":
            why = f"{r.answer} ({r.answer_reason})"
        elif r.answer == "granted" and r.t + grace <= T and (r.latency_ns is None
                                                             or r.latency_ns > grace_ns):
            why = ("not active within the grace" if r.latency_ns is None else
                   f"active after {r.latency:g} s")
        if why is not None:
            bad.append({"campaign": name, "t": r.t, "units": r.units, "why": why})
    return n, bad


def tree_summary(sim: Any, grid: np.ndarray, held_fn: Any, cc: np.ndarray) -> tuple[dict, dict]:
    """What a tree of envelopes did: per node (every level) the units its subtree held over
    time beside its guarantee, sustained rate and ceiling; the storms' denials by reason;
    the wakers' waits; per project the within-guarantee requests and any the broker did not
    serve as promised; and the checks (``checks``: each True when it held in this run)."""
    sc, T, grace = sim.sc, sim.duration, sim.sc.broker["grace"]
    dim = sim.dim
    led = sim.ledger
    names = sim.names
    envs = {n.name: n.envelope for n in sc.nodes}
    envs.update({c.name: c.envelope for c in sc.campaigns})
    every = max(sc.sample_every, float(np.ceil(T / 12 / sc.sample_every)) * sc.sample_every)
    checkpoints = [float(x) for x in np.arange(0.0, T + every / 2, every)]
    if checkpoints[-1] < T:
        checkpoints.append(T)
    cp = np.asarray(checkpoints)
    nodes: dict[str, dict] = {}
    series: dict[str, np.ndarray] = {}
    ceilings_held = True
    for name in names[:sim.first_population]:
        idx = [i for i, x in enumerate(names) if x == name or x.startswith(name + "/")]
        t, v = held_fn(np.isin(cc, idx))
        env = envs[name]
        g, s_, b = env.g(dim), env.s(dim), env.b(dim)
        vmax = int(v.max()) if v.size else 0
        ok = vmax <= b
        ceilings_held &= ok
        series[name] = step_at(t, v, grid)
        nodes[name] = {"level": name.count("/"), "parent": name.rpartition("/")[0] or None,
                       "children": sum(1 for x in envs if x.rpartition("/")[0] == name),
                       "guaranteed": g, "sustained": s_, "ceiling": b,
                       # SPEC §14.8: units granted on borrowed leases over the run, and the
                       # borrowed leases preempted (a lender took its guarantee back)
                       "borrowed": int(led.borrowed_units[idx].sum()),
                       "borrowed_preempted": int(led.borrowed_preempted[idx].sum()),
                       "mean_held": step_integral(t, v, 0.0, T) / T, "max_held": vmax,
                       "held_at": [int(x) for x in step_at(t, v, cp)],
                       "within_ceiling": ok}
    # the storms: their answers by reason (what denied them), firm and opportunistic
    storms = [a for a in sim.named_agents if a.kind == "storm"]
    by_class: dict[str, dict] = {}
    for a in storms:
        d = by_class.setdefault(a.cls, {"agents": [], "asked": 0, "granted": 0, "denied": {},
                                        "renewals_refused": {}})
        d["agents"].append(a.name)
        for r in led.requests:
            if r.campaign != a.index or r.answer is None:
                continue
            d["asked"] += 1
            if r.answer == "granted":
                d["granted"] += 1
            else:
                k = r.answer_reason or "?"
                d["denied"][k] = d["denied"].get(k, 0) + 1
        for (c, reason), n in led.renewals_refused.items():
            if c == a.index:
                d["renewals_refused"][reason] = d["renewals_refused"].get(reason, 0) + n
    for d in by_class.values():
        d["denied"] = dict(sorted(d["denied"].items()))
    # the wakers: how long their first request waited
    wakers = {}
    grace_ns = to_ns(grace, "broker.grace")
    for a in sim.named_agents:
        if a.kind != "waker" or a.first_request is None:
            continue
        r = led.requests[a.first_request]
        wakers[a.name] = {"asked_at": r.t, "units": r.units, "guaranteed": a.g,
                          "answer": r.answer, "reason": r.answer_reason, "path": r.path,
                          "wait": r.latency,
                          "within_grace": r.latency_ns is not None
                          and r.latency_ns <= grace_ns}
    # isolation: per project, the within-guarantee requests the broker did not serve
    storm_names = {a.name for a in storms}
    projects = {}
    for name in names[:sim.first_population]:
        if "/" in name or not nodes[name]["children"]:
            continue
        n, bad = guarantee_violations(led.requests, names, grace, T, under=name)
        mine = [r for r in led.requests if r.within_guarantee
                and names[r.campaign].startswith(name + "/")]
        projects[name] = {
            "storm_inside": any(x.startswith(name + "/") for x in storm_names),
            "within_guarantee": n, "granted_warm": sum(r.path == "warm" for r in mine),
            "granted_reclaim": sum(r.path == "reclaim" for r in mine),
            "latency_max": max((r.latency for r in mine if r.latency is not None),
                               default=None),
            "violations": len(bad), "first_violations": bad[:5]}
    others = [p for p in projects.values() if not p["storm_inside"]]
    checks = {
        # the projects without a storm: every request within a guarantee served as promised
        "isolation": bool(others) and all(p["within_guarantee"] > 0 and p["violations"] == 0
                                          for p in others),
        # every waker's first request active within the grace
        "wakers_within_grace": bool(wakers) and all(w["within_grace"]
                                                    for w in wakers.values()),
        # no node's subtree ever held more than the node's ceiling
        "ceilings": ceilings_held,
    }
    return ({"checkpoints": checkpoints, "nodes": nodes, "storm": by_class,
             "wakers": wakers, "projects": projects, "checks": checks}, series)


def predicted_hold(s: float, b: float, B: float, span: float) -> float | None:
    """The prepaid prediction of a storm's average hold over ``span`` seconds of asking for
    its ceiling: its sustained rate ``s`` plus the bucket ``B`` spread over the window, and
    never more than the ceiling ``b`` (a bucket that outlasts the window leaves the storm at
    its ceiling throughout). ``None`` without a finite bucket or a window."""
    if not math.isfinite(B) or span <= 0:
        return None
    return min(b, s + B / span)


def _storm_window(sim: Any) -> tuple[float, float] | None:
    ws = [(a.p["start"], a.p["end"]) for a in sim.named_agents if a.kind == "storm"]
    if not ws:
        return None
    return min(w[0] for w in ws), max(w[1] for w in ws)


def _minted_ns(sim: Any, c: int) -> int | None:
    """Tokens the storm's bucket refilled during the run (unit-nanoseconds, as the engine
    counts them), from its conservation counters (SPEC §11.5); ``None`` if it has none."""
    b = sim.broker
    st = getattr(b, "st", None)
    if st is not None:                       # the C core's ledger
        return int(st.tok_minted[c, 0])
    camps = getattr(b, "_camps", None)       # the reference broker's holdings
    return None if camps is None else int(camps[c].hold[0].minted)


def _minted(sim: Any, c: int) -> float:
    """:func:`_minted_ns` in unit-seconds (nan without the counters)."""
    ns = _minted_ns(sim, c)
    return float("nan") if ns is None else ns / NS


def _journal_counts(sim: Any) -> tuple[int, dict]:
    if sim.journal is None:
        return 0, {}
    from ..journal.records import OPS

    rows = sim.journal.rows()
    ops, counts = np.unique(rows["op"], return_counts=True)
    return int(rows.shape[0]), {OPS[int(o)]: int(n) for o, n in zip(ops, counts)}


def _fmt(x: Any, unit: str = "", nd: int = 1) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "n/a"
    return f"{x:,.{nd}f}{unit}"


def _claims(sim: Any, summary: dict, per: dict, named: dict) -> list[dict]:
    out = []
    grace = sim.sc.broker["grace"]

    def add(n: int, measured: str, verdict: str, ok: bool | None) -> None:
        _, what, source = CLAIMS[n - 1]
        out.append({"claim": n, "what": what, "source": source, "measured": measured,
                    "verdict": verdict, "ok": ok})

    storm = next((d for d in per.values() if d["agent"] == "storm"), None)
    if storm and not storm["window_in_run"]:
        sa = named[next(n for n, d in per.items() if d is storm)].p
        add(1, f"the storm's window ({sa['start']:g}–{sa['end']:g} s) is not inside this run "
               f"({summary['duration']:g} s)", "n/a", None)
    elif storm:
        avg, s, b = storm["avg_hold_window"], storm["sustained"], storm["ceiling"]
        pred, ext, bound = storm["predicted_hold"], storm["extracted_above_sustained"], storm["bound"]
        within = s < avg < b
        paid = storm["within_bound"] is True
        close = pred is not None and abs(avg - pred) <= 0.15 * pred
        add(1, f"{_fmt(avg)} GPUs average over the window (prepaid prediction s + B/window = "
               f"{_fmt(pred)}); last quarter {_fmt(storm['hold_last_quarter'])} GPUs; "
               f"{_fmt(ext, nd=0)} GPU-s above sustained vs B + refill = {_fmt(bound, nd=0)}",
            "reproduced" if within and paid and close else
            ("bound holds" if within and paid else "differs"), within and paid)
    else:
        add(1, "no storm in this scenario", "n/a", None)
    inter = next((d for d in per.values() if d["agent"] == "interactive"), None)
    if inter and inter["latency_p95"] is None and inter["violations"] == 0:
        add(2, f"no request of the interactive campaign was served in this run, none "
               f"waited past the grace ({inter['requests']} made)", "n/a", None)
    elif inter:
        in_storm = inter["storm_latency_p95"] is not None
        p95 = inter["storm_latency_p95"] if in_storm else inter["latency_p95"]
        # at the engine's resolution: a p95 within a nanosecond of the grace is the grace
        ok = p95 is not None and to_ns(p95) <= to_ns(grace) and inter["violations"] == 0
        where = (f"over {inter['storm_requests']} requests in the storm window" if in_storm
                 else "over all requests (none in a storm window)")
        add(2, f"p95 {_fmt(p95, ' s')} {where} (all: p50 {_fmt(inter['latency_p50'], ' s')}, "
               f"p95 {_fmt(inter['latency_p95'], ' s')}); {inter['violations']} of "
               f"{inter['within_guarantee']} within-guarantee requests past the {grace:g} s grace",
            "reproduced" if ok and to_ns(p95) <= NS else ("within grace" if ok else "differs"),
            ok)
    else:
        add(2, "no interactive campaign", "n/a", None)
    ad = next((d for d in per.values() if d["agent"] == "adaptive"), None)
    nv = next((d for d in per.values() if d["agent"] == "naive"), None)
    if ad and nv and nv["science"] > 0 and ad["credits_per_science"] and nv["credits_per_science"]:
        sr = ad["science"] / nv["science"]
        cr = nv["credits_per_science"] / ad["credits_per_science"]
        ok = sr > 1.0 and cr > 1.0
        near = abs(sr - 2.2) <= 0.5 and abs(cr - 2.5) <= 0.6
        add(3, f"{sr:.2f}x the science ({ad['science']:,.0f} vs {nv['science']:,.0f}) at "
               f"{cr:.2f}x lower credits per unit ({ad['credits_per_science']:.2f} vs "
               f"{nv['credits_per_science']:.2f})",
            "reproduced" if ok and near else ("same direction" if ok else "differs"), ok)
    else:
        add(3, "needs an adaptive and a naive agent", "n/a", None)
    u, uf = summary["utilisation"], summary["utilisation_firm_only"]
    has_bf = any(d["agent"] == "backfill" for d in per.values())
    add(4, f"{100 * u:.1f}% mean utilisation ({100 * uf:.1f}% from firm leases alone)",
        ("reproduced" if abs(100 * u - 82) <= 8 else ("backfill raises it" if u > uf else "differs"))
        if has_bf else "n/a", (u > uf) if has_bf else None)
    if nv:
        lost = nv["stalled_share"]
        inf = storm.get("inference_rate_second_half") if storm else None
        sus = storm.get("inference_sustained") if storm else None
        pinned = inf is not None and sus is not None and abs(inf - sus) <= 0.1 * max(sus, 1)
        msg = f"{100 * lost:.1f}% of the naive agent's GPU time stalled on throttled I/O " \
              f"({nv['io_throttled_calls']} of {nv['io_calls']} reads throttled)"
        if inf is not None:
            assert storm is not None          # (inf comes from it)
            msg += f"; storm inference {inf:.1f} tokens/s in the second half of its window " \
                   f"(asked {storm['inference_asked_rate']:,.0f}/s, sustained {sus:g}/s)"
        ok = lost > 0.1 and (pinned or inf is None)
        add(5, msg, "reproduced" if ok and 0.25 <= lost <= 0.55 else
            ("same direction" if ok else "differs"), ok)
    else:
        add(5, "needs a naive agent", "n/a", None)
    j = summary["journal"]
    if j:
        ops = j["ops"]
        calls = sum(ops.get(k, 0) for k in ("acquire", "release", "renew", "cancel", "consume"))
        pool = sum(ops.get(k, 0) for k in ("add_nodes", "remove_nodes"))
        n_calls = sim_decision_calls(sim)
        ok = calls == n_calls
        add(6, f"{j['records']:,} journal records: {calls:,} decisions asked for "
               f"(acquire/release/renew/cancel/consume; the agents made {n_calls:,}), "
               f"{j['records'] - calls - pool:,} records of what followed (grants, expiries, "
               f"preemptions, ...) and {pool:,} pool changes (pilots joining and leaving)",
            "reproduced" if ok else "differs", ok)
    else:
        add(6, "journal off in this run", "n/a", None)
    return out


def sim_decision_calls(sim: Any) -> int:
    """Decisions the agents asked the broker for, counted on the simulator's side."""
    return sum(sim.decision_counts.values())
