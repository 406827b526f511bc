"""The one path rule (issue 27): typed on the command line -> relative to the working directory;
written in a recipe -> relative to the recipe file; a recipe's id is local only with ./ ../ / ~."""

from __future__ import annotations

from pathlib import Path

import yaml

from dflash_trt.cli import run
from dflash_trt.plan import recipe as R


def _recipe(tmp_path: Path, **sections) -> Path:
    base = yaml.safe_load(R.bundled_recipes()["tiny"].read_text())
    for k, v in sections.items():
        base[k] = {**base.get(k, {}), **v}
    d = tmp_path / "recipes"
    d.mkdir(exist_ok=True)
    (d / "r.yaml").write_text(yaml.safe_dump(base))
    return d / "r.yaml"


def test_recipe_values_follow_the_file_and_typed_values_the_working_directory(tmp_path, monkeypatch):
    f = _recipe(
        tmp_path,
        precision={"calib": "data/c.txt"},
        target={"id": "./models/t", "config": "cfg/t"},
        drafter={"id": "org/drafter"},
    )
    work = tmp_path / "work"
    (work / "org" / "drafter").mkdir(parents=True)  # a same-named local directory does not make it local
    monkeypatch.chdir(work)
    r = R.load_recipe(str(f))
    assert r.precision.calib == str(f.parent / "data/c.txt")
    assert (r.target.id, r.target.config) == (str(f.parent / "models/t"), str(f.parent / "cfg/t"))
    assert r.drafter.id == "org/drafter"
    r = R.load_recipe(
        str(f),
        overrides=["precision.calib=mine.txt", "target.config=../cfg"],
        fields=[R.FieldValue("drafter.id", "./d", "--drafter")],
    )
    assert r.precision.calib == str(work / "mine.txt") and r.target.config == str(work / "../cfg")
    assert r.drafter.id == str(work / "d")


def test_a_relative_calib_flag_on_a_bundled_recipe_is_the_working_directorys(tmp_path, monkeypatch):
    """Before: the bundled recipe's directory (inside the installed package) was used."""
    from dflash_trt._cli.build import recipe_from_flags

    monkeypatch.chdir(tmp_path)
    r = recipe_from_flags("tiny", None, None, {"--calib": "calib.txt"}, None)
    assert r.resolve_path(r.precision.calib) == tmp_path / "calib.txt"


def test_a_recipe_id_without_a_local_prefix_is_a_hub_id(tmp_path, monkeypatch, capsys):
    """A recipe id 'models/t' naming a directory of the working directory is still a hub id (offline here:
    one line), never the local directory."""
    import shutil

    from dflash_trt.ingest import embedded_dir

    f = _recipe(tmp_path, target={"id": "models/t"})
    monkeypatch.chdir(tmp_path)
    shutil.copytree(embedded_dir("tiny") / "target", tmp_path / "models" / "t")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    assert run(["build", str(f), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "models/t" in err, err


def test_the_rule_is_in_help(capsys):
    assert run(["build", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "relative to the working directory" in text and "./, ../, / or ~" in text
