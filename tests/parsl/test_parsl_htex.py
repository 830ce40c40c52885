"""Real Parsl workflows (HighThroughputExecutor, ~100 @python_app tasks) on bursar leases:
in-process broker, through the HTTP service on loopback, and with a lease revoked mid-run.
Waits are bounded; workers are local processes started by the provider's LocalLauncher."""

from __future__ import annotations

import os
import threading
import time

import parsl
import pytest
from parsl import python_app
from parsl.jobs.states import JobState

from bursarcore import Broker, Envelope, Intent, MonotonicClock, Pool
from bursarcore.admission import ServiceClass
from bursarcore.adapters.parsl import BursarProvider
from bursarcore.service.locked import LockedBroker

N = 100


@python_app
def square(x, pause=0.02):
    import time

    time.sleep(pause)
    return x * x


# the workers import this module to run `square`: the ordinary Parsl way, worker_init
WORKER_INIT = f"export PYTHONPATH={os.path.dirname(os.path.abspath(__file__))}:$PYTHONPATH"


def _run(config, n=N, pause=0.02, during=None, timeout=120):
    with parsl.load(config) as dfk:
        futures = [square(i, pause) for i in range(n)]
        if during is not None:
            during(futures)
        results = [f.result(timeout=timeout) for f in futures]
        executor = dfk.executors["htex"]
        statuses = {b: s for b, s in executor.status_facade.items()}
    assert results == [i * i for i in range(n)]
    return statuses


def _released(broker, campaign):
    """Leases of ``campaign`` the journal shows released (a release that found the lease
    already ended would be refused, and is not counted)."""
    return {r["lease"] for r in broker.journal.query(campaign=campaign, op="release",
                                                      outcome="ok")}


def test_workflow_on_in_process_broker_negotiates_and_releases(tmp_path, make_config):
    from bursarcore.journal import MemoryJournal

    b = Broker(Pool(gpu=16), clock=MonotonicClock(), journal=MemoryJournal())
    b.register("sci", Envelope(credits=1000, guaranteed={"gpu": 4}, sustained={"gpu": 16},
                               ceiling={"gpu": 16}))
    lb = LockedBroker(b)
    provider = BursarProvider("sci", broker=lb, gpus_per_block=4, lease_duration=60,
                              init_blocks=1, min_blocks=0, max_blocks=3,
                              worker_init=WORKER_INIT)
    statuses = _run(make_config(provider, tmp_path / "run"))
    # the strategy scaled out to several leases, and cleanup gave every one back
    assert provider.stats["granted"] >= 2 and provider.stats["launched"] >= 2
    assert lb.leases("sci") == []
    assert len(_released(lb, "sci")) == provider.stats["granted"] == provider.stats["released"]
    assert JobState.FAILED not in {s.state for s in statuses.values()}


def test_workflow_through_the_http_service(tmp_path, make_config):
    pytest.importorskip("fastapi")
    from bursarcore.client import BursarClient
    from bursarcore.service.testing import ServerProcess

    config = {"pool": {"gpu": 16},
              "campaigns": {"sci": {"credits": 1000, "guaranteed": {"gpu": 4},
                                    "sustained": {"gpu": 16}, "ceiling": {"gpu": 16}}}}
    with ServerProcess(tmp_path / "srv", config) as srv:
        provider = BursarProvider("sci", base_url=srv.url, token=srv.tokens["sci"],
                                  gpus_per_block=4, lease_duration=60, init_blocks=1,
                                  min_blocks=0, max_blocks=3, worker_init=WORKER_INIT)
        statuses = _run(make_config(provider, tmp_path / "run"))
        assert provider.stats["granted"] >= 2
        with BursarClient(srv.url, srv.tokens["sci"]) as c:
            assert c.leases() == []
            records, _ = c.journal(op="release", outcome="ok", limit=1000)
            assert len({r["lease"] for r in records}) == provider.stats["granted"]
        assert JobState.FAILED not in {s.state for s in statuses.values()}
        provider.close()


def test_revoked_lease_tears_down_its_block_and_a_replacement_finishes_the_work(
        tmp_path, make_config):
    classes = [ServiceClass("agent-burst", 2, 3.0),
               ServiceClass("opportunistic", 3, 0.25, congestion_priced=False,
                            preemptible=True, grace=1.0, free_when_broke=True)]
    b = Broker(Pool(gpu=12), clock=MonotonicClock(), classes=classes)
    b.register("sci", Envelope(credits=1000, service_class="opportunistic",
                               sustained={"gpu": 12}, ceiling={"gpu": 12}))
    b.register("urgent", Envelope(credits=1000, guaranteed={"gpu": 4}, sustained={"gpu": 4},
                                  ceiling={"gpu": 4}))
    lb = LockedBroker(b)
    provider = BursarProvider("sci", broker=lb, gpus_per_block=4, lease_duration=60,
                              init_blocks=1, min_blocks=0, max_blocks=3,
                              worker_init=WORKER_INIT)
    seen = {}

    def preempt(futures):
        # once work is flowing on three blocks, a guaranteed campaign reclaims 4 GPUs:
        # one of sci's opportunistic leases is preempted (1 s grace), its block torn down
        end = time.monotonic() + 60
        while time.monotonic() < end and (provider.stats["launched"] < 3 or
                                          sum(f.done() for f in futures) < 5):
            time.sleep(0.05)
        d = lb.acquire(Intent("urgent", units={"gpu": 4}, duration=600))
        assert d.granted and d.path == "reclaim"
        seen["victims"] = [l.id for l in lb.leases("sci") if l.state == "revoking"]
        while time.monotonic() < end and provider.stats["revoked"] < 1:
            time.sleep(0.05)
        seen["done_at_revoke"] = sum(f.done() for f in futures)
        # the urgent work is short: its GPUs come back for the replacement block

        def later():
            time.sleep(1)
            lb.release(d.lease.id)
        threading.Thread(target=later, daemon=True).start()

    statuses = _run(make_config(provider, tmp_path / "run", retries=3), pause=0.4,
                    during=preempt)
    assert len(seen["victims"]) == 1 and provider.stats["revoked"] == 1
    assert seen["done_at_revoke"] < N               # it happened mid-run
    assert provider.stats["granted"] >= 4           # a replacement lease was negotiated
    assert provider.stats["launched"] >= 4          # ... and its block ran
    ended = [s for s in statuses.values() if s.message and "revoked" in s.message]
    assert ended and all(s.state == JobState.CANCELLED for s in ended)
    assert JobState.FAILED not in {s.state for s in statuses.values()}
    assert lb.leases("sci") == []
