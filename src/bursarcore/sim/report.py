"""The report: one self-contained HTML page (figures embedded as PNG, a timeline in plain
JavaScript, no network), plus ``journal.jsonl`` and ``summary.json`` beside it.

Matplotlib draws the figures (the ``sim`` extra); without it the page still has the
claims table, the numbers and the timeline, and says the figures need matplotlib.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import os
from typing import Any

import numpy as np

from .metrics import SimResult

__all__ = ["write_report", "render_html", "write_outputs"]

_COLORS = {"storm": "#d62728", "interactive": "#2ca02c", "naive": "#ff7f0e",
           "adaptive": "#1f77b4", "backfill": "#9e9e9e", "probe": "#9467bd",
           "population": "#17becf"}
_OTHER = "#666666"
_AGENT_ORDER = ["interactive", "adaptive", "naive", "storm", "probe", "backfill"]


def _mpl():
    try:
        import matplotlib

        matplotlib.use("Agg", force=True)
        import matplotlib.pyplot as plt

        return plt
    except ImportError:
        return None


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=96, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _shade_storm(ax: Any, res: SimResult) -> None:
    windows = {tuple(d["window"]) for d in res.summary["campaigns"].values()
               if d["agent"] == "storm" and d["window_in_run"]}   # storms of one window: once
    for w0, w1 in sorted(windows):
        ax.axvspan(w0 / 60, w1 / 60, color="#d62728", alpha=0.06, lw=0)


def figures(res: SimResult) -> dict[str, str]:
    """Base64 PNGs by name (empty without matplotlib)."""
    plt = _mpl()
    if plt is None:
        return {}
    s, summ = res.series, res.summary
    camps = summ["campaigns"]
    tm = s["t"] / 60.0
    out: dict[str, str] = {}

    # 1. occupancy by campaign, and by population (its members together)
    fig, ax = plt.subplots(figsize=(10, 3.6))
    names = [n for n in s["held"]]
    order = sorted(names, key=lambda n: _AGENT_ORDER.index(camps[n]["agent"])
                   if camps[n]["agent"] in _AGENT_ORDER else len(_AGENT_ORDER))
    groups = s.get("groups_held", {})
    layers = [s["held"][n] for n in order] + list(groups.values())
    if layers:   # a scenario of populations alone has no named campaign to stack
        ax.stackplot(tm, layers, labels=order + [f"{g} (population)" for g in groups],
                     step="post", alpha=0.85,
                     colors=[_COLORS.get(camps[n]["agent"], _OTHER) for n in order]
                     + [_COLORS["population"]] * len(groups))
    ax.axhline(s["capacity"], color="k", lw=1, ls="--", label="capacity")
    _shade_storm(ax, res)
    ax.set_xlabel("simulated minutes")
    ax.set_ylabel("GPUs held (active leases)")
    ax.set_title("Pool occupancy by campaign (the storm's window shaded)")
    ax.legend(loc="upper left", fontsize=8, ncol=3)
    ax.set_xlim(tm[0], tm[-1])
    out["occupancy"] = _png(fig)

    # 2. storm: hold vs ceiling and sustained, token balance; inference
    storms = [n for n in names if camps[n]["agent"] == "storm"]
    if storms:
        n = storms[0]
        d = camps[n]
        fig, (ax, ax3) = plt.subplots(1, 2, figsize=(11, 3.6), gridspec_kw={"width_ratios": [3, 2]})
        ax.step(tm, s["held"][n], where="post", color=_COLORS["storm"], label="held")
        ax.axhline(d["ceiling"], color="k", ls=":", lw=1, label=f"ceiling b = {d['ceiling']}")
        ax.axhline(d["sustained"], color="k", ls="--", lw=1, label=f"sustained s = {d['sustained']}")
        if d.get("predicted_hold"):
            ax.axhline(d["predicted_hold"], color="#555", ls="-.", lw=0.8,
                       label=f"s + B/window = {d['predicted_hold']:.0f}")
        if d["avg_hold_window"] is not None:
            ax.axhline(d["avg_hold_window"], color=_COLORS["storm"], ls="-.", lw=0.8,
                       label=f"average in window = {d['avg_hold_window']:.0f}")
        _shade_storm(ax, res)
        ax.set_xlabel("simulated minutes")
        ax.set_ylabel("GPUs")
        ax.set_title(f"{n}: hold against its envelope")
        tok = s["tokens"].get(n)
        if tok is not None and tok.size:
            ax2 = ax.twinx()
            ax2.plot(tok[:, 0] / 60, tok[:, 1] / 1000, color="#8c564b", lw=1.2, label="tokens")
            ax2.set_ylabel("token balance (k GPU-s)", color="#8c564b")
            ax2.set_ylim(bottom=0)
        ax.legend(loc="upper left", fontsize=7)
        fl = s.get("flow", {}).get(n, {}).get("inference")
        if fl is not None:
            ax3.plot(tm, fl["asked"], color="#aaa", label="asked")
            ax3.plot(tm, fl["allowed"], color=_COLORS["storm"], label="allowed")
            if d.get("inference_sustained") is not None:
                ax3.axhline(d["inference_sustained"], color="k", ls="--", lw=1,
                            label=f"sustained {d['inference_sustained']:g}/s")
            ax3.set_yscale("symlog", linthresh=10)
            ax3.set_title("storm inference (tokens/s)")
            ax3.set_xlabel("simulated minutes")
            ax3.legend(fontsize=7)
            _shade_storm(ax3, res)
        else:
            ax3.axis("off")
        out["storm"] = _png(fig)

    # 2b. a tree of envelopes: each project's subtree and its children's, against g and b
    tree = summ.get("tree")
    if tree and s.get("tree_held"):
        tops = [n for n, d in tree["nodes"].items() if d["level"] == 0 and d["children"]]
        if tops:
            fig, axs = plt.subplots(1, len(tops), figsize=(5.5 * len(tops), 3.4), squeeze=False)
            for ax, top in zip(axs[0], tops):
                members = [top] + [n for n, d in tree["nodes"].items() if d["parent"] == top]
                for k, n in enumerate(members):
                    d = tree["nodes"][n]
                    line, = ax.step(tm, s["tree_held"][n], where="post",
                                    lw=2.0 if k == 0 else 1.0,
                                    label=f"{n} (g {d['guaranteed']:g}, b {d['ceiling']:g})")
                    ax.axhline(d["guaranteed"], color=line.get_color(), ls="--", lw=0.8)
                ax.axhline(tree["nodes"][top]["ceiling"], color="k", ls=":", lw=1)
                _shade_storm(ax, res)
                ax.set_title(f"{top}: held by each subtree (dashed: guarantees, dotted: ceiling)",
                             fontsize=9)
                ax.set_xlabel("simulated minutes")
                ax.set_ylabel("GPUs held")
                ax.legend(fontsize=7, loc="lower right")
            out["tree"] = _png(fig)

    # 3. grant latency per class
    lat = s["latency"]
    if lat:
        fig, ax = plt.subplots(figsize=(7, 3.4))
        for cls, x in sorted(lat.items()):
            if x.size == 0:
                continue
            xs = np.sort(x)
            ax.step(np.r_[0, xs], np.r_[0, np.arange(1, xs.size + 1) / xs.size], where="post",
                    label=f"{cls} (n={xs.size}, p95 {np.percentile(xs, 95):.1f} s)")
        ax.set_xscale("symlog", linthresh=1)
        ax.set_xlabel("grant latency: request → lease active (s)")
        ax.set_ylabel("share of requests")
        ax.set_title("Grant latency by service class (ECDF)")
        ax.axvline(res.scenario.broker["grace"], color="k", ls=":", lw=1, label="grace")
        ax.legend(fontsize=7, loc="lower right")
        out["latency"] = _png(fig)

    # 4. utilisation
    fig, ax = plt.subplots(figsize=(10, 3.2))
    cap = s["capacity"]
    ax.plot(tm, 100 * s["occupied"] / cap, color="k", lw=1, label="all leases")
    ax.plot(tm, 100 * s["occupied_firm"] / cap, color="#1f77b4", lw=1, label="firm leases only")
    busy = sum(s.get("running", {}).values()) if s.get("running") else None
    if busy is not None:
        ax.plot(tm, 100 * busy / cap, color="#2ca02c", lw=1, label="science tasks computing")
    ax.set_ylim(0, 105)
    _shade_storm(ax, res)
    ax.set_xlabel("simulated minutes")
    ax.set_ylabel("% of the pool")
    ax.set_title(f"Utilisation: mean {100 * summ['utilisation']:.1f}% "
                 f"(firm leases alone {100 * summ['utilisation_firm_only']:.1f}%)")
    ax.legend(fontsize=8, loc="lower left")
    out["utilisation"] = _png(fig)

    # 5. credits and science per agent
    nm = [n for n in order if camps[n]["credits_spent"] is not None]
    if nm:
        out["credits"] = _credits_figure(plt, camps, nm)

    # 6. I/O throttling
    fls = {n: v["fs"] for n, v in s.get("flow", {}).items() if "fs" in v}
    if fls:
        fig, axs = plt.subplots(1, 2, figsize=(11, 3.2))
        for n, fl in fls.items():
            c = _COLORS.get(camps[n]["agent"], _OTHER)
            axs[0].plot(tm, fl["allowed"], color=c, lw=1, label=f"{n} allowed")
            axs[0].plot(tm, np.minimum(fl["asked"], 1e4), color=c, lw=0.6, ls=":",
                        label=f"{n} asked")
        axs[0].set_yscale("symlog", linthresh=1)
        axs[0].set_title("filesystem GB/s: asked vs allowed (throttled at source)")
        axs[0].set_xlabel("simulated minutes")
        axs[0].legend(fontsize=7)
        for n in fls:
            if n in s.get("busy", {}):
                c = _COLORS.get(camps[n]["agent"], _OTHER)
                axs[1].plot(tm, s["busy"][n] - s["running"][n], color=c, lw=1,
                            label=f"{n}: GPUs waiting on inputs")
                axs[1].plot(tm, s["running"][n], color=c, lw=1, ls="--",
                            label=f"{n}: GPUs computing")
        axs[1].set_title("GPUs stalled on I/O vs computing")
        axs[1].set_xlabel("simulated minutes")
        axs[1].legend(fontsize=7)
        out["io"] = _png(fig)
    return out


def _credits_figure(plt: Any, camps: dict, nm: list[str]) -> str:
    fig, axs = plt.subplots(1, 3, figsize=(11, 3.2))
    cols = [_COLORS.get(camps[n]["agent"], _OTHER) for n in nm]
    axs[0].bar(nm, [camps[n]["credits_spent"] for n in nm], color=cols)
    axs[0].set_title("credits spent")
    sci = [n for n in nm if "science" in camps[n]]
    axs[1].bar(sci, [camps[n]["science"] for n in sci], color=[_COLORS.get(camps[n]["agent"], _OTHER) for n in sci])
    axs[1].set_title("science (value of completed tasks)")
    axs[2].bar(sci, [camps[n]["science_per_credit"] or 0 for n in sci],
               color=[_COLORS.get(camps[n]["agent"], _OTHER) for n in sci])
    axs[2].set_title("science per credit")
    for a in axs:
        a.tick_params(axis="x", labelrotation=30, labelsize=8)
    return _png(fig)


def _timeline_data(res: SimResult, max_events: int = 4000) -> dict:
    s, camps = res.series, res.summary["campaigns"]
    t = s["t"]
    data: dict[str, Any] = {"t": t.tolist(), "capacity": int(s["capacity"]), "campaigns": []}
    for n, h in s["held"].items():
        d = camps[n]
        cap = s["campaign_caps"][n]
        tok = s["tokens"].get(n)
        tokens = (np.interp(t, tok[:, 0], tok[:, 1]).round(0).tolist()
                  if tok is not None and tok.size else None)
        data["campaigns"].append({"name": n, "agent": d["agent"], "class": d["class"],
                                  "color": _COLORS.get(d["agent"], "#666"),
                                  "g": cap["g"], "s": cap["s"], "b": cap["b"],
                                  "held": np.asarray(h).astype(int).tolist(),
                                  "tokens": tokens})
    for spec in res.scenario.populations:
        h = s.get("groups_held", {}).get(spec.name)
        if h is None:
            continue
        env, dim = spec.envelope, res.scenario.pool.dims[0]
        data["campaigns"].append({"name": f"{spec.name} ×{spec.count:,}", "agent": "population",
                                  "class": spec.service_class, "color": _COLORS["population"],
                                  "g": spec.count * env.g(dim), "s": spec.count * env.s(dim),
                                  "b": spec.count * env.b(dim),
                                  "held": np.asarray(h).astype(int).tolist(), "tokens": None})
    pool = s.get("pool", {})
    if pool.get("t") is not None and len(pool["t"]):
        for k in ("multiplier", "free", "congestion"):
            data[k] = np.interp(t, pool["t"], pool[k]).round(3).tolist()
    ev = []
    j = res.journal
    if j is not None:
        from ..journal.records import OPS, REASONS

        rows = j.rows()
        names = j.names
        keep = np.isin(rows["op"], [i for i, o in enumerate(OPS)
                                    if o in ("grant", "preempt", "revoke", "activate", "refuse",
                                             "release", "renew", "acquire")])
        r = rows[keep]
        # acquisitions that pended or were refused, and everything else
        r = r[(r["op"] != OPS.index("acquire")) | (r["outcome"] != 1)]
        if r.shape[0] > max_events:
            idx = np.linspace(0, r.shape[0] - 1, max_events).astype(int)
            r = r[idx]
        for row in r:
            c = int(row["campaign"])
            ev.append([round(int(row["t"]) / 1e9, 2), names[c] if 0 <= c < len(names) else "",
                       OPS[int(row["op"])], int(row["units"]),
                       REASONS[int(row["reason"])] if 0 <= int(row["reason"]) < len(REASONS) else ""])
    data["events"] = ev
    return data


_TIMELINE_JS = r"""
(function () {
  var D = JSON.parse(document.getElementById('timeline-data').textContent);
  var slider = document.getElementById('tl-slider');
  var label = document.getElementById('tl-time');
  var bars = document.getElementById('tl-bars');
  var evbox = document.getElementById('tl-events');
  var play = document.getElementById('tl-play');
  var sig = document.getElementById('tl-signals');
  slider.max = D.t.length - 1;
  var rows = D.campaigns.map(function (c) {
    var row = document.createElement('div'); row.className = 'tl-row';
    var name = document.createElement('span'); name.className = 'tl-name';
    name.textContent = c.name + ' (' + c['class'] + ')';
    var track = document.createElement('div'); track.className = 'tl-track';
    var fill = document.createElement('div'); fill.className = 'tl-fill';
    fill.style.background = c.color;
    var mk = function (v, cls, title) {
      var m = document.createElement('div'); m.className = cls; m.title = title;
      m.style.left = (100 * Math.min(v, D.capacity) / D.capacity) + '%'; track.appendChild(m);
    };
    track.appendChild(fill);
    if (c.g > 0) mk(c.g, 'tl-mark tl-g', 'guaranteed ' + c.g);
    mk(c.s, 'tl-mark tl-s', 'sustained ' + c.s);
    mk(c.b, 'tl-mark tl-b', 'ceiling ' + c.b);
    var val = document.createElement('span'); val.className = 'tl-val';
    row.appendChild(name); row.appendChild(track); row.appendChild(val);
    bars.appendChild(row);
    return {c: c, fill: fill, val: val};
  });
  function fmt(t) {
    var m = Math.floor(t / 60), s = Math.floor(t % 60);
    return m + ' min ' + (s < 10 ? '0' : '') + s + ' s';
  }
  function show(i) {
    i = Math.max(0, Math.min(D.t.length - 1, i | 0));
    var t = D.t[i], total = 0;
    label.textContent = 't = ' + fmt(t) + ' (' + t.toFixed(0) + ' s)';
    rows.forEach(function (r) {
      var h = r.c.held[i]; total += h;
      r.fill.style.width = (100 * h / D.capacity) + '%';
      var txt = h + ' GPUs';
      if (r.c.tokens) txt += ' · tokens ' + Math.round(r.c.tokens[i]).toLocaleString();
      r.val.textContent = txt;
    });
    var s = 'occupied ' + total + ' / ' + D.capacity + ' (' + (100 * total / D.capacity).toFixed(0) + '%)';
    if (D.multiplier) s += ' · congestion multiplier ×' + D.multiplier[i].toFixed(2) +
        ' · free ' + Math.round(D.free[i]);
    sig.textContent = s;
    var lo = t - 30, hi = t + 30, out = [];
    for (var k = 0; k < D.events.length && out.length < 40; k++) {
      var e = D.events[k];
      if (e[0] >= lo && e[0] <= hi) out.push(e);
    }
    evbox.innerHTML = '';
    if (!out.length) { evbox.textContent = 'no journaled decisions within 30 s'; return; }
    out.forEach(function (e) {
      var li = document.createElement('li');
      li.textContent = e[0].toFixed(1) + ' s  ' + e[1] + '  ' + e[2] +
        (e[3] ? '  ' + e[3] + ' GPUs' : '') + (e[4] ? '  (' + e[4] + ')' : '');
      evbox.appendChild(li);
    });
  }
  slider.addEventListener('input', function () { show(+slider.value); });
  var timer = null;
  play.addEventListener('click', function () {
    if (timer) { clearInterval(timer); timer = null; play.textContent = 'play'; return; }
    play.textContent = 'pause';
    timer = setInterval(function () {
      var v = +slider.value + 1;
      if (v > +slider.max) { clearInterval(timer); timer = null; play.textContent = 'play'; return; }
      slider.value = v; show(v);
    }, 40);
  });
  var start = D.t.findIndex(function (x) { return x >= (D.focus || 0); });
  slider.value = start < 0 ? 0 : start;
  show(+slider.value);
  document.body.setAttribute('data-timeline', 'ready');
  function figs() {
    var ok = 0, imgs = document.querySelectorAll('img[data-figure]');
    imgs.forEach(function (im) { if (im.complete && im.naturalWidth > 0) ok++; });
    document.body.setAttribute('data-figures-rendered', ok + '/' + imgs.length);
  }
  if (document.readyState === 'complete') figs(); else window.addEventListener('load', figs);
})();
"""

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px auto;
max-width:1150px;color:#222;line-height:1.4;padding:0 16px}
h1{font-size:1.5em;margin-bottom:0}h2{font-size:1.15em;margin-top:1.8em;border-bottom:1px solid #ddd}
.sub{color:#666;margin-top:4px}table{border-collapse:collapse;font-size:0.9em;width:100%}
td,th{border:1px solid #ddd;padding:4px 8px;vertical-align:top;text-align:left}
th{background:#f5f5f5}.ok{color:#1a7f37;font-weight:600}.bad{color:#b42318;font-weight:600}
.na{color:#888}img{max-width:100%;display:block;margin:8px 0}
.tl-row{display:flex;align-items:center;margin:3px 0;font-size:0.85em}
.tl-name{width:230px;flex:none}.tl-val{width:260px;flex:none;padding-left:8px;color:#444}
.tl-track{position:relative;flex:1;height:16px;background:#f0f0f0;border-radius:2px}
.tl-fill{height:100%;border-radius:2px}.tl-mark{position:absolute;top:-2px;width:2px;height:20px}
.tl-g{background:#2ca02c}.tl-s{background:#333}.tl-b{background:#d62728}
#tl-slider{width:100%}#tl-events{font-family:ui-monospace,monospace;font-size:0.8em;
max-height:220px;overflow:auto;background:#fafafa;border:1px solid #eee;padding:6px 24px}
.num{text-align:right;font-variant-numeric:tabular-nums}code{background:#f3f3f3;padding:0 3px}
"""


def _f(x: Any, nd: int = 1) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    if isinstance(x, (int, np.integer)):
        return f"{int(x):,}"
    return f"{x:,.{nd}f}"


def render_html(res: SimResult, figs: dict[str, str] | None = None) -> str:
    figs = figures(res) if figs is None else figs
    sc, summ, camps = res.scenario, res.summary, res.summary["campaigns"]
    e = html.escape
    parts = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
             f"<title>bursarcore simulation: {e(sc.name)}</title><style>{_CSS}</style></head><body>"]
    parts.append(f"<h1>bursarcore simulation — {e(sc.name)}</h1>")
    parts.append(f"<p class='sub'>{e(sc.description)}<br>pool {summ['capacity']:,} GPUs"
                 f"{''.join(f', {k} {v:g}/s' for k, v in sc.pool.flow.items())}; "
                 f"{summ['duration']:,.0f} simulated s; seed {summ['seed']}; "
                 f"{e(summ['backend'])} engine, {e(summ['enforcement'])} enforcement, grace "
                 f"{sc.broker['grace']:g} s; bursarcore {e(summ['version'])}; "
                 f"{res.timing['wall_seconds']:.2f} s wall ({res.timing['engine_seconds']:.2f} s "
                 f"in the broker, {res.timing['broker_calls']:,} calls)</p>")
    # claims
    parts.append("<h2>The source document's claims (SPEC §10) beside this run</h2><table>"
                 "<tr><th>#</th><th>claim</th><th>source</th><th>this run</th><th>verdict</th></tr>")
    for c in res.claims:
        cls = "na" if c["ok"] is None else ("ok" if c["ok"] else "bad")
        parts.append(f"<tr><td>{c['claim']}</td><td>{e(c['what'])}</td><td>{e(c['source'])}</td>"
                     f"<td>{e(c['measured'])}</td><td class='{cls}'>{e(c['verdict'])}</td></tr>")
    parts.append("</table>")
    # timeline
    data = _timeline_data(res)
    storm_w = [d["window"][0] for d in camps.values()
               if d["agent"] == "storm" and d["window_in_run"]]
    data["focus"] = storm_w[0] + 60 if storm_w else 0
    parts.append("<h2>Timeline — drag the slider to scrub through time</h2>"
                 "<p class='sub'>Bars: GPUs held by each campaign (marks: green guarantee, black "
                 "sustained rate, red ceiling). Below: the journal's decisions within 30 s.</p>"
                 "<div><button id='tl-play' type='button'>play</button> <b id='tl-time'></b> "
                 "<span id='tl-signals' class='sub'></span></div>"
                 "<input id='tl-slider' type='range' min='0' max='0' value='0' step='1'>"
                 "<div id='tl-bars'></div><ul id='tl-events'></ul>")
    parts.append("<script id='timeline-data' type='application/json'>"
                 + json.dumps(data, separators=(",", ":")).replace("</", "<\\/") + "</script>")
    parts.append(f"<script>{_TIMELINE_JS}</script>")
    # figures
    captions = {
        "occupancy": "Pool occupancy by campaign.",
        "storm": "The storm against its envelope: it asks for its ceiling every second; prepaid "
                 "leases let it burst only as far as its tokens pay, then hold it at its "
                 "sustained rate. Right: its inference, throttled at source.",
        "tree": "A tree of envelopes: what each project's subtree and each of its campaigns' "
                "held over time, beside their guarantees (dashed) and the project's ceiling "
                "(dotted).",
        "latency": "Grant latency (request → lease active) per service class.",
        "utilisation": "Utilisation over time.",
        "credits": "Credits spent and science produced per agent.",
        "io": "I/O throttling: what the science agents asked of the filesystem and what they "
              "got; the naive agent's GPUs wait on their inputs, the adaptive agent stages "
              "inputs before it asks for GPUs.",
    }
    parts.append("<h2>Figures</h2>")
    if not figs:
        parts.append("<p class='na'>Figures need matplotlib: <code>pip install "
                     "'bursarcore[sim]'</code>.</p>")
    for k, cap in captions.items():
        if k in figs:
            parts.append(f"<figure><img alt='{k}' data-figure='{k}' "
                         f"src='data:image/png;base64,{figs[k]}'><figcaption>{e(cap)}"
                         f"</figcaption></figure>")
    # per-campaign table
    parts.append("<h2>Per campaign</h2><table><tr><th>campaign</th><th>agent</th><th>class</th>"
                 "<th class='num'>mean GPUs held</th><th class='num'>credits spent</th>"
                 "<th class='num'>science</th><th class='num'>science / credit</th>"
                 "<th class='num'>latency p50 / p95 (s)</th><th>refusals</th>"
                 "<th class='num'>preempted</th></tr>")
    for n, d in camps.items():
        ref = ", ".join(f"{k} {v}" for k, v in d["refused"].items()) or "–"
        parts.append(f"<tr><td>{e(n)}</td><td>{d['agent']}</td><td>{d['class']}</td>"
                     f"<td class='num'>{_f(d['mean_held'])}</td>"
                     f"<td class='num'>{_f(d['credits_spent'])}</td>"
                     f"<td class='num'>{_f(d.get('science'))}</td>"
                     f"<td class='num'>{_f(d.get('science_per_credit'), 2)}</td>"
                     f"<td class='num'>{_f(d['latency_p50'])} / {_f(d['latency_p95'])}</td>"
                     f"<td>{e(ref)}</td><td class='num'>{d['preempted']}</td></tr>")
    parts.append("</table>")
    if summ.get("tree"):
        parts.append(_tree_html(summ["tree"]))
    fac = summ.get("facility")
    if fac:
        ended = ", ".join(f"{k} {v}" for k, v in fac["pilots_ended"].items()) or "none"
        fails = "; ".join(f"{x['pilots']} at {x['at']:g} s" for x in fac["failures"])
        ws = ", ".join(f"{k} {v:,}" for k, v in fac["work_status"].items())
        parts.append(
            f"<h2>Facility (SPEC §12)</h2><p>The pool is {fac['pilots']} pilots of "
            f"{fac['nodes_per_pilot']} × {fac['slots_per_node']} GPUs of the local binding "
            f"(simulated execution), kept by the pool manager; walltime "
            f"{fac['walltime']:,.0f} s, queue wait {fac['start_delay']:g} s"
            f"{'; node failures: ' + e(fails) if fails else ''}.</p><table>"
            f"<tr><th>pilots submitted / joined / drained / left / ended</th>"
            f"<th class='num'>leases revoked by the pool shrinking</th>"
            f"<th class='num'>pool low</th><th class='num'>work launched (parts)</th>"
            f"<th class='num'>signalled</th><th class='num'>killed after grace</th>"
            f"<th>work at the end</th></tr>"
            f"<tr><td>{fac['pilots_submitted']} / {fac['pilots_joined']} / "
            f"{fac['pilots_drained']} / {fac['pilots_left']} / {e(ended)}</td>"
            f"<td class='num'>{fac['leases_revoked_by_pool']:,}</td>"
            f"<td class='num'>{fac['capacity_min']:,}</td>"
            f"<td class='num'>{fac['work_launched']:,} ({fac['work_parts']:,})</td>"
            f"<td class='num'>{fac['work_signalled']:,}</td>"
            f"<td class='num'>{fac['work_killed']:,}</td><td>{e(ws)}</td></tr></table>")
    j = summ.get("journal")
    if j:
        ops = ", ".join(f"{k} {v:,}" for k, v in sorted(j["ops"].items(), key=lambda kv: -kv[1]))
        parts.append(f"<h2>Journal</h2><p>{j['records']:,} records ({e(ops)}), in "
                     f"<code>journal.jsonl</code> beside this page; every number above is in "
                     f"<code>summary.json</code>.</p>")
    parts.append("<p class='sub'>Made by <code>bursar simulate</code>. Self-contained: no "
                 "network, no external files.</p></body></html>")
    return "".join(parts)


TREE_CHECKS = {
    "isolation": "every request within a guarantee in a project without a storm was granted "
                 "warm or on the reclaim path within the grace, never refused nor left pending "
                 "for capacity, ceiling or tokens",
    "wakers_within_grace": "every waker's first request (its guarantee) was active within "
                           "the grace",
    "ceilings": "no node's subtree ever held more than the node's ceiling",
}


def tree_lines(tree: dict) -> list[str]:
    """The tree's checks and figures as plain lines (the command line prints them)."""
    out = [f"tree check {k}: {'holds' if ok else 'BROKEN'} ({TREE_CHECKS.get(k, k)})"
           for k, ok in tree["checks"].items()]
    for cls, d in tree["storm"].items():
        den = ", ".join(f"{r} {n:,}" for r, n in d["denied"].items()) or "none"
        out.append(f"storm ({cls}, {len(d['agents'])} agents): {d['asked']:,} asks, "
                   f"{d['granted']:,} granted; denied: {den}")
    for n, w in tree["wakers"].items():
        wait = "never active" if w["wait"] is None else f"{w['wait']:g} s"
        out.append(f"waker {n}: asked {w['units']} GPUs at {w['asked_at']:g} s, "
                   f"{w['answer']} {w['path'] or w['reason'] or ''}, wait {wait}")
    for n, d in tree["nodes"].items():
        if d.get("borrowed") and not d["children"]:
            out.append(f"borrower {n}: {d['borrowed']:,} GPUs granted on borrowed leases in all "
                       f"(SPEC §14.8), {d['borrowed_preempted']:,} of those leases preempted "
                       f"when a lender asked for its guarantee")
    for n, p in tree["projects"].items():
        out.append(f"project {n}{' (storm inside)' if p['storm_inside'] else ''}: "
                   f"{p['within_guarantee']:,} requests within a guarantee, "
                   f"{p['granted_warm']:,} warm, {p['granted_reclaim']:,} reclaim, "
                   f"{p['violations']} not served as promised")
    return out


def _tree_html(tree: dict) -> str:
    e = html.escape
    parts = ["<h2>Tree of envelopes (SPEC §14)</h2><p class='sub'>Every level's ceiling, "
             "bucket and budget bind its subtree; guarantees nest and stay reserved at every "
             "level, idle or not; a node with a borrow limit may use its siblings' idle guarantees "
             "on leases preempted when a lender asks for its own (SPEC §14.8).</p>"
             "<table><tr><th>check</th><th>this run</th></tr>"]
    for k, ok in tree["checks"].items():
        parts.append(f"<tr><td>{e(TREE_CHECKS.get(k, k))}</td><td class='{'ok' if ok else 'bad'}'>"
                     f"{'holds' if ok else 'broken'}</td></tr>")
    parts.append("</table>")
    cps = tree["checkpoints"]
    parts.append("<h3>Held by each subtree over time (GPUs)</h3><table><tr><th>node</th>"
                 "<th class='num'>g</th><th class='num'>s</th><th class='num'>b</th>"
                 "<th class='num'>mean</th><th class='num'>max</th>"
                 + "".join(f"<th class='num'>{t / 60:g} min</th>" for t in cps) + "</tr>")
    for n, d in tree["nodes"].items():
        pad = "&nbsp;" * 4 * d["level"]
        parts.append(f"<tr><td>{pad}{e(n)}</td><td class='num'>{d['guaranteed']:g}</td>"
                     f"<td class='num'>{d['sustained']:g}</td><td class='num'>{d['ceiling']:g}"
                     f"</td><td class='num'>{d['mean_held']:.1f}</td>"
                     f"<td class='num'>{d['max_held']}</td>"
                     + "".join(f"<td class='num'>{h}</td>" for h in d["held_at"]) + "</tr>")
    parts.append("</table><h3>The storm, its denials by reason, the wakers, the projects"
                 "</h3><ul>")
    for line in tree_lines(tree)[len(tree["checks"]):]:
        parts.append(f"<li>{e(line)}</li>")
    parts.append("</ul>")
    for n, p in tree["projects"].items():
        for v in p["first_violations"]:
            parts.append(f"<p class='bad'>{e(n)}: {e(v['campaign'])} asked {v['units']} at "
                         f"{v['t']:.1f} s: {e(v['why'])}</p>")
    return "".join(parts)


def _replace(path: str, write: Any) -> None:
    """``write(tmp_path)`` then rename over ``path``: a reader sees the old file or the
    whole new one, and a failed write leaves no partial file behind."""
    d, base = os.path.split(path)
    tmp = os.path.join(d, f".{base}.{os.getpid()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _write_text(text: str) -> Any:
    def write(p: str) -> None:
        with open(p, "w", encoding="utf-8") as f:
            f.write(text)
    return write


def write_outputs(res: SimResult, out_dir: str | os.PathLike, *, journal: bool = True,
                  report: bool = True) -> dict[str, str]:
    """Write ``report.html``, ``summary.json`` and ``journal.jsonl`` into ``out_dir``.

    The summary and the page are rendered before anything is written, so a run whose
    report cannot be made writes nothing; each file is written beside its final name and
    renamed into place, so none is ever left half-written."""
    from ..journal import export_jsonl

    summary = json.dumps(res.to_json(), indent=1, sort_keys=True, allow_nan=False) + "\n"
    page = render_html(res) if report else None
    out_dir = os.fspath(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    paths = {}
    p = os.path.join(out_dir, "summary.json")
    _replace(p, _write_text(summary))
    paths["summary"] = p
    if journal and res.journal is not None:
        p = os.path.join(out_dir, "journal.jsonl")
        _replace(p, lambda tmp: export_jsonl(res.journal, tmp))
        paths["journal"] = p
    if page is not None:
        p = os.path.join(out_dir, "report.html")
        _replace(p, _write_text(page))
        paths["report"] = p
    return paths


write_report = write_outputs
