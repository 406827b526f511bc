"""Recipes: strict keys reported with file and path, --set overrides, bundled recipes, the recipes CLI."""

from __future__ import annotations

import pytest
import yaml

from dflash_trt.build import recipe as R
from dflash_trt.cli import run
from dflash_trt.errors import RecipeError

BASE = {"name": "x", "target": {"id": "org/t"}, "drafter": {"id": "org/d"}}


def write(tmp_path, data, name="r.yaml"):
    p = tmp_path / name
    p.write_text(yaml.safe_dump(data))
    return p


def test_unknown_key_is_reported_with_file_and_path(tmp_path):
    p = write(tmp_path, {**BASE, "serving": {"max_batch_sise": 8}})
    with pytest.raises(RecipeError) as e:
        R.load(p)
    assert str(p) in str(e.value) and "serving.max_batch_sise" in str(e.value) and "unknown key" in str(e.value)


def test_bad_value_and_missing_key(tmp_path):
    with pytest.raises(RecipeError, match=r"precision\.weights"):
        R.load(write(tmp_path, {**BASE, "precision": {"weights": "int3"}}))
    with pytest.raises(RecipeError, match=r"drafter: required key is missing"):
        R.load(write(tmp_path, {"name": "x", "target": {"id": "t"}}, "m.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(RecipeError, match="invalid YAML"):
        R.load(bad)


def test_set_overrides_parse_values_and_create_sections(tmp_path):
    p = write(tmp_path, BASE)
    r = R.load(p, ["serving.max_batch_size=32", "precision.weights=fp8", "speculative.draft_len_schedule={1: 7, 8: 3}",
                   "gpu.name=H100"])
    assert r.serving.max_batch_size == 32 and isinstance(r.serving.max_batch_size, int)
    assert r.precision.weights == "fp8" and r.gpu.name == "H100"
    assert r.speculative.draft_len_schedule == {1: 7, 8: 3}
    with pytest.raises(RecipeError, match="KEY=VALUE"):
        R.load(p, ["serving.max_batch_size"])
    with pytest.raises(RecipeError, match="serving.max_batch_size"):
        R.load(p, ["serving.max_batch_size=-1"])
    with pytest.raises(RecipeError, match="not a section"):
        R.load(p, ["name.sub=1"])


def test_relative_config_paths_resolve_against_the_recipe_file(tmp_path):
    p = write(tmp_path, {**BASE, "target": {"id": "org/t", "config": "cfg/t"}})
    r = R.load(p)
    assert r.resolve_path(r.target.config) == tmp_path / "cfg" / "t"


def test_every_bundled_recipe_loads_and_round_trips():
    names = R.bundled()
    assert {"tiny", "qwen3-8b-b200-nvfp4", "qwen3-8b-h100-fp8", "llama3.1-8b-h100-fp8", "gpt-oss-120b-8xh200"} <= set(names)
    for name in names:
        r = R.load(name)
        again = R.from_dict(yaml.safe_load(r.to_yaml()), where=name)
        assert again == r.model_copy(update={"source": None}) or again.model_dump() == r.model_dump()


def test_recipes_cli(tmp_path, capsys):
    assert run(["recipes", "list"]) == 0
    assert "qwen3-8b-b200-nvfp4" in capsys.readouterr().out
    assert run(["recipes", "show", "qwen3-8b-h100-fp8", "--set", "serving.max_batch_size=16"]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)
    assert shown["serving"]["max_batch_size"] == 16 and shown["gpu"]["name"] == "H100"
    dest = tmp_path / "mine.yaml"
    assert run(["recipes", "copy", "tiny", str(dest)]) == 0
    assert R.load(dest).name == "tiny"
    assert run(["recipes", "copy", "tiny", str(dest)]) == 2          # never overwrites
    capsys.readouterr()
    bad = write(tmp_path, {**BASE, "enginee": "trtllm"}, "bad.yaml")
    assert run(["recipes", "validate", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "enginee" in err
