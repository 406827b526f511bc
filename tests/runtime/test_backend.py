"""The loop reaches the models only through its backend, and the block-size rule is one."""

from __future__ import annotations

from collections import Counter

import pytest

from dflash_trt.errors import DFlashError
from dflash_trt.runtime.backend import Backend, TorchBackend
from dflash_trt.runtime.loop import block_size_for, generate
from tests.helpers import VOCAB, hf_greedy, prompts, tiny_drafter, tiny_target, wrap

MAX_NEW = 20


class CountingBackend(TorchBackend):
    """The torch backend, counting every call the loop makes."""

    def __init__(self, target, drafter):
        super().__init__(target, drafter)
        self.calls = Counter()
        self.kept = []

    def new_caches(self, batch, draft):
        self.calls["new_caches"] += 1
        return super().new_caches(batch, draft)

    def target_forward(self, ids, positions, attention_mask, cache, capture, logits_at=None):
        self.calls["target_forward"] += 1
        return super().target_forward(ids, positions, attention_mask, cache, capture, logits_at)

    def drafter_round(self, target_hidden, n_new, anchor, block_size, cache):
        self.calls["drafter_round"] += 1
        return super().drafter_round(target_hidden, n_new, anchor, block_size, cache)

    def keep_rows(self, target_cache, draft_cache, rows):
        self.calls["keep_rows"] += 1
        self.kept.append(rows.tolist())
        super().keep_rows(target_cache, draft_cache, rows)

    def compact(self, target_cache, col_valid):
        self.calls["compact"] += 1
        return super().compact(target_cache, col_valid)


class HoleKeepingBackend(TorchBackend):
    """Never compacts: the default of the interface (holes stay, masked)."""

    compact = Backend.compact


@pytest.fixture(scope="module")
def models():
    model = tiny_target("qwen3")
    drafter = tiny_drafter(model, block_size=6)
    ps = prompts(3, seed=11, lo=3, hi=30)
    return model, drafter, ps, [hf_greedy(model, p, MAX_NEW) for p in ps]


def test_generate_talks_to_the_models_only_through_the_backend(models):
    model, drafter, ps, truth = models
    backend = CountingBackend(wrap(model, drafter), drafter)
    # Row 1 is cancelled after its third commit: it leaves the batch, the others go on.
    asked = Counter()

    def should_stop(row):
        asked[row] += 1
        return row == 1 and asked[row] == 3

    out = generate(None, None, ps, max_new_tokens=MAX_NEW, block_size=6, should_stop=should_stop, backend=backend)
    assert out.token_ids[0] == truth[0] and out.token_ids[2] == truth[2]
    assert out.token_ids[1] == truth[1][: len(out.token_ids[1])]
    assert out.finish_reasons == ["length", "cancelled", "length"]
    s, calls = out.stats, backend.calls
    assert calls["new_caches"] == 1
    assert calls["target_forward"] == s.target_forwards  # prefill + one per round
    assert calls["drafter_round"] == calls["compact"] == s.target_forwards - 1
    assert backend.kept[0] == [0, 2]  # the cancelled row left, once
    assert calls["keep_rows"] == len(backend.kept)


def test_autoregressive_never_calls_the_drafter(models):
    model, drafter, ps, truth = models
    backend = CountingBackend(wrap(model), drafter)  # a drafter is there, block size 1 ignores it
    out = generate(None, None, ps, max_new_tokens=MAX_NEW, block_size=1, backend=backend)
    assert out.token_ids == truth
    assert backend.calls["drafter_round"] == 0
    assert backend.calls["target_forward"] == MAX_NEW


def test_holes_kept_by_a_backend_that_does_not_compact_are_still_masked(models):
    model, drafter, ps, truth = models
    out = generate(
        None, None, ps, max_new_tokens=MAX_NEW, block_size=6, backend=HoleKeepingBackend(wrap(model, drafter), drafter)
    )
    assert out.token_ids == truth


def test_one_block_size_rule():
    assert block_size_for(None, 16) == 16
    assert block_size_for(4, 16) == 4
    assert block_size_for(None, None) == 1
    assert block_size_for(1, 16) == 1


def test_backend_block_limits_are_user_errors(models):
    model, drafter, ps, _ = models
    with pytest.raises(DFlashError, match="exceeds the drafter's trained block size 6"):
        generate(None, None, ps, block_size=8, backend=TorchBackend(wrap(model, drafter), drafter))
    with pytest.raises(DFlashError, match="needs a drafter"):
        generate(None, None, ps, block_size=2, backend=TorchBackend(wrap(model), None))


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_plain_targets_run_the_lean_forward_and_it_equals_transformers(arch):
    """Same logits and target_hidden (the last layer's too, transformers' normed one) as the
    transformers forward, through a cache with holes and a second step."""
    import torch

    model = tiny_target(arch)
    layer_ids = [0, 2, 3]
    lean, plain = TorchBackend(wrap(model), None), TorchBackend(wrap(model), None, lean=False)
    assert lean.lean is not None and plain.lean is None
    lean.target.layer_ids = plain.target.layer_ids = layer_ids
    ids = torch.tensor(prompts(2, seed=3, lo=9, hi=9))
    valid = torch.ones(2, 9, dtype=torch.bool)
    valid[1, 6:] = False  # padding / rejected columns
    outs = []
    for be in (lean, plain):
        cache, _ = be.new_caches(2, False)
        first = be.target_forward(ids, torch.arange(9).expand(2, 9), valid, cache, True)
        step_valid = torch.cat([valid, torch.ones(2, 3, dtype=torch.bool)], 1)
        second = be.target_forward(
            ids[:, :3], torch.tensor([[9, 10, 11], [6, 7, 8]]), step_valid, cache, True, logits_at=torch.tensor([2, 1])
        )
        outs.append((first, second))
    for (a_logits, a_hidden), (b_logits, b_hidden) in zip(*outs, strict=True):
        assert torch.allclose(a_logits, b_logits, rtol=0, atol=1e-10)
        assert torch.allclose(a_hidden, b_hidden, rtol=0, atol=1e-10)
    assert outs[0][1][0].shape == (2, 1, VOCAB)


def test_other_targets_keep_the_transformers_forward():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from dflash_trt.runtime.decoder import lean_forward

    cfg = Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        use_sliding_window=True,
        sliding_window=4,
        max_window_layers=0,
        layer_types=["sliding_attention"] * 2,
    )
    assert lean_forward(Qwen3ForCausalLM(cfg).eval()) is None
