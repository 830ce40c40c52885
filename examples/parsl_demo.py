"""A real Parsl workflow on bursar leases: ordinary @python_app code; the whole integration
is the provider block in the config.

    pip install ".[parsl]"
    python examples/parsl_demo.py                 # in-process broker, simulated pool
    python examples/parsl_demo.py --serve         # the same through `bursar serve` on loopback
    python examples/parsl_demo.py --url http://127.0.0.1:8000 --token bsr_...   # your server

Watch Parsl's scaling strategy negotiate warm-path leases (one Parsl block = one lease) as
the work arrives, and release every one of them on cleanup. About 15 s on a laptop.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time

import parsl
from parsl import python_app
from parsl.config import Config
from parsl.executors import HighThroughputExecutor

from bursarcore import Broker, Envelope, MonotonicClock, Pool
from bursarcore.adapters.parsl import BursarProvider
from bursarcore.journal import MemoryJournal

CAMPAIGN = "my-campaign"
ENVELOPE = {"credits": 5000, "service_class": "agent-burst", "guaranteed": {"gpu": 64},
            "sustained": {"gpu": 128}, "ceiling": {"gpu": 256}, "burst": {"gpu": 100_000}}


@python_app
def sample(seed: int, n: int = 200_000) -> int:
    """Monte Carlo: points of the unit square inside the quarter circle."""
    import random

    rng = random.Random(seed)
    return sum(rng.random() ** 2 + rng.random() ** 2 <= 1.0 for _ in range(n))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", type=int, default=100)
    ap.add_argument("--serve", action="store_true", help="go through bursar serve on loopback")
    ap.add_argument("--url", help="a running bursar serve")
    ap.add_argument("--token", help="the campaign's token (with --url)")
    ap.add_argument("--campaign", default=CAMPAIGN)
    ap.add_argument("--run-dir", default=os.path.join(tempfile.gettempdir(), "bursar-parsl-demo"))
    args = ap.parse_args(argv)
    t0 = time.monotonic()

    def say(msg: str) -> None:
        print(f"[{time.monotonic() - t0:5.1f} s] {msg}", flush=True)

    server, broker = None, None
    if args.url:
        where = dict(base_url=args.url, token=args.token)
    elif args.serve:
        from bursarcore.service.testing import ServerProcess

        server = ServerProcess(tempfile.mkdtemp(prefix="bursar-demo-"),
                               {"pool": {"gpu": 512}, "campaigns": {args.campaign: ENVELOPE}})
        server.start()
        say(f"bursar serve on {server.url}")
        where = dict(base_url=server.url, token=server.tokens[args.campaign])
    else:
        # the simulated pool: 512 GPUs in 64 nodes of 8, on this machine's clock
        broker = Broker(Pool(gpu=512), clock=MonotonicClock(), journal=MemoryJournal())
        from bursarcore.service.core import envelope_from_json
        broker.register(args.campaign, envelope_from_json(ENVELOPE))
        where = dict(broker=broker)

    # ---- the provider block: the whole integration surface --------------------------
    provider = BursarProvider(
        campaign=args.campaign,
        **where,                            # base_url=..., token=... or broker=...
        gpus_per_block=64, lease_duration=600, adaptive=True,
        init_blocks=1, min_blocks=0, max_blocks=3)
    config = Config(executors=[HighThroughputExecutor(
        label="htex", provider=provider, max_workers_per_node=2,
        address="127.0.0.1", loopback_address="127.0.0.1")],
        strategy="htex_auto_scale", strategy_period=0.5, max_idletime=5,
        run_dir=args.run_dir, usage_tracking=0)
    # ----------------------------------------------------------------------------------

    logging.getLogger("parsl").setLevel(logging.WARNING)
    say(f"Parsl starts; provider: {provider!r}")
    with parsl.load(config):
        futures = [sample(i) for i in range(args.tasks)]
        say(f"{len(futures)} tasks submitted")
        done, last = 0, -1
        while done < len(futures):
            done = sum(f.done() for f in futures)
            blocks = {s.state.name for s in provider.status(list(provider._blocks))}
            if done != last and (done % 20 == 0 or done == len(futures)):
                say(f"{done:3d}/{len(futures)} done; leases granted {provider.stats['granted']}, "
                    f"blocks {sorted(blocks)}")
                last = done
            time.sleep(0.1)
        hits = sum(f.result() for f in futures)
        say(f"pi ~ {4 * hits / (len(futures) * 200_000):.5f}")
    say(f"cleanup: leases granted {provider.stats['granted']}, released "
        f"{provider.stats['released']}, renewed {provider.stats['renewed']}")
    if broker is not None:
        for r in broker.journal.query(campaign=args.campaign):
            if r["op"] in ("acquire", "release"):
                say(f"journal: {r['op']:8s} lease {r['lease']} {r['units']} GPUs "
                    f"{'(' + ('warm' if r['path'] == 1 else 'reclaim') + ')' if r['op'] == 'acquire' else ''}"
                    f" at +{r['t'] / 1e9:.1f} s")
        left = broker.leases(args.campaign)
    else:
        from bursarcore.client import BursarClient
        with BursarClient(where["base_url"], where["token"], campaign=args.campaign) as c:
            left = c.leases()
    say(f"leases still held after cleanup: {len(left)}")
    provider.close()
    if server is not None:
        server.stop()
    return 0 if not left else 1


if __name__ == "__main__":
    sys.exit(main())
