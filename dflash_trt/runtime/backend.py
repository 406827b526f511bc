"""What answers the speculative loop's model calls: the target forward, the drafter round,
and the caches behind them.

The loop (``loop.py``) owns the schedule: which rows are live, positions, the column-validity
mask, the tokens. A :class:`Backend` owns the models and the cache *contents*; the loop holds
the cache objects it creates and hands them back on every call, so the same loop runs the
PyTorch modules (:class:`TorchBackend`), ONNX Runtime sessions over the exported graphs, or
TensorRT engines (build/export.py documents those graphs' I/O, which these calls mirror).

The calls, per batch of ``b`` rows:

- ``new_caches(b, draft)`` -> (target cache, drafter cache or None): empty caches.
- ``target_forward(ids, positions, attention_mask, cache, capture, logits_at=None)`` -> (logits,
  target_hidden): prefill and verify alike; appends ``T`` columns to the target cache
  (``logits_at``: the one position per row whose logits prefill needs).
- ``drafter_round(target_hidden, n_new, anchor, block_size, cache)`` -> draft logits: KV
  injection of the tokens committed since the last round, then one block forward over
  ``[anchor, MASK x (B-1)]`` (the exported ``drafter.onnx`` is exactly this round). Block
  size 1 (a round the scheduler's draft-length schedule turns drafting off for) only injects.
- ``draft_block(target_hidden, n_new, anchor, block_size, cache, params, keys, first)`` ->
  (tokens, q): the B-1 draft tokens per row and the distributions q the sampled rows drew them
  from (None when no row samples; tokens None at block size 1). Default: ``drafter_round``,
  then :func:`~dflash_trt.runtime.sampling.propose` per row; the backends hand it to the
  drafter family's :class:`~dflash_trt.runtime.proposer.Proposer` (a DFlash2 drafter walks its
  candidate selector left to right instead).
- ``keep_rows(target_cache, draft_cache, rows)``: rows leaving the batch.
- ``merge_rows(target_a, draft_a, target_b, draft_b)`` -> (target cache, drafter cache): rows
  joining, b's after a's (SGLang's ``merge_batch``); target caches of S_a and S_b columns
  become max(S_a, S_b) columns, the shorter padded on the right (padding columns are holes).
- ``compact(target_cache, col_valid)`` -> col_valid: drop cache columns that are holes in
  every row, or move each row's valid columns together (the mask is explicit and keys carry
  their RoPE, so column order is free); optional: holes are masked, so keeping them is
  correct, only slower.
- ``commit_cache(target_cache, col_valid, n_new)``: after acceptance, the last verify's first
  ``n_new`` columns per row are committed and the rest rejected (optional: attention masks the
  rejected columns; a recurrent state or a sliding window must drop them, see
  ``target_cache.py``).
- ``check_request(prompts, max_new_tokens, block_size)``: refuse, before any work, a request
  outside the shapes this backend runs (optional: the exported graphs' engine profile).

Every call works per step on whatever rows are live, with the block size given per call, so
the scheduler batches continuously through this interface alone.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from dflash_trt.errors import DFlashError
from dflash_trt.model import Drafter, Target, family_of
from dflash_trt.plugins import PagedKVCache
from dflash_trt.runtime.decoder import lean_forward
from dflash_trt.runtime.lean_drafter import lean_drafter
from dflash_trt.runtime.proposer import Proposer, proposer_for
from dflash_trt.runtime.sampling import SamplingParams, propose
from dflash_trt.runtime.target_cache import cache_policy


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
    def target_forward(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        attention_mask: torch.Tensor,
        cache: object,
        capture: bool,
        logits_at: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One target forward that appends ``T`` columns to ``cache``.

        ids [b, T]; positions [b, T]; attention_mask [b, S+T] bool over the S cached columns
        and the T new ones (False: a hole or padding). Returns logits [b, T, V] ([b, 1, V], the
        logits at position ``logits_at[r]`` of each row, when given: a backend may compute only
        those) and, when ``capture``, target_hidden [b, T, n_tap*H] (else None).
        """

    @abstractmethod
    def drafter_round(
        self, target_hidden: torch.Tensor, n_new: torch.Tensor, anchor: torch.Tensor, block_size: int, cache: object
    ) -> torch.Tensor:
        """Inject the committed context, then draft one block; returns draft logits [b, B-1, V] (float32).

        target_hidden [b, T, n_tap*H] with n_new [b] of its T real per row: the tokens committed
        since the last round, injected at the cache's current lengths. anchor [b]: the last
        committed token, block position 0, at absolute position ``lengths + n_new``.
        """

    def draft_block(
        self,
        target_hidden: torch.Tensor,
        n_new: torch.Tensor,
        anchor: torch.Tensor,
        block_size: int,
        cache: object,
        params: list[SamplingParams],
        keys: list[int | None],
        first: list[int],
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """One drafter round as tokens: (draft tokens [b, B-1], q [b, B-1, V] float32 or None),
        q being what each sampled row's tokens were drawn from (what rejection sampling must use).
        Default: each position from ``drafter_round``'s logits (:func:`sampling.propose`)."""
        dlogits = self.drafter_round(target_hidden, n_new, anchor, block_size, cache)
        if block_size == 1:
            return None, None
        return propose(dlogits, params, keys, first)

    @abstractmethod
    def keep_rows(self, target_cache: object, draft_cache: object | None, rows: torch.Tensor) -> None:
        """Keep only ``rows`` [n] (indices into the current batch, in order) in both caches."""

    def merge_rows(
        self, target_a: object, draft_a: object | None, target_b: object, draft_b: object | None
    ) -> tuple[object, object | None]:
        """Caches holding a's rows then b's; S columns become max(S_a, S_b), padded on the right."""
        raise DFlashError(f"{type(self).__name__} cannot merge batches")

    def compact(self, target_cache: object, col_valid: torch.Tensor) -> torch.Tensor:
        """Drop columns that are holes in every row; col_valid [b, S] -> [b, S'] (default: keep all)."""
        return col_valid

    def commit_cache(self, target_cache: object, col_valid: torch.Tensor, n_new: torch.Tensor) -> None:
        """The last verify's first ``n_new[r]`` columns of row r are committed, the rest rejected.

        col_valid [b, S] already marks them (the verify's B columns are its last B); n_new [b].
        Default: nothing to do, the rejected columns are holes the attention mask hides.
        """
        return None

    def check_request(self, prompts: list[list[int]], max_new_tokens: int, block_size: int) -> None:
        """Raise DFlashError (one line) for a request this backend cannot run (default: any runs)."""
        return None

    def check_batch(self, max_batch: int, block_size: int) -> None:
        """Raise DFlashError (one line) when batches of ``max_batch`` rows at ``block_size`` cannot
        run here (the scheduler asks once, when it is made; default: any run)."""
        return None


class TorchBackend(Backend):
    """The PyTorch modules themselves: a transformers target with its cache handled per family
    (``target_cache.CachePolicy``: sliding windows, recurrent-state rollback), and the drafter
    over its paged cache (the reference implementation of both custom ops).

    A plain decoder target (Llama, Qwen2, Qwen3) runs through :mod:`~dflash_trt.runtime.decoder`'s
    lean forward over the same weights and cache (``lean=False``: transformers' own forward).
    """

    #: the name --backend gives this backend (messages and reports say it)
    name = "torch"

    def __init__(self, target: Target, drafter: Drafter | None, *, lean: bool = True):
        self.target, self.drafter = target, drafter
        self.device = target.device
        self.drafter_block_size = drafter.cfg.block_size if drafter is not None else None
        self.lean = lean_forward(target.model) if lean else None
        #: the drafter's lean round (``lean_drafter.py``), None: the reference ops
        self.lean_drafter = (
            lean_drafter(drafter, self.lean.head if self.lean is not None else None, target.head)
            if lean and drafter is not None
            else None
        )
        self.caches = cache_policy(target.model)
        #: how the drafter's family drafts a block (``proposer.proposer_for``: the one dispatch)
        self.proposer = proposer_for(family_of(drafter.cfg)) if drafter is not None else Proposer()

    def new_caches(self, batch: int, draft: bool):
        dcache = self.drafter.new_cache(batch, device=self.device) if draft and self.drafter is not None else None
        return self.caches.new_cache(batch), dcache

    def target_forward(self, ids, positions, attention_mask, cache, capture, logits_at=None):
        def run(model_mask, ids=ids, positions=positions, cache=cache):
            """The cache policy builds the model's mask and settles the cache around this call
            (a policy running rows apart, ``row_cache.RowReplayPolicy``, passes each row's own)."""
            if self.lean is not None:  # plain decoders only: the policy passes their 2D mask through
                return self.lean.forward(
                    ids, positions, attention_mask, cache, self.target.layer_ids if capture else None, logits_at
                )
            return self.target.forward(ids, positions, model_mask, cache, capture=capture)

        logits, hidden = self.caches.forward(run, ids, positions, attention_mask, cache)
        if logits_at is not None and self.lean is None:
            logits = logits[torch.arange(ids.shape[0], device=ids.device), logits_at][:, None]
        return logits, hidden

    def drafter_round(self, target_hidden, n_new, anchor, block_size, cache):
        return self.draft_hidden_logits(target_hidden, n_new, anchor, block_size, cache)[1]

    def draft_hidden_logits(self, target_hidden, n_new, anchor, block_size, cache):
        """Inject, draft one block: (hidden [b, B-1, H], draft logits [b, B-1, V] float32)."""
        d = self.drafter
        assert d is not None, "a draft round needs a drafter"
        cfg = d.cfg
        run = self.lean_drafter or d  # the same round (``lean_drafter.py``), or the reference ops
        run.inject(target_hidden.to(d.dtype), n_new, cache)
        if block_size == 1:  # a round with drafting off: the drafter only takes in the last commit
            return None, anchor.new_zeros(anchor.shape[0], 0, cfg.vocab_size, dtype=torch.float32)
        block = anchor.new_full((anchor.shape[0], block_size), cfg.mask_token_id)  # [b, B]
        block[:, 0] = anchor
        hidden = run.draft(self.target.embed(block, cfg.input_embedding_scale).to(d.dtype), cache)[:, 1:]
        logits = self.lean_drafter.logits(hidden) if self.lean_drafter else d.logits(hidden, self.target.head)
        return hidden, logits.float()

    def draft_block(self, target_hidden, n_new, anchor, block_size, cache, params, keys, first):
        """The drafter family's proposer drafts (``Proposer.torch_block``; DFlash: ``Backend.draft_block``)."""
        return self.proposer.torch_block(self, target_hidden, n_new, anchor, block_size, cache, params, keys, first)

    def keep_rows(self, target_cache, draft_cache, rows):
        self.caches.keep_rows(target_cache, rows)
        if draft_cache is not None:
            draft_cache.select(rows)
            repack_paged(draft_cache)

    def merge_rows(self, target_a, draft_a, target_b, draft_b):
        """Full-attention columns padded on the right to the wider cache, sliding windows and
        recurrent states concatenated (``CachePolicy.merge``)."""
        return self.caches.merge(target_a, target_b), (merge_paged(draft_a, draft_b) if draft_a is not None else None)

    def compact(self, target_cache, col_valid):
        return self.caches.compact(target_cache, col_valid)

    def commit_cache(self, target_cache, col_valid, n_new):
        self.caches.commit(target_cache, col_valid, n_new)


# ---- cache surgery shared by backends -----------------------------------------------------
def merge_paged(a: PagedKVCache, b: PagedKVCache) -> PagedKVCache:
    """``a`` with ``b``'s sequences appended: b's used pages are copied after a's, its page table
    renumbered, both tables padded to the wider one with -1."""
    n = b.used_pages
    if a.used_pages + n > a.k.shape[1]:  # grow the pool (doubling, as reserve does)
        extra = max(a.used_pages + n, 2 * a.k.shape[1]) - a.k.shape[1]
        a.k, a.v = (torch.cat([t, t.new_zeros(t.shape[0], extra, *t.shape[2:])], dim=1) for t in (a.k, a.v))
    a.k[:, a.used_pages : a.used_pages + n] = b.k[:, :n]
    a.v[:, a.used_pages : a.used_pages + n] = b.v[:, :n]
    table_b = torch.where(b.page_table >= 0, b.page_table + a.used_pages, b.page_table)
    width = max(a.page_table.shape[1], table_b.shape[1])
    pad = lambda t: torch.cat([t, t.new_full((t.shape[0], width - t.shape[1]), -1)], 1)  # noqa: E731
    a.page_table = torch.cat([pad(a.page_table), pad(table_b)])
    a.lengths = torch.cat([a.lengths, b.lengths])
    a.used_pages += n
    return a


def repack_paged(cache: PagedKVCache, force: bool = False) -> None:
    """Free the pages of sequences that left (``select`` keeps them allocated): once fewer than
    half the allocated pages are still in some page table, copy the live ones to the front of
    the pool and renumber the tables (a continuously batching scheduler would grow forever else);
    ``force``: whenever any page is free (a pool of fixed size about to take more rows)."""
    live = cache.page_table[cache.page_table >= 0]
    if (live.numel() if force else 2 * live.numel()) >= cache.used_pages:
        return
    order = live.long().sort().values  # old ids, ascending
    remap = torch.full((cache.used_pages,), -1, dtype=cache.page_table.dtype, device=order.device)
    remap[order] = torch.arange(order.numel(), dtype=cache.page_table.dtype, device=order.device)
    cache.k[:, : order.numel()] = cache.k[:, order]
    cache.v[:, : order.numel()] = cache.v[:, order]
    cache.page_table = torch.where(cache.page_table >= 0, remap[cache.page_table.long().clamp_min(0)], cache.page_table)
    cache.used_pages = order.numel()
