"""User-facing errors.

Anything the user can fix (a bad path, a bad recipe key, a pair that does not match, a
precision the GPU cannot run) raises :class:`DFlashError`. The CLI prints its message as
one line on stderr and exits with code 2; no traceback.
"""

from __future__ import annotations

import errno
import os


class DFlashError(Exception):
    """A user error: the message says what is wrong and what to do."""

    exit_code = 2


class RecipeError(DFlashError):
    """A recipe file or override is invalid."""


class CheckpointError(DFlashError):
    """A checkpoint is missing, corrupt, or in a format we cannot use."""


class CompatibilityError(DFlashError):
    """A target and drafter do not belong together."""


class HardwareError(DFlashError):
    """A GPU/precision/memory combination cannot work."""


class MissingExtraError(DFlashError):
    """An optional dependency is not installed."""

    def __init__(self, package: str, extra: str, purpose: str):
        super().__init__(
            f"{purpose} needs the '{package}' package: pip install 'dflash-trt[{extra}]'"
        )


def require(module: str, extra: str, purpose: str):
    """Import an optional dependency or raise a one-line error naming the extra."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MissingExtraError(module.split(".")[0], extra, purpose) from exc


def read_text(path, what: str) -> str:
    """A user's text file (recipe, prompts, calibration, a report) as str, or one line naming it:
    missing, unreadable, not a regular file (a FIFO or device is never opened: a read can block
    forever), or not UTF-8 text. ``what`` names it as the user gave it (``--prompts``)."""
    import stat
    from pathlib import Path

    p = Path(path)
    try:
        mode = p.stat().st_mode
        if not stat.S_ISREG(mode):
            raise DFlashError(f"{what} {p}: not a regular file; pass a text file")
        with open(p, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise DFlashError(f"{what} {p}: cannot read it (no such file)") from None
    except OSError as exc:
        raise DFlashError(f"{what} {p}: cannot read it ({exc.strerror or exc})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise DFlashError(f"{what} {p}: not UTF-8 text (byte 0x{data[exc.start]:02x} on line {line})") from None


#: errno values that say the machine refused (space, size limit, name length, permissions), not the program
ENVIRONMENT = {errno.ENOSPC: "no space left on the device", errno.EDQUOT: "disk quota exceeded",
               errno.EFBIG: "file too large for the process's file-size limit (ulimit -f) or the file system",
               errno.ENAMETOOLONG: "file name too long for the file system",
               errno.EROFS: "read-only file system", errno.EACCES: "permission denied", errno.EPERM:
               "operation not permitted", errno.EMFILE: "too many open files", errno.ENOTDIR: "not a directory",
               errno.ELOOP: "too many levels of symbolic links"}


def environment_error(exc: BaseException) -> str | None:
    """One line for an OS refusal anywhere in ``exc``'s chain (``__cause__``/``__context__``), naming
    the path it was about; None when no such ``OSError`` is there (a bug keeps its traceback)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in ENVIRONMENT:
            path = exc.filename2 if exc.filename2 is not None else exc.filename
            where = f"{os.fsdecode(path)}: " if path is not None else ""
            return f"{where}{ENVIRONMENT[exc.errno]} ({errno.errorcode.get(exc.errno, exc.errno)})"
        exc = exc.__cause__ or exc.__context__
    return None
