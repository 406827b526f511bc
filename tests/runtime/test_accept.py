"""``sampling.accept`` on hand-made logits, and ``Stats.observe`` on hand-made rounds."""

from __future__ import annotations

import pytest
import torch

from dflash_trt.runtime.sampling import SamplingParams, accept
from dflash_trt.runtime.stats import Stats

V = 12
NEG = float("-inf")


def peaked(tokens: list[list[int]]) -> torch.Tensor:
    """Logits [b, T, V] whose argmax (and, at any temperature, only support) is tokens[r][t]."""
    out = torch.full((len(tokens), len(tokens[0]), V), NEG)
    for r, row in enumerate(tokens):
        for t, tok in enumerate(row):
            out[r, t, tok] = 0.0
    return out


def one_hot(tokens: list[list[int]]) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor(tokens), V).float()


def test_greedy_accepts_the_agreeing_prefix_then_the_targets_token():
    target = peaked([[5, 6, 7, 8], [5, 6, 7, 8], [4, 6, 7, 8]])
    draft = torch.tensor([[5, 6, 7], [5, 9, 7], [1, 6, 7]])  # all / one / none agree (then agree again)
    acc, bonus = accept(draft, target, None, SamplingParams(), None)
    assert acc.tolist() == [3, 1, 0]
    # All accepted: the target's next token; else its token where the first draft was wrong.
    assert bonus.tolist() == [8, 6, 4]


def test_autoregressive_is_one_target_token_and_nothing_accepted():
    target = peaked([[3], [10]])
    no_drafts = torch.zeros(2, 0, dtype=torch.long)
    acc, bonus = accept(no_drafts, target, None, SamplingParams(), None)
    assert acc.tolist() == [0, 0] and bonus.tolist() == [3, 10]
    gen = torch.Generator().manual_seed(0)
    acc, bonus = accept(no_drafts, target, None, SamplingParams(temperature=1.0), gen)
    assert acc.tolist() == [0, 0] and bonus.tolist() == [3, 10]  # the only token in support


def test_rejection_sampling_rejects_what_the_target_never_says():
    # The target puts all its mass on token 3 everywhere; the drafter all of its on its draft.
    target = peaked([[3, 3, 3]] * 3)
    draft = torch.tensor([[5, 5], [3, 5], [3, 3]])
    q = one_hot(draft.tolist())
    params = SamplingParams(temperature=1.0)
    for seed in range(20):
        acc, bonus = accept(draft, target, q, params, torch.Generator().manual_seed(seed))
        # p(5) = 0: rejected with certainty; p(3) = q(3) = 1: accepted with certainty.
        assert acc.tolist() == [0, 1, 2]
        # After a rejection the residual max(p - q, 0) is all on 3; all accepted: drawn from p.
        assert bonus.tolist() == [3, 3, 3]


def test_rejection_sampling_rejects_in_proportion():
    """p(d) = 1/4 where q(d) = 1: accepted a quarter of the time, and a rejection never
    returns the rejected token (the residual has no mass on it)."""
    target = torch.full((4000, 2, V), NEG)
    target[:, :, 0] = 0.0
    target[:, :, 1] = torch.log(torch.tensor(3.0))  # p = [1/4, 3/4, 0, ...]
    draft = torch.zeros(4000, 1, dtype=torch.long)
    q = one_hot(draft.tolist())
    acc, bonus = accept(draft, target, q, SamplingParams(temperature=1.0), torch.Generator().manual_seed(1))
    rate = acc.float().mean().item()
    assert 0.2 < rate < 0.3
    assert set(bonus[acc == 0].tolist()) == {1}


def test_observe_counts_rounds_tokens_and_positions():
    s = Stats(block_size=4)
    assert s.accepted_at == [0, 0, 0]
    s.observe([0, 3, 1], [1, 4, 2])
    s.observe([2], [2])  # acc 2, kept 2: cut by the length limit (bonus dropped)
    assert (s.rounds, s.committed, s.target_forwards) == (4, 9, 2)
    assert s.accepted_at == [3, 2, 1]
    assert s.acceptance_length == pytest.approx(9 / 4)
    assert s.per_position_acceptance == pytest.approx([3 / 4, 2 / 4, 1 / 4])


def test_stats_keys_are_what_bench_and_the_server_read():
    assert list(Stats(block_size=2).as_dict()) == [
        "block_size",
        "acceptance_length",
        "per_position_acceptance",
        "target_forwards",
        "rounds",
        "prompt_tokens",
        "new_tokens",
        "seconds",
        "tokens_per_second",
        "prefill_seconds",
        "draft_seconds",
        "verify_seconds",
    ]
