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
    stale = tmp_path / f".bundle.partial-{int(dead.stdout)}"   # a pid that has exited
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
