"""The chat template and thinking switch a deployment serves with, against the drafter's training."""

from __future__ import annotations

import json
import shutil

import pytest

from dflash_trt import ingest
from dflash_trt.cli import run

TEMPLATE = "{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}{{ messages }}"


@pytest.fixture
def thinking_pair(tiny_pair_dir, tmp_path):
    """The tiny pair with a thinking switch in the target's template and a drafter whose
    training.json says it was trained with thinking off."""
    tdir, ddir = (tmp_path / "target", tmp_path / "drafter")
    shutil.copytree(tiny_pair_dir[0], tdir)
    shutil.copytree(tiny_pair_dir[1], ddir)
    cfg = json.loads((tdir / "tokenizer_config.json").read_text())
    (tdir / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": TEMPLATE}))
    (ddir / "training.json").write_text(json.dumps({"settings": {"chat_template_kwargs": {"enable_thinking": False}}}))
    return tdir, ddir


def test_what_a_drafter_was_trained_with_and_when_it_differs(thinking_pair):
    tdir, ddir = thinking_pair
    trained = ingest.trained_chat(ddir)
    assert trained == {"enable_thinking": False}
    default = ingest.serving_chat(tdir, None)
    assert default["thinking_switch"] is True and len(default["chat_template_sha256"]) == 64
    assert "set serving.enable_thinking: false" in ingest.chat_mismatch(trained, default)
    assert ingest.chat_mismatch(trained, ingest.serving_chat(tdir, False)) is None
    assert "serves enable_thinking=true" in ingest.chat_mismatch(trained, ingest.serving_chat(tdir, True))
    assert ingest.chat_mismatch(None, default) is None  # the drafter does not say: nothing to compare
    assert ingest.chat_mismatch(trained, {"thinking_switch": False, "enable_thinking": None}) is None


def test_plan_warns_in_one_line_and_the_bundle_records_the_setting(thinking_pair, tmp_path, capsys):
    tdir, ddir = thinking_pair
    args = ["plan", "--target", str(tdir), "--drafter", str(ddir), "--gpu", "cpu"]
    assert run(args) == 0
    warned = [ln for ln in capsys.readouterr().err.splitlines() if "enable_thinking" in ln]
    assert len(warned) == 1 and "trained with enable_thinking=false" in warned[0]
    assert run(args + ["--set", "serving.enable_thinking=false"]) == 0
    assert "enable_thinking" not in capsys.readouterr().err
    out = tmp_path / "bundle"
    assert (
        run(
            [
                "build",
                "--target",
                str(tdir),
                "--drafter",
                str(ddir),
                "--gpu",
                "cpu",
                "-o",
                str(out),
                "--set",
                "serving.enable_thinking=false",
            ]
        )
        == 0
    )
    serve = json.loads((out / "manifest.json").read_text())["serve"]
    assert serve["enable_thinking"] is False and serve["thinking_switch"] is True
    assert serve["drafter_chat"] == {"enable_thinking": False} and serve["chat_template_sha256"]


def test_serve_warns_when_the_bundle_serves_another_setting(thinking_pair, tmp_path, capsys):
    tdir, ddir = thinking_pair
    out = tmp_path / "bundle"
    assert run(["build", "--target", str(tdir), "--drafter", str(ddir), "--gpu", "cpu", "-o", str(out)]) == 0
    capsys.readouterr()
    assert run(["serve", str(out), "--dry-run"]) == 0
    warned = [ln for ln in capsys.readouterr().err.splitlines() if "enable_thinking" in ln]
    assert len(warned) == 1
