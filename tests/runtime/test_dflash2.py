"""The reference runtime with a DFlash2 drafter: lossless greedy, the selector's q is the proposal
distribution, and speculative sampling keeps the target's distribution."""

from __future__ import annotations

import pytest
import torch

from dflash_trt.runtime import SamplingParams, generate, probs
from dflash_trt.runtime.backend import TorchBackend
from tests.helpers import hf_greedy, prompts, tiny_dflash2_drafter, tiny_target, wrap
from tests.runtime.test_loop import _chi2_ok

MAX_NEW = 20
N_SAMPLES = 12000  # enough that a q off by a softmax of the unary logits alone fails (chi2 ~225 > 160)


@pytest.fixture(scope="module", params=["qwen3", pytest.param("llama", marks=pytest.mark.slow)])
def pair(request):
    model = tiny_target(request.param)
    drafter = tiny_dflash2_drafter(model, block_size=8)
    ps = prompts(6, seed=4, lo=1, hi=40)
    return model, drafter, ps, [hf_greedy(model, p, MAX_NEW) for p in ps]


@pytest.mark.parametrize("batch", [1, 3])
def test_greedy_is_lossless(pair, batch):
    model, drafter, ps, truth = pair
    target = wrap(model, drafter)
    for i in range(0, len(ps), batch):
        out = generate(target, drafter, ps[i : i + batch], max_new_tokens=MAX_NEW)
        assert out.token_ids == truth[i : i + batch]


def test_the_runtime_proposes_the_selector_walk(pair):
    """The drafted block is the selector's walk, not the per-position argmax the v1 path takes."""
    model, drafter, ps, _ = pair
    seen, argmax = [], []
    backend = TorchBackend(wrap(model, drafter), drafter)  # the lean round and its table walk
    round_, block = backend.draft_hidden_logits, backend.draft_block

    def draft_hidden_logits(*args):
        hidden, logits = round_(*args)
        argmax.append(logits.argmax(-1))
        return hidden, logits

    def draft_block(*args):
        tokens, q = block(*args)
        seen.append(tokens)
        return tokens, q

    backend.draft_hidden_logits, backend.draft_block = draft_hidden_logits, draft_block
    generate(None, None, ps[:3], max_new_tokens=MAX_NEW, backend=backend)
    assert seen and len(seen) == len(argmax) and all(t.shape == a.shape for t, a in zip(seen, argmax, strict=True))
    assert any(not torch.equal(t, a) for t, a in zip(seen, argmax, strict=True))


def test_q_is_the_distribution_the_proposal_is_drawn_from():
    """Rows with identical inputs: position 0's token follows q[0]; position 1's, given a fixed
    position-0 token, follows that rows' q[1]."""
    model = tiny_target(dtype=torch.float32)
    d = tiny_dflash2_drafter(model, selector_top_k=6)
    with torch.no_grad():
        d.candidate_selector.predecessor_codebook.mul_(4.0)  # transitions that matter
    n, K, V, H = 20000, 3, model.config.vocab_size, model.config.hidden_size
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(1, K, H, generator=g).expand(n, K, H)
    logits = (torch.randn(1, K, V, generator=g) * 2).expand(n, K, V)
    anchor = torch.full((n,), 5)
    tokens, q = d.propose(hidden, logits, anchor, temperature=0.9, gen=torch.Generator().manual_seed(1))
    ok, msg = _chi2_ok(torch.bincount(tokens[:, 0], minlength=V).double(), q[0, 0].double(), n)
    assert ok, msg
    first = torch.mode(tokens[:, 0]).values
    rows = tokens[:, 0] == first
    assert torch.allclose(q[rows, 1], q[rows][0, 1])  # q[1] depends on the path so far only
    ok, msg = _chi2_ok(torch.bincount(tokens[rows, 1], minlength=V).double(), q[rows][0, 1].double(), int(rows.sum()))
    assert ok, msg
    assert not torch.allclose(q[tokens[:, 0] != first][0, 1], q[rows][0, 1])  # ... and on it


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0),
        pytest.param(SamplingParams(temperature=0.8, top_k=10, top_p=0.9), marks=pytest.mark.slow),
    ],
)
def test_speculative_sampling_keeps_the_target_distribution(params):
    """The first three tokens (two come out of a DFlash2 draft/verify round) follow the target's
    exact marginals. Unseeded rows: their drafts come from the selector's walk at the row's
    temperature and rejection sampling uses its q (seeded rows are decided by the target's own
    noise-perturbed argmax, which needs no q)."""
    torch.manual_seed(31)
    model = tiny_target("qwen3", dtype=torch.float32)
    with torch.no_grad():
        model.lm_head.weight.mul_(0.3)  # flatter distributions: more tokens in play
    drafter = tiny_dflash2_drafter(model, block_size=4, selector_top_k=32)
    with torch.no_grad():  # strong transitions: q is far from a softmax of the unary logits alone
        drafter.candidate_selector.predecessor_codebook.mul_(6.0)
    prompt = prompts(1, seed=9, lo=6, hi=6)[0]
    n = N_SAMPLES
    out = generate(wrap(model, drafter), drafter, [prompt] * n, max_new_tokens=3, sampling=params)
    toks = torch.tensor(out.token_ids)
    with torch.no_grad():
        p1 = probs(model(torch.tensor([prompt])).logits[0, -1], params).double()
        V = p1.shape[0]
        p2_given = probs(model(torch.tensor([prompt + [t] for t in range(V)])).logits[:, -1], params).double()
        p12 = p1[:, None] * p2_given  # [V, V]
        pairs = torch.tensor([prompt + [a, b] for a in range(V) for b in range(V)])
        p3_given = torch.cat([probs(model(c).logits[:, -1], params).double() for c in pairs.split(2048)])
    p2 = p12.sum(0)
    p3 = (p12.reshape(-1, 1) * p3_given).sum(0)
    for col, expected in ((0, p1), (1, p2), (2, p3)):
        ok, msg = _chi2_ok(torch.bincount(toks[:, col], minlength=V).double(), expected, n)
        assert ok, f"token {col + 1}: {msg}"
    assert out.stats.accepted_at[0] > 0.05 * out.stats.rounds  # drafts were accepted, not only resampled


def test_walk_groups_splits_unseeded_rows_by_temperature():
    """Argmax rows (greedy, seeded) walk together at 0; unseeded sampled rows at different settings
    (once refused in one batch) walk one group per temperature, top-k / top-p not splitting them."""
    from dflash_trt.runtime.proposer import walk_groups

    hot, warm = SamplingParams(temperature=0.9), SamplingParams(temperature=0.5, top_k=5)
    params = [hot, SamplingParams(), warm, SamplingParams(temperature=0.9, top_p=0.8), hot, warm]
    keys = [None, None, None, None, 7, None]  # row 4 is seeded: decided by argmax
    assert walk_groups(params, keys) == [([1, 4], 0.0), ([0, 3], 0.9), ([2, 5], 0.5)]
    assert walk_groups([hot, hot], [None, None]) == [([0, 1], 0.9)]
    assert walk_groups([SamplingParams()], [None]) == [([0], 0.0)]
