"""How a pair runs, decided once: the :class:`RunSpec` (backend, kernels).

The words (docs/design/pipeline.md, "Words"): the **backend** executes the forwards under the runtime's loop
(``torch``: the PyTorch modules; ``onnx``: ONNX Runtime over a bundle's ``onnx/``; ``tensorrt``:
TensorRT over its ``engines/``); the **kernels** are the dflash ops' implementation inside the
torch backend, named for what runs: ``lean`` (the runtime's fused PyTorch round and decoder
forward, checked once against the reference ops on a probe; the reference ops where that check
does not hold or does not apply) | ``triton`` (the Triton kernels). The reference ops
themselves (``plugins``' ``kernels="reference"``, the specification) are the tests'. Every
backend batches continuously (the scheduler: rows join and leave a running batch every round).

:func:`resolve_run` is the one place the user's choices meet the bundle: it refuses, in one
DFlashError line, only what truly cannot run, before any weights load:

- ``onnx`` / ``tensorrt`` without a bundle whose build exported the graphs (``build --graphs``),
  or with a graph profile older than the runtime, or in a dtype other than the graphs' float32;
- ``tensorrt`` where TensorRT or a CUDA GPU is missing, or on a bundle without ``engines/``;
- ``triton`` kernels with a graph backend (the graphs carry their own op implementations).

What resolving changed from the choices given is said once, in :attr:`RunSpec.notes`. Loading
(``load_pair`` / ``load_bundle``) takes the resolved spec and returns a finished :class:`~dflash_trt.runtime.pair.Pair`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from dflash_trt import ingest
from dflash_trt.errors import DFlashError, HardwareError
from dflash_trt.runtime.trt_backend import tensorrt_problem

#: what ``--backend`` chooses: the PyTorch modules, ONNX Runtime over onnx/, TensorRT over engines/
BACKENDS = ("torch", "onnx", "tensorrt")
#: the backends that run a bundle's exported graphs
GRAPH_BACKENDS = ("onnx", "tensorrt")
#: what ``--kernels`` chooses inside the torch backend: the lean fused path, or the Triton kernels
KERNELS = ("lean", "triton")
#: the ``plugins`` dispatch each choice sets on the drafter (lean: the reference ops the lean
#: round is probed against and falls back to; ``runtime.lean_drafter``)
DISPATCH = {"lean": "reference", "triton": "triton"}


@dataclass(frozen=True)
class RunSpec:
    """A resolved run: every field is a value that runs (see :func:`resolve_run`)."""

    backend: str = "torch"
    kernels: str = "lean"
    #: what resolving changed from the choices given (one line each), for the caller to say once
    notes: tuple[str, ...] = field(default=(), compare=False)

    @property
    def graphs(self) -> bool:
        """True when the backend runs a bundle's exported graphs (onnx, tensorrt)."""
        return self.backend in GRAPH_BACKENDS


def resolve_run(
    backend: str = "torch", kernels: str = "lean", *, bundle: str | Path | None = None, dtype: str = "auto"
) -> RunSpec:
    """The :class:`RunSpec` for the user's choices and the bundle (None: a pair named by
    ``--target``/``--drafter``), or one DFlashError line for a combination that cannot run.

    """
    _choice("--backend", backend, BACKENDS)
    _choice("--kernels", kernels, KERNELS)
    if backend == "torch":
        return RunSpec(backend, kernels)
    if kernels != "lean":
        raise DFlashError(
            f"--kernels {kernels} chooses the torch backend's dflash ops; the {backend} backend runs "
            "the graphs' own: drop --kernels or use --backend torch"
        )
    if bundle is None:
        raise DFlashError(f"--backend {backend} runs a bundle's exported graphs: pass a bundle built with --graphs")
    _check_graphs(backend, bundle, dtype)
    return RunSpec(backend, kernels)


def _choice(flag: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise DFlashError(f"{flag} {value!r}: choose one of {', '.join(allowed)}")


def _check_graphs(backend: str, bundle: str | Path, dtype: str) -> None:
    """What the graph backends need of the bundle and of this machine (manifest only, no weights)."""
    b = ingest.open_bundle(bundle)
    graphs = b.built.graphs  # the manifest's record of the exported graphs and engines
    if graphs is None:
        raise DFlashError(
            f"{b.root}: --backend {backend} runs the exported graphs of a bundle built with "
            "--graphs; this one has none (rebuild it so, or use --backend torch)"
        )
    if graphs.profile is None or not (b.onnx / "embed.onnx").is_file():
        raise DFlashError(f"{b.root}: its onnx/ predates the recorded engine profile; rebuild it with --graphs")
    if dtype not in ("auto", "float32"):
        raise DFlashError(f"--backend {backend} runs the float32 graphs the build exported; drop --dtype {dtype}")
    if backend == "tensorrt":
        problem = tensorrt_problem()
        if problem:
            raise HardwareError(
                f"--backend tensorrt needs TensorRT and a CUDA GPU: {problem}; "
                "use --backend onnx (CPU) or --backend torch"
            )
        if not graphs.engines_built:
            raise DFlashError(
                f"{b.root}: no engines/ in this bundle (the build said: {graphs.engines_reason}); "
                "rebuild it where TensorRT and a GPU are, or use --backend onnx"
            )
