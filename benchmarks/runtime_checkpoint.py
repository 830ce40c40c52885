"""Checkpoint save and restore times for workspaces of incompressible data (SPEC §13; the
RASER bar is checkpoint/restore under 30 s).

    python benchmarks/runtime_checkpoint.py [--sizes 10 100] [--repeat 3] [--dir DIR]

Each workspace holds ``size`` MB of ``os.urandom`` bytes spread over 8 files in two
directories, plus a 1 MB agent state. *save* is :meth:`CheckpointStore.save` (tar, sha256,
fsync, rename, prune); *restore* is :meth:`CheckpointStore.restore` (verify the sha256,
empty the workspace, extract with the ``data`` filter). Prints a markdown table of the
median and worst of ``--repeat`` runs. The page cache is warm (the archive was just
written), as it is when a requeued task restarts on the node that saved it; a cold read
from a shared filesystem adds ``size / bandwidth``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

from bursarcore.runtime.checkpoint import CheckpointStore


def make_workspace(path: str, size_mb: int) -> None:
    per = size_mb * 2**20 // 8
    for i in range(8):
        d = os.path.join(path, f"dir{i % 2}")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"blob{i}.bin"), "wb") as f:
            left = per
            while left:
                n = min(left, 4 << 20)
                f.write(os.urandom(n))
                left -= n


def bench(size_mb: int, repeat: int, base: str) -> dict[str, list[float]]:
    root = tempfile.mkdtemp(prefix=f"ckpt-bench-{size_mb}-", dir=base)
    try:
        ws = os.path.join(root, "ws")
        os.makedirs(ws)
        make_workspace(ws, size_mb)
        state = os.urandom(1 << 20)
        store = CheckpointStore(os.path.join(root, "ck"), keep=2)
        out: dict[str, list[float]] = {"save": [], "restore": []}
        for _ in range(repeat):
            t0 = time.perf_counter()
            ck = store.save(ws, state)
            out["save"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            got = store.restore(ws)
            out["restore"].append(time.perf_counter() - t0)
            assert got is not None and got[0].seq == ck.seq and got[1] == state
        out["archive_mb"] = [ck.size / 2**20]
        return out
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10, 100], help="workspace sizes, MB")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where to put workspace and checkpoints "
                    "(default: the system temp dir)")
    a = ap.parse_args(argv)
    print(f"command: python {' '.join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])])}")
    print()
    print("| workspace | archive | save median (worst) | restore median (worst) |")
    print("|---|---|---|---|")
    for mb in a.sizes:
        r = bench(mb, a.repeat, a.dir or tempfile.gettempdir())
        print(f"| {mb} MB | {r['archive_mb'][0]:.1f} MB "
              f"| {statistics.median(r['save']):.3f} s ({max(r['save']):.3f} s) "
              f"| {statistics.median(r['restore']):.3f} s ({max(r['restore']):.3f} s) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
