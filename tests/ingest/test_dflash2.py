"""DFlash2 drafters written raw (the published config shape and tensor names), read, checked, loaded,
written back; malformed ones refused in one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from dflash_trt import ingest
from dflash_trt.cli import run
from dflash_trt.errors import DFlashError
from dflash_trt.model import DFlash2Drafter

H, LAYERS, HEADS, KV, HD, FFN, VOCAB, TAPS, GROUP, RANK, TOP_K = 64, 2, 4, 2, 16, 96, 96, 2, 16, 8, 4


def published_config(**dflash) -> dict:
    """z-lab/Qwen3.8-27B-DFlash2's config.json, scaled down (keys and their places verbatim)."""
    return {
        "architectures": ["DFlash2DraftModel"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": None,
        "is_causal": False,
        "dflash_config": {
            "block_size": 8,
            "conv_group_size": GROUP,
            "conv_kernel_size": TAPS,
            "mask_token_id": VOCAB - 1,
            "selector_rank": RANK,
            "selector_top_k": TOP_K,
            "target_layer_ids": [0, 2],
            **dflash,
        },
        "dtype": "float32",
        "eos_token_id": 2,
        "head_dim": HD,
        "hidden_act": "silu",
        "hidden_size": H,
        "initializer_range": 0.02,
        "intermediate_size": FFN,
        "layer_types": ["sliding_attention"] * LAYERS,
        "max_position_embeddings": 512,
        "max_window_layers": LAYERS,
        "model_type": "qwen3",
        "num_attention_heads": HEADS,
        "num_hidden_layers": LAYERS,
        "num_key_value_heads": KV,
        "num_target_layers": 4,
        "pad_token_id": 0,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
        "sliding_window": 16,
        "tie_word_embeddings": False,
        "transformers_version": "5.15.0",
        "use_cache": True,
        "use_sliding_window": True,
        "vocab_size": VOCAB,
    }


def published_tensors(seed: int = 0, codebook_suffix: str = "") -> dict[str, torch.Tensor]:
    """Every tensor under its published name, built here by hand (not from DFlash2Drafter)."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g) * 0.2  # noqa: E731
    t = {
        "fc.weight": r(H, 2 * H),
        "hidden_norm.weight": 1 + r(H),
        "norm.weight": 1 + r(H),
        "candidate_selector.predecessor_codebook" + codebook_suffix: r(VOCAB, RANK),
        "candidate_selector.successor_codebook" + codebook_suffix: r(VOCAB, RANK),
        "candidate_selector.hidden_projection.weight": r(RANK, H),
    }
    for i in range(LAYERS):
        p = f"layers.{i}."
        t.update(
            {
                p + "self_attn.q_proj.weight": r(HEADS * HD, H),
                p + "self_attn.k_proj.weight": r(KV * HD, H),
                p + "self_attn.v_proj.weight": r(KV * HD, H),
                p + "self_attn.o_proj.weight": r(H, HEADS * HD),
                p + "self_attn.q_norm.weight": 1 + r(HD),
                p + "self_attn.k_norm.weight": 1 + r(HD),
                p + "mlp.gate_proj.weight": r(FFN, H),
                p + "mlp.up_proj.weight": r(FFN, H),
                p + "mlp.down_proj.weight": r(H, FFN),
                p + "input_layernorm.weight": 1 + r(H),
                p + "post_attention_layernorm.weight": 1 + r(H),
            }
        )
        for conv in ("attention_conv", "mlp_conv"):
            t[p + f"{conv}.base_kernel"] = r(2, TAPS, H)
            t[p + f"{conv}.kernel_projection.weight"] = r(2 * TAPS * (H // GROUP), H)
    return t


def write_published(root: Path, config: dict | None = None, tensors: dict | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(config or published_config(), indent=2))
    save_file(tensors if tensors is not None else published_tensors(), str(root / "model.safetensors"))
    return root


def test_raw_dflash2_is_read_with_its_sizes_and_attention_rule(tmp_path):
    spec = ingest.read_drafter(write_published(tmp_path / "d"))
    c = spec.config
    assert spec.format == "dflash2" and c.family == "dflash2"
    assert (c.conv_kernel_size, c.conv_group_size, c.selector_rank, c.selector_top_k) == (TAPS, GROUP, RANK, TOP_K)
    assert c.block_size == 8 and c.rope_theta == 1e4 and c.mask_token_id == VOCAB - 1
    # is_causal: false makes the sliding layers windowed and non-causal (the authors' Qwen3DFlashAttention)
    assert [c.layer_causal(i) for i in range(LAYERS)] == [False, False]
    assert [c.layer_window(i) for i in range(LAYERS)] == [16, 16]
    assert spec.to_dict()["dflash2"] == {
        "conv_kernel_size": TAPS,
        "conv_group_size": GROUP,
        "selector_rank": RANK,
        "selector_top_k": TOP_K,
    }


@pytest.mark.parametrize("suffix", ["", ".weight"])
def test_raw_dflash2_loads_every_tensor_and_round_trips(tmp_path, suffix):
    raw = published_tensors(codebook_suffix=suffix)
    d = ingest.load_drafter(write_published(tmp_path / "d", tensors=raw))
    assert isinstance(d, DFlash2Drafter)
    state = d.state_dict()
    for name, tensor in raw.items():
        assert torch.equal(state[name.removesuffix(".weight") if "codebook" in name else name], tensor), name
    out = ingest.write_zlab(tmp_path / "d", tmp_path / "out")
    back = load_file(str(out / "model.safetensors"))
    published = {n.removesuffix(".weight") if "codebook" in n else n: v for n, v in raw.items()}
    assert set(back) == set(published)
    assert all(torch.equal(back[n], v) for n, v in published.items())
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["DFlash2DraftModel"] and cfg["is_causal"] is False
    assert {
        k: cfg["dflash_config"][k]
        for k in ("block_size", "conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
    } == {
        "block_size": 8,
        "conv_kernel_size": TAPS,
        "conv_group_size": GROUP,
        "selector_rank": RANK,
        "selector_top_k": TOP_K,
    }
    assert ingest.read_drafter(out).config == ingest.read_drafter(tmp_path / "d").config


def test_pair_validation_checks_the_selector_against_the_target(tiny_pair_dir, tmp_path):
    tdir, _ = tiny_pair_dir
    report = ingest.validate_pair(tdir, write_published(tmp_path / "d"))
    row = [c for c in report.checks if c["check"] == "dflash2"]
    assert row and row[0]["status"] == "ok" and "top-4 of 96" in row[0]["detail"]


def _config_with(**over):
    cfg = published_config()
    for k, v in over.items():
        if k.startswith("dflash_"):
            if v is None:
                cfg["dflash_config"].pop(k[len("dflash_") :])
            else:
                cfg["dflash_config"][k[len("dflash_") :]] = v
        else:
            cfg[k] = v
    return cfg


def _without(*names):
    return {k: v for k, v in published_tensors().items() if not k.startswith(names)}


MALFORMED = {
    "group size not dividing the hidden size": (
        _config_with(dflash_conv_group_size=24),
        None,
        "conv_group_size 24 does not divide hidden_size 64",
    ),
    "missing selector sizes": (
        _config_with(dflash_selector_rank=None, dflash_selector_top_k=None),
        None,
        "lacks dflash_config.selector_rank, selector_top_k",
    ),
    "top-k beyond the vocabulary": (
        _config_with(dflash_selector_top_k=500),
        None,
        "selector_top_k 500 exceeds the vocabulary (96)",
    ),
    "zero taps": (_config_with(dflash_conv_kernel_size=0), None, "conv_kernel_size is 0"),
    "missing selector tensors": (None, _without("candidate_selector."), "lack the candidate selector"),
    "missing convolutions": (None, _without("layers.1.mlp_conv."), "lack the dynamic convolutions"),
    "codebook of the wrong width": (
        None,
        {**published_tensors(), "candidate_selector.successor_codebook": torch.zeros(VOCAB, RANK + 1)},
        "config.json implies [96, 8]",
    ),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_dflash2_is_refused_in_one_line(tiny_pair_dir, tmp_path, capsys, case):
    config, tensors, needle = MALFORMED[case]
    d = write_published(tmp_path / "d", config=config, tensors=tensors)
    with pytest.raises(DFlashError, match=needle.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        ingest.read_drafter(d)
    code = run(["inspect", str(d), "--target", str(tiny_pair_dir[0])])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and needle in err and "Traceback" not in err, err
    assert not (tmp_path / "out").exists()


def test_dflash2_in_the_speculators_layout_is_refused(tmp_path):
    cfg = {"speculators_model_type": "dflash2", "architectures": ["DFlash2Speculator"]}
    d = tmp_path / "d"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    shutil.copy(write_published(tmp_path / "src") / "model.safetensors", d)
    with pytest.raises(DFlashError, match="speculators layout is not supported"):
        ingest.read_drafter(d)
