"""Recipes: strict keys reported with file and path, --set overrides, bundled recipes, the recipes CLI."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from dflash_trt.cli import run
from dflash_trt.errors import RecipeError
from dflash_trt.plan import recipe as R

BASE = {"name": "x", "target": {"id": "org/t"}, "drafter": {"id": "org/d"}}


def write(tmp_path, data, name="r.yaml"):
    p = tmp_path / name
    p.write_text(yaml.safe_dump(data))
    return p


def test_unknown_key_is_reported_with_file_and_path(tmp_path):
    p = write(tmp_path, {**BASE, "serving": {"max_batch_sise": 8}})
    with pytest.raises(RecipeError) as e:
        R.load_recipe(p)
    assert str(p) in str(e.value) and "serving.max_batch_sise" in str(e.value) and "unknown key" in str(e.value)


def test_bad_value_and_missing_key(tmp_path):
    with pytest.raises(RecipeError, match=r"precision\.weights"):
        R.load_recipe(write(tmp_path, {**BASE, "precision": {"weights": "int3"}}))
    with pytest.raises(RecipeError, match=r"drafter: required key is missing"):
        R.load_recipe(write(tmp_path, {"name": "x", "target": {"id": "t"}}, "m.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(RecipeError, match="invalid YAML"):
        R.load_recipe(bad)


def test_set_overrides_parse_values_and_create_sections(tmp_path):
    p = write(tmp_path, BASE)
    r = R.load_recipe(
        p,
        [
            "serving.max_batch_size=32",
            "precision.weights=fp8",
            "speculative.draft_len_schedule={1: 7, 8: 3}",
            "gpu.name=H100",
        ],
    )
    assert r.serving.max_batch_size == 32 and isinstance(r.serving.max_batch_size, int)
    assert r.precision.weights == "fp8" and r.gpu.name == "H100"
    assert r.speculative.draft_len_schedule == {1: 7, 8: 3}
    with pytest.raises(RecipeError, match="KEY=VALUE"):
        R.load_recipe(p, ["serving.max_batch_size"])
    with pytest.raises(RecipeError, match="serving.max_batch_size"):
        R.load_recipe(p, ["serving.max_batch_size=-1"])
    with pytest.raises(RecipeError, match="not a section"):
        R.load_recipe(p, ["name.sub=1"])


def test_relative_config_paths_resolve_against_the_recipe_file(tmp_path):
    p = write(tmp_path, {**BASE, "target": {"id": "org/t", "config": "cfg/t"}})
    r = R.load_recipe(p)
    assert r.resolve_path(r.target.config) == tmp_path / "cfg" / "t"


def test_every_bundled_recipe_loads_and_round_trips():
    names = R.bundled_recipes()
    assert {"tiny", "qwen3-8b-b200-nvfp4", "qwen3-8b-h100-fp8", "llama3.1-8b-h100-fp8", "gpt-oss-120b-8xh200"} <= set(
        names
    )
    for name in names:
        r = R.load_recipe(name)
        again = R.recipe_from_dict(yaml.safe_load(r.to_yaml()), where=name)
        assert again == r.model_copy(update={"source": None}) or again.model_dump() == r.model_dump()


def test_recipes_cli(tmp_path, capsys):
    assert run(["recipes", "list"]) == 0
    assert "qwen3-8b-b200-nvfp4" in capsys.readouterr().out
    assert run(["recipes", "show", "qwen3-8b-h100-fp8", "--set", "serving.max_batch_size=16"]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)
    assert shown["serving"]["max_batch_size"] == 16 and shown["gpu"]["name"] == "H100"
    dest = tmp_path / "mine.yaml"
    assert run(["recipes", "copy", "tiny", str(dest)]) == 0
    assert R.load_recipe(dest).name == "tiny"
    assert run(["recipes", "copy", "tiny", str(dest)]) == 2  # never overwrites
    capsys.readouterr()
    bad = write(tmp_path, {**BASE, "enginee": "trtllm"}, "bad.yaml")
    assert run(["recipes", "validate", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "enginee" in err


# --- command-line flags: typed fields, never YAML ---------------------------------------


def test_flags_land_in_typed_fields_without_yaml():
    from dflash_trt._cli.build import recipe_from_flags

    flags = {
        "--gpu": "100",
        "--gpus-per-node": 2,
        "--precision": "fp8",
        "--kv-cache-dtype": "fp8",
        "--calib": "calib #1.txt",
        "--graphs": True,
    }
    r = recipe_from_flags("qwen3-8b-h100-fp8", "org/t", None, flags, None)
    # YAML would have read "100" as an int (refused for a name) and cut "calib #1.txt" at the comment.
    assert r.gpu.name == "100" and r.gpu.count == 2 and isinstance(r.gpu.count, int)
    calib = str(Path.cwd() / "calib #1.txt")  # typed on the command line: relative to the working directory
    assert (r.precision.weights, r.precision.kv_cache, r.precision.calib) == ("fp8", "fp8", calib)
    assert r.graphs is True
    assert (r.target.id, r.target.config, r.target.revision) == ("org/t", None, None)  # the recipe's config dir goes
    assert r.drafter == R.load_recipe("qwen3-8b-h100-fp8").drafter
    # Without a recipe: named after the target and precision; --set still applies after the flags.
    r = recipe_from_flags(
        None,
        "some/dir/my-target/",
        "org/d",
        {"--precision": "nvfp4"},
        ["precision.weights=bf16", "serving.max_batch_size=8"],
    )
    assert r.name == "my-target-nvfp4" and r.precision.weights == "bf16" and r.serving.max_batch_size == 8
    assert r.source is None


def test_graphs_flag_sets_the_recipe_key(tmp_path, monkeypatch):
    """``build --graphs`` and ``--set graphs=true`` set ``graphs``; without either the recipe's own
    (the old ``engine`` spellings are gone: tests/test_removed_spellings.py)."""
    from dflash_trt import deploy
    from dflash_trt.errors import DFlashError

    seen = []

    def build(recipe, *args, **kw):  # the recipe the command resolved, then stop before any work
        seen.append(recipe.graphs)
        raise DFlashError("stop")

    monkeypatch.setattr(deploy, "build", build)
    for argv in (["--graphs"], [], ["--set", "graphs=true"]):
        assert run(["build", *argv, "--dry-run"]) == 2
    assert seen == [True, False, True]
    r = R.load_recipe(write(tmp_path, {**BASE, "graphs": True}))
    assert r.graphs is True and yaml.safe_load(r.to_yaml())["graphs"] is True


def test_a_bad_flag_value_is_one_line_naming_the_flag(tmp_path, capsys):
    p = write(tmp_path, BASE)
    with pytest.raises(RecipeError, match=r"^--gpus-per-node 0: Input should be greater than or equal to 1$"):
        R.load_recipe(p, fields=[R.FieldValue("gpu.count", 0, "--gpus-per-node")])
    # A --set on the same key wins over the flag, so its error names the key, not the flag.
    with pytest.raises(RecipeError, match=rf"^{re.escape(str(p))}: gpu.count: Input should be greater"):
        R.load_recipe(p, ["gpu.count=-1"], fields=[R.FieldValue("gpu.count", 2, "--gpus-per-node")])
    for argv, flag in (
        (["plan", "--precision", "fp16"], "--precision 'fp16'"),
        (["plan", "qwen3-8b-h100-fp8", "--kv-cache-dtype", "int4"], "--kv-cache-dtype 'int4'"),
    ):
        assert run(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith(f"error: {flag}: Input should be"), err
