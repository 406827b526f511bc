"""Recipes whose shipped configs lack fields plan from the Hugging Face cache, offline.

Each test lays out a prepared cache as huggingface_hub does (``models--org--name/snapshots/<sha>/``,
``refs/main``), sets ``HF_HUB_CACHE`` and ``HF_HUB_OFFLINE=1``, and plans a bundled recipe from it:
a hybrid Qwen3.5 target, a Gemma 4 target and an MLA (Kimi) target. The cached files are the
shipped configs completed with the fields the recipe lacks (stand-ins for the hub's files; no
weights). The recipes pin short commit prefixes: the full snapshot hash is found from them. With
nothing cached, the same plan refuses in one line naming the missing fields and the commands that work.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from dflash_trt.deploy import pipeline
from dflash_trt.errors import DFlashError, RecipeError
from dflash_trt.plan import published
from dflash_trt.plan import recipe as R

NVFP4 = {
    "producer": {"name": "modelopt"},
    "quantization": {
        "quant_algo": "NVFP4",
        "kv_cache_quant_algo": None,
        "group_size": 16,
        "exclude_modules": ["lm_head"],
    },
}


def _snapshot(cache: Path, repo: str, revision: str | None, files: dict[str, dict]) -> Path:
    """``cache/models--org--name/snapshots/<sha>/`` with ``files``; ``refs/main`` points at it (an
    unpinned recipe reads main). ``revision`` is the full hash (padded when a test gives less)."""
    sha = (revision or "").ljust(40, "0")
    folder = cache / ("models--" + repo.replace("/", "--"))
    snap = folder / "snapshots" / sha
    snap.mkdir(parents=True)
    for name, data in files.items():
        (snap / name).write_text(json.dumps(data))
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text(sha)
    return snap


def _config(recipe, role: str) -> dict:
    cfg, _ = published.read_any(recipe.resolve_path(getattr(recipe, role).config))
    return dict(cfg)


@pytest.fixture
def offline_cache(tmp_path, monkeypatch):
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def _qwen35(r):
    target = _config(r, "target")
    target["quantization_config"] = {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": [128, 128],
    }
    return {"config.json": target}, {"config.json": _config(r, "drafter")}


def _gemma4(r):
    return {"config.json": _config(r, "target"), "hf_quant_config.json": NVFP4}, {"config.json": _config(r, "drafter")}


def _kimi(r):
    # Kimi-K2.6 keeps K2.5's DeepSeek-V3 (MLA) layout: the stand-in is K2.5's config
    k25 = R.load_recipe("kimi-k2.5-8xh200-int4")
    target = {k: v for k, v in _config(k25, "target").items() if k != "quantization_config"}
    text = {k: v for k, v in target.get("text_config", {}).items() if k != "quantization_config"}
    drafter = {**_config(r, "drafter"), "intermediate_size": 18432, "block_size": 8}
    return {"config.json": {**target, "text_config": text}, "hf_quant_config.json": NVFP4}, {"config.json": drafter}


CASES = {"qwen3.5-27b-h200-fp8": _qwen35, "gemma-4-26b-a4b-b200-nvfp4": _gemma4, "kimi-k2.6-8xb200-nvfp4": _kimi}


def _hub_only(name: str):
    """The bundled recipe (its shipped configs lack fields: planning must read the cache)."""
    r = R.load_recipe(name)
    assert published.lacking(r, "target") or published.lacking(r, "drafter"), f"{name} plans offline already"
    return r


def _short(r):
    """The same recipe pinning 8-digit prefixes of its revisions, as model cards quote them."""
    for ref in (r.target, r.drafter):
        if ref.revision:
            ref.revision = ref.revision[:8]
    return r


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_hub_only_recipe_plans_from_the_local_cache(name, offline_cache):
    r = _hub_only(name)
    tfiles, dfiles = CASES[name](r)
    tsnap = _snapshot(offline_cache, r.target.id, r.target.revision, tfiles)
    dsnap = _snapshot(offline_cache, r.drafter.id, r.drafter.revision, dfiles)
    res = pipeline.resolve_recipe(_short(r))
    assert any(ref.revision and len(ref.revision) == 8 for ref in (r.target, r.drafter))
    assert res.target_dir == tsnap and res.drafter_dir == dsnap  # short prefixes found their snapshots
    p = pipeline.plan_resolved(res)
    assert 1 <= p.max_draft_len < p.block_size


@pytest.mark.parametrize("name", sorted(CASES))
def test_offline_with_nothing_cached_refuses_in_one_line(name, offline_cache):
    r = _hub_only(name)
    with pytest.raises(RecipeError) as exc:
        pipeline.resolve_recipe(r)
    msg = str(exc.value)
    assert "\n" not in msg and "--target DIR --drafter DIR" in msg
    for role in ("target", "drafter"):  # every model whose configs lack fields: its fields, its fetch
        if published.lacking(r, role):
            assert published.lacking(r, role)[0] in msg and f"hf download {getattr(r, role).id}" in msg


def test_a_speculators_drafter_from_the_cache_gets_zlab_ids_in_the_trtllm_config(offline_cache):
    """Red Hat's Qwen3-8B drafter as speculators 0.9 publishes it (a stand-in config: nested decoder,
    +1 ids, every layer sliding and non-causal): the plan and the TensorRT-LLM config read z-lab ids."""
    from dflash_trt.deploy import trtllm_config

    r = _hub_only("qwen3-8b-redhat-h100-fp8")
    layer = {
        "model_type": "qwen3",
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "num_hidden_layers": 5,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 151936,
        "rope_theta": 1000000.0,
        "max_position_embeddings": 40960,
        "layer_types": ["sliding_attention"] * 5,
        "sliding_window": 2048,
    }
    drafter = {
        "speculators_model_type": "dflash",
        "architectures": ["DFlashDraftModel"],
        "block_size": 8,
        "transformer_layer_config": layer,
        "aux_hidden_state_layer_ids": [2, 10, 19, 28, 35],
        "mask_token_id": 151669,
        "draft_vocab_size": 151936,
    }
    _snapshot(offline_cache, r.drafter.id, r.drafter.revision, {"config.json": drafter})
    res = pipeline.resolve_recipe(r)
    assert list(res.drafter.target_layer_ids) == [1, 9, 18, 27, 34]
    assert all(not res.drafter_config.layer_causal(i) for i in range(5))
    spec = trtllm_config.config(r, pipeline.plan_resolved(res), res.drafter).speculative_config
    assert spec.target_layer_ids == [1, 9, 18, 27, 34]


def test_a_complete_recipe_still_plans_from_its_shipped_configs(offline_cache):
    res = pipeline.resolve_recipe(R.load_recipe("qwen3.5-4b-h100-bf16"))
    assert "configs" in str(res.target_dir) and not any(offline_cache.iterdir())


def test_a_short_prefix_matching_two_snapshots_is_not_guessed(offline_cache):
    from dflash_trt.ingest import hub

    folder = offline_cache / "models--org--m" / "snapshots"
    for sha in ("abcdef12" + "0" * 32, "abcdef12" + "1" * 32):
        (folder / sha).mkdir(parents=True)
    assert hub.expand_revision("org/m", "abcdef12") == "abcdef12"
    shutil.rmtree(folder / ("abcdef12" + "1" * 32))
    assert hub.expand_revision("org/m", "abcdef12") == "abcdef12" + "0" * 32
    assert hub.expand_revision("org/m", "main") == "main"


def test_the_build_reads_the_same_cached_snapshot_without_weights_offline(offline_cache):
    """``build`` (weights) resolves the same revision; with no safetensors cached it is a checkpoint
    problem in one line, not the recipe's incompleteness."""
    r = _hub_only("gemma-4-26b-a4b-b200-nvfp4")
    tfiles, dfiles = _gemma4(r)
    _snapshot(offline_cache, r.target.id, r.target.revision, tfiles)
    _snapshot(offline_cache, r.drafter.id, r.drafter.revision, dfiles)
    res = pipeline.resolve_recipe(r)
    assert res.precision == "nvfp4"
    with pytest.raises(DFlashError):
        pipeline.resolve_recipe(r, weights=True)
