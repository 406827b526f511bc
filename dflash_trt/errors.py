"""User-facing errors.

Anything the user can fix (a bad path, a bad recipe key, a pair that does not match, a
precision the GPU cannot run) raises :class:`DFlashError`. The CLI prints its message as
one line on stderr and exits with code 2; no traceback.
"""

from __future__ import annotations

import contextlib
import errno
import importlib
import os
import shutil
import stat
from pathlib import Path


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
        super().__init__(f"{purpose} needs the '{package}' package: pip install 'dflash-trt[{extra}]'")


def require(module: str, extra: str, purpose: str):
    """Import an optional dependency or raise a one-line error naming the extra."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MissingExtraError(module.split(".")[0], extra, purpose) from exc


def read_text(path, what: str) -> str:
    """A user's text file (recipe, prompts, calibration, a report) as str, or one line naming it:
    missing, unreadable, not a regular file (a FIFO or device is never opened: a read can block
    forever), or not UTF-8 text. ``what`` names it as the user gave it (``--prompts``)."""
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
        line = data[: exc.start].count(b"\n") + 1
        raise DFlashError(f"{what} {p}: not UTF-8 text (byte 0x{data[exc.start]:02x} on line {line})") from None


#: errno values that say the machine refused (space, size limit, name length, permissions), not the program
ENVIRONMENT = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EFBIG: "file too large for the process's file-size limit (ulimit -f) or the file system",
    errno.ENAMETOOLONG: "file name too long for the file system",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.EMFILE: "too many open files",
    errno.ENOTDIR: "not a directory",
    errno.ELOOP: "too many levels of symbolic links",
}


def os_refusal(exc: BaseException) -> OSError | None:
    """The ``OSError`` with an :data:`ENVIRONMENT` errno anywhere in ``exc``'s chain
    (``__cause__``/``__context__``, and the per-rank ``failures`` torch's ``CheckpointException``
    carries), or None."""
    seen: set[int] = set()
    todo: list = [exc]
    while todo:
        e = todo.pop(0)
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, tuple):  # DCP's wrapped exception: (exception, traceback summary)
            todo.extend(x for x in e if isinstance(x, BaseException))
            continue
        if isinstance(e, OSError) and e.errno in ENVIRONMENT:
            return e
        failures = getattr(e, "failures", None)
        if isinstance(failures, dict):
            todo.extend(failures.values())
        if isinstance(e, BaseException):
            todo.extend((e.__cause__, e.__context__))
    return None


def environment_error(exc: BaseException) -> str | None:
    """One line for an OS refusal in ``exc``'s chain (:func:`os_refusal`), naming the path it was
    about; None when there is none (a bug keeps its traceback)."""
    e = os_refusal(exc)
    if e is None:
        return None
    path = e.filename2 if e.filename2 is not None else e.filename
    where = f"{os.fsdecode(path)}: " if path is not None else ""
    return f"{where}{ENVIRONMENT[e.errno]} ({errno.errorcode.get(e.errno, e.errno)})"


def discard_on_error(path):
    """A context for writing the temporary ``path`` (a file or a folder, renamed into place when the
    block succeeds): any failure inside removes it, so a full disk or a file-size limit leaves
    nothing half-written behind; an OS refusal that names no file (a library writing in Rust or
    C++) is raised again naming ``path``. Usage: ``with discard_on_error(tmp): write(tmp); ...``."""

    @contextlib.contextmanager
    def guard():
        try:
            yield
        except BaseException as exc:
            p = Path(path)
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    p.unlink()
            refused = os_refusal(exc)
            if refused is not None and refused.filename is None:
                raise OSError(refused.errno, refused.strerror or os.strerror(refused.errno), str(p)) from exc
            raise

    return guard()
