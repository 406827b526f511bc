"""Token selection: logit warping, sampling, and acceptance of drafts.

At temperature 0 everything is argmax. Otherwise the target's distribution is the warped
softmax (temperature, then top-k, then top-p), and :func:`rejection_sample` accepts draft
tokens so that every committed token is distributed exactly as the target's warped
distribution (Leviathan et al. 2023; Chen et al. 2023). :func:`accept` is the one entry
the loop calls, whatever the mode.
"""

from __future__ import annotations

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
        if self.temperature < 0:
            raise DFlashError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise DFlashError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise DFlashError(f"top_k must be >= 0, got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def probs(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """Warped distribution over the vocabulary (float32), same shape as logits."""
    scores = logits.float() / p.temperature
    vocab = scores.shape[-1]
    if 0 < p.top_k < vocab:
        kth = torch.topk(scores, p.top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    out = torch.softmax(scores, dim=-1)
    if p.top_p < 1.0:
        sorted_p, order = out.sort(dim=-1, descending=True)
        keep = (sorted_p.cumsum(-1) - sorted_p) < p.top_p  # always keeps the top token
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


def rejection_sample(draft: torch.Tensor, q: torch.Tensor, p: torch.Tensor,
                     gen: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
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
    ok = (u * q_d < p_d).long()          # accept with probability min(1, p/q)
    acc = ok.cumprod(-1).sum(-1)
    rows = torch.arange(b, device=draft.device)
    p_at = p[rows, acc]
    q_pad = torch.cat([q, torch.zeros_like(q[:, :1])], dim=1)  # q = 0 at the bonus position
    residual = (p_at - q_pad[rows, acc]).clamp_min(0)
    total = residual.sum(-1, keepdim=True)
    residual = torch.where(total > 0, residual / total.clamp_min(1e-30), p_at)
    return acc, draw(residual, gen)


def accept(draft: torch.Tensor, target_logits: torch.Tensor, q: torch.Tensor | None,
           p: SamplingParams, gen: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
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
        post = target_logits.argmax(-1)                                # [b, K+1]
        acc = (draft == post[:, :-1]).long().cumprod(-1).sum(-1)        # [b]
        return acc, post.gather(1, acc[:, None])[:, 0]
    if draft.shape[1] == 0:
        return (torch.zeros(draft.shape[0], dtype=torch.long, device=draft.device),
                draw(probs(target_logits[:, 0], p), gen))
    return rejection_sample(draft, q, probs(target_logits, p), gen)
