"""torch.library custom ops for the DFlash plugins, so torch.compile / torch.export trace them.

Importing this module registers (once per process):

* ``dflash::kv_injection(target_hidden, n_new, lengths, fc_weight, norm_weight, kv_weight, kv_bias?,
  k_norm_weight, inv_freq, k_cache!, v_cache!, page_table, rope_scale, eps, num_kv_heads,
  head_dim, kernels) -> ()`` - the whole KV injection, mutating both caches in place
  (``mutates_args=("k_cache", "v_cache")``); the op the runtime semantics are defined on.
* ``dflash::kv_cache_update(kv, k_norm_weight, inv_freq, n_new, lengths, page_table,
  k_cache, v_cache, rope_scale, eps, num_kv_heads, head_dim, kernels) -> (k_cache',
  v_cache')`` - the functional post-GEMM stage, 1:1 with the ONNX/TensorRT op
  ``dflash::KVInjection`` (returns updated copies; TensorRT aliases them in place).
* ``dflash::block_attention(q, k, v, k_cache, v_cache, page_table, lengths, causal,
  window?, scale, layer, kernels) -> out`` - 1:1 with ``dflash::BlockDiffusionAttention``.
  ``k_cache``/``v_cache`` may be one layer's ``[pages, page_size, kvh, d]`` pool or all
  layers' ``[L, pages, page_size, kvh, d]`` with ``layer`` selecting one (no copy).

Each has a fake (meta) implementation; the real one dispatches on ``kernels``
(``"reference"`` or ``"triton"``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from dflash_trt.plugins import attention as _ba
from dflash_trt.plugins import injection as _kvi
from dflash_trt.plugins.op_shapes import block_attention_shapes


def _pick(kernels: str, reference, triton):
    if kernels == "reference":
        return reference
    if kernels == "triton":
        return triton
    raise ValueError(f"unknown kernels {kernels!r}; choose 'reference' or 'triton'")


@torch.library.custom_op("dflash::kv_injection", mutates_args=("k_cache", "v_cache"))
def kv_injection(
    target_hidden: Tensor,
    n_new: Tensor,
    lengths: Tensor,
    fc_weight: Tensor,
    norm_weight: Tensor,
    kv_weight: Tensor,
    kv_bias: Tensor | None,
    k_norm_weight: Tensor,
    inv_freq: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    page_table: Tensor,
    rope_scale: float,
    eps: float,
    num_kv_heads: int,
    head_dim: int,
    kernels: str = "reference",
) -> None:
    fn = _pick(kernels, _kvi.kv_injection_reference, _kvi.kv_injection_triton)
    fn(
        target_hidden=target_hidden,
        n_new=n_new,
        lengths=lengths,
        fc_weight=fc_weight,
        norm_weight=norm_weight,
        kv_weight=kv_weight,
        kv_bias=kv_bias,
        k_norm_weight=k_norm_weight,
        inv_freq=inv_freq,
        rope_scale=rope_scale,
        eps=eps,
        k_cache=k_cache,
        v_cache=v_cache,
        page_table=page_table,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
    )


@kv_injection.register_fake
def _kv_injection_fake(
    target_hidden,
    n_new,
    lengths,
    fc_weight,
    norm_weight,
    kv_weight,
    kv_bias,
    k_norm_weight,
    inv_freq,
    k_cache,
    v_cache,
    page_table,
    rope_scale,
    eps,
    num_kv_heads,
    head_dim,
    kernels="reference",
) -> None:
    return None


@torch.library.custom_op("dflash::kv_cache_update", mutates_args=())
def kv_cache_update(
    kv: Tensor,
    k_norm_weight: Tensor,
    inv_freq: Tensor,
    n_new: Tensor,
    lengths: Tensor,
    page_table: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    rope_scale: float,
    eps: float,
    num_kv_heads: int,
    head_dim: int,
    kernels: str = "reference",
) -> tuple[Tensor, Tensor]:
    k_out, v_out = k_cache.clone(), v_cache.clone()
    fn = _pick(kernels, _kvi.kv_scatter_reference, _kvi.kv_scatter_triton)
    fn(
        kv,
        k_norm_weight,
        inv_freq,
        n_new,
        lengths,
        page_table,
        k_out,
        v_out,
        rope_scale=rope_scale,
        eps=eps,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
    )
    return k_out, v_out


@kv_cache_update.register_fake
def _kv_cache_update_fake(
    kv,
    k_norm_weight,
    inv_freq,
    n_new,
    lengths,
    page_table,
    k_cache,
    v_cache,
    rope_scale,
    eps,
    num_kv_heads,
    head_dim,
    kernels="reference",
):
    return torch.empty_like(k_cache), torch.empty_like(v_cache)


@torch.library.custom_op("dflash::block_attention", mutates_args=())
def block_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    page_table: Tensor,
    lengths: Tensor,
    causal: bool,
    window: int | None,
    scale: float,
    layer: int = 0,
    kernels: str = "reference",
) -> Tensor:
    if k_cache.dim() == 5:
        if kernels == "triton":
            from dflash_trt.plugins import triton_kernels as tk  # optional: triton

            return tk.block_attention(
                q, k, v, k_cache, v_cache, page_table, lengths, causal=causal, window=window, scale=scale, layer=layer
            )
        k_cache, v_cache = k_cache[layer], v_cache[layer]
    fn = _pick(kernels, _ba.block_attention_reference, _ba.block_attention_triton)
    out = fn(q, k, v, k_cache, v_cache, page_table, lengths, causal=causal, window=window, scale=scale)
    return out.clone() if out.data_ptr() == q.data_ptr() else out


@block_attention.register_fake
def _block_attention_fake(
    q, k, v, k_cache, v_cache, page_table, lengths, causal, window, scale, layer=0, kernels="reference"
):
    shape, _ = block_attention_shapes(tuple(q.shape), tuple(k.shape), tuple(k_cache.shape))
    return q.new_empty(shape)
