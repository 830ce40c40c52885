"""Durable decisions/s through the columnar batch endpoints of ``bursar serve``, over
loopback, beside the 100-item batch endpoints measured in the same run.

    python benchmarks/service_columnar.py                # writes its section of RESULTS_service.md
    python benchmarks/service_columnar.py --quick        # 1 s per row, prints the table only

Starts a fresh server for each row (SQLite journal, synchronous=FULL: every answer waits
for its records' fsync; rate limit off; 16 campaigns) on 127.0.0.1, then runs the row
with N client processes at once, each on its own keep-alive connection, for at most
``--seconds``. A columnar request carries ``--rows`` items (10,000) spread over the 16
campaigns by the operator token; it is sent through :class:`bursarcore.client.BursarClient`
(``admit_columns`` / ``consume_columns``: encoding, HTTP, decoding all counted). The
100-item rows send their prepared JSON with httpx, as ``load_service.py`` does. Every
request is checked to be a 2xx with one decision per item. Loopback only; every loop
stops by itself.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

from load_service import BATCH, machine  # noqa: E402

# the load test's 16 campaigns on a pool large enough that a row's grants all fit: a row
# measures deciding and journaling, not a full pool refusing
CONFIG = {
    "pool": {"gpu": 2_000_000, "flow": {"fs": 1e12}},
    "campaigns": {
        f"c{i}": {"credits": None, "service_class": "agent-burst",
                  "guaranteed": {"gpu": 0, "fs": 0}, "sustained": {"gpu": 200_000, "fs": 1e11},
                  "ceiling": {"gpu": 200_000, "fs": 1e11}, "burst": {"gpu": None, "fs": 1e11}}
        for i in range(16)},
}
CAMPAIGNS = sorted(CONFIG["campaigns"])
BEGIN, END = "<!-- columnar: begin -->", "<!-- columnar: end -->"


def client_main(a: dict) -> dict:
    """One client process: from ``a["start"]`` (wall clock, shared by every client of
    the row) for ``a["seconds"]`` or ``a["max_requests"]`` requests, on one keep-alive
    connection."""
    import httpx

    from bursarcore.client import BursarClient

    scenario, url, token, rows, duration = (a["scenario"], a["url"], a["token"], a["rows"],
                                            a["duration"])
    rng = np.random.default_rng(a["k"])
    ci = rng.integers(0, len(CAMPAIGNS), rows)
    units = np.ones(rows, np.int64)
    amounts = np.full(rows, 1.0)
    binary = "binary" in scenario
    old_body = ({"intents": [{"max": 1, "duration": duration}] * BATCH} if "intents" in scenario
                else {"items": [{"dim": "fs", "amount": 1.0}] * BATCH})
    old_path = "/intents/batch" if "intents" in scenario else "/consume/batch"
    c = CAMPAIGNS[a["k"] % len(CAMPAIGNS)]
    n = bad = 0
    with BursarClient(url, token, timeout=120, retries=0) as cl, \
            httpx.Client(base_url=url, timeout=120,
                         headers={"Authorization": f"Bearer {token}"}) as http:
        cl.campaigns()                                      # warm the connection
        http.get("/v1/health")
        time.sleep(max(0.0, a["start"] - time.time()))
        t0 = time.perf_counter()
        end = t0 + a["seconds"]
        while time.perf_counter() < end and n < a["max_requests"]:
            if "columnar intents" in scenario:
                out = cl.admit_columns(ci, units, duration, campaigns=CAMPAIGNS, binary=binary)
                ok = out["granted"].shape[0] == rows and bool((out["seq"] >= 0).all())
            elif "columnar consume" in scenario:
                out = cl.consume_columns(ci, "fs", amounts, campaigns=CAMPAIGNS, binary=binary)
                ok = out["allowed"].shape[0] == rows and bool((out["seq"] >= 0).all())
            else:
                r = http.post(f"/v1/campaigns/{c}{old_path}", json=old_body)
                ok = r.status_code == 200
            n += 1
            bad += not ok
        wall = time.perf_counter() - t0
    return {"requests": n, "bad": bad, "seconds": wall}


def _rows(scenario: str, url: str, token: str, rows: int, threads: int, seconds: float,
          max_requests: int, duration: float) -> dict:
    """A row: ``threads`` client processes at once (each its own interpreter, so the
    clients' encoding never waits for another client's lock)."""
    per = rows if "columnar" in scenario else BATCH
    start = time.time() + 1.5 + 0.3 * threads              # every client connected by then
    procs = []
    for k in range(threads):
        arg = json.dumps({"scenario": scenario, "url": url, "token": token, "rows": rows,
                          "seconds": seconds, "max_requests": -(-max_requests // threads),
                          "duration": duration, "k": k, "start": start})
        procs.append(subprocess.Popen([sys.executable, __file__, "--client", arg],
                                      stdout=subprocess.PIPE, text=True))
    outs = []
    for p in procs:
        out, _ = p.communicate(timeout=seconds + 300)
        if p.returncode != 0:
            raise RuntimeError(f"a client failed ({p.returncode})")
        outs.append(json.loads(out.strip().splitlines()[-1]))
    n = sum(o["requests"] for o in outs)
    wall = max(o["seconds"] for o in outs)
    return {"scenario": scenario, "threads": threads, "requests": n, "seconds": wall,
            "rps": n / wall, "decisions_per_s": n * per / wall, "per": per,
            "bad": sum(o["bad"] for o in outs)}


SCENARIOS = [f"POST intents/batch ({BATCH})", "columnar intents, JSON",
             "columnar intents, binary", "columnar intents, binary, 1 s leases",
             f"POST consume/batch ({BATCH})", "columnar consume, JSON",
             "columnar consume, binary"]


def _server(args: argparse.Namespace, workdir: Path) -> Any:
    from bursarcore.service.testing import ServerProcess

    extra = ["--max-batch-items", str(max(args.rows, 100_000))]
    srv = ServerProcess(workdir, CONFIG, rate=0.0, synchronous=args.synchronous, tick=0.5,
                        extra_args=extra)
    return srv.start()


def run(args: argparse.Namespace, workdir: Path) -> list[dict]:
    """Each row on a fresh server (a new journal), so no row decides on the leases, or
    pays for the expiries, of the rows before it."""
    import httpx

    rows = []
    k = 0
    for s in SCENARIOS:
        if args.only and args.only not in s:
            continue
        for th in args.threads:
            k += 1
            srv = _server(args, workdir / f"row{k}")
            try:
                dur = 1.0 if "1 s leases" in s else args.duration
                h0 = httpx.get(f"{srv.url}/v1/health").json()
                row = _rows(s, srv.url, srv.tokens["operator"], args.rows, th, args.seconds,
                            # the 1 s-lease row runs its whole time: its steady state
                            # (grants expiring again) starts after the first second
                            (10**6 if "1 s leases" in s else args.max_requests)
                            if "columnar" in s else 100 * args.max_requests,
                            dur)
                h1 = httpx.get(f"{srv.url}/v1/health").json()
            finally:
                srv.stop(timeout=60)
            row["commits"] = h1["commits"] - h0["commits"]
            rows.append(row)
            print(f"  {s:38s} x{th:<2d} {row['rps']:8.1f} req/s "
                  f"{row['decisions_per_s']:11,.0f} dec/s  bad {row['bad']}", flush=True)
    return rows


def table(rows: list[dict]) -> str:
    base = {}
    for r in rows:
        if "columnar" not in r["scenario"]:
            base[(r["scenario"].split()[1].split("/")[0], r["threads"])] = r["decisions_per_s"]
    # (the 1 s-lease row compares with the same 100-item row: its leases last the default)
    out = ["| endpoint | items per request | client processes | requests | req/s | durable "
           "decisions/s | × the 100-item batch | non-2xx or short |",
           "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        kind = "intents" if "intents" in r["scenario"] else "consume"
        ref = base.get((kind, r["threads"]))
        ratio = f"{r['decisions_per_s'] / ref:.1f}" if ref else "—"
        out.append(f"| {r['scenario']} | {r['per']:,} | {r['threads']} | {r['requests']:,} | "
                   f"{r['rps']:,.1f} | {r['decisions_per_s']:,.0f} | {ratio} | {r['bad']} |")
    return "\n".join(out)


SECTION = """{begin}
## Columnar batches (`POST /v1/batch/intents`, `/v1/batch/consume`)

Command: `{cmd}` (benchmarks/service_columnar.py)

Machine: {machine}, msgpack {msgpack}; load average before the run {load} (other work
shares the machine: figures from one run, rows of the same run compare).

Each row runs on a fresh server (SQLite journal, `synchronous={sync}`, rate limit off, 16
campaigns) with N client processes at once, each on its own keep-alive connection, for at
most {seconds:g} s and at most {maxr:,} columnar requests ({maxd:,} decisions; the "1 s
leases" rows for the whole time). A columnar
request carries {rows:,} items spread over the 16 campaigns (the operator token): 1-unit
intents of {dur:g} s (none expires during the row) or, in the "1 s leases" row, of 1 s
(the steady state where every grant expires again), or 1-unit consumptions of the flow
dimension `fs`. They are sent by `BursarClient.admit_columns` / `consume_columns`, so the
client's encoding and decoding count; "JSON" sends and answers lists, "binary"
MessagePack typed columns. The 100-item rows are the per-campaign batch endpoints,
measured in the same run for the ratio. Every answer is sent once its journal records
are durable; "durable decisions/s" counts the rows of the 2xx answers.

{table}

{where}
{end}
"""


WHERE = """
Where the time goes (py-spy on the server during the binary rows, 3 clients). The service's
own work per 10,000-item request — reading the typed columns, the checks, the answer's
columns from the journal rows, encoding — is about 6 % of the server's samples. The rest
is the engine and the journal: `Broker.admit_batch` about 37 % (its compiled loop a small
part; the journal's in-memory copy of the new records about 25 %, of which growing the
record store by doubling about 15 % and the records' checksums about 9 %; growing the
lease table about 9 %), the SQLite commit in its writer thread about 20 %, and idle time
waiting for fsync or the clients. In the 1 s-lease rows every grant expires again a
second later: the broker's compiled expiry path decides and journals each expiry (one
record each, its state after), and the service builds its event log from those records
when they are durable, so in the steady state expiries and admissions share the rate.
`Broker.consume_batch` decides an unpriced batch in its compiled loop and writes its
journal records as one block (about 6 million consumptions a second in process with a
memory journal), so the consume rows are bound, as the intent rows are, by the HTTP, the
encoding and the commit. The rate of a row falls as it goes: its fresh server's record
store and lease table grow by doubling (copying what they hold), so the first second runs
fastest. The machine is shared with other work, which moves every figure.
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=4.0, help="per row (4)")
    ap.add_argument("--max-requests", type=int, default=60,
                    help="columnar requests per row at most, shared by its clients (60: "
                         "600,000 decisions; the 100-item rows 100x as many requests)")
    ap.add_argument("--duration", type=float, default=600.0,
                    help="lease length of the intents, seconds (600: none expires in a row)")
    ap.add_argument("--rows", type=int, default=10_000, help="items per columnar request")
    ap.add_argument("--threads", default="1,4", help="client processes, comma-separated")
    ap.add_argument("--synchronous", default="FULL", choices=["NORMAL", "FULL"])
    ap.add_argument("--only", help="only the rows whose name contains this")
    ap.add_argument("--quick", action="store_true", help="1 s per row, no results file")
    ap.add_argument("--client", help=argparse.SUPPRESS)

    ap.add_argument("--out", default=str(HERE / "RESULTS_service.md"))
    args = ap.parse_args(argv)
    if args.client:
        print(json.dumps(client_main(json.loads(args.client))))
        return 0
    args.threads = [int(x) for x in args.threads.split(",")]
    if args.quick:
        args.seconds = 1.0
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    with tempfile.TemporaryDirectory(prefix="bursar-columnar-") as d:
        rows = run(args, Path(d))
    text = table(rows)
    print(text)
    if not args.quick and not args.only:
        cmd = "python benchmarks/service_columnar.py " + " ".join(
            a for a in (argv if argv is not None else sys.argv[1:]))
        import msgpack

        section = SECTION.format(begin=BEGIN, end=END, cmd=cmd.strip(), machine=machine(),
                                 msgpack=".".join(map(str, msgpack.version)), load=load,
                                 sync=args.synchronous, rows=args.rows, table=text,
                                 where=WHERE.strip(), seconds=args.seconds,
                                 maxr=args.max_requests, maxd=args.max_requests * args.rows,
                                 dur=args.duration)
        out = Path(args.out)
        old = out.read_text() if out.exists() else ""
        if BEGIN in old and END in old:
            old = old[:old.index(BEGIN)] + old[old.index(END) + len(END) + 1:]
        out.write_text(old.rstrip("\n") + "\n\n" + section)
        print(f"written {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
