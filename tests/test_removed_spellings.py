"""The old spellings CHANGELOG.md lists as removed are refused like any unknown option or key
(one line, exit 2), and the changelog names each one; the ``deprecated`` helper for after a
release warns once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dflash_trt.cli import run

CHANGELOG = (Path(__file__).resolve().parents[1] / "CHANGELOG.md").read_text()

#: (argv, what the one stderr line says, how CHANGELOG.md spells the removed form)
REMOVED = [
    (["serve", "dflash-out/none", "--runtime", "reference"], "No such option: --runtime", "serve --runtime"),
    (["build", "--engine", "tensorrt", "--dry-run"], "No such option: --engine", "build --engine tensorrt"),
    (["build", "--engine", "trtllm", "--dry-run"], "No such option: --engine", "build --engine trtllm"),
    (["build", "--gpus", "2", "--dry-run"], "No such option: --gpus", "build --gpus N"),
    (["plan", "tiny", "--gpus", "2"], "No such option: --gpus", "plan --gpus N"),
    (["generate", "--bundle", "dflash-out/none", "-p", "hi"], "No such option: --bundle", "generate --bundle OUT"),
    (["bench", "--bundle", "dflash-out/none"], "No such option: --bundle", "bench --bundle OUT"),
    (["build", "--set", "engine=tensorrt", "--dry-run"], "engine: unknown key", "--set engine=..."),
    (
        ["generate", "-p", "hi", "--max-new-tokens", "4"],
        "No such option: --max-new-tokens",
        "generate --max-new-tokens",
    ),
    (["bench", "--max-new-tokens", "4"], "No such option: --max-new-tokens", "bench --max-new-tokens"),
    (["serve", "dflash-out/none", "--batching", "static"], "No such option: --batching", "serve --batching"),
    (["generate", "-p", "hi", "--kernels", "reference"], "'reference'", "--kernels reference"),
]


@pytest.mark.parametrize("argv, says, listed", REMOVED, ids=[" ".join(r[0][:3]) for r in REMOVED])
def test_a_removed_spelling_is_an_unknown_option(argv, says, listed, capsys):
    assert run(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err, err
    assert f"`{listed}" in CHANGELOG.replace("\\|", "|"), f"CHANGELOG.md does not list {listed!r} as removed"


def test_the_old_recipe_key_engine_is_unknown(tmp_path, capsys):
    import yaml

    from dflash_trt import plan as R

    data = yaml.safe_load(Path(R.bundled_recipes()["tiny"]).read_text())
    data["engine"] = "tensorrt"
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(data))
    assert run(["plan", str(tmp_path / "old.yaml")]) == 2
    assert "engine: unknown key" in capsys.readouterr().err
    assert "recipe key `engine: tensorrt|trtllm`" in CHANGELOG.replace("\\|", "|")


def test_planner_files_with_the_old_key_are_refused(tmp_path, capsys):
    from dflash_trt.plan import perf_model as M

    old = {("engines" if k == "stacks" else k): v for k, v in M.shipped_calibration().as_dict().items()}
    (tmp_path / "cal.json").write_text(json.dumps(old))
    with pytest.raises(Exception, match="not a dflash-trt calibration"):
        M.Calibration.from_dict(old)
    assert "the key `engines`" in CHANGELOG and "the key `engine`" in CHANGELOG


def test_the_manifest_s_engine_section_is_graphs():
    """Bundle format 4 renamed the section (the Python names with it); the changelog lists both."""
    from dflash_trt import ingest

    assert not hasattr(ingest, "EngineInfo") and "engine" not in ingest.Manifest.model_fields
    assert ingest.Manifest.model_fields["graphs"].annotation == ingest.GraphsInfo | None
    assert "`ingest.EngineInfo`, `Manifest.engine`; the manifest key `engine`" in CHANGELOG


def test_alias_warning_warns_once_naming_the_release(capsys):
    from dflash_trt import deprecated

    assert deprecated.alias_warning("--old-flag-for-test", "--new-flag", "0.3.0") is True
    assert deprecated.alias_warning("--old-flag-for-test", "--new-flag", "0.3.0") is False
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--new-flag" in err and "0.3.0" in err
