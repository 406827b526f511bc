"""A recipe for every published DFlash drafter; incomplete ones say so and refuse in one line."""

from __future__ import annotations

import pytest

from dflash_trt.deploy import pipeline
from dflash_trt.errors import RecipeError
from dflash_trt.model import DrafterConfig
from dflash_trt.plan import published
from dflash_trt.plan import recipe as R

# The 21 z-lab drafters (z-lab README at 94e4abc lists 20; Qwen3.5-397B-A17B is the 21st).
PUBLISHED = [
    "gemma-4-31B-it-DFlash",
    "gemma-4-26B-A4B-it-DFlash",
    "MiniMax-M2.7-DFlash",
    "MiniMax-M2.5-DFlash",
    "Kimi-K2.6-DFlash",
    "Kimi-K2.5-DFlash",
    "Qwen3.6-27B-DFlash",
    "Qwen3.6-35B-A3B-DFlash",
    "Qwen3.5-4B-DFlash",
    "Qwen3.5-9B-DFlash",
    "Qwen3.5-27B-DFlash",
    "Qwen3.5-35B-A3B-DFlash",
    "Qwen3.5-122B-A10B-DFlash",
    "gpt-oss-20b-DFlash",
    "gpt-oss-120b-DFlash",
    "Qwen3-Coder-Next-DFlash",
    "Qwen3-4B-DFlash-b16",
    "Qwen3-8B-DFlash-b16",
    "Qwen3-Coder-30B-A3B-DFlash",
    "LLaMA3.1-8B-Instruct-DFlash-UltraChat",
    "Qwen3.5-397B-A17B-DFlash",
]


def _recipes():
    return {name: R.load_recipe(path) for name, path in R.bundled_recipes().items()}


def test_every_published_drafter_has_a_recipe_with_its_config_shipped():
    recipes = _recipes()
    drafters = {r.drafter.id for r in recipes.values()}
    assert {f"z-lab/{d}" for d in PUBLISHED} <= drafters
    for r in recipes.values():
        if r.drafter.id in {f"z-lab/{d}" for d in PUBLISHED}:
            path = r.resolve_path(r.drafter.config)
            assert path is not None and path.is_dir(), r.name
            assert any(path.iterdir()), f"{r.name}: the drafter's config must ship with the recipe"
            # a pinned revision, or the recipe says it is unknown
            assert r.drafter.revision or any("drafter.revision" in f for f in r.incomplete), r.name


@pytest.mark.parametrize("name", sorted(R.bundled_recipes()))
def test_a_recipe_whose_configs_lack_fields_is_never_ready(name):
    """Every field the planner needs and a shipped config lacks keeps the recipe off ``ready``
    (the status is derived: ``incomplete`` only adds what the configs cannot show)."""
    r = R.load_recipe(name)
    missing = published.missing(r) + [
        f for f in r.incomplete if not f.startswith(("target.revision", "drafter.revision"))
    ]
    if missing:
        assert R_status(r).kind != "ready", f"{name}: configs lack {missing}"


def test_an_incomplete_recipe_refuses_offline_in_one_line_naming_the_fields(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    r = R.load_recipe("qwen3.5-9b-h100-fp8")
    with pytest.raises(RecipeError) as exc:
        pipeline.resolve_recipe(r)
    msg = str(exc.value)
    assert "\n" not in msg and "not in the Hugging Face cache" in msg and "target.linear_num_key_heads" in msg
    assert "hf download Qwen/Qwen3.5-9B" in msg


# The second wave (FACTS §13): every publisher's drafters, each with a derived status.
SECOND_WAVE = {
    "nvidia/Kimi-K2.6-DFlash",
    "nvidia/Kimi-K2.7-Code-DFlash",
    "nvidia/NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4-DFlash",
    "nvidia/NVIDIA-Nemotron-3.5-Bolt-DFlash",
    "nvidia/MiniMax-M2.7-DFlash",
    "modal-labs/Kimi-K3-DFlash",
    "RedHatAI/Qwen3-8B-speculator.dflash",
    "RedHatAI/Qwen3-30B-A3B-speculator.dflash",
    "RedHatAI/gemma-4-31B-it-speculator.dflash",
    "RedHatAI/DeepSeek-V4-Flash-speculator.dflash",
    "RedHatAI/Qwen3-8B-speculator.dflash2",
    "meta-models/Muse-Glimmer-30B-assistant",
    "poolside/Laguna-S-2.1-DFlash",
    "poolside/Laguna-XS-2.1-DFlash",
    "XiaomiMiMo/MiMo-V2.5-DFlash",
    "XiaomiMiMo/MiMo-V2.5-Pro-FP4-DFlash",
    "incoai/GLM-5.3-DFlash2",
    "z-lab/gemma4-12B-it-DFlash",
    "z-lab/Kimi-K2.7-Code-DFlash",
    "z-lab/GLM-5.1-FP8-DFlash",
    "z-lab/Alpamayo-R1-10B-DFlash",
}


def test_every_second_wave_drafter_has_a_recipe_with_a_derived_status():
    recipes = _recipes()
    by_drafter = {r.drafter.id: r for r in recipes.values()}
    assert SECOND_WAVE <= set(by_drafter)
    statuses = {d: R_status(by_drafter[d]) for d in SECOND_WAVE}
    assert all(s.kind in ("ready", "hub-only", "id-unconfirmed", "unsupported") for s in statuses.values())
    assert all(s.reason for s in statuses.values() if s.kind != "ready")
    # unsupported names what the runtime lacks: a family missing from its registry, or a refused format
    from dflash_trt import ingest

    for s in statuses.values():
        if s.kind == "unsupported" and "TARGET_FAMILIES" in s.reason:
            family = s.reason.split("target family ", 1)[1].split()[0]
            assert family not in ingest.TARGET_FAMILIES and ingest.target_family_of(family) is None, s.reason
    assert any(s.kind == "unsupported" for s in statuses.values())
    assert statuses["RedHatAI/Qwen3-8B-speculator.dflash"].kind == "hub-only"
    assert statuses["z-lab/Kimi-K2.7-Code-DFlash"].kind == "id-unconfirmed"


def test_the_status_follows_the_family_registry(monkeypatch):
    """A family in ingest.TARGET_FAMILIES makes its recipes buildable; without it they are unsupported."""
    from dflash_trt import ingest
    from dflash_trt.ingest import families

    r = R.load_recipe("laguna-xs-2.1-poolside-b200")
    assert R_status(r).kind == "hub-only"
    monkeypatch.delitem(ingest.TARGET_FAMILIES, "laguna")
    monkeypatch.setattr(families, "_BY_MODEL_TYPE", {k: v for k, v in families._BY_MODEL_TYPE.items() if v != "laguna"})
    status = R_status(r)
    assert status.kind == "unsupported" and "laguna" in status.reason


def R_status(r):
    from dflash_trt.plan import recipe_status

    return recipe_status(r)


@pytest.mark.parametrize(
    "name", ["qwen3.5-4b-h100-bf16", "gpt-oss-20b-h100", "qwen3-4b-h100-fp8", "qwen3-coder-30b-a3b-h200-fp8"]
)
def test_the_new_complete_recipes_plan_offline(name):
    p = pipeline.plan_resolved(pipeline.resolve_recipe(R.load_recipe(name)))
    assert p.memory.fits and 1 <= p.max_draft_len < p.block_size


def test_the_qwen35_drafter_traits_are_read_as_published():
    """8 taps on 6 layers, 5 sliding + 1 full with the drafter's own 4096 window, block 16 only
    inside dflash_config, theta 1e7 only in rope_parameters."""
    import json

    path = R.load_recipe("qwen3.5-4b-h100-bf16").resolve_path("configs/z-lab--Qwen3.5-4B-DFlash")
    raw = json.loads((path / "config.json").read_text())
    assert "block_size" not in raw and "rope_theta" not in raw  # the traits this test is about
    c = DrafterConfig.from_zlab(raw)
    assert (len(c.target_layer_ids), c.num_hidden_layers, c.block_size) == (8, 6, 16)
    assert c.layer_types == ["sliding_attention"] * 5 + ["full_attention"] and c.sliding_window == 4096
    assert c.rope_theta == 1e7 and c.mask_token_id == 248077


def test_the_gemma_and_kimi_drafter_traits_are_read_as_published():
    import json

    gemma = R.load_recipe("gemma-4-26b-a4b-b200-nvfp4").resolve_path("configs/z-lab--gemma-4-26B-A4B-it-DFlash")
    g = DrafterConfig.from_zlab(json.loads((gemma / "config.partial.json").read_text()))
    assert g.final_logit_softcapping == 30.0 and g.sliding_window == 2048 and len(g.target_layer_ids) == 6
    kimi = R.load_recipe("kimi-k2.5-8xh200-int4").resolve_path("configs/z-lab--Kimi-K2.5-DFlash")
    raw = json.loads((kimi / "config.partial.json").read_text())
    k = DrafterConfig.from_zlab({**raw, "block_size": 8})
    assert k.rope_scaling["rope_type"] == "yarn" and k.rope_scaling["factor"] == 64.0


def test_recipes_list_shows_each_status_at_80_columns(monkeypatch, capsys):
    """Every recipe's name (the handle users copy) and its derived status fit 80 columns whole."""
    from dflash_trt._cli.common import out
    from dflash_trt.cli import run

    monkeypatch.setattr(out, "width", 80)
    assert run(["recipes", "list"]) == 0
    text = capsys.readouterr().out
    rows = {
        line.split("│")[1].strip(): line.split("│")[4].strip()
        for line in text.splitlines()
        if line.startswith("│") and line.split("│")[1].strip()
    }
    for name, path in R.bundled_recipes().items():
        assert rows.get(name) == R_status(R.load_recipe(path)).kind, name
    assert max(len(line) for line in text.splitlines() if line.startswith(("│", "┃"))) <= 80
