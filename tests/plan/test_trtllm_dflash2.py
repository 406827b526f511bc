"""TensorRT-LLM and DFlash2: the releases that serve it, the draft attention its windows allow, the
config it gets, the bundled DFlash2 recipes (incomplete: refused in one line)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from dflash_trt.cli import run
from dflash_trt.deploy import pipeline
from dflash_trt.deploy import trtllm_config as trtllm
from dflash_trt.errors import RecipeError
from dflash_trt.model import DrafterConfig
from dflash_trt.plan import check_drafter, drafter_attention_backend, get_release, trtllm_dflash2
from dflash_trt.plan import recipe as R

CONFIGS = Path(R.__file__).resolve().parents[1] / "recipes" / "configs"


def dflash2_config(**over) -> DrafterConfig:
    base = dict(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=128,
        mask_token_id=127,
        target_layer_ids=[0, 1],
        causal=False,
        layer_types=["sliding_attention"] * 2,
        sliding_window=32,
        conv_kernel_size=2,
        conv_group_size=16,
        selector_rank=8,
        selector_top_k=4,
    )
    return DrafterConfig(**{**base, **over})


def test_only_the_releases_with_the_dflash2_path_serve_it():
    check_drafter(dflash2_config(), "1.4.0rc1")
    for release in ("1.3.0rc26", "1.3.0rc27"):
        with pytest.raises(RecipeError, match=f"TensorRT-LLM {release} does not serve DFlash2 drafters"):
            check_drafter(dflash2_config(), release)
    plain = dflash2_config(conv_kernel_size=None, conv_group_size=None, selector_rank=None, selector_top_k=None)
    check_drafter(plain, "1.3.0rc26")  # plain DFlash: untouched
    with pytest.raises(RecipeError, match="selector_top_k of 1"):
        check_drafter(dflash2_config(selector_top_k=1), "1.4.0rc1")


def test_the_release_table_s_dflash2_column_decides(monkeypatch):
    """``serves`` reads ``Release.dflash2``: True only on 1.4.0rc1 (PR #18155 in its tag, its notes say so);
    flipping a row's column flips the answer, and the refusal names the releases whose column is True."""
    import dataclasses

    from dflash_trt.plan import trtllm_releases as T

    assert [r.version for r in T.RELEASES if r.dflash2] == ["1.4.0rc1"] == trtllm_dflash2.serving_releases()
    assert "#18155" in T.KNOWN["1.4.0rc1"].notes and not trtllm_dflash2.serves("9.9.9")
    assert not hasattr(trtllm_dflash2, "SERVES")
    rows = tuple(dataclasses.replace(r, dflash2=r.version == "1.3.0rc27") for r in T.RELEASES)
    monkeypatch.setattr(T, "RELEASES", rows)
    monkeypatch.setattr(T, "KNOWN", {r.version: r for r in rows})
    assert trtllm_dflash2.serves("1.3.0rc27") and not trtllm_dflash2.serves("1.4.0rc1")
    with pytest.raises(RecipeError, match="set trtllm.release to 1.3.0rc27, or run"):
        check_drafter(dflash2_config(), "1.4.0rc1")


def test_the_family_dispatch_applies_the_layer_rule_to_a_dflash2_drafter():
    """DFlash2 has no attention override: its non-causal windows meet the rule every family shares."""
    cfg, rc1 = dflash2_config(), get_release("1.4.0rc1")
    assert drafter_attention_backend("auto", cfg, 90, rc1) == "FA4"
    assert drafter_attention_backend("auto", cfg, 100, rc1) == "VANILLA"
    assert drafter_attention_backend("VANILLA", cfg, 100, rc1) == "VANILLA"
    with pytest.raises(RecipeError, match="non-causal sliding window"):
        drafter_attention_backend("TRTLLM", cfg, 100, rc1)
    causal = dflash2_config(causal=True)  # a causal window TRTLLM runs
    assert drafter_attention_backend("auto", causal, 100, rc1) == "auto"


def _dflash2_recipe(tmp_path: Path, gpu: str, **sets) -> Path:
    """A complete DFlash2 recipe: the bundled Qwen3-8B target, its DFlash drafter's config made DFlash2
    (the published DFlash2 attention rule: every layer sliding, is_causal false)."""
    d = json.loads((CONFIGS / "z-lab--Qwen3-8B-DFlash-b16" / "config.json").read_text())
    d.update(
        architectures=["DFlash2DraftModel"],
        is_causal=False,
        layer_types=["sliding_attention"] * 5,
        sliding_window=2048,
        use_sliding_window=True,
    )
    d["dflash_config"].update(
        block_size=16, conv_kernel_size=2, conv_group_size=16, selector_rank=256, selector_top_k=16
    )
    (tmp_path / "drafter").mkdir()
    (tmp_path / "drafter" / "config.json").write_text(json.dumps(d))
    recipe = {
        "name": "qwen3-8b-dflash2",
        "target": {"id": "Qwen/Qwen3-8B", "config": str(CONFIGS / "Qwen--Qwen3-8B")},
        "drafter": {"id": "org/qwen3-8b-dflash2", "config": str(tmp_path / "drafter")},
        "gpu": {"name": gpu},
        "precision": {"weights": "fp8"},
        "serving": {"max_batch_size": 16},
        **sets,
    }
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


@pytest.mark.parametrize("gpu, backend", [("B200", "VANILLA"), ("H200", "FA4")])
def test_a_dflash2_recipe_plans_and_emits_the_dflash_config(tmp_path, gpu, backend):
    r = R.load_recipe(_dflash2_recipe(tmp_path, gpu))
    res = pipeline.resolve_recipe(r)
    p = pipeline.plan_resolved(res)
    assert p.attention_backend == backend and p.trtllm_release == "1.4.0rc1"
    spec = yaml.safe_load(trtllm.trtllm_yaml(trtllm.config(r, p, res.drafter)))["speculative_config"]
    assert spec["decoding_type"] == "DFlash" and spec["attention_backend"] == backend
    assert spec["max_draft_len"] <= 15 and spec["target_layer_ids"] == [1, 9, 17, 25, 33]


def test_a_dflash2_recipe_for_another_release_or_trtllm_attention_is_one_line(tmp_path, capsys):
    path = _dflash2_recipe(tmp_path, "B200", trtllm={"release": "1.3.0rc27"})
    assert run(["plan", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "TensorRT-LLM 1.3.0rc27 does not serve DFlash2" in err, err
    path.write_text(
        path.read_text().replace("release: 1.3.0rc27", "release: 1.4.0rc1")
        + "speculative: {attention_backend: TRTLLM}\n"
    )
    assert run(["plan", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "non-causal sliding window" in err, err


@pytest.mark.parametrize("name", ["qwen3.8-27b-dflash2-h200-fp8", "muse-glimmer-30b-dflash2-h200-fp8"])
def test_the_published_dflash2_recipes_are_incomplete_and_refused_in_one_line(name, capsys):
    r = R.load_recipe(name)
    assert r.incomplete and all("target.config" in x for x in r.incomplete)
    assert r.drafter.config and "DFlash2DraftModel" in (r.resolve_path(r.drafter.config) / "config.json").read_text()
    assert run(["plan", name]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"recipe {name}: its shipped configs lack" in err, err
    assert "incomplete" in r.to_yaml() and "incomplete" not in R.load_recipe("tiny").to_yaml()
