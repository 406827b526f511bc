"""Planning hybrid, MLA, gemma-4 and VLM targets: what their caches and weights really hold."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dflash_trt.plan import deployment as plan
from dflash_trt.plan.model_shapes import TargetShape

CONFIGS = Path(__file__).resolve().parents[2] / "dflash_trt" / "recipes" / "configs"


def _shape(folder: str) -> TargetShape:
    """The shape of a shipped target config, whole (config.json) or partial (the text model's
    fields of a VLM's config.partial.json, as read_config merges them)."""
    from dflash_trt.plan.family_shapes import vision_params

    path = CONFIGS / folder
    if (path / "config.json").exists():
        return TargetShape.from_dir(path)
    full = json.loads((path / "config.partial.json").read_text())
    text = {"model_type": full["model_type"], **full["text_config"]}
    return TargetShape.from_config(text, vision=vision_params(full))


def test_qwen35_counts_match_the_shipped_checkpoint():
    """Qwen3.5-4B: 8.68 GiB of BF16 safetensors (vision tower and one MTP layer included)."""
    t = _shape("Qwen--Qwen3.5-4B")
    shipped = json.loads((CONFIGS / "Qwen--Qwen3.5-4B" / "sizes.json").read_text())["total_size"]
    assert 0.95 < 2 * t.params / shipped < 1.01
    assert t.vision_params > 0.3e9 and t.model_type == "qwen3_5"


def test_hybrid_layers_hold_a_state_per_sequence_not_kv():
    t = _shape("Qwen--Qwen3.5-4B")
    per_token = t.cache_bytes(1, 2, 1001) - t.cache_bytes(1, 2, 1000)
    assert per_token == 8 * 4 * 2 * 256 * 2  # 8 full-attention layers, 4 KV heads, K+V of 256, BF16
    state = t.cache_bytes(1, 2, 0)
    conv = (2 * 16 * 128 + 32 * 128) * 3 * 2  # (2 key_dim + value_dim) x (kernel - 1), BF16
    rec = 32 * 128 * 128 * 4  # value heads x d_k x d_v, float32 (mamba_ssm_dtype)
    assert state == 24 * (conv + rec)
    assert t.cache_bytes(2, 2, 0) == state // 2  # split across ranks by heads


def test_mla_caches_one_latent_per_token_on_every_rank():
    t = _shape("moonshotai--Kimi-K2.5")
    per_token = t.cache_bytes(1, 2, 1) - t.cache_bytes(1, 2, 0)
    assert per_token == 61 * (512 + 64) * 2
    assert t.cache_bytes(8, 2, 1000) == t.cache_bytes(1, 2, 1000)  # replicated, not split
    assert 1.0e12 < t.params < 1.06e12 and t.experts == 384


def test_gemma4_global_layers_have_their_own_head_size():
    t = _shape("google--gemma-4-26B-A4B-it")
    per_token = t.cache_bytes(1, 2, 1) - t.cache_bytes(1, 2, 0)
    assert per_token == (25 * 8 * 2 * 256 + 5 * 2 * 2 * 512) * 2
    assert 25e9 < t.params < 27e9  # 48.07 GiB shipped in BF16 (about 25.8 B parameters)


def test_the_roofline_reads_neither_the_vision_tower_nor_the_embedding():
    t = _shape("Qwen--Qwen3.5-4B")
    from dflash_trt.plan import hardware
    from dflash_trt.plan.model_shapes import DraftShape

    d = DraftShape.from_dir(CONFIGS / "z-lab--Qwen3.5-4B-DFlash")
    dep = plan.Deployment(target=t, drafter=d, gpu=hardware.get_gpu("H100"), gpus=1, precision="bf16", kv_cache="auto")
    read = plan.step_model(dep, tp=1, ctx=2048)._weights_read(1, 1)
    head = 0 if t.lm_head_params else 2 * t.embed_params  # a tied head reads the embedding matrix
    assert t.vision_params > 0
    assert read == pytest.approx(plan.weight_bytes(t, "bf16") - 2 * (t.embed_params + t.vision_params) + head)
