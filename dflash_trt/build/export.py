"""ONNX export of the drafter (with the two DFlash custom ops) and of the target, an
onnxruntime parity check, and the TensorRT engine build (optional imports throughout).

Drafter graph (``drafter.onnx``): one speculative round of the drafter, exactly
``Drafter.inject(target_hidden, n_new, cache)`` followed by ``Drafter.draft(block_embeds, cache)``:

    inputs : target_hidden [b, T, n_tap*H], n_new [b] int64, block_embeds [b, B, H],
             k_cache, v_cache [L, pages, page_size, kvh, d], page_table [b, max_pages] int32
             (already covering lengths + n_new: the runtime allocates pages),
             lengths [b] int64 (committed context length *before* this round's tokens)
    outputs: hidden [b, B, H] (final-normed block hidden states) or logits [b, B, V] when a
             head weight is given, k_cache_out, v_cache_out (the updated caches; TensorRT
             aliases them to the inputs, so the update is in place there)

fc -> hidden_norm -> the one fused K/V GEMM are plain ONNX nodes; ``dflash::KVInjection``
does k_norm + RoPE + paged scatter for all layers; every layer's attention is one
``dflash::BlockDiffusionAttention`` node reading the whole cache tensors (``layer``
attribute, no per-layer copies). Dims b, T, pages and max_pages are dynamic.

Target graph (``target.onnx``): a transformers causal LM with the DFlash target_hidden
(``output_hidden_states[i + 1]`` for each layer id, concatenated) as an extra output and
its KV cache as stacked tensors:

    inputs : input_ids [b, T], attention_mask [b, P+T], position_ids [b, T],
             past_k, past_v [layers, b, kvh, P, head_dim]
    outputs: logits [b, T, V], target_hidden [b, T, n_tap*H], present_k, present_v [layers, b, kvh, P+T, hd]
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from torch import nn

from dflash_trt.errors import DFlashError, HardwareError, require
from dflash_trt import plugins

DRAFTER_INPUTS = ["target_hidden", "n_new", "block_embeds", "k_cache", "v_cache", "page_table", "lengths"]
TARGET_INPUTS = ["input_ids", "attention_mask", "position_ids", "past_k", "past_v"]

#: fp32 parity bound the export is held to (ONNX Runtime vs ``Drafter.inject`` + ``draft``).
DRAFTER_ONNX_ATOL = 1e-4


class DrafterRound(nn.Module):
    """``Drafter.inject`` + ``Drafter.draft`` as one traceable forward over the custom ops."""

    def __init__(self, drafter, head_weight: torch.Tensor | None = None, kernels: str = "reference"):
        super().__init__()
        from dflash_trt.plugins import torch_ops  # noqa: F401  (registers torch.ops.dflash)

        self.drafter = drafter
        self.kernels = kernels
        wkv, bkv, k_norm = plugins.fused_kv_weights(drafter)
        self.register_buffer("kv_weight", wkv.detach().clone(), persistent=False)
        self.register_buffer("kv_bias", None if bkv is None else bkv.detach().clone(), persistent=False)
        self.register_buffer("k_norm_weight", k_norm.detach().clone(), persistent=False)
        self.head = None
        if head_weight is not None:
            self.head = nn.Linear(head_weight.shape[1], head_weight.shape[0], bias=False)
            self.head.weight = nn.Parameter(head_weight.detach().clone(), requires_grad=False)

    def forward(self, target_hidden, n_new, block_embeds, k_cache, v_cache, page_table, lengths):
        from dflash_trt.plugins import fused_kv

        d = self.drafter
        cfg = d.cfg
        kv = fused_kv(target_hidden, d.fc.weight, d.hidden_norm.weight, self.kv_weight, self.kv_bias, cfg.rms_norm_eps)
        k_cache, v_cache = torch.ops.dflash.kv_cache_update(
            kv, self.k_norm_weight, d.inv_freq, n_new, lengths, page_table, k_cache, v_cache,
            float(d.rope_scaling_factor), float(cfg.rms_norm_eps), cfg.num_key_value_heads, cfg.head_dim,
            self.kernels)
        ctx_len = lengths + n_new

        def attend(i, q, k, v):
            return torch.ops.dflash.block_attention(
                q, k, v, k_cache, v_cache, page_table, ctx_len, cfg.layer_causal(i), cfg.layer_window(i),
                cfg.head_dim ** -0.5, i, self.kernels)

        positions = ctx_len[:, None] + torch.arange(block_embeds.shape[1], device=block_embeds.device)
        out = d.block_forward(block_embeds, positions, attend)
        if self.head is not None:
            out = d.logits(out, self.head)
        return out, k_cache, v_cache


def example_round(drafter, batch: int = 2, T: int = 5, page_size: int = 4, seed: int = 0,
                  prior: int = 7):
    """Inputs for one round on a cache that already holds some context (random, never zeros)."""
    cfg = drafter.cfg
    gen = torch.Generator().manual_seed(seed)
    dtype = drafter.fc.weight.dtype
    H, n_tap = cfg.hidden_size, len(cfg.target_layer_ids)
    cache = drafter.new_cache(batch, page_size=page_size)
    with torch.no_grad():
        first = torch.randn(batch, prior, n_tap * H, generator=gen).to(dtype)
        drafter.inject(first, torch.tensor([prior - i % prior for i in range(batch)]), cache)
    n_new = torch.tensor([T - (i % T) for i in range(batch)])
    cache.reserve(n_new)
    inputs = dict(
        target_hidden=torch.randn(batch, T, n_tap * H, generator=gen).to(dtype), n_new=n_new,
        block_embeds=torch.randn(batch, cfg.block_size, H, generator=gen).to(dtype),
        k_cache=cache.k.clone(), v_cache=cache.v.clone(), page_table=cache.page_table.clone(),
        lengths=cache.lengths.clone(),
    )
    return inputs, cache


def export_drafter_onnx(drafter, out_dir, *, head_weight: torch.Tensor | None = None,
                        page_size: int = 4, dynamic: bool = True, filename: str = "drafter.onnx") -> Path:
    """Export one drafter round with ``dflash::KVInjection`` / ``dflash::BlockDiffusionAttention``;
    checked with ``onnx.checker`` (op schemas registered). Returns the .onnx path."""
    onnx = require("onnx", "onnx", "ONNX export")
    require("onnxscript", "onnx", "ONNX export")
    from torch.export import Dim

    from dflash_trt.plugins import onnx_ops

    cfg = drafter.cfg
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    module = DrafterRound(drafter, head_weight=head_weight).eval()
    inputs, _ = example_round(drafter, page_size=page_size)
    table = onnx_ops.translation_table(
        num_layers=cfg.num_hidden_layers, num_heads=cfg.num_attention_heads,
        num_kv_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim, block_size=cfg.block_size,
        page_size=page_size, rope_theta=cfg.rope_theta)
    dyn = None
    if dynamic:
        b, T, P, M = Dim("batch"), Dim("new_tokens"), Dim("pages"), Dim("max_pages")
        dyn = {"target_hidden": {0: b, 1: T}, "n_new": {0: b}, "block_embeds": {0: b}, "k_cache": {1: P},
               "v_cache": {1: P}, "page_table": {0: b, 1: M}, "lengths": {0: b}}
    path = out / filename
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        prog = torch.onnx.export(
            module, tuple(inputs[n] for n in DRAFTER_INPUTS), dynamo=True, dynamic_shapes=dyn,
            custom_translation_table=table, input_names=DRAFTER_INPUTS,
            output_names=["logits" if head_weight is not None else "hidden", "k_cache_out", "v_cache_out"],
            optimize=True, verbose=False)
    model = prog.model_proto
    onnx_ops.register_onnx_schemas()
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return path


def run_drafter_onnx(onnx_path, inputs: dict) -> list:
    """Run the exported drafter round in onnxruntime with the Python custom ops."""
    from dflash_trt.plugins import onnx_ops

    sess = onnx_ops.ort_session(onnx_path)
    names = {i.name for i in sess.get_inputs()}
    return sess.run(None, {k: v.detach().cpu().numpy() for k, v in inputs.items() if k in names})


def check_drafter_onnx(drafter, onnx_path, *, head_weight: torch.Tensor | None = None, page_size: int = 4,
                       batch: int = 3, T: int = 4, seed: int = 1) -> dict:
    """onnxruntime vs PyTorch (``Drafter.inject`` + ``Drafter.draft``) on fresh inputs whose
    batch / T / cache sizes differ from the export's. Returns max abs errors per output."""
    import numpy as np

    inputs, cache = example_round(drafter, batch=batch, T=T, page_size=page_size, seed=seed)
    got = run_drafter_onnx(onnx_path, inputs)
    with torch.no_grad():
        drafter.inject(inputs["target_hidden"], inputs["n_new"], cache)
        hidden = drafter.draft(inputs["block_embeds"], cache)
        if head_weight is not None:
            head = nn.Linear(head_weight.shape[1], head_weight.shape[0], bias=False)
            head.weight = nn.Parameter(head_weight)
            hidden = drafter.logits(hidden, head)
    want = [hidden, cache.k, cache.v]
    names = ["logits" if head_weight is not None else "hidden", "k_cache", "v_cache"]
    return {n: float(np.abs(g - w.numpy()).max()) for n, g, w in zip(names, got, want)}


# ---------------------------------------------------------------------------------------
# target
# ---------------------------------------------------------------------------------------


class TargetWithTaps(nn.Module):
    """A causal LM forward with stacked KV-cache tensors in and out, plus the DFlash target_hidden."""

    def __init__(self, model: nn.Module, layer_ids: list[int]):
        super().__init__()
        self.model = model.eval()
        self.layer_ids = list(layer_ids)
        cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        self.num_layers = int(cfg.num_hidden_layers)

    def forward(self, input_ids, attention_mask, position_ids, past_k, past_v):
        from transformers import DynamicCache

        cache = DynamicCache(config=self.model.config)
        for i in range(self.num_layers):
            cache.update(past_k[i], past_v[i], i)
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         past_key_values=cache, use_cache=True, output_hidden_states=True)
        target_hidden = torch.cat([out.hidden_states[i + 1] for i in self.layer_ids], dim=-1)
        layers = out.past_key_values.layers
        return (out.logits, target_hidden, torch.stack([layers[i].keys for i in range(self.num_layers)]),
                torch.stack([layers[i].values for i in range(self.num_layers)]))


def target_example_inputs(model: nn.Module, batch: int = 2, past: int = 5, T: int = 3, seed: int = 0) -> dict:
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    gen = torch.Generator().manual_seed(seed)
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kvh = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    L = int(cfg.num_hidden_layers)
    dtype = model.get_input_embeddings().weight.dtype
    return dict(
        input_ids=torch.randint(0, cfg.vocab_size, (batch, T), generator=gen),
        attention_mask=torch.ones(batch, past + T, dtype=torch.long),
        position_ids=torch.arange(past, past + T)[None].expand(batch, -1).contiguous(),
        past_k=torch.randn(L, batch, kvh, past, hd, generator=gen).to(dtype),
        past_v=torch.randn(L, batch, kvh, past, hd, generator=gen).to(dtype),
    )


def export_target_onnx(hf_model: nn.Module, layer_ids: list[int], out_dir, *, filename: str = "target.onnx") -> Path:
    """Export a transformers causal LM (Llama/Qwen3-style) with target_hidden and KV-cache I/O."""
    onnx = require("onnx", "onnx", "ONNX export")
    require("onnxscript", "onnx", "ONNX export")
    from torch.export import Dim

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    module = TargetWithTaps(hf_model, layer_ids)
    inputs = target_example_inputs(hf_model)
    D = Dim.DYNAMIC
    dyn = {"input_ids": {0: D, 1: D}, "attention_mask": {0: D, 1: D}, "position_ids": {0: D, 1: D},
           "past_k": {1: D, 3: D}, "past_v": {1: D, 3: D}}
    path = out / filename
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        prog = torch.onnx.export(module, tuple(inputs[n] for n in TARGET_INPUTS), dynamo=True,
                                 dynamic_shapes=dyn, input_names=TARGET_INPUTS,
                                 output_names=["logits", "target_hidden", "present_k", "present_v"], verbose=False)
    onnx.checker.check_model(prog.model_proto)
    prog.save(str(path))
    return path


def check_target_onnx(hf_model: nn.Module, layer_ids: list[int], onnx_path, **shape) -> dict:
    """onnxruntime vs the transformers forward; max abs error per output."""
    import numpy as np
    import onnxruntime as ort

    inputs = target_example_inputs(hf_model, **shape)
    sess = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    got = sess.run(None, {k: v.numpy() for k, v in inputs.items()})
    with torch.no_grad():
        want = TargetWithTaps(hf_model, layer_ids)(*(inputs[n] for n in TARGET_INPUTS))
    return {n: float(np.abs(g - w.numpy()).max())
            for n, g, w in zip(["logits", "target_hidden", "present_k", "present_v"], got, want)}


# ---------------------------------------------------------------------------------------
# TensorRT engines
# ---------------------------------------------------------------------------------------

ENGINE_REQUIREMENTS = (
    "building TensorRT engines needs: the 'tensorrt' Python package >= 10.8 with the "
    "'tensorrt.plugin' module (Python/AOT plugins), a CUDA GPU visible to torch, and "
    "triton (to compile the plugin kernels to PTX ahead of time)"
)


def engine_support() -> tuple[bool, str]:
    """(True, "") when engines can be built here, else (False, what is missing)."""
    try:
        import tensorrt  # noqa: F401
        import tensorrt.plugin  # noqa: F401
    except ImportError as exc:
        return False, f"{ENGINE_REQUIREMENTS}; tensorrt is not importable ({exc})"
    if not torch.cuda.is_available():
        return False, f"{ENGINE_REQUIREMENTS}; no CUDA GPU is available"
    try:
        import triton  # noqa: F401
    except ImportError:
        return False, f"{ENGINE_REQUIREMENTS}; triton is not installed"
    return True, ""


def _onnx_for_tensorrt(model):
    """TensorRT's ONNX parser finds a plugin by node op_type plus the ``plugin_namespace``
    and ``plugin_version`` attributes: add them to a copy of the dflash nodes."""
    import onnx

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


def build_engines(onnx_dir, engines_dir, *, fp16: bool = False, max_batch: int = 64,
                  max_new_tokens: int = 16, max_pages: int = 4096, max_pages_per_seq: int = 2048) -> list[Path]:
    """Build a TensorRT engine for every ``*.onnx`` in ``onnx_dir`` (the drafter with the
    dflash plugins). Raises :class:`DFlashError` saying what is missing when it cannot."""
    ok, why = engine_support()
    if not ok:
        if "GPU" in why and "not importable" not in why:
            raise HardwareError(why)
        raise DFlashError(why)
    import onnx
    import tensorrt as trt

    from dflash_trt.plugins import trt as dflash_trt_plugins

    registered, reason = dflash_trt_plugins.register_trt_plugins()
    if not registered:
        raise DFlashError(f"cannot register the dflash TensorRT plugins: {reason}")
    onnx_dir, engines_dir = Path(onnx_dir), Path(engines_dir)
    engines_dir.mkdir(parents=True, exist_ok=True)
    logger = trt.Logger(trt.Logger.WARNING)
    built = []
    for path in sorted(onnx_dir.glob("*.onnx")):
        builder = trt.Builder(logger)
        network = builder.create_network(0)
        parser = trt.OnnxParser(network, logger)
        model = _onnx_for_tensorrt(onnx.load(str(path)))
        if not parser.parse(model.SerializeToString(), path=str(path)):
            errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
            raise DFlashError(f"TensorRT cannot parse {path.name}: {errors}")
        config = builder.create_builder_config()
        if fp16:
            config.set_flag(trt.BuilderFlag.FP16)
        profile = builder.create_optimization_profile()
        for i in range(network.num_inputs):
            t = network.get_input(i)
            shape = list(t.shape)
            lo, opt, hi = [], [], []
            for axis, dim in enumerate(shape):
                if dim >= 0:
                    lo.append(dim), opt.append(dim), hi.append(dim)
                    continue
                cap = {"k_cache": max_pages, "v_cache": max_pages}.get(t.name)
                if cap is None:
                    cap = max_pages_per_seq if (t.name == "page_table" and axis == 1) else (
                        max_new_tokens if axis == 1 else max_batch)
                lo.append(1), opt.append(max(1, cap // 2)), hi.append(cap)
            profile.set_shape(t.name, lo, opt, hi)
        config.add_optimization_profile(profile)
        blob = builder.build_serialized_network(network, config)
        if blob is None:
            raise DFlashError(f"TensorRT failed to build an engine for {path.name}")
        dst = engines_dir / (path.stem + ".engine")
        dst.write_bytes(bytes(blob))
        built.append(dst)
    return built
