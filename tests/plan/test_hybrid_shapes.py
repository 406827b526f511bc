"""Planning the second-wave hybrids: the state and cache bytes ``plan/hybrid_shapes.py`` reads
from a config are what transformers' own cache holds for that model, per sequence and per token."""

from __future__ import annotations

import pytest
import torch

from dflash_trt.plan.family_shapes import layer_counts
from dflash_trt.plan.model_shapes import TargetShape
from tests.families import family_target
from tests.helpers import prompts


def _cache(model, n_tokens: int):
    with torch.no_grad():
        return model(torch.tensor([prompts(1, seed=1, lo=n_tokens, hi=n_tokens)[0]]), use_cache=True).past_key_values


def _elements(layer, name: str) -> int:
    states = getattr(layer, name, {}) or {}
    return sum(t[0].numel() for t in states.values() if t is not None)


@pytest.mark.parametrize("family", ["nemotron_h", "kimi_linear", "glm5_next"])
def test_state_and_latent_bytes_are_what_the_cache_holds(family):
    model = family_target(family, dtype=torch.float32)
    text = model.config.get_text_config(decoder=True)
    # config.json of a published Nemotron-H carries num_hidden_layers; transformers' to_dict drops it
    cfg = {"num_hidden_layers": text.num_hidden_layers, **text.to_dict(), "model_type": text.model_type}
    c = layer_counts(cfg)
    one, two = _cache(model, 9), _cache(model, 10)
    linear = [layer for layer in one.layers if hasattr(layer, "recurrent_states")]
    (state,) = c.states
    assert state.layers == len(linear)
    for layer in linear:
        K = layer.conv_kernel_size[0]
        assert _elements(layer, "recurrent_states") == state.recurrent
        assert _elements(layer, "conv_states") // K * (K - 1) == state.conv  # TensorRT-LLM keeps K - 1 inputs

    def per_token(cache) -> int:  # cached elements of one sequence that grow with the context
        n = 0
        for layer in cache.layers:
            for name in ("keys", "values", "indexer_keys"):
                t = getattr(layer, name, None)
                n += t[0].numel() if isinstance(t, torch.Tensor) else 0
        return n

    grown = per_token(two) - per_token(one)
    assert grown == sum(g.layers * g.kv_heads * g.dims for g in c.kv)
    shape = TargetShape.from_config(cfg)
    assert shape.cache_bytes(1, 2, 0) == state.bytes(1) > 0
    assert shape.cache_bytes(1, 2, 11) - shape.cache_bytes(1, 2, 10) == 2 * grown
    lang = sum(p.numel() for n, p in model.named_parameters() if "visual" not in n)
    assert 0.93 < (c.linear + c.other + 2 * text.vocab_size * text.hidden_size) / lang < 1.02
