"""Durable decisions/s and decision latency over one decision stream (``/v1/stream``, one
WebSocket) of ``bursar serve``, over loopback.

    python benchmarks/service_stream.py                 # writes its section of RESULTS_service.md
    python benchmarks/service_stream.py --quick         # 1 s per row, prints the table only

Starts a fresh server for each row (SQLite journal, synchronous=FULL: every answer waits
for its records' fsync; rate limit off; the 16 campaigns of service_columnar.py on a pool
large enough that every intent is granted) on 127.0.0.1, and one load generator process
with one WebSocket. The generator sends frames of ``--frame`` messages, keeping at most
``--window`` messages unanswered (a pipeline), for at most ``--seconds``; the operator token
names a campaign per message (the 16 in turn). A message's latency runs from the moment
its frame was handed to the socket to the moment its answer was read. "raw" rows send
prepared frames and count answers (the server's rate); "client" rows go through
``BursarClient.stream()`` (building each message, decoding each answer into a
``Decision``: an agent's rate). Every answer is checked to be a decision (or a
consumption) with a journal seq. Loopback only; every loop stops by itself.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

from load_service import machine  # noqa: E402
from service_columnar import CAMPAIGNS, CONFIG  # noqa: E402

BEGIN, END = "<!-- stream: begin -->", "<!-- stream: end -->"


def _messages(op: str, n: int, duration: float) -> list[dict]:
    if op == "intents":
        return [{"id": i, "op": "acquire", "campaign": CAMPAIGNS[i % len(CAMPAIGNS)],
                 "max": 1, "duration": duration} for i in range(n)]
    return [{"id": i, "op": "consume", "campaign": CAMPAIGNS[i % len(CAMPAIGNS)],
             "dim": "fs", "amount": 1.0} for i in range(n)]


def generator(a: dict) -> dict:
    """One WebSocket: frames in a window, answers counted and timed."""
    import msgpack

    from bursarcore.client import BursarClient

    url, token, frame, window = a["url"], a["token"], a["frame"], a["window"]
    binary, op = a["binary"], a["op"]
    lat: list[np.ndarray] = []
    n = bad = 0
    if a["mode"] == "client":
        from bursarcore import Intent

        with BursarClient(url, token, timeout=60) as cl, \
                cl.stream(events=False, binary=binary, frame=frame, window=window) as s:
            sent_at: collections.deque[float] = collections.deque()
            k = 0
            t0 = time.perf_counter()
            end = t0 + a["seconds"]
            while time.perf_counter() < end and n < a["max_messages"]:
                while s.unanswered < window and k - n < window:
                    c = CAMPAIGNS[k % len(CAMPAIGNS)]
                    if op == "intents":
                        s.acquire(Intent(c, units={"gpu": 1}, duration=a["duration"]))
                    else:
                        s.consume("fs", 1.0, campaign=c)
                    sent_at.append(time.perf_counter())
                    k += 1
                ans = s.receive()
                now = time.perf_counter()
                lat.append(np.array([now - sent_at.popleft()]))
                n += 1
                bad += getattr(ans.value, "seq", -1) < 0
            wall = time.perf_counter() - t0
    else:
        from websockets.sync.client import connect

        msgs = _messages(op, frame * 16, a["duration"])
        frames = [msgs[i:i + frame] for i in range(0, len(msgs), frame)]
        enc = [(msgpack.packb(f if frame > 1 else f[0]) if binary else
                json.dumps(f if frame > 1 else f[0], separators=(",", ":"))) for f in frames]
        ws = connect(url.replace("http", "ws", 1) + "/v1/stream?events=false",
                     additional_headers={"Authorization": f"Bearer {token}"},
                     compression=None, max_size=1 << 26).__enter__()
        inflight: collections.deque[list] = collections.deque()   # [sent_at, left]
        unanswered = 0
        j = 0
        t0 = time.perf_counter()
        end = t0 + a["seconds"]
        while time.perf_counter() < end and n < a["max_messages"]:
            while unanswered + frame <= window:
                ws.send(enc[j % len(enc)])
                inflight.append([time.perf_counter(), frame])
                unanswered += frame
                j += 1
            data = ws.recv(timeout=60)
            now = time.perf_counter()
            doc = msgpack.unpackb(data) if isinstance(data, bytes) else json.loads(data)
            docs = doc if isinstance(doc, list) else [doc]
            kind = "decision" if op == "intents" else "consumption"
            for d in docs:
                bad += d.get("type") != kind or d[kind]["seq"] < 0
            k = len(docs)
            n += k
            unanswered -= k
            while k:
                head = inflight[0]
                take = min(k, head[1])
                lat.append(np.full(take, now - head[0]))
                head[1] -= take
                k -= take
                if head[1] == 0:
                    inflight.popleft()
        wall = time.perf_counter() - t0
        ws.close()
    x = np.concatenate(lat) if lat else np.zeros(1)
    return {"messages": n, "bad": int(bad), "seconds": wall,
            "p50": float(np.percentile(x, 50)) * 1e3, "p99": float(np.percentile(x, 99)) * 1e3}


#: the server's window and frame flags of the rows that need more than the defaults
#: (--stream-window 4096, --stream-frame 1000)
WIDE = ("--stream-window", "16384", "--stream-frame", "2000")
#: the server on the cffi binding of the C core: acquire has no compiled common case there,
#: and a run's decisions and leases are built in Python
CFFI = {"BURSARCORE_BACKEND": "cffi"}
ROWS = [
    # (mode, op, binary, frame, window, server flags[, server environment])
    ("raw", "intents", False, 1, 1, ()),
    ("raw", "intents", False, 1, 256, ()),
    ("raw", "intents", False, 100, 2000, ()),
    ("raw", "intents", False, 1000, 4000, ()),
    ("raw", "intents", True, 20, 200, ()),
    ("raw", "intents", True, 100, 2000, ()),
    ("raw", "intents", True, 1000, 4000, ()),
    ("raw", "intents", True, 1000, 8000, WIDE),
    ("raw", "intents", True, 2000, 8000, WIDE),
    ("raw", "intents", True, 1000, 4000, (), CFFI),
    ("raw", "consume", True, 1000, 4000, ()),
    ("client", "intents", False, 100, 2000, ()),
    ("client", "intents", True, 100, 2000, ()),
]


def run(args: argparse.Namespace, workdir: Path) -> list[dict]:
    import httpx

    from bursarcore.service.testing import ServerProcess

    out = []
    for k, (mode, op, binary, frame, window, flags, *more) in enumerate(ROWS):
        env = more[0] if more else {}
        name = f"{mode} {op} {'binary' if binary else 'json'}{' cffi' if env else ''}"
        if args.only and args.only not in name:
            continue
        srv = ServerProcess(workdir / f"row{k}", CONFIG, rate=0.0,
                            synchronous=args.synchronous, tick=0.5,
                            extra_args=list(flags), env=env).start()
        try:
            h0 = httpx.get(f"{srv.url}/v1/health").json()
            a = {"url": srv.url, "token": srv.tokens["operator"], "frame": frame,
                 "window": window, "binary": binary, "op": op, "mode": mode,
                 "seconds": args.seconds, "max_messages": args.max_messages,
                 "duration": args.duration}
            p = subprocess.run([sys.executable, __file__, "--generator", json.dumps(a)],
                               capture_output=True, text=True, timeout=args.seconds + 300)
            if p.returncode != 0:
                raise RuntimeError(f"the generator failed: {p.stderr[-2000:]}")
            r = json.loads(p.stdout.strip().splitlines()[-1])
            h1 = httpx.get(f"{srv.url}/v1/health").json()
        finally:
            srv.stop(timeout=60)
        r.update(mode=mode, op=op, form="MessagePack" if binary else "JSON", frame=frame,
                 window=window, flags=" ".join([*(f"{k}={v}" for k, v in env.items()),
                                                *flags]),
                 rate=r["messages"] / r["seconds"],
                 commits=h1["commits"] - h0["commits"])
        out.append(r)
        print(f"  {mode:6s} {op:8s} {r['form']:11s} frame {frame:5d} window {window:5d} "
              f"{r['rate']:10,.0f}/s  p50 {r['p50']:7.2f} ms  p99 {r['p99']:7.2f} ms  "
              f"bad {r['bad']}", flush=True)
    return out


def table(rows: list[dict]) -> str:
    lines = ["| generator | messages | form | messages per frame | window | server flags | "
             "answers | durable decisions/s | p50 ms | p99 ms | answers per fsync | "
             "not a decision |",
             "|---|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        per = f"{r['messages'] / r['commits']:,.0f}" if r["commits"] else "—"
        flags = f"`{r['flags']}`" if r["flags"] else "defaults"
        lines.append(f"| {r['mode']} | {r['op']} | {r['form']} | {r['frame']:,} | "
                     f"{r['window']:,} | {flags} | {r['messages']:,} | {r['rate']:,.0f} | "
                     f"{r['p50']:.2f} | {r['p99']:.2f} | {per} | {r['bad']} |")
    return "\n".join(lines)


SECTION = """{begin}
## The decision stream (`/v1/stream`, one WebSocket)

Command: `{cmd}` (benchmarks/service_stream.py)

Machine: {machine}, websockets {websockets}, msgpack {msgpack}, msgspec {msgspec}; load
average before the
run {load} (other work shares the machine: figures from one run, rows of the same run
compare).

Each row runs on a fresh server (SQLite journal, `synchronous={sync}`, rate limit off, the
16 campaigns of the columnar rows, every intent granted) and one load-generator process
with **one** WebSocket, for at most {seconds:g} s and {maxm:,} messages. The generator
keeps at most "window" messages unanswered, in frames of "messages per frame"; each
message is a 1-unit intent of {dur:g} s (or a 1-unit consumption) naming one of the 16
campaigns (the operator token). Every answer is sent once its journal record is durable,
so "durable decisions/s" counts acknowledged decisions. A message's latency runs from its
frame's send to its answer's arrival, as the generator sees it. "raw" sends prepared
frames and counts the answers (the server's rate); "client" goes through
`BursarClient.stream()`, building each message from an `Intent` and decoding each answer
into a `Decision` in the same process (an agent's rate). "server flags" are the rows'
`--stream-window` and `--stream-frame` when they are not the defaults (4096, 1000): a
client's window is held to the server's; `BURSARCORE_BACKEND=cffi` runs the server on
the cffi binding of the C core.

{table}

{where}
{end}
"""


WHERE = """
Reading it. One connection is served by one event-loop thread, which decides a slice of
128 messages under the broker lock at once and encodes the slice's answers at once; the
answers wait for the commit as bytes. Consecutive intents without a deadline or a
max_spend (every intent here) are decided as runs: one pass of the compiled batch loop
per run, its journal records appended as columns, and each answer's decision and lease
built in compiled code with the Cython binding (in Python, as the single path builds
them, on the cffi binding); any other message is one broker operation, as over HTTP. So
the rate is bound by the work per message on that thread — the run itself (its inputs
and columns, the loop, its journal rows, the decisions and leases) is the largest part,
then building each answer's document from its decision and encoding it, reading and
checking each message (a shape the connection sent before is not checked again),
decoding the frame and writing the answers to the socket — and by the pipeline: a
connection's rate is at most its window per round trip (Little's law: window / rate is
the latency, as the p50 shows), so with a commit and a frame's decoding on each side of
the round trip a window of a few frames is what keeps the server busy; a wider window
(`--stream-window`, the rows with 8,000 in flight) holds more answers back for as long
and carries more while the server has idle time to fill between a frame's answers and the
next frame, which it has when nothing else shares the two cores with the load generator
and the committer thread. The fsync costs nothing per decision once the pipeline is full
(hundreds to thousands of answers share each commit). One message at a time (window 1)
costs one commit per decision, as a single HTTP intent does. JSON costs more than
MessagePack per message (text to read and to write). The "client" rows are bound by the
agent's own process: building and checking an `Intent` per message and decoding each
answer into a `Decision` and its `Lease`. The cffi row (`BURSARCORE_BACKEND=cffi`)
differs from the Cython one by the intents read and the decisions and leases built in
Python. The load generator runs on the same two cores as the server and its committer
thread, and other work shared the machine during the run: rows compare within the run,
and a row's rate moves by tens of percent between runs.
"""


# ---------------------------------------------------------------------------- wrk
WBEGIN, WEND = "<!-- wrk: begin -->", "<!-- wrk: end -->"
_LUA = """wrk.method = "POST"
wrk.body = '{"max": 1, "duration": 600}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer %s"
"""


def bare_app(durable: str | None = None) -> Any:
    """A bare FastAPI endpoint with a pydantic body: the intent's model, validated, and a
    fixed answer of the same shape as a decision — what the framework alone costs. With
    ``durable`` a path, the endpoint also commits one row to a SQLite database there
    (WAL, ``synchronous=FULL``, in a worker thread, as bursar's journal commits) before it
    answers: the framework plus one durable commit per request, without group commit."""
    import asyncio
    import sqlite3
    import threading

    from fastapi import FastAPI

    from bursarcore.service.models import DecisionOut, IntentIn

    app = FastAPI()
    answer = {"outcome": "granted", "intent_id": 0, "campaign": "c0", "units": 1,
              "lease": None, "path": "warm", "reason": None, "retry_after": None,
              "cost": 0.0, "wait": 0.0, "seq": 0}
    commit = None
    if durable is not None:
        db = sqlite3.connect(durable, isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.execute("CREATE TABLE IF NOT EXISTS t (campaign TEXT, units INTEGER)")
        lock = threading.Lock()

        def commit(campaign: str, units: int) -> None:
            with lock:
                db.execute("BEGIN")
                db.execute("INSERT INTO t VALUES (?, ?)", (campaign, units))
                db.execute("COMMIT")

    async def intents(campaign: str, body: IntentIn) -> dict:
        if commit is not None:
            await asyncio.to_thread(commit, campaign, body.max)
        return {**answer, "campaign": campaign, "units": body.max}

    # the types themselves (this module's annotations are strings, and these are local)
    intents.__annotations__ = {"campaign": str, "body": IntentIn, "return": dict}
    app.post("/v1/campaigns/{campaign}/intents", response_model=DecisionOut,
             status_code=201)(intents)
    return app


def _wrk(url: str, token: str, conns: int, seconds: float, workdir: Path) -> dict:
    import re

    lua = workdir / "post.lua"
    lua.write_text(_LUA % token)
    p = subprocess.run(["wrk", "-t", "1", "-c", str(conns), "-d", f"{seconds:g}s",
                        "--latency", "-s", str(lua), url + "/v1/campaigns/c0/intents"],
                       capture_output=True, text=True, timeout=seconds + 60)
    out = p.stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    p99 = re.search(r"99%\s+([\d.]+)(us|ms|s)", out)
    scale = {"us": 1e-3, "ms": 1.0, "s": 1e3}[p99.group(2)]
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return {"rps": rps, "p99": float(p99.group(1)) * scale,
            "bad": int(non2xx.group(1)) if non2xx else 0}


def _commits(url: str, token: str) -> tuple[float, float]:
    """The server's journal commits so far: (count, seconds spent in them)."""
    import re

    import httpx

    text = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {token}"},
                     timeout=30).text
    got = {}
    for k in ("count", "sum"):
        m = re.search(rf"^bursar_journal_commit_duration_seconds_{k} (\S+)$", text, re.M)
        got[k] = float(m.group(1))
    return got["count"], got["sum"]


def _fsync_probe(workdir: Path, n: int = 200) -> float:
    """The median time of one SQLite commit of one row (WAL, synchronous=FULL) in this
    directory, in ms: what a request that waits for its own commit pays at least."""
    import sqlite3

    path = workdir / "probe.db"
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("CREATE TABLE IF NOT EXISTS t (x BLOB)")
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        db.execute("BEGIN")
        db.execute("INSERT INTO t VALUES (?)", (b"x" * 128,))
        db.execute("COMMIT")
        ts.append(time.perf_counter() - t)
    db.close()
    return float(np.median(ts)) * 1e3


def _bare_server(workdir: Path, durable: bool) -> tuple[subprocess.Popen, str]:
    import socket

    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    args = [sys.executable, __file__, "--bare", str(port)]
    if durable:
        args += ["--bare-durable", str(workdir / "bare.db")]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    end = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, f"http://127.0.0.1:{port}"
        except OSError:
            if time.monotonic() > end or proc.poll() is not None:
                proc.kill()
                raise RuntimeError("the bare FastAPI app did not start")
            time.sleep(0.1)


def wrk_rows(args: argparse.Namespace, workdir: Path) -> list[dict]:
    """Every round runs, for each number of connections, bursar, the bare endpoint and
    the bare endpoint with a commit one after the other (in a rotating order), so that
    each ratio compares runs seconds apart on the same machine."""
    from bursarcore.service.testing import ServerProcess

    srv = ServerProcess(workdir / "bursar", CONFIG, rate=0.0, tick=0.5,
                        synchronous=args.synchronous).start()
    bare, bare_url = _bare_server(workdir, False)
    durable, durable_url = _bare_server(workdir, True)
    targets = {"bursar": (srv.url, srv.tokens["c0"]), "bare": (bare_url, "x"),
               "bare+commit": (durable_url, "x")}
    rows = []
    try:
        for conns in (1, 16):        # warm-up: every server has answered before a round
            for name, (url, tok) in targets.items():
                _wrk(url, tok, conns, 1.0, workdir)
        for r in range(args.rounds):
            for conns in (1, 16):
                row: dict[str, Any] = {"round": r, "conns": conns,
                                       "fsync_ms": _fsync_probe(workdir)}
                order = list(targets)
                order = order[r % 3:] + order[:r % 3]
                for name in order:
                    url, tok = targets[name]
                    if name == "bursar":
                        c0, s0 = _commits(srv.url, srv.tokens["operator"])
                    row[name] = _wrk(url, tok, conns, args.seconds, workdir)
                    if name == "bursar":
                        c1, s1 = _commits(srv.url, srv.tokens["operator"])
                        row["commit_ms"] = (s1 - s0) / max(1.0, c1 - c0) * 1e3
                        row["per_commit"] = row["bursar"]["rps"] * args.seconds \
                            / max(1.0, c1 - c0)
                rows.append(row)
                print(f"  round {r} -c {conns:2d}: bursar {row['bursar']['rps']:8,.0f}/s, "
                      f"bare {row['bare']['rps']:8,.0f}/s, bare+commit "
                      f"{row['bare+commit']['rps']:8,.0f}/s, bursar/bare "
                      f"{row['bursar']['rps'] / row['bare']['rps']:.2f}, commit "
                      f"{row['commit_ms']:.3f} ms, probe {row['fsync_ms']:.3f} ms",
                      flush=True)
    finally:
        srv.stop(timeout=60)
        for p in (bare, durable):
            p.terminate()
            p.wait(30)
    return rows


def wrk_table(rows: list[dict]) -> str:
    out = ["| connections | round | `bursar serve`: req/s | p99 ms | bare: req/s | p99 ms | "
           "bare + commit: req/s | **bursar / bare** | bursar / (bare + commit) | "
           "bursar's commit, ms | requests per commit | one-row commit (probe), ms | "
           "non-2xx |",
           "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in sorted(rows, key=lambda r: (r["conns"], r["round"])):
        o, b, d = r["bursar"], r["bare"], r["bare+commit"]
        out.append(f"| {r['conns']} | {r['round'] + 1} | {o['rps']:,.0f} | {o['p99']:.2f} | "
                   f"{b['rps']:,.0f} | {b['p99']:.2f} | {d['rps']:,.0f} | "
                   f"**{o['rps'] / b['rps']:.2f}** | {o['rps'] / d['rps']:.2f} | "
                   f"{r['commit_ms']:.3f} | {r['per_commit']:.1f} | {r['fsync_ms']:.3f} | "
                   f"{o['bad'] + b['bad'] + d['bad']} |")
    return "\n".join(out)


def wrk_summary(rows: list[dict]) -> str:
    """Medians over the rounds; with one connection, a request's time split into the
    commit it waits for and the rest."""
    lines = ["| connections | bursar / bare, median (min-max) | bursar / (bare + commit), "
             "median | ms per request: bare | bursar | of which its commit | bursar "
             "without the commit | one-row commit (probe) |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for conns in (1, 16):
        rs = [r for r in rows if r["conns"] == conns]
        ratio = sorted(r["bursar"]["rps"] / r["bare"]["rps"] for r in rs)
        dur = sorted(r["bursar"]["rps"] / r["bare+commit"]["rps"] for r in rs)
        med = lambda f: float(np.median([f(r) for r in rs]))  # noqa: E731
        bare_ms = med(lambda r: 1e3 / r["bare"]["rps"])
        ours_ms = med(lambda r: 1e3 / r["bursar"]["rps"])
        if conns == 1:
            commit = med(lambda r: r["commit_ms"])
            rest = med(lambda r: 1e3 / r["bursar"]["rps"] - r["commit_ms"])
            split = f"{commit:.3f} | {rest:.3f} | {med(lambda r: r['fsync_ms']):.3f}"
        else:
            split = "shared | — | —"     # one commit acknowledges several requests
        lines.append(f"| {conns} | {np.median(ratio):.2f} ({ratio[0]:.2f}-{ratio[-1]:.2f}) | "
                     f"{np.median(dur):.2f} | {bare_ms:.3f} | {ours_ms:.3f} | {split} |")
    return "\n".join(lines)


WSECTION = """{begin}
## One intent per request against a bare FastAPI endpoint (wrk)

Command: `{cmd}` (benchmarks/service_stream.py; wrk {wrk})

Machine: {machine}; load average before the run {load} (other work shares the machine).

wrk (1 thread, keep-alive connections) posts `{{"max": 1, "duration": 600}}` for {seconds:g}
s to `POST /v1/campaigns/c0/intents` of three servers on the same loopback, in each of
{rounds} rounds, one after the other (the order rotating between rounds):

* `bursar serve` (SQLite journal, `synchronous={sync}`, rate limit off, the 16 campaigns
  above): every intent is authenticated, rate-limit checked, decided, journaled, made
  durable and answered 201 with its lease;
* **bare**: a FastAPI app under uvicorn (one process, no access log, uvicorn's defaults:
  the same h11 HTTP implementation as bursar's) whose endpoint validates the same pydantic
  body (`IntentIn`) and answers a fixed decision (`DecisionOut`): what the framework
  alone costs, with no durability. "bursar / bare" is bursar's rate over this one's, in
  the same round;
* **bare + commit**: the same endpoint, which also commits one row to SQLite (WAL,
  `synchronous=FULL`, in a worker thread) before it answers: the framework plus one
  durable commit per request, without group commit.

"bursar's commit" is the mean time of the server's journal commits during its run (from
`/metrics`: from handing the batch to the writer thread until the event loop has it back,
so the two thread switches are in it), "requests per commit" the requests its group
commit acknowledged with one commit; the probe is the median time of a one-row SQLite
commit in the same directory, on the probing thread, taken just before the round's runs.
The first table holds the medians over the rounds, with one connection a request's time
split into the commit it waits for and the rest; the second every round.

{summary}

{table}

{where}
{end}
"""

WWHERE = """
Reading it. With one connection each request waits for its own commit (there is nothing
to group): a request costs its HTTP, its checks and its decision ("bursar without the
commit") plus one commit, and the commit alone bounds the ratio: bursar / bare <= bare's
time per request / (bare's time + the commit). For a ratio of 0.9 the commit — an fsync,
plus handing the batch to the writer thread and back — would have to take less than a
ninth of the bare request. The probe column is what a one-row commit alone takes on this
disk just before the round, "bursar's commit" what the server's commits took, the
hand-off included: at one connection it is the commit, not the service's own work, that
sets the ratio, and on a disk whose fsync costs a good part of a bare request a ratio of
0.9 would mean answering before the decision is durable, which the service does not do.
"bare + commit" pays the same kind of commit per request (its fsync's time varies with
the disk's other load as bursar's does, so at one connection the two compare only
within a round). With 16 connections the commits are shared (group commit: the requests
per commit), and the ratio is what the broker, the journal and the access checks cost
per request on the event-loop thread against what the direct path saves on the
framework; other work on the machine moves it between rounds, hence the medians.
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=4.0, help="per row (4)")
    ap.add_argument("--max-messages", type=int, default=2_000_000, help="per row")
    ap.add_argument("--duration", type=float, default=600.0,
                    help="lease length of the intents, seconds (600: none expires in a row)")
    ap.add_argument("--synchronous", default="FULL", choices=["NORMAL", "FULL"])
    ap.add_argument("--only", help="only the rows whose name contains this")
    ap.add_argument("--quick", action="store_true", help="1 s per row, no results file")
    ap.add_argument("--wrk", action="store_true",
                    help="instead: one intent per request with wrk, against a bare FastAPI "
                         "endpoint with a pydantic body, 1 and 16 connections")
    ap.add_argument("--generator", help=argparse.SUPPRESS)
    ap.add_argument("--bare", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--bare-durable", help=argparse.SUPPRESS)
    ap.add_argument("--rounds", type=int, default=3,
                    help="with --wrk: rounds of the three servers (3)")
    ap.add_argument("--out", default=str(HERE / "RESULTS_service.md"))
    args = ap.parse_args(argv)
    if args.generator:
        print(json.dumps(generator(json.loads(args.generator))))
        return 0
    if args.bare:
        import uvicorn

        uvicorn.run(bare_app(args.bare_durable), host="127.0.0.1", port=args.bare,
                    log_level="warning", access_log=False, server_header=False)
        return 0
    if args.quick:
        args.seconds = 1.0
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    if args.wrk:
        with tempfile.TemporaryDirectory(prefix="bursar-wrk-") as d:
            wrows = wrk_rows(args, Path(d))
        text = wrk_table(wrows)
        print(wrk_summary(wrows))
        print(text)
        if not args.quick:
            ver = subprocess.run(["wrk", "-v"], capture_output=True, text=True)
            wver = (ver.stdout + ver.stderr).split()[1] if (ver.stdout + ver.stderr).split() \
                else "?"
            cmd = "python benchmarks/service_stream.py " + " ".join(
                argv if argv is not None else sys.argv[1:])
            section = WSECTION.format(begin=WBEGIN, end=WEND, cmd=cmd.strip(), wrk=wver,
                                      machine=machine(), load=load, seconds=args.seconds,
                                      sync=args.synchronous, table=text,
                                      summary=wrk_summary(wrows), rounds=args.rounds,
                                      where=WWHERE.strip())
            _write_section(Path(args.out), WBEGIN, WEND, section)
        return 0
    with tempfile.TemporaryDirectory(prefix="bursar-stream-") as d:
        rows = run(args, Path(d))
    text = table(rows)
    print(text)
    if not args.quick and not args.only:
        import msgpack
        import websockets

        cmd = "python benchmarks/service_stream.py " + " ".join(
            argv if argv is not None else sys.argv[1:])
        section = SECTION.format(begin=BEGIN, end=END, cmd=cmd.strip(), machine=machine(),
                                 websockets=websockets.__version__,
                                 msgpack=".".join(map(str, msgpack.version)), load=load,
                                 msgspec=_msgspec_version(),
                                 sync=args.synchronous, table=text, where=WHERE.strip(),
                                 seconds=args.seconds, maxm=args.max_messages,
                                 dur=args.duration)
        _write_section(Path(args.out), BEGIN, END, section)
    return 0


def _msgspec_version() -> str:
    try:
        import msgspec
    except ImportError:
        return "not installed (msgpack and json encode)"
    return msgspec.__version__


def _write_section(out: Path, begin: str, end: str, section: str) -> None:
    old = out.read_text() if out.exists() else ""
    if begin in old and end in old:
        old = old[:old.index(begin)] + old[old.index(end) + len(end) + 1:]
    out.write_text(old.rstrip("\n") + "\n\n" + section)
    print(f"written {out}")


if __name__ == "__main__":
    sys.exit(main())
