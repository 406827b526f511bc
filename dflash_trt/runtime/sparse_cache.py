"""DeepSeek sparse attention's indexer key cache, kept column for column with the KV cache.

A DSA layer (deepseek_v32, glm_moe_dsa; transformers' ``DynamicIndexedLayer``) caches, beside
its MLA latent KV ``keys`` / ``values`` [b, 1, S, d], one indexer key per column,
``indexer_keys`` [b, S, c]. Each query scores every column,
``score[t, s] = sum_h w[t, h] * relu(q[t, h] . k_idx[s])``, adds the attention mask, and keeps its
top ``index_topk`` columns; attention then sees the chosen columns that the mask allows.

The invariant kept here: before every verify each row's committed columns are packed to the
front, in order, in the KV cache and the indexer cache alike, and every column past a row's
committed count is zero and masked. A rejected draft's key is therefore not in the cache when a
later query scores: no indexer can choose it, whatever ``index_topk`` is, and a row's indexer
sees exactly what a fresh prefill of its committed tokens would give it (keys carry their RoPE,
so a column's index is free). Rows joining (``merge_indexer``) pad on the right like the KV.
"""

from __future__ import annotations

import torch


def pack(cache, layers: list[int], col_valid: torch.Tensor) -> torch.Tensor:
    """Move each row's valid columns [b, S] to the front of ``layers`` (KV and indexer keys),
    zero the rest; returns the packed column mask [b, W], W = the most valid columns of a row."""
    n = col_valid.sum(1)                                                         # [b]
    W = int(n.max()) if n.numel() else 0
    packed = torch.arange(W, device=col_valid.device)[None] < n[:, None]       # [b, W]
    if col_valid.shape[1] == W and bool((col_valid == packed).all()):
        return col_valid
    order = torch.sort((~col_valid).to(torch.uint8), dim=1, stable=True).indices[:, :W]  # valid first
    for i in layers:
        layer = cache.layers[i]
        if getattr(layer, "keys", None) is not None and layer.keys.numel():
            layer.keys, layer.values = _take(layer.keys, order, packed, 2), _take(layer.values, order, packed, 2)
        keys = getattr(layer, "indexer_keys", None)
        if keys is not None and keys.numel():
            layer.indexer_keys = _take(keys, order, packed, 1)
    return packed


def _take(t: torch.Tensor, order: torch.Tensor, packed: torch.Tensor, dim: int) -> torch.Tensor:
    """t's columns ``order`` [b, W] along ``dim`` (1 or 2), zero where ``packed`` [b, W] is False."""
    shape = [order.shape[0]] + [1] * (t.dim() - 1)
    shape[dim] = order.shape[1]
    idx, keep = order.view(shape), packed.view(shape)
    out = t.gather(dim, idx.expand(*[s if d != dim else order.shape[1] for d, s in enumerate(t.shape)]))
    return torch.where(keep, out, torch.zeros((), dtype=t.dtype, device=t.device))


def merge_indexer(out, layers, batches: list[int], width: int) -> None:
    """``out``'s indexer keys: ``layers``' concatenated along the batch, each right-padded with
    zeros to ``width`` columns (a layer holding none yet gives zeros for its ``batches[i]`` rows)."""
    ref = next((lay.indexer_keys for lay in layers
                if getattr(lay, "indexer_keys", None) is not None and lay.indexer_keys.numel()), None)
    if ref is None:
        return
    parts = []
    for layer, b in zip(layers, batches, strict=True):
        k = getattr(layer, "indexer_keys", None)
        if k is None or not k.numel():
            k = ref.new_zeros((b, 0, ref.shape[-1]))
        parts.append(torch.nn.functional.pad(k, (0, 0, 0, width - k.shape[1])))
    out.lazy_initialization_indexer(parts[0])
    out.indexer_keys = torch.cat(parts)
