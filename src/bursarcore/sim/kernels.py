"""Per-step kernels of the population agents: numpy always, numba when installed.

``step(queue, prev, held, arrivals, io_factor, tokens, s, b, B, lease, dt, greedy, mult,
want, done)`` advances every campaign of a population by one step, in place. ``prev`` is
what each campaign held during the step that just ended, ``held`` what it holds now:

* work done = min(queue, prev · dt · io_factor) GPU-seconds; the queue shrinks by it and
  grows by the step's arrivals;
* the token estimate refilled at (s − prev)⁺ per second, capped at B (the prepaid rule of
  SPEC §4.2, mirrored by the agent so it never asks for what its bucket cannot pay);
* ``want`` = the GPUs to ask for: enough to clear the queue within one lease, within the
  ceiling, within sustained plus what the tokens cover for a lease — and, for a campaign
  that reads supply (not ``greedy``), nothing while the congestion multiplier is above 1.5.

The numba and numpy versions do the same IEEE operations element by element (no
reductions), so they give identical arrays; tests check that. ``BURSARCORE_NO_NUMBA=1``
forces numpy.
"""

from __future__ import annotations

import os

import numpy as np

__all__ = ["step_numpy", "step_numba", "numba_available", "get_step"]


def step_numpy(queue, prev, held, arrivals, io_factor, tokens, s, b, B, lease, dt, greedy,
               mult, want, done):
    cap = prev * dt * io_factor
    d = np.minimum(queue, cap)
    done[:] = d
    queue -= d
    queue += arrivals
    refill = np.maximum(s - prev, 0.0) * dt
    np.minimum(tokens + refill, B, out=tokens)
    need = np.ceil(queue / lease)
    room_tok = np.maximum(s - held, 0.0) + np.floor(tokens / lease)
    w = np.minimum(np.minimum(need - held, b - held), room_tok)
    w = np.maximum(w, 0.0)
    w = np.where((greedy == 0) & (mult > 1.5), 0.0, w)
    want[:] = w.astype(np.int64)


_numba_step = None


def _build_numba():
    global _numba_step
    if _numba_step is not None:
        return _numba_step
    import numba

    @numba.njit(cache=False, nogil=True)
    def _step(queue, prev, held, arrivals, io_factor, tokens, s, b, B, lease, dt, greedy,
              mult, want, done):
        n = queue.shape[0]
        for i in range(n):
            cap = prev[i] * dt * io_factor[i]
            q = queue[i]
            d = q if q < cap else cap
            done[i] = d
            q = q - d
            q = q + arrivals[i]
            queue[i] = q
            r = s[i] - prev[i]
            if r < 0.0:
                r = 0.0
            tk = tokens[i] + r * dt
            if tk > B[i]:
                tk = B[i]
            tokens[i] = tk
            need = np.ceil(q / lease)
            r = s[i] - held[i]
            if r < 0.0:
                r = 0.0
            room = r + np.floor(tk / lease)
            w = need - held[i]
            x = b[i] - held[i]
            if x < w:
                w = x
            if room < w:
                w = room
            if w < 0.0:
                w = 0.0
            if greedy[i] == 0 and mult > 1.5:
                w = 0.0
            want[i] = np.int64(w)

    _numba_step = _step
    return _step


def numba_available() -> bool:
    if os.environ.get("BURSARCORE_NO_NUMBA", "").strip() not in ("", "0"):
        return False
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True


def step_numba(*args):
    return _build_numba()(*args)


def get_step(use_numba: bool | None):
    """The kernel: numba if asked (True) or available (None); numpy otherwise."""
    if use_numba is None:
        use_numba = numba_available()
    if use_numba:
        if not numba_available():
            raise RuntimeError("numba is not installed: pip install 'bursarcore[numba]'")
        return step_numba, "numba"
    return step_numpy, "numpy"
