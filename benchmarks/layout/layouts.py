"""Build and drive the layout experiment kernels (``_layout.pyx``).

``build()`` compiles ``_layout.pyx`` with pyximport (flags in ``_layout.pyxbld``) into a
temporary build directory, once per machine. ``Table(layout, n)`` holds ``n`` buckets in
one layout and exposes ``debit(idx, amt, t, out)`` and ``state()`` (the five fields as
arrays) so the experiment can check every layout decides identically.
"""

from __future__ import annotations

import os
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
LAYOUTS = ("aos8", "aos8_prefetch", "aos5", "soa")
DESCRIBE = {"aos8": "8 x int64 rows, 64-byte aligned: the product",
            "aos8_prefetch": "aos8 + prefetch 16 ahead",
            "aos5": "5 x int64 rows, unpadded",
            "soa": "5 separate int64 arrays"}
FIELDS = ("capacity", "rate", "tokens", "remainder", "last")


def build():
    """The compiled ``_layout`` module (built on first use)."""
    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    import pyximport

    build_dir = os.path.join(tempfile.gettempdir(), "bursarcore-layout-build")
    importers = pyximport.install(build_dir=build_dir, language_level=3, inplace=False)
    try:
        import _layout
    finally:
        pyximport.uninstall(*importers)
    return _layout


def _aligned_rows(n: int, width: int) -> np.ndarray:
    """(n, width) int64 C-contiguous, first row on a 64-byte boundary (as the product)."""
    buf = np.zeros(n * width + 8, dtype=np.int64)
    off = (-(buf.ctypes.data % 64) // 8) % 8
    return buf[off:off + n * width].reshape(n, width)


class Table:
    """``n`` full buckets with fixed-point ``capacity`` and ``rate`` in one layout."""

    def __init__(self, layout: str, n: int, capacity: int, rate: int, t0: int = 0) -> None:
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}")
        self.layout = layout
        self._mod = build()
        init = (capacity, rate, capacity, 0, t0)
        if layout == "soa":
            self._cols = [np.full(n, v, dtype=np.int64) for v in init]
        else:
            self._rows = _aligned_rows(n, 5 if layout == "aos5" else 8)
            for j, v in enumerate(init):
                self._rows[:, j] = v
        self._fn = getattr(self._mod, f"debit_{layout}")

    def debit(self, idx: np.ndarray, amt: np.ndarray, t: int, out: np.ndarray) -> None:
        if self.layout == "soa":
            self._fn(*self._cols, idx, amt, t, out)
        else:
            self._fn(self._rows, idx, amt, t, out)

    def state(self) -> dict[str, np.ndarray]:
        if self.layout == "soa":
            return {f: c.copy() for f, c in zip(FIELDS, self._cols)}
        return {f: self._rows[:, j].copy() for j, f in enumerate(FIELDS)}
