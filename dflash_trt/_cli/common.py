"""Options and helpers shared by the commands."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer
from rich.console import Console

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

TargetOpt = Annotated[str | None, typer.Option(
    "--target", "-t",
    help="Target model: local directory or hub id (org/name\\[@rev]). Default: the embedded tiny pair.")]
DrafterOpt = Annotated[str | None, typer.Option(
    "--drafter", "-d", help="DFlash drafter: local directory or hub id, any published format.")]
DtypeOpt = Annotated[str, typer.Option(
    "--dtype", help="Runtime dtype: auto (float32 on CPU), float32, bfloat16, float16.")]
KernelsOpt = Annotated[str, typer.Option(
    "--kernels", help="DFlash op implementations: reference (PyTorch) or triton (needs a GPU, or TRITON_INTERPRET=1).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of text.")]
BundleArg = Annotated[str | None, typer.Argument(
    help="A bundle directory from `dflash-trt build` (instead of --target/--drafter).")]
BundleOpt = Annotated[str | None, typer.Option("--bundle", help="A bundle directory from `dflash-trt build`.")]
BackendOpt = Annotated[str, typer.Option(
    "--backend", help="What runs the models: torch (the reference runtime's PyTorch modules), onnx (ONNX Runtime over "
                      "the bundle's onnx/, CPU) or tensorrt (its engines/, GPU); onnx and tensorrt need a bundle "
                      "built with --engine tensorrt.")]


def print_json(obj) -> None:
    sys.stdout.write(json.dumps(obj, indent=2) + "\n")
    sys.stdout.flush()


DEFAULT_RECIPE = "tiny"


def default_pair() -> tuple[str, str]:
    """(target, drafter) of the bundled ``tiny`` recipe: the pair shipped inside the package."""
    from dflash_trt.plan import load_recipe

    r = load_recipe(DEFAULT_RECIPE)
    return r.target.id, r.drafter.id


def default_prompts() -> str:
    """Held-out standard-library prompts shipped with the embedded pair."""
    from dflash_trt.ingest import embedded_dir

    return str(embedded_dir("tiny") / "heldout_prompts.jsonl")


SMALL_MODEL_PARAMS = 50_000_000


def load_pair_from(target: str | None, drafter: str | None, dtype: str, need_drafter: bool = True,
                   bundle: str | None = None, bundle_opt: str | None = None, kernels: str = "reference",
                   backend: str = "torch"):
    """The pair a command runs: a bundle, --target/--drafter, or the embedded tiny pair; with
    ``backend`` onnx or tensorrt, a bundle's, answered by its exported graphs (``pair.backend``)."""
    from dflash_trt.errors import DFlashError
    from dflash_trt.plugins import KERNELS
    from dflash_trt.runtime import BACKENDS, open_backend

    if kernels not in KERNELS:
        raise DFlashError(f"--kernels {kernels!r}: choose one of {', '.join(KERNELS)}")
    if backend not in BACKENDS:
        raise DFlashError(f"--backend {backend!r}: choose one of {', '.join(BACKENDS)}")
    if backend != "torch" and (bundle or bundle_opt) is None:
        raise DFlashError(f"--backend {backend} runs a bundle's exported graphs: pass a bundle built with "
                          "--engine tensorrt")
    pair = _load(target, drafter, dtype, need_drafter, bundle, bundle_opt, graphs=backend != "torch")
    _threads_for(pair)
    if pair.drafter is not None:
        pair.drafter.kernels = kernels
    if backend != "torch":
        with err.status(f"opening the {backend} backend"):
            pair.backend = open_backend(backend, bundle or bundle_opt, pair, dtype)
    return pair


def _threads_for(pair) -> None:
    """Small models run fastest on one CPU thread.

    With torch's default of one OpenMP thread per core, every small op pays a thread
    hand-off; on a busy CPU that made the embedded pair ~5x slower (bench: 106 vs 511
    autoregressive tokens/s on a shared 2-core machine). Applies to CPU targets under
    SMALL_MODEL_PARAMS parameters; OMP_NUM_THREADS still wins.
    """
    import os

    import torch

    if "OMP_NUM_THREADS" in os.environ or pair.target.device.type not in ("cpu", "meta"):  # meta: graphs on a CPU
        return
    if sum(p.numel() for p in pair.target.model.parameters()) < SMALL_MODEL_PARAMS:
        torch.set_num_threads(1)


def _load(target, drafter, dtype, need_drafter, bundle, bundle_opt, graphs: bool = False):
    """``graphs``: a graph backend runs the bundle, so its PyTorch modules are not loaded
    (``runtime.load_graph_pair``: configs and tokenizer only)."""
    from dflash_trt.errors import DFlashError
    from dflash_trt.runtime import load_bundle, load_graph_pair, load_pair

    if bundle is not None and bundle_opt is not None and bundle != bundle_opt:
        raise DFlashError("give the bundle once: as an argument or with --bundle")
    bundle = bundle or bundle_opt
    if bundle is not None:
        if target is not None or drafter is not None:
            raise DFlashError("a bundle brings its own target and drafter: drop --target/--drafter")
        with err.status("loading bundle"):
            return load_graph_pair(bundle) if graphs else load_bundle(bundle, dtype=dtype)
    if target is None:
        if drafter is not None:
            raise DFlashError("--drafter needs --target: pass both, or neither for the embedded tiny pair")
        target, drafter = default_pair()
        if not need_drafter:
            drafter = None
    elif drafter is None and need_drafter:
        raise DFlashError("no drafter given: pass --drafter DIR_OR_HUB_ID")
    with err.status("loading models"):
        return load_pair(target, drafter, dtype=dtype)
