"""Logging for dflash-trt: one root handler on stderr, plain text or JSON lines, and where a bug's
traceback is written.

Invariant: a record never carries a secret or a prompt unless the code that logs it says so:
nothing here adds request headers, bodies or the API key, and the modules that log (``serve/``,
``runtime/``) log request ids, stages and exceptions, never prompt text. Each module logs through
``logger = logging.getLogger(__name__)``; :func:`configure` (``serve --log-level --log-format``)
sets the level and format for them, uvicorn's error and access loggers included.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("text", "json")
#: loggers uvicorn writes through: configured like ours so its access log follows --log-format
UVICORN = ("uvicorn", "uvicorn.error", "uvicorn.access")


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, and the traceback when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            out["traceback"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def formatter(fmt: str) -> logging.Formatter:
    if fmt == "json":
        return JsonFormatter()
    return logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")


class _Stderr(logging.StreamHandler):
    """A handler on whatever ``sys.stderr`` is when a record is written (a test's capture that
    ended, or a replaced stream, is never written to)."""

    @property  # type: ignore[override]
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


def configure(level: str = "info", fmt: str = "text") -> logging.Handler:
    """dflash-trt's and uvicorn's loggers at ``level``, through one stderr handler in ``fmt``."""
    handler = _Stderr()
    handler.setFormatter(formatter(fmt))
    for name in ("dflash_trt", *UVICORN):
        lg = logging.getLogger(name)
        lg.handlers, lg.propagate = [handler], False
        lg.setLevel(level.upper())
    return handler


def uvicorn_log_config(level: str, fmt: str) -> dict:
    """uvicorn's ``log_config``: its loggers through the same format (access lines too)."""
    cls = f"{JsonFormatter.__module__}.{JsonFormatter.__qualname__}" if fmt == "json" else None
    f = {"()": cls} if cls else {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"default": f},
        "handlers": {
            "default": {"class": "logging.StreamHandler", "formatter": "default", "stream": "ext://sys.stderr"}
        },
        "loggers": {name: {"handlers": ["default"], "level": level.upper(), "propagate": False} for name in UVICORN},
    }


def write_traceback(exc: BaseException) -> Path | None:
    """The full traceback of ``exc`` in a new file under the user's temp directory (never inside
    an output or a bundle directory); None when it cannot be written."""
    try:
        fd, name = tempfile.mkstemp(prefix=f"dflash-trt-bug-{time.strftime('%Y%m%d-%H%M%S')}-", suffix=".txt")
        with os.fdopen(fd, "w") as f:
            f.write(f"argv: {sys.argv!r}\n")
            f.write("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
        return Path(name)
    except OSError:
        return None
