"""The speculative loop: prefill, draft, verify, accept, commit. The executable specification.

Invariant between rounds, per sequence: the committed tokens are ``x_0 .. x_{n-1}``; the
target's KV cache holds ``x_0 .. x_{n-2}`` (all but the last); the last committed token
``x_{n-1}`` (the previous round's bonus token) is the next block's anchor, at position
``n - 1``. The drafter's context cache holds the same tokens except the last commit's,
whose target_hidden waits in the batch state and is injected at the start of the next
drafter round (one drafter call per round, as the exported drafter graph runs it).

One round, for the whole batch at once (gpt-fast's ``speculative_decode``, batched):

1. draft:  KV injection of the last commit, then the block ``[anchor, MASK x (B-1)]``
   through the drafter in one forward; positions 1..B-1 give B-1 draft tokens.
2. verify: the target runs once over ``[anchor, d_1 .. d_{B-1}]``.
3. accept: the longest prefix that agrees with the target (greedy), or rejection
   sampling (T > 0), then one bonus token from the target (``sampling.accept``).
4. commit: each sequence advances by its own ``acc + 1``. Rejected positions stay in the
   target's KV cache as holes that the attention mask hides, so no sequence waits for
   another.

Block size 1 is plain autoregressive decoding through the same code: no drafter, each
"round" verifies just the anchor and emits its bonus token. Every model call goes through
a :class:`~dflash_trt.runtime.backend.Backend`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from dflash_trt.errors import DFlashError
from dflash_trt.model import Drafter, Target
from dflash_trt.runtime.backend import Backend, TorchBackend
from dflash_trt.runtime.sampling import SamplingParams, accept, select
from dflash_trt.runtime.stats import Stats


@dataclass
class Generation:
    token_ids: list[list[int]]      # generated tokens per sequence (no prompt)
    finish_reasons: list[str]       # "stop", "length" or "cancelled"
    stats: Stats


def block_size_for(requested: int | None, trained: int | None) -> int:
    """The draft block size to run: the one asked for, else the drafter's trained block,
    else 1 (no drafter: autoregressive decoding)."""
    return requested or trained or 1


@dataclass
class Batch:
    """The rows still generating, as one batch; row ``r`` of every tensor is prompt ``rows[r]``,
    and between rounds every row holds the invariant in this module's docstring.

    col_valid [n, S]: which of the target cache's S columns are real (False: padding or a
    rejected position). positions [n]: the anchor's position, i.e. the tokens committed
    before it. last [n]: the anchor. target_hidden [n, T, n_tap*H] / n_new [n]: the last
    commit, not yet injected into the drafter cache (None without a drafter).
    """

    rows: list[int]
    target_cache: object
    draft_cache: object | None
    col_valid: torch.Tensor
    positions: torch.Tensor
    last: torch.Tensor
    target_hidden: torch.Tensor | None
    n_new: torch.Tensor

    def filter(self, backend: Backend, keep: list[int]) -> bool:
        """Keep only rows ``keep`` (indices into this batch); False when none are left."""
        if len(keep) == len(self.rows):
            return True
        self.rows = [self.rows[r] for r in keep]
        if not self.rows:
            return False
        idx = torch.tensor(keep, dtype=torch.long, device=self.last.device)
        backend.keep_rows(self.target_cache, self.draft_cache, idx)
        self.col_valid, self.positions, self.last, self.n_new = (
            self.col_valid[idx], self.positions[idx], self.last[idx], self.n_new[idx])
        if self.target_hidden is not None:
            self.target_hidden = self.target_hidden[idx]
        return True


@dataclass
class Outputs:
    """The tokens of every prompt and why it finished: the one place finishing is decided."""

    prompts: int
    max_new_tokens: int
    stops: set[int]
    on_commit: Callable[[int, list[int]], None] | None
    should_stop: Callable[[int], bool] | None
    token_ids: list[list[int]] = field(init=False)
    reasons: list[str] = field(init=False)

    def __post_init__(self):
        self.token_ids = [[] for _ in range(self.prompts)]
        self.reasons = ["length"] * self.prompts

    def take(self, rows: list[int], new: list[list[int]]) -> tuple[list[int], list[int]]:
        """Append ``new[r]`` to prompt ``rows[r]``, cut at the length limit and after a stop
        token. Returns (tokens kept per row, the rows that go on)."""
        kept, going = [], []
        for r, (i, toks) in enumerate(zip(rows, new)):
            toks = toks[: self.max_new_tokens - len(self.token_ids[i])]
            for j, tok in enumerate(toks):
                if tok in self.stops:
                    toks = toks[: j + 1]
                    self.reasons[i] = "stop"
                    break
            self.token_ids[i].extend(toks)
            kept.append(len(toks))
            if self.on_commit is not None:
                self.on_commit(i, toks)
            if self.reasons[i] == "stop" or len(self.token_ids[i]) >= self.max_new_tokens:
                continue
            if self.should_stop is not None and self.should_stop(i):
                self.reasons[i] = "cancelled"
                continue
            going.append(r)
        return kept, going


def prefill(backend: Backend, prompts: list[list[int]], sampling: SamplingParams,
            gen: torch.Generator | None, draft: bool) -> Batch:
    """The right-padded prompts [b, T] through the target in one forward (padding columns are
    holes from the start); each row's first token, drawn at its last prompt position, becomes
    its anchor. With ``draft``, the prompts' target_hidden [b, T, n_tap*H] waits for the
    first drafter round."""
    dev = backend.device
    lengths = torch.tensor([len(p) for p in prompts], device=dev)                # [b]
    b, T = len(prompts), int(lengths.max())
    ids = torch.zeros(b, T, dtype=torch.long, device=dev)
    for i, p in enumerate(prompts):
        ids[i, : len(p)] = torch.tensor(p, device=dev)
    col_valid = torch.arange(T, device=dev)[None] < lengths[:, None]           # [b, T]
    cache, dcache = backend.new_caches(b, draft)
    logits, target_hidden = backend.target_forward(ids, torch.arange(T, device=dev).expand(b, T),
                                                   col_valid, cache, capture=draft)
    first = select(logits[torch.arange(b, device=dev), lengths - 1], sampling, gen)  # [b]
    return Batch(list(range(b)), cache, dcache, col_valid, lengths, first, target_hidden, lengths)


def draft(backend: Backend, batch: Batch, B: int, sampling: SamplingParams,
          gen: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The block to verify, [n, B]: the anchor, then B-1 draft tokens; and q [n, B-1, V], the
    draft distributions they were drawn from (None at temperature 0; ``Backend.draft_block``).
    B = 1 drafts nothing: the block is the anchor alone."""
    anchor = batch.last[:, None]                                                # [n, 1]
    if B == 1:
        return anchor, None
    tokens, q = backend.draft_block(batch.target_hidden, batch.n_new, batch.last, B, batch.draft_cache,
                                    sampling, gen)                              # [n, B-1], [n, B-1, V]
    return torch.cat([anchor, tokens], dim=1), q


def verify(backend: Backend, batch: Batch, block: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One target forward over block [n, B] at positions ``positions + 0..B-1``, attending
    to the cache's valid columns. Returns logits [n, B, V] and target_hidden [n, B, n_tap*H]
    (None without a drafter)."""
    batch.col_valid = backend.compact(batch.target_cache, batch.col_valid)
    n, B = block.shape
    offsets = torch.arange(B, device=block.device)
    attn = torch.cat([batch.col_valid, torch.ones(n, B, dtype=torch.bool, device=block.device)], dim=1)
    return backend.target_forward(block, batch.positions[:, None] + offsets, attn, batch.target_cache,
                                  capture=batch.draft_cache is not None)


def commit(batch: Batch, block: torch.Tensor, acc: torch.Tensor, bonus: torch.Tensor,
           target_hidden: torch.Tensor | None) -> None:
    """Advance row r past the first ``acc[r] + 1`` inputs of the verified block [n, B]: they
    become valid target cache columns (the rest are holes), their target_hidden the next
    drafter round's context, and bonus [n] the next anchor."""
    n_new = acc + 1                                                             # [n]
    offsets = torch.arange(block.shape[1], device=block.device)
    batch.col_valid = torch.cat([batch.col_valid, offsets[None] < n_new[:, None]], dim=1)
    batch.positions = batch.positions + n_new
    batch.last, batch.target_hidden, batch.n_new = bonus, target_hidden, n_new


def _checked_block_size(backend: Backend, requested: int | None, prompts: list[list[int]],
                        max_new_tokens: int) -> int:
    """The block size to run, after checking it and the other arguments (DFlashError if wrong)."""
    trained = backend.drafter_block_size
    B = block_size_for(requested, trained)
    if B < 1:
        raise DFlashError(f"block size must be >= 1, got {B}")
    if B > 1 and trained is None:
        raise DFlashError("a block size above 1 needs a drafter")
    if trained is not None and B > trained:
        raise DFlashError(f"block size {B} exceeds the drafter's trained block size {trained}")
    if not prompts or any(len(p) == 0 for p in prompts):
        raise DFlashError("every prompt needs at least one token")
    if max_new_tokens < 0:
        raise DFlashError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    return B


@torch.inference_mode()
def generate(
    target: Target | None,
    drafter: Drafter | None,
    prompts: list[list[int]],
    *,
    max_new_tokens: int = 128,
    sampling: SamplingParams = SamplingParams(),
    block_size: int | None = None,
    stop_token_ids: list[int] | tuple[int, ...] = (),
    on_commit: Callable[[int, list[int]], None] | None = None,
    should_stop: Callable[[int], bool] | None = None,
    backend: Backend | None = None,
) -> Generation:
    """Generate for a batch of tokenized prompts; block_size 1 (or no drafter) is autoregressive.

    ``on_commit(row, new_token_ids)`` is called after every commit with the prompt's index
    in ``prompts`` (for streaming). ``should_stop(row)`` is asked after every commit; when
    it says yes the row finishes as ``"cancelled"`` and leaves the batch (a client that
    went away frees its slot). ``backend`` answers every model call (default:
    ``TorchBackend(target, drafter)``; when given, ``target`` and ``drafter`` are unused).
    """
    backend = backend or TorchBackend(target, drafter)
    B = _checked_block_size(backend, block_size, prompts, max_new_tokens)
    stats = Stats(block_size=B, prompt_tokens=sum(len(p) for p in prompts))
    out = Outputs(len(prompts), max_new_tokens, set(stop_token_ids), on_commit, should_stop)
    if max_new_tokens == 0:
        return Generation(out.token_ids, out.reasons, stats)
    dev = backend.device
    gen = torch.Generator(device=dev).manual_seed(sampling.seed) if sampling.seed is not None else None
    start = time.perf_counter()
    batch = prefill(backend, prompts, sampling, gen, draft=B > 1)
    stats.target_forwards += 1
    _, going = out.take(batch.rows, [[t] for t in batch.last.tolist()])
    stats.prefill_seconds = time.perf_counter() - start
    while batch.filter(backend, going):
        t0 = time.perf_counter()
        block, q = draft(backend, batch, B, sampling, gen)                      # [n, B]
        t1 = time.perf_counter()
        logits, target_hidden = verify(backend, batch, block)                   # [n, B, V]
        t2 = time.perf_counter()
        acc, bonus = accept(block[:, 1:], logits, q, sampling, gen)             # [n], [n]
        acc_l, block_l = acc.tolist(), block.tolist()
        new = [row[1 : 1 + a] + [b] for row, a, b in zip(block_l, acc_l, bonus.tolist())]  # accepted + bonus
        kept, going = out.take(batch.rows, new)
        stats.observe(acc_l, kept)
        stats.draft_seconds += t1 - t0
        stats.verify_seconds += t2 - t1
        commit(batch, block, acc, bonus, target_hidden)
    stats.seconds = time.perf_counter() - start
    stats.new_tokens = sum(len(o) for o in out.token_ids)
    return Generation(out.token_ids, out.reasons, stats)
