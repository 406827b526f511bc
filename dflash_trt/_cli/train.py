"""dflash-trt train-drafter: train a DFlash or DFlash2 drafter for any transformers causal LM."""

from __future__ import annotations

import inspect
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.progress import Progress as Bar

from dflash_trt._cli.common import JsonOpt, err, out, print_json
from dflash_trt.train import Progress, parameters, settings_from


def train_drafter(**params: Any) -> None:
    # One line: typer lists a command by its docstring's first line.
    """Train a DFlash (or, with --arch dflash2, a DFlash2) drafter: target-regenerated responses, random anchors, block masks, decayed loss."""  # noqa: E501
    from dflash_trt.train import launch  # start-up: torch (the face loads the launcher on first use)

    nproc, as_json = params.pop("nproc"), params.pop("as_json")
    settings = settings_from(params.pop("ctx"), params)
    result = launch(settings, nproc) if nproc > 1 else _run_with_bars(settings)
    summary = _summary(result)
    if as_json:
        print_json(summary)
        return
    held = "n/a" if result.heldout_tau is None else f"{result.heldout_tau:.2f}"
    out.print(f"drafter written to {result.out} (step {result.step}, loss {summary['loss']}, held-out τ {held})")


# The options are TrainSettings' fields (dflash_trt.train.options: the parser python -m
# dflash_trt.train uses too), then what only this command takes.
_KW = inspect.Parameter.KEYWORD_ONLY
train_drafter.__signature__ = inspect.Signature(
    [  # type: ignore[attr-defined]
        *parameters(),
        inspect.Parameter(
            "nproc",
            _KW,
            default=1,
            annotation=Annotated[
                int,
                typer.Option(
                    "--nproc",
                    min=1,
                    help="Data-parallel ranks on this machine, started with torch's launcher (torchrun). "
                    "The batch is global.",
                ),
            ],
        ),
        inspect.Parameter("as_json", _KW, default=False, annotation=JsonOpt),
    ]
)


def _run_with_bars(settings):
    """Train, one progress bar per phase on stderr (loss, τ and the last held-out τ beside it)."""
    from dflash_trt.train import train_drafter as run  # start-up: torch (the face loads the loop on first use)

    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    with Bar(*columns, console=err, transient=False) as bar:
        state = {"task": None, "heldout": ""}

        def phase(name: str, total: int) -> None:
            if state["task"] is not None:
                bar.stop_task(state["task"])
            state["task"] = bar.add_task(name, total=total, info="")

        def advance(done: int, info: dict) -> None:
            if "heldout_tau" in info:
                state["heldout"] = f" held-out τ {info['heldout_tau']:.2f}"
            text = f"loss {info['loss']:.3f} τ {info['tau']:.2f}{state['heldout']}" if "loss" in info else ""
            if state["task"] is not None:
                bar.update(state["task"], completed=done, info=text)

        return run(settings, Progress(phase=phase, advance=advance, log=lambda line: bar.console.print(line)))


def _summary(result) -> dict:
    """The --json object (NaN losses, e.g. before the first step, become null)."""

    def num(x, nd):
        return None if x is None or x != x else round(x, nd)

    return {
        "out": str(result.out),
        "step": result.step,
        "loss": num(result.loss, 4),
        "train_tau": num(result.train_tau, 3),
        "heldout_tau": None if result.heldout_tau is None else round(result.heldout_tau, 3),
        "seconds": round(result.seconds, 1),
        "history": result.history,
    }


def register(app: typer.Typer) -> None:
    app.command("train-drafter")(train_drafter)
