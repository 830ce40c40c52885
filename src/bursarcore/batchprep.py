"""Column passes around ``Broker.admit_batch``'s compiled loop, with one pure-Python
specification and a compiled twin (``bursarcore._batchprep``) that must return the same.

After the loop has run, a batch's own columns are no longer in cache, and each numpy pass
over one (a comparison, a cast, a reduction) costs as much as a fused loop doing the
work of several: these helpers are those fused loops.

:func:`minmax` is the least and greatest item of an int64 column, in one pass (the range
checks of ``campaign_idx`` and ``units``).

:func:`finish` turns the loop's lease column into the batch's outcome column (1 where an
item has no lease — refused, unless the single path said pending, which the caller
writes after — and 0 where it has one) and its intent ids ``iid0 + j``, and sets the
units of an item without a lease to 0 (a refusal's units are what the rules allowed).
"""

from __future__ import annotations

import numpy as np

from . import _backend

__all__ = ["minmax", "finish", "reference_minmax", "reference_finish", "BACKEND"]


def _column(a: object, write: bool = False) -> np.ndarray:
    if (type(a) is not np.ndarray or a.dtype != np.int64 or a.ndim != 1
            or not a.flags.c_contiguous or (write and not a.flags.writeable)):
        raise TypeError("expected a contiguous one-dimensional int64 numpy array"
                        + (" (writeable)" if write else ""))
    return a


def reference_minmax(a: np.ndarray) -> tuple[int, int]:
    """(least, greatest) item of a non-empty contiguous 1-D int64 array."""
    a = _column(a)
    if a.shape[0] == 0:
        raise ValueError("minmax of an empty array")
    return int(a.min()), int(a.max())


def reference_finish(out_n: np.ndarray, out_l: np.ndarray,
                     iid0: int) -> tuple[np.ndarray, np.ndarray]:
    """(outcome, intent): outcome 1 where ``out_l < 0`` (no lease: refused) and 0
    elsewhere, intent ids ``iid0 + j``; ``out_n`` is set to 0 where ``out_l < 0``."""
    out_n, out_l = _column(out_n, True), _column(out_l)
    n = out_l.shape[0]
    if out_n.shape[0] != n:
        raise ValueError("finish: out_n and out_l differ in length")
    none = out_l < 0
    out_n[none] = 0
    return none.astype(np.int64), np.arange(iid0, iid0 + n, dtype=np.int64)


_ext = _backend.compiled("_batchprep")
BACKEND = "compiled" if _ext is not None else "reference"
minmax = _ext.minmax if _ext is not None else reference_minmax
finish = _ext.finish if _ext is not None else reference_finish
