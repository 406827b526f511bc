"""Planning the second-wave families: one sequence's cache bytes, as the planner counts them
(no torch), against the tensors the reference runtime's cache really holds after a prefill."""

from __future__ import annotations

import pytest
import torch

from dflash_trt.plan.model_shapes import TargetShape
from tests.second_wave import FAMILIES, TOPK, _config, second_wave_target

N = 40  # prompt tokens: past every tiny window (6) and several compressor windows


def _held_bytes(cache) -> int:
    """Bytes of every distinct tensor a transformers cache holds (K = V counted once)."""
    seen, total = set(), 0
    for layer in cache.layers:
        for name in ("keys", "values", "indexer_keys"):
            t = getattr(layer, name, None)
            if (
                name == "values"
                and isinstance(t, torch.Tensor)
                and t.shape == layer.keys.shape
                and torch.equal(t, layer.keys)
            ):  # V4's K = V, stored twice on its plain sliding layer
                continue
            if isinstance(t, torch.Tensor) and t.numel() and t.data_ptr() not in seen:
                seen.add(t.data_ptr())
                total += t.numel() * t.element_size()
        for state in ("compressed_kv",):
            for t in (getattr(layer, state, None) or {}).values():
                if t is not None and t.numel():
                    total += t.numel() * t.element_size()
    return total


def _shape(family: str) -> TargetShape:
    _, cfg = _config(family)
    text = cfg.get_text_config().to_dict()
    text["model_type"] = text["model_type"].removesuffix("_text")
    return TargetShape.from_config(text)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_planner_counts_what_the_runtime_cache_holds(family):
    from transformers import DynamicCache

    model = second_wave_target(family, dtype=torch.float32)
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(torch.randint(3, 90, (1, N)), use_cache=True, cache=cache)
    planned = _shape(family).cache_bytes(1, 4, N, windowed=True)
    held = _held_bytes(cache)
    # transformers keeps W - 1 tokens of a sliding layer between forwards (the next query is the
    # W-th); the planner counts the W a forward holds: at most one token per sliding layer more
    sliding = sum(g.bytes(1, 4, 1) for g in _shape(family).kv_groups if g.sliding or g.window)
    assert held <= planned <= held + sliding, (planned, held)


def test_sparse_attention_caches_the_latent_and_an_indexer_key_on_every_rank():
    t = _shape("deepseek_v32")
    per_token = t.cache_bytes(1, 2, 1001) - t.cache_bytes(1, 2, 1000)
    assert per_token == 4 * (16 + 8) * 2 + 4 * 16 * 2  # latent (kv_lora + rope) + indexer key, 4 layers, BF16
    assert t.cache_bytes(8, 2, 1000) == t.cache_bytes(1, 2, 1000)
    glm = _shape("glm_moe_dsa")  # "shared" layers cache no indexer key
    assert glm.cache_bytes(1, 2, 1) - glm.cache_bytes(1, 2, 0) == 4 * 24 * 2 + 2 * 16 * 2
    latent = t.kv_groups[-1]
    assert latent.attended(1000) == TOPK and latent.attended(3) == 3


def test_v4_holds_a_window_and_compressed_entries():
    t = _shape("deepseek_v4")  # window 6; CSA every 2 tokens, HCA every 4
    assert t.cache_bytes(1, 2, 400) == 2 * 16 * (4 * 6 + 2 * 200 + 2 * 200 * 16 // 16 + 100)
