"""Where a bundle is written: the ``-o`` checks, the lock, the ``.partial`` build directory, the swap.

Invariants:

- **exclusive**: a build holds ``fcntl.flock`` on ``.NAME.lock`` beside the output (inside it
  when only the output itself is writable) from the checks to the swap; a second build to the
  same output fails at once in one line (:func:`lock`).
- **nothing half-written**: a build writes into ``.NAME.partial-PID`` beside the output (or
  ``OUT/.dflash-trt.partial-PID`` when the parent is not writable: a container volume's mount
  point); the next build of the same output sweeps partial directories whose process is gone.
- **only a bundle's own files**: a new output is renamed into place (atomic). An existing one
  (``--force``, a mount point, an immutable directory: nothing that needs renaming the output
  itself) is swapped file by file: the previous bundle's files as its manifest lists them
  (format 3 ``files``) are removed, the new files moved in, the manifest last. A file that is
  not the previous bundle's (one that appeared during the build) is never deleted; one the new
  bundle would overwrite stops the swap before anything changes, the built bundle kept.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
from pathlib import Path

from dflash_trt import ingest
from dflash_trt.deploy.siblings import PID_ROOM, sibling
from dflash_trt.errors import DFlashError


def check_output(out: Path, force: bool) -> None:
    """``-o`` may name a new path, an empty directory, or (with --force) an existing bundle; never
    a file or a directory of the user's, which --force would otherwise delete."""
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise DFlashError(f"-o {out}: exists and is not a directory; choose another -o")
    if out.is_dir() and any(not p.name.startswith(INSIDE) for p in out.iterdir()):
        if not (out / ingest.Layout.MANIFEST).is_file():
            raise DFlashError(f"-o {out}: a directory that is not a dflash-trt bundle (no {ingest.Layout.MANIFEST}); "
                              "--force only replaces bundles: choose another -o")
        if not force:
            raise DFlashError(f"{out} exists; pass --force to replace it, or choose another -o")
        previous_files(out)   # refused now, before any work, when it does not list its files
    parent = next((p for p in (out.parent, *out.parent.parents) if p.exists()), Path("."))
    if not parent.is_dir():
        raise DFlashError(f"-o {out}: {parent} is a file, not a directory")
    where = out if out.is_dir() else parent   # an existing output directory is written inside
    if not os.access(where, os.W_OK | os.X_OK):
        raise DFlashError(f"-o {out}: {where} is not writable")


INSIDE = ".dflash-trt"   # the lock and partial names used inside OUT when its parent is read-only


def _beside(out: Path) -> bool:
    """Whether the lock and partial go beside ``out`` (its parent writable), else inside it."""
    parent = out.parent
    if not parent.exists():
        return True   # created by start_partial's mkdir (check_output vetted the ancestor)
    return os.access(parent, os.W_OK | os.X_OK) or not out.is_dir()


@contextlib.contextmanager
def lock(out: Path):
    """Hold the output's build lock (``fcntl.flock``, released by the kernel if the build dies);
    a second build to the same output raises one line instead of replacing the first one's work.
    The lock file is removed on release (so it leaves nothing behind); a build that locked a file
    already unlinked by the previous holder opens the new one again."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        path = out.parent / sibling(out.name, "lock") if _beside(out) else out / f"{INSIDE}.lock"
    except OSError as exc:
        raise DFlashError(f"-o {out}: cannot write there ({exc.strerror or exc})") from None
    fd = _acquire(out, path)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        with contextlib.suppress(OSError):
            path.unlink()
        os.close(fd)


def _acquire(out: Path, path: Path) -> int:
    import fcntl

    for _ in range(10):
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise DFlashError(f"-o {out}: cannot write there ({exc.strerror or exc})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise DFlashError(f"-o {out}: another build is writing there (pid {holder}); wait for it to finish "
                              "or choose another -o") from None
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)   # the previous holder removed it as we locked: open the current one
    raise DFlashError(f"-o {out}: cannot take the build lock {path}")


def start_partial(out: Path) -> Path:
    """A fresh partial build directory for ``out`` (beside it, else inside it); partial builds of
    the same output left by a killed build (their process is gone) are removed first: they are
    model-sized."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        where, prefix = ((out.parent, sibling(out.name, "partial-", PID_ROOM)) if _beside(out)
                         else (out, f"{INSIDE}.partial-"))
        for stale in where.glob(f"{prefix}*"):
            pid = stale.name.rsplit("-", 1)[-1]
            if stale.is_dir() and not (pid.isdigit() and _alive(int(pid))):
                shutil.rmtree(stale, ignore_errors=True)
        tmp = where / f"{prefix}{os.getpid()}"
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


# rename(2) errors that mean "this directory cannot be renamed": swap its contents instead
_NO_RENAME = (errno.EBUSY, errno.EXDEV, errno.EPERM, errno.EACCES, errno.EROFS, errno.ENOTEMPTY, errno.EEXIST)


def replace(tmp: Path, out: Path) -> None:
    """Put the bundle built in ``tmp`` at ``out``: renamed into place when ``out`` does not exist,
    else (or where the rename is refused) swapped file by file (:func:`swap_contents`)."""
    if not out.exists() and tmp.parent != out:
        try:
            tmp.rename(out)
            return
        except OSError as exc:
            if exc.errno not in _NO_RENAME:
                raise DFlashError(f"-o {out}: cannot move the build into place ({exc.strerror or exc}); "
                                  f"the built bundle is kept in {tmp}") from None
    swap_contents(tmp, out)


def _files(root: Path, skip: Path | None = None) -> list[str]:
    """Every entry under ``root`` that is not a directory (POSIX paths; a symlink to a directory
    counts as a file), not descending into ``skip``."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        d = Path(dirpath)
        links = [n for n in dirnames if (d / n).is_symlink()]
        dirnames[:] = [n for n in dirnames if n not in links and d / n != skip]
        out += [(d / n).relative_to(root).as_posix() for n in filenames + links]
    return out


def previous_files(out: Path) -> set[str]:
    """The previous bundle's own files at ``out`` (its manifest's format 3 ``files`` and the
    manifest itself); empty when ``out`` holds no manifest. A manifest that lists no files (an
    older format) is refused: nothing says which files are the bundle's."""
    from dflash_trt import ingest

    path = out / ingest.Layout.MANIFEST
    if not path.is_file():
        return set()
    try:
        files = json.loads(path.read_text()).get("files")
    except (OSError, ValueError, AttributeError) as exc:
        raise DFlashError(f"-o {out}: cannot read its {path.name} ({exc}); remove the old bundle yourself "
                          "or choose another -o") from None
    if not isinstance(files, dict) or not all(isinstance(k, str) for k in files):
        raise DFlashError(f"-o {out}: its {path.name} lists no files (a bundle older than format 3), so which "
                          "files are the bundle's is unknown; remove it yourself or choose another -o")
    return {*files, path.name}


def swap_contents(tmp: Path, out: Path) -> None:
    """Replace the previous bundle's files in ``out`` by ``tmp``'s, keeping every other file.

    Checked before anything changes: a file in ``out`` that is not the previous bundle's and that
    the new bundle would overwrite refuses the swap (the build stays in ``tmp``). The manifest
    moves last, so a swap cut short leaves no manifest that vouches for a mix."""
    from dflash_trt import ingest

    keep = f"the built bundle is kept in {tmp}"
    try:
        out.mkdir(exist_ok=True)
        old = previous_files(out)
        new = _files(tmp)
        others = set(_files(out, skip=tmp)) - old - {p.name for p in out.glob(f"{INSIDE}.*")}
        clash = sorted(others & set(new))
        if clash:
            raise DFlashError(f"-o {out}: {clash[0]} is not the previous bundle's file and the new bundle would "
                              f"overwrite it; move it away and build again; {keep}")
        for rel in sorted(old):
            with contextlib.suppress(FileNotFoundError):
                (out / rel).unlink()
        _prune_dirs(out, {str(Path(rel).parent) for rel in old})
        manifest = ingest.Layout.MANIFEST
        for rel in sorted(new, key=lambda r: r == manifest):
            dst = out / rel
            for d in reversed([q for q in dst.parents if out in q.parents]):
                if not d.is_dir():
                    d.mkdir()
                    d.chmod(0o755)   # as share() left them in tmp
            shutil.move(str(tmp / rel), str(dst))
        shutil.rmtree(tmp, ignore_errors=True)
    except OSError as exc:
        raise DFlashError(f"-o {out}: cannot swap the bundle in ({exc.strerror or exc}; "
                          f"{getattr(exc, 'filename', '') or ''}); {keep}") from None


def _prune_dirs(out: Path, dirs: set[str]) -> None:
    """Remove the directories the previous bundle's files leave empty (deepest first)."""
    for d in sorted(dirs, key=lambda d: -len(Path(d).parts)):
        for p in [out / d, *(out / d).parents]:
            if p == out or out not in p.parents:
                break
            try:
                p.rmdir()
            except OSError:
                break
