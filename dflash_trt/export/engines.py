"""TensorRT engines of the exported graphs, built for one optimisation profile, and that profile.

The profile (``ingest.EngineProfile``, recorded in the manifest) bounds every dynamic axis
``export.DYNAMIC_AXES`` names: each TensorRT input gets ``(min, opt, max)`` per axis from it
(:func:`profile_shapes`), so an engine accepts exactly the shapes the runtimes check a request
against before they run it. The drafter graph's two custom ops become the dflash plugins
(``plugins.trt``); TensorRT's ONNX parser finds them by op_type and the ``plugin_namespace``
attribute (TensorRT's "Adding custom layers" guide, ONNX parser plugin fallback).
"""

from __future__ import annotations

from pathlib import Path

import torch

from dflash_trt import ingest
from dflash_trt.errors import DFlashError, HardwareError
from dflash_trt.export.graph_io import DYNAMIC_AXES, GRAPHS, PAGE_SIZE
from dflash_trt.export.rounds import drafter_dynamic_axes
from dflash_trt.plugins import trt as dflash_trt_plugins

ENGINE_REQUIREMENTS = (
    "building TensorRT engines needs: the 'tensorrt' Python package >= 10.8 with the "
    "'tensorrt.plugin' module (Python/AOT plugins), a CUDA GPU visible to torch, and "
    "triton (to compile the plugin kernels to PTX ahead of time)"
)


def profile_for(serving, block_size: int, page_size: int = PAGE_SIZE):
    """The engine profile (``ingest.EngineProfile``) of a recipe's ``serving`` section: a request
    within its limits (batch, prompt + output <= ``max_seq_len``) fits. The target cache holds
    the committed context plus one verify block (``runtime``'s ``request_shapes`` gives the bound);
    a row's drafter context fits ``max_seq_len`` slots, every row at once the pool (pages of rows
    that finish are not reused within one call)."""
    pages_per_seq = -(-serving.max_seq_len // page_size)
    return ingest.EngineProfile(
        max_batch=serving.max_batch_size,
        max_tokens=min(serving.max_num_tokens, serving.max_seq_len),
        max_seq_len=serving.max_seq_len + block_size,
        block_size=block_size,
        page_size=page_size,
        max_pages=serving.max_batch_size * pages_per_seq,
        max_pages_per_seq=pages_per_seq,
    )


def dim_ranges(profile) -> dict[str, tuple[int, int, int]]:
    """(min, opt, max) of each named profile dimension; opt is a decode step at a middling batch."""
    p = profile
    return {
        "batch": (1, min(p.max_batch, 8), p.max_batch),
        "tokens": (1, min(p.block_size, p.max_tokens), p.max_tokens),
        "seq": (1, min(1024, p.max_seq_len), p.max_seq_len),
        "past": (0, min(1024, p.max_seq_len - 1), p.max_seq_len - 1),
        "pages": (1, min(p.max_pages, 64), p.max_pages),
        "pages_per_seq": (1, min(p.max_pages_per_seq, 64), p.max_pages_per_seq),
    }


def profile_shapes(graph: str, name: str, shape: list[int], profile) -> tuple[list[int], list[int], list[int]]:
    """(min, opt, max) shapes of input ``name`` of ``graph`` (a key of ``GRAPHS``); static axes
    (``shape[axis] >= 0``) stay as they are. The inputs a family's drafter graph adds are named
    by its export round (``rounds.drafter_dynamic_axes``)."""
    axes = {**DYNAMIC_AXES[graph], **(drafter_dynamic_axes() if graph == "drafter" else {})}.get(name, {})
    ranges = dim_ranges(profile)
    lo, opt, hi = [], [], []
    for axis, dim in enumerate(shape):
        if dim >= 0:
            lo.append(dim), opt.append(dim), hi.append(dim)
            continue
        if axis not in axes:
            raise DFlashError(f"{GRAPHS[graph]}: input {name} axis {axis} is dynamic but has no profile dimension")
        a, b, c = ranges[axes[axis]]
        lo.append(a), opt.append(b), hi.append(c)
    return lo, opt, hi


def engine_support() -> tuple[bool, str]:
    """(True, "") when engines can be built here, else (False, what is missing)."""
    try:
        import tensorrt  # noqa: F401  # optional: tensorrt
        import tensorrt.plugin  # noqa: F401  # optional: tensorrt
    except ImportError as exc:
        return False, f"{ENGINE_REQUIREMENTS}; tensorrt is not importable ({exc})"
    if not torch.cuda.is_available():
        return False, f"{ENGINE_REQUIREMENTS}; no CUDA GPU is available"
    try:
        import triton  # noqa: F401  # optional: triton
    except ImportError:
        return False, f"{ENGINE_REQUIREMENTS}; triton is not installed"
    return True, ""


def onnx_for_tensorrt(model):
    """TensorRT's ONNX parser finds a plugin by node op_type plus the ``plugin_namespace``
    and ``plugin_version`` attributes: add them to a copy of the dflash nodes."""
    import onnx  # optional: onnx

    m = onnx.ModelProto()
    m.CopyFrom(model)
    for node in m.graph.node:
        if node.domain == "dflash":
            names = {a.name for a in node.attribute}
            if "plugin_namespace" not in names:
                node.attribute.append(onnx.helper.make_attribute("plugin_namespace", "dflash"))
            if "plugin_version" not in names:
                node.attribute.append(onnx.helper.make_attribute("plugin_version", "1"))
    return m


def build_engines(onnx_dir, engines_dir, profile, *, fp16: bool = False) -> list[Path]:
    """Build ``engines/<graph>.engine`` for every graph of ``GRAPHS`` in ``onnx_dir``, with one
    optimisation profile from ``profile`` (``ingest.EngineProfile``). Raises
    :class:`DFlashError` saying what is missing when it cannot."""
    ok, why = engine_support()
    if not ok:
        if "GPU" in why and "not importable" not in why:
            raise HardwareError(why)
        raise DFlashError(why)
    import tensorrt as trt  # optional: tensorrt

    registered, reason = dflash_trt_plugins.register_trt_plugins()
    if not registered:
        raise DFlashError(f"cannot register the dflash TensorRT plugins: {reason}")
    onnx_dir, engines_dir = Path(onnx_dir), Path(engines_dir)
    engines_dir.mkdir(parents=True, exist_ok=True)
    logger = trt.Logger(trt.Logger.WARNING)
    built = []
    for graph, filename in GRAPHS.items():
        path = onnx_dir / filename
        if not path.is_file():
            continue
        blob = _build_one(trt, logger, graph, path, profile, fp16)
        dst = engines_dir / (path.stem + ".engine")
        dst.write_bytes(bytes(blob))
        built.append(dst)
    return built


def _build_one(trt, logger, graph: str, path: Path, profile, fp16: bool):  # pragma: no cover - needs TensorRT
    import onnx  # optional: onnx

    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    model = onnx_for_tensorrt(onnx.load(str(path)))
    if not parser.parse(model.SerializeToString(), path=str(path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise DFlashError(f"TensorRT cannot parse {path.name}: {errors}")
    config = builder.create_builder_config()
    if fp16:
        config.set_flag(trt.BuilderFlag.FP16)
    else:  # float32 means float32: TF32 matmuls (on by default from Ampere) could flip a greedy argmax
        config.clear_flag(trt.BuilderFlag.TF32)
    opt_profile = builder.create_optimization_profile()
    for i in range(network.num_inputs):
        t = network.get_input(i)
        opt_profile.set_shape(t.name, *profile_shapes(graph, t.name, list(t.shape), profile))
    config.add_optimization_profile(opt_profile)
    blob = builder.build_serialized_network(network, config)
    if blob is None:
        raise DFlashError(f"TensorRT failed to build an engine for {path.name}")
    return blob
