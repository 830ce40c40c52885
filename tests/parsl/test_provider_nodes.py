"""BursarProvider on a node of a tree of envelopes, through the HTTP service in this
process (a manual clock, a recording launcher, the refresh driven by the test): the
campaign is a node path, and the token may be its own or an ancestor's."""

from __future__ import annotations

import pytest
from parsl.jobs.states import JobState

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from bursarcore.adapters.parsl import BursarProvider  # noqa: E402
from bursarcore.client import BursarClient  # noqa: E402
from bursarcore.service.testing import InProcessService  # noqa: E402

from test_provider_unit import Recorder, states  # noqa: E402

ENV = {"credits": 10000, "sustained": {"gpu": 16}, "ceiling": {"gpu": 16},
       "burst": {"gpu": 1e6}}
TREE = {"pool": {"gpu": 16}, "campaigns": {
    "astro": {**ENV, "guaranteed": {"gpu": 8}},
    "astro/survey": {**ENV, "guaranteed": {"gpu": 4}}}}


@pytest.mark.parametrize("who", ["astro/survey", "astro"])
def test_a_node_path_campaign_runs_renews_and_releases_its_blocks(who):
    svc = InProcessService(TREE)
    rec = Recorder()
    with svc.client() as http, BursarClient("http://testserver", svc.tokens[who],
                                            transport=http._transport) as client:
        p = BursarProvider("astro/survey", client=client, launcher=rec, gpus_per_block=4,
                           lease_duration=100, renew_margin=30, background=False)
        job = p.submit("process_worker_pool.py", 1)
        p.refresh()
        assert states(p, [job]) == [JobState.RUNNING]
        (_, _, lid, env), = rec.started
        assert env["BURSAR_CAMPAIGN"] == "astro/survey"
        lease = svc.broker.lease(lid)
        assert lease.campaign == "astro/survey" and lease.units == 4
        # near its expiry the busy block is renewed, on its node's URL
        svc.clock.advance(80)
        p.refresh()
        assert p.stats["renewed"] == 1
        assert svc.broker.lease(lid).expiry == lease.expiry + 100
        assert p.cancel([job]) == [True]
        assert svc.broker.lease(lid).state == "released" and rec.stopped == [job]
        assert svc.broker.leases("astro/survey") == []
        p.close(timeout=5)
