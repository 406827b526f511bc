"""Targets whose cache absorbs every token it sees, per batch: each row on its own cache, rejected drafts replayed away.

DeepSeek V4's attention layers (transformers' ``DeepseekV4HCACache`` / ``DeepseekV4CSACache``)
keep, beside a sliding window, a compressor state: the tokens of the window being filled
(``buffer_kv``), the entries emitted so far (``compressed_kv``, one per ``compress_rate`` tokens,
at position ``entry_count * compress_rate``), the previous window's overlap half, and the
Lightning indexer's own compressed keys. A token in that state cannot be masked out (it is
mixed into an entry) and the state has one count for the whole batch, so neither holes nor
ragged rows fit it.

So this policy runs every row alone, over its own transformers cache and only its real
tokens (no padding, no holes): what ``generate`` does for one sequence. A verify first keeps a
copy of each row's cache; at commit a row that accepted all its tokens keeps the new cache,
any other gets the copy back and replays its accepted prefix through the model (the verify's
logits for those positions are already right: every branch is causal, a compressed entry is
visible only to queries past its window). The columns the loop tracks mean nothing here: the
policy packs them to each row's committed count. Rows leave and join as list surgery.

Cost: one forward per row per verify, plus one replay of the accepted prefix on a partial
accept: the reference runtime's price for exactness on these targets (TensorRT-LLM rolls the
compressor back in its own kernels: ``tensorrt_llm/_torch/attention_backend/sparse/deepseek_v4``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

#: layer types whose cache state absorbs tokens (transformers' ``get_layer_types_and_kwargs`` names).
COMPRESSING = {"compressed_sparse_attention", "heavily_compressed_attention"}


@dataclass
class RowCaches:
    """One transformers cache per row; ``pending``: the last forward's per-row (copy of the cache
    before it, its ids [1, n], positions [1, n]) until it is committed, and the call that replays."""

    rows: list = field(default_factory=list)
    pending: list | None = None
    replay: Callable[..., Any] | None = None


class RowReplayPolicy:
    """The ``CachePolicy`` calls, for targets whose layers compress (see the module docstring)."""

    def __init__(self, model):
        self.config = model.config

    def new_cache(self, batch: int) -> RowCaches:
        from transformers import DynamicCache  # start-up: transformers (importing the runtime does not import it)

        return RowCaches([DynamicCache(config=self.config) for _ in range(batch)])

    @torch.no_grad()  # the copies below are of plain tensors, whoever calls
    def forward(self, run, ids, positions, attention_mask, cache: RowCaches):
        """Each row's real tokens through its own cache; logits [b, T, V] and target_hidden
        [b, T, n_tap*H] (zeros at padding), as one batched forward would give them."""
        if cache.pending is not None:
            self._settle(cache, [p[1].shape[1] for p in cache.pending])
        T = ids.shape[1]
        fresh = attention_mask.shape[1] == T
        real = attention_mask[:, -T:]  # [b, T]
        outs, pending = [], []
        for r, row in enumerate(cache.rows):
            cols = real[r].nonzero().squeeze(1)
            ids_r, pos_r = ids[r : r + 1, cols], positions[r : r + 1, cols]  # [1, n]
            pending.append((None if fresh else copy.deepcopy(row), ids_r, pos_r))
            outs.append((cols, *run(None, ids_r, pos_r, row)))
        cache.pending, cache.replay = (None, None) if fresh else (pending, run)
        return _scatter(outs, ids.shape[0], T)

    def commit(self, cache: RowCaches, col_valid, n_new) -> None:
        """Row r keeps the first n_new[r] tokens of the last forward."""
        if cache.pending is not None:
            self._settle(cache, n_new.tolist())

    @torch.no_grad()
    def _settle(self, cache: RowCaches, n_keep: list[int]) -> None:
        assert cache.pending is not None and cache.replay is not None, "settled only after a forward"
        for r, ((before, ids_r, pos_r), n) in enumerate(zip(cache.pending, n_keep, strict=True)):
            if n < ids_r.shape[1]:  # part of the draft was rejected: back to the copy, replay the rest
                cache.rows[r] = before
                if n:
                    cache.replay(None, ids_r[:, :n], pos_r[:, :n], before)
        cache.pending = cache.replay = None

    def compact(self, cache: RowCaches, col_valid: torch.Tensor) -> torch.Tensor:
        """The loop's columns, packed to each row's committed count (the row caches hold no holes)."""
        n = col_valid.sum(1)
        return torch.arange(int(n.max()), device=col_valid.device)[None] < n[:, None]

    def keep_rows(self, cache: RowCaches, rows: torch.Tensor) -> None:
        if cache.pending is not None:
            self._settle(cache, [p[1].shape[1] for p in cache.pending])
        cache.rows = [cache.rows[i] for i in rows.tolist()]

    def merge(self, a: RowCaches, b: RowCaches) -> RowCaches:
        for c in (a, b):
            if c.pending is not None:
                self._settle(c, [p[1].shape[1] for p in c.pending])
        return RowCaches(a.rows + b.rows)


def _scatter(outs, b: int, T: int):
    """Per-row (columns [n], logits [1, n, V], hidden [1, n, D] or None) -> batched [b, T, ...]."""
    ref_logits, ref_hidden = outs[0][1], outs[0][2]
    logits = ref_logits.new_zeros((b, T, ref_logits.shape[-1]))
    hidden = None if ref_hidden is None else ref_hidden.new_zeros((b, T, ref_hidden.shape[-1]))
    for r, (cols, lg, hd) in enumerate(outs):
        logits[r, cols] = lg[0]
        if hidden is not None:
            hidden[r, cols] = hd[0]
    return logits, hidden
