"""Starting the ranks: ``python -m dflash_trt.train`` under torchrun, and ``train-drafter --nproc N``.

``torchrun --nproc_per_node N -m dflash_trt.train --target T --data D --out O ...`` runs
:func:`main` in every rank. It takes the flags of ``dflash-trt train-drafter`` (the fields
of :class:`TrainSettings`, spelled ``--kebab-case``), prints progress as plain lines from
rank 0 (logs of a cluster job are not terminals), and exits 2 with one line on a user error.
Under Slurm the same command runs as ``srun torchrun --nnodes ... --rdzv-backend c10d ...``.

:func:`launch` is ``--nproc N``: torch's own launcher API
(``torch.distributed.launcher.api.elastic_launch``, what torchrun itself calls) starts N
ranks on this machine, each running :func:`_worker`, and returns rank 0's result.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import socket
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

try:  # typer >= 0.29 vendors click
    from typer._click import exceptions as click_exc
except ImportError:  # pragma: no cover - older typer on top of click
    from click import exceptions as click_exc  # type: ignore[no-redef]

from dflash_trt.errors import DFlashError
from dflash_trt.train.checks import preflight
from dflash_trt.train.loop import train_drafter
from dflash_trt.train.options import parameters, settings_from
from dflash_trt.train.settings import Progress, Result, TrainSettings


def command() -> Any:
    """``python -m dflash_trt.train``'s command: the options ``train-drafter`` takes (``options``)."""

    def rank(**params: Any) -> TrainSettings:
        return settings_from(params.pop("ctx"), params)

    rank.__signature__ = inspect.Signature(parameters())  # type: ignore[attr-defined]
    app = typer.Typer(add_completion=False)
    app.command(
        help="Train a DFlash drafter in each rank torchrun starts; the options are those of "
        "`dflash-trt train-drafter` (but --nproc: torchrun starts the ranks)."
    )(rank)
    return typer.main.get_command(app)


def settings_from_argv(argv: list[str]) -> TrainSettings | int:
    """The settings ``argv`` gives, or the exit code of a ``--help`` or a usage error (said on stderr)."""
    try:
        got = command().main(args=argv, prog_name="python -m dflash_trt.train", standalone_mode=False)
    except click_exc.ClickException as exc:
        exc.show()
        return exc.exit_code
    return got if isinstance(got, TrainSettings) else int(got or 0)


def line_progress(write: Callable[[str], None] | None = None) -> Progress:
    """Progress as plain lines: each phase, about every 5% of it, and every log line."""
    write = write or (lambda line: print(line, file=sys.stderr, flush=True))
    state = {"name": "", "total": 0, "every": 1}

    def phase(name: str, total: int) -> None:
        state.update(name=name, total=total, every=max(1, total // 20))
        write(f"{name}: {total}")

    def advance(done: int, info: dict) -> None:
        if done == 0 or (done % state["every"] and done != state["total"]):
            return
        text = f", loss {info['loss']:.3f}, τ {info['tau']:.2f}" if "loss" in info else ""
        write(f"{state['name']}: {done}/{state['total']}{text}")

    return Progress(phase=phase, advance=advance, log=write)


def main(argv: list[str] | None = None) -> int:
    """One rank of ``torchrun ... -m dflash_trt.train``: train, print rank 0's summary line."""
    rank = int(os.environ.get("RANK", "0"))
    try:
        settings = settings_from_argv(sys.argv[1:] if argv is None else argv)
        if not isinstance(settings, TrainSettings):
            return settings
        result = train_drafter(settings, line_progress() if rank == 0 else Progress())
    except DFlashError as exc:
        where = "" if rank == 0 else f" (rank {rank})"
        print(f"dflash_trt.train: error{where}: {exc}", file=sys.stderr)
        return exc.exit_code
    if rank == 0:
        held = "n/a" if result.heldout_tau is None else f"{result.heldout_tau:.2f}"
        print(f"drafter written to {result.out} (step {result.step}, loss {result.loss:.4f}, held-out τ {held})")
    return 0


def _worker(settings: TrainSettings) -> dict:
    """The entry point of each rank :func:`launch` starts (a user error is returned, not raised)."""
    rank = int(os.environ.get("RANK", "0"))
    try:
        return {"result": train_drafter(settings, line_progress() if rank == 0 else Progress())}
    except DFlashError as exc:
        return {"error": str(exc)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(settings: TrainSettings, nproc: int) -> Result:
    """Train on ``nproc`` local ranks (started by torch's launcher); rank 0's result."""
    if nproc < 1:
        raise DFlashError("--nproc must be >= 1")
    preflight(settings, nproc)  # a user error in a second, not after starting the ranks
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=uuid.uuid4().hex,
        rdzv_backend="c10d",
        rdzv_endpoint=f"127.0.0.1:{_free_port()}",
        max_restarts=0,
    )
    threads = os.environ.get("OMP_NUM_THREADS")
    if threads is None:  # the ranks share the cores, as torchrun arranges
        os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // nproc))
    try:
        returned = elastic_launch(config, _worker)(settings)
    except ChildFailedError as exc:
        first = next(iter(exc.failures.values()))
        raise DFlashError(f"a training rank failed (exit code {first.exitcode}); its error is above") from None
    finally:
        if threads is None:
            os.environ.pop("OMP_NUM_THREADS", None)
    errors = [returned[r]["error"] for r in sorted(returned) if "error" in returned[r]]
    if errors:
        raise DFlashError(errors[0])
    result = returned[0]["result"]
    return dataclasses.replace(result, out=Path(result.out))
