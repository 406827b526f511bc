"""The lean drafter round (``runtime/lean_drafter.py``) against the reference ops it stands in for."""

from __future__ import annotations

import pytest
import torch

from dflash_trt.runtime import generate
from dflash_trt.runtime.backend import TorchBackend
from dflash_trt.runtime.lean_drafter import LeanDrafter, lean_drafter
from tests.helpers import (
    OracleDrafter,
    prompts,
    tiny_dflash2_drafter,
    tiny_drafter,
    tiny_drafter_config,
    tiny_target,
    wrap,
)

SLIDING = dict(layer_types=["sliding_attention", "full_attention"], sliding_window=5)


@pytest.mark.parametrize(
    "kind,extra",
    [("dflash", {}), ("dflash2", {}), ("dflash", SLIDING)],
    ids=["dflash", "dflash2", "dflash-sliding-causal"],
)
def test_the_lean_round_is_the_reference_round(kind, extra):
    """Three rounds over one batch of rows with different context lengths (a row taking none in
    the second): the same cache contents, hidden states and logits as ``inject`` + ``draft``
    (to float32 rounding: both take RMSNorm's statistics in float32, over differently laid out
    tensors)."""
    model = tiny_target()
    d = (tiny_drafter if kind == "dflash" else tiny_dflash2_drafter)(model, **extra)
    target = wrap(model, d)
    lean = lean_drafter(d, None, target.head)
    assert isinstance(lean, LeanDrafter)
    g = torch.Generator().manual_seed(0)
    ref_cache, lean_cache = d.new_cache(3), d.new_cache(3)
    for n_new in ([9, 4, 6], [2, 0, 5], [3, 3, 1]):
        n = torch.tensor(n_new)
        hidden = torch.randn(3, max(n_new), d.fc.in_features, generator=g, dtype=d.dtype)
        block = torch.randn(3, d.cfg.block_size, d.cfg.hidden_size, generator=g, dtype=d.dtype)
        d.inject(hidden, n, ref_cache)
        lean.inject(hidden, n, lean_cache)
        want, got = d.draft(block, ref_cache), lean.draft(block, lean_cache)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
        torch.testing.assert_close(lean.logits(got), d.logits(want, target.head), rtol=0, atol=1e-5)
        assert torch.equal(lean_cache.lengths, ref_cache.lengths)
        assert torch.equal(lean_cache.page_table, ref_cache.page_table)
        for layer in range(d.cfg.num_hidden_layers):
            for a, b in zip(ref_cache.gather(layer), lean_cache.gather(layer), strict=True):
                torch.testing.assert_close(b, a, rtol=0, atol=1e-5)


def test_the_backend_drafts_the_same_blocks_through_the_lean_round():
    """The reference runtime's rounds go through the lean drafter, and a batch of DFlash2 rows
    takes exactly the tokens and acceptance the reference ops give (greedy: the target's own)."""
    model = tiny_target()
    d = tiny_dflash2_drafter(model)
    lean, ref = TorchBackend(wrap(model, d), d), TorchBackend(wrap(model, d), d, lean=False)
    assert lean.lean_drafter is not None and ref.lean_drafter is None
    ps = prompts(3, seed=4, lo=5, hi=20)
    a = generate(None, None, ps, max_new_tokens=24, block_size=6, backend=lean)
    b = generate(None, None, ps, max_new_tokens=24, block_size=6, backend=ref)
    assert a.token_ids == b.token_ids
    assert a.stats.per_position_acceptance == b.stats.per_position_acceptance


def test_drafters_it_does_not_reproduce_keep_the_reference(monkeypatch):
    model = tiny_target()
    target = wrap(model)
    # a subclass computes its round its own way (the tests' oracle reads the answer)
    oracle = OracleDrafter(tiny_drafter_config(model), [[3, 4, 5]], lambda rnd, row: 1).to(torch.float64)
    assert lean_drafter(oracle, None, target.head) is None
    # a round the probe finds different (here: perturbed) is never used
    real = LeanDrafter.draft
    monkeypatch.setattr(LeanDrafter, "draft", lambda self, e, c: real(self, e, c) + 1e-3)
    assert lean_drafter(tiny_drafter(model, seed=5), None, target.head) is None
    monkeypatch.undo()
    assert lean_drafter(tiny_drafter(model, seed=5), None, target.head) is not None
