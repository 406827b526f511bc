"""The drafters published since the catalog (FACTS §15) each have a recipe with a derived status;
GGUF-only and refused-format ones are refused by name; every recipe pins its drafter's revision
or says it is unknown, and build warns when a hub id comes without one (z-lab/dflash issue #152:
a drafter retrained under the same id changed acceptance several-fold)."""

from __future__ import annotations

import pytest

from dflash_trt import plan as R
from dflash_trt.cli import run

SINCE_CATALOG = {  # FACTS §15, "Drafters since the catalog" (and JetSpec's drafter from "formats")
    "z-lab/gemma4-12B-it-DFlash",
    "deepseek-ai/dflash_gemma4_12b_block7",
    "RedHatAI/GLM-5.3-speculator.dflash2-preview",
    "RedHatAI/Qwen3.5-397B-A17B-speculator.dflash",
    "RedHatAI/Qwen3.5-397B-A17B-FP8-dynamic-speculator.dflash",
    "RedHatAI/Qwen3-30B-A3B-Instruct-2507-speculator.dflash",
    "RadixArk/Muse-Spark-Open-DFlash2",
    "incoai/GLM-5.3-Flash-DFlash2",
    "poolside/Laguna-XS.2-speculator.dflash",
    "JetSpec/jetspec-qwen3-8b",
    "nvidia/NVIDIA-Nemotron-3.5-Bolt-E4B-4GB-DFlash",
    "incoai/Qwen3.8-27B-DFlash2-GGUF",
}
BY_NAME = {
    "nvidia/NVIDIA-Nemotron-3.5-Bolt-E4B-4GB-DFlash": "GGUF only",
    "incoai/Qwen3.8-27B-DFlash2-GGUF": "GGUF only",
    "deepseek-ai/dflash_gemma4_12b_block7": "Gemma-4 backbone",
}


def _recipes():
    return {name: R.load_recipe(path) for name, path in R.bundled_recipes().items()}


def test_every_drafter_since_the_catalog_has_a_recipe_with_a_derived_status():
    by_drafter = {r.drafter.id.split("@")[0]: r for r in _recipes().values()}
    assert SINCE_CATALOG <= set(by_drafter), sorted(SINCE_CATALOG - set(by_drafter))
    for ref in SINCE_CATALOG:
        status = R.recipe_status(by_drafter[ref])
        if ref in BY_NAME:
            assert status.kind == "unsupported" and BY_NAME[ref] in status.reason, (ref, status)
        else:
            assert status.kind in ("hub-only", "id-unconfirmed"), (ref, status)  # incomplete: no revision recorded


@pytest.mark.parametrize("name", sorted(R.bundled_recipes()))
def test_every_recipe_pins_its_drafter_or_says_the_revision_is_unknown(name):
    r = R.load_recipe(R.bundled_recipes()[name])
    d = r.drafter
    local = d.id.startswith("embedded:") or "/" not in d.id
    assert local or d.revision or "@" in d.id or any(f.startswith("drafter.revision") for f in r.incomplete), name


@pytest.mark.parametrize(
    "name, needle",
    [("qwen3.8-27b-dflash2-gguf", "z-lab/Qwen3.8-27B-DFlash2"), ("gemma-4-12b-deepseek-b7-h100", "Gemma-4 backbone")],
)
def test_a_drafter_refused_by_name_stops_build_in_one_line(name, needle, capsys):
    assert run(["build", name, "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err and "Traceback" not in err


def test_build_warns_on_a_hub_drafter_without_a_revision(capsys):
    assert run(["build", "qwen3-8b-h100-fp8", "--dry-run"]) == 0  # pinned: no warning
    assert "without a revision" not in capsys.readouterr().err
    assert run(["build", "qwen3-8b-h100-fp8", "--dry-run", "--set", "drafter.revision=null"]) == 0
    err = capsys.readouterr().err
    assert "z-lab/Qwen3-8B-DFlash-b16 is a hub id without a revision" in err and "issue #152" in err
    assert (
        run(
            [
                "build",
                "--target",
                "embedded:tiny/target",
                "--drafter",
                "embedded:tiny/drafter",
                "--gpu",
                "cpu",
                "--dry-run",
            ]
        )
        == 0
    )  # a local or embedded drafter: nothing to pin
    assert "without a revision" not in capsys.readouterr().err
