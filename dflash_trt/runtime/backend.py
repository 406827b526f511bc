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
- ``keep_rows(target_cache, draft_cache, rows)``: rows leaving the batch.
- ``compact(target_cache, col_valid)`` -> col_valid: drop cache columns that are holes in
  every row (optional: holes are masked, so keeping them is correct, only slower).
- ``commit_cache(target_cache, col_valid, n_new)``: after acceptance, the last verify's first
  ``n_new`` columns per row are committed and the rest rejected (optional: attention masks the
  rejected columns; a recurrent state or a sliding window must drop them, see
  ``target_cache.py``).

A step-level engine that batches continuously adds one call here for rows *joining* (merging
two batches' caches, SGLang's ``merge_batch``); every other call already works per step on
whatever rows are live, with the block size given per call.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from dflash_trt.model import Drafter, Target
from dflash_trt.runtime.target_cache import CachePolicy


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

    @abstractmethod
    def keep_rows(self, target_cache: object, draft_cache: object | None, rows: torch.Tensor) -> None:
        """Keep only ``rows`` [n] (indices into the current batch, in order) in both caches."""

    def compact(self, target_cache: object, col_valid: torch.Tensor) -> torch.Tensor:
        """Drop columns that are holes in every row; col_valid [b, S] -> [b, S'] (default: keep all)."""
        return col_valid

    def commit_cache(self, target_cache: object, col_valid: torch.Tensor, n_new: torch.Tensor) -> None:
        """The last verify's first ``n_new[r]`` columns of row r are committed, the rest rejected.

        col_valid [b, S] already marks them (the verify's B columns are its last B); n_new [b].
        Default: nothing to do, the rejected columns are holes the attention mask hides.
        """


class TorchBackend(Backend):
    """The PyTorch modules themselves: a transformers target with its cache handled per family
    (``target_cache.CachePolicy``: sliding windows, recurrent-state rollback), and the drafter
    over its paged cache (the reference implementation of both custom ops)."""

    def __init__(self, target: Target, drafter: Drafter | None):
        self.target, self.drafter = target, drafter
        self.device = target.device
        self.drafter_block_size = drafter.cfg.block_size if drafter is not None else None
        self.caches = CachePolicy(target.model)

    def new_caches(self, batch: int, draft: bool):
        dcache = self.drafter.new_cache(batch, device=self.device) if draft else None
        return self.caches.new_cache(batch), dcache

    def target_forward(self, ids, positions, attention_mask, cache, capture):
        return self.caches.forward(self.target, ids, positions, attention_mask, cache, capture)

    def drafter_round(self, target_hidden, n_new, anchor, block_size, cache):
        d, cfg = self.drafter, self.drafter.cfg
        d.inject(target_hidden.to(d.dtype), n_new, cache)
        block = anchor.new_full((anchor.shape[0], block_size), cfg.mask_token_id)   # [b, B]
        block[:, 0] = anchor
        hidden = d.draft(self.target.embed(block, cfg.input_embedding_scale).to(d.dtype), cache)
        return d.logits(hidden[:, 1:], self.target.head).float()

    def keep_rows(self, target_cache, draft_cache, rows):
        self.caches.keep_rows(target_cache, rows)
        if draft_cache is not None:
            draft_cache.select(rows)

    def compact(self, target_cache, col_valid):
        return self.caches.compact(target_cache, col_valid)

    def commit_cache(self, target_cache, col_valid, n_new):
        self.caches.commit(target_cache, col_valid, n_new)
