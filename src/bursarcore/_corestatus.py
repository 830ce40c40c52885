"""The C core's status codes as the library's exceptions, for both of its bindings
(Cython and cffi), so a refusal reads the same whichever backend made it.

Only the error paths come here: the bindings compare a status with ``BC_OK`` themselves.
"""

from __future__ import annotations

from .errors import InvalidArgument, TimeWentBackwards

__all__ = ["STATUS", "engine_error", "status_error", "time_error", "watermark_error"]

#: status code -> the rule it reports (bursarcore.h)
STATUS = {
    -1: "invalid argument (a NULL pointer or lengths that do not agree)",
    -2: "value out of range",
    -3: "index out of range",
    -4: "time before the last update",
    -5: "out of memory; nothing changed",
    -6: "must be <= capacity",
}


def status_error(status: int, field: str, value: object = None) -> Exception:
    """The exception for a status the edge's own checks did not already turn into one."""
    if status == -5:
        return MemoryError(f"bursarcore: {field}: {STATUS[-5]}")
    rule = STATUS.get(status, f"unknown status {status}")
    if status == -4:
        return TimeWentBackwards(field, rule, value)
    return InvalidArgument(field, rule, value)


def time_error(last_ns: int, t_ns: int) -> TimeWentBackwards:
    """``now`` before one bucket's last update."""
    return TimeWentBackwards("now", f"must be >= the bucket's last update {last_ns / 1e9!r}",
                             t_ns / 1e9)


def watermark_error(wm_ns: int, now: object) -> TimeWentBackwards:
    """``now`` before the newest time any operation on the table used."""
    return TimeWentBackwards("now", f"must be >= the last update {wm_ns / 1e9!r}", now)


def engine_error(err: int, what: object = None) -> Exception:
    """The exception for an error code of the admission engine's kernels (``BC_E_*`` of
    core/src/engine.h), the same whichever binding called them. These are broken
    preconditions of the engine (the broker validates its input and grows the state before
    it asks), not refusals."""
    if err == -1:
        return IndexError("lease store full: call EngineState.grow_leases first")
    if err == -2:
        return IndexError("slot arena full: call EngineState.grow_leases first")
    if err == -3:
        return IndexError(f"too few free slots to place {what}")
    if err == -4:
        return IndexError(f"lease {what} would overfill its dimension's free-slot stack")
    if err == -6:
        return ZeroDivisionError("integer division or modulo by zero (duration 0)")
    if err == -7:
        return IndexError(f"index out of range: {what}")
    if err == -8:
        return OverflowError("price_pm does not fit int64 (price x multipliers too large)")
    if err == -9:
        return IndexError("heap_pop from an empty expiry heap")
    if err == -10:
        return IndexError(f"lease {what} has already ended")
    return RuntimeError(f"bursarcore: unexpected engine error code {err}")
