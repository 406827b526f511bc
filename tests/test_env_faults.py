"""What the machine refuses is one line and exit 2, nothing half-written (issue 41): a process
file-size limit (a real ``RLIMIT_FSIZE``, so Rust and C++ writers meet it too) and a full disk
(``ENOSPC`` injected into ``os.sendfile``) during build and training, names past ``NAME_MAX``
and a legal 255-byte output name, a stdout that cannot encode, a busy port, a damaged training
run on ``--resume``, errors outside ``Exception`` (a Rust panic, torch's ``CheckpointException``)
while Ctrl-C and ``SystemExit`` keep their meaning, and a plot path that cannot be written."""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import resource
import shutil
import socket
import sys
from pathlib import Path

import pytest

from dflash_trt.cli import run


def _one_line(capsys, code) -> str:
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


@contextlib.contextmanager
def file_size_limit(limit: int):
    """This process's soft ``RLIMIT_FSIZE`` lowered to ``limit`` bytes (restored after)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def _error_line(capsys, code) -> str:
    """A long command (training) reports progress on stderr; its refusal is the one ``error:`` line, last."""
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and err.splitlines()[-1] == errors[0] and "Traceback" not in err, err
    return errors[0]


def _leftovers(root: Path) -> list[str]:
    return sorted(
        str(p.relative_to(root)) for p in root.rglob("*") if p.name.endswith((".tmp", ".lock")) or ".partial-" in p.name
    )


def test_build_under_a_file_size_limit(tmp_path, capsys):
    out = tmp_path / "b"
    with file_size_limit(200_000):  # the tiny target's safetensors is ~7 MB
        err = _one_line(capsys, run(["build", "-o", str(out)]))
    assert "EFBIG" in err and "model.safetensors" in err and "ulimit -f" in err
    assert not out.exists() and _leftovers(tmp_path) == []


def test_build_on_a_full_disk(tmp_path, capsys, monkeypatch):
    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "sendfile", full)  # shutil's copy of the checkpoint
    out = tmp_path / "b"
    err = _one_line(capsys, run(["build", "-o", str(out)]))
    assert "no space left" in err and "ENOSPC" in err and str(tmp_path) in err
    assert not out.exists() and _leftovers(tmp_path) == []


def test_names_past_the_limit_and_a_legal_long_output(tmp_path, capsys, monkeypatch):
    from dflash_trt.deploy import output

    NAME_MAX, PID_ROOM = 255, 32  # a partial's name adds the pid and a random tail after its prefix
    monkeypatch.chdir(tmp_path)
    err = _one_line(capsys, run(["build", "-o", "x" * (NAME_MAX + 1)]))
    assert "too long" in err
    legal = "y" * NAME_MAX
    assert run(["build", "-o", legal]) == 0, capsys.readouterr().err
    assert (tmp_path / legal / "manifest.json").is_file() and _leftovers(tmp_path) == []
    assert run(["build", "-o", legal, "--force"]) == 0, capsys.readouterr().err
    name = lambda o: (output.lock_path(o).name, output._partial_prefix(o)[1])  # noqa: E731
    for got, room in zip(name(tmp_path / legal), (0, PID_ROOM), strict=True):
        assert len(got.encode()) + room <= NAME_MAX
    assert name(tmp_path / legal) == name(tmp_path / legal) != name(tmp_path / (legal[:-1] + "z"))
    assert output.lock_path(tmp_path / "short").name == ".short.lock"


def test_stdout_that_cannot_encode_degrades(tmp_path, monkeypatch):
    raw = io.BytesIO()
    ascii_out = io.TextIOWrapper(raw, encoding="ascii")  # errors="strict", like PYTHONIOENCODING=ascii
    monkeypatch.setattr(sys, "stdout", ascii_out)
    assert run(["build", "-o", str(tmp_path / "b")]) == 0  # the plan prints τ
    ascii_out.flush()
    assert (tmp_path / "b" / "manifest.json").is_file() and b"bundle written" in raw.getvalue()


def test_a_busy_port_is_one_line_before_any_model_loads(bundle_dir, capsys, monkeypatch):
    import dflash_trt.runtime as runtime

    def never(*a, **k):
        raise AssertionError("models loaded before the port was checked")

    monkeypatch.setattr(runtime, "load_bundle", never)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        err = _one_line(capsys, run(["serve", str(bundle_dir), "--server", "embedded", "--port", str(port)]))
    assert f"--port {port}" in err and "already in use" in err


# ---- training: a file-size limit, and a damaged run on --resume ---------------------------------
def _train(root: Path, out: Path, steps: int, *extra: str) -> list[str]:
    return [
        "train-drafter",
        "--target",
        str(root / "target"),
        "--data",
        str(root / "data.txt"),
        "--out",
        str(out),
        "--steps",
        str(steps),
        "--block-size",
        "4",
        "--layers",
        "1",
        "--batch-size",
        "2",
        "--anchors",
        "4",
        "--prompt-len",
        "12",
        "--gen-len",
        "8",
        "--samples",
        "8",
        "--eval-every",
        "100",
        "--save-every",
        "1",
        "--json",
        *extra,
    ]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from tests.helpers import save_pair

    root = tmp_path_factory.mktemp("faults")
    save_pair(root)
    (root / "data.txt").write_text("".join(f"def f{i}(x):\n    return x * {i}\n\n" for i in range(60)))
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert run(_train(root, root / "run", 1)) == 0
    return root


def test_training_under_a_file_size_limit(trained, tmp_path, capsys):
    out = tmp_path / "run"
    with file_size_limit(50_000):
        err = _error_line(capsys, run(_train(trained, out, 1)))
    assert "EFBIG" in err and str(out) in err
    assert _leftovers(tmp_path) == []


def _garbage(rel: str):
    def damage(run_dir: Path) -> None:
        (run_dir / rel).write_bytes(b"\x00{not json")

    return damage


def _truncate_shard(run_dir: Path) -> None:
    shard = next((run_dir / ".train" / "state").glob("*.safetensors"))
    shard.write_bytes(shard.read_bytes()[:100])


DAMAGE = {
    "settings.json": _garbage(".train/settings.json"),
    "state/train.json": _garbage(".train/state/train.json"),
    "a truncated shard": _truncate_shard,
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_run_on_resume_is_one_line(trained, tmp_path, capsys, damage):
    run_dir = tmp_path / "run"
    shutil.copytree(trained / "run", run_dir)
    DAMAGE[damage](run_dir)
    err = _error_line(capsys, run(_train(trained, run_dir, 2, "--resume")))
    assert "the saved training state" in err and str(run_dir) in err


# ---- errors that do not derive from Exception; Ctrl-C and SystemExit ----------------------------
class PanicException(BaseException):
    """What pyo3 raises for a Rust panic (``pyo3_runtime.PanicException`` derives from BaseException)."""


PanicException.__module__ = "pyo3_runtime"


def _raising(exc: BaseException):
    def boom(*a, **k):
        raise exc

    return boom


def test_errors_outside_exception_are_one_line(capsys, monkeypatch):
    from torch.distributed.checkpoint.api import CheckpointException, _wrap_exception

    from dflash_trt import ingest

    dcp_failed = CheckpointException("load", {0: _wrap_exception(RuntimeError("bad shard"))})
    for exc, needle in (
        (PanicException("called `Option::unwrap()` on a `None` value"), "pyo3_runtime.PanicException"),
        (dcp_failed, "CheckpointException"),
        (RecursionError("maximum recursion depth exceeded"), "nested too deeply"),
    ):
        monkeypatch.setattr(ingest, "validate_pair", _raising(exc))
        err = _one_line(capsys, run(["inspect", "embedded:tiny/drafter", "--target", "embedded:tiny/target"]))
        assert needle in err, err


def test_ctrl_c_and_system_exit_keep_their_meaning(capsys, monkeypatch):
    from dflash_trt import ingest

    monkeypatch.setattr(ingest, "validate_pair", _raising(KeyboardInterrupt()))
    assert run(["inspect", "embedded:tiny/drafter", "--target", "embedded:tiny/target"]) == 130
    monkeypatch.setattr(ingest, "validate_pair", _raising(SystemExit(5)))
    with pytest.raises(SystemExit) as raised:
        run(["inspect", "embedded:tiny/drafter", "--target", "embedded:tiny/target"])
    assert raised.value.code == 5


def test_a_bug_keeps_its_traceback(monkeypatch, capsys):
    """A bug is not translated into a user's one line: exit 1, said to be a bug, its traceback kept in a file."""
    from dflash_trt import ingest

    monkeypatch.setattr(ingest, "validate_pair", _raising(ZeroDivisionError("a bug")))
    assert run(["inspect", "embedded:tiny/drafter", "--target", "embedded:tiny/target"]) == 1
    line = capsys.readouterr().err.strip()
    assert line.startswith("internal error (a bug in dflash-trt") and "ZeroDivisionError" in line
    where = line.split("the traceback is in ", 1)[1].split(";", 1)[0]
    assert "ZeroDivisionError: a bug" in Path(where).read_text()


# ---- a plot path that cannot be written keeps the results ----------------------------------------
@pytest.mark.parametrize("where", ["/", "fifo.png", "missing/dir/p.png", "p.unknownformat"])
def test_a_plot_that_cannot_be_written_keeps_the_results(tmp_path, monkeypatch, where):
    from dflash_trt._cli.common import save_then_plot

    monkeypatch.chdir(tmp_path)
    os.mkfifo(tmp_path / "fifo.png")

    def draw(path):
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig = plt.figure()
        try:
            fig.savefig(path)
        finally:
            plt.close(fig)

    said = save_then_plot({"levels": [1]}, Path(where), draw)
    assert said is not None and "--plot" in said and "\n" not in said
    if where == "p.unknownformat":
        assert json.loads((tmp_path / "p.json").read_text()) == {"levels": [1]}
