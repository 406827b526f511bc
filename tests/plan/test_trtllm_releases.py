"""The release table as established from TensorRT-LLM's tags, and the rules it drives: the one
draft-attention rule keyed on the drafter's layers, the drafter's memory per release and draft
backend (PR #19410), the refusals (disaggregated serving, PR #19352; a quantized drafter)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from dflash_trt.cli import run
from dflash_trt.deploy import pipeline
from dflash_trt.errors import RecipeError
from dflash_trt.model import DrafterConfig
from dflash_trt.plan import recipe as R
from dflash_trt.plan import trtllm_releases as T
from dflash_trt.plan import trtllm_rules as rules

CONFIGS = Path(R.__file__).resolve().parents[1] / "recipes" / "configs"


def test_each_row_says_what_its_tag_holds_and_how_that_was_established():
    rc26, rc27, rc1 = (T.KNOWN[v] for v in ("1.3.0rc26", "1.3.0rc27", "1.4.0rc1"))
    assert [r.version for r in T.RELEASES if r.dflash2] == ["1.4.0rc1"]
    assert rc1.refuses_windowed_trtllm and rc1.warns_disaggregated and rc1.block_size_from_dflash_config
    assert rc1.draft_kv_manager == ("TRTLLM",) and rc1.tag.startswith("0372799")
    assert rc26.tag.startswith("c295dd9") and rc26.block_size_from_dflash_config and not rc26.dflash2
    assert rc26.draft_kv_manager == ("VANILLA", "TRTLLM", "FA4") and not rc26.refuses_windowed_trtllm
    assert not rc27.tag and "not established" in rc27.notes  # unknown: said, not inferred
    assert all(r.draft_len_floor == 0 for r in T.RELEASES)  # PR #16888 is open
    for pr in ("#17935", "#18155", "#19159", "#19352", "#19410"):
        assert pr in rc1.notes and pr in rc26.notes
    assert T.DEFAULT_RELEASE == "1.4.0rc1" and rc1.capture == ()  # placeholder for the family issues


def _drafter(**over) -> DrafterConfig:
    """A plain DFlash drafter (no DFlash2 sizes), as a speculators-format checkpoint converts."""
    base = dict(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=128,
        mask_token_id=127,
        target_layer_ids=[0, 1],
    )
    return DrafterConfig(**{**base, **over})


@pytest.mark.parametrize("kind", ["plain", "dflash2"])
def test_one_rule_on_the_layers_decides_the_draft_attention(kind):
    extra = dict(conv_kernel_size=2, conv_group_size=16, selector_rank=8, selector_top_k=4) if kind == "dflash2" else {}
    windowed = _drafter(
        causal=False,
        layer_types=["full_attention", "sliding_attention", "sliding_attention"],
        sliding_window=32,
        **extra,
    )
    assert (windowed.family == "dflash2") == (kind == "dflash2") and rules.windowed_non_causal(windowed) == [1, 2]
    rc1, rc26 = T.KNOWN["1.4.0rc1"], T.KNOWN["1.3.0rc26"]
    assert rules.draft_attention_backend("auto", windowed, 90, rc1) == "FA4"
    assert rules.draft_attention_backend("auto", windowed, 90, rc26) == "VANILLA"  # no FA4 there
    assert rules.draft_attention_backend("auto", windowed, 100, rc1) == "VANILLA"
    assert rules.draft_attention_backend("FA4", windowed, 90, rc1) == "FA4"
    with pytest.raises(RecipeError, match=r"layer\(s\) 1, 2 use a non-causal sliding window.*refuses it \(PR #19159\)"):
        rules.draft_attention_backend("TRTLLM", windowed, 100, rc1)
    with pytest.raises(RecipeError, match="would run it with wrong masks"):  # the release does not refuse
        rules.draft_attention_backend("TRTLLM", windowed, 100, rc26)
    causal = _drafter(causal=True, layer_types=["sliding_attention"] * 3, sliding_window=32, **extra)
    full = _drafter(causal=False, **extra)  # non-causal, no window
    for cfg in (causal, full):
        assert rules.windowed_non_causal(cfg) == []
        assert rules.draft_attention_backend("TRTLLM", cfg, 100, rc1) == "TRTLLM"


def _plan(sets):
    r = R.load_recipe("qwen3-8b-h100-fp8", list(sets))
    return pipeline.plan_resolved(pipeline.resolve_recipe(r))


def test_the_unused_draft_kv_pool_is_charged_per_release_and_backend():
    """Qwen3-8B's drafter: 5 layers, 8 KV heads x 128; batch 32, max_seq_len 8192, tp 1. Before
    PR #19410 VANILLA also gets a managed draft KV cache (charged as the paged arena); after it not."""
    sets = ["speculative.attention_backend=VANILLA", "speculative.max_draft_len=7"]
    old, new = _plan(sets + ["trtllm.release=1.3.0rc27"]), _plan(sets + ["trtllm.release=1.4.0rc1"])
    paged = 2 * (32 + 1) * 5 * math.ceil((8192 + 7 + 1) / 32) * 32 * 8 * 128 * 2
    assert old.memory.draft_kv_pool == paged and new.memory.draft_kv_pool == 0
    assert old.memory.total - new.memory.total == paged and old.memory.drafter_arena == new.memory.drafter_arena
    b200 = _plan(["gpu.name=B200", "speculative.attention_backend=TRTLLM", "trtllm.release=1.3.0rc27"])
    assert b200.memory.draft_kv_pool == 0 and b200.memory.arena_in_kv_pool  # TRTLLM: the pool IS the arena


def test_a_runtime_block_wider_than_the_checkpoint_s_is_refused():
    with pytest.raises(RecipeError, match="exceeds the drafter's trained block 16 .*PR #17935"):
        _plan(["speculative.block_size=17"])
    assert _plan(["speculative.block_size=8"]).block_size == 8


def test_disaggregated_serving_is_refused_in_one_line(capsys):
    assert run(["plan", "qwen3-8b-h100-fp8", "--set", "serving.disaggregated=true"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "disaggregated" in err and "PR #19352" in err, err
    assert run(["plan", "qwen3-8b-h100-fp8"]) == 0


@pytest.mark.parametrize("where", ["hf_quant_config.json", "config.json"])
def test_a_quantized_drafter_is_refused_in_one_line(tmp_path, capsys, where):
    d = tmp_path / "drafter"
    d.mkdir()
    cfg = json.loads((CONFIGS / "z-lab--Qwen3-8B-DFlash-b16" / "config.json").read_text())
    if where == "config.json":
        cfg["quantization_config"] = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    else:
        (d / "hf_quant_config.json").write_text(
            json.dumps({"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "NVFP4"}})
        )
    (d / "config.json").write_text(json.dumps(cfg))
    recipe = yaml.safe_load((Path(R.__file__).parents[1] / "recipes" / "qwen3-8b-h100-fp8.yaml").read_text())
    recipe["target"]["config"] = str(CONFIGS / "Qwen--Qwen3-8B")
    recipe["drafter"] = {"id": "org/quantized-drafter", "config": str(d)}
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(recipe))
    assert run(["plan", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "quantized" in err and "#51581" in err and "unquant" in err, err
