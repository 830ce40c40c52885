"""``explain(record)``: why a decision came out as it did, in one paragraph with numbers."""

from __future__ import annotations

from typing import Any

from .._abi import LIMITS
from .records import binding_rule

__all__ = ["explain"]

_BIG = 1 << 61


def _u(x: int) -> str:
    return "unlimited" if x >= _BIG else f"{x:,}"


def _s(ns: int) -> str:
    v = ns / 1e9
    return f"{v:,.0f} s" if v == int(v) else f"{v:,.3f} s"


def _cr(micro: int) -> str:
    return "unlimited" if micro >= _BIG else f"{micro / 1e6:,.2f}"


def _tok(uns: int) -> str:
    return "unlimited" if uns >= _BIG else f"{uns / 1e9:,.0f}"


def _envelope(rec: dict[str, Any]) -> str:
    """A register or change record's envelope, in words."""
    env = (rec.get("payload") or {}).get("envelope", {})
    credits = "unlimited" if env.get("credits") is None else f"{env['credits']:,}"
    return (f"credits {credits}, class {env.get('service_class')}, guaranteed "
            f"{env.get('guaranteed')}, sustained {env.get('sustained')}, ceiling "
            f"{env.get('ceiling')} and burst {env.get('burst')}")


def explain(rec: dict[str, Any]) -> str:
    """One paragraph for a journal record (a dict from :meth:`Journal.record`)."""
    op = rec["op"]
    who = rec.get("campaign_name") or f"campaign {rec['campaign']}"
    dim = rec.get("dim_name") or "units"
    cls = rec.get("class_name") or f"class {rec['cls']}"
    at = f"At t = {_s(rec['t'])}"
    if op == "config":
        return f"{at} the broker started with this configuration: {rec['payload']}."
    if op == "register":
        who = (rec.get("payload") or {}).get("name", who)
        return f"{at} campaign {who} was registered with {_envelope(rec)}."
    if op == "change":
        who = (rec.get("payload") or {}).get("name", who)
        return (f"{at} the envelope of {who} was changed to {_envelope(rec)}; its live "
                f"leases keep running as granted.")
    if op == "remove":
        who = (rec.get("payload") or {}).get("name", who)
        return (f"{at} campaign {who} was removed: its guarantee left its parent's and the "
                f"pool's figures, and its name is unknown until registered again.")
    if op == "advance":
        return f"{at} time advanced; the pending queue was served in order."
    lease = rec["lease"]
    if op in ("expire", "revoke", "activate", "preempt"):
        what = {"expire": "expired at the end of its term",
                "revoke": "was revoked: its preemption grace ended",
                "activate": "became active: the opportunistic leases it reclaimed are gone",
                "preempt": ("was told it will be preempted at "
                            f"t = {_s(rec['deadline'])} (the grace of its class)")}[op]
        return (f"{at} lease {lease} of {who} ({rec['units']} {dim}) {what}. {who} now holds "
                f"{rec['held_after']} {dim}; tokens {_tok(rec['tokens_after'])} unit-s, "
                f"credits {_cr(rec['credits_after'])}.")
    if op == "release":
        if rec["outcome"] == "refused":
            return f"{at} {who} tried to release lease {lease}, which was no longer live."
        return (f"{at} {who} released lease {lease} ({rec['units']} {dim}) early: the unused "
                f"part of its prepaid tokens and {_cr(-rec['cost'])} credits were refunded; "
                f"tokens now {_tok(rec['tokens_after'])} unit-s, credits "
                f"{_cr(rec['credits_after'])}.")
    if op == "cancel":
        return f"{at} {who} withdrew pending intent {rec['intent']}."
    if op == "refuse":
        why = ("its deadline passed" if rec["reason"] == "deadline"
               else "it waited longer than its TTL")
        return (f"{at} pending intent {rec['intent']} of {who} was refused because {why} "
                f"before {rec['nmin']} {dim} could be granted.")
    if op == "renew":
        if rec["outcome"] == "granted":
            return (f"{at} {who} renewed lease {lease} by {_s(rec['dur'])} for "
                    f"{_cr(rec['cost'])} credits; the above-sustained part was prepaid again "
                    f"from {_tok(rec['tokens_before'])} unit-s of tokens (now "
                    f"{_tok(rec['tokens_after'])}).")
        return (f"{at} {who} could not renew lease {lease} by {_s(rec['dur'])}: "
                + _because(rec, dim) + " The lease keeps its old expiry.")
    if op == "consume":
        return (f"{at} {who} asked to consume {rec['nmax'] / 1e6:,g} {dim}; "
                f"{rec['units'] / 1e6:,g} passed now"
                + ("" if rec["units"] >= rec["nmax"] else
                   f", the rest was throttled at source ({rec['reason'] or 'rate'}).") + ".")
    # acquire / grant
    ask = (f"{rec['nmin']}" if rec["nmin"] == rec["nmax"] else f"{rec['nmin']}–{rec['nmax']}")
    head = (f"{at} {who} asked for {ask} {dim} for {_s(rec['dur'])} as {cls} (rank "
            f"{rec['rank']}" + (f", fair-share deficit {rec['deficit']:+.3f}"
                                if rec.get("deficit") is not None else "") + ").")
    if op == "grant":
        head = f"{at} pending intent {rec['intent']} of {who} could now be met."
    if rec["outcome"] == "granted":
        path = {1: "warm path (free units)", 2: "reclaim path (after preempting opportunistic "
                "leases, active when their grace ends)", 3: "borrow path (free units its "
                "siblings' idle guarantees lend, on a lease revoked after the borrow grace "
                "when the pool needs them)"}.get(rec["path"], "warm path")
        body = (f" Granted {rec['units']} {dim} as lease {lease} on the {path}, escrowing "
                f"{_cr(rec['cost'])} credits.")
        if rec["path"] == 3:
            body += (f" Its firm room allowed {_u(max(0, rec['lim_capacity']))} {dim}; the "
                     f"borrowed lease gave it more.")
        elif rec["units"] < rec["nmax"]:
            body += " It was sized down: " + _because(rec, dim, granted=True)
        return head + body
    if rec["outcome"] == "pending":
        return (head + " It could not be met now and waits in the pending queue: "
                + _because(rec, dim))
    return head + " Refused: " + _because(rec, dim)


def _because(rec: dict, dim: str, granted: bool = False) -> str:
    lims = {name: rec[f"lim_{name}"] for name in LIMITS}
    reason = rec["reason"]
    if granted or not reason:
        reason = LIMITS[binding_rule("granted" if granted else rec["outcome"], reason,
                                     rec["units"], rec["nmax"], list(lims.values()))]
    n = lims.get(reason, 0)
    held_before = rec["held_after"] - (rec["units"] if rec["outcome"] == "granted" else 0)
    level = rec.get("level", -1)
    if reason in ("ceiling", "tokens", "credits") and level >= 0 and level != rec["campaign"]:
        return _above(rec, reason, level, n, dim)
    if reason == "ceiling":
        return (f"the ceiling binds — {who_holds(held_before, dim)} and the ceiling allows "
                f"{_u(n)} more.")
    if reason == "capacity":
        return (f"capacity binds — {rec['free']:,} {dim} are free now and {rec['unmet']:,} "
                f"are kept for campaigns' unmet guarantees (only opportunistic and borrowed "
                f"leases may use them), so at most {_u(n)} could be granted here.")
    if reason == "tokens":
        return (f"the prepaid token bucket binds — it holds {_tok(rec['tokens_before'])} "
                f"unit-seconds, which pay for at most {_u(n)} {dim} (those within the "
                f"sustained rate are free) for {_s(rec['dur'])}.")
    if reason == "credits":
        return (f"credits bind — {_cr(rec['credits_before'])} credits left"
                + (f" and a max_spend of {_cr(rec['max_spend'])}" if rec["max_spend"] >= 0 else "")
                + f" pay for at most {_u(n)} {dim} at this price.")
    if reason == "deadline":
        return "the deadline falls before the earliest time any grant path could deliver."
    if reason == "ttl":
        return "it waited in the pending queue longer than its TTL."
    if reason == "invalid":
        return "the lease was not live."
    if reason == "unknown_campaign":
        return "the campaign is not registered."
    if reason == "cancelled":
        return "it was cancelled."
    if reason == "pending_limit":
        return ("the campaign already has as many intents waiting in the pending queue as "
                "its cap (max_pending) allows.")
    if reason in lims:
        return f"the {reason} rule binds — it allows at most {_u(n)} {dim} here."
    return f"rule {reason}."


def _above(rec: dict, rule: str, level: int, n: int, dim: str) -> str:
    """The reason when a level above the node bound the decision (SPEC §14.2): that level's
    rule, named with its figure (``level_figure``), not the node's own."""
    above = "`" + (rec.get("level_name") or f"campaign {level}") + "`"
    own = "`" + (rec.get("campaign_name") or f"campaign {rec['campaign']}") + "`'s own"
    fig = rec.get("level_figure", 0)
    if rule == "ceiling":
        return (f"the ceiling of {above} ({_u(fig)} {dim}) binds, not {own} — with what its "
                f"subtree holds and the guarantees reserved in it, it allows {_u(n)} more.")
    if rule == "tokens":
        return (f"the prepaid token bucket of {above} binds, not {own} — it holds "
                f"{_tok(fig)} unit-seconds, which pay for at most {_u(n)} {dim} (those "
                f"within the sustained rates on the path are free) for {_s(rec['dur'])}.")
    return (f"the budget of {above} binds, not {own} — {_cr(fig)} credits left pay for at "
            f"most {_u(n)} {dim} at this price.")


def who_holds(h: int, dim: str) -> str:
    return f"the campaign holds {h:,} {dim}"
