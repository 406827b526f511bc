"""Crash-safe, exclusive writers (issue 39): a ``build --force`` (or ``tune``) swap killed at any
step leaves the old bundle, the new one, or a journal the next writer finishes or rolls back and
says so; the user's files in -o survive; a second writer refuses naming the holder; a lock left
by a killed process never blocks; a long -o name still gets a lock and a partial."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from dflash_trt import ingest
from dflash_trt.cli import run
from dflash_trt.deploy import output, swap
from dflash_trt.errors import CheckpointError

USER = {"notes.txt": "mine", "target/mine.txt": "mine too"}  # files the user keeps in -o


class Killed(BaseException):
    """Stands in for SIGKILL at one step: nothing in the swap catches a BaseException it did not raise."""


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    """Two bundles of the tiny pair that differ (the old one in -o, the new one as a finished partial)."""
    root = tmp_path_factory.mktemp("swap")
    assert run(["build", "-o", str(root / "old")]) == 0
    assert run(["build", "-o", str(root / "new"), "--set", "serving.max_batch_size=4"]) == 0
    return root / "old", root / "new"


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _setup(bundles, where: Path) -> tuple[Path, Path]:
    old, new = bundles
    out = shutil.copytree(old, where / "out")
    for rel, text in USER.items():
        (out / rel).write_text(text)
    tmp = shutil.copytree(new, where / f".out.partial-{os.getpid()}")
    return out, tmp


def _is(out: Path, bundle: Path) -> bool:
    """``out`` holds exactly ``bundle``'s files plus the user's, and nothing of a swap."""
    want = {**_files(bundle), **{k: v.encode() for k, v in USER.items()}}
    return _files(out) == want and not [p for p in out.iterdir() if p.name.startswith(".")]


def _steps(bundles, where: Path) -> list[str]:
    out, tmp = _setup(bundles, where)
    seen: list[str] = []
    real, swap._step = swap._step, seen.append
    try:
        output.swap_contents(tmp, out)
    finally:
        swap._step = real
    assert _is(out, bundles[1]) and not tmp.exists()
    shutil.rmtree(out)
    return seen


def _kill_at(monkeypatch, step: str) -> None:
    def hook(name):
        if name == step:
            raise Killed(name)

    monkeypatch.setattr(swap, "_step", hook)


def test_a_swap_killed_at_any_step_is_finished_by_the_next_writer(bundles, tmp_path, monkeypatch):
    steps = _steps(bundles, tmp_path)
    assert len(steps) > 2 * len(_files(bundles[0]))  # every file out and in, the phases, the cleaning
    for step in steps:
        where = tmp_path / str(steps.index(step))
        where.mkdir()
        out, tmp = _setup(bundles, where)
        _kill_at(monkeypatch, step)
        with pytest.raises(Killed):
            output.swap_contents(tmp, out)
        monkeypatch.setattr(swap, "_step", lambda name: None)
        assert (out / swap.JOURNAL).exists(), step  # killed before its end: the journal says what to do
        said = output.recover(out)
        assert said and "finished the swap" in said, step
        assert _is(out, bundles[1]), step
        assert not tmp.exists() and sorted(p.name for p in where.iterdir()) == ["out"], step
        assert ingest.check_files(ingest.open_bundle(out)) == [
            f"{r}: not in the manifest (added after the build)" for r in sorted(USER)
        ]


def test_a_swap_whose_partial_is_gone_is_rolled_back(bundles, tmp_path, monkeypatch):
    steps = _steps(bundles, tmp_path)
    cut = steps.index("moved in manifest.json")  # before it, files of the new bundle are still in the partial
    for step in steps[:cut]:
        where = tmp_path / str(steps.index(step))
        where.mkdir()
        out, tmp = _setup(bundles, where)
        _kill_at(monkeypatch, step)
        with pytest.raises(Killed):
            output.swap_contents(tmp, out)
        monkeypatch.setattr(swap, "_step", lambda name: None)
        shutil.rmtree(tmp)  # the partial lost (removed by hand, or a full disk)
        said = output.recover(out)
        assert said and "rolled back" in said, step
        assert _is(out, bundles[0]), step


def test_a_recovery_killed_in_turn_is_recovered_again(bundles, tmp_path, monkeypatch):
    steps = _steps(bundles, tmp_path)
    first = next(s for s in steps if s.startswith("moved in"))
    where = tmp_path / "w"
    where.mkdir()
    out, tmp = _setup(bundles, where)
    _kill_at(monkeypatch, first)
    with pytest.raises(Killed):
        output.swap_contents(tmp, out)
    for step in steps[steps.index(first) + 1 :]:  # each step the recovery itself takes
        _kill_at(monkeypatch, step)
        with pytest.raises(Killed):
            output.recover(out)
    monkeypatch.setattr(swap, "_step", lambda name: None)
    assert "finished" in output.recover(out)
    assert _is(out, bundles[1])


KILLER = """
import os, signal, sys
from dflash_trt.deploy import swap
from dflash_trt.cli import run

def hook(step):
    if step == sys.argv[2]:
        os.kill(os.getpid(), signal.SIGKILL)

swap._step = hook
sys.exit(run(["build", "-o", sys.argv[1], "--force", "--set", "serving.max_batch_size=4"]))
"""


def test_a_build_force_really_killed_mid_swap_is_finished_by_the_rerun(bundles, tmp_path, capsys):
    """One real SIGKILL, at the worst point: every old file moved out, no new one in yet."""
    out = shutil.copytree(bundles[0], tmp_path / "out")
    (out / "notes.txt").write_text("mine")
    killed = subprocess.run(
        [sys.executable, "-c", KILLER, str(out), "phase in"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert not (out / ingest.Layout.MANIFEST).exists() and (out / swap.JOURNAL).exists()
    assert (tmp_path / ".out.lock").exists()  # the killed build's lock file is left behind
    with pytest.raises(CheckpointError, match="swap"):
        ingest.open_bundle(out)  # a reader says what happened, in one line
    assert run(["build", "-o", str(out)]) == 2  # the stale lock does not block; without --force: refused, after
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "finished the swap a killed process left" in err and "--force" in err, err
    assert (out / "notes.txt").read_text() == "mine"
    added = "notes.txt: not in the manifest (added after the build)"
    assert ingest.check_files(ingest.open_bundle(out)) == [added]
    assert ingest.open_bundle(out).manifest.recipe["serving"]["max_batch_size"] == 4  # the killed build's bundle
    assert run(["build", "-o", str(out), "--force"]) == 0
    assert ingest.check_files(ingest.open_bundle(out)) == [added]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # partial and lock swept


def test_a_second_writer_refuses_naming_the_holder(tmp_path, capsys):
    out = tmp_path / "out"
    with output.lock(out):
        assert run(["build", "-o", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and f"pid {os.getpid()} on {os.uname().nodename}" in err, err
        holder = json.loads(output.lock_path(out).read_text())
        assert holder["pid"] == os.getpid() and holder["command"].startswith("dflash-trt")
    assert not out.exists()


def test_a_long_output_name_gets_a_short_lock_and_partial(tmp_path, capsys):
    a, b = tmp_path / ("x" * 250 + "a"), tmp_path / ("x" * 250 + "b")  # legal names, 251 bytes
    assert output.short_name(a.name) != output.short_name(b.name)  # one prefix, two outputs, two locks
    assert len(f".{output.short_name(a.name)}.partial-4194304") < 120
    assert run(["build", "-o", str(a)]) == 0, capsys.readouterr().err
    assert run(["build", "-o", str(a), "--force"]) == 0, capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == [a.name]


def test_a_swap_begun_under_a_relative_name_is_recovered_from_anywhere(bundles, tmp_path, monkeypatch):
    where = tmp_path / "w"
    where.mkdir()
    _setup(bundles, where)
    monkeypatch.chdir(where)  # build -o out, run from where
    _kill_at(monkeypatch, "phase in")
    with pytest.raises(Killed):
        output.swap_contents(Path(f".out.partial-{os.getpid()}"), Path("out"))
    monkeypatch.setattr(swap, "_step", lambda name: None)
    monkeypatch.chdir(tmp_path)
    assert "finished" in output.recover(where / "out")
    assert _is(where / "out", bundles[1])


def test_what_the_os_will_not_remove_after_a_swap_is_said_and_swept_next_time(bundles, tmp_path, monkeypatch):
    """The swap is done, then the OS refuses the removals (an open, unlink or rmdir that fails in
    rmtree): the bundle is whole, the warning names what stays, and the next swap of the same
    output removes it (the backup inside at its start, the partial beside by start_partial)."""
    out, tmp = _setup(bundles, tmp_path)
    real_rmtree = shutil.rmtree

    def refusing(path, *a, **k):
        hook = k.get("onexc") or k.get("onerror")
        if hook is None:
            return real_rmtree(path, *a, **k)
        hook(
            os.unlink,
            str(path),
            PermissionError(13, "Permission denied")
            if "onexc" in k
            else (PermissionError, PermissionError(13, "Permission denied"), None),
        )

    monkeypatch.setattr(shutil, "rmtree", refusing)
    said = output.swap_contents(tmp, out)
    monkeypatch.setattr(shutil, "rmtree", real_rmtree)
    assert said and f"remove {out / swap.BACKUP} (Permission denied) and {tmp} (Permission denied)" in said
    assert (out / swap.BACKUP).is_dir() and tmp.is_dir()
    assert not (out / swap.JOURNAL).exists()
    assert ingest.read_manifest(out) is not None
    os.rename(tmp, tmp.with_name(".out.partial-999999999"))  # its process gone, as after the build exits
    stale = out / swap.BACKUP / ingest.Layout.MANIFEST  # half-removed: a directory where a file will move
    stale.unlink()
    (stale / "x").mkdir(parents=True)
    again = output.start_partial(out)
    shutil.copytree(bundles[0], again, dirs_exist_ok=True)
    assert output.swap_contents(again, out) is None
    assert _is(out, bundles[0]) and [p.name for p in tmp_path.iterdir()] == ["out"]
