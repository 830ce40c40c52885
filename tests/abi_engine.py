"""A C-ABI engine (``bc_engine_new`` through the cffi binding) for the tests that drive the
core without the Python broker: one held dimension, one class, no congestion, no fee."""

from __future__ import annotations

from typing import Any

import pytest

NS = 10**9
MAXV = 1 << 62


def abi_engine(capacity: int) -> tuple[Any, Any, Any]:
    """(ffi, lib, engine) for a pool of ``capacity`` units: the class table's one class
    firm and unpriced, prices 0, fair-share half-life 1 s, rows never reused. Skips the
    test when the cffi binding is not built."""
    pytest.importorskip("_cffi_backend")
    try:
        from bursarcore._cffi_core import ffi, lib
    except ImportError:
        pytest.skip("the cffi binding is not built")
    cfg = ffi.new("bc_engine_config *")
    keep = [ffi.new("int64_t[]", [capacity]), ffi.new("int64_t[]", [0]),
            ffi.new("int64_t[]", [0]), ffi.new("int64_t[]", [0, 10**6, 0, 0, 0, 0]),
            ffi.new("int64_t[]", [10**6])]
    cfg.dims, cfg.capacity, cfg.headroom, cfg.price = 1, keep[0], keep[1], keep[2]
    cfg.classes, cfg.class_table, cfg.thresholds = 1, keep[3], 0
    cfg.cong_thresholds, cfg.cong_mult = ffi.NULL, keep[4]
    cfg.window_ns, cfg.bins, cfg.instant, cfg.half_life_ns, cfg.reuse_after = NS, 1, 0, NS, -1
    out = ffi.new("bc_engine **")
    assert lib.bc_engine_new(cfg, out) == lib.BC_OK
    return ffi, lib, ffi.gc(out[0], lib.bc_engine_free)
