"""The manifest's recipe, typed: ``build`` stores a ``Recipe`` and the JSON stays what it was; a
stored recipe today's ``Recipe`` refuses is one line saying to rebuild from the typed reader, while
the bundle still reads, serves and runs through ``ingest`` as before."""

from __future__ import annotations

import json
import shutil

import pytest

from dflash_trt import deploy, ingest, plan
from dflash_trt.cli import run
from dflash_trt.errors import CheckpointError


@pytest.fixture(scope="module")
def built(tiny_pair_dir, tmp_path_factory):
    tdir, ddir = tiny_pair_dir
    out = tmp_path_factory.mktemp("bundle") / "tiny"
    assert run(["build", "-t", str(tdir), "-d", str(ddir), "-o", str(out), "--set", "serving.max_seq_len=256"]) == 0
    return out


def test_build_stores_the_recipe_typed_and_the_json_is_the_envelope_s(built, tiny_pair_dir):
    b = ingest.open_bundle(built)
    m = plan.read_bundle_manifest(b)
    assert isinstance(m, plan.BundleManifest) and isinstance(m.recipe, plan.Recipe)
    assert m.recipe.serving.max_seq_len == 256 and m.recipe.target.id == str(tiny_pair_dir[0].resolve())
    assert m.recipe.gpu.name == "cpu" and m.recipe.graphs is False  # defaults stored too, typed
    # the typed view serialises to the very JSON on disk: the recipe in full, no incomplete or source
    text = (built / ingest.Layout.MANIFEST).read_text()
    assert json.dumps(m.to_json(), indent=2) + "\n" == text
    assert m.to_json()["recipe"] == b.manifest.recipe and "incomplete" not in b.manifest.recipe
    assert m.plan == b.manifest.plan and m.graphs is None  # every other field as ingest read it


def test_a_recipe_today_s_recipe_refuses_is_read_as_today_or_told_to_rebuild(built, tmp_path, capsys):
    """A format-3 bundle built while the recipe key ``engine`` existed (removed 2026-12-01)."""
    old = shutil.copytree(built, tmp_path / "old")
    path = old / ingest.Layout.MANIFEST
    data = json.loads(path.read_text())
    data["format"] = "dflash-trt-bundle/3"
    data["recipe"]["engine"] = "trtllm"
    path.write_text(json.dumps(data, indent=2) + "\n")
    # read as today: the envelope keeps the recipe as stored, the plan typed; it serves and runs
    b = ingest.open_bundle(old)
    assert b.manifest.recipe["engine"] == "trtllm" and b.manifest.plan.tp == 1
    assert run(["serve", str(old), "--dry-run"]) == 0
    capsys.readouterr()
    # the typed reader, and the bundle check that uses it, tell it to rebuild in one line
    with pytest.raises(CheckpointError) as exc:
        plan.read_bundle_manifest(b)
    msg = str(exc.value)
    assert "recipe.engine" in msg and "rebuild the bundle with 'dflash-trt build'" in msg and "\n" not in msg
    with pytest.raises(CheckpointError, match=r"recipe\.engine.*rebuild"):
        deploy.check_trtllm_bundle(old)
    assert deploy.check_trtllm_bundle(built)["precision"] == "bf16"  # today's build passes it
