"""Options and helpers shared by the commands."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Optional

import typer
from rich.console import Console

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

TargetOpt = Annotated[Optional[str], typer.Option("--target", "-t", help="Target model: local directory or hub id (org/name[@rev]). Default: the embedded tiny pair.")]
DrafterOpt = Annotated[Optional[str], typer.Option("--drafter", "-d", help="DFlash drafter: local directory or hub id, any published format.")]
DtypeOpt = Annotated[str, typer.Option("--dtype", help="Runtime dtype: auto (float32 on CPU), float32, bfloat16, float16.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of text.")]


def print_json(obj) -> None:
    sys.stdout.write(json.dumps(obj, indent=2) + "\n")
    sys.stdout.flush()


DEFAULT_RECIPE = "tiny"


def default_pair() -> tuple[str, str]:
    """(target, drafter) of the bundled ``tiny`` recipe: the pair shipped inside the package."""
    from dflash_trt import recipe

    r = recipe.load(DEFAULT_RECIPE)
    return r.target.id, r.drafter.id


def default_prompts() -> str:
    """Held-out standard-library prompts shipped with the embedded pair."""
    from dflash_trt.checkpoint import embedded_dir

    return str(embedded_dir("tiny") / "heldout_prompts.jsonl")


def _one_thread_for_tiny_models() -> None:
    """The embedded pair's matrices are tiny: one CPU thread runs it fastest.

    With torch's default of one OpenMP thread per core, every small op pays a thread
    hand-off; on a busy CPU that made the embedded pair ~5x slower (bench: 106 vs 511
    autoregressive tokens/s on a shared 2-core machine). OMP_NUM_THREADS still wins.
    """
    import os

    import torch

    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)


def load_pair_from(target: str | None, drafter: str | None, dtype: str, need_drafter: bool = True):
    from dflash_trt.errors import DFlashError
    from dflash_trt.pair import load_pair

    if target is None:
        if drafter is not None:
            raise DFlashError("--drafter needs --target: pass both, or neither for the embedded tiny pair")
        target, drafter = default_pair()
        _one_thread_for_tiny_models()
        if not need_drafter:
            drafter = None
    elif drafter is None and need_drafter:
        raise DFlashError("no drafter given: pass --drafter DIR_OR_HUB_ID")
    with err.status("loading models"):
        return load_pair(target, drafter, dtype=dtype)
