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

A pooled indexer (glm5_next: ``index_kpool`` consecutive columns scored as one candidate) needs
the committed columns packed to the BACK instead (``back=True``: left padding). Its layer keeps
no RoPE and stores each written column's padding flag beside its key (``[k | gate | valid]``);
pools start at a row's first valid column and run over consecutive columns, a query sees the
columns up to its own, and its incomplete tail pool is counted as "first valid column + visible
count" (``Glm5NextTextIndexer.get_pooled_states`` / ``append_visible_tail``). All three hold for a
row only when its committed columns are contiguous and end right where the next block starts:
front-packing leaves holes between a short row's last committed column and the block, and a pool
spanning them is dropped or its tail points at a hole. Back-packed, every row's cache is a fresh
left-padded prefill of its committed tokens (pools aligned on its first token, as TensorRT-LLM
aligns them on position 0: ``modeling_glm5_next.py::Glm5NextContextRows.build``), and a rejected
draft's key, gate and flag are gone before any later query pools them.
"""

from __future__ import annotations

import torch


def pack(cache, layers: list[int], col_valid: torch.Tensor, back: bool = False) -> torch.Tensor:
    """Move each row's valid columns [b, S] to the front (``back``: the end) of ``layers`` (KV and
    indexer keys), in order, zero the rest; returns the packed column mask [b, W], W = the most
    valid columns of a row."""
    n = col_valid.sum(1)  # [b]
    W = int(n.max()) if n.numel() else 0
    cols = torch.arange(W, device=col_valid.device)[None]
    packed = cols >= W - n[:, None] if back else cols < n[:, None]  # [b, W]
    if col_valid.shape[1] == W and bool((col_valid == packed).all()):
        return col_valid
    key = col_valid if back else ~col_valid  # stable: order kept
    order = torch.sort(key.to(torch.uint8), dim=1, stable=True).indices  # [b, S]
    order = order[:, order.shape[1] - W :] if back else order[:, :W]  # [b, W]
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
    ref = next(
        (
            lay.indexer_keys
            for lay in layers
            if getattr(lay, "indexer_keys", None) is not None and lay.indexer_keys.numel()
        ),
        None,
    )
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
