"""TensorRT over a bundle's ``engines/``: the speculative loop through the built engines, on a GPU.

Written against TensorRT 10's Python API (``tensorrt.Runtime.deserialize_cuda_engine``,
``IExecutionContext.set_input_shape`` / ``set_tensor_address`` / ``execute_async_v3``; see
TensorRT's Python API reference, "IExecutionContext") with the dflash plugins registered in
TensorRT's plugin registry first (``plugins.trt.register_trt_plugins``). Every buffer is a
torch CUDA tensor: inputs are bound by address, outputs allocated at the shapes the context
infers, the drafter's ``k_cache_out`` / ``v_cache_out`` bound to the cache inputs themselves
(the KVInjection plugin declares them aliased, so the update is in place), and the engines run
on torch's current stream, so nothing crosses to the host between layers or between calls.

Where ``tensorrt`` or a GPU is missing, :class:`TensorRTBackend` refuses in one line. Nothing
here has run on this project's development machines (no GPU, no tensorrt there); ``bench/
engines.py`` runs it where both exist.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from dflash_trt.errors import DFlashError, HardwareError
from dflash_trt.plugins import trt as dflash_plugins
from dflash_trt.runtime.graph_backend import GraphBackend

logger = logging.getLogger(__name__)

ENGINE_FILES = {"embed": "embed.engine", "target": "target.engine", "drafter": "drafter.engine"}
#: outputs written in place into an input's buffer (the plugin's aliased outputs)
ALIASES = {"drafter": {"k_cache_out": "k_cache", "v_cache_out": "v_cache"}}


def tensorrt_problem() -> str | None:
    """Why the TensorRT backend cannot run here (None: it can)."""
    try:
        import tensorrt  # noqa: F401  # optional: tensorrt (whether it imports is the question)
    except ImportError as exc:
        logger.debug("tensorrt does not import", exc_info=exc)  # a broken install's own traceback
        return f"the 'tensorrt' Python package (>= 10.8) is not importable ({exc})"
    if not torch.cuda.is_available():
        return "no CUDA GPU is visible to torch"
    return None


class TensorRTBackend(GraphBackend):
    """The three engines of ``engines_dir``, one execution context each, on ``cuda``."""

    name = "tensorrt"
    initial_pages = None  # the pool is allocated once at the profile's maximum: never resized

    def __init__(self, engines_dir: str | Path, profile, mask_token_id: int):
        problem = tensorrt_problem()
        if problem:
            raise HardwareError(
                f"--backend tensorrt needs TensorRT and a CUDA GPU: {problem}; "
                "use --backend onnx (CPU) or --backend torch"
            )
        import tensorrt as trt  # optional: tensorrt

        registered, reason = dflash_plugins.register_trt_plugins()
        if not registered:
            raise DFlashError(f"--backend tensorrt: cannot register the dflash TensorRT plugins: {reason}")
        self.trt = trt
        engines_dir = Path(engines_dir)
        runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
        self.engines, self.contexts = {}, {}
        for graph, filename in ENGINE_FILES.items():
            engine = runtime.deserialize_cuda_engine((engines_dir / filename).read_bytes())
            if engine is None:
                raise DFlashError(
                    f"{engines_dir / filename}: TensorRT cannot deserialize this engine "
                    "(built by another TensorRT version?); rebuild the bundle"
                )
            self.engines[graph], self.contexts[graph] = engine, engine.create_execution_context()
        self._dtypes = {
            trt.float32: torch.float32,
            trt.float16: torch.float16,
            trt.bfloat16: torch.bfloat16,
            trt.int32: torch.int32,
            trt.int64: torch.int64,
            trt.bool: torch.bool,
        }
        self._empty = torch.empty(1, device="cuda")  # an address for zero-volume tensors (an empty past)
        super().__init__(profile, mask_token_id, torch.device("cuda"))

    def _names(self, graph: str, mode) -> list[str]:
        e = self.engines[graph]
        return [n for n in (e.get_tensor_name(i) for i in range(e.num_io_tensors)) if e.get_tensor_mode(n) == mode]

    def input_shape(self, graph, name):
        return [d if d >= 0 else None for d in self.engines[graph].get_tensor_shape(name)]

    output_shape = input_shape  # the engine declares every I/O tensor's shape alike

    def input_names(self, graph):
        return self._names(graph, self.trt.TensorIOMode.INPUT)

    def output_names(self, graph):
        return self._names(graph, self.trt.TensorIOMode.OUTPUT)

    def _address(self, t: torch.Tensor) -> int:
        return t.data_ptr() if t.numel() else self._empty.data_ptr()

    def run(self, graph, feeds):  # pragma: no cover - needs TensorRT and a GPU
        trt, engine, ctx = self.trt, self.engines[graph], self.contexts[graph]
        bound = {}
        for name in self._names(graph, trt.TensorIOMode.INPUT):
            t = feeds[name].to(device=self.device, dtype=self._dtypes[engine.get_tensor_dtype(name)]).contiguous()
            bound[name] = t
            ctx.set_input_shape(name, tuple(t.shape))
            ctx.set_tensor_address(name, self._address(t))
        outs = []
        for name in self.graph_outputs[graph]:
            alias = ALIASES.get(graph, {}).get(name)
            if alias is not None:
                out = bound[alias]
            else:
                out = torch.empty(
                    tuple(ctx.get_tensor_shape(name)),
                    device=self.device,
                    dtype=self._dtypes[engine.get_tensor_dtype(name)],
                )
            ctx.set_tensor_address(name, self._address(out))
            outs.append(out)
        if not ctx.execute_async_v3(torch.cuda.current_stream().cuda_stream):
            raise DFlashError(f"TensorRT failed to run the {graph} engine")
        return outs
