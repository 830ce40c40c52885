"""The C core's status codes as the library's exceptions, for both of its bindings
(Cython and cffi), so a refusal reads the same whichever backend made it.

Only the error paths come here: the bindings compare a status with ``BC_OK`` themselves.
"""

from __future__ import annotations

from .errors import InvalidArgument, TimeWentBackwards

__all__ = ["STATUS", "status_error", "time_error", "watermark_error"]

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
