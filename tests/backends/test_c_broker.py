"""The admission engine through the public C ABI, from a C program: ``examples/c/broker_demo.c``
(a toy broker: campaigns and nodes of trees of envelopes, acquire, renew, release, expiry)
built with ``cc`` against the installed package, run on its own script and on random ones,
must print what the Python :class:`~bursarcore.Broker` decides for the same operations — on
the compiled engine and on the reference: outcomes, units, reasons, lease ids, charges,
expiries and balances.

The toy broker has no policy layer: a request the engine defers (a reclaim or a pending
wait) is dropped, so the Python side cancels its pending intent at once.
"""

from __future__ import annotations

import math
import os
import random
import shutil
import subprocess

import pytest

import bursarcore
from bursarcore import Broker, Envelope, Intent, ManualClock, Pool
from bursarcore.broker import BACKENDS

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "c")
CLASSES = ("deadline", "interactive", "agent-burst", "opportunistic")
NS = 1_000_000_000
UNKNOWN = "index out of range"      # bc_strerror(BC_EINDEX): a lease not granted or ended

try:
    LIBRARY = bursarcore.get_library()
except FileNotFoundError:
    LIBRARY = None


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> str:
    if LIBRARY is None:
        pytest.skip("libbursarcore not built")
    cc = shutil.which(os.environ.get("CC", "cc"))
    assert cc, "a C compiler (cc) is needed to build the C example"
    out = str(tmp_path_factory.mktemp("c") / "broker_demo")
    subprocess.run([cc, "-std=c11", "-O2", "-Wall", "-Wextra", "-Wpedantic", "-Werror",
                    f"-I{bursarcore.get_include()}", "-o", out,
                    os.path.join(EXAMPLE, "broker_demo.c"), LIBRARY,
                    f"-Wl,-rpath,{os.path.dirname(LIBRARY)}"], check=True)
    return out


def run_c(demo: str, script: str | None) -> list[str]:
    args = [demo] if script is None else [demo, "-"]
    p = subprocess.run(args, input=script, capture_output=True, text=True, timeout=60,
                       check=True)
    return p.stdout.splitlines()


def builtin_script() -> str:
    """The C program's own script, read from its source."""
    with open(os.path.join(EXAMPLE, "broker_demo.c"), encoding="utf-8") as f:
        src = f.read()
    body = src.split("static const char *DEMO =", 1)[1].split(";", 1)[0]
    lines = []
    for part in body.split('"')[1::2]:
        lines.append(part.replace("\\n", ""))
    return "\n".join(lines) + "\n"


def run_python(script: str, backend: str) -> list[str]:
    """The script on the Python broker, printed as the C program prints it."""
    clock = ManualClock(0.0)
    b = Broker(Pool(gpu=8), clock=clock, backend=backend)
    out, ncamp, names = [], 0, []
    expired: list[int] = []
    granted: set[int] = set()

    def at(t_ns: int) -> None:
        clock.set(t_ns / NS)

    def live(lid: int) -> bool:
        return lid in granted and b.lease(lid).state == "active"

    def collect() -> None:
        expired.extend(e.lease_id for e in b.poll() if e.kind == "expired")

    for line in script.splitlines():
        op, *a = line.split()
        v = [int(x) for x in a]
        if op == "campaign":
            g, s, c, bucket, credits, t = v
            at(t)
            b.register(f"c{ncamp}", Envelope(
                credits=math.inf if credits < 0 else credits / 1e6,
                guaranteed={"gpu": g}, sustained={"gpu": s}, ceiling={"gpu": c},
                burst={"gpu": bucket / NS}))
            out.append(f"{line}: campaign {ncamp}")
            names.append(f"c{ncamp}")
            ncamp += 1
        elif op == "node":
            p, g, s, c, bucket, credits, t = v
            at(t)
            names.append(f"{names[p]}/c{ncamp}")
            b.register(names[-1], Envelope(
                credits=math.inf if credits < 0 else credits / 1e6,
                guaranteed={"gpu": g}, sustained={"gpu": s}, ceiling={"gpu": c},
                burst={"gpu": bucket / NS}))
            out.append(f"{line}: node {ncamp}")
            ncamp += 1
        elif op == "acquire":
            c, k, lo, hi, dur, t = v
            at(t)
            d = b.acquire(Intent(names[c], {"gpu": (lo, hi)}, duration=dur / NS,
                                 service_class=CLASSES[k]))
            collect()
            outcome = {"granted": "granted", "refused": "refused",
                       "pending": "deferred"}[d.outcome]
            if d.outcome == "pending":
                b.cancel(d.intent_id)
                collect()
            lease = d.lease.id if d.lease is not None else -1
            if lease >= 0:
                granted.add(lease)
            units = d.units if d.outcome == "granted" else 0
            out.append(f"{line}: {outcome} units={units} reason={d.reason or 'none'} "
                       f"lease={lease} charge={round(d.cost * 1e6)}")
        elif op == "renew":
            lid, ext, t = v
            at(t)
            collect()
            if not live(lid):
                out.append(f"{line}: {UNKNOWN}")
                continue
            d = b.renew(lid, ext / NS)
            collect()
            units = b.lease(lid).units
            # the C ABI reports what was charged; the broker's refusal the price that did
            # not fit
            charge = round(d.cost * 1e6) if d.outcome == "granted" else 0
            out.append(f"{line}: {d.outcome} units={units} reason={d.reason or 'none'} "
                       f"lease={lid} charge={charge}")
        elif op == "release":
            lid, t = v
            at(t)
            collect()
            if not live(lid):
                out.append(f"{line}: {UNKNOWN}")
                continue
            b.release(lid)
            collect()
            ls = b.lease(lid)
            out.append(f"{line}: {ls.state} units={ls.units} charge={round(ls.cost * 1e6)}")
        elif op == "advance":
            (t,) = v
            at(t)
            collect()
            out.append(f"{line}: expired" + "".join(f" {i}" for i in expired))
            expired.clear()
        elif op == "balance":
            (c,) = v
            sp = b.supply(names[c])
            credits = (1 << 62) if math.isinf(sp.credits) else round(sp.credits * 1e6)
            dim = sp.dims["gpu"]
            out.append(f"{line}: credits={credits} held={dim.held} "
                       f"tokens={round(dim.tokens * NS)}")
        else:
            raise AssertionError(op)
    return out


BACKENDS = sorted(BACKENDS)


@pytest.mark.parametrize("backend", BACKENDS)
def test_builtin_script_agrees(demo, backend):
    got = run_c(demo, None)
    assert got == run_python(builtin_script(), backend)
    # the script reaches every outcome it documents
    text = "\n".join(got)
    for word in ("granted", "reason=ceiling", "reason=tokens", "reason=credits", "released",
                 "expired 2 0", "node 2"):
        assert word in text, word


def random_script(rng: random.Random) -> str:
    lines: list[str] = []
    room: list[int] = []            # guarantee not yet given to children, per node
    n = rng.randint(1, 3)
    for _ in range(n):
        g = rng.randint(0, 8 // n)
        s = rng.randint(g, 8)
        c = rng.randint(max(s, 1), 8)
        bucket = rng.choice([0, 5 * NS, 60 * NS, 3600 * NS])
        credits = rng.choice([-1, 1_000_000, 20_000_000])
        lines.append(f"campaign {g} {s} {c} {bucket} {credits} 0")
        room.append(g)
    for _ in range(rng.choice([0, 0, 1, 3])):   # nodes of trees (SPEC §14), nested guarantees
        p = rng.randrange(n)
        g = rng.randint(0, room[p])
        room[p] -= g
        s = rng.randint(g, 8)
        c = rng.randint(max(s, 1), 8)
        bucket = rng.choice([0, 5 * NS, 60 * NS, 3600 * NS])
        credits = rng.choice([-1, -1, 1_000_000, 20_000_000])
        lines.append(f"node {p} {g} {s} {c} {bucket} {credits} 0")
        room.append(g)
        n += 1
    t, leases = 0, 0
    for _ in range(rng.randint(5, 40)):
        t += rng.choice([0, NS, 7 * NS, 45 * NS])
        r = rng.random()
        if r < 0.55:
            lo = rng.randint(1, 4)
            hi = rng.randint(lo, 8)
            k = rng.choice([0, 1, 2, 2])   # firm classes: no reclaim (a policy step)
            dur = rng.choice([10, 60, 600]) * NS
            lines.append(f"acquire {rng.randrange(n)} {k} {lo} {hi} {dur} {t}")
            leases += 1
        elif r < 0.7 and leases:
            lines.append(f"renew {rng.randrange(leases)} {rng.choice([5, 30]) * NS} {t}")
        elif r < 0.85 and leases:
            lines.append(f"release {rng.randrange(leases)} {t}")
        elif r < 0.93:
            lines.append(f"advance {t}")
        else:
            lines.append(f"balance {rng.randrange(n)}")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("seed", range(40))
def test_random_scripts_agree(demo, seed):
    script = random_script(random.Random(seed))
    got = run_c(demo, script)
    for backend in BACKENDS:
        py = run_python(script, backend)
        assert got == py, backend + "\n" + "\n".join(
            f"C : {a}\nPy: {b}" for a, b in zip(got, py) if a != b)
