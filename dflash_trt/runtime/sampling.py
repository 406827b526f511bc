"""Token selection: logit warping, sampling, and acceptance of drafts.

At temperature 0 everything is argmax. Otherwise the target's distribution is the warped
softmax (temperature, then top-k, then top-p), and every committed token is distributed
exactly as that warped distribution, in one of two ways:

- **unseeded rows**: :func:`rejection_sample` accepts draft tokens (Leviathan et al. 2023;
  Chen et al. 2023), the optimal coupling (the most drafts accepted);
- **seeded rows**: one Gumbel noise vector per *absolute token index*, drawn from the row's
  seed (:func:`gumbel`). The drafter's token at index i and the target's are both the argmax
  of their warped log-probabilities plus that index's noise (the Gumbel-max trick), and a
  draft is accepted while it equals the target's (the greedy rule on perturbed scores). Every
  committed token is then the target's own Gumbel-max sample at its index: exactly the
  target's distribution, and the same tokens whatever shares the batch, whatever the draft
  length or the round boundaries (the reproducibility a seed promises). It accepts somewhat
  fewer drafts than rejection sampling: a seed costs a little acceptance.

:func:`accept` is the rule for one set of parameters; :func:`accept_rows`, :func:`propose`
and :func:`select_rows` apply each row's own parameters in one batch (what the loop calls).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dflash_trt.errors import DFlashError


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None

    def __post_init__(self):
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise DFlashError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise DFlashError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise DFlashError(f"top_k must be >= 0, got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


# The smallest temperature divided by: below it float32 scores overflow (or the divisor rounds to
# 0); the warp is then already its T -> 0 limit (uniform over the argmax ties), so clamping is exact.
_MIN_T = torch.finfo(torch.float32).tiny


def probs(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """Warped distribution over the vocabulary (float32), same shape as logits.

    Defined for every accepted parameter: the logits are shifted so their maximum is 0 before
    dividing by ``max(T, float32 tiny)`` (no inf - inf for a tiny T), any ``top_k`` (>= vocab: no
    cut), and top-p always keeps the most likely token (a ``top_p`` that rounds to 0 in float32
    is greedy over the warped scores, never an empty set)."""
    x = logits.float().clamp(max=torch.finfo(torch.float32).max)  # an fp16 overflow (+inf) is its max
    scores = (x - x.amax(-1, keepdim=True)) / max(p.temperature, _MIN_T)
    vocab = scores.shape[-1]
    if 0 < p.top_k < vocab:
        kth = torch.topk(scores, p.top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    out = torch.softmax(scores, dim=-1)
    if p.top_p < 1.0:
        sorted_p, order = out.sort(dim=-1, descending=True)
        keep = (sorted_p.cumsum(-1) - sorted_p) < p.top_p
        keep[..., 0] = True  # the top token, always
        sorted_p = sorted_p * keep
        out = torch.zeros_like(out).scatter(-1, order, sorted_p)
        out = out / out.sum(-1, keepdim=True)
    return out


def draw(prob: torch.Tensor, gen: torch.Generator | None) -> torch.Tensor:
    """One sample per row of a [..., V] distribution."""
    flat = prob.reshape(-1, prob.shape[-1])
    return torch.multinomial(flat, 1, generator=gen).view(prob.shape[:-1])


def select(logits: torch.Tensor, p: SamplingParams, gen: torch.Generator | None) -> torch.Tensor:
    """argmax at T=0, otherwise a draw from the warped distribution."""
    if p.greedy:
        return logits.argmax(-1)
    return draw(probs(logits, p), gen)


def rejection_sample(
    draft: torch.Tensor, q: torch.Tensor, p: torch.Tensor, gen: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Speculative rejection sampling for a batch.

    draft [b, K] tokens drawn from q [b, K, V]; p [b, K+1, V] target distributions at the
    K draft positions plus the bonus position. Returns (accepted count [b], next token
    [b]): the token that follows the accepted prefix, drawn from the residual
    ``norm(max(p - q, 0))`` after a rejection or from ``p[K]`` when all are accepted.
    """
    b, K = draft.shape
    p_d = p[:, :K].gather(-1, draft[..., None])[..., 0]
    q_d = q.gather(-1, draft[..., None])[..., 0]
    u = torch.rand(b, K, generator=gen, device=draft.device)
    ok = (u * q_d < p_d).long()  # accept with probability min(1, p/q)
    acc = ok.cumprod(-1).sum(-1)
    rows = torch.arange(b, device=draft.device)
    p_at = p[rows, acc]
    q_pad = torch.cat([q, torch.zeros_like(q[:, :1])], dim=1)  # q = 0 at the bonus position
    residual = (p_at - q_pad[rows, acc]).clamp_min(0)
    total = residual.sum(-1, keepdim=True)
    residual = torch.where(total > 0, residual / total.clamp_min(1e-30), p_at)
    return acc, draw(residual, gen)


def accept(
    draft: torch.Tensor,
    target_logits: torch.Tensor,
    q: torch.Tensor | None,
    p: SamplingParams,
    gen: torch.Generator | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Decide, per row, how much of a verified block to commit.

    draft [b, K] the drafted tokens (K = B-1; K = 0 is autoregressive decoding); target_logits
    [b, K+1, V] the target's logits at the anchor and at each draft (position j predicts the
    token after input j); q [b, K, V] the drafter's warped distributions the drafts were drawn
    from (None at temperature 0 or when K = 0).

    Returns (acc [b], bonus [b]):

    - **accepted** ``acc[r]``: the length of the draft prefix the target agrees with, 0..K;
      the committed tokens are ``draft[r, :acc[r]]`` followed by the bonus.
    - **bonus** ``bonus[r]``: the one token the target itself contributes after that
      prefix, so every row advances by ``acc + 1``. After a rejection it is the corrected
      token (vLLM's "recovered"); when all K are accepted, the target's next token.

    Greedy (T = 0): a draft is accepted while it equals the target's argmax, and the
    bonus is the argmax at the first disagreement (SGLang's ``matches.cumprod(1).sum(1)``).
    Sampling: no drafts is one draw from the target; otherwise :func:`rejection_sample`.
    """
    if p.greedy:
        post = target_logits.argmax(-1)  # [b, K+1]
        acc = (draft == post[:, :-1]).long().cumprod(-1).sum(-1)  # [b]
        return acc, post.gather(1, acc[:, None])[:, 0]
    if draft.shape[1] == 0:
        return (
            torch.zeros(draft.shape[0], dtype=torch.long, device=draft.device),
            draw(probs(target_logits[:, 0], p), gen),
        )
    assert q is not None, "sampled drafts carry the drafter's probabilities q"
    return rejection_sample(draft, q, probs(target_logits, p), gen)


# ---- per-row sampling: each row of a batch with its own parameters ------------------------
_MASK64 = (1 << 64) - 1


def noise_key(seed: int, stream: int = 0) -> int:
    """The noise stream of a seeded row: ``seed`` (any int) and a stream number (a prompt's index
    in one ``generate`` call; 0 for a request of its own), mixed into one 63-bit key."""
    return _mix(seed & _MASK64, stream & _MASK64)


def _mix(*parts: int) -> int:
    """splitmix64's finaliser over each part: nearby inputs give unrelated 63-bit seeds."""
    h = 0x9E3779B97F4A7C15
    for x in parts:
        h = ((h ^ x) * 0xBF58476D1CE4E5B9) & _MASK64
        h = ((h ^ (h >> 27)) * 0x94D049BB133111EB) & _MASK64
        h ^= h >> 31
    return h >> 1


def gumbel(key: int, first: int, count: int, vocab: int, device) -> torch.Tensor:
    """Gumbel noise [count, V] for token indices ``first .. first + count - 1`` of stream ``key``:
    index i's noise depends on (key, i) alone, so it is the same in any batch and any round."""
    out = torch.empty(count, vocab, device=device)
    for j in range(count):
        gen = torch.Generator(device=device).manual_seed(_mix(key, first + j))
        out[j].exponential_(generator=gen)  # E ~ Exp(1); -log E ~ Gumbel(0, 1)
    return -out.log()


def _perturbed(logits: torch.Tensor, p: SamplingParams, key: int, first: int) -> torch.Tensor:
    """Scores [K, V] whose argmax is a Gumbel-max sample of the warped distribution of each of
    the K positions (indices ``first ..``)."""
    return probs(logits, p).log() + gumbel(key, first, logits.shape[0], logits.shape[-1], logits.device)


def _argmax_rows(params: Sequence[SamplingParams], keys: Sequence[int | None]) -> list[int]:
    """Rows decided by argmax: greedy ones, and seeded ones (argmax of perturbed scores)."""
    return [r for r, (p, k) in enumerate(zip(params, keys, strict=True)) if p.greedy or k is not None]


def _sampled_groups(params, keys) -> dict[SamplingParams, list[int]]:
    """Unseeded sampled rows, grouped by parameters (one warp per group)."""
    groups: dict[SamplingParams, list[int]] = {}
    for r, (p, k) in enumerate(zip(params, keys, strict=True)):
        if not p.greedy and k is None:
            groups.setdefault(p, []).append(r)
    return groups


def _scores(logits: torch.Tensor, rows: list[int], params, keys, first: list[int]) -> torch.Tensor:
    """logits [n, K, V] of the argmax rows -> their scores: logits (greedy) or perturbed (seeded)."""
    out = logits[rows]
    for i, r in enumerate(rows):
        if keys[r] is not None and not params[r].greedy:
            out[i] = _perturbed(logits[r], params[r], keys[r], first[r])
    return out


def propose(
    draft_logits: torch.Tensor, params: Sequence[SamplingParams], keys: Sequence[int | None], first: list[int]
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Each row's draft tokens [n, K] from the drafter's logits [n, K, V] (position j drafts token
    index ``first[r] + j``), and q [n, K, V]: the warped draft distributions of the unseeded
    sampled rows (None when there are none; other rows' entries unused)."""
    if all(p.greedy for p in params):
        return draft_logits.argmax(-1), None
    tokens = torch.empty(draft_logits.shape[:2], dtype=torch.long, device=draft_logits.device)
    rows = _argmax_rows(params, keys)
    if rows:
        tokens[rows] = _scores(draft_logits, rows, params, keys, first).argmax(-1)
    groups = _sampled_groups(params, keys)
    if not groups:
        return tokens, None
    q = torch.zeros_like(draft_logits, dtype=torch.float32)
    for p, rows in groups.items():
        q[rows] = probs(draft_logits[rows], p)
        tokens[rows] = draw(q[rows], None)
    return tokens, q


def accept_rows(
    draft: torch.Tensor,
    target_logits: torch.Tensor,
    q: torch.Tensor | None,
    params: Sequence[SamplingParams],
    keys: Sequence[int | None],
    first: list[int],
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`accept` with each row's own parameters: (acc [n], bonus [n]). ``first[r]``: the token
    index that target_logits[r, 0] predicts (seeded rows draw that index's noise)."""
    if all(p.greedy for p in params):
        return accept(draft, target_logits, None, SamplingParams(), None)
    n = draft.shape[0]
    acc = torch.zeros(n, dtype=torch.long, device=draft.device)
    bonus = torch.zeros(n, dtype=torch.long, device=draft.device)
    rows = _argmax_rows(params, keys)
    if rows:
        scores = _scores(target_logits, rows, params, keys, first)
        acc[rows], bonus[rows] = accept(draft[rows], scores, None, SamplingParams(), None)
    for p, rows in _sampled_groups(params, keys).items():
        acc[rows], bonus[rows] = accept(draft[rows], target_logits[rows], q[rows] if q is not None else None, p, None)
    return acc, bonus


def select_rows(
    logits: torch.Tensor, params: Sequence[SamplingParams], keys: Sequence[int | None], first: list[int]
) -> torch.Tensor:
    """One token per row from logits [n, V] that predict token index ``first[r]``: [n]."""
    none = torch.zeros(logits.shape[0], 0, dtype=torch.long, device=logits.device)
    return accept_rows(none, logits[:, None], None, params, keys, first)[1]
