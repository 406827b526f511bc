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

import argparse
import dataclasses
import os
import socket
import sys
import typing
import uuid
from collections.abc import Callable
from pathlib import Path

from dflash_trt.errors import DFlashError
from dflash_trt.train.loop import preflight, train_drafter
from dflash_trt.train.settings import Progress, Result, TrainSettings

SHORT = {"target": "-t", "out": "-o", "block_size": "-b"}


def _int_list(value: str) -> list[int]:
    try:
        ids = [int(x) for x in value.replace(",", " ").split()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r}: expected integers like 1,3,5") from None
    if not ids:
        raise argparse.ArgumentTypeError("give at least one integer")
    return ids


def _unwrap_optional(tp) -> tuple[object, bool]:
    """(the type, whether None is allowed) of ``X``, ``X | None`` or ``Optional[X]``."""
    args = typing.get_args(tp)
    if type(None) in args and len(args) == 2:
        return next(a for a in args if a is not type(None)), True
    return tp, False


def parser() -> argparse.ArgumentParser:
    """Flags from the fields of TrainSettings (their annotations give the types)."""
    p = argparse.ArgumentParser(prog="python -m dflash_trt.train",
                                description="Train a DFlash drafter in each rank torchrun starts; the flags "
                                            "are those of `dflash-trt train-drafter` (see its --help).")
    hints = typing.get_type_hints(TrainSettings)  # real types, whatever spelling the annotations use
    for f in dataclasses.fields(TrainSettings):
        names = [f"--{f.name.replace('_', '-')}"] + ([SHORT[f.name]] if f.name in SHORT else [])
        required = f.default is dataclasses.MISSING
        kind, optional = _unwrap_optional(hints[f.name])
        if kind is bool:
            action = argparse.BooleanOptionalAction if optional else "store_true"
            p.add_argument(*names, dest=f.name, action=action, default=None if optional else False)
        else:
            conv = {int: int, float: float, list[int]: _int_list}.get(kind, str)
            p.add_argument(*names, dest=f.name, type=conv, required=required,
                           default=None if required else f.default, metavar=f.name.upper())
    return p


def settings_from_argv(argv: list[str]) -> TrainSettings:
    return TrainSettings(**vars(parser().parse_args(argv)))


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
        result = train_drafter(settings_from_argv(sys.argv[1:] if argv is None else argv),
                               line_progress() if rank == 0 else Progress())
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
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    if nproc < 1:
        raise DFlashError("--nproc must be >= 1")
    preflight(settings, nproc)             # a user error in a second, not after starting the ranks
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=uuid.uuid4().hex,
                          rdzv_backend="c10d", rdzv_endpoint=f"127.0.0.1:{_free_port()}", max_restarts=0)
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
