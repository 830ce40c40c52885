"""Journal (SPEC §9), replay (invariant 8), crash safety, explain and queries."""

from __future__ import annotations

import math
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from bursarcore import Broker, Envelope, Intent, ManualClock, Pool
from bursarcore.broker import BACKENDS
from bursarcore.errors import InvalidArgument, JournalCorrupt, JournalUnavailable
from bursarcore.journal import MemoryJournal, SQLiteJournal, export_jsonl, import_jsonl
from bursarcore.journal.records import deadline_of

INF = math.inf
CAMPAIGNS = {
    "storm": Envelope(credits=200, service_class="agent-burst", sustained={"gpu": 8},
                      ceiling={"gpu": 48}, burst={"gpu": 2000}),
    "inter": Envelope(credits=100, service_class="interactive", guaranteed={"gpu": 8},
                      sustained={"gpu": 8}, ceiling={"gpu": 16}, burst={"gpu": 500}),
    "bf": Envelope(credits=INF, service_class="opportunistic", sustained={"gpu": 64},
                   ceiling={"gpu": 64}, burst={"gpu": INF}),
}
NAMES = list(CAMPAIGNS)


def build(backend, journal):
    b = Broker(Pool(gpu=64), clock=ManualClock(0.0), backend=backend, ttl=120.0, journal=journal)
    for n, e in CAMPAIGNS.items():
        b.register(n, e)
    return b


OP = st.one_of(
    st.tuples(st.just("acquire"), st.sampled_from(NAMES), st.integers(1, 40), st.integers(0, 30),
              st.sampled_from([1.0, 30.0, 90.0, 600.0]), st.booleans(),
              # a deadline relative to now: at the very instant (it lapses at a poll at the
              # same time, a decision no input record is at), or soon
              st.sampled_from([None, None, 0.0, 0.001, 0.5, 30.0])),
    # a poll at the same instant: runs what fell due since the last operation, unjournaled
    st.tuples(st.just("poll")),
    st.tuples(st.just("release"), st.integers(0, 1000)),
    st.tuples(st.just("renew"), st.integers(0, 1000), st.sampled_from([10.0, 300.0])),
    st.tuples(st.just("cancel"), st.integers(0, 1000)),
    st.tuples(st.just("advance"), st.sampled_from([0.5, 1.0, 30.0, 61.0, 200.0])),
    st.tuples(st.just("batch"), st.lists(st.tuples(st.integers(0, 2), st.integers(1, 20)),
                                         min_size=1, max_size=5)),
    # reads: state() brings every bucket up to now and serves what is due; replay must
    # not depend on whether anyone looked
    st.tuples(st.just("state"), st.sampled_from([0.0, 0.5, 30.0])),
    st.tuples(st.just("supply"), st.sampled_from(NAMES)),
)


def run(b: Broker, op) -> object:
    kind = op[0]
    if kind == "acquire":
        _, c, lo, span, dur, opp, dl = op
        cls = "opportunistic" if opp else None
        return b.acquire(Intent(c, units={"gpu": (lo, lo + span)}, duration=dur,
                                service_class=cls,
                                deadline=None if dl is None else b.clock.now() + dl)).to_dict()
    if kind == "poll":
        return [e.to_dict() for e in b.poll()]
    if kind in ("release", "renew"):
        live = [l.id for l in b.leases()]
        if not live:
            return None
        lid = live[op[1] % len(live)]
        return (b.release(lid) if kind == "release" else b.renew(lid, op[2])).to_dict()
    if kind == "cancel":
        pend = [p["intent_id"] for p in b.pending()]
        return b.cancel(pend[op[1] % len(pend)]) if pend else None
    if kind == "advance":
        b.clock.advance(op[1])
        return [e.to_dict() for e in b.poll()]
    if kind == "batch":
        r = b.admit_batch([i[0] for i in op[1]], [i[1] for i in op[1]], 60.0)
        return [x.tolist() for x in r]
    if kind == "state":
        b.clock.advance(op[1])
        return b.state()
    if kind == "supply":
        return b.supply(op[1]).to_dict()
    raise AssertionError(kind)


def strip_seq(x):
    if isinstance(x, dict):
        return {k: strip_seq(v) for k, v in x.items() if k != "seq"}
    if isinstance(x, list):
        return [strip_seq(v) for v in x]
    return x


# ------------------------------------------------------------------ records
def test_one_record_per_decision_with_rule_inputs(eb):
    j = MemoryJournal()
    b = build(eb, j)
    d = b.acquire(Intent("storm", units={"gpu": (1, 48)}, duration=600))
    rec = j.record(d.seq)
    assert rec["op"] == "acquire" and rec["outcome"] == "granted" and rec["units"] == d.units
    assert rec["rank"] == 2 and rec["tokens_before"] == 2000 * 10**9
    assert rec["credits_before"] == 200 * 10**6 and rec["free"] == 64 and rec["unmet"] == 8
    assert rec["lim_tokens"] == 8 + 2000 // 600 and rec["held_after"] == d.units
    assert [r["op"] for r in j][:4] == ["config", "register", "register", "register"]
    b.clock.advance(600)
    b.poll()
    assert j.query(op="expire")[0]["lease"] == d.lease.id


def test_backends_write_identical_journals():
    if len(BACKENDS) < 2:
        pytest.skip("compiled engine not built (BURSARCORE_NO_EXTENSIONS=1)")
    rng = random.Random(5)
    journals = []
    for backend in BACKENDS:
        rng.seed(5)
        j = MemoryJournal()
        b = build(backend, j)
        for _ in range(150):
            k = rng.random()
            if k < 0.5:
                run(b, ("acquire", rng.choice(NAMES), rng.randint(1, 30), rng.randint(0, 20),
                        rng.choice([1.0, 60.0, 600.0]), rng.random() < 0.2,
                        rng.choice([None, None, 0.0, 5.0])))
            elif k < 0.7:
                run(b, ("advance", rng.choice([1.0, 30.0, 61.0])))
            elif k < 0.85:
                run(b, ("release", rng.randint(0, 99)))
            else:
                run(b, ("batch", [(rng.randint(0, 2), rng.randint(1, 16)) for _ in range(3)]))
        journals.append(j.rows())
    assert journals[0].tobytes() == journals[1].tobytes()


# ------------------------------------------------------------------ replay
@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=80, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(ops=st.lists(OP, max_size=40), after=st.lists(OP, max_size=10))
# an intent pending (its ceiling) with its deadline at that very instant, refused by a poll
# at the same instant (no input record), then an input at a later instant
@example(ops=[("acquire", "storm", 48, 0, 30.0, False, None),
              ("acquire", "storm", 1, 0, 30.0, False, 0.0), ("poll",), ("advance", 0.5),
              ("acquire", "inter", 1, 0, 1.0, False, None)], after=[])
def test_replay_reproduces_state_and_later_decisions(backend, ops, after):
    j = MemoryJournal()
    b = build(backend, j)
    for op in ops:
        run(b, op)
    b.poll()  # a replayed broker starts with no undelivered events
    r = Broker.replay(j, backend=backend, resume=False)
    r.clock.set(b.clock.now())  # a poll that changed nothing leaves no record of its time
    assert r.state() == b.state()
    assert [l.id for l in r.leases()] == [l.id for l in b.leases()]
    for op in after:
        assert strip_seq(run(r, op)) == strip_seq(run(b, op))
    assert r.state() == b.state()


def test_replay_resumes_the_same_journal(eb, tmp_path):
    j = SQLiteJournal(tmp_path / "j.db", batch=1, create=True)
    b = build(eb, j)
    b.acquire(Intent("storm", units={"gpu": 8}, duration=60))
    b.clock.advance(10)
    b.sync()
    j.close()
    j2 = SQLiteJournal(tmp_path / "j.db")
    r = Broker.replay(j2, backend=eb)
    d = r.acquire(Intent("inter", units={"gpu": 4}, duration=60))
    assert d.granted and d.seq == len(j2) - 1
    r.sync()
    j2.close()
    assert Broker.replay(SQLiteJournal(tmp_path / "j.db"), backend=eb).state() == r.state()


def test_tampered_journal_diverges_with_a_named_record(eb):
    j = MemoryJournal()
    b = build(eb, j)
    d = b.acquire(Intent("storm", units={"gpu": (1, 48)}, duration=600))
    rows = j.rows()
    rows[d.seq]["units"] += 1  # the journal now claims a different grant
    with pytest.raises(JournalCorrupt) as e:
        Broker.replay(j, backend=eb)
    assert e.value.record == d.seq and "units" in str(e.value)


def test_journal_must_start_empty(eb):
    j = MemoryJournal()
    build(eb, j)
    with pytest.raises(InvalidArgument) as e:
        Broker(Pool(gpu=1), journal=j)
    assert e.value.field == "journal"


@pytest.mark.parametrize("sink", ["memory", "sqlite"])
@pytest.mark.parametrize("path", ["general", "fast"])
def test_deadlines_before_time_zero_replay(eb, path, sink, tmp_path):
    """A deadline before time 0, and one of exactly -1 ns (the field's "none"), are
    journaled so that replay reads them back as those deadlines, not as none: the
    replayed journal is byte-identical (every backend, general and fast acquire, both
    sinks, and through a JSON lines export)."""
    j = MemoryJournal() if sink == "memory" else SQLiteJournal(tmp_path / "j.db", batch=3, create=True)
    b = Broker(Pool(gpu=8), clock=ManualClock(-5.0), backend=eb, ttl=50.0, journal=j)
    if getattr(b, "_fast", None) is None and path == "fast":
        pytest.skip("this backend has one acquire path")
    if path == "general" and hasattr(b, "_fast"):
        b._fast = None                 # the compiled broker's general path
    env = Envelope(credits=INF, sustained={"gpu": 8}, ceiling={"gpu": 8}, burst={"gpu": INF})
    b.register("a", env)
    b.register("big", env)
    seqs = {}

    def ask(c, n, dl):
        d = b.acquire(Intent(c, units={"gpu": n}, duration=100, deadline=dl))
        seqs[d.seq] = None if dl is None else round(dl * 1e9)
        return d.outcome

    # at t = -5 s: a warm grant with a deadline of -1 ns, then the pool is full and three
    # intents pend, until -1 ns, -2 s and their TTL
    assert ask("a", 1, -1e-9) == "granted" and ask("big", 7, None) == "granted"
    assert [ask("a", 1, dl) for dl in (-1e-9, -2.0, None)] == ["pending"] * 3
    b.clock.advance(5.0)
    ev = [(e.kind, e.time, e.reason) for e in b.poll()]
    assert ev == [("refused", -2.0, "deadline"), ("refused", -1e-9, "deadline")]
    # at t = 0: deadlines before 0 are refused at once
    assert [ask("a", 1, dl) for dl in (-1.0, -1e-9)] == ["refused"] * 2
    b.clock.advance(60.0)
    assert [(e.kind, e.reason) for e in b.poll()] == [("refused", "ttl")]
    rows = j.rows()
    assert {s: deadline_of(int(rows[s]["deadline"])) for s in seqs} == seqs
    assert all(int(rows[s]["deadline"]) == -1 for s, dl in seqs.items() if dl is None)
    if sink == "sqlite":
        b.sync()
        j.close()
        j = SQLiteJournal(tmp_path / "j.db")
    want = j.rows().tobytes()
    for be in BACKENDS:
        assert Broker.replay(j, backend=be, resume=False).journal.rows().tobytes() == want, be
    export_jsonl(j, tmp_path / "j.jsonl")
    back = import_jsonl(tmp_path / "j.jsonl")
    assert back.rows().tobytes() == want
    assert Broker.replay(back, backend=eb, resume=False).journal.rows().tobytes() == want
    if sink == "sqlite":
        j.close()


# ------------------------------------------------------------------ sinks
@pytest.mark.parametrize("first", [60.0, 61.0])
def test_a_release_of_a_lease_granted_by_time_passing_replays(eb, first):
    """A pending intent granted by time passing (at a timer's instant: an earlier intent's
    TTL, that intent granted since), its lease read off a poll, which writes no record, and
    released: replay brings the broker to the release's time before it checks the lease's
    id, so the same lease exists and the journal is rebuilt byte for byte."""
    j = MemoryJournal()
    b = Broker(Pool(gpu=64), clock=ManualClock(0.0), backend=eb, ttl=120.0, journal=j)
    b.register("n0", Envelope(credits=INF, sustained={"gpu": 4}, ceiling={"gpu": 4},
                              burst={"gpu": 0}))
    b.register("n2", Envelope(credits=INF, guaranteed={"gpu": 1}, sustained={"gpu": 1},
                              ceiling={"gpu": 1}, burst={"gpu": 0}))
    assert b.acquire(Intent("n2", units={"gpu": 1}, duration=10)).outcome == "granted"
    assert b.acquire(Intent("n2", units={"gpu": 1}, duration=1)).outcome == "pending"
    b.clock.advance(first)                 # that intent is granted; its TTL timer: 120 s
    b.poll()
    assert b.acquire(Intent("n0", units={"gpu": (1, 4)}, duration=5)).outcome == "granted"
    assert b.acquire(Intent("n0", units={"gpu": (1, 4)}, duration=5)).outcome == "pending"
    b.clock.advance(60.0)                  # to 120 s or just past it
    granted = [e for e in b.poll() if e.kind == "granted"]
    assert [(e.campaign, e.time) for e in granted] == [("n0", 120.0)]
    assert b.release(granted[0].lease_id).outcome == "released"
    again = Broker.replay(j, backend=eb, resume=False)
    assert again.journal.rows().tobytes() == j.rows().tobytes()
    assert again.state() == b.state()


def test_sqlite_group_commit_and_reload(eb, tmp_path):
    path = tmp_path / "j.db"
    j = SQLiteJournal(path, batch=1000, create=True)
    b = build(eb, j)
    d = b.acquire(Intent("storm", units={"gpu": 8}, duration=60))
    assert j.durable_seq == -1  # buffered: not yet acknowledged
    assert b.sync() == d.seq == j.durable_seq
    j.close()
    again = SQLiteJournal(path)
    assert again.rows().tobytes() == j.rows().tobytes() and again.names == NAMES


def test_sqlite_durable_mode_commits_every_operation(eb, tmp_path):
    j = SQLiteJournal(tmp_path / "j.db", batch=10**6, create=True)
    b = Broker(Pool(gpu=8), clock=ManualClock(0.0), backend=eb, journal=j, durable=True)
    b.register("a", Envelope(credits=10, sustained={"gpu": 8}))
    d = b.acquire(Intent("a", units={"gpu": 2}, duration=60))
    assert j.durable_seq == d.seq


def test_sqlite_corruption_names_the_record(eb, tmp_path):
    path = tmp_path / "j.db"
    j = SQLiteJournal(path, batch=1, create=True)
    b = build(eb, j)
    b.acquire(Intent("storm", units={"gpu": 8}, duration=60))
    b.sync()
    j.close()
    db = sqlite3.connect(path)
    db.execute("UPDATE journal SET rec = substr(rec, 1, 20) WHERE seq = 2")
    db.commit()
    db.close()
    with pytest.raises(JournalCorrupt) as e:
        SQLiteJournal(path)
    assert e.value.record == 2 and "truncated" in str(e.value)
    db = sqlite3.connect(path)
    db.execute("DELETE FROM journal WHERE seq = 2")
    db.commit()
    db.close()
    with pytest.raises(JournalCorrupt) as e:
        SQLiteJournal(path)
    assert e.value.record == 3 and "sequence" in str(e.value)
    bad = tmp_path / "garbage.db"
    bad.write_bytes(b"this is not a database" * 100)
    with pytest.raises(JournalUnavailable) as e:
        SQLiteJournal(bad)
    assert e.value.kind == "unreadable" and str(bad) in str(e.value)


def test_jsonl_round_trip_and_truncation(eb, tmp_path):
    j = MemoryJournal()
    b = build(eb, j)
    b.acquire(Intent("storm", units={"gpu": 8}, duration=60))
    b.clock.advance(100)
    b.poll()
    p = tmp_path / "j.jsonl"
    assert export_jsonl(j, p) == len(j)
    back = import_jsonl(p)
    assert back.rows().tobytes() == j.rows().tobytes()
    r = Broker.replay(back, backend=eb)
    r.clock.set(b.clock.now())
    assert r.state() == b.state()
    text = p.read_text()
    p.write_text(text[:-10])
    with pytest.raises(JournalCorrupt) as e:
        import_jsonl(p)
    # the truncated last line should hold the last record: named by its seq and line
    assert e.value.record == len(j) - 1 and f"line {len(j)} is truncated" in str(e.value)
    lines = text.splitlines(keepends=True)
    lines[2] = lines[2].replace('"nmax": 0', '"nmax": 5')
    p.write_text("".join(lines))
    with pytest.raises(JournalCorrupt, match="checksum"):
        import_jsonl(p)


def test_queries_and_counts(eb):
    j = MemoryJournal()
    b = build(eb, j)
    b.acquire(Intent("storm", units={"gpu": 49}, duration=60))      # ceiling: refused
    b.acquire(Intent("storm", units={"gpu": 40}, duration=600))     # tokens: refused
    b.acquire(Intent("inter", units={"gpu": 8}, duration=60))
    b.clock.advance(30)
    b.acquire(Intent("inter", units={"gpu": 9}, duration=60))       # ceiling: pending
    assert [r["reason"] for r in j.query(campaign="storm", op="acquire")] == ["ceiling", "tokens"]
    assert [r["op"] for r in j.query(campaign="storm")] == ["register", "acquire", "acquire"]
    assert len(j.query(campaign="inter", outcome="granted")) == 1
    assert len(j.query(t0=10, t1=40)) == 1
    assert j.counts()["ceiling"] == 2 and j.counts(by="outcome")["refused"] == 2
    assert j.counts(campaign="inter", by="outcome") == {"granted": 1, "pending": 1, "ok": 1}
    assert j.counts(by="op")["acquire"] == 4
    with pytest.raises(InvalidArgument):
        j.query(reason="bogus")


# ------------------------------------------------------------------ explain
def test_explain_every_reason(eb):
    j = MemoryJournal()
    b = Broker(Pool(gpu=16), clock=ManualClock(0.0), backend=eb, ttl=50, journal=j)
    b.register("a", Envelope(credits=1, sustained={"gpu": 4}, ceiling={"gpu": 8},
                             burst={"gpu": 100}))
    b.register("big", Envelope(credits=INF, sustained={"gpu": 16}, ceiling={"gpu": 16}))
    b.register("bf", CAMPAIGNS["bf"])
    seqs = {
        "ceiling": b.acquire(Intent("a", units={"gpu": 9}, duration=10)).seq,
        "tokens": b.acquire(Intent("a", units={"gpu": 8}, duration=600)).seq,
        "credits": b.acquire(Intent("a", units={"gpu": 4}, duration=36000)).seq,
    }
    held = b.acquire(Intent("big", units={"gpu": 16}, duration=100))
    seqs["capacity"] = b.acquire(Intent("a", units={"gpu": 2}, duration=10)).seq
    seqs["deadline"] = b.acquire(Intent("bf", units={"gpu": 1}, duration=10, deadline=-1)).seq
    b.acquire(Intent("bf", units={"gpu": 2}, duration=10))
    b.clock.advance(50)
    b.poll()
    seqs["ttl"] = j.query(op="refuse")[0]["seq"]
    b.release(held.lease.id)
    seqs["invalid"] = b.renew(held.lease.id, 10).seq
    seqs["invalid-release"] = b.release(held.lease.id).seq
    texts = {k: b.explain(s) for k, s in seqs.items()}
    assert "ceiling" in texts["ceiling"] and "9" in texts["ceiling"]
    assert "token bucket" in texts["tokens"] and "100 unit-seconds" in texts["tokens"]
    assert "credits" in texts["credits"] and "1.00" in texts["credits"]
    assert "capacity binds" in texts["capacity"] and "0 gpu are free" in texts["capacity"]
    assert "deadline" in texts["deadline"]
    assert "TTL" in texts["ttl"]
    assert "no longer live" in texts["invalid-release"]
    assert "not live" in texts["invalid"]
    for k, t in texts.items():
        assert len(t) > 40 and t.endswith("."), (k, t)
    for r in j:  # every record explains in one paragraph
        assert "\n" not in b.explain(r)


# ------------------------------------------------------------------ crash safety
CHILD = textwrap.dedent("""
    import math, random, sys
    from bursarcore import Broker, Envelope, Intent, ManualClock, Pool
    from bursarcore.journal import SQLiteJournal
    path, backend, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
    rng = random.Random(seed)
    j = SQLiteJournal(path, batch=rng.choice([1, 7, 64]), synchronous="NORMAL", create=True)
    b = Broker(Pool(gpu=64), clock=ManualClock(0.0), backend=backend, journal=j)
    b.register("a", Envelope(credits=500, sustained={"gpu": 16}, ceiling={"gpu": 48}, burst={"gpu": 5000}))
    b.register("g", Envelope(credits=500, service_class="interactive", guaranteed={"gpu": 16},
                             sustained={"gpu": 16}, ceiling={"gpu": 32}, burst={"gpu": 2000}))
    b.register("bf", Envelope(credits=math.inf, service_class="opportunistic", sustained={"gpu": 64},
                              ceiling={"gpu": 64}, burst={"gpu": math.inf}))
    i = 0
    while True:
        i += 1
        r = rng.random()
        if r < 0.55:
            c = rng.choice("agb")
            c = {"a": "a", "g": "g", "b": "bf"}[c]
            d = b.acquire(Intent(c, units={"gpu": (1, rng.randint(1, 32))}, duration=rng.choice([5.0, 60.0, 300.0])))
        elif r < 0.75:
            live = b.leases()
            d = b.release(live[rng.randrange(len(live))].id) if live else None
        elif r < 0.85:
            b.admit_batch([rng.randrange(3) for _ in range(4)], [rng.randint(1, 8) for _ in range(4)], 30.0)
            d = None
        else:
            b.clock.advance(rng.choice([1.0, 10.0, 61.0]))
            b.poll()
            d = None
        if d is not None and d.seq >= 0:
            pending_ack = getattr(b, "_acks", [])
            pending_ack.append((d.seq, d.outcome, d.lease.id if d.lease else -1))
            b._acks = pending_ack
        if i % 5 == 0:
            durable = b.sync()
            for seq, outcome, lease in getattr(b, "_acks", []):
                assert seq <= durable
                print(seq, outcome, lease, flush=True)
            b._acks = []
""")


@pytest.mark.parametrize("backend", BACKENDS)
def test_sigkill_loses_no_acknowledged_decision(backend, tmp_path):
    import select
    import time
    from invariants import check_invariants

    rng = random.Random(11)
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    for trial in range(4):
        path = tmp_path / f"crash{trial}.db"
        p = subprocess.Popen([sys.executable, str(script), str(path), backend, str(trial)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        acked = []
        target = rng.randint(5, 400)
        deadline = time.monotonic() + 60
        while len(acked) < target and time.monotonic() < deadline:
            ready, _, _ = select.select([p.stdout], [], [], 1.0)
            if ready:
                line = p.stdout.readline()
                if not line:
                    break
                seq, outcome, lease = line.split()
                acked.append((int(seq), outcome, int(lease)))
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
        assert acked, p.stderr.read()
        j = SQLiteJournal(path)
        assert j.durable_seq >= acked[-1][0]
        for seq, outcome, lease in acked:
            rec = j.record(seq)
            assert rec["outcome"] == {"released": "ok"}.get(outcome, outcome)
            assert rec["lease"] == lease
        b = Broker.replay(j, backend=backend)
        check_invariants(b)  # no lease lost or duplicated; tokens and credits balance
        live = [l.id for l in b.leases()]
        assert len(live) == len(set(live))


def test_sqlite_rows_keep_earlier_records_after_appends(eb, tmp_path):
    j = SQLiteJournal(tmp_path / "j.db", batch=2, create=True)
    b = build(eb, j)
    assert j.rows()["seq"].tolist() == [0, 1, 2, 3]
    d = b.acquire(Intent("storm", units={"gpu": 1}, duration=10))
    assert j.rows()["seq"].tolist() == [0, 1, 2, 3, 4]
    assert "storm asked for 1 gpu" in b.explain(d.seq)
    assert len(j.query(campaign="storm")) == 2


def test_replay_onto_a_later_clock_with_flow_dims(eb):
    b = Broker(Pool(gpu=8, flow={"fs": 10.0}), clock=ManualClock(100.0), backend=eb,
               journal=MemoryJournal())
    b.register("a", Envelope(credits=10, guaranteed={"fs": 1}, sustained={"gpu": 8, "fs": 1},
                             ceiling={"gpu": 8, "fs": 2}, burst={"fs": 5}))
    b.consume("a", "fs", 1.5)
    r = Broker.replay(b.journal, backend=eb, clock=ManualClock(200.0))
    assert r.clock.now() == 200.0 and r.consume("a", "fs", 1).allowed == 1.0
    behind = Broker.replay(b.journal, backend=eb, clock=ManualClock(50.0))
    with pytest.raises(InvalidArgument):
        behind.supply("a")  # the clock may not run behind the journal


def test_tiny_durations_are_refused_before_anything_changes():
    with pytest.raises(InvalidArgument) as e:
        Intent("a", units={"gpu": 1}, duration=1e-10)
    assert e.value.field == "duration"
