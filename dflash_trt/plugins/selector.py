"""DFlash2's candidate selector: the walk over each block position's top-k candidates (reference).

Instead of an independent argmax per block position, DFlash2 (z-lab's ``dflash`` package,
``dflash/model.py``, ``CandidateSelector.select``; vLLM PR #52816; SGLang PR #35371) keeps the
top-k draft logits of every position and walks the block left to right from the verified anchor,
scoring each candidate ``c`` against the token ``p`` chosen one position before::

    score_t(p -> c) = unary_t[c] + < A[p] * h_t , B[c] >          (sum over the selector rank r)

``unary_t`` are the position's draft logits (after ``output_multiplier`` / softcapping), ``A``
and ``B`` the predecessor and successor codebooks [V, r], ``h_t`` the position's hidden state
through the selector's ``hidden_projection`` [r]. Greedy (temperature 0) takes the argmax; at
temperature T the walk draws from ``q_t = softmax(score_t / T)`` over the k candidates by
inverse CDF of a uniform ``u_t`` (vLLM's walk), and ``q_t`` is the proposal distribution the
verifier's rejection sampling must use. The walk is sequential in t (each step reads the last
choice), over k candidates only, so every step's choice can be taken for every candidate it could
follow at once (:func:`edge_scores`): the exported walk (:func:`walk_graph`) and the lean runtime's
greedy one (:func:`walk_greedy`) are a batch of standard ops and then K lookups; no custom op.
"""

from __future__ import annotations

import torch


def selector_walk(
    unary: torch.Tensor,
    candidates: torch.Tensor,
    hidden: torch.Tensor,
    predecessor: torch.Tensor,
    successor: torch.Tensor,
    anchor: torch.Tensor,
    temperature: float = 0.0,
    uniforms: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The selector's walk.

    unary [b, K, k] float32 and candidates [b, K, k] (the top-k of each of K positions);
    hidden [b, K, r] the projected hidden states; predecessor, successor [V, r] the codebooks;
    anchor [b] the token before position 0. With temperature > 0, uniforms [b, K] in [0, 1).
    Returns (tokens [b, K], q [b, K, k] float32 or None at temperature 0).
    """
    b, K, _ = unary.shape
    prev = anchor
    tokens, qs = [], []
    for t in range(K):
        context = predecessor[prev].float() * hidden[:, t].float()  # [b, r]
        scores = unary[:, t] + torch.einsum("br,bkr->bk", context, successor[candidates[:, t]].float())
        if temperature > 0:
            q = torch.softmax(scores / temperature, dim=-1)  # [b, k]
            below = (q.cumsum(-1) <= uniforms[:, t, None]).sum(-1)  # inverse CDF
            index = below.clamp_max(q.shape[-1] - 1)
            qs.append(q)
        else:
            index = scores.argmax(-1)
        prev = candidates[:, t].gather(1, index[:, None])[:, 0]
        tokens.append(prev)
    return torch.stack(tokens, 1), (torch.stack(qs, 1) if qs else None)


def selector_walk_graph(
    unary: torch.Tensor,
    candidates: torch.Tensor,
    hidden: torch.Tensor,
    predecessor: torch.Tensor,
    successor: torch.Tensor,
    anchor: torch.Tensor,
    temperature: torch.Tensor,
    uniforms: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`walk` with the temperature a tensor [1] (0: greedy) and no Python branch on it, so
    one exported graph serves both modes. Returns tokens [b, K] and q [b, K, k] (at temperature
    0 the softmax at temperature 1, which a greedy verifier ignores); equal to :func:`walk`'s.

    Every step's choice is taken for every candidate it could stand on at once (:func:`edge_scores`,
    the softmax, the inverse CDF against that step's uniform, the argmax: a handful of batched
    nodes), so the walk itself is K pairs of gathers that follow the chosen index: a graph of
    a few dozen nodes, not K unrolled rounds of gathers, products, softmax and CDF."""
    K, k = unary.shape[1], unary.shape[2]
    sampling = temperature > 0
    scale = torch.where(sampling, temperature, torch.ones_like(temperature))
    scores = edge_scores(unary, candidates, hidden, predecessor, successor, anchor)  # [b, K, k_prev, k]
    q_all = torch.softmax(scores / scale, dim=-1)
    drawn = (q_all.cumsum(-1) <= uniforms[:, :, None, None]).sum(-1).clamp_max(k - 1)  # [b, K, k_prev]
    choice = torch.where(sampling, drawn, scores.argmax(-1))  # [b, K, k_prev]
    row = torch.zeros_like(anchor)[:, None]  # [b, 1]: at t = 0 every predecessor row is the anchor
    picks, qs = [], []
    for t in range(K):
        qs.append(q_all[:, t].gather(1, row[:, :, None].expand(-1, 1, k)))  # [b, 1, k]
        row = choice[:, t].gather(1, row)  # [b, 1]
        picks.append(row)
    index = torch.cat(picks, dim=1)  # [b, K]
    return candidates.gather(2, index[:, :, None])[:, :, 0], torch.cat(qs, dim=1)


def selector_walk_greedy(
    unary: torch.Tensor,
    candidates: torch.Tensor,
    hidden: torch.Tensor,
    predecessor: torch.Tensor,
    successor: torch.Tensor,
    anchor: torch.Tensor,
) -> torch.Tensor:
    """:func:`walk`'s tokens at temperature 0 [b, K], from every transition's score at once.

    The walk is sequential only in which candidate it stands on: the best successor of every
    candidate (:func:`edge_scores`' argmax, [b, K, k], one batch of tensor calls) is known
    before it starts, so the walk itself is K lookups in a [b, K, k] table of small integers,
    not K rounds of gathers and products (on a CPU, most of a small drafter's proposal). The
    scores are the same sums over the rank as :func:`walk`'s, taken by one batched product."""
    best = edge_scores(unary, candidates, hidden, predecessor, successor, anchor).argmax(-1).tolist()
    path = []
    for row in best:  # row [K][k]: at t = 0 every predecessor row is the anchor
        i = row[0][0]
        steps = [i]
        for t in range(1, len(row)):
            i = row[t][i]
            steps.append(i)
        path.append(steps)
    index = torch.tensor(path, dtype=torch.long, device=candidates.device)  # [b, K]
    return candidates.gather(2, index[..., None])[..., 0]


def edge_scores(
    unary: torch.Tensor,
    candidates: torch.Tensor,
    hidden: torch.Tensor,
    predecessor: torch.Tensor,
    successor: torch.Tensor,
    anchor: torch.Tensor,
) -> torch.Tensor:
    """Every transition's score at once, [b, K, k_prev, k] (a dense rewrite of the formula;
    :func:`walk_greedy`, and tests).

    Row ``p`` of position t scores the candidates of t after candidate p of t - 1; at t = 0 every
    row holds the anchor as the predecessor.
    """
    b, K, k = unary.shape
    prev = torch.cat([anchor[:, None, None].expand(b, 1, k), candidates[:, :-1]], dim=1)  # [b, K, k]
    A = predecessor[prev].float() * hidden[:, :, None].float()  # [b, K, k, r]
    Bc = successor[candidates].float()  # [b, K, k, r]
    return unary[:, :, None, :] + A @ Bc.transpose(-1, -2)  # sum over r
