"""A rejected draft leaves no trace a later query could pick: the sparse indexer's key cache
and DeepSeek V4's compressor state, against a fresh prefill of the committed tokens."""

from __future__ import annotations

import pytest
import torch

from dflash_trt.runtime.backend import TorchBackend
from dflash_trt.runtime.loop import Request, commit, prefill, verify
from tests.helpers import prompts, wrap
from tests.second_wave import TOPK, second_wave_target


def _partial_commit(model, acc: list[int]):
    """Two rows prefilled together, one verify of a random 5-token block, row r keeping acc[r]
    drafts; returns (backend, batch, the committed tokens per row)."""
    backend = TorchBackend(wrap(model), None)
    ps = prompts(2, seed=11, lo=7, hi=12)
    batch = prefill(backend, [Request(p, 32) for p in ps], draft=False)
    g = torch.Generator().manual_seed(5)
    block = torch.cat([batch.last[:, None], torch.randint(3, 90, (2, 4), generator=g)], dim=1)  # [2, 5]
    logits, _ = verify(backend, batch, block)
    acc_t = torch.tensor(acc)
    bonus = logits[torch.arange(2), acc_t].argmax(-1)
    commit(backend, batch, block, acc_t, bonus, None)
    committed = [p + block[r, : a + 1].tolist() for r, (p, a) in enumerate(zip(ps, acc, strict=True))]
    return backend, batch, committed


def _indexers(model):
    return [m for name, m in model.named_modules() if name.endswith("self_attn.indexer") and m is not None]


def _record(modules):
    """Forward hooks that collect each indexer's top-k column indices [b, T, k], in layer order."""
    seen: list[torch.Tensor] = []
    hooks = [m.register_forward_hook(lambda _m, _a, out: seen.append(out.long())) for m in modules]
    return seen, hooks


@pytest.mark.parametrize("family", ["deepseek_v32", pytest.param("glm_moe_dsa", marks=pytest.mark.slow)])
def test_a_rejected_draft_key_is_never_chosen(family):
    """Row 0 rejects all 4 drafts, row 1 keeps 2. At the next verify each row's indexer cache is
    its committed keys, packed, then zeros (what a fresh prefill of the committed tokens caches),
    and every query's top-k picks the positions the fresh forward picks, never a hole."""
    model = second_wave_target(family)
    backend, batch, committed = _partial_commit(model, [0, 2])
    block2 = torch.tensor([[batch.last[0], 40, 41], [batch.last[1], 42, 43]])
    seen, hooks = _record(_indexers(model))
    logits, _ = verify(backend, batch, block2)
    for h in hooks:
        h.remove()
    n = [len(c) for c in committed]
    W = batch.col_valid.shape[1]
    assert W == max(n) and batch.col_valid.sum(1).tolist() == n  # packed: no rejected column left
    layer = next(i for i, lay in enumerate(batch.target_cache.layers) if getattr(lay, "indexer_keys", None) is not None)
    for r in range(2):
        ids = torch.tensor([committed[r] + block2[r].tolist()])
        fresh_seen, fresh_hooks = _record(_indexers(model))
        with torch.no_grad():
            out = model(ids, use_cache=True)
        for h in fresh_hooks:
            h.remove()
        fresh_keys = out.cache.layers[layer].indexer_keys[0, : n[r]]
        keys = batch.target_cache.layers[layer].indexer_keys[r]  # [W + 3, c]
        assert torch.allclose(keys[: n[r]], fresh_keys, atol=1e-10)
        assert not keys[n[r] : W].any(), "a rejected draft's indexer key is still cached"
        torch.testing.assert_close(logits[r], out.logits[0, -3:], atol=1e-5, rtol=0)  # eager softmax: float32
        for got, want in zip(seen, fresh_seen, strict=True):
            for t in range(3):
                cols = got[r, t].tolist()
                assert all(c < n[r] or c >= W for c in cols), f"row {r} query {t} chose a hole: {cols}"
                pos = sorted(c if c < n[r] else n[r] + c - W for c in cols)
                assert pos == sorted(want[0, n[r] + t].tolist())
                assert len(pos) == TOPK


def test_a_rejected_token_never_enters_a_v4_compressor():
    """DeepSeek V4: after a partial accept each row's cache (sliding window, compressor buffers,
    compressed entries, the indexer's compressed keys, overlap halves, entry counts) is exactly
    what a fresh prefill of its committed tokens builds (to float32 rounding: V4 applies RoPE and
    its attention softmax in float32; a rejected token mixed in would be off by O(1))."""
    from transformers import DynamicCache

    model = second_wave_target("deepseek_v4")
    _, batch, committed = _partial_commit(model, [1, 3])
    for r, toks in enumerate(committed):
        fresh = DynamicCache(config=model.config)
        with torch.no_grad():
            model(torch.tensor([toks]), use_cache=True, cache=fresh)
        mine = batch.target_cache.rows[r]
        for a, b in zip(mine.layers, fresh.layers, strict=True):
            assert a.cumulative_length == b.cumulative_length
            torch.testing.assert_close(a.keys, b.keys, atol=1e-5, rtol=0)
            for state in ("buffer_kv", "buffer_gate", "compressed_kv", "overlap_kv", "overlap_gate"):
                for name, t in getattr(b, state, {}).items():
                    u = getattr(a, state)[name]
                    assert (t is None) == (u is None) or (t.numel() == 0 and u.numel() == 0), (state, name)
                    if t is not None and u is not None:
                        torch.testing.assert_close(u, t, atol=1e-5, rtol=0)
            assert getattr(a, "entry_count", None) == getattr(b, "entry_count", None)


def test_a_rejected_draft_never_enters_a_glm5_pool():
    """glm5_next pools ``index_kpool`` consecutive columns from a row's first valid one and keeps
    each column's padding flag beside its key. Rows of 9 and 13 prompt tokens, a 5-token verify,
    row 0 keeping 1 draft and row 1 none: at the next verify each row's indexer cache is zeros
    (left padding) then exactly what a fresh forward of its committed tokens caches, so its pools
    are the fresh ones; every query picks the fresh forward's positions and never a hole, and the
    logits are the fresh forward's (to float32 rounding: the KDA kernels run in float32; a wrong
    pool is off by O(1)). With the committed columns packed to the front instead, the short row's
    pools straddle the holes before the block, and this fails."""
    from tests.families import GLM5_NEXT, family_target

    model = family_target(GLM5_NEXT)
    backend = TorchBackend(wrap(model), None)
    ps = prompts(2, seed=11, lo=9, hi=14)
    ps = [ps[0][:9], ps[1][:13]]
    batch = prefill(backend, [Request(p, 32) for p in ps], draft=False)
    g = torch.Generator().manual_seed(5)
    block = torch.cat([batch.last[:, None], torch.randint(3, 90, (2, 4), generator=g)], dim=1)  # [2, 5]
    logits, _ = verify(backend, batch, block)
    acc = torch.tensor([1, 0])
    commit(backend, batch, block, acc, logits[torch.arange(2), acc].argmax(-1), None)
    committed = [p + block[r, : a + 1].tolist() for r, (p, a) in enumerate(zip(ps, acc.tolist(), strict=True))]
    n = [len(c) for c in committed]
    assert n[0] != n[1] and max(n) % 2 != min(n) % 2  # the short row's pools would straddle holes
    block2 = torch.tensor([[batch.last[0], 40, 41], [batch.last[1], 42, 43]])
    seen, hooks = _record(_indexers(model))
    logits, _ = verify(backend, batch, block2)
    for h in hooks:
        h.remove()
    W = batch.col_valid.shape[1]
    layer = next(i for i, lay in enumerate(batch.target_cache.layers) if getattr(lay, "indexer_keys", None) is not None)
    for r in range(2):
        fresh_seen, fresh_hooks = _record(_indexers(model))
        with torch.no_grad():
            out = model(torch.tensor([committed[r] + block2[r].tolist()]), use_cache=True)
        for h in fresh_hooks:
            h.remove()
        valid = torch.cat([batch.col_valid[r], torch.ones(3, dtype=torch.bool)])  # [W + 3]
        pos = torch.where(valid, valid.long().cumsum(0) - 1, -1).tolist()  # column -> token position
        for got, want in zip(seen, fresh_seen, strict=True):
            for t in range(3):
                cols = [c for c in got[r, t].tolist() if c >= 0]
                assert all(pos[c] >= 0 for c in cols), f"row {r} query {t} chose a hole: {cols}"
                assert sorted(pos[c] for c in cols) == sorted(c for c in want[0, n[r] + t].tolist() if c >= 0)
        torch.testing.assert_close(logits[r], out.logits[0, -3:], atol=1e-5, rtol=0)
        assert W == max(n) and batch.col_valid.sum(1).tolist() == n  # no rejected column left
        pad = W - n[r]  # left padding of row r
        keys = batch.target_cache.layers[layer].indexer_keys[r]  # [W + 3, 2 d + 1]
        assert not keys[:pad].any(), "a rejected or padding column is still in the indexer cache"
        torch.testing.assert_close(keys[pad:], out.cache.layers[layer].indexer_keys[0], atol=1e-5, rtol=0)
