"""The speculative loop: prefill, draft, verify, accept. The executable specification.

Invariant between rounds, per sequence: the committed tokens are ``x_0 .. x_{n-1}``; the
target's KV cache and the drafter's context cache hold ``x_0 .. x_{n-2}`` (all but the
last); the last committed token ``x_{n-1}`` (the previous round's bonus token) is the next
block's anchor, at position ``n - 1``.

One round, for the whole batch at once:

1. draft:  the block ``[anchor, MASK x (B-1)]`` runs through the drafter in one forward;
   positions 1..B-1 give B-1 draft tokens through the target's LM head.
2. verify: the target runs once over ``[anchor, d_1 .. d_{B-1}]``.
3. accept: the longest prefix that agrees with the target (greedy), or rejection
   sampling (T > 0), then one bonus token from the target. Each sequence advances by
   its own ``acc + 1``.
4. commit: the target hidden states of the ``acc + 1`` verified inputs become drafter
   context (KV injection). Rejected positions stay in the target's KV cache as holes
   that the attention mask hides, so no sequence waits for another.

Block size 1 is plain autoregressive decoding through the same code: no drafter, each
"round" verifies just the anchor and emits its bonus token.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from dflash_trt.errors import DFlashError
from dflash_trt.model import Drafter, Target
from dflash_trt.runtime.sampling import SamplingParams, probs, rejection_sample, draw, select


@dataclass
class Stats:
    """Counters of one generate call, over all its sequences."""

    block_size: int
    rounds: int = 0                 # sequence-rounds: one per sequence per target forward
    committed: int = 0              # tokens committed in those rounds (accepted + bonus)
    target_forwards: int = 0        # batched target forwards, prefill included
    accepted_at: list[int] = field(default_factory=list)  # per draft position k: rounds with acc >= k
    prompt_tokens: int = 0
    new_tokens: int = 0
    seconds: float = 0.0
    prefill_seconds: float = 0.0
    draft_seconds: float = 0.0      # drafter: block forward + KV injection, rounds only
    verify_seconds: float = 0.0     # target forwards in rounds (prefill excluded)

    @property
    def acceptance_length(self) -> float:
        """τ: mean tokens committed per sequence per target forward (1 <= τ <= B)."""
        return self.committed / self.rounds if self.rounds else 0.0

    @property
    def per_position_acceptance(self) -> list[float]:
        return [a / self.rounds if self.rounds else 0.0 for a in self.accepted_at]

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict:
        return {
            "block_size": self.block_size,
            "acceptance_length": round(self.acceptance_length, 4),
            "per_position_acceptance": [round(x, 4) for x in self.per_position_acceptance],
            "target_forwards": self.target_forwards,
            "rounds": self.rounds,
            "prompt_tokens": self.prompt_tokens,
            "new_tokens": self.new_tokens,
            "seconds": round(self.seconds, 4),
            "tokens_per_second": round(self.tokens_per_second, 3),
            "prefill_seconds": round(self.prefill_seconds, 4),
            "draft_seconds": round(self.draft_seconds, 4),
            "verify_seconds": round(self.verify_seconds, 4),
        }


@dataclass
class Generation:
    token_ids: list[list[int]]      # generated tokens per sequence (no prompt)
    finish_reasons: list[str]       # "stop", "length" or "cancelled"
    stats: Stats


def _new_target_cache(target: Target):
    from transformers import DynamicCache

    return DynamicCache(config=target.config)


def _drop_hole_columns(cache, col_valid: torch.Tensor) -> torch.Tensor:
    """Remove cache columns that are holes in every row (all of them, at batch 1).

    Holes are masked anyway; dropping them keeps attention and mask cost proportional
    to committed tokens instead of B per round. Only plain (non-sliding) dynamic layers
    are compacted; other cache types keep their holes, which is still correct.
    """
    keep = col_valid.any(0)
    if bool(keep.all()):
        return col_valid
    layers = getattr(cache, "layers", [])
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


@torch.inference_mode()
def generate(
    target: Target,
    drafter: Drafter | None,
    prompts: list[list[int]],
    *,
    max_new_tokens: int = 128,
    sampling: SamplingParams = SamplingParams(),
    block_size: int | None = None,
    stop_token_ids: list[int] | tuple[int, ...] = (),
    on_commit: Callable[[int, list[int]], None] | None = None,
    should_stop: Callable[[int], bool] | None = None,
) -> Generation:
    """Generate for a batch of tokenized prompts; block_size 1 (or no drafter) is autoregressive.

    ``on_commit(row, new_token_ids)`` is called after every commit with the prompt's index
    in ``prompts`` (for streaming). ``should_stop(row)`` is asked after every commit; when
    it says yes the row finishes as ``"cancelled"`` and leaves the batch (a client that
    went away frees its slot).
    """
    B = block_size or (drafter.cfg.block_size if drafter is not None else 1)
    if B < 1:
        raise DFlashError(f"block size must be >= 1, got {B}")
    if B > 1 and drafter is None:
        raise DFlashError("a block size above 1 needs a drafter")
    if drafter is not None and B > drafter.cfg.block_size:
        raise DFlashError(f"block size {B} exceeds the drafter's trained block size {drafter.cfg.block_size}")
    if not prompts or any(len(p) == 0 for p in prompts):
        raise DFlashError("every prompt needs at least one token")
    if max_new_tokens < 0:
        raise DFlashError(f"max_new_tokens must be >= 0, got {max_new_tokens}")

    b, dev = len(prompts), target.device
    stats = Stats(block_size=B, accepted_at=[0] * (B - 1),
                  prompt_tokens=sum(len(p) for p in prompts))
    outputs: list[list[int]] = [[] for _ in range(b)]
    reasons = ["length"] * b
    if max_new_tokens == 0:
        return Generation(outputs, reasons, stats)
    gen = torch.Generator(device=dev).manual_seed(sampling.seed) if sampling.seed is not None else None
    stops = set(stop_token_ids)
    use_drafter = B > 1
    start = time.perf_counter()

    # ---- prefill: right-padded prompts; padding columns are holes from the start ------
    lengths = torch.tensor([len(p) for p in prompts], device=dev)
    T = int(lengths.max())
    ids = torch.zeros(b, T, dtype=torch.long, device=dev)
    for i, p in enumerate(prompts):
        ids[i, : len(p)] = torch.tensor(p, device=dev)
    col_valid = torch.arange(T, device=dev)[None] < lengths[:, None]
    positions = torch.arange(T, device=dev).expand(b, T)
    cache = _new_target_cache(target)
    logits, target_hidden = target.forward(ids, positions, col_valid.long(), cache, capture=use_drafter)
    rows = torch.arange(b, device=dev)
    last = select(logits[rows, lengths - 1], sampling, gen)
    stats.target_forwards += 1
    dcache = None
    if use_drafter:
        dcache = drafter.new_cache(b, device=dev)
        drafter.inject(target_hidden.to(drafter.dtype), lengths, dcache)
    seq_pos = lengths.clone()             # position of the anchor == tokens already cached
    live = list(range(b))                 # original index of each row still generating
    done = []
    for r, i in enumerate(live):
        tok = int(last[r])
        outputs[i].append(tok)
        if on_commit is not None:
            on_commit(i, [tok])
        if tok in stops:
            reasons[i] = "stop"
            done.append(r)
        elif max_new_tokens == 1:
            done.append(r)
        elif should_stop is not None and should_stop(i):
            reasons[i] = "cancelled"
            done.append(r)
    stats.prefill_seconds = time.perf_counter() - start

    offsets = torch.arange(B, device=dev)
    scale = drafter.cfg.input_embedding_scale if use_drafter else 1.0
    while True:
        # ---- retire finished rows from every batched structure -------------------------
        if done:
            keep = torch.tensor([r for r in range(len(live)) if r not in set(done)], device=dev, dtype=torch.long)
            live = [live[r] for r in keep.tolist()]
            if not live:
                break
            cache.batch_select_indices(keep)
            col_valid, seq_pos, last = col_valid[keep], seq_pos[keep], last[keep]
            if dcache is not None:
                dcache.select(keep)
            done = []
        col_valid = _drop_hole_columns(cache, col_valid)
        n = len(live)

        # ---- draft: one drafter forward over [anchor, MASK ...] -----------------------
        block = torch.full((n, B), drafter.cfg.mask_token_id if use_drafter else 0, dtype=torch.long, device=dev)
        block[:, 0] = last
        q = None
        t0 = time.perf_counter()
        if use_drafter:
            hidden = drafter.draft(target.embed(block, scale).to(drafter.dtype), dcache)
            dlogits = drafter.logits(hidden[:, 1:], target.head).float()
            if sampling.greedy:
                block[:, 1:] = dlogits.argmax(-1)
            else:
                q = probs(dlogits, sampling)
                block[:, 1:] = draw(q, gen)

        # ---- verify: one target forward over [anchor, d_1 .. d_{B-1}] -----------------
        t1 = time.perf_counter()
        attn = torch.cat([col_valid, torch.ones(n, B, dtype=torch.bool, device=dev)], dim=1)
        logits, target_hidden = target.forward(block, seq_pos[:, None] + offsets, attn.long(), cache, capture=use_drafter)
        stats.target_forwards += 1
        t2 = time.perf_counter()
        stats.draft_seconds += t1 - t0
        stats.verify_seconds += t2 - t1
        r_ = torch.arange(n, device=dev)
        if sampling.greedy or not use_drafter:
            if sampling.greedy:
                post = logits.argmax(-1)
                acc = (block[:, 1:] == post[:, :-1]).long().cumprod(-1).sum(-1)
                bonus = post[r_, acc]
            else:
                acc = torch.zeros(n, dtype=torch.long, device=dev)
                bonus = draw(probs(logits[:, 0], sampling), gen)
        else:
            acc, bonus = rejection_sample(block[:, 1:], q, probs(logits, sampling), gen)

        # ---- commit ---------------------------------------------------------------------
        acc_l, block_l, bonus_l = acc.tolist(), block.tolist(), bonus.tolist()
        for k in range(1, B):
            stats.accepted_at[k - 1] += sum(a >= k for a in acc_l)
        for r, i in enumerate(live):
            new = block_l[r][1 : 1 + acc_l[r]] + [bonus_l[r]]
            room = max_new_tokens - len(outputs[i])
            produced = new[:room]
            for j, tok in enumerate(produced):
                if tok in stops:
                    produced = produced[: j + 1]
                    reasons[i] = "stop"
                    break
            outputs[i].extend(produced)
            stats.rounds += 1
            stats.committed += len(produced)
            if on_commit is not None:
                on_commit(i, produced)
            if reasons[i] == "stop" or len(outputs[i]) >= max_new_tokens:
                done.append(r)
            elif should_stop is not None and should_stop(i):
                reasons[i] = "cancelled"
                done.append(r)
        n_new = acc + 1
        col_valid = torch.cat([col_valid, offsets[None] < n_new[:, None]], dim=1)
        if use_drafter and len(done) < n:
            t3 = time.perf_counter()
            drafter.inject(target_hidden.to(drafter.dtype), n_new, dcache)
            stats.draft_seconds += time.perf_counter() - t3
        seq_pos = seq_pos + n_new
        last = bonus

    stats.seconds = time.perf_counter() - start
    stats.new_tokens = sum(len(o) for o in outputs)
    return Generation(outputs, reasons, stats)
