"""What answers the speculative loop's model calls: the target forward, the drafter round,
and the caches behind them.

The loop (``loop.py``) owns the schedule: which rows are live, positions, the column-validity
mask, the tokens. A :class:`Backend` owns the models and the cache *contents*; the loop holds
the cache objects it creates and hands them back on every call, so the same loop runs the
PyTorch modules (:class:`TorchBackend`), ONNX Runtime sessions over the exported graphs, or
TensorRT engines (build/export.py documents those graphs' I/O, which these calls mirror).

The calls, per batch of ``b`` rows:

- ``new_caches(b, draft)`` -> (target cache, drafter cache or None): empty caches.
- ``target_forward(ids, positions, attention_mask, cache, capture)`` -> (logits, target_hidden):
  prefill and verify alike; appends ``T`` columns to the target cache.
- ``drafter_round(target_hidden, n_new, anchor, block_size, cache)`` -> draft logits: KV
  injection of the tokens committed since the last round, then one block forward over
  ``[anchor, MASK x (B-1)]`` (the exported ``drafter.onnx`` is exactly this round).
- ``draft_block(target_hidden, n_new, anchor, block_size, cache, sampling, gen)`` -> (tokens, q):
  the B-1 draft tokens and the distribution q they were drawn from (None at temperature 0).
  Default: ``drafter_round``, then an argmax or an independent draw per position; a DFlash2
  drafter instead walks its candidate selector left to right (``TorchBackend`` overrides it).
- ``keep_rows(target_cache, draft_cache, rows)``: rows leaving the batch.
- ``compact(target_cache, col_valid)`` -> col_valid: drop cache columns that are holes in
  every row (optional: holes are masked, so keeping them is correct, only slower).

A step-level engine that batches continuously adds one call here for rows *joining* (merging
two batches' caches, SGLang's ``merge_batch``); every other call already works per step on
whatever rows are live, with the block size given per call.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from dflash_trt.model import DFlash2Drafter, Drafter, Target
from dflash_trt.runtime.sampling import SamplingParams, draw, probs


class Backend(ABC):
    """The loop's only door to the models. Tensors in and out live on ``self.device``."""

    #: device of every tensor the loop passes in (ids, masks, positions).
    device: torch.device
    #: the drafter's trained block size; None when there is no drafter (autoregressive only).
    drafter_block_size: int | None

    @abstractmethod
    def new_caches(self, batch: int, draft: bool) -> tuple[object, object | None]:
        """Empty (target cache, drafter cache) for ``batch`` rows; no drafter cache unless ``draft``."""

    @abstractmethod
    def target_forward(self, ids: torch.Tensor, positions: torch.Tensor, attention_mask: torch.Tensor,
                       cache: object, capture: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One target forward that appends ``T`` columns to ``cache``.

        ids [b, T]; positions [b, T]; attention_mask [b, S+T] bool over the S cached columns
        and the T new ones (False: a hole or padding). Returns logits [b, T, V] and, when
        ``capture``, target_hidden [b, T, n_tap*H] (else None).
        """

    @abstractmethod
    def drafter_round(self, target_hidden: torch.Tensor, n_new: torch.Tensor, anchor: torch.Tensor,
                      block_size: int, cache: object) -> torch.Tensor:
        """Inject the committed context, then draft one block; returns draft logits [b, B-1, V] (float32).

        target_hidden [b, T, n_tap*H] with n_new [b] of its T real per row: the tokens committed
        since the last round, injected at the cache's current lengths. anchor [b]: the last
        committed token, block position 0, at absolute position ``lengths + n_new``.
        """

    def draft_block(self, target_hidden: torch.Tensor, n_new: torch.Tensor, anchor: torch.Tensor, block_size: int,
                    cache: object, sampling: SamplingParams,
                    gen: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One drafter round as tokens: (draft tokens [b, B-1], q [b, B-1, V] float32 or None at
        temperature 0), q being the distribution each token was drawn from (what rejection
        sampling must use). Default: each position independently from ``drafter_round``'s logits."""
        dlogits = self.drafter_round(target_hidden, n_new, anchor, block_size, cache)
        if sampling.greedy:
            return dlogits.argmax(-1), None
        q = probs(dlogits, sampling)                                                # [b, B-1, V]
        return draw(q, gen), q

    @abstractmethod
    def keep_rows(self, target_cache: object, draft_cache: object | None, rows: torch.Tensor) -> None:
        """Keep only ``rows`` [n] (indices into the current batch, in order) in both caches."""

    def compact(self, target_cache: object, col_valid: torch.Tensor) -> torch.Tensor:
        """Drop columns that are holes in every row; col_valid [b, S] -> [b, S'] (default: keep all)."""
        return col_valid


class TorchBackend(Backend):
    """The PyTorch modules themselves: a transformers target with a DynamicCache, and the
    drafter over its paged cache (the reference implementation of both custom ops)."""

    def __init__(self, target: Target, drafter: Drafter | None):
        self.target, self.drafter = target, drafter
        self.device = target.device
        self.drafter_block_size = drafter.cfg.block_size if drafter is not None else None

    def new_caches(self, batch: int, draft: bool):
        from transformers import DynamicCache

        dcache = self.drafter.new_cache(batch, device=self.device) if draft else None
        return DynamicCache(config=self.target.config), dcache

    def target_forward(self, ids, positions, attention_mask, cache, capture):
        return self.target.forward(ids, positions, attention_mask.long(), cache, capture=capture)

    def drafter_round(self, target_hidden, n_new, anchor, block_size, cache):
        return self._draft_hidden_logits(target_hidden, n_new, anchor, block_size, cache)[1]

    def _draft_hidden_logits(self, target_hidden, n_new, anchor, block_size, cache):
        """Inject, draft one block: (hidden [b, B-1, H], draft logits [b, B-1, V] float32)."""
        d, cfg = self.drafter, self.drafter.cfg
        d.inject(target_hidden.to(d.dtype), n_new, cache)
        block = anchor.new_full((anchor.shape[0], block_size), cfg.mask_token_id)   # [b, B]
        block[:, 0] = anchor
        hidden = d.draft(self.target.embed(block, cfg.input_embedding_scale).to(d.dtype), cache)[:, 1:]
        return hidden, d.logits(hidden, self.target.head).float()

    def draft_block(self, target_hidden, n_new, anchor, block_size, cache, sampling, gen):
        """A DFlash2 drafter walks its candidate selector (``DFlash2Drafter.propose``); q is the
        walk's distribution over each position's candidates. Others: ``Backend.draft_block``."""
        if not isinstance(self.drafter, DFlash2Drafter):
            return super().draft_block(target_hidden, n_new, anchor, block_size, cache, sampling, gen)
        hidden, dlogits = self._draft_hidden_logits(target_hidden, n_new, anchor, block_size, cache)
        return self.drafter.propose(hidden, dlogits, anchor, sampling.temperature, gen)

    def keep_rows(self, target_cache, draft_cache, rows):
        target_cache.batch_select_indices(rows)
        if draft_cache is not None:
            draft_cache.select(rows)

    def compact(self, target_cache, col_valid):
        """Holes are masked anyway; dropping them keeps attention and mask cost proportional
        to committed tokens instead of B per round. Only plain (non-sliding) dynamic layers
        are compacted; other cache types keep their holes, which is still correct."""
        keep = col_valid.any(0)
        if bool(keep.all()):
            return col_valid
        layers = getattr(target_cache, "layers", [])
        if not all(hasattr(l, "keys") and not getattr(l, "is_sliding", False) for l in layers):
            return col_valid
        n_keep = int(keep.sum())
        if bool(keep[:n_keep].all()):  # holes only at the tail (always so at batch 1): a view
            pick = lambda t: t[..., :n_keep, :]  # noqa: E731
        else:
            idx = keep.nonzero().squeeze(1)
            pick = lambda t: t.index_select(-2, idx)  # noqa: E731
        for layer in layers:
            if getattr(layer, "is_initialized", True) and layer.keys is not None and layer.keys.numel():
                layer.keys, layer.values = pick(layer.keys), pick(layer.values)
        return col_valid[:, keep]
