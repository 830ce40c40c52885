"""BursarProvider's block lifecycle against an in-process broker on a manual clock, with a
recording launcher and the refresh driven by the test: deterministic, no Parsl run."""

from __future__ import annotations

import time

import pytest
from parsl.jobs.states import JobState

from bursarcore import Broker, Envelope, Intent, ManualClock, Pool
from bursarcore.admission import ServiceClass
from bursarcore.adapters.parsl import BursarProvider, LocalLauncher, WorkerLauncher
from bursarcore.errors import InvalidArgument, UnknownLease
from bursarcore.service.locked import LockedBroker


class Recorder:
    """A WorkerLauncher that runs nothing and remembers what it was asked."""

    def __init__(self):
        self.started, self.stopped, self.exit = [], [], {}

    def start(self, block_id, command, lease, env):
        self.started.append((block_id, command, lease.id, dict(env)))
        return block_id

    def poll(self, handle):
        return self.exit.get(handle)

    def stop(self, handle, grace):
        self.stopped.append(handle)


def make(pool=16, env=None, classes=None, reuse_after=None, **kw):
    more = {} if reuse_after is None else {"reuse_after": reuse_after}
    b = Broker(Pool(gpu=pool), clock=ManualClock(1000.0), classes=classes, **more)
    b.register("sci", env or Envelope(credits=1000, guaranteed={"gpu": 4},
                                      sustained={"gpu": 16}, ceiling={"gpu": 16}))
    b.register("other", Envelope(credits=1000, sustained={"gpu": 16}, ceiling={"gpu": 16}))
    lb = LockedBroker(b)
    rec = Recorder()
    kw.setdefault("gpus_per_block", 4)
    kw.setdefault("lease_duration", 100)
    p = BursarProvider("sci", broker=lb, launcher=rec, background=False, **kw)
    return b, lb, p, rec


def states(p, ids):
    return [s.state for s in p.status(ids)]


def test_is_a_parsl_execution_provider_and_hides_the_token():
    from parsl.providers.base import ExecutionProvider

    p = BursarProvider("sci", base_url="http://127.0.0.1:1", token="bsr_secret-token",
                       background=False)
    assert isinstance(p, ExecutionProvider) and isinstance(p.launcher, WorkerLauncher)
    assert "secret" not in repr(p) and p.label == "bursar"
    assert p.min_blocks == 0 and p.max_blocks == 1 and p.init_blocks == 1


def test_submit_never_blocks_even_with_the_service_down():
    p = BursarProvider("sci", base_url="http://127.0.0.1:1", token="bsr_x", poll_period=0.2)
    t0 = time.monotonic()
    job = p.submit("sleep 100", 1)
    assert time.monotonic() - t0 < 0.05
    time.sleep(0.5)                           # the thread failed to reach it, quietly
    assert states(p, [job]) == [JobState.PENDING]
    p.close(timeout=5)


def test_granted_block_runs_on_its_lease_and_scale_in_releases_it():
    b, lb, p, rec = make()
    job = p.submit("process_worker_pool.py --block_id=0", 1)
    assert states(p, [job]) == [JobState.PENDING]
    p.refresh()
    assert states(p, [job]) == [JobState.RUNNING]
    (block, cmd, lid, env), = rec.started
    assert block == job and cmd.startswith("process_worker_pool.py")
    assert env["BURSAR_LEASE_ID"] == str(lid) and env["BURSAR_UNITS"] == "4"
    assert env["BURSAR_PLACEMENT"] and env["BURSAR_CAMPAIGN"] == "sci"
    assert b.lease(lid).state == "active" and b.lease(lid).units == 4
    assert p.cancel([job, "nope"]) == [True, False]
    assert rec.stopped == [job] and b.lease(lid).state == "released"
    assert states(p, [job]) == [JobState.CANCELLED]


def test_pending_intent_is_a_pending_block_until_capacity_frees():
    b, lb, p, rec = make(pool=8, gpus_per_block=8, adaptive=False)
    other = lb.acquire(Intent("other", units={"gpu": 4}, duration=1000))
    assert other.granted
    job = p.submit("cmd", 1)
    p.refresh()
    assert states(p, [job]) == [JobState.PENDING] and p.stats["pending"] == 1
    assert "intent" in p.status([job])[0].message
    lb.release(other.lease.id)
    p.refresh()
    assert states(p, [job]) == [JobState.RUNNING] and len(rec.started) == 1


def test_adaptive_sizing_asks_for_what_is_grantable():
    b, lb, p, rec = make(pool=16, gpus_per_block=8)
    assert lb.acquire(Intent("other", units={"gpu": 10}, duration=1000)).granted
    job = p.submit("cmd", 1)
    p.refresh()
    assert states(p, [job]) == [JobState.RUNNING]
    assert rec.started[0][3]["BURSAR_UNITS"] == "6"
    assert lb.lease(rec.started[0][2]).units == 6


def test_busy_blocks_are_renewed_before_expiry():
    b, lb, p, rec = make(renew_margin=20)
    job = p.submit("cmd", 1)
    p.refresh()
    lid = rec.started[0][2]
    exp = b.lease(lid).expiry
    b.clock.advance(85)                       # 15 s left < the 20 s margin
    p.refresh()
    assert p.stats["renewed"] == 1 and b.lease(lid).expiry == pytest.approx(exp + 100)
    b.clock.advance(50)
    p.refresh()
    assert states(p, [job]) == [JobState.RUNNING]


def test_an_expired_lease_ends_the_block_as_timeout_not_failed():
    env = Envelope(credits=1000, sustained={"gpu": 0}, ceiling={"gpu": 16}, burst={"gpu": 400})
    b, lb, p, rec = make(env=env, renew_margin=20)
    job = p.submit("cmd", 1)
    p.refresh()
    assert states(p, [job]) == [JobState.RUNNING]
    b.clock.advance(85)
    p.refresh()                               # renewal refused: no tokens left
    assert p.stats["renew_refused"] == 1 and p.stats["renewed"] == 0
    b.clock.advance(20)
    p.refresh()
    st = p.status([job])[0]
    assert st.state == JobState.TIMEOUT and "expired" in st.message
    assert rec.stopped == [job] and p.stats["expired"] == 1


def _take_the_row(b, lb, lid):
    """Another campaign's grant reuses the ended lease's row (reuse_after=0): the broker
    no longer has its record."""
    d = lb.acquire(Intent("other", units={"gpu": 1}, duration=1000))
    assert d.granted and (d.lease.id ^ lid) & 0xFFFFFFFF == 0 and d.lease.id != lid
    with pytest.raises(UnknownLease, match="reused"):
        b.lease(lid)


def test_an_expired_lease_whose_record_was_reused_still_ends_as_timeout():
    env = Envelope(credits=1000, sustained={"gpu": 0}, ceiling={"gpu": 16}, burst={"gpu": 400})
    b, lb, p, rec = make(env=env, renew_margin=20, reuse_after=0)
    job = p.submit("cmd", 1)
    p.refresh()
    lid = rec.started[0][2]
    b.clock.advance(85)
    p.refresh()                               # renewal refused: no tokens left
    b.clock.advance(20)                       # expired at +100
    _take_the_row(b, lb, lid)
    p.refresh()
    st = p.status([job])[0]
    assert st.state == JobState.TIMEOUT and f"lease {lid} expired" in st.message
    assert rec.stopped == [job] and p.stats["expired"] == 1 and p.stats["revoked"] == 0


def test_a_revoked_or_released_lease_whose_record_was_reused_is_cancelled():
    b, lb, p, rec = make(reuse_after=0)
    job = p.submit("cmd", 1)
    p.refresh()
    lid = rec.started[0][2]
    lb.remove_nodes("gpu", [b.lease(lid).placement[0][0]], grace=5)
    p.refresh()                               # the provider sees it revoking, deadline +5
    b.clock.advance(5)
    lb.poll()                                 # revoked at +5
    _take_the_row(b, lb, lid)
    p.refresh()
    st = p.status([job])[0]
    assert st.state == JobState.CANCELLED and f"lease {lid} revoked" in st.message
    assert p.stats["revoked"] == 1 and p.stats["expired"] == 0
    # released behind the provider's back, before its expiry: cancelled, not timed out
    job2 = p.submit("cmd", 1)
    p.refresh()
    lid2 = rec.started[-1][2]
    lb.release(lid2)
    _take_the_row(b, lb, lid2)
    p.refresh()
    st = p.status([job2])[0]
    assert st.state == JobState.CANCELLED and "ended" in st.message and p.stats["expired"] == 0


def test_a_revoked_lease_tears_the_block_down_and_reports_cancelled():
    b, lb, p, rec = make()
    job = p.submit("cmd", 1)
    p.refresh()
    lid = rec.started[0][2]
    node = b.lease(lid).placement[0][0]
    lb.remove_nodes("gpu", [node], grace=5)
    p.refresh()
    assert states(p, [job]) == [JobState.RUNNING]         # notice given, grace running
    b.clock.advance(5)
    p.refresh()
    st = p.status([job])[0]
    assert st.state == JobState.CANCELLED and "revoked" in st.message
    assert st.state != JobState.FAILED and rec.stopped == [job]
    # Parsl's replacement block gets a new lease
    job2 = p.submit("cmd", 1)
    p.refresh()
    assert states(p, [job2]) == [JobState.RUNNING] and rec.started[-1][2] != lid


def test_an_opportunistic_lease_preempted_by_a_firm_one():
    classes = [ServiceClass("agent-burst", 2, 3.0),
               ServiceClass("opportunistic", 3, 0.25, congestion_priced=False,
                            preemptible=True, grace=2.0, free_when_broke=True)]
    env = Envelope(credits=1000, service_class="opportunistic", sustained={"gpu": 8},
                   ceiling={"gpu": 8})
    b, lb, p, rec = make(pool=8, env=env, classes=classes, gpus_per_block=8)
    job = p.submit("cmd", 1)
    p.refresh()
    d = lb.acquire(Intent("other", units={"gpu": 4}, duration=100))
    assert d.path == "reclaim"
    p.refresh()
    assert states(p, [job]) == [JobState.RUNNING]
    b.clock.advance(2)
    p.refresh()
    assert states(p, [job]) == [JobState.CANCELLED] and p.stats["revoked"] == 1


def test_refused_intent_keeps_the_block_pending_and_is_filed_again():
    env = Envelope(credits=0.001, sustained={"gpu": 16}, ceiling={"gpu": 16})
    b, lb, p, rec = make(env=env, gpus_per_block=4, adaptive=False)
    job = p.submit("cmd", 1)
    p.refresh()
    assert p.stats["refused"] == 1 and states(p, [job]) == [JobState.PENDING]
    p.refresh()                                 # not yet due again
    assert p.stats["intents"] == 1
    p._blocks[job].next_try = 0                 # (skip the backoff)
    p.refresh()
    assert p.stats["intents"] == 2 and states(p, [job]) == [JobState.PENDING]


def test_cancelling_a_pending_block_withdraws_its_intent():
    b, lb, p, rec = make(pool=8, gpus_per_block=8, adaptive=False)
    lb.acquire(Intent("other", units={"gpu": 4}, duration=1000))
    job = p.submit("cmd", 1)
    p.refresh()
    assert lb.pending("sci")
    p.cancel([job])
    assert lb.pending("sci") == [] and states(p, [job]) == [JobState.CANCELLED]


def test_workers_that_exit_end_the_block_and_free_the_lease():
    b, lb, p, rec = make()
    job = p.submit("cmd", 1)
    p.refresh()
    lid = rec.started[0][2]
    rec.exit[job] = 0
    p.refresh()
    assert states(p, [job]) == [JobState.COMPLETED] and b.lease(lid).state == "released"


def test_bad_configuration_is_refused_naming_the_field():
    with pytest.raises(InvalidArgument) as e:
        BursarProvider("sci")
    assert e.value.field == "base_url"
    with pytest.raises(InvalidArgument) as e:
        BursarProvider("sci", base_url="http://x")
    assert e.value.field == "token"
    b, lb, p, rec = make()
    with pytest.raises(InvalidArgument) as e:
        BursarProvider("sci", broker=b, gpus_per_block=0)
    assert e.value.field == "gpus_per_block"
    with pytest.raises(InvalidArgument):
        BursarProvider("sci", broker=b, launcher=object())


def test_local_launcher_runs_and_stops_a_process_group(tmp_path):
    from bursarcore.broker import Lease

    lease = Lease(7, "sci", "gpu", 2, "active", True, "agent-burst", 0.0, 0.0, 10.0, 1.0,
                  None, 3, (("n0", 1), ("n1", 1)), (0, 1))
    ll = LocalLauncher(str(tmp_path), per_node=True)
    h = ll.start("blk", 'echo "$BURSAR_LEASE_ID $BURSAR_NODE"; sleep 30', lease,
                 {"BURSAR_LEASE_ID": "7"})
    assert len(h) == 2 and ll.poll(h) is None
    end = time.monotonic() + 10
    while time.monotonic() < end and not all(
            (tmp_path / f"blk.{i}.out").read_text() for i in (0, 1)):
        time.sleep(0.05)
    t0 = time.monotonic()
    ll.stop(h, grace=2)
    assert ll.poll(h) is not None and time.monotonic() - t0 < 3
    out = (tmp_path / "blk.0.out").read_text() + (tmp_path / "blk.1.out").read_text()
    assert "7 n0" in out and "7 n1" in out
    h = ll.start("ok", "exit 0", lease, {})
    for p in h:
        p.wait(5)
    assert ll.poll(h) == 0


class FakeBinding:
    """The machine side of a facility binding, as bursarcore.adapters.Binding has it."""

    class Handle:
        def __init__(self, lease_id):
            self.lease_id, self.code = lease_id, None

        @property
        def exit_code(self):
            return self.code

        def wait(self, timeout=None):
            return self.code

    def __init__(self):
        self.launched, self.revoked, self.killed = [], [], []

    def now(self):
        return 0.0

    def launch(self, lease, argv, env=None):
        self.launched.append((lease.id, argv, env))
        return self.Handle(lease.id)

    def revoke(self, lease_id, deadline):
        self.revoked.append((lease_id, deadline))

    def kill(self, lease_id):
        self.killed.append(lease_id)


def test_a_facility_binding_launches_the_workers():
    from bursarcore.adapters.parsl import BindingLauncher

    fb = FakeBinding()
    b, lb, p, _ = make()
    p = BursarProvider("sci", broker=lb, binding=fb, gpus_per_block=4, background=False,
                       stop_grace=3)
    assert isinstance(p.launcher, BindingLauncher)
    job = p.submit("process_worker_pool.py", 1)
    p.refresh()
    (lid, argv, env), = fb.launched
    assert argv == ["/bin/bash", "-c", "process_worker_pool.py"] and env["BURSAR_LEASE_ID"] == str(lid)
    assert states(p, [job]) == [JobState.RUNNING]
    p.cancel([job])
    assert fb.revoked == [(lid, 3.0)] and fb.killed == [lid]
    assert b.lease(lid).state == "released"


def test_every_exported_name_resolves_and_parsl_is_imported_only_for_the_provider():
    """``BursarProvider`` is made on first access (it subclasses Parsl's provider), so
    importing the module does not import Parsl; ``__all__`` and ``dir()`` name it, and a
    star import gets it."""
    import subprocess
    import sys

    code = ("import sys, bursarcore.adapters.parsl as m\n"
            "assert 'parsl' not in sys.modules\n"
            "assert set(m.__all__) <= set(dir(m)), set(m.__all__) - set(dir(m))\n"
            "ns = {}\n"
            "exec('from bursarcore.adapters.parsl import *', ns)\n"
            "assert set(m.__all__) <= set(ns)\n"
            "from parsl.providers.base import ExecutionProvider\n"
            "assert issubclass(ns['BursarProvider'], ExecutionProvider)\n"
            "assert m.BursarProvider is ns['BursarProvider']\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
