"""Drafter formats that load and then run wrong somewhere (``ingest.format_guards``): each is named,
and runs where it runs right (JetSpec in dflash-trt's runtime, lossless) or is refused in one line
for the path that would run it wrong. Every refusal is held against the valid drafters that must
still pass: z-lab (plain, and with causal sliding layers), speculators with non-causal sliding
layers (``is_causal: false`` in the z-lab form) and DFlash2."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from dflash_trt import ingest
from dflash_trt.cli import run
from dflash_trt.errors import CheckpointError
from dflash_trt.runtime import SamplingParams, generate, load_pair


def _edit(src, dst, edit):
    d = shutil.copytree(src, dst)
    cfg = json.loads((d / "config.json").read_text())
    edit(cfg)
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def _set(**dflash):
    return lambda cfg: cfg["dflash_config"].update(dflash)


def _sliding(cfg):  # z-lab Qwen3.6-era: sliding layers (causal by default) beside full ones
    n = cfg["num_hidden_layers"]
    cfg.update(layer_types=["sliding_attention"] * (n - 1) + ["full_attention"], sliding_window=16)


@pytest.fixture
def valid(tiny_pair_dir, tmp_path):
    """The valid drafters every refusal is held against: {name: directory}."""
    from transformers import AutoModelForCausalLM

    from tests.helpers import tiny_drafter
    from tests.ingest.formats_writers import write_speculators

    _, zlab = tiny_pair_dir
    d = tiny_drafter(AutoModelForCausalLM.from_pretrained(tiny_pair_dir[0]).eval(), seed=7)
    spec = write_speculators(tmp_path / "spec", d.cfg, d.state_dict())
    cfg = json.loads((spec / "config.json").read_text())
    cfg["transformer_layer_config"].update(
        layer_types=["sliding_attention"] * d.cfg.num_hidden_layers, sliding_window=16
    )
    cfg.pop("sliding_window_non_causal", None)  # speculators 0.9: absent means non-causal windows
    (spec / "config.json").write_text(json.dumps(cfg))
    return {
        "zlab": zlab,
        "zlab-sliding": _edit(zlab, tmp_path / "sliding", _sliding),
        "speculators": spec,
        "dflash2": ingest.embedded_dir("tiny") / "drafter",
    }


def test_valid_drafters_still_pass(valid):
    formats = {name: ingest.read_drafter(path) for name, path in valid.items()}
    assert {n: s.format for n, s in formats.items()} == {
        "zlab": "zlab-v1",
        "zlab-sliding": "zlab-v1",
        "speculators": "speculators",
        "dflash2": "dflash2",
    }
    assert formats["speculators"].config.causal is False  # non-causal sliding layers, not JetSpec
    sliding = formats["zlab-sliding"].config
    last = sliding.num_hidden_layers - 1
    assert sliding.causal is None and sliding.layer_causal(0) and not sliding.layer_causal(last)
    assert all(ingest.trtllm_refusal(s.config.causal) is None for s in formats.values())


@pytest.mark.parametrize(
    "edit, needle",
    [
        (_set(projector_type="lilicorr"), "LiLiCorr drafter"),
        (lambda c: c.update(correlator_hidden_size=64), "LiLiCorr drafter"),
        (_set(attention_mode="mla"), "MLA DFlash drafter"),
        (lambda c: c.update(architectures=["KimiK3DFlashDraftModel"], kv_lora_rank=32), "MLA DFlash drafter"),
        (lambda c: c.update(model_type="gemma4_text"), "Gemma-4 backbone"),
    ],
)
def test_formats_no_path_runs_right_are_refused_by_name(valid, tmp_path, edit, needle, capsys):
    bad = _edit(valid["zlab"], tmp_path / "bad", edit)
    with pytest.raises(CheckpointError, match=needle):
        ingest.read_drafter(bad)
    assert run(["inspect", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err and "Traceback" not in err


def test_the_nemo_alias_is_read_as_zlab(valid, tmp_path):
    d = _edit(valid["zlab"], tmp_path / "nemo", lambda c: c.update(architectures=["Qwen3DFlashDraftModel"]))
    spec = ingest.read_drafter(d)
    assert spec.format == "zlab-v1" and any("Qwen3DFlashDraftModel" in n for n in spec.norm.notes)
    assert spec.config.to_zlab()["architectures"] == ["DFlashDraftModel"]  # what the bundle ships


def test_jetspec_runs_lossless_in_our_runtime_and_is_refused_for_trtllm(tiny_pair_dir, valid, tmp_path, capsys):
    target, zlab = tiny_pair_dir
    jet = _edit(zlab, tmp_path / "jetspec", _set(causal=True))
    spec = ingest.read_drafter(jet)
    assert spec.format == "jetspec" and all(spec.config.layer_causal(i) for i in range(spec.config.num_hidden_layers))
    assert run(["inspect", str(jet)]) == 0
    shown = capsys.readouterr().out
    assert "jetspec" in shown and "note: JetSpec runs on dflash-trt's runtime" in shown and "--graphs" in shown
    pair, plain = load_pair(target, jet, dtype="float32"), load_pair(target, zlab, dtype="float32")
    ids = [pair.tokenizer("the quick brown fox")["input_ids"]]
    with torch.inference_mode():
        seq = list(ids[0])
        for _ in range(24):  # the target's own greedy decoding, one full forward per token
            seq.append(int(pair.target.model(torch.tensor([seq])).logits[0, -1].argmax()))
        got = generate(
            pair.target,
            pair.drafter,
            ids,
            max_new_tokens=24,
            sampling=SamplingParams(),
            block_size=8,
            stop_token_ids=[],
        )
        other = generate(
            plain.target,
            plain.drafter,
            ids,
            max_new_tokens=24,
            sampling=SamplingParams(),
            block_size=8,
            stop_token_ids=[],
        )
    assert list(got.token_ids[0]) == seq[len(ids[0]) :]  # lossless
    # the same weights drafted bidirectionally in the block propose other tokens: causal is applied
    assert got.stats.accepted_at != other.stats.accepted_at or got.stats.rounds != other.stats.rounds
    for name, path in [("jetspec", jet), *valid.items()]:
        t = "embedded:tiny/target" if name == "dflash2" else str(target)  # the DFlash2 drafter's own target
        code = run(
            [
                "build",
                "--target",
                t,
                "--drafter",
                str(path),
                "--gpu",
                "cpu",
                "--dry-run",
                "-o",
                str(tmp_path / f"out-{name}"),
            ]
        )
        err = capsys.readouterr().err.strip().splitlines()
        if name == "jetspec":
            assert code == 2 and len(err) == 1 and "JetSpec drafter" in err[0] and "--graphs" in err[0]
        else:
            assert code == 0, (name, err)


def test_a_gguf_only_drafter_is_refused_by_name(tmp_path, capsys):
    d = tmp_path / "gguf"
    d.mkdir()
    (d / "drafter-Q8_0.gguf").write_bytes(b"GGUF")
    with pytest.raises(CheckpointError, match="GGUF only .drafter-Q8_0.gguf.*safetensors only"):
        ingest.read_drafter(d)
    for ref, hint in [
        ("incoai/Qwen3.8-27B-DFlash2-GGUF", "z-lab/Qwen3.8-27B-DFlash2"),
        ("nvidia/NVIDIA-Nemotron-3.5-Bolt-E4B-4GB-DFlash", "no safetensors release"),
    ]:
        assert run(["build", "--target", "embedded:tiny/target", "--drafter", ref, "--gpu", "cpu", "--dry-run"]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and ref in err and "GGUF only" in err and hint in err


def test_serve_sh_refuses_a_jetspec_bundle_for_trtllm_serve(tmp_path, monkeypatch):
    """The judge serve.sh runs before trtllm-serve (a bundle built with --graphs still has a trtllm/ config)."""
    from dflash_trt.deploy import trtllm_judge

    monkeypatch.setattr(trtllm_judge, "installed_trtllm", lambda: None)  # refused before the release matters
    (tmp_path / "drafter").mkdir()
    for causal, refused in ((True, True), (None, False), (False, False)):
        dflash = {"mask_token_id": 1, "target_layer_ids": [0], **({} if causal is None else {"causal": causal})}
        (tmp_path / "drafter" / "config.json").write_text(json.dumps({"dflash_config": dflash}))
        code, lines = trtllm_judge.judge_trtllm_config("1.4.0rc1", tmp_path)
        assert (code == 2 and "JetSpec" in lines[0]) if refused else not any("JetSpec" in x for x in lines)
