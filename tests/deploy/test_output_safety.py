"""Build output never destroys user data (issue 16): --force replaces only bundles, stale partial
builds are swept, recipe names cannot escape the output folder, bundles are world-readable."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

from dflash_trt.cli import run


def _one_line(capsys, code) -> str:
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("kind", ["file", "user directory", "symlink"])
def test_force_replaces_only_a_bundle(tmp_path, capsys, kind):
    out = tmp_path / "out"
    if kind == "file":
        out.write_text("precious")
    elif kind == "user directory":
        out.mkdir()
        (out / "precious.txt").write_text("precious")
    else:
        (tmp_path / "elsewhere").mkdir()
        out.symlink_to(tmp_path / "elsewhere")
    before = sorted(p.name for p in tmp_path.rglob("*"))
    err = _one_line(capsys, run(["build", "-o", str(out), "--force"]))
    assert str(out) in err
    assert sorted(p.name for p in tmp_path.rglob("*")) == before
    if kind == "user directory":
        assert (out / "precious.txt").read_text() == "precious"


@pytest.mark.parametrize("bad", ["plainfile/sub", "plainfile/a/b"])
def test_output_under_a_file_is_one_line(tmp_path, capsys, bad, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "plainfile").write_text("x")
    err = _one_line(capsys, run(["build", "-o", bad]))
    assert "plainfile" in err and (tmp_path / "plainfile").read_text() == "x"


@pytest.mark.parametrize("name", ["../escape", "a/b", "..", "/abs", "x\ny"])
def test_recipe_name_cannot_leave_the_output_folder(tmp_path, capsys, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    err = _one_line(capsys, run(["build", "--set", f"name={name!r}", "--dry-run"]))
    assert "name" in err
    assert list(tmp_path.iterdir()) == []


def test_a_killed_builds_partial_is_swept_and_the_bundle_is_world_readable(tmp_path, capsys):
    out = tmp_path / "bundle"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f".bundle.partial-{int(dead.stdout)}"  # a pid that has exited
    (stale / "target").mkdir(parents=True)
    (stale / "target" / "model.safetensors").write_bytes(b"\0" * 1024)
    old_umask = os.umask(0o077)  # a user whose umask hides files must still share the bundle
    try:
        assert run(["build", "-o", str(out)]) == 0, capsys.readouterr().err
    finally:
        os.umask(old_umask)
    assert not stale.exists()
    for p in [out, *out.rglob("*")]:
        mode = stat.S_IMODE(p.stat().st_mode)
        assert mode & 0o044 == 0o044, f"{p} is {oct(mode)}"
    assert stat.S_IMODE((out / "trtllm" / "serve.sh").stat().st_mode) & 0o111 == 0o111
    # --force replaces a bundle
    assert run(["build", "-o", str(out), "--force"]) == 0


# ---- issue 27: the swap where the output cannot be renamed, only a bundle's own files, the lock --------
import errno  # noqa: E402
import json  # noqa: E402
from pathlib import Path  # noqa: E402

from dflash_trt import ingest  # noqa: E402
from dflash_trt.deploy import output, pipeline  # noqa: E402


def _refuse_renaming(monkeypatch, out: Path, code: int) -> list:
    """rename(2) onto or from ``out`` itself fails with ``code`` (a mount point, an immutable dir)."""
    seen, real_os, real_path = [], os.rename, Path.rename

    def guard(src, dst):
        if Path(dst) == out or Path(src) == out:
            seen.append((src, dst))
            raise OSError(code, os.strerror(code), str(src))

    monkeypatch.setattr(os, "rename", lambda s, d, **kw: guard(s, d) or real_os(s, d, **kw))
    monkeypatch.setattr(Path, "rename", lambda self, d: guard(self, d) or real_path(self, d))
    return seen


@pytest.mark.parametrize("code", [errno.EBUSY, errno.EXDEV, errno.EPERM])
def test_the_swap_works_where_the_output_cannot_be_renamed(tmp_path, capsys, monkeypatch, code):
    out = tmp_path / "vol"
    seen = _refuse_renaming(monkeypatch, out, code)
    assert run(["build", "-o", str(out)]) == 0, capsys.readouterr().err
    assert seen, "the rename onto the output was never tried"
    assert ingest.check_files(ingest.open_bundle(out)) == []
    assert run(["build", "-o", str(out), "--force"]) == 0, capsys.readouterr().err
    assert ingest.check_files(ingest.open_bundle(out)) == []
    assert [p.name for p in tmp_path.iterdir()] == ["vol"]


def test_a_mount_point_whose_parent_is_read_only_is_built_inside(tmp_path, capsys, monkeypatch):
    out = tmp_path / "mnt"
    out.mkdir()  # an empty container volume; its parent is not writable
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if Path(p) == tmp_path else real(p, mode, **kw))
    _refuse_renaming(monkeypatch, out, errno.EBUSY)
    made = []
    real_mkdir = Path.mkdir
    monkeypatch.setattr(Path, "mkdir", lambda self, *a, **k: made.append(self) or real_mkdir(self, *a, **k))
    assert run(["build", "-o", str(out)]) == 0, capsys.readouterr().err
    assert any(p.parent == out and p.name.startswith(output.INSIDE) for p in made), made
    assert ingest.check_files(ingest.open_bundle(out)) == []
    assert [p.name for p in tmp_path.iterdir()] == ["mnt"]
    assert not [p for p in out.iterdir() if p.name.startswith(".")]


def test_force_keeps_a_file_that_appeared_during_the_build(tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    assert run(["build", "-o", str(out)]) == 0
    real = pipeline._write_bundle

    def meanwhile(*a, **k):
        (out / "notes.txt").write_text("mine")
        (out / "target" / "extra.bin").write_text("mine too")
        return real(*a, **k)

    monkeypatch.setattr(pipeline, "_write_bundle", meanwhile)
    assert run(["build", "-o", str(out), "--force"]) == 0, capsys.readouterr().err
    assert (out / "notes.txt").read_text() == "mine" and (out / "target" / "extra.bin").read_text() == "mine too"
    added = "not in the manifest (added after the build)"
    assert sorted(ingest.check_files(ingest.open_bundle(out))) == [f"notes.txt: {added}", f"target/extra.bin: {added}"]


def test_a_file_not_the_bundles_that_the_build_would_overwrite_stops_the_swap(tmp_path, capsys):
    out = tmp_path / "out"
    assert run(["build", "-o", str(out)]) == 0
    m = json.loads((out / "manifest.json").read_text())
    del m["files"]["trtllm/serve.sh"]  # serve.sh is now the user's file, not the bundle's
    (out / "manifest.json").write_text(json.dumps(m))
    (out / "trtllm" / "serve.sh").write_text("mine")
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    err = _one_line(capsys, run(["build", "-o", str(out), "--force"]))
    assert "trtllm/serve.sh" in err and "kept in" in err
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    kept = Path(err.rsplit("kept in ", 1)[1])
    assert (kept / "manifest.json").is_file()


def test_an_older_bundle_that_lists_no_files_is_not_replaced(tmp_path, capsys):
    out = tmp_path / "out"
    assert run(["build", "-o", str(out)]) == 0
    m = json.loads((out / "manifest.json").read_text())
    del m["files"]
    (out / "manifest.json").write_text(json.dumps(m))
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    assert "lists no files" in _one_line(capsys, run(["build", "-o", str(out), "--force"]))
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_a_second_build_to_the_same_output_fails_in_one_line(tmp_path, capsys):
    out = tmp_path / "out"
    with output.lock(out):  # a build in progress (flock: a second open file conflicts, even in-process)
        err = _one_line(capsys, run(["build", "-o", str(out)]))
        assert "another dflash-trt writer" in err and f"pid {os.getpid()} on " in err
        assert not out.exists()
    assert run(["build", "-o", str(out)]) == 0
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
