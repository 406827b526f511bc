"""dflash-trt inspect: drafters and targets described from configs and headers; the pair verdict."""

from __future__ import annotations

import json
import re
import shutil

import torch

from dflash_trt.cli import run
from dflash_trt.model.drafter import Drafter
from tests.ingest.formats_writers import write_speculators


def _json(capsys):
    return json.loads(capsys.readouterr().out)


def test_inspect_zlab_drafter_table(tiny_pair_dir, capsys):
    _, ddir = tiny_pair_dir
    assert run(["inspect", str(ddir)]) == 0
    out = capsys.readouterr().out
    for needle in ("zlab-v1", "DFlashDraftModel", "block size", "[0, 2]", "[1, 3]", "mask token id", "95"):
        assert needle in out, needle


def test_inspect_speculators_json(tiny_pair_dir, tmp_path, capsys):
    d = Drafter.load(tiny_pair_dir[1])
    path = write_speculators(tmp_path / "spec", d.cfg, d.state_dict())
    assert run(["inspect", str(path), "--json"]) == 0
    info = _json(capsys)
    assert info["kind"] == "drafter" and info["format"] == "speculators"
    assert info["target_layer_ids"]["zlab"] == d.cfg.target_layer_ids
    assert info["target_layer_ids"]["published"] == [i + 1 for i in d.cfg.target_layer_ids]
    assert info["mask_token_id"] == d.cfg.mask_token_id and info["block_size"] == d.cfg.block_size
    assert info["num_parameters"] == sum(v.numel() for k, v in d.state_dict().items())
    assert info["bytes_on_disk"] == (path / "model.safetensors").stat().st_size
    assert info["dtype"] == "float32" and info["weights_present"] is True


def test_inspect_prequantized_target(tiny_pair_dir, tmp_path, capsys):
    t = tmp_path / "t"
    shutil.copytree(tiny_pair_dir[0], t)
    (t / "hf_quant_config.json").write_text(
        json.dumps(
            {
                "producer": {"name": "modelopt", "version": "0.47.0"},
                "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8", "exclude_modules": ["lm_head"]},
            }
        )
    )
    assert run(["inspect", str(t), "--json"]) == 0
    info = _json(capsys)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_pair_dir[0], dtype=torch.float32)
    assert info["kind"] == "target" and info["architecture"] == "Qwen3ForCausalLM"
    assert info["quantization"]["quant_algo"] == "FP8" and info["quantization"]["kv_cache_quant_algo"] == "FP8"
    assert info["num_parameters"] == sum(p.numel() for p in model.parameters())
    assert info["layers"] == 4 and info["embedding_rows"] == 96 and info["hidden_state_capture"] is True
    assert run(["inspect", str(t)]) == 0
    compact = re.sub(r"[\s│]", "", capsys.readouterr().out)  # the table folds long cells
    assert "FP8(modelopt,hf_quant_config.json),KVcacheFP8" in compact


def test_inspect_pair_verdict(tiny_pair_dir, tmp_path, capsys):
    tdir, ddir = tiny_pair_dir
    assert run(["inspect", str(ddir), "--target", str(tdir), "--json"]) == 0
    pair = _json(capsys)["pair"]
    assert pair["ok"] is True and {c["check"] for c in pair["checks"]} >= {
        "hidden size",
        "vocabulary",
        "mask token",
        "target layer ids",
        "target depth",
        "rope",
        "tokenizer",
        "hidden-state capture",
    }
    bad = tmp_path / "d"
    shutil.copytree(ddir, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["dflash_config"]["target_layer_ids"] = [1, 9]
    cfg["dflash_config"]["mask_token_id"] = 300
    (bad / "config.json").write_text(json.dumps(cfg))
    assert run(["inspect", str(bad), "--target", str(tdir)]) == 2
    cap = capsys.readouterr()
    assert "2 problem(s)" in cap.out and "mask_token_id 300" in cap.out
    assert len(cap.err.strip().splitlines()) == 1 and "mask_token_id 300" in cap.err


def test_inspect_config_only_target(tiny_pair_dir, tmp_path, capsys):
    t = tmp_path / "t"
    t.mkdir()
    shutil.copy(tiny_pair_dir[0] / "config.json", t / "config.json")
    assert run(["inspect", str(t), "--json"]) == 0
    info = _json(capsys)
    assert info["weights_present"] is False and info["num_parameters"] is None
    assert any("weights absent" in w for w in info["warnings"])
