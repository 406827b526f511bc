"""DFlash2's two additions against dense rewrites of their formulas: the grouped dynamic causal
convolution and the candidate selector's walk."""

from __future__ import annotations

import pytest
import torch

from dflash_trt.plugins import dynamic_conv, selector


def _conv_case(b=2, L=8, H=12, K=2, group=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(b, L, H, generator=g, dtype=torch.float64),
        torch.randn(b, L, K, H // group, generator=g, dtype=torch.float64),
        torch.randn(K, H, generator=g, dtype=torch.float64),
        group,
    )


@pytest.mark.parametrize("K", [1, 2, 3])
def test_conv_matches_its_dense_rewrite(K):
    x, dyn, base, group = _conv_case(K=K)
    torch.testing.assert_close(
        dynamic_conv.grouped_dynamic_conv(x, dyn, base, group),
        dynamic_conv.grouped_dynamic_conv_dense(x, dyn, base, group),
    )


def test_conv_is_causal_and_the_anchor_sees_only_itself():
    x, dyn, base, group = _conv_case(K=2, seed=1)
    out = dynamic_conv.grouped_dynamic_conv(x, dyn, base, group)
    coeff = base[0] + dyn[:, 0, 0].repeat_interleave(group, -1)
    torch.testing.assert_close(out[:, 0], coeff * x[:, 0])
    later = x.clone()
    later[:, 5:] += 3.0
    torch.testing.assert_close(dynamic_conv.grouped_dynamic_conv(later, dyn, base, group)[:, :5], out[:, :5])


def test_conv_never_crosses_a_block_boundary():
    B = 4
    x, dyn, base, group = _conv_case(L=3 * B, K=3, seed=2)
    together = dynamic_conv.grouped_dynamic_conv(x, dyn, base, group, block_len=B)
    apart = torch.cat(
        [
            dynamic_conv.grouped_dynamic_conv(x[:, k * B : (k + 1) * B], dyn[:, k * B : (k + 1) * B], base, group)
            for k in range(3)
        ],
        dim=1,
    )
    torch.testing.assert_close(together, apart)
    assert not torch.allclose(together, dynamic_conv.grouped_dynamic_conv(x, dyn, base, group))


def _selector_case(b=3, K=5, k=4, V=50, r=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, K, V, generator=g) * 2
    unary, cand = torch.topk(logits, k, dim=-1)
    return dict(
        unary=unary,
        candidates=cand,
        hidden=torch.randn(b, K, r, generator=g),
        predecessor=torch.randn(V, r, generator=g),
        successor=torch.randn(V, r, generator=g),
        anchor=torch.randint(V, (b,), generator=g),
    )


def test_edge_scores_are_the_formula_entry_by_entry():
    c = _selector_case()
    e = selector.edge_scores(**c)
    b, K, k = c["unary"].shape
    for i in range(b):
        for t in range(K):
            for p in range(k):
                prev = int(c["anchor"][i]) if t == 0 else int(c["candidates"][i, t - 1, p])
                for j in range(k):
                    cand = int(c["candidates"][i, t, j])
                    want = c["unary"][i, t, j] + sum(
                        float(c["predecessor"][prev, r] * c["hidden"][i, t, r] * c["successor"][cand, r])
                        for r in range(c["hidden"].shape[-1])
                    )
                    assert abs(float(e[i, t, p, j]) - float(want)) < 1e-4


def _walk_dense(c, temperature=0.0, uniforms=None):
    """The walk read off the dense score table: row = the previous step's choice."""
    e = selector.edge_scores(**c)
    b, K, k = c["unary"].shape
    tokens = torch.zeros(b, K, dtype=torch.long)
    for i in range(b):
        row = 0  # at t = 0 every row holds the anchor
        for t in range(K):
            s = e[i, t, row]
            if temperature > 0:
                cdf = torch.softmax(s / temperature, -1).cumsum(-1)
                row = min(int((cdf <= uniforms[i, t]).sum()), k - 1)
            else:
                row = int(s.argmax())
            tokens[i, t] = c["candidates"][i, t, row]
    return tokens


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_greedy_walk_follows_the_dense_score_table(seed):
    c = _selector_case(seed=seed)
    tokens, q = selector.selector_walk(**c)
    assert q is None and torch.equal(tokens, _walk_dense(c))


@pytest.mark.parametrize("seed,strength", [(0, 1.0), (1, 1.0), (3, 3.0)])
def test_the_table_walk_is_the_greedy_walk(seed, strength):
    """``walk_greedy`` (the lean runtime's: every best successor first, then lookups) takes the
    walk's path, where the transitions decide it too (strength 3: the path leaves the argmax)."""
    c = _selector_case(seed=seed, r=6)
    c["predecessor"], c["successor"] = c["predecessor"] * strength, c["successor"] * strength
    tokens, _ = selector.selector_walk(**c)
    assert torch.equal(selector.selector_walk_greedy(**c), tokens)
    if strength > 1:
        assert not torch.equal(tokens, c["candidates"][..., 0])


def test_greedy_walk_is_not_an_argmax_per_position():
    # Strong transitions: the pairwise term decides, so the path leaves the per-position argmax.
    c = _selector_case(seed=3, r=6)
    c["predecessor"], c["successor"] = c["predecessor"] * 3, c["successor"] * 3
    tokens, _ = selector.selector_walk(**c)
    assert not torch.equal(tokens, c["candidates"][..., 0])


def test_sampled_walk_is_the_inverse_cdf_of_q():
    c = _selector_case(seed=4)
    u = torch.rand(3, 5, generator=torch.Generator().manual_seed(5))
    tokens, q = selector.selector_walk(**c, temperature=0.7, uniforms=u)
    assert torch.equal(tokens, _walk_dense(c, 0.7, u))
    torch.testing.assert_close(q.sum(-1), torch.ones(3, 5))


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_the_exported_walk_is_the_walk(temperature):
    c = _selector_case(seed=6)
    u = torch.rand(3, 5, generator=torch.Generator().manual_seed(7))
    tokens, q = selector.selector_walk(**c, temperature=temperature, uniforms=u)
    g_tokens, g_q = selector.selector_walk_graph(**c, temperature=torch.tensor([temperature]), uniforms=u)
    assert torch.equal(tokens, g_tokens)
    if q is not None:
        torch.testing.assert_close(q, g_q)
