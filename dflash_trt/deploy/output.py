"""Where a bundle is written: the ``-o`` checks, the ``.partial`` build directory, the atomic swap.

A build writes into ``.NAME.partial-PID`` beside the output and renames it into place at the
end, so an interrupted build leaves no half-written bundle; the next build of the same output
sweeps partial directories whose process is gone. ``--force`` replaces only a dflash-trt bundle.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from dflash_trt import ingest
from dflash_trt.errors import DFlashError


def check_output(out: Path, force: bool) -> None:
    """``-o`` may name a new path, an empty directory, or (with --force) an existing bundle; never
    a file or a directory of the user's, which --force would otherwise delete."""
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise DFlashError(f"-o {out}: exists and is not a directory; choose another -o")
    if out.is_dir() and any(out.iterdir()):
        if not (out / ingest.Layout.MANIFEST).is_file():
            raise DFlashError(f"-o {out}: a directory that is not a dflash-trt bundle (no {ingest.Layout.MANIFEST}); "
                              "--force only replaces bundles: choose another -o")
        if not force:
            raise DFlashError(f"{out} exists; pass --force to replace it, or choose another -o")
    parent = next((p for p in (out.parent, *out.parent.parents) if p.exists()), Path("."))
    if not parent.is_dir():
        raise DFlashError(f"-o {out}: {parent} is a file, not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise DFlashError(f"-o {out}: {parent} is not writable")


def start_partial(out: Path) -> Path:
    """A fresh ``.NAME.partial-PID`` beside ``out``; partial builds of the same output left by a
    killed build (their process is gone) are removed first: they are model-sized."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        for stale in out.parent.glob(f".{out.name}.partial-*"):
            pid = stale.name.rsplit("-", 1)[-1]
            if stale.is_dir() and not (pid.isdigit() and _alive(int(pid))):
                shutil.rmtree(stale, ignore_errors=True)
        tmp = out.parent / f".{out.name}.partial-{os.getpid()}"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
    except OSError as exc:
        raise DFlashError(f"-o {out}: cannot write there ({exc.strerror or exc})") from None
    return tmp


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def share(root: Path) -> None:
    """Bundle files readable by other users and containers: temporary directories and some writers
    create 0700/0600 entries; directories become 0755, files 0644 (0755 if executable)."""
    for p in [root, *root.rglob("*")]:
        if p.is_symlink():
            continue
        mode = p.stat().st_mode
        p.chmod(0o755 if p.is_dir() or mode & 0o100 else 0o644)


def replace(tmp: Path, out: Path) -> None:
    old = None
    if out.exists():
        old = out.parent / f".{out.name}.old-{os.getpid()}"
        out.rename(old)
    tmp.rename(out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
