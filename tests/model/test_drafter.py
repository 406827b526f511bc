"""The drafter module: loads published z-lab tensors, round-trips, and computes what DFlash specifies."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file
from transformers.models.qwen3.modeling_qwen3 import Qwen3Config, Qwen3RotaryEmbedding, apply_rotary_pos_emb

from dflash_trt.errors import CheckpointError
from dflash_trt.model.config import DrafterConfig
from dflash_trt.model.drafter import Drafter
from tests.helpers import tiny_drafter, tiny_target

H, L, HEADS, KV, D, FFN, V = 64, 2, 4, 2, 16, 96, 128


def zlab_config(**over) -> dict:
    """A config.json shaped like z-lab/Qwen3-8B-DFlash-b16's, scaled down."""
    cfg = {
        "architectures": ["DFlashDraftModel"],
        "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
        "attention_bias": False,
        "block_size": 8,
        "dflash_config": {"mask_token_id": V - 1, "target_layer_ids": [0, 2]},
        "dtype": "float32",
        "head_dim": D,
        "hidden_act": "silu",
        "hidden_size": H,
        "intermediate_size": FFN,
        "layer_types": ["full_attention"] * L,
        "max_position_embeddings": 512,
        "model_type": "qwen3",
        "num_attention_heads": HEADS,
        "num_hidden_layers": L,
        "num_key_value_heads": KV,
        "num_target_layers": 4,
        "rms_norm_eps": 1e-6,
        "rope_scaling": None,
        "rope_theta": 1000000,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "vocab_size": V,
    }
    cfg.update(over)
    return cfg


def zlab_tensors(n_tap=2, seed=0) -> dict[str, torch.Tensor]:
    """Tensors under the published names: no model. prefix, no embedding, no lm_head."""
    g = torch.Generator().manual_seed(seed)

    def r(*s):
        return torch.randn(*s, generator=g) * 0.1

    t = {"fc.weight": r(H, n_tap * H), "hidden_norm.weight": 1 + r(H), "norm.weight": 1 + r(H)}
    for i in range(L):
        p = f"layers.{i}."
        t.update(
            {
                p + "self_attn.q_proj.weight": r(HEADS * D, H),
                p + "self_attn.k_proj.weight": r(KV * D, H),
                p + "self_attn.v_proj.weight": r(KV * D, H),
                p + "self_attn.o_proj.weight": r(H, HEADS * D),
                p + "self_attn.q_norm.weight": 1 + r(D),
                p + "self_attn.k_norm.weight": 1 + r(D),
                p + "mlp.gate_proj.weight": r(FFN, H),
                p + "mlp.up_proj.weight": r(FFN, H),
                p + "mlp.down_proj.weight": r(H, FFN),
                p + "input_layernorm.weight": 1 + r(H),
                p + "post_attention_layernorm.weight": 1 + r(H),
            }
        )
    return t


def write_zlab(path, cfg=None, tensors=None):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg or zlab_config()))
    save_file(tensors or zlab_tensors(), str(path / "model.safetensors"))


def test_loads_raw_zlab_checkpoint(tmp_path):
    tensors = zlab_tensors()
    write_zlab(tmp_path, tensors=tensors)
    d = Drafter.load(tmp_path)
    state = d.state_dict()
    assert set(state) == set(tensors)
    for name, t in tensors.items():
        assert torch.equal(state[name], t), name
    assert d.cfg.block_size == 8 and d.cfg.mask_token_id == V - 1 and d.cfg.target_layer_ids == [0, 2]


def test_newer_zlab_config_reads_block_size_and_swa_from_dflash_config(tmp_path):
    cfg = zlab_config(layer_types=["sliding_attention", "full_attention"], sliding_window=None)
    cfg.pop("block_size")
    cfg["dflash_config"].update(block_size=16, use_swa=True, swa_window_size=64)
    c = DrafterConfig.from_zlab(cfg)
    assert c.block_size == 16
    assert c.layer_window(0) == 64 and c.layer_window(1) is None
    assert c.layer_causal(0) and not c.layer_causal(1)


def test_save_load_round_trip_is_identical(tmp_path):
    model = tiny_target("qwen3", dtype=torch.float32)
    d = tiny_drafter(model)
    d.save(tmp_path / "d")
    back = Drafter.load(tmp_path / "d")
    assert back.cfg == d.cfg.model_copy(update={"dtype": "float32"})  # dtype records the saved weights
    for (n1, a), (n2, b) in zip(d.state_dict().items(), back.state_dict().items(), strict=True):
        assert n1 == n2 and torch.equal(a, b)
    saved = json.loads((tmp_path / "d" / "config.json").read_text())
    assert saved["architectures"] == ["DFlashDraftModel"]
    assert saved["dflash_config"]["target_layer_ids"] == d.cfg.target_layer_ids


def test_wrong_shapes_and_missing_tensors_are_checkpoint_errors(tmp_path):
    t = zlab_tensors()
    t["fc.weight"] = t["fc.weight"][:, :H].contiguous()
    write_zlab(tmp_path / "a", tensors=t)
    with pytest.raises(CheckpointError, match="fc.weight"):
        Drafter.load(tmp_path / "a")
    t = zlab_tensors()
    del t["layers.1.mlp.up_proj.weight"]
    write_zlab(tmp_path / "b", tensors=t)
    with pytest.raises(CheckpointError, match="missing"):
        Drafter.load(tmp_path / "b")


def naive_block(
    d: Drafter, target_hidden: torch.Tensor, block: torch.Tensor, causal=False, window=None
) -> torch.Tensor:
    """DFlash written densely, the way the paper describes it: fused context in front of the
    block's own K/V in every layer, RoPE at absolute positions, one non-causal forward."""
    cfg = d.cfg
    n, B = target_hidden.shape[1], block.shape[1]
    ctx = d.hidden_norm(d.fc(target_hidden))
    rope = Qwen3RotaryEmbedding(
        Qwen3Config(
            hidden_size=cfg.hidden_size,
            num_attention_heads=cfg.num_attention_heads,
            head_dim=cfg.head_dim,
            rope_theta=cfg.rope_theta,
        )
    )
    pos = torch.arange(n + B)[None]
    cos, sin = rope(block, pos)
    x = block
    for layer in d.layers:
        a = layer.self_attn
        h = layer.input_layernorm(x)
        both = torch.cat([ctx, h], dim=1)
        q = a.q_norm(a.q_proj(h).view(1, B, -1, cfg.head_dim)).transpose(1, 2)
        k = a.k_norm(a.k_proj(both).view(1, n + B, -1, cfg.head_dim)).transpose(1, 2)
        v = a.v_proj(both).view(1, n + B, -1, cfg.head_dim).transpose(1, 2)
        qc, qs = cos[:, n:], sin[:, n:]
        q, _ = apply_rotary_pos_emb(q, q, qc, qs)
        k, _ = apply_rotary_pos_emb(k, k, cos, sin)
        qp = torch.arange(n, n + B)[:, None]
        kp = torch.arange(n + B)[None]
        mask = torch.ones(B, n + B, dtype=torch.bool)
        if causal:
            mask &= kp <= qp
        if window:
            mask &= (qp - kp).abs() < window
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        x = x + a.o_proj(o.transpose(1, 2).reshape(1, B, -1))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return d.norm(x)


@pytest.mark.parametrize("mode", ["bidirectional", "causal", "sliding"])
def test_inject_then_draft_equals_the_dense_formulation(mode):
    model = tiny_target("qwen3", dtype=torch.float64)
    kw = {}
    if mode == "causal":
        kw = dict(causal=True)
    if mode == "sliding":
        kw = dict(layer_types=["sliding_attention", "sliding_attention"], sliding_window=7)
    d = tiny_drafter(model, **kw)
    n_tap = len(d.cfg.target_layer_ids)
    torch.manual_seed(4)
    target_hidden = torch.randn(1, 13, n_tap * d.cfg.hidden_size, dtype=torch.float64)
    block = torch.randn(1, 8, d.cfg.hidden_size, dtype=torch.float64)
    cache = d.new_cache(1)
    # Inject in two chunks, as the runtime does round by round.
    d.inject(target_hidden[:, :9], torch.tensor([9]), cache)
    d.inject(target_hidden[:, 9:], torch.tensor([4]), cache)
    got = d.draft(block, cache)
    want = naive_block(d, target_hidden, block, causal=mode != "bidirectional", window=7 if mode == "sliding" else None)
    # RMSNorm and RoPE tables are computed in float32 on both sides (as in transformers),
    # so agreement is to float32 rounding; a semantic slip (positions, masks, norms) is O(1).
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
