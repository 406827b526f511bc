"""The journaled swap: an existing output's files replaced by a partial build's, crash-safe.

Invariants:

- **old, new, or finishable**: before anything changes, ``OUT/.dflash-trt.swap.json`` (the
  journal, written by rename) records the partial directory, the files leaving and the files
  coming. The files leaving are *moved* into ``OUT/.dflash-trt.old/`` (manifest first), the
  journal's phase then says ``in``, the new files are moved in (manifest last), the phase says
  ``clean``, and only then are the moved-out files and the partial removed. A process killed at
  any step leaves the journal; the next writer (:func:`recover_swap`, under the output's lock) finishes
  the swap where the partial still holds every file not yet moved in, else moves the previous
  bundle's files back, and says which it did. Every step is idempotent, so a recovery killed in
  turn is recovered again.
- **confined**: every path the swap moves, creates or removes is a plain relative name below
  ``OUT`` (no ``..``, no absolute path) whose directories below ``OUT`` are real directories,
  never symlinks (:func:`inside`); a rename moves a symlink itself, never what it points at.
- **only what the journal names**: files of ``OUT`` that are neither leaving nor coming (the
  user's) are never moved or removed; directories are removed only when the swap left them empty.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import sys
from pathlib import Path, PurePosixPath

from dflash_trt import ingest
from dflash_trt.errors import DFlashError

JOURNAL = ingest.Layout.SWAP_JOURNAL  # OUT/.dflash-trt.swap.json
BACKUP = ".dflash-trt.old"  # OUT/.dflash-trt.old/: the files leaving, until the swap is done


def _step(name: str) -> None:
    """A point between two changes of the swap: what a crash can interrupt (tests stop here)."""


def inside(root: Path, rel: str, what: str) -> Path:
    """``root/rel`` for a plain relative POSIX name whose every directory below ``root`` is absent
    or a real directory (not a symlink); one line naming ``what`` otherwise."""
    p = PurePosixPath(rel)
    if not rel or p.is_absolute() or any(part in ("", ".", "..") for part in p.parts) or "\\" in rel or "\0" in rel:
        raise DFlashError(f"{root}: {what} {rel!r} is not a plain path inside it; refused")
    d = root
    for part in p.parts[:-1]:
        d = d / part
        try:
            mode = os.lstat(d).st_mode
        except FileNotFoundError:
            break
        if not stat.S_ISDIR(mode):
            kind = "a symlink" if stat.S_ISLNK(mode) else "not a directory"
            raise DFlashError(
                f"{root}: {what} {rel!r} lies under {d.relative_to(root)}, which is {kind}; "
                "dflash-trt writes only inside the bundle: move it away and run again"
            )
    return root / rel


def _lexists(p: Path) -> bool:
    return os.path.lexists(p)


def _write_journal(out: Path, journal: dict) -> None:
    tmp = out / f"{JOURNAL}.tmp"
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(journal, indent=1) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, out / JOURNAL)
    except BaseException:  # the journal is whole or not there: no half-written file left beside it
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def _mkdirs(root: Path, dst: Path) -> None:
    """The directories of ``dst`` below ``root``, created 0755 (as ``share`` leaves a bundle's)."""
    for d in reversed([q for q in dst.parents if root in q.parents]):
        if not os.path.lexists(d):
            d.mkdir()
            d.chmod(0o755)


def plan(tmp: Path, out: Path, old: set[str], new: list[str], others: set[str]) -> dict:
    """The journal of a swap of ``out``'s ``old`` files for ``tmp``'s ``new`` ones, checked before
    anything changes: every name confined, and no file of the user's (``others``) overwritten."""
    keep = f"the built bundle is kept in {tmp}"
    for rel in sorted(old):
        path = inside(out, rel, "the previous bundle's file")
        if os.path.isdir(path) and not os.path.islink(path):
            raise DFlashError(
                f"-o {out}: {rel} is listed as a file of the previous bundle but is a directory; "
                f"move it away and build again; {keep}"
            )
    for rel in new:
        inside(out, rel, "the new bundle's file")
    clash = sorted(others & set(new))
    if clash:
        raise DFlashError(
            f"-o {out}: {clash[0]} is not the previous bundle's file and the new bundle would "
            f"overwrite it; move it away and build again; {keep}"
        )
    if tmp.parent not in (out, out.parent):
        raise DFlashError(f"-o {out}: the partial build {tmp} is neither beside nor inside it; {keep}")
    # the partial by name (beside OUT, or inside it): a journal read from another directory finds it
    return {"partial": tmp.name, "inside": tmp.parent == out, "old": sorted(old), "new": sorted(new), "phase": "out"}


def partial_dir(out: Path, journal: dict) -> Path:
    """The partial build directory a journal names."""
    return (out if journal["inside"] else out.parent) / journal["partial"]


def swap(out: Path, journal: dict, resume: bool = False) -> str | None:
    """Run the swap ``journal`` describes (:func:`plan`; ``resume``: the one on disk, from its
    recorded phase) to the end. Returns the sentence naming what the OS refused to remove once the
    swap was done (:func:`_clean`), else None."""
    if not resume:
        if _lexists(out / JOURNAL):
            raise DFlashError(
                f"-o {out}: a swap a killed process left is pending ({out / JOURNAL}); run the build "
                "or tune again: it finishes or rolls it back first"
            )
        if _lexists(out / BACKUP) and not (out / BACKUP).is_symlink():  # an earlier swap's, done but not removed
            shutil.rmtree(out / BACKUP)
        _write_journal(out, journal)
        _step("journal written")
    manifest = ingest.Layout.MANIFEST
    tmp, backup = partial_dir(out, journal), out / BACKUP
    if journal["phase"] == "out":  # the previous bundle's files leave, the manifest first
        for rel in sorted(journal["old"], key=lambda r: r != manifest):
            src, dst = out / rel, backup / rel
            if _lexists(src):
                _mkdirs(out, dst)
                os.rename(src, dst)
                _step(f"moved out {rel}")
        _write_journal(out, {**journal, "phase": "in"})
        journal = {**journal, "phase": "in"}
        _step("phase in")
    if journal["phase"] == "in":  # the new files come, the manifest last
        for rel in sorted(journal["new"], key=lambda r: r == manifest):
            src, dst = tmp / rel, out / rel
            if _lexists(src):
                _mkdirs(out, dst)
                shutil.move(str(src), str(dst))
                _step(f"moved in {rel}")
        _write_journal(out, {**journal, "phase": "clean"})
        _step("phase clean")
    return _clean(out, journal, backup, tmp)


def _clean(out: Path, journal: dict, backup: Path, tmp: Path) -> str | None:
    """The swap is done: the moved-out files and the emptied partial go, then the journal. What the
    OS refuses to remove stays (the bundle is whole without it) and is named in the returned
    sentence; the next writer of ``out`` sweeps it (the backup at its swap, a partial whose process
    is gone at ``start_partial``)."""
    refused: dict[Path, str] = {}  # a directory that stays -> the first reason the OS gave

    def said(path: Path, exc: BaseException) -> None:
        refused.setdefault(path, str(getattr(exc, "strerror", None) or exc))

    def remove(path: Path) -> None:
        if sys.version_info >= (3, 12):
            shutil.rmtree(path, onexc=lambda _fn, _p, exc: said(path, exc))
        else:  # onerror: deprecated from 3.12, the only hook before it
            shutil.rmtree(path, onerror=lambda _fn, _p, info: said(path, info[1]))

    if _lexists(backup):
        remove(backup)
    _step("moved-out files removed")
    if _lexists(tmp) and (tmp.parent != out or tmp.name.startswith(".dflash-trt.partial-")):  # never the user's
        remove(tmp)
    _step("partial removed")
    _prune_dirs(out, {str(PurePosixPath(rel).parent) for rel in journal["old"]})
    (out / JOURNAL).unlink()
    if not refused:
        return None
    what = " and ".join(f"{p} ({why})" for p, why in refused.items())
    return (
        f"{out}: the swap is done, but the OS refused to remove {what}; the bundle is whole without "
        f"{'them' if len(refused) > 1 else 'it'} and the next build or tune of {out} removes "
        f"{'them' if len(refused) > 1 else 'it'}"
    )


def _prune_dirs(out: Path, dirs: set[str]) -> None:
    """Remove the directories the previous bundle's files left empty (deepest first)."""
    for d in sorted(dirs, key=lambda d: -len(Path(d).parts)):
        for p in [out / d, *(out / d).parents]:
            if p == out or out not in p.parents or p.is_symlink():
                break
            try:
                p.rmdir()
            except OSError:
                break


def _read_journal(out: Path) -> dict | None:
    path = out / JOURNAL
    if not _lexists(path):
        return None
    try:
        j = json.loads(path.read_text())
        ok = (
            isinstance(j, dict)
            and isinstance(j.get("partial"), str)
            and isinstance(j.get("inside"), bool)
            and j.get("phase") in ("out", "in", "clean")
            and all(isinstance(j.get(k), list) and all(isinstance(r, str) for r in j[k]) for k in ("old", "new"))
        )
    except (OSError, ValueError):
        ok = False
    if not ok:
        raise DFlashError(f"{path}: an interrupted swap's journal that cannot be read; move {out} away and build again")
    for rel in j["old"] + j["new"]:
        inside(out, rel, "the interrupted swap's file")
    name = j["partial"]
    if not name.startswith(".") or "/" in name or name in (".", "..") or ".partial-" not in name:
        raise DFlashError(f"{path}: names {name!r}, not a partial build of {out}; move {out} away and build again")
    return j


def recover_swap(out: Path) -> str | None:
    """Finish or roll back a swap of ``out`` a killed process left (call it holding the output's
    lock); the sentence saying which, or None when there was none."""
    try:
        j = _read_journal(out)
        if j is None:
            return None
        tmp, backup = partial_dir(out, j), out / BACKUP
        moved_in = j["phase"] != "out"
        complete = j["phase"] == "clean" or all(_lexists(tmp / r) or (moved_in and _lexists(out / r)) for r in j["new"])
        if complete:
            swap(out, j, resume=True)
            said = f"{out}: finished the swap a killed process left (the new bundle is in place)"
        else:
            _roll_back(out, j, backup, tmp)
            said = f"{out}: rolled back the swap a killed process left (the previous bundle is back)"
    except OSError as exc:
        raise DFlashError(
            f"{out}: cannot recover the swap a killed process left ({exc.strerror or exc}); "
            f"its journal is {out / JOURNAL}"
        ) from None
    return said  # the caller says it (build: a warning, or the refusal's first words; tune: a warning)


def _roll_back(out: Path, j: dict, backup: Path, tmp: Path) -> None:
    """The new files that came are removed, the previous bundle's files moved back (manifest last)."""
    manifest = ingest.Layout.MANIFEST
    if j["phase"] == "in":  # the previous files had all left: what is there came (or half-came) from the partial
        for rel in j["new"]:
            if _lexists(out / rel):
                (out / rel).unlink()
    for rel in sorted(j["old"], key=lambda r: r == manifest):
        src = backup / rel
        if _lexists(src):
            _mkdirs(out, out / rel)
            os.replace(src, out / rel)
    shutil.rmtree(backup, ignore_errors=True)
    shutil.rmtree(tmp, ignore_errors=True)
    _prune_dirs(out, {str(PurePosixPath(rel).parent) for rel in j["new"]})
    (out / JOURNAL).unlink()
