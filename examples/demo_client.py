"""An agent negotiating with ``bursar serve`` over HTTP: supply -> quote -> intent -> lease
-> renew -> release, with the journal explaining each decision.

    bursar serve --demo &                      # the SPEC §10 scenario; writes tokens to
                                               # bursar-demo-credentials.json
    python examples/demo_client.py             # talks to http://127.0.0.1:8000

    python examples/demo_client.py --spawn     # starts its own server on loopback first

The client returns the same types as the in-process broker (Supply, Quote, Decision,
Lease, Consumption, Event): swapping ``Broker(...)`` for ``BursarClient(url, token)`` is
the whole change for an agent.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time

from bursarcore import Intent
from bursarcore.client import BursarClient, ServiceError


def negotiate(c: BursarClient, campaign: str, want: int, budget: float) -> int:
    t0 = time.monotonic()

    def say(msg: str) -> None:
        print(f"[{time.monotonic() - t0:5.2f} s] {msg}")

    cursor = c.events().next
    # 1. supply: what is there, at what price, and what can I afford?
    s = c.supply(campaign)
    g = s.dims["gpu"]
    say(f"supply for {campaign}: {g.free}/{g.capacity} GPUs free, {g.reclaimable} reclaimable, "
        f"congestion {g.congestion:.2f} (price x{g.multiplier}), tokens {g.tokens:,.0f} of "
        f"{g.bucket:,.0f} GPU-s, credits {s.credits:,.0f}, holding {g.held}/{g.ceiling}")
    say("expected wait per path: " + ", ".join(
        f"{p} {'unknown' if w is None else f'{w:.0f} s'}" for p, w in g.wait.items()))

    # 2. quote: a grid of what-ifs, and the plan the agent picks from it
    sizes, durations = [16, 64, 128, 256, 384], [300, 1800]
    q = c.quote(campaign, sizes, durations)
    say("quote (credits, path) for sizes x durations:")
    for i, n in enumerate(sizes):
        cells = "  ".join(f"{d:>5d} s: {q.cost[i, j]:8.1f} {q.path[i, j]:7s}"
                          + ("" if q.grantable[i, j] else f" ({q.reason[i, j]})")
                          for j, d in enumerate(durations))
        print(f"           {n:4d} GPUs | {cells}")
    duration = 300
    ok = [int(n) for i, n in enumerate(sizes) if q.grantable[i, 0] and q.cost[i, 0] <= budget]
    top = min(want, max(ok)) if ok else want
    say(f"plan: ask for {top // 4}..{top} GPUs for {duration} s, spending at most {budget:.0f}")

    # 3. intent -> decision
    d = c.acquire(Intent(campaign, units={"gpu": (max(1, top // 4), top)}, duration=duration,
                         max_spend=budget))
    say(f"decision: {d.outcome} {d.units} GPUs via {d.path} for {d.cost:.1f} credits"
        + (f" (reason {d.reason}, retry after {d.retry_after})" if d.reason else ""))
    if d.outcome == "pending":
        end = time.monotonic() + 30
        while time.monotonic() < end:
            t = c.ticket(d.intent_id, campaign)
            if t.status != "pending":
                break
            time.sleep(0.5)
        say(f"ticket {d.intent_id}: {t.status}")
        if t.status != "granted":
            return 1
        lease = t.lease
    elif not d.granted:
        say("refused: the agent would replan (smaller, later, or cheaper class)")
        return 1
    else:
        lease = d.lease

    # 4. the lease: where the work runs
    nodes = ", ".join(f"{n}x{u}" for n, u in lease.placement[:4])
    more = f" and {len(lease.placement) - 4} more nodes" if len(lease.placement) > 4 else ""
    say(f"lease {lease.id}: {lease.units} GPUs, {lease.state}, expires in "
        f"{lease.expiry - c.now():.0f} s, on {nodes}{more}")

    # inference tokens are a flow dimension: throttled at source
    cons = c.consume(campaign, "inference", 5000)
    say(f"consume 5000 inference tokens: {cons.allowed:,.0f} allowed now"
        + (f", the rest after {cons.retry_after:.1f} s ({cons.reason})"
           if cons.allowed < cons.requested else ""))

    # 5. renew while the work goes on
    r = c.renew(lease.id, 300)
    say(f"renew by 300 s: {r.outcome}" + (f", new expiry in {r.lease.expiry - c.now():.0f} s, "
                                           f"cost {r.cost:.1f}" if r.outcome == "granted"
                                           else f" ({r.reason})"))

    # 6. release early: unused tokens and credits come back
    rel = c.release(lease.id)
    after = c.supply(campaign)
    say(f"release: {rel.outcome}, refund {-rel.cost:.1f} credits; now credits "
        f"{after.credits:,.0f}, tokens {after.dims['gpu'].tokens:,.0f} GPU-s")

    # 7. the journal says why
    say("journal: " + c.explain(d.seq, campaign))
    page = c.events(after=cursor, campaign=campaign)
    say(f"events since start: {[(e.kind, e.lease_id) for e in page.events]}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--credentials", default="bursar-demo-credentials.json",
                    help="tokens written by 'bursar serve --demo'")
    ap.add_argument("--token", help="a campaign token (instead of --credentials)")
    ap.add_argument("--campaign", default="adaptive-sci")
    ap.add_argument("--gpus", type=int, default=256)
    ap.add_argument("--budget", type=float, default=500.0, help="max credits for the lease")
    ap.add_argument("--spawn", action="store_true",
                    help="start a demo server on loopback for this run")
    args = ap.parse_args(argv)

    server = None
    if args.spawn:
        from bursarcore.service.core import DEMO_CONFIG
        from bursarcore.service.testing import ServerProcess

        server = ServerProcess(tempfile.mkdtemp(prefix="bursar-demo-"), DEMO_CONFIG).start()
        url, token = server.url, server.tokens[args.campaign]
        print(f"started bursar serve at {url}")
    else:
        url = args.url
        if args.token:
            token = args.token
        else:
            try:
                with open(args.credentials, encoding="utf-8") as f:
                    token = json.load(f)["campaigns"][args.campaign]
            except (OSError, KeyError, ValueError) as e:
                sys.exit(f"no token: run 'bursar serve --demo' first, or pass --token/--spawn "
                         f"({e})")
    try:
        with BursarClient(url, token, campaign=args.campaign) as c:
            return negotiate(c, args.campaign, args.gpus, args.budget)
    except ServiceError as e:
        sys.exit(f"{url}: {e}")
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    sys.exit(main())
