"""Where a bundle is written: the ``-o`` checks, the lock, the ``.partial`` build directory, the swap.

Invariants:

- **exclusive**: every writer of a bundle (``build``, ``tune``) holds ``fcntl.flock`` on
  ``.NAME.lock`` beside the output (inside it when only the output itself is writable; NAME
  shortened with a hash when the output's name is too long to carry a suffix) from its checks to
  its last write; the file names its holder (pid, host, command), and a second writer fails at
  once in one line naming it (:func:`lock`). The kernel drops the lock of a killed process, so a
  lock file left behind never blocks.
- **nothing half-written**: a build writes into ``.NAME.partial-PID`` beside the output (or
  ``OUT/.dflash-trt.partial-PID`` when the parent is not writable: a container volume's mount
  point); the next writer of the same output first finishes or rolls back a swap a killed
  process left (:func:`deploy.swap.recover_swap`), then sweeps partial directories whose process is gone.
- **only a bundle's own files**: a new output is renamed into place (atomic). An existing one
  (``--force``, a mount point, an immutable directory: nothing that needs renaming the output
  itself) is swapped file by file through a journal (:mod:`dflash_trt.deploy.swap`): the previous
  bundle's files as its manifest lists them (format 3 ``files``) leave, the new files come, the
  manifest last. A file that is not the previous bundle's (one that appeared during the build) is
  never deleted; one the new bundle would overwrite stops the swap before anything changes, the
  built bundle kept. Every name is confined to the output, and no directory on the way is a symlink.
- **shared, not widened**: files the build creates are made readable by all (:func:`share`); a
  file copied from a checkpoint keeps at most its source's mode.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import shutil
import signal
import socket
import sys
import threading
from pathlib import Path

from dflash_trt import ingest
from dflash_trt.deploy import swap
from dflash_trt.errors import DFlashError


def check_output(out: Path, force: bool) -> None:
    """``-o`` may name a new path, an empty directory, or (with --force) an existing bundle; never
    a file or a directory of the user's, which --force would otherwise delete. A bundle a killed
    swap left (its journal present) passes: the build finishes or rolls it back under the lock."""
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise DFlashError(f"-o {out}: exists and is not a directory; choose another -o")
    pending = os.path.lexists(out / swap.JOURNAL)
    if out.is_dir() and not pending and any(not p.name.startswith(INSIDE) for p in out.iterdir()):
        if not (out / ingest.Layout.MANIFEST).is_file():
            raise DFlashError(
                f"-o {out}: a directory that is not a dflash-trt bundle (no {ingest.Layout.MANIFEST}); "
                "--force only replaces bundles: choose another -o"
            )
        if not force:
            raise DFlashError(f"{out} exists; pass --force to replace it, or choose another -o")
        previous_files(out)  # refused now, before any work, when it does not list its files
    parent = next((p for p in (out.parent, *out.parent.parents) if p.exists()), Path("."))
    if not parent.is_dir():
        raise DFlashError(f"-o {out}: {parent} is a file, not a directory")
    where = out if out.is_dir() else parent  # an existing output directory is written inside
    if not os.access(where, os.W_OK | os.X_OK):
        raise DFlashError(f"-o {out}: {where} is not writable")


INSIDE = ".dflash-trt"  # the lock and partial names used inside OUT when its parent is read-only
_LONG = 96  # bytes of a name kept whole in ``.NAME.lock`` / ``.NAME.partial-PID``


def short_name(name: str) -> str:
    """``name``, or for one too long to carry the lock and partial suffixes (NAME_MAX is 255 bytes),
    its first characters and a hash of the whole: one output, one lock, whatever its name's length."""
    raw = name.encode()
    if len(raw) <= _LONG:
        return name
    return raw[:64].decode(errors="ignore") + "~" + hashlib.sha256(raw).hexdigest()[:16]


def _beside(out: Path) -> bool:
    """Whether the lock and partial go beside ``out`` (its parent writable), else inside it."""
    parent = out.parent
    if not parent.exists():
        return True  # created by start_partial's mkdir (check_output vetted the ancestor)
    return os.access(parent, os.W_OK | os.X_OK) or not out.is_dir()


def lock_path(out: Path) -> Path:
    return out.parent / f".{short_name(out.name)}.lock" if _beside(out) else out / f"{INSIDE}.lock"


def _holder() -> bytes:
    """What the lock file says of its holder, for the second writer's message."""
    command = " ".join(["dflash-trt", *sys.argv[1:]])[:300]
    return json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "command": command}).encode()


def _describe(raw: bytes) -> str:
    try:
        h = json.loads(raw.decode())
        return f"pid {h['pid']} on {h['host']}: {h['command']}"
    except (ValueError, KeyError, TypeError):
        return f"pid {raw.decode(errors='replace').strip() or '?'}"


@contextlib.contextmanager
def lock(out: Path):
    """Hold the output's write lock (``fcntl.flock``, released by the kernel if the holder dies);
    a second writer to the same output raises one line naming the holder instead of mixing its
    files with the first one's. The lock file is removed on release (so it leaves nothing behind);
    a writer that locked a file already unlinked by the previous holder opens the new one again."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        path = lock_path(out)
    except OSError as exc:
        raise DFlashError(f"-o {out}: cannot write there ({exc.strerror or exc})") from None
    fd = _acquire(out, path)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, _holder(), 0)
        yield
    finally:
        with contextlib.suppress(OSError):
            path.unlink()
        os.close(fd)


def _acquire(out: Path, path: Path) -> int:
    for _ in range(10):
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as exc:
            why = f"{path} is a symlink; remove it" if exc.errno == errno.ELOOP else exc.strerror or exc
            raise DFlashError(f"-o {out}: cannot take the write lock ({why})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _describe(os.pread(fd, 4096, 0))
            os.close(fd)
            raise DFlashError(
                f"-o {out}: another dflash-trt writer holds it ({holder}); wait for it to finish or choose another -o"
            ) from None
        try:
            if os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)  # the previous holder removed it as we locked: open the current one
    raise DFlashError(f"-o {out}: cannot take the write lock {path}")


def recover(out: Path) -> str | None:
    """Under the lock: finish or roll back a swap of ``out`` a killed writer left (the sentence
    saying which; None when there was none)."""
    return swap.recover_swap(out) if out.is_dir() and not out.is_symlink() else None


def _partial_prefix(out: Path) -> tuple[Path, str]:
    return (out.parent, f".{short_name(out.name)}.partial-") if _beside(out) else (out, f"{INSIDE}.partial-")


def start_partial(out: Path) -> Path:
    """A fresh partial build directory for ``out`` (beside it, else inside it); partial builds of
    the same output left by a killed build (their process is gone) are removed first: they are
    model-sized. (Call :func:`recover` first: a killed swap's partial may still be needed.)"""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        where, prefix = _partial_prefix(out)
        for stale in where.glob(f"{prefix}*"):
            pid = stale.name.rsplit("-", 1)[-1]
            if not stale.is_symlink() and stale.is_dir() and not (pid.isdigit() and _alive(int(pid))):
                shutil.rmtree(stale, ignore_errors=True)
        tmp = where / f"{prefix}{os.getpid()}"
        if tmp.is_symlink():
            tmp.unlink()
        elif tmp.exists():
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


def share(root: Path, copied: dict[str, int] | None = None) -> None:
    """Bundle files readable by other users and containers: temporary directories and some writers
    create 0700/0600 entries; directories become 0755, files 0644 (0755 if executable). A file
    ``copied`` from elsewhere (relative path -> its source's mode) keeps at most that mode."""
    copied = copied or {}
    for p in [root, *root.rglob("*")]:
        if p.is_symlink():
            continue
        mode = p.stat().st_mode
        new = 0o755 if p.is_dir() or mode & 0o100 else 0o644
        rel = p.relative_to(root).as_posix()
        if rel in copied:
            new &= copied[rel]
        p.chmod(new)


# rename(2) errors that mean "this directory cannot be renamed": swap its contents instead
_NO_RENAME = (errno.EBUSY, errno.EXDEV, errno.EPERM, errno.EACCES, errno.EROFS, errno.ENOTEMPTY, errno.EEXIST)


def replace(tmp: Path, out: Path) -> str | None:
    """Put the bundle built in ``tmp`` at ``out``: renamed into place when ``out`` does not exist,
    else (or where the rename is refused) swapped file by file (:func:`swap_contents`). Returns
    the sentence naming what the OS refused to remove after a swap, else None."""
    if not out.exists() and tmp.parent != out:
        try:
            tmp.rename(out)
            return None
        except OSError as exc:
            if exc.errno not in _NO_RENAME:
                raise DFlashError(
                    f"-o {out}: cannot move the build into place ({exc.strerror or exc}); "
                    f"the built bundle is kept in {tmp}"
                ) from None
    return swap_contents(tmp, out)


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
    older format) is refused: nothing says which files are the bundle's. Each name must be a plain
    path inside ``out`` under no symlink (a manifest edited to name ``../x`` deletes nothing)."""
    path = out / ingest.Layout.MANIFEST
    if not path.is_file():
        return set()
    try:
        files = json.loads(path.read_text()).get("files")
    except (OSError, ValueError, AttributeError) as exc:
        raise DFlashError(
            f"-o {out}: cannot read its {path.name} ({exc}); remove the old bundle yourself or choose another -o"
        ) from None
    if not isinstance(files, dict) or not all(isinstance(k, str) for k in files):
        raise DFlashError(
            f"-o {out}: its {path.name} lists no files (a bundle older than format 3), so which "
            "files are the bundle's is unknown; remove it yourself or choose another -o"
        )
    for rel in files:
        swap.inside(out, rel, f"the file its {path.name} lists")
    return {*files, path.name}


def swap_contents(tmp: Path, out: Path, old: set[str] | None = None) -> str | None:
    """Replace ``old`` (default: the previous bundle's files) in ``out`` by ``tmp``'s, keeping every
    other file, through the journaled swap (:mod:`dflash_trt.deploy.swap`).

    Checked before anything changes: a file in ``out`` that is not leaving and that the new bundle
    would overwrite refuses the swap (the build stays in ``tmp``). The manifest leaves first and
    comes last, so a swap cut short leaves no manifest that vouches for a mix, and a journal the
    next writer finishes or rolls back from. Returns what the OS refused to remove once it was done
    (a sentence), else None."""
    keep = f"the built bundle is kept in {tmp}"
    try:
        out.mkdir(exist_ok=True)
        old = previous_files(out) if old is None else old
        others = set(_files(out, skip=tmp)) - old - {p.name for p in out.glob(f"{INSIDE}.*")}
        journal = swap.plan(tmp, out, old, _files(tmp), others)
        return swap.swap(out, journal)
    except OSError as exc:
        raise DFlashError(
            f"-o {out}: cannot swap the bundle in ({exc.strerror or exc}; "
            f"{getattr(exc, 'filename', '') or ''}); {keep}; the next build or tune of {out} "
            "finishes or rolls back the swap"
        ) from None


SKIP_SUFFIXES = (".bin", ".pt", ".pth", ".py", ".pkl", ".msgpack", ".h5", ".ckpt")  # never copied: pickles, code


def copy_checkpoint(src: Path, dst: Path) -> None:
    """A checkpoint's files (configs, safetensors, tokenizer), never pickles or code; a symlink
    only into the checkpoint's own store (``ingest.checkpoint_file``); each copy at most as open
    as its source (``share`` caps it: :func:`copied_modes`)."""
    dst.mkdir(parents=True, exist_ok=True)
    for f in sorted(src.iterdir()):
        if f.is_file() and not f.name.startswith(".") and not f.name.endswith(SKIP_SUFFIXES):
            real = ingest.checkpoint_file(src, f)
            shutil.copyfile(real, dst / f.name)
            (dst / f.name).chmod(real.stat().st_mode & 0o777)


def copied_modes(src: Path, target: Path, quantized: bool) -> dict[str, int]:
    """The bundle's ``target/`` files copied as they are from checkpoint ``src`` (all of them, or
    for a ModelOpt export only its tokenizer files), relative path -> the source's mode: ``share``
    opens them no wider than their source."""
    names = set(ingest.tokenizer_files(src)) if quantized else {f.name for f in src.iterdir()}
    return {
        f"{ingest.Layout.TARGET}/{f.name}": ingest.checkpoint_file(src, src / f.name).stat().st_mode & 0o777
        for f in target.iterdir()
        if f.name in names and (src / f.name).is_file()
    }


def replace_files(root: Path, files: dict[Path, str], what: str, warnings: list[str] | None = None) -> list[Path]:
    """Write every file of bundle ``root``, the previous one kept as ``NAME.prev``, as one journaled
    swap (``deploy.swap``): the new texts and the ``.prev`` copies are written into a partial
    directory first, then swapped in, so a kill at any point leaves the old files or the new ones
    (or a swap the next writer finishes or rolls back). Ctrl-C waits until the swap
    is done (then is raised). Call it holding the bundle's lock. Returns the ``.prev`` paths; what the
    OS refused to remove once the swap was done is appended to ``warnings`` (a sentence)."""
    tmp = start_partial(root)
    try:
        prevs = []
        for path, text in files.items():
            rel = path.relative_to(root).as_posix()
            swap.inside(root, f"{rel}.prev", what)
            _write(swap.inside(tmp, rel, what), text.encode())
            if os.path.lexists(path):
                _write(tmp / f"{rel}.prev", path.read_bytes())
                prevs.append(path.with_name(path.name + ".prev"))
        share(tmp)
        new = [p.relative_to(tmp).as_posix() for p in tmp.rglob("*") if not p.is_dir()]
        with _sigint_held():
            left = swap_contents(tmp, root, old={r for r in new if os.path.lexists(root / r)})
        if left and warnings is not None:
            warnings.append(left)
        return prevs
    finally:
        if not os.path.lexists(root / swap.JOURNAL):  # a journal: the next writer needs the partial
            shutil.rmtree(tmp, ignore_errors=True)


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "xb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


class _sigint_held:
    """Defer SIGINT (main thread only) for the few renames that must happen together."""

    def __enter__(self):
        self.hit, self.old = False, None
        if threading.current_thread() is threading.main_thread():
            self.old = signal.signal(signal.SIGINT, lambda *_: setattr(self, "hit", True))
        return self

    def __exit__(self, *exc):
        if self.old is not None:
            signal.signal(signal.SIGINT, self.old)
        if self.hit and exc[0] is None:
            raise KeyboardInterrupt
