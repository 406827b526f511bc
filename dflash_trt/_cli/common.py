"""Options and helpers shared by the commands: one definition per flag, so ``--backend``,
``--kernels``, ``--dtype`` mean the same in generate, bench and serve, and one function
(:func:`run_spec`) that resolves them (``runtime.resolve_run``) and says its notes once."""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from dflash_trt import ingest
from dflash_trt.errors import DFlashError
from dflash_trt.plan import load_recipe

logger = logging.getLogger(__name__)
out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

#: the ``embedded:`` references --help lists (tests/test_cli_conventions.py checks them against
#: ``ingest.resolve.embedded_names()``; written out so --help need not walk the packaged assets)
EMBEDDED_REFS = ("embedded:tiny/target", "embedded:tiny/drafter")
TargetOpt = Annotated[
    str | None,
    typer.Option(
        "--target",
        "-t",
        help="Target model: local directory, hub id (org/name\\[@rev]) or embedded:NAME "
        f"({EMBEDDED_REFS[0]}). Default: the embedded tiny pair.",
    ),
]
DrafterOpt = Annotated[
    str | None,
    typer.Option(
        "--drafter",
        "-d",
        help=f"DFlash drafter: local directory, hub id (any published format) or embedded:NAME ({EMBEDDED_REFS[1]}).",
    ),
]
DtypeOpt = Annotated[
    str, typer.Option("--dtype", help="Runtime dtype: auto (float32 on CPU), float32, bfloat16, float16.")
]
KernelsOpt = Annotated[
    str,
    typer.Option(
        "--kernels",
        help="DFlash op implementations inside the torch backend: lean (the runtime's fused PyTorch path) "
        "or triton (needs a GPU, or TRITON_INTERPRET=1).",
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of text.")]
BundleArg = Annotated[
    str | None, typer.Argument(help="A bundle directory from `dflash-trt build` (instead of --target/--drafter).")
]
BlockSizeOpt = Annotated[
    int | None,
    typer.Option(
        "--block-size",
        "-b",
        min=1,
        help="Draft block size B (default: the drafter's trained block); 1 is plain autoregressive decoding.",
    ),
]
GpusPerNodeOpt = Annotated[int | None, typer.Option("--gpus-per-node", min=1, help="GPUs per node.")]
BackendOpt = Annotated[
    str,
    typer.Option(
        "--backend",
        help="What runs the models: torch (the reference runtime's PyTorch modules), onnx (ONNX Runtime over "
        "the bundle's onnx/, CPU) or tensorrt (its engines/, GPU); onnx and tensorrt need a bundle "
        "built with --graphs.",
    ),
]


@contextmanager
def steps(description: str, total: int | None):
    """Progress of a long loop: yields ``step(completed=None, description=None)`` (None: one more).
    On a terminal a transient rich bar; otherwise (CI logs, ``| tee``), where a live bar shows
    nothing, one stderr line per step, so a minute-long bench or tune is not silent."""
    if err.is_terminal:
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=err,
            transient=True,
        ) as bar:
            task = bar.add_task(description, total=total)

            def update(completed=None, desc=None):
                bar.update(
                    task,
                    **({"advance": 1} if completed is None else {"completed": completed}),
                    **({"description": desc} if desc else {}),
                )

            yield update
        return
    start, done = time.perf_counter(), [0]

    def line(completed=None, desc=None):
        done[0] = done[0] + 1 if completed is None else completed
        of = f"/{total}" if total else ""
        print(
            f"{desc or description}: {done[0]}{of} ({time.perf_counter() - start:.0f} s)", file=sys.stderr, flush=True
        )

    yield line


def print_json(obj) -> None:
    sys.stdout.write(json.dumps(obj, indent=2) + "\n")
    sys.stdout.flush()


DEFAULT_RECIPE = "tiny"


def default_pair() -> tuple[str, str]:
    """(target, drafter) of the bundled ``tiny`` recipe: the pair shipped inside the package."""
    r = load_recipe(DEFAULT_RECIPE)
    return r.target.id, r.drafter.id


def default_prompts() -> str:
    """Held-out standard-library prompts shipped with the embedded pair."""
    return str(ingest.embedded_dir("tiny") / "heldout_prompts.jsonl")


SMALL_MODEL_PARAMS = 50_000_000


def run_spec(backend: str = "torch", kernels: str = "lean", bundle: str | None = None, dtype: str = "auto"):
    """The resolved ``runtime.RunSpec`` for the flags (one DFlashError line if they cannot run);
    what resolving changed is said here, once, on stderr."""
    from dflash_trt.runtime import resolve_run  # start-up: torch (the runtime face loads it)

    # choices are case-insensitive, as typer's case_sensitive=False makes the enum flags
    backend, kernels, dtype = backend.lower(), kernels.lower(), dtype.lower()
    spec = resolve_run(backend, kernels, bundle=bundle, dtype=dtype)
    for note in spec.notes:
        err.print(note)
    return spec


def load_pair_from(
    target: str | None,
    drafter: str | None,
    dtype: str,
    need_drafter: bool = True,
    bundle: str | None = None,
    kernels: str = "lean",
    backend: str = "torch",
):
    """The finished pair a command runs: a bundle, --target/--drafter, or the embedded tiny pair,
    under the run spec the flags resolve to (``pair.backend`` answers its model calls)."""
    check_refs(target, drafter, need_drafter, bundle)
    spec = run_spec(backend, kernels, bundle=bundle, dtype=dtype)
    pair = _load(target, drafter, dtype, need_drafter, bundle, spec)
    _threads_for(pair)
    return pair


def check_refs(target=None, drafter=None, need_drafter: bool = True, bundle=None) -> None:
    """A bad path or a missing flag is refused from the file system alone, before the runtime
    (torch, transformers' model code) is imported: one line in well under a second."""
    if bundle is not None:
        ingest.open_bundle(str(bundle), require_manifest=False)  # serve takes a hand-made trtllm directory too
        return
    if target is None and drafter is not None:
        raise DFlashError("--drafter needs --target: pass both, or neither for the embedded tiny pair")
    if target is not None and drafter is None and need_drafter:
        raise DFlashError("no drafter given: pass --drafter DIR_OR_HUB_ID")
    for ref, role in ((target, "target"), (drafter, "drafter")):
        if ref is not None and _local(ref):  # hub ids are fetched when loaded, once
            ingest.resolve(ref, role)


def _local(ref: str) -> bool:
    """A reference ``ingest.resolve`` answers from this machine (no hub call): embedded, a path,
    or a name that cannot be a hub id."""
    return ref.startswith(("embedded:", "/", ".", "~")) or "/" not in ref or Path(ref.split("/")[0]).is_dir()


def _threads_for(pair) -> None:
    """Small models run fastest on one CPU thread.

    With torch's default of one OpenMP thread per core, every small op pays a thread
    hand-off; on a busy CPU that made the embedded pair ~5x slower (bench: 106 vs 511
    autoregressive tokens/s on a shared 2-core machine). Applies to CPU targets under
    SMALL_MODEL_PARAMS parameters; OMP_NUM_THREADS still wins.
    """
    import torch  # start-up: torch (called once a pair is loaded)

    if "OMP_NUM_THREADS" in os.environ or pair.target.device.type not in ("cpu", "meta"):  # meta: graphs on a CPU
        return
    if sum(p.numel() for p in pair.target.model.parameters()) < SMALL_MODEL_PARAMS:
        torch.set_num_threads(1)


def _load(target, drafter, dtype, need_drafter, bundle, spec):
    from dflash_trt.runtime import load_bundle, load_pair  # start-up: torch

    if bundle is not None:
        if target is not None or drafter is not None:
            raise DFlashError("a bundle brings its own target and drafter: drop --target/--drafter")
        with err.status("loading bundle" + (f" ({spec.backend} backend)" if spec.graphs else "")):
            return load_bundle(bundle, spec, dtype=dtype)
    if target is None:
        if drafter is not None:
            raise DFlashError("--drafter needs --target: pass both, or neither for the embedded tiny pair")
        target, drafter = default_pair()
        if not need_drafter:
            drafter = None
    elif drafter is None and need_drafter:
        raise DFlashError("no drafter given: pass --drafter DIR_OR_HUB_ID")
    with err.status("loading models"):
        return load_pair(target, drafter, spec, dtype=dtype)


def _plain(path):
    """``path``, to be written: refused when it exists and is not a regular file (a FIFO blocks a write)."""
    if path.exists() and not path.is_file():
        raise ValueError(f"{path} exists and is not a regular file")
    return path


def save_then_plot(report: dict, path, draw) -> str | None:
    """Results before the figure: ``report`` is written to PATH.json beside the plot, then
    ``draw(path)`` runs. A long benchmark never loses its results to the plot: a file the
    filesystem refuses (or a figure matplotlib cannot write) comes back as one line for the
    caller to raise *after* it has printed the results (None: both written). Each file is written
    under a fresh name and renamed over PATH (:func:`replace_file`): a symlink there is replaced,
    never written through."""
    path = Path(path)
    try:
        saved: Path | None = _plain(path.with_suffix(".json"))  # ValueError for a path with no name ("/", ".")
        replace_file(saved, lambda tmp: tmp.write_text(json.dumps(report, indent=2, default=str) + "\n"))
    except (OSError, ValueError) as exc:
        saved = None
        why = f"cannot write the results beside it ({getattr(exc, 'strerror', None) or exc})"
    try:
        replace_file(_plain(path), draw)
    except Exception as exc:  # noqa: BLE001 - whatever the figure's writer raises, the results are kept
        logger.debug("--plot %s failed", path, exc_info=exc)
        kept = f"the results are in {saved} and below" if saved else "the results are printed below"
        return f"--plot {path}: cannot write the plot ({getattr(exc, 'strerror', None) or exc}); {kept}"
    return None if saved else f"--plot {path}: {why}; the plot was written"


def replace_file(path, write) -> None:
    """``write(tmp)`` into a fresh hidden file beside ``path`` (created here: never an existing file
    or link), then renamed over ``path``; on failure the temporary file is removed."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        raise IsADirectoryError(21, "is a directory", str(path))
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.unlink(missing_ok=True)
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644))
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
