"""The exported graphs as a :class:`~dflash_trt.runtime.backend.Backend`: the runtime owns the
caches and feeds them in and out of every call.

A bundle built with ``--graphs`` holds three graphs (``export/onnx_graphs.py`` documents their
I/O): ``embed`` (token ids -> embedding rows), ``target`` (a forward with ``past_k``/``past_v``
in and the forward's ``new_k``/``new_v`` out, plus target_hidden) and ``drafter`` (one round: KV
injection, then the block forward, over the paged cache; a DFlash2 drafter's graph also walks its
candidate selector and outputs the proposal, ``export/onnx_dflash2.py``, which
:meth:`GraphBackend.draft_block` turns into the loop's tokens and q). ONNX Runtime (``onnx_backend.py``)
and TensorRT (``trt_backend.py``) differ only in how one graph runs (:meth:`GraphBackend.run`);
everything around the calls is here:

- the target cache (:class:`DenseTargetCache`): k, v [layers, b, kvh, S, d], a buffer the graph
  reads as its past (row i's first ``lengths[i]`` columns valid) and returns only the forward's
  new K/V, which the runtime writes in place: all of a prefill's valid columns, and of a verify
  only the ``n_new`` the acceptance keeps (``commit_cache``), so the cache stays packed by row and
  a partial acceptance costs no compaction (rejected K/V are never written). A bundle exported
  before that contract (``present_k``/``present_v`` out: :class:`TargetCache`) has its cache
  replaced by the present every forward and compacted by row: keys carry their RoPE and the
  mask is explicit, so column order does not matter to attention; each row's valid columns move
  to the front, and the cache is as wide as the longest row's committed context, not the
  batch's history of rejected positions;
- the drafter cache: a ``plugins.PagedKVCache`` whose pages the runtime allocates
  (``reserve``) before each round, as the drafter graph expects, and whose tensors the graph's
  ``k_cache_out`` / ``v_cache_out`` replace (TensorRT writes them in place);
- the request check (:meth:`GraphBackend.check_request`) against ``ingest.EngineProfile``, the
  shapes the engines were built for (``graph_profile.py``): a request outside them is one line
  before any work.
"""

from __future__ import annotations

from abc import abstractmethod

import torch
import torch.nn.functional as F

from dflash_trt import plugins
from dflash_trt.errors import DFlashError
from dflash_trt.runtime.backend import Backend, merge_paged, repack_paged
from dflash_trt.runtime.graph_caches import DenseKVCache, DenseTargetCache, TargetCache, merge_caches
from dflash_trt.runtime.graph_profile import request_problem, request_shapes
from dflash_trt.runtime.proposer import graph_proposer

#: each graph's outputs, in the order :meth:`GraphBackend.run` returns them (``build/export.py``)
GRAPH_OUTPUTS = {
    "embed": ["embeds"],
    "target": ["logits", "target_hidden", "new_k", "new_v"],
    "drafter": ["logits", "k_cache_out", "v_cache_out"],
}
#: the target graph's outputs in bundles exported before the new-K/V contract (the whole present cache)
PRESENT_TARGET_OUTPUTS = ["logits", "target_hidden", "present_k", "present_v"]


class GraphBackend(Backend):
    """The loop's calls answered by the three exported graphs (see the module docstring).

    ``profile`` is the bundle's ``ingest.EngineProfile``; ``mask_token_id`` the drafter's MASK.
    A subclass runs one graph (:meth:`run`) and says what its inputs' static dims are
    (:meth:`input_shape`).
    """

    #: pages the drafter pool starts with (None: the profile's maximum, allocated once).
    initial_pages: int | None = None
    #: the name --backend gives this backend (messages say it)
    name = "graph"
    #: a prefill of several prompts runs the target graph once per prompt, at its own length, instead
    #: of once padded to the longest: where the forward is bound by arithmetic (a CPU) the padding
    #: and the attention over it are paid in full (``OnnxBackend``; a GPU engine keeps the batch)
    prefill_rows_alone = False

    def __init__(self, profile, mask_token_id: int, device: torch.device, drafter_graph: str | None = None):
        self.profile, self.mask_token_id, self.device = profile, int(mask_token_id), torch.device(device)
        self.drafter_block_size = profile.block_size
        #: how the drafter family drafts through its graph (``proposer.graph_proposer``: the manifest's
        #: ``engine.drafter_graph`` when given, else what the graph's inputs say)
        self.proposer = graph_proposer(drafter_graph, self.input_names("drafter"))
        self.graph_outputs = {**GRAPH_OUTPUTS, "drafter": self.proposer.graph_outputs}
        #: the target graph returns only the forward's K/V (False: an older bundle's whole present)
        self.new_kv = "new_k" in self.output_names("target")
        if not self.new_kv:
            self.graph_outputs["target"] = PRESENT_TARGET_OUTPUTS
        self.vocab_size = self.output_shape("target", "logits")[-1]
        L, _, kvh, _, d = self.input_shape("target", "past_k")  # [layers, b, kvh, P, d]
        if L is None or kvh is None or d is None:  # static axes in every export
            raise DFlashError("the target graph's cache has a dynamic layer or head axis; rebuild the bundle")
        self._target_dims: tuple[int, int, int] = (L, kvh, d)
        #: the drafter graph reads a dense per-row context (``export/onnx_native.py``: ONNX Runtime's
        #: form) rather than the paged pool the dflash custom ops read
        self.dense_drafter = "k_ctx" in self.input_names("drafter")
        self._past_columns: int | None = None  # the checked request's target-cache bound (check_request)
        if self.dense_drafter:
            self.graph_outputs["drafter"] = self.proposer.dense_outputs
            Ld, _, kvh_d, _, dd = self.input_shape("drafter", "k_ctx")  # [L, b, kvh, S, d]
            page_size = profile.page_size  # no pages in this form
        else:
            Ld, _, page_size, kvh_d, dd = self.input_shape("drafter", "k_cache")  # [L, pages, page_size, kvh, d]
        if Ld is None or page_size is None or kvh_d is None or dd is None:  # static axes in every export
            raise DFlashError("the drafter graph's cache has a dynamic layer, page or head axis; rebuild the bundle")
        self._drafter_dims: tuple[int, int, int] = (Ld, kvh_d, dd)
        if page_size != profile.page_size:
            raise DFlashError(
                f"drafter graph pages hold {page_size} slots, the manifest's profile says "
                f"{profile.page_size}; rebuild the bundle"
            )

    @abstractmethod
    def run(self, graph: str, feeds: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        """Run graph ``graph`` ("embed" | "target" | "drafter") on ``feeds`` (contiguous tensors on
        ``self.device``); its outputs in ``GRAPH_OUTPUTS[graph]``'s order, on ``self.device``."""

    @abstractmethod
    def input_shape(self, graph: str, name: str) -> list[int | None]:
        """The declared shape of one graph input (None: a dynamic axis)."""

    @abstractmethod
    def output_shape(self, graph: str, name: str) -> list[int | None]:
        """The declared shape of one graph output (None: a dynamic axis)."""

    @abstractmethod
    def input_names(self, graph: str) -> list[str]:
        """The names of one graph's inputs."""

    @abstractmethod
    def output_names(self, graph: str) -> list[str]:
        """The names of one graph's outputs."""

    # -- the request check ---------------------------------------------------------------
    def check_batch(self, max_batch: int, block_size: int) -> None:
        """A scheduler's batch and block size within the engines' profile, or one line."""
        if max_batch > self.profile.max_batch:
            raise DFlashError(
                f"max batch {max_batch} exceeds the engines' profile (batch <= {self.profile.max_batch}) "
                f"that --backend {self.name} runs; lower --max-batch or rebuild with "
                "--set serving.max_batch_size=N"
            )
        self._check_block(block_size)

    def _check_block(self, block_size: int) -> None:
        p = self.profile
        if block_size not in (1, p.block_size):
            raise DFlashError(
                f"--backend {self.name}: the drafter graph was exported for block size {p.block_size}, "
                f"not {block_size}; use block size {p.block_size} (or 1), or --backend torch"
            )

    def check_request(self, prompts: list[list[int]], max_new_tokens: int, block_size: int) -> None:
        """Refuse, in one line, a request the engines were not built for (``ingest.EngineProfile``)."""
        p = self.profile
        self._check_block(block_size)
        lengths = [len(x) for x in prompts]
        problem = request_problem(p, lengths, max_new_tokens, block_size)
        #: the target cache's capacity for this request: the past a verify reads (request_shapes' seq
        #: less the block) never passes it, so neither does any shape the engines are run at. Only the
        #: capacity's rounding up to a chunk is capped by it, never a row's own columns (``reserve``),
        #: so a bound left by another request checked meanwhile (a scheduler's) is safe, only looser
        self._past_columns = request_shapes(lengths, max_new_tokens, block_size, p.page_size)["seq"] - block_size
        if problem:
            raise DFlashError(
                f"request outside the engines' profile (batch <= {p.max_batch}, <= {p.max_tokens} "
                f"tokens per forward, <= {p.max_seq_len} target-cache columns): {problem}; rebuild "
                "with larger serving limits (--set serving.max_batch_size=N --set serving.max_seq_len=N)"
            )

    # -- the loop's calls ----------------------------------------------------------------
    def new_caches(self, batch: int, draft: bool):
        dcache: DenseKVCache | plugins.PagedKVCache | None = None
        if draft and self.dense_drafter:
            dcache = DenseKVCache(*self._drafter_dims, batch=batch, device=self.device)
        elif draft:
            L, kvh, d = self._drafter_dims
            pages = self.initial_pages or self.profile.max_pages
            dcache = plugins.PagedKVCache(
                L, batch, kvh, d, page_size=self.profile.page_size, device=self.device, dtype=torch.float32, pages=pages
            )
        if not self.new_kv:
            return TargetCache(), dcache
        p = self.profile  # without a checked request, the profile's bound: past + a block <= max_seq_len
        past, self._past_columns = self._past_columns or p.max_seq_len - p.block_size, None
        return DenseTargetCache(*self._target_dims, batch=batch, device=self.device, max_columns=past), dcache

    def target_forward(self, ids, positions, attention_mask, cache, capture, logits_at=None):
        if self.new_kv:
            return self._dense_target_forward(ids, positions, attention_mask, cache, capture, logits_at)
        if cache.k is None:
            L, kvh, d = self._target_dims
            cache.k = cache.v = torch.zeros(L, ids.shape[0], kvh, 0, d, device=self.device)
        logits, target_hidden, cache.k, cache.v = self.run(
            "target",
            {
                "input_ids": ids.contiguous(),
                "attention_mask": attention_mask.long().contiguous(),
                "position_ids": positions.contiguous(),
                "past_k": cache.k,
                "past_v": cache.v,
            },
        )
        if logits_at is not None:  # the graph computes every position; keep the asked-for one per row
            logits = logits[torch.arange(ids.shape[0], device=logits.device), logits_at][:, None]
        return logits, (target_hidden if capture else None)

    def _dense_target_forward(self, ids, positions, attention_mask, cache, capture, logits_at):
        """The forward over the cache buffer as it is (row i valid before ``lengths[i]``; the
        loop's attention_mask [b, S+T] only says which of the T new tokens are real). A prefill's
        K/V (the prompts, right-padded) are written at once; a verify's wait for ``commit_cache``."""
        b, T = ids.shape
        new_valid = attention_mask[:, -T:].bool()  # [b, T]
        prefill = not bool(cache.lengths.any())
        n = _prompt_lengths(new_valid) if prefill else None  # right-padded prompts: row i's first n[i] are real
        if n is not None and b > 1 and self.prefill_rows_alone:
            logits, target_hidden, k_new, v_new = self._prefill_rows(ids, positions, n)
        else:
            past = torch.arange(cache.k.shape[3], device=self.device)[None] < cache.lengths[:, None]
            logits, target_hidden, k_new, v_new = self.run(
                "target",
                {
                    "input_ids": ids.contiguous(),
                    "attention_mask": torch.cat([past, new_valid], 1).long(),
                    "position_ids": positions.contiguous(),
                    "past_k": cache.k,
                    "past_v": cache.v,
                },
            )
        if n is not None:
            cache.reserve(n)
            cache.append(k_new, v_new, n)
        else:
            cache.pending = (k_new, v_new)
        if logits_at is not None:
            logits = logits[torch.arange(b, device=logits.device), logits_at][:, None]
        return logits, (target_hidden if capture else None)

    def _prefill_rows(self, ids, positions, n) -> list[torch.Tensor]:
        """The target graph's outputs for a prefill of right-padded prompts (n[i] real tokens in row
        i), one forward per prompt at its own length (``prefill_rows_alone``), zero-padded back to
        the batched forward's [b, T, ...]."""
        T = ids.shape[1]
        L, kvh, d = self._target_dims
        no_past = torch.zeros(L, 1, kvh, 0, d, device=self.device)
        lengths = n.tolist()
        rows = [
            self.run(
                "target",
                {
                    "input_ids": ids[i : i + 1, :m].contiguous(),
                    "attention_mask": torch.ones(1, m, dtype=torch.long, device=self.device),
                    "position_ids": positions[i : i + 1, :m].contiguous(),
                    "past_k": no_past,
                    "past_v": no_past,
                },
            )
            for i, m in enumerate(lengths)
        ]
        # every output's tokens axis is its second to last (logits, target_hidden [1, m, .]; new_k,
        # new_v [L, 1, kvh, m, d]); the batch axis is 0 of the first two and 1 of the K/V
        return [
            torch.cat(
                [F.pad(out[j], (0, 0, 0, T - m)) for out, m in zip(rows, lengths, strict=True)], dim=0 if j < 2 else 1
            )
            for j in range(4)
        ]

    def round_feeds(self, target_hidden, n_new, anchor, block_size, cache) -> dict[str, torch.Tensor]:
        """The drafter graph's common inputs for one round (pages reserved first: the graph writes
        into pages the runtime allocated)."""
        cache.reserve(n_new)
        return {
            "target_hidden": target_hidden.float().contiguous(),
            "n_new": n_new.long().contiguous(),
            "block_embeds": self._block_embeds(anchor, block_size),
            "k_cache": cache.k,
            "v_cache": cache.v,
            "page_table": cache.page_table.contiguous(),
            "lengths": cache.lengths.contiguous(),
        }

    def _block_embeds(self, anchor, block_size: int) -> torch.Tensor:
        """The round's block [anchor, MASK, ...] through the embedding graph: [b, B, H]."""
        block = anchor.new_full((anchor.shape[0], block_size), self.mask_token_id)  # [b, B]
        block[:, 0] = anchor
        (embeds,) = self.run("embed", {"input_ids": block})
        return embeds

    def drafter_round(self, target_hidden, n_new, anchor, block_size, cache):
        if not self.proposer.graph_logits:
            raise DFlashError(
                f"--backend {self.name}: this bundle's {self.proposer.graph} drafter graph proposes "
                "tokens, not logits; draft with draft_block"
            )
        if self.dense_drafter:
            return self._dense_round(target_hidden, n_new, anchor, block_size, cache)
        feeds = self.round_feeds(target_hidden, n_new, anchor, block_size, cache)
        logits, cache.k, cache.v = self.run("drafter", feeds)
        cache.lengths = cache.lengths + n_new
        return logits[:, 1:].float()  # [b, B-1, V]: block positions 1..B-1 are the drafts

    def dense_feeds(self, target_hidden, n_new, anchor, block_size, cache) -> dict[str, torch.Tensor]:
        """:meth:`round_feeds` for a dense-context drafter graph: the context buffer itself (room for
        this round's columns made first; the graph returns them and :meth:`DenseKVCache.append`
        writes them, so the cache is never copied in or out)."""
        cache.reserve(n_new)
        return {
            "target_hidden": target_hidden.float().contiguous(),
            "n_new": n_new.long().contiguous(),
            "block_embeds": self._block_embeds(anchor, block_size),
            "k_ctx": cache.k,
            "v_ctx": cache.v,
            "lengths": cache.lengths.contiguous(),
        }

    def _dense_round(self, target_hidden, n_new, anchor, block_size, cache):
        """The round through a dense-context drafter graph: it reads the context and returns this
        round's K/V, which the cache writes in place (no copy of the cache in or out)."""
        logits, k_new, v_new = self.run("drafter", self.dense_feeds(target_hidden, n_new, anchor, block_size, cache))
        cache.append(k_new, v_new, n_new)
        return logits[:, 1:].float()  # [b, B-1, V]

    def draft_block(self, target_hidden, n_new, anchor, block_size, cache, params, keys, first):
        """The drafter family's proposer drafts through the graph (``Proposer.graph_block``)."""
        return self.proposer.graph_block(self, target_hidden, n_new, anchor, block_size, cache, params, keys, first)

    def keep_rows(self, target_cache, draft_cache, rows):
        if isinstance(target_cache, DenseTargetCache):
            target_cache.select(rows)
        elif target_cache.k is not None:
            target_cache.k, target_cache.v = target_cache.k[:, rows], target_cache.v[:, rows]
        if draft_cache is not None:
            draft_cache.select(rows)
            if isinstance(draft_cache, plugins.PagedKVCache):  # the pages of rows that left are freed
                repack_paged(draft_cache)

    def merge_rows(self, target_a, draft_a, target_b, draft_b):
        """b's rows after a's (``graph_caches``: every row's columns stay where they were); a paged
        drafter pool is repacked first when b's pages would not fit beside a's live ones."""
        target = merge_caches(target_a, target_b)
        if draft_a is None or draft_b is None:
            return target, None
        if isinstance(draft_a, plugins.PagedKVCache):
            if draft_a.used_pages + draft_b.used_pages > draft_a.k.shape[1]:
                repack_paged(draft_a, force=True)
            return target, merge_paged(draft_a, draft_b)
        return target, merge_caches(draft_a, draft_b)

    def commit_cache(self, target_cache, col_valid, n_new):
        """Write the verify's first n_new[r] K/V columns of row r after its committed ones
        (the new-K/V contract; the rest, rejected, are never written)."""
        if isinstance(target_cache, DenseTargetCache) and target_cache.pending is not None:
            k_new, v_new = target_cache.pending
            target_cache.pending = None
            target_cache.reserve(n_new)
            target_cache.append(k_new, v_new, n_new)

    def compact(self, target_cache, col_valid):
        """Each row's valid columns first, in order; col_valid [b, S] -> [b, S'] with S' the most
        valid columns of any row (left-aligned: row r's first ``count_r`` columns are valid).
        A :class:`DenseTargetCache` is packed already: its lengths say the layout, nothing moves."""
        if isinstance(target_cache, DenseTargetCache):
            lengths = target_cache.lengths
            return torch.arange(int(lengths.max()), device=lengths.device)[None] < lengths[:, None]
        counts = col_valid.sum(1)  # [b]
        width = int(counts.max())
        packed = torch.arange(col_valid.shape[1], device=col_valid.device)[None] < counts[:, None]
        if target_cache.k is None or (width == col_valid.shape[1] and bool((packed == col_valid).all())):
            return col_valid
        if bool((packed == col_valid).all()):  # holes only at the tail (always so at batch 1): a slice
            target_cache.k, target_cache.v = target_cache.k[..., :width, :], target_cache.v[..., :width, :]
            return packed[:, :width]
        order = torch.sort((~col_valid).to(torch.int8), dim=1, stable=True).indices[:, :width]  # [b, S']
        L, kvh, d = self._target_dims
        idx = order[None, :, None, :, None].expand(L, -1, kvh, -1, d)
        target_cache.k = target_cache.k.gather(3, idx)
        target_cache.v = target_cache.v.gather(3, idx)
        return packed[:, :width]


def _prompt_lengths(new_valid: torch.Tensor) -> torch.Tensor:
    """Each row's real tokens in a prefill's [b, T] mask, which must be right-padded."""
    n = new_valid.sum(1)
    if not bool((new_valid == (torch.arange(new_valid.shape[1], device=new_valid.device)[None] < n[:, None])).all()):
        raise DFlashError("a prefill's prompts must be right-padded (each row's real tokens first)")
    return n
