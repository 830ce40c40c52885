"""The C core through its public C ABI, from a C program: ``examples/c/buckets_demo.c``
built with ``cc`` against ``bursarcore.get_include()`` and ``bursarcore.get_library()``,
run on its own script and on random ones, must report what the reference (the
specification, plain Python) decides for the same operations: statuses, grants, credits,
waits and tokens. The cffi binding's direct calls check the ABI's refusals change nothing.
"""

from __future__ import annotations

import math
import os
import random
import re
import shutil
import subprocess

import numpy as np
import pytest

import bursarcore
from bursarcore import units
from bursarcore.errors import InvalidArgument, TimeWentBackwards
from bursarcore.reference.buckets import TokenBuckets as Reference

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "c")

try:
    LIBRARY = bursarcore.get_library()
except FileNotFoundError:
    LIBRARY = None
needs_library = pytest.mark.skipif(LIBRARY is None, reason="libbursarcore not built "
                                   "(BURSARCORE_NO_EXTENSIONS path without a build)")


def test_include_folder_holds_the_header():
    header = os.path.join(bursarcore.get_include(), "bursarcore.h")
    with open(header, encoding="utf-8") as f:
        text = f.read()
    assert "#define BURSARCORE_ABI_VERSION" in text
    assert "Python.h" not in text


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> str:
    if LIBRARY is None:
        pytest.skip("libbursarcore not built")
    cc = shutil.which(os.environ.get("CC", "cc"))
    assert cc, "a C compiler (cc) is needed to build the C example"
    out = str(tmp_path_factory.mktemp("c") / "buckets_demo")
    subprocess.run([cc, "-std=c11", "-O2", "-Wall", "-Wextra", "-Wpedantic", "-Werror",
                    f"-I{bursarcore.get_include()}", "-o", out,
                    os.path.join(EXAMPLE, "buckets_demo.c"), LIBRARY,
                    f"-Wl,-rpath,{os.path.dirname(LIBRARY)}"], check=True)
    return out


def run_c(demo: str, script: str | None) -> list[str]:
    args = [demo] if script is None else [demo, "-"]
    p = subprocess.run(args, input=script, capture_output=True, text=True, timeout=60,
                       check=True)
    return p.stdout.splitlines()


def run_reference(script: str) -> list[str]:
    """The script on the reference, printed as the C program prints it."""
    b = None
    lines = []
    for line in script.splitlines():
        op, *args = line.split()
        try:
            if op == "append":
                cap, rate, tok, t = map(int, args)
                tokens = None if tok < 0 else tok / units.SCALE
                if b is None:
                    b = Reference([cap / units.SCALE], [rate / units.SCALE],
                                  tokens=None if tokens is None else [tokens], now=0.0)
                    if t != 0:
                        raise AssertionError("the first append is at 0 in these scripts")
                    i = 0
                else:
                    i = b.append(cap / units.SCALE, rate / units.SCALE, tokens, t / units.NS)
                out = f"ok {i}"
            elif op == "debit":
                i, a, t = map(int, args)
                out = f"ok {int(b.try_debit(i, a / units.SCALE, t / units.NS))}"
            elif op == "refund":
                i, a, t = map(int, args)
                out = f"ok {units.to_fixed(b.refund(i, a / units.SCALE, t / units.NS))}"
            elif op == "rate":
                i, r, t = map(int, args)
                b.set_rate(i, r / units.SCALE, t / units.NS)
                out = "ok"
            elif op == "until":
                i, a, t = map(int, args)
                w = b.time_until(i, a / units.SCALE, t / units.NS)
                out = "ok never" if w == math.inf else f"ok {w!r}"
            elif op == "peek":
                (t,) = map(int, args)
                tok = b.tokens(t / units.NS)
                out = " ".join(["ok", *(str(round(x * units.SCALE)) for x in tok)])
            elif op == "batch":
                t = int(args[0])
                pairs = [tuple(map(int, p.split(":"))) for p in args[1:]]
                try:
                    got = b.try_debit_batch(np.array([i for i, _ in pairs], dtype=np.int64),
                                            np.array([a for _, a in pairs]) / units.SCALE,
                                            t / units.NS)
                    out = " ".join(["ok", *(str(int(g)) for g in got)])
                except (InvalidArgument, TimeWentBackwards) as e:
                    raise BatchError(e, pairs, t, b) from None
            else:
                raise AssertionError(op)
        except BatchError as be:
            out = be.status
        except TimeWentBackwards:
            out = "ETIME"
        except InvalidArgument as e:
            out = "EINDEX" if "index out of range" in e.rule else "ERANGE"
        lines.append(f"{op} -> {out}")
    return lines


class BatchError(Exception):
    """A refused batch, with the first offending position as the C ABI reports it."""

    def __init__(self, e: Exception, pairs, t, b) -> None:
        n = len(b)
        bad = next((k for k, (i, _) in enumerate(pairs) if not 0 <= i < n), None)
        if bad is not None:
            self.status = f"EINDEX at {bad}"
        else:
            last = b.state["last"]
            self.status = "ETIME at " + str(next(k for k, (i, _) in enumerate(pairs)
                                                 if t < last[i]))


def same(c_lines: list[str], ref_lines: list[str]) -> None:
    assert len(c_lines) == len(ref_lines)
    for c, r in zip(c_lines, ref_lines):
        if c.startswith("until -> ok ") and not c.endswith("never"):
            ns = int(c.split()[-1])
            assert r == f"until -> ok {ns / units.NS!r}", (c, r)
        else:
            assert c == r


def demo_script() -> str:
    with open(os.path.join(EXAMPLE, "buckets_demo.c"), encoding="utf-8") as f:
        body = f.read().split("static const char *DEMO =", 1)[1].split(";", 1)[0]
    return "".join(s.replace("\\n", "\n") for s in re.findall(r'"([^"]*)"', body))


def test_the_example_reports_what_the_reference_decides(demo):
    script = demo_script()
    assert script.count("\n") >= 10
    got = run_c(demo, None)
    same(got, run_reference(script))
    assert got[2:4] == ["debit -> ok 1", "debit -> ok 0"]
    assert got[-2:] == ["debit -> ETIME", "debit -> EINDEX"]


def random_script(rng: random.Random, steps: int) -> str:
    lines = ["append 10000000 1000000 -1 0"]
    n, t = 1, 0
    for _ in range(steps):
        t += rng.choice([0, 1, 999, 10**6, 10**9, 37 * 10**9])
        when = t if rng.random() > 0.05 else max(0, t - rng.randint(1, 10**9))  # backwards
        i = rng.randrange(n + (1 if rng.random() < 0.05 else 0))            # sometimes bad
        amount = rng.choice([0, 1, 999_999, 10**6, 3 * 10**6, rng.randrange(2 * 10**7)])
        op = rng.choice(["debit"] * 4 + ["refund", "rate", "until", "peek", "batch",
                                          "append"])
        if op == "append":
            cap = rng.choice([0, 10**6, 5 * 10**6, 10**9])
            tok = rng.choice([-1, 0, cap // 2])
            lines.append(f"append {cap} {rng.choice([0, 1, 10**5, 10**6])} {tok} {t}")
            n += 1
        elif op == "rate":
            lines.append(f"rate {i} {rng.choice([0, 1, 10**5, 3 * 10**6])} {when}")
        elif op == "peek":
            lines.append(f"peek {t}")
        elif op == "batch":
            items = " ".join(f"{rng.randrange(n + (rng.random() < 0.03))}:"
                             f"{rng.randrange(4 * 10**6)}" for _ in range(rng.randint(1, 8)))
            lines.append(f"batch {when} {items}")
        else:
            lines.append(f"{op} {i} {amount} {when}")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("seed", range(12))
def test_random_scripts_agree_with_the_reference(demo, seed):
    script = random_script(random.Random(seed), 300)
    same(run_c(demo, script), run_reference(script))


# -- the ABI's refusals, called directly (cffi) -------------------------------------------------
@pytest.fixture(scope="module")
def core():
    pytest.importorskip("_cffi_backend")
    try:
        from bursarcore._cffi_core import ffi, lib
    except ImportError:
        pytest.skip("the cffi binding is not built")
    return ffi, lib


def table(core, n=3):
    ffi, lib = core
    out = ffi.new("bc_buckets **")
    assert lib.bc_buckets_new(0, 0, out) == lib.BC_OK
    b = ffi.gc(out[0], lib.bc_buckets_free)
    for _ in range(n):
        assert lib.bc_buckets_append(b, 10**7, 10**6, -1, 0, ffi.NULL) == lib.BC_OK
    return b


def columns(core, b):
    ffi, lib = core
    n = lib.bc_buckets_len(b)
    cols = [np.zeros(n, dtype=np.int64) for _ in range(5)]
    assert lib.bc_buckets_columns(b, *(ffi.cast("int64_t *", c.ctypes.data) for c in cols),
                                  n) == lib.BC_OK
    return [c.tolist() for c in cols] + [lib.bc_buckets_watermark(b)]


def test_abi_version_and_messages(core):
    ffi, lib = core
    assert lib.bc_abi_version() == lib.BURSARCORE_ABI_VERSION == 1
    for st in (lib.BC_OK, lib.BC_EINVAL, lib.BC_ERANGE, lib.BC_EINDEX, lib.BC_ETIME,
               lib.BC_ENOMEM, lib.BC_ETOKENS):
        assert ffi.string(lib.bc_strerror(st)) not in (b"", b"unknown status")
    assert ffi.string(lib.bc_strerror(12345)) == b"unknown status"


def test_null_handles_are_refused(core):
    ffi, lib = core
    assert lib.bc_buckets_new(0, 0, ffi.NULL) == lib.BC_EINVAL
    g = ffi.new("int *")
    assert lib.bc_buckets_try_debit(ffi.NULL, 0, 1, 0, g) == lib.BC_EINVAL
    assert lib.bc_buckets_len(ffi.NULL) == 0
    lib.bc_buckets_free(ffi.NULL)                       # a no-op, as free(NULL)


@pytest.mark.parametrize("bad", ["index", "time", "amount", "now-range"])
def test_a_refused_batch_changes_nothing(core, bad):
    ffi, lib = core
    b = table(core)
    assert lib.bc_buckets_try_debit(b, 1, 10**6, 5 * 10**9, ffi.new("int *")) == lib.BC_OK
    before = columns(core, b)
    idx = np.array([0, 1, 2, 0], dtype=np.int64)
    amt = np.full(4, 10**6, dtype=np.int64)
    now = np.array([5, 6, 7, 8], dtype=np.int64) * 10**9
    want = {"index": lib.BC_EINDEX, "time": lib.BC_ETIME, "amount": lib.BC_ERANGE,
            "now-range": lib.BC_ERANGE}[bad]
    if bad == "index":
        idx[3] = 3
    elif bad == "time":
        now[:] = [6, 7, 8, 4]                           # bucket 0 at 6 s, then at 4 s
        now *= 10**9
    elif bad == "amount":
        amt[2] = -1
    else:
        now[3] = (1 << 62) + 1
    granted = np.zeros(4, dtype=np.uint8)
    where = ffi.new("size_t *")
    p = lambda a, t="int64_t *": ffi.cast(t, a.ctypes.data)  # noqa: E731
    st = lib.bc_buckets_try_debit_batch(b, p(idx), 4, p(amt), 4, p(now), 4,
                                        p(granted, "uint8_t *"), where)
    assert st == want
    assert where[0] == (2 if bad == "amount" else 3)
    assert columns(core, b) == before


def test_unsorted_times_on_different_buckets_are_allowed(core):
    ffi, lib = core
    b = table(core)
    idx = np.array([0, 1, 0, 1], dtype=np.int64)
    now = np.array([5, 2, 6, 3], dtype=np.int64) * 10**9   # each bucket's own times rise
    amt = np.full(4, 10**6, dtype=np.int64)
    granted = np.zeros(4, dtype=np.uint8)
    p = lambda a, t="int64_t *": ffi.cast(t, a.ctypes.data)  # noqa: E731
    assert lib.bc_buckets_try_debit_batch(b, p(idx), 4, p(amt), 4, p(now), 4,
                                          p(granted, "uint8_t *"), ffi.NULL) == lib.BC_OK
    assert granted.tolist() == [1, 1, 1, 1]
    assert columns(core, b)[4] == [6 * 10**9, 3 * 10**9, 0]


def test_extend_is_all_or_nothing(core):
    ffi, lib = core
    b = table(core, 1)
    before = columns(core, b)
    cap = np.array([5, 6, 7], dtype=np.int64)
    rate = np.array([1, 1, 1], dtype=np.int64)
    tok = np.array([5, 9, 7], dtype=np.int64)            # 9 > 6: the second is refused
    where = ffi.new("size_t *")
    p = lambda a: ffi.cast("int64_t *", a.ctypes.data)  # noqa: E731
    assert lib.bc_buckets_extend(b, p(cap), p(rate), p(tok), 3, 0, where) == lib.BC_ETOKENS
    assert where[0] == 1
    assert columns(core, b) == before
    tok[1] = 6
    assert lib.bc_buckets_extend(b, p(cap), p(rate), p(tok), 3, 0, where) == lib.BC_OK
    assert lib.bc_buckets_len(b) == 4


def test_growth_keeps_every_bucket(core):
    ffi, lib = core
    b = table(core, 0)
    for k in range(5000):                               # many doublings from 16 rows
        assert lib.bc_buckets_append(b, k, 1, -1, 0, ffi.NULL) == lib.BC_OK
    assert columns(core, b)[0] == list(range(5000))


def test_the_f64_batch_converts_as_units_and_decides_as_the_int64_one(core):
    ffi, lib = core
    rng = np.random.default_rng(5)
    n = 2000
    idx = rng.integers(0, 3, n).astype(np.int64)
    amt_f = np.array([round(x, int(k)) for x, k in                 # awkward decimals too
                      zip(rng.uniform(0, 3, n), rng.integers(0, 8, n))])
    now_f = np.sort(rng.uniform(0, 50, n))
    amt_i = np.array([units.to_fixed(float(x)) for x in amt_f], dtype=np.int64)
    now_i = np.array([units.to_ns(float(x)) for x in now_f], dtype=np.int64)
    p = lambda a, t="int64_t *": ffi.cast(t, a.ctypes.data)  # noqa: E731
    a, b = table(core), table(core)
    ga, gb = np.zeros(n, dtype=np.uint8), np.zeros(n, dtype=np.uint8)
    assert lib.bc_buckets_try_debit_batch(a, p(idx), n, p(amt_i), n, p(now_i), n,
                                          p(ga, "uint8_t *"), ffi.NULL) == lib.BC_OK
    assert lib.bc_buckets_try_debit_batch_f64(b, p(idx), n, p(amt_f, "double *"), n,
                                              p(now_f, "double *"), n,
                                              p(gb, "uint8_t *"), ffi.NULL) == lib.BC_OK
    assert ga.tolist() == gb.tolist() and 0 < ga.sum() < n
    assert columns(core, a) == columns(core, b)
    before = columns(core, b)
    for bad_amount, bad_now in ((math.nan, 60.0), (-1e-9, 60.0), (1.0, math.inf),
                                (1.0, math.nan), (5e12, 60.0)):
        x, t = np.array([1.0, bad_amount]), np.array([60.0, bad_now])
        where = ffi.new("size_t *")
        assert lib.bc_buckets_try_debit_batch_f64(
            b, p(idx[:2]), 2, p(x, "double *"), 2, p(t, "double *"), 2,
            p(gb, "uint8_t *"), where) == lib.BC_ERANGE
        assert where[0] == 1
        assert columns(core, b) == before
