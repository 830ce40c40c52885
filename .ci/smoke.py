"""Smoke test of an installed bursarcore (run by .ci/wheel-smoke and .ci/min-deps with the
interpreter of a fresh virtualenv, from a folder outside the source tree).

Checks: the package is the installed one, with the version its metadata has; every module
imports (``--allow-missing parsl,numba``: a module that needs one of these absent extras is
reported, not failed); the compiled backend loads; a short simulation runs and writes its
report; the console scripts answer ``--version``; with ``--service``, the app answers a
request in this process and ``bursar serve`` answers one over loopback.
Exit status 0 when everything checked passed.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import os
import pkgutil
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent


def check(ok: bool, what: str) -> None:
    if not ok:
        raise SystemExit(f"smoke: FAILED: {what}")
    print(f"smoke: ok: {what}", flush=True)


def run(argv: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def check_c_abi(work: Path, source: Path) -> None:
    """The installed header and shared library build a C program that runs."""
    import bursarcore

    cc = shutil.which("cc")
    if cc is None:
        print("smoke: skipped: the C example (no cc)")
        return
    demo = source / "examples" / "c" / "buckets_demo.c"
    lib = bursarcore.get_library()
    r = run([cc, "-std=c11", "-Wall", "-Werror", f"-I{bursarcore.get_include()}", "-o",
             str(work / "buckets_demo"), str(demo), lib,
             f"-Wl,-rpath,{os.path.dirname(lib)}"], work)
    check(r.returncode == 0, f"cc builds examples/c/buckets_demo.c against {lib}"
          + ("" if r.returncode == 0 else f"\n{r.stderr}"))
    r = run([str(work / "buckets_demo")], work)
    check(r.returncode == 0 and r.stdout.splitlines()[2] == "debit -> ok 1",
          "the C example runs against the installed library")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", required=True, type=Path,
                    help="the source tree, which must not be what is imported")
    ap.add_argument("--allow-missing", default="", metavar="DIST[,DIST]",
                    help="third-party modules that may be absent (extras not installed)")
    ap.add_argument("--service", action="store_true", help="also exercise the HTTP service")
    a = ap.parse_args()
    allowed = {m for m in a.allow_missing.split(",") if m}
    work = Path(tempfile.mkdtemp(prefix="bursar-smoke-"))
    os.chdir(work)

    import bursarcore

    where = Path(bursarcore.__file__).resolve()
    check(a.source.resolve() not in where.parents, f"bursarcore imported from {where.parent}")
    meta = importlib.metadata.version("bursarcore")
    check(bursarcore.__version__ == meta, f"version {bursarcore.__version__} (metadata {meta})")

    skipped = []
    # every module but the ``__main__`` scripts, which run when imported, and the cffi build
    # script, which reads the core's sources (build inputs: in the sdist, not the wheel)
    modules = [m.name for m in pkgutil.walk_packages(bursarcore.__path__, "bursarcore.")
               if not m.name.endswith(".__main__") and m.name != "bursarcore._cffi_build"]
    for name in modules:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            top = (e.name or "").split(".")[0]
            if top not in allowed:
                raise
            skipped.append(f"{name} (needs {top})")
    check(len(modules) > 50, f"{len(modules) - len(skipped)} of {len(modules)} modules import"
          + (f"; not installed: {', '.join(skipped)}" if skipped else ""))

    backends = bursarcore.available_backends()
    check(backends == ["cython", "cffi", "reference"], f"backends {backends}")
    check_c_abi(work, a.source)
    from bursarcore import Broker, Envelope, Intent, ManualClock, Pool

    b = Broker(Pool(gpu=512), clock=ManualClock(0.0))
    b.register("storm", Envelope(credits=50_000, service_class="agent-burst",
                                 guaranteed={"gpu": 0}, sustained={"gpu": 64},
                                 ceiling={"gpu": 384}, burst={"gpu": 25_000}))
    d = b.acquire(Intent("storm", units={"gpu": (64, 384)}, duration=600))
    check((d.outcome, d.units) == ("granted", 105), f"README's example: {d.outcome} {d.units}")

    for prog in ("bursar", "bursar-run", "bursar-worker"):
        r = run([str(BIN / prog), "--version"], work, timeout=60)
        check(r.returncode == 0 and r.stdout.strip() == f"{prog} {meta}",
              f"{prog} --version: {r.stdout.strip() or r.stderr.strip()}")

    t0 = time.monotonic()
    r = run([str(BIN / "bursar"), "simulate", "--duration", "300", "--out", "report"], work)
    check(r.returncode == 0 and (work / "report" / "report.html").is_file()
          and json.loads((work / "report" / "summary.json").read_text()),
          f"bursar simulate --duration 300 ({time.monotonic() - t0:.1f} s)"
          + ("" if r.returncode == 0 else f"\n{r.stdout}\n{r.stderr}"))

    if a.service:
        from bursarcore.service.testing import InProcessService

        svc = InProcessService({"pool": {"gpu": 8}, "campaigns": {
            "a": {"credits": 100, "ceiling": {"gpu": 8}, "sustained": {"gpu": 8}}}})
        with svc.client() as http:
            r1 = http.post("/v1/campaigns/a/intents", json={"max": 4, "duration": 60},
                           headers=svc.headers("a"))
            r2 = http.post("/v1/campaigns/a/intents", json={"max": 0, "duration": 60},
                           headers=svc.headers("a"))
        check(r1.status_code == 201 and r1.json()["outcome"] == "granted"
              and r2.status_code == 422, f"in-process app: grant {r1.status_code}, "
              f"bad body {r2.status_code}")

        from bursarcore.client import BursarClient

        ready = work / "ready.txt"
        proc = subprocess.Popen(
            [str(BIN / "bursar"), "serve", "--demo", "--memory", "--port", "0",
             "--ready-file", str(ready), "--tokens", str(work / "tokens.json"),
             "--credentials", str(work / "creds.json"), "--log-level", "warning"], cwd=work)
        try:
            deadline = time.monotonic() + 60
            while not (ready.exists() and ready.read_text().strip()):
                if proc.poll() is not None or time.monotonic() > deadline:
                    check(False, f"bursar serve did not start (exit {proc.poll()})")
                time.sleep(0.1)
            url = ready.read_text().strip()
            creds = json.loads((work / "creds.json").read_text())
            name, token = next(iter(creds["campaigns"].items()))
            with BursarClient(url, token) as client:
                health = client.health()
                supply = client.supply(name)
            check(bool(health) and supply is not None, f"bursar serve on {url}: health, "
                  f"supply of {name!r}")
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    shutil.rmtree(work, ignore_errors=True)
    print("smoke: all passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
