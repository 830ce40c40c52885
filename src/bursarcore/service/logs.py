"""Logging for ``bursar serve``: one configuration for bursar's own loggers and uvicorn's
(``uvicorn.error``, ``uvicorn.access``), as text or as JSON lines (``--log-format json``).

The same :func:`log_config` dictionary is applied with :func:`logging.config.dictConfig`
before the journal is opened and handed to uvicorn as its ``log_config``, so every line
the process writes has the one format. A JSON line is one object with ``time`` (UTC, ISO
8601 with milliseconds), ``level``, ``logger`` and ``message``; an access line adds
``client``, ``method``, ``path``, ``http_version`` and ``status`` as fields of their own;
an exception adds ``exc_info`` (the traceback as one string). The formatter is this
module's twenty lines rather than a dependency: it needs nothing beyond :mod:`json`.
Request headers are never logged (uvicorn's access line has none), so neither are tokens.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
from typing import Any

__all__ = ["JsonFormatter", "log_config"]

# uvicorn's access record: args = (client_addr, method, full_path, http_version, status)
_ACCESS_FIELDS = ("client", "method", "path", "http_version", "status")


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (newlines inside strings are escaped)."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": _dt.datetime.fromtimestamp(record.created, _dt.timezone.utc)
                    .isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.name == "uvicorn.access" and isinstance(record.args, tuple) \
                and len(record.args) == len(_ACCESS_FIELDS):
            doc.update(zip(_ACCESS_FIELDS, record.args))
        if record.exc_info:
            doc["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str, ensure_ascii=False)


_TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def log_config(level: str = "info", fmt: str = "text") -> dict[str, Any]:
    """A :func:`logging.config.dictConfig` dictionary: every line to stderr in ``fmt``
    (``"text"`` or ``"json"``) at ``level`` for bursar's and uvicorn's loggers."""
    if fmt not in ("text", "json"):
        raise ValueError(f"log format must be 'text' or 'json' (got {fmt!r})")
    formatter: dict[str, Any] = ({"()": f"{__name__}.JsonFormatter"} if fmt == "json"
                                 else {"format": _TEXT})
    lvl = level.upper()
    handler = {"class": "logging.StreamHandler", "formatter": "bursar",
               "stream": "ext://sys.stderr"}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"bursar": formatter},
        "handlers": {"stderr": handler},
        "loggers": {
            "bursarcore": {"handlers": ["stderr"], "level": lvl, "propagate": False},
            "uvicorn": {"handlers": ["stderr"], "level": lvl, "propagate": False},
            "uvicorn.error": {"level": lvl},
            "uvicorn.access": {"handlers": ["stderr"], "level": lvl, "propagate": False},
        },
        # anything else (a library's warnings) in the same format
        "root": {"handlers": ["stderr"], "level": "WARNING"},
    }
