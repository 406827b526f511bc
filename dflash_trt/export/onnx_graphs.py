"""ONNX export of the DFlash drafter round with the two DFlash custom ops, and its onnxruntime
parity check; the public face of the standalone path's three graphs (TensorRT engines are built
from them in ``engines.py``).

Invariant: ``drafter.onnx`` computes exactly ``Drafter.inject`` then ``Drafter.draft`` over the
custom ops, with ``graph_io``'s I/O names and dynamic axes. This module also re-exports the graphs'
contract (``graph_io``) and the target side (``onnx_target``: ``target.onnx``, ``embed.onnx``), so
``onnx_graphs.<name>`` reaches every graph.

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
attribute, no per-layer copies). Dims b, T, pages and max_pages are dynamic; B and
page_size are fixed at export (custom-op attributes).

:data:`DYNAMIC_AXES` names every dynamic axis by the profile dimension it is
(``ingest.EngineProfile``): the TensorRT optimisation profile and the runtimes' checks read it.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.export import Dim

from dflash_trt import plugins
from dflash_trt.errors import require
from dflash_trt.export.graph_io import (
    DRAFTER_INPUTS,
    DRAFTER_ONNX_ATOL,
    DYNAMIC_AXES,
    GRAPHS,
    PAGE_SIZE,
    TARGET_INPUTS,
    TARGET_ONNX_ATOL,
    TARGET_OUTPUTS,
)
from dflash_trt.export.onnx_target import (
    TargetWithTaps,
    check_target_onnx,
    export_embed_onnx,
    export_target_onnx,
    target_example_inputs,
    target_export_problem,
)
from dflash_trt.plugins import (
    onnx_ops,
    torch_ops,  # noqa: F401  (registers torch.ops.dflash, which DrafterRound calls)
)

__all__ = [
    "DRAFTER_INPUTS",
    "DRAFTER_ONNX_ATOL",
    "DYNAMIC_AXES",
    "GRAPHS",
    "PAGE_SIZE",
    "TARGET_INPUTS",
    "TARGET_ONNX_ATOL",
    "TARGET_OUTPUTS",
    "DrafterRound",
    "TargetWithTaps",
    "check_drafter_onnx",
    "check_target_onnx",
    "example_round",
    "export_drafter_onnx",
    "export_embed_onnx",
    "export_target_onnx",
    "run_drafter_onnx",
    "target_example_inputs",
    "target_export_problem",
]


class DrafterRound(nn.Module):
    """``Drafter.inject`` + ``Drafter.draft`` as one traceable forward over the custom ops."""

    def __init__(self, drafter, head_weight: torch.Tensor | None = None, kernels: str = "reference"):
        super().__init__()
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
        d = self.drafter
        cfg = d.cfg
        kv = plugins.fused_kv(
            target_hidden, d.fc.weight, d.hidden_norm.weight, self.kv_weight, self.kv_bias, cfg.rms_norm_eps
        )
        k_cache, v_cache = torch.ops.dflash.kv_cache_update(
            kv,
            self.k_norm_weight,
            d.inv_freq,
            n_new,
            lengths,
            page_table,
            k_cache,
            v_cache,
            float(d.rope_scaling_factor),
            float(cfg.rms_norm_eps),
            cfg.num_key_value_heads,
            cfg.head_dim,
            self.kernels,
        )
        ctx_len = lengths + n_new

        def attend(i, q, k, v):
            return torch.ops.dflash.block_attention(
                q,
                k,
                v,
                k_cache,
                v_cache,
                page_table,
                ctx_len,
                cfg.layer_causal(i),
                cfg.layer_window(i),
                cfg.head_dim**-0.5,
                i,
                self.kernels,
            )

        positions = ctx_len[:, None] + torch.arange(block_embeds.shape[1], device=block_embeds.device)
        out = d.block_forward(block_embeds, positions, attend)
        if self.head is not None:
            out = d.logits(out, self.head)
        return out, k_cache, v_cache


def example_round(drafter, batch: int = 2, T: int = 5, page_size: int = 4, seed: int = 0, prior: int = 7):
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
        target_hidden=torch.randn(batch, T, n_tap * H, generator=gen).to(dtype),
        n_new=n_new,
        block_embeds=torch.randn(batch, cfg.block_size, H, generator=gen).to(dtype),
        k_cache=cache.k.clone(),
        v_cache=cache.v.clone(),
        page_table=cache.page_table.clone(),
        lengths=cache.lengths.clone(),
    )
    return inputs, cache


def export_drafter_onnx(
    drafter,
    out_dir,
    *,
    head_weight: torch.Tensor | None = None,
    page_size: int = 4,
    dynamic: bool = True,
    filename: str = "drafter.onnx",
) -> Path:
    """Export one drafter round with ``dflash::KVInjection`` / ``dflash::BlockDiffusionAttention``;
    checked with ``onnx.checker`` (op schemas registered). Returns the .onnx path."""
    onnx = require("onnx", "onnx", "ONNX export")
    require("onnxscript", "onnx", "ONNX export")
    cfg = drafter.cfg
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    module = DrafterRound(drafter, head_weight=head_weight).eval()
    inputs, _ = example_round(drafter, page_size=page_size)
    table = onnx_ops.translation_table(
        num_layers=cfg.num_hidden_layers,
        num_heads=cfg.num_attention_heads,
        num_kv_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim,
        block_size=cfg.block_size,
        page_size=page_size,
        rope_theta=cfg.rope_theta,
    )
    dyn = None
    if dynamic:
        dims = {n: Dim(n) for n in ("batch", "tokens", "pages", "pages_per_seq")}
        dyn = {name: {axis: dims[d] for axis, d in axes.items()} for name, axes in DYNAMIC_AXES["drafter"].items()}
    path = out / filename
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        prog = torch.onnx.export(
            module,
            tuple(inputs[n] for n in DRAFTER_INPUTS),
            dynamo=True,
            dynamic_shapes=dyn,
            custom_translation_table=table,
            input_names=DRAFTER_INPUTS,
            output_names=["logits" if head_weight is not None else "hidden", "k_cache_out", "v_cache_out"],
            optimize=True,
            verbose=False,
        )
    model = prog.model_proto
    onnx_ops.register_onnx_schemas()
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return path


def run_drafter_onnx(onnx_path, inputs: dict) -> list:
    """Run the exported drafter round in onnxruntime with the Python custom ops."""
    sess = onnx_ops.ort_session(onnx_path)
    names = {i.name for i in sess.get_inputs()}
    return sess.run(None, {k: v.detach().cpu().numpy() for k, v in inputs.items() if k in names})


def check_drafter_onnx(
    drafter,
    onnx_path,
    *,
    head_weight: torch.Tensor | None = None,
    page_size: int = 4,
    batch: int = 3,
    T: int = 4,
    seed: int = 1,
) -> dict:
    """onnxruntime vs PyTorch (``Drafter.inject`` + ``Drafter.draft``) on fresh inputs whose
    batch / T / cache sizes differ from the export's. Returns max abs errors per output."""
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
    return {n: float(np.abs(g - w.numpy()).max()) for n, g, w in zip(names, got, want, strict=True)}
