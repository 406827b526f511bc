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
   another (the backend settles what a mask cannot hide, recurrent states and sliding
   windows: ``Backend.commit_cache``).

Block size 1 is plain autoregressive decoding through the same code: no drafter, each
"round" verifies just the anchor and emits its bonus token. Every model call goes through
a :class:`~dflash_trt.runtime.backend.Backend`.

Rows are :class:`Request` objects (``batch.py``), each with its own limits and sampling parameters. A batch
changes between rounds: :meth:`Batch.filter` lets rows leave, :meth:`Batch.merge` lets rows
that :func:`admit` just prefilled join (SGLang's ``filter_batch`` / ``merge_batch``), each
through the backend, so a row's tokens never depend on what shares its batch; :func:`readmit`
rebuilds a row that already took tokens alone in fresh caches (after a shared round raised).
:func:`generate` admits every prompt at once and runs rounds until none is left; the
scheduler (``scheduler.py``) admits and rounds step by step with the same functions.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import cast

import torch

from dflash_trt.errors import DFlashError
from dflash_trt.model import Drafter, Target
from dflash_trt.runtime.backend import Backend, TorchBackend
from dflash_trt.runtime.batch import Batch, Request, take
from dflash_trt.runtime.sampling import SamplingParams, accept_rows, select_rows
from dflash_trt.runtime.stats import Stats


@dataclass
class Generation:
    token_ids: list[list[int]]  # generated tokens per sequence (no prompt)
    finish_reasons: list[str]  # "stop", "length" or "cancelled"
    stats: Stats


def block_size_for(requested: int | None, trained: int | None) -> int:
    """The draft block size to run: the one asked for, else the drafter's trained block,
    else 1 (no drafter: autoregressive decoding)."""
    return requested or trained or 1


def _sampling(batch_rows: list[Request]) -> tuple[list[SamplingParams], list[int | None]]:
    return [r.sampling for r in batch_rows], [r.noise_key for r in batch_rows]


def prefill(backend: Backend, rows: list[Request], draft: bool) -> Batch:
    """The right-padded prompts [b, T] through the target in one forward (padding columns are
    holes from the start); each row's first token, drawn at its last prompt position, becomes
    its anchor. With ``draft``, the prompts' target_hidden [b, T, n_tap*H] waits for the
    first drafter round."""
    batch, logits = _context(backend, rows, [r.prompt for r in rows], draft)
    batch.last = select_rows(logits[:, 0], *_sampling(rows), batch.positions.tolist())  # [b]
    return batch


def _context(backend: Backend, rows: list[Request], seqs: list[list[int]], draft: bool) -> tuple[Batch, torch.Tensor]:
    """``seqs`` right-padded [b, T] through fresh caches in one target forward: the batch whose
    anchors are still to be set (zeros), and the logits at each row's last position [b, 1, V]."""
    dev = backend.device
    lengths = torch.tensor([len(s) for s in seqs], device=dev)  # [b]
    b, T = len(rows), int(lengths.max())
    ids = torch.zeros(b, T, dtype=torch.long, device=dev)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s, device=dev)
    col_valid = torch.arange(T, device=dev)[None] < lengths[:, None]  # [b, T]
    cache, dcache = backend.new_caches(b, draft)
    logits, target_hidden = backend.target_forward(
        ids, torch.arange(T, device=dev).expand(b, T), col_valid, cache, capture=draft, logits_at=lengths - 1
    )
    return Batch(
        list(rows), cache, dcache, col_valid, lengths, torch.zeros_like(lengths), target_hidden, lengths
    ), logits


def readmit(backend: Backend, req: Request, draft: bool, stats: Stats) -> Batch:
    """Rebuild the row of ``req``, which already took tokens, alone in fresh caches: its prompt and
    every token it took but the last through one prefill, the last its anchor; no token is drawn.
    The invariant of this module's docstring then holds as if the row had never left its batch
    (every family: the caches are built by the same forward as a prompt's), so its tokens go on
    unchanged: greedy is the target's own decoding, a seeded row's noise is drawn per token index."""
    assert req.token_ids and req.finish_reason is None, "only a live row that took tokens is readmitted"
    *ctx, anchor = req.prompt + req.token_ids
    backend.check_request([ctx], 1, 1)  # the rebuild's forward fits the backend (one line if not)
    batch, _ = _context(backend, [req], [ctx], draft)
    batch.last = torch.full_like(batch.last, anchor)
    stats.target_forwards += 1
    return batch


def draft(backend: Backend, batch: Batch, B: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The block to verify, [n, B]: the anchor, then B-1 draft tokens; and q [n, B-1, V], the
    warped draft distributions of the sampled rows (None when there are none;
    ``Backend.draft_block``). B = 1 drafts nothing: the block is the anchor alone (a drafter
    still takes in the last commit)."""
    anchor = batch.last[:, None]  # [n, 1]
    if batch.draft_cache is None:
        return anchor, None
    assert batch.target_hidden is not None, "a drafting batch carries the target's hidden states"
    tokens, q = backend.draft_block(
        batch.target_hidden,
        batch.n_new,
        batch.last,
        B,
        batch.draft_cache,
        *_sampling(batch.rows),
        (batch.positions + 1).tolist(),
    )  # [n, B-1], [n, B-1, V]
    if tokens is None:
        return anchor, None
    return torch.cat([anchor, tokens], dim=1), q


def verify(backend: Backend, batch: Batch, block: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One target forward over block [n, B] at positions ``positions + 0..B-1``, attending
    to the cache's valid columns. Returns logits [n, B, V] and target_hidden [n, B, n_tap*H]
    (None without a drafter)."""
    batch.col_valid = backend.compact(batch.target_cache, batch.col_valid)
    n, B = block.shape
    offsets = torch.arange(B, device=block.device)
    attn = torch.cat([batch.col_valid, torch.ones(n, B, dtype=torch.bool, device=block.device)], dim=1)
    return backend.target_forward(
        block, batch.positions[:, None] + offsets, attn, batch.target_cache, capture=batch.draft_cache is not None
    )


def commit(
    backend: Backend,
    batch: Batch,
    block: torch.Tensor,
    acc: torch.Tensor,
    bonus: torch.Tensor,
    target_hidden: torch.Tensor | None,
) -> None:
    """Advance row r past the first ``acc[r] + 1`` inputs of the verified block [n, B]: they
    become valid target cache columns (the rest are holes; the backend settles its cache on
    them, ``Backend.commit_cache``), their target_hidden the next drafter round's context,
    and bonus [n] the next anchor."""
    n_new = acc + 1  # [n]
    offsets = torch.arange(block.shape[1], device=block.device)
    batch.col_valid = torch.cat([batch.col_valid, offsets[None] < n_new[:, None]], dim=1)
    backend.commit_cache(batch.target_cache, batch.col_valid, n_new)
    batch.positions = batch.positions + n_new
    batch.last, batch.target_hidden, batch.n_new = bonus, target_hidden, n_new


def admit(backend: Backend, rows: list[Request], draft: bool, stats: Stats) -> Batch | None:
    """Prefill ``rows`` and take their first tokens; returns the batch of those that go on
    (None when every one finished at its first token)."""
    batch = prefill(backend, rows, draft)
    stats.target_forwards += 1
    stats.prompt_tokens += sum(len(r.prompt) for r in rows)
    _, going = take(batch.rows, [[t] for t in batch.last.tolist()])
    return batch if batch.filter(backend, going) else None


def run_round(backend: Backend, batch: Batch, B: int, stats: Stats) -> bool:
    """One round for the whole batch with block size B: draft, verify, accept, commit; rows
    that finish leave. Returns False when no row is left.

    Every model call of the round (draft, verify, the cache commit) and the acceptance run before
    any row takes a token (``take``: appended, streamed): a round that raises there has changed
    no row, only the batch's caches (then unknown: the scheduler rebuilds its rows alone,
    :func:`readmit`)."""
    t0 = time.perf_counter()
    block, q = draft(backend, batch, B)  # [n, B]
    t1 = time.perf_counter()
    logits, target_hidden = verify(backend, batch, block)  # [n, B, V]
    t2 = time.perf_counter()
    acc, bonus = accept_rows(
        block[:, 1:], logits, q, *_sampling(batch.rows), (batch.positions + 1).tolist()
    )  # [n], [n]
    commit(backend, batch, block, acc, bonus, target_hidden)  # before any token is taken (below)
    acc_l, block_l = acc.tolist(), block.tolist()
    new = [row[1 : 1 + a] + [b] for row, a, b in zip(block_l, acc_l, bonus.tolist(), strict=True)]  # accepted + bonus
    kept, going = take(batch.rows, new)
    for req, k in zip(batch.rows, kept, strict=True):
        req.rounds += 1
        req.committed += k
    stats.observe(acc_l, kept)
    stats.draft_seconds += t1 - t0
    stats.verify_seconds += t2 - t1
    return batch.filter(backend, going)


def _checked_block_size(backend: Backend, requested: int | None, prompts: list[list[int]], max_new_tokens: int) -> int:
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
    match_stop: Callable[[int, list[int]], int | None] | None = None,
    backend: Backend | None = None,
) -> Generation:
    """Generate for a batch of tokenized prompts; block_size 1 (or no drafter) is autoregressive.

    Every prompt is admitted at once (one prefill), then rounds run until none is left.
    ``on_commit(row, new_token_ids)`` is called after every commit with the prompt's index
    in ``prompts`` (for streaming). ``should_stop(row)`` is asked after every commit; when
    it says yes the row finishes as ``"cancelled"`` and leaves the batch (a client that
    went away frees its slot). ``match_stop(row, new)``: ``Request.match_stop`` per row.
    With ``sampling.seed``, prompt i draws the noise stream
    ``(seed, i)``: the call reproduces, and equal prompts still sample independently.
    ``backend`` answers every model call (default: ``TorchBackend(target, drafter)``; when
    given, ``target`` and ``drafter`` are unused).
    """
    if backend is None:
        if target is None:
            raise DFlashError("generate needs a target or a backend")
        backend = TorchBackend(target, drafter)
    B = _checked_block_size(backend, block_size, prompts, max_new_tokens)
    backend.check_request(prompts, max_new_tokens, B)
    stops = frozenset(stop_token_ids)
    rows = [
        Request(
            p,
            max_new_tokens,
            sampling,
            stops,
            stream=i,
            on_commit=partial(on_commit, i) if on_commit else None,
            should_stop=partial(should_stop, i) if should_stop else None,
            match_stop=partial(match_stop, i) if match_stop else None,
        )
        for i, p in enumerate(prompts)
    ]
    stats = Stats(block_size=B)
    if max_new_tokens == 0:
        stats.prompt_tokens = sum(len(p) for p in prompts)
        return Generation([[] for _ in rows], ["length"] * len(rows), stats)
    start = time.perf_counter()
    batch = admit(backend, rows, B > 1, stats)
    stats.prefill_seconds = time.perf_counter() - start
    while batch is not None and run_round(backend, batch, B, stats):
        pass
    stats.seconds = time.perf_counter() - start
    stats.new_tokens = sum(len(r.token_ids) for r in rows)
    reasons = [r.finish_reason for r in rows]  # every row has finished when the loop ends
    return Generation([r.token_ids for r in rows], cast(list[str], reasons), stats)
