"""The reference runtime is lossless, batches correctly, and samples from the target's distribution."""

from __future__ import annotations

import math

import pytest
import torch

from dflash_trt.runtime.loop import generate
from dflash_trt.runtime.sampling import SamplingParams, probs, rejection_sample
from tests.helpers import OracleDrafter, hf_greedy, prompts, tiny_drafter, tiny_drafter_config, tiny_target, wrap

MAX_NEW = 24


@pytest.fixture(scope="module", params=["qwen3", "llama"])
def pair(request):
    model = tiny_target(request.param)
    drafter = tiny_drafter(model, block_size=8)
    ps = prompts(20, seed=3, lo=1, hi=48)
    truth = [hf_greedy(model, p, MAX_NEW) for p in ps]
    return model, drafter, ps, truth


@pytest.mark.parametrize("block_size", [4, 8])
@pytest.mark.parametrize("batch", [1, 3])
def test_greedy_is_lossless_against_transformers_generate(pair, block_size, batch):
    model, drafter, ps, truth = pair
    target = wrap(model, drafter)
    for i in range(0, len(ps), batch):
        out = generate(target, drafter, ps[i : i + batch], max_new_tokens=MAX_NEW, block_size=block_size)
        assert out.token_ids == truth[i : i + batch]
        assert out.finish_reasons == ["length"] * len(out.token_ids)


def test_autoregressive_baseline_is_the_same_code_path(pair):
    model, drafter, ps, truth = pair
    out = generate(wrap(model), None, ps[:5], max_new_tokens=MAX_NEW, block_size=1)
    assert out.token_ids == truth[:5]
    assert out.stats.acceptance_length == 1.0
    assert out.stats.target_forwards == MAX_NEW  # prefill + one forward per further token


def test_batch_matches_batch_one_with_mixed_lengths(pair):
    model, drafter, ps, _ = pair
    target = wrap(model, drafter)
    together = generate(target, drafter, ps[:7], max_new_tokens=MAX_NEW, block_size=8).token_ids
    alone = [generate(target, drafter, [p], max_new_tokens=MAX_NEW, block_size=8).token_ids[0] for p in ps[:7]]
    assert together == alone


def _oracle(model, ps, block_size, extra=16, wrong=lambda rnd, row: None):
    truth = [p + hf_greedy(model, p, MAX_NEW + extra) for p in ps]
    cfg = tiny_drafter_config(model, block_size=block_size)
    return OracleDrafter(cfg, truth, wrong).to(model.dtype), truth


def test_oracle_drafter_accepts_full_blocks_and_tau_is_exact():
    model = tiny_target("qwen3")
    ps = prompts(4, seed=5)
    B = 8
    drafter, truth = _oracle(model, ps, B)
    out = generate(wrap(model, drafter), drafter, ps, max_new_tokens=MAX_NEW, block_size=B)
    assert out.token_ids == [t[len(p) : len(p) + MAX_NEW] for p, t in zip(ps, truth, strict=True)]
    # 1 token from prefill, then rounds of B tokens; the last round is cut to what is left.
    rounds = math.ceil((MAX_NEW - 1) / B)
    assert out.stats.rounds == rounds * len(ps)
    assert out.stats.acceptance_length == pytest.approx((MAX_NEW - 1) / rounds)
    assert out.stats.per_position_acceptance == [1.0] * (B - 1)
    assert out.stats.target_forwards == 1 + rounds


def test_oracle_partial_acceptance_counts_exactly():
    model = tiny_target("llama")
    ps = prompts(3, seed=6)
    B = 6
    # Round j corrupts draft position (j % (B-1)) + 1 in every row: acc = that position - 1.
    drafter, truth = _oracle(model, ps, B, wrong=lambda rnd, row: rnd % (B - 1) + 1)
    out = generate(wrap(model, drafter), drafter, ps, max_new_tokens=MAX_NEW, block_size=B)
    assert out.token_ids == [t[len(p) : len(p) + MAX_NEW] for p, t in zip(ps, truth, strict=True)]
    # Independent count: each round commits k tokens (k-1 accepted + bonus), until full.
    remaining, rounds, accepted_at = MAX_NEW - 1, 0, [0] * (B - 1)
    committed = 0
    while remaining > 0:
        k = rounds % (B - 1) + 1
        for pos in range(1, k):
            accepted_at[pos - 1] += 1
        take = min(k, remaining)
        committed += take
        remaining -= take
        rounds += 1
    assert out.stats.rounds == rounds * len(ps)
    assert out.stats.acceptance_length == pytest.approx(committed / rounds)
    assert out.stats.per_position_acceptance == pytest.approx([a / rounds for a in accepted_at])


def test_stop_token_inside_an_accepted_run():
    model = tiny_target("qwen3")
    ps = prompts(3, seed=7)
    B = 8
    drafter, truth = _oracle(model, ps, B)
    # Pick a token the greedy continuation of row 0 first emits at index >= 3, so it falls
    # inside a fully accepted block rather than on a block boundary.
    cont = truth[0][len(ps[0]) :]
    j = next(j for j in range(3, MAX_NEW) if cont[j] not in cont[:j] and j % B != 0)
    stop = cont[j]
    out = generate(wrap(model, drafter), drafter, ps, max_new_tokens=MAX_NEW, block_size=B, stop_token_ids=[stop])
    assert out.token_ids[0] == cont[: j + 1]
    assert out.finish_reasons[0] == "stop"
    for r in (1, 2):
        c = truth[r][len(ps[r]) :][:MAX_NEW]
        want = c[: c.index(stop) + 1] if stop in c else c
        assert out.token_ids[r] == want


def test_invalid_arguments_are_user_errors():
    from dflash_trt.errors import DFlashError

    model = tiny_target("qwen3")
    d = tiny_drafter(model, block_size=4)
    t = wrap(model, d)
    with pytest.raises(DFlashError):
        generate(t, d, [[1, 2]], block_size=8)
    with pytest.raises(DFlashError):
        generate(t, d, [[]])
    with pytest.raises(DFlashError):
        generate(t, None, [[1, 2]], block_size=4)
    with pytest.raises(DFlashError):
        SamplingParams(top_p=0)


# ---------------------------------------------------------------------------------------
# Sampling keeps the target's distribution
# ---------------------------------------------------------------------------------------


def _chi2_ok(counts: torch.Tensor, expected_p: torch.Tensor, n: int, z: float = 4.0) -> tuple[bool, str]:
    """Pearson chi-square with cells of expected count < 5 pooled; accept unless the
    statistic exceeds the Wilson-Hilferty quantile at ``z`` standard normal deviations
    (z = 4: a false alarm about once in 30,000 runs)."""
    exp = expected_p * n
    big = exp >= 5
    obs = torch.cat([counts[big], counts[~big].sum()[None]])
    ex = torch.cat([exp[big], exp[~big].sum()[None]])
    keep = ex > 0
    obs, ex = obs[keep], ex[keep]
    # Observed mass where the target has none is an outright failure.
    if counts[expected_p == 0].sum() > 0:
        return False, "sampled a token the target gives probability 0"
    stat = float(((obs - ex) ** 2 / ex).sum())
    k = len(ex) - 1
    limit = k * (1 - 2 / (9 * k) + z * math.sqrt(2 / (9 * k))) ** 3
    return stat <= limit, f"chi2={stat:.1f} limit={limit:.1f} dof={k}"


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0, seed=11),
        SamplingParams(temperature=0.7, top_k=12, seed=12),
        SamplingParams(temperature=1.3, top_p=0.8, seed=13),
    ],
)
def test_rejection_sampling_reproduces_target_distribution(params):
    torch.manual_seed(0)
    V, K, n = 40, 3, 60_000
    p_logits = torch.randn(V, dtype=torch.float64) * 2
    q_logits = torch.randn(V, dtype=torch.float64) * 2
    p = probs(p_logits, params).expand(n, K + 1, V)
    q = probs(q_logits, params).expand(n, K, V)
    gen = torch.Generator().manual_seed(params.seed)
    draft = torch.multinomial(q[:, 0], 1, generator=gen).expand(n, K).contiguous()
    acc, nxt = rejection_sample(draft, q, p, gen)
    first = torch.where(acc > 0, draft[:, 0], nxt)
    counts = torch.bincount(first, minlength=V).double()
    ok, msg = _chi2_ok(counts, p[0, 0], n)
    assert ok, msg


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0, seed=21),
        SamplingParams(temperature=0.8, top_k=10, top_p=0.9, seed=22),
    ],
)
def test_speculative_sampling_end_to_end_matches_target(params):
    """The first two generated tokens (the second comes out of a draft/verify round) are
    distributed as the target's: compare with the exact marginals."""
    model = tiny_target("qwen3", dtype=torch.float32)
    with torch.no_grad():
        model.lm_head.weight.mul_(0.3)  # flatter distributions: more tokens in play
    drafter = tiny_drafter(model, block_size=4)
    prompt = prompts(1, seed=9, lo=6, hi=6)[0]
    n = 4000
    out = generate(wrap(model, drafter), drafter, [prompt] * n, max_new_tokens=2, sampling=params)
    toks = torch.tensor(out.token_ids)
    with torch.no_grad():
        p1 = probs(model(torch.tensor([prompt])).logits[0, -1], params).double()
        V = p1.shape[0]
        both = torch.tensor([prompt + [t] for t in range(V)])
        p2_given = probs(model(both).logits[:, -1], params).double()
    p2 = (p1[:, None] * p2_given).sum(0)
    for col, expected in ((0, p1), (1, p2)):
        counts = torch.bincount(toks[:, col], minlength=V).double()
        ok, msg = _chi2_ok(counts, expected, n)
        assert ok, f"token {col + 1}: {msg}"
    assert out.stats.rounds == n  # every sequence went through exactly one round
