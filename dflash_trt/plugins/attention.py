"""Block-diffusion attention over a paged context cache.

Semantics (the reference below is the specification). For sequence i with context length
n = lengths[i], block query t sits at absolute position n + t. Keys are the context
positions 0..n-1 (from the paged cache) followed by the block's own B positions n..n+B-1.
A query sees a key unless

* ``causal`` and the key is a block key later than the query, or
* ``window`` is set and |query position - key position| >= window.

So the default (non-causal, no window) block sees the whole context and the whole block.
Grouped-query attention: query head h reads kv head h // (heads // kv_heads).
Shapes: q [b, B, h, d]; k, v [b, B, kvh, d]; k_cache, v_cache [pages, page_size, kvh, d];
page_table [b, max_pages] int; lengths [b] int. Output [b, B, h, d] in q's dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def block_visibility(lengths: torch.Tensor, max_len: int, B: int, causal: bool, window: int | None) -> torch.Tensor:
    """Boolean [b, B, max_len + B]: which keys each block query may see."""
    dev = lengths.device
    t = torch.arange(B, device=dev)
    q_pos = lengths[:, None] + t  # [b, B]
    ctx_pos = torch.arange(max_len, device=dev)
    k_pos = torch.cat([ctx_pos[None].expand(len(lengths), -1), q_pos], dim=1)  # [b, max_len+B]
    ctx_valid = ctx_pos[None] < lengths[:, None]
    valid = torch.cat([ctx_valid, torch.ones(len(lengths), B, dtype=torch.bool, device=dev)], 1)
    vis = valid[:, None, :].expand(-1, B, -1).clone()
    if causal:
        block_ok = t[None, :] <= t[:, None]  # key t' <= query t
        vis[:, :, max_len:] &= block_ok[None]
    if window is not None:
        vis &= (q_pos[:, :, None] - k_pos[:, None, :]).abs() < window
    return vis


def gather_pages(cache: torch.Tensor, page_table: torch.Tensor, max_len: int) -> torch.Tensor:
    """[pages, page_size, kvh, d] -> [b, max_len, kvh, d] following each page table."""
    page_size = cache.shape[1]
    pos = torch.arange(max_len, device=page_table.device)
    if max_len == 0:
        return cache.new_zeros(page_table.shape[0], 0, *cache.shape[2:])
    pages = page_table.long().clamp_min(0)[:, pos // page_size]
    return cache[pages, (pos % page_size)[None]]


def block_attention_reference(
    q, k, v, k_cache, v_cache, page_table, lengths, *, causal: bool, window: int | None, scale: float
) -> torch.Tensor:
    b, B, h, d = q.shape
    kvh = k.shape[2]
    max_len = int(lengths.max().item()) if b else 0
    # [b, kvh, K, d]
    keys = torch.cat([gather_pages(k_cache, page_table, max_len).to(k.dtype), k], dim=1).transpose(1, 2)
    vals = torch.cat([gather_pages(v_cache, page_table, max_len).to(v.dtype), v], dim=1).transpose(1, 2)
    mask = block_visibility(lengths, max_len, B, causal, window)
    # enable_gqa: query head h reads kv head h // (heads // kv_heads) without copying the keys and
    # values once per query head (the copy was most of the round at long context: 2.5 s -> 0.96 s
    # at b 4, 8k context, 32/8 heads on one CPU thread).
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), keys, vals, attn_mask=mask[:, None], scale=scale, enable_gqa=h != kvh
    )
    return out.transpose(1, 2).to(q.dtype)


def block_attention_triton(
    q, k, v, k_cache, v_cache, page_table, lengths, *, causal: bool, window: int | None, scale: float
) -> torch.Tensor:
    from dflash_trt.plugins import triton_kernels as tk  # optional: triton

    return tk.block_attention(q, k, v, k_cache, v_cache, page_table, lengths, causal=causal, window=window, scale=scale)
