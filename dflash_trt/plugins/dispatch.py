"""Dispatch for the two DFlash ops: the drafter module calls these, ``kernels=`` picks the code.

``kernels="reference"`` (the default) runs the reference implementations, which define what
the fast kernels must compute; ``kernels="triton"`` routes to the Triton kernels.
"""

from __future__ import annotations

import torch
from torch import nn

from dflash_trt.plugins import attention as ba
from dflash_trt.plugins import injection as kvi
from dflash_trt.plugins.paged_cache import PagedKVCache

KERNELS = ("reference", "triton")


def fused_kv_weights(drafter: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """All layers' k_proj and v_proj stacked for one GEMM: [L*2*kvh*d, H], bias, k_norm [L, d].

    Cached on the drafter, keyed on the source tensors' identities and versions, so it is
    rebuilt after a dtype/device move or an optimizer step and not on every round."""
    srcs = [
        t
        for layer in drafter.layers
        for t in (
            layer.self_attn.k_proj.weight,
            layer.self_attn.v_proj.weight,
            layer.self_attn.k_norm.weight,
            layer.self_attn.k_proj.bias,
            layer.self_attn.v_proj.bias,
        )
        if t is not None
    ]
    key = tuple((t.data_ptr(), t._version, t.dtype, t.requires_grad and torch.is_grad_enabled()) for t in srcs)
    cached = getattr(drafter, "_fused_kv_cache", None)
    if cached is not None and cached[0] == key:
        return cached[1]
    fused = _stack_kv(drafter)
    if not any(t.requires_grad and torch.is_grad_enabled() for t in srcs):  # never cache autograd graphs
        drafter._fused_kv_cache = (key, fused)
    return fused


def _stack_kv(drafter: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    ws, bs, kn = [], [], []
    for layer in drafter.layers:
        a = layer.self_attn
        ws += [a.k_proj.weight, a.v_proj.weight]
        if a.k_proj.bias is not None:
            bs += [a.k_proj.bias, a.v_proj.bias]
        kn.append(a.k_norm.weight)
    return torch.cat(ws, 0), (torch.cat(bs, 0) if bs else None), torch.stack(kn, 0)


def kv_injection(
    drafter: nn.Module,
    target_hidden: torch.Tensor,
    n_new: torch.Tensor,
    cache: PagedKVCache,
    kernels: str = "reference",
) -> None:
    """Inject context K/V for new committed tokens; advances ``cache.lengths`` by ``n_new``."""
    cfg = drafter.cfg
    cache.reserve(n_new)
    wkv, bkv, k_norm = fused_kv_weights(drafter)
    args = dict(
        target_hidden=target_hidden,
        n_new=n_new,
        lengths=cache.lengths,
        fc_weight=drafter.fc.weight,
        norm_weight=drafter.hidden_norm.weight,
        kv_weight=wkv,
        kv_bias=bkv,
        k_norm_weight=k_norm,
        inv_freq=drafter.inv_freq,
        rope_scale=drafter.rope_scaling_factor,
        eps=cfg.rms_norm_eps,
        k_cache=cache.k,
        v_cache=cache.v,
        page_table=cache.page_table,
        num_kv_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim,
    )
    if kernels == "triton":
        kvi.kv_injection_triton(**args)
    elif kernels == "reference":
        kvi.kv_injection_reference(**args)
    else:
        raise ValueError(f"unknown kernels {kernels!r}; choose one of {KERNELS}")
    cache.lengths = cache.lengths + n_new


def block_attention(
    q,
    k,
    v,
    k_cache,
    v_cache,
    page_table,
    lengths,
    *,
    causal: bool,
    window: int | None,
    scale: float,
    kernels: str = "reference",
) -> torch.Tensor:
    """[b, B, h, d] output; see ``plugins.attention`` for the exact semantics."""
    if kernels == "triton":
        return ba.block_attention_triton(
            q, k, v, k_cache, v_cache, page_table, lengths, causal=causal, window=window, scale=scale
        )
    if kernels != "reference":
        raise ValueError(f"unknown kernels {kernels!r}; choose one of {KERNELS}")
    return ba.block_attention_reference(
        q, k, v, k_cache, v_cache, page_table, lengths, causal=causal, window=window, scale=scale
    )
