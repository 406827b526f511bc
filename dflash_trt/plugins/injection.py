"""KV injection: tapped target hidden states -> every draft layer's context K/V, in the paged cache.

Semantics (the reference below is the specification):

    ctx = hidden_norm(fc(target_hidden))                          # [b, T, H]
    kv  = ctx @ kv_weight.T (+ kv_bias)                   # one GEMM over all layers' K and V
    for each layer l:  k_l = k_norm_l(kv[..., l, 0]) then RoPE at position lengths[i] + t
                       v_l = kv[..., l, 1]
    write k_l, v_l of the first n_new[i] tokens of sequence i at positions lengths[i] + t,
    i.e. page page_table[i, pos // page_size], offset pos % page_size.

``kv_weight`` is layer-major: rows [l*2*kvh*d, (l*2+1)*kvh*d) are layer l's k_proj,
the next kvh*d rows its v_proj. ``lengths`` is not advanced here (the caller does).
"""

from __future__ import annotations

import torch

from dflash_trt.plugins.primitives import rms_norm, rotate_half


def rope_tables(positions: torch.Tensor, inv_freq: torch.Tensor, rope_scale: float, dtype):
    freqs = positions[..., None].float() * inv_freq.float()
    emb = torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * rope_scale).to(dtype), (emb.sin() * rope_scale).to(dtype)


def fused_kv(target_hidden, fc_weight, norm_weight, kv_weight, kv_bias, eps) -> torch.Tensor:
    """fc -> hidden_norm -> ONE GEMM over all layers' K/V weights: [b, T, L*2*kvh*d]."""
    kv = rms_norm(target_hidden @ fc_weight.T, norm_weight, eps) @ kv_weight.T
    return kv + kv_bias if kv_bias is not None else kv


def kv_injection_reference(
    *,
    target_hidden,
    n_new,
    lengths,
    fc_weight,
    norm_weight,
    kv_weight,
    kv_bias,
    k_norm_weight,
    inv_freq,
    rope_scale,
    eps,
    k_cache,
    v_cache,
    page_table,
    num_kv_heads,
    head_dim,
) -> None:
    if target_hidden.shape[0] == 0 or target_hidden.shape[1] == 0:
        return
    kv = fused_kv(target_hidden, fc_weight, norm_weight, kv_weight, kv_bias, eps)
    kv_scatter_reference(
        kv,
        k_norm_weight,
        inv_freq,
        n_new,
        lengths,
        page_table,
        k_cache,
        v_cache,
        rope_scale=rope_scale,
        eps=eps,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
    )


def kv_scatter_reference(
    kv,
    k_norm_weight,
    inv_freq,
    n_new,
    lengths,
    page_table,
    k_cache,
    v_cache,
    *,
    rope_scale,
    eps,
    num_kv_heads,
    head_dim,
) -> None:
    """The stage after the one GEMM (what ``dflash::KVInjection`` in ONNX / TensorRT does):
    kv [b, T, L*2*kvh*d] -> per-layer k_norm + RoPE -> paged scatter of the first n_new[i]."""
    b, T, _ = kv.shape
    if T == 0 or b == 0:
        return
    L = k_norm_weight.shape[0]
    page_size = k_cache.shape[2]
    t = torch.arange(T, device=kv.device)
    positions = lengths[:, None] + t
    kv = kv.view(b, T, L, 2, num_kv_heads, head_dim).permute(2, 3, 0, 1, 4, 5)
    k, v = kv[:, 0], kv[:, 1]
    k = rms_norm(k, k_norm_weight[:, None, None, None, :], eps)
    cos, sin = rope_tables(positions, inv_freq, rope_scale, k.dtype)
    k = k * cos[None, :, :, None] + rotate_half(k) * sin[None, :, :, None]
    valid = t[None] < n_new[:, None]
    rows, cols = valid.nonzero(as_tuple=True)
    pos = positions[rows, cols]
    page = page_table.long()[rows, pos // page_size]
    off = pos % page_size
    k_cache[:, page, off] = k[:, rows, cols].to(k_cache.dtype)
    v_cache[:, page, off] = v[:, rows, cols].to(v_cache.dtype)


def kv_scatter_triton(
    kv,
    k_norm_weight,
    inv_freq,
    n_new,
    lengths,
    page_table,
    k_cache,
    v_cache,
    *,
    rope_scale,
    eps,
    num_kv_heads,
    head_dim,
) -> None:
    from dflash_trt.plugins import triton_kernels as tk  # optional: triton

    tk.kv_scatter(
        kv,
        k_norm_weight,
        inv_freq,
        n_new,
        lengths,
        page_table,
        k_cache,
        v_cache,
        eps=eps,
        rope_scale=rope_scale,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
    )


def kv_injection_triton(
    *,
    target_hidden,
    n_new,
    lengths,
    fc_weight,
    norm_weight,
    kv_weight,
    kv_bias,
    k_norm_weight,
    inv_freq,
    rope_scale,
    eps,
    k_cache,
    v_cache,
    page_table,
    num_kv_heads,
    head_dim,
) -> None:
    """Same contract as the reference: fc + hidden_norm + ONE GEMM over all layers' K/V
    weights in torch, then ONE Triton launch for k_norm, RoPE and the paged scatter."""
    if target_hidden.shape[0] == 0 or target_hidden.shape[1] == 0:
        return
    from dflash_trt.plugins import triton_kernels as tk  # optional: triton

    kv = fused_kv(target_hidden, fc_weight, norm_weight, kv_weight, kv_bias, eps)
    tk.kv_scatter(
        kv,
        k_norm_weight,
        inv_freq,
        n_new,
        lengths,
        page_table,
        k_cache,
        v_cache,
        eps=eps,
        rope_scale=rope_scale,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
    )
