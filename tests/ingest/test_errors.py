"""Broken inputs: each is refused before any weights load, as one line, exit 2, writing nothing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from dflash_trt import ingest
from dflash_trt.cli import run
from dflash_trt.errors import DFlashError
from dflash_trt.model.drafter import Drafter
from tests.ingest.formats_writers import write_speculators, write_zlab_v1


def _cfg(d: Path) -> dict:
    return json.loads((d / "config.json").read_text())


def _set_cfg(d: Path, **changes) -> None:
    cfg = _cfg(d)
    for k, v in changes.items():
        if k.startswith("dflash_"):
            cfg["dflash_config"][k[len("dflash_") :]] = v
        else:
            cfg[k] = v
    (d / "config.json").write_text(json.dumps(cfg))


def truncated_safetensors(t, d):
    f = d / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2])
    return t, d


def corrupt_header(t, d):
    (d / "model.safetensors").write_bytes((20).to_bytes(8, "little") + b"{not json at all!!!!" + b"\0" * 64)
    return t, d


def missing_shard(t, d):
    tensors = load_file(str(t / "model.safetensors"))
    names = sorted(tensors)
    half = len(names) // 2
    shards = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
    for shard, part in shards.items():
        save_file({n: tensors[n] for n in part}, str(t / shard))
    (t / "model.safetensors").unlink()
    index = {
        "metadata": {"total_size": sum(v.numel() * v.element_size() for v in tensors.values())},
        "weight_map": {n: s for s, part in shards.items() for n in part},
    }
    (t / "model.safetensors.index.json").write_text(json.dumps(index))
    (t / "model-00002-of-00002.safetensors").unlink()
    return t, d


def wrong_hidden_size(t, d):
    cfg = Drafter.load(d).cfg.model_copy(update={"hidden_size": 32, "intermediate_size": 64, "head_dim": 8})
    shutil.rmtree(d)
    write_zlab_v1(d, cfg, Drafter(cfg).state_dict())
    return t, d


def layer_id_out_of_range(t, d):
    _set_cfg(d, dflash_target_layer_ids=[0, 4])  # a 4-layer target has ids 0..3
    return t, d


def mask_outside_vocabulary(t, d):
    _set_cfg(d, dflash_mask_token_id=500)
    return t, d


def trained_for_deeper_target(t, d):
    _set_cfg(d, num_target_layers=36)
    return t, d


def dspark(t, d):
    cfg = Drafter.load(d).cfg
    shutil.rmtree(d)
    write_speculators(d, cfg, Drafter(cfg).state_dict(), extra={"markov_w1.weight": torch.zeros(4, 4)})
    _set_cfg(d, speculators_model_type="dspark", markov_rank=4, architectures=["DSparkSpeculator"])
    return t, d


def dflash2(t, d):
    _set_cfg(d, architectures=["DFlash2DraftModel"], dflash_conv_kernel_size=2, dflash_selector_rank=256)
    return t, d


def bin_only(t, d):
    (d / "model.safetensors").unlink()
    (d / "pytorch_model.bin").write_bytes(b"PK\x03\x04 pickled weights are never opened")
    return t, d


def custom_code_only(t, d):
    _set_cfg(
        t,
        model_type="acme",
        architectures=["AcmeForCausalLM"],
        auto_map={"AutoModelForCausalLM": "modeling_acme.AcmeForCausalLM"},
    )
    (t / "modeling_acme.py").write_text("raise SystemExit('checkpoint code must never run')\n")
    return t, d


def missing_tokenizer(t, d):
    for f in t.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")) or f.name in ("vocab.json", "merges.txt"):
            f.unlink()
    return t, d


def unknown_format(t, d):
    (d / "config.json").write_text(
        json.dumps({"architectures": ["BertModel"], "model_type": "bert", "hidden_size": 64})
    )
    return t, d


def empty_folder(t, d):
    shutil.rmtree(d)
    d.mkdir()
    return t, d


def swapped(t, d):
    return d, t


def quantized_drafter(t, d):
    tensors = load_file(str(d / "model.safetensors"))
    tensors["layers.0.mlp.up_proj.weight"] = tensors["layers.0.mlp.up_proj.weight"].to(torch.float8_e4m3fn)
    save_file(tensors, str(d / "model.safetensors"))
    return t, d


def config_does_not_match_weights(t, d):
    _set_cfg(d, intermediate_size=96)
    return t, d


def speculators_embedding_layer(t, d):
    cfg = Drafter.load(d).cfg
    shutil.rmtree(d)
    write_speculators(d, cfg, Drafter(cfg).state_dict())
    _set_cfg(d, aux_hidden_state_layer_ids=[0, 3])
    return t, d


def speculators_reduced_vocab_without_head(t, d):
    cfg = Drafter.load(d).cfg
    shutil.rmtree(d)
    write_speculators(d, cfg, Drafter(cfg).state_dict())
    _set_cfg(d, draft_vocab_size=40)
    return t, d


CASES = {
    # name: (mutation, needle in the one-line message, target-side?)
    "truncated safetensors": (truncated_safetensors, "truncated"),
    "corrupt safetensors header": (corrupt_header, "corrupt"),
    "missing shard": (missing_shard, "model-00002-of-00002.safetensors"),
    "wrong hidden size": (wrong_hidden_size, "hidden_size 32 != target hidden_size 64"),
    "layer id out of range": (layer_id_out_of_range, "target layer ids [4] out of range for the 4-layer target"),
    "mask id outside the vocabulary": (mask_outside_vocabulary, "mask_token_id 500 has no row"),
    "trained for another depth": (trained_for_deeper_target, "num_target_layers 36"),
    "DSpark": (dspark, "DSpark drafter"),
    "DFlash2 without its group size and top-k": (dflash2, "DFlash2 drafter config lacks"),
    ".bin-only": (bin_only, "pickled weights"),
    "custom-code-only config": (custom_code_only, "custom code"),
    "missing tokenizer": (missing_tokenizer, "no tokenizer files"),
    "unknown format": (unknown_format, "unknown drafter format"),
    "empty folder": (empty_folder, "empty directory"),
    "target and drafter swapped": (swapped, "swap"),
    "quantized drafter": (quantized_drafter, "quantized drafter"),
    "config does not match weights": (config_does_not_match_weights, "config.json implies"),
    "speculators aux id 0": (speculators_embedding_layer, "embedding output"),
    "reduced vocabulary without its head": (speculators_reduced_vocab_without_head, "own head is missing"),
}


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}


@pytest.fixture
def broken(tiny_pair_dir, tmp_path, request):
    tdir, ddir = tiny_pair_dir
    t, d = tmp_path / "target", tmp_path / "drafter"
    shutil.copytree(tdir, t)
    shutil.copytree(ddir, d)
    mutate, needle = CASES[request.param]
    t, d = mutate(t, d)
    return t, d, needle, tmp_path


@pytest.mark.parametrize("broken", list(CASES), indirect=True)
def test_broken_input_is_one_line_exit_2_and_writes_nothing(broken, capsys):
    t, d, needle, root = broken
    before = _snapshot(root)
    code = run(["generate", "-t", str(t), "-d", str(d), "-p", "hello", "-n", "2"])
    errtext = capsys.readouterr().err.strip()
    assert code == 2, errtext
    assert len(errtext.splitlines()) == 1 and "Traceback" not in errtext
    assert needle in errtext, errtext
    # the same refusal from the API that writes: nothing is created
    with pytest.raises(DFlashError):
        ingest.validate_pair(t, d)
    try:
        ingest.write_zlab(d, root / "out")
    except DFlashError:
        pass
    else:  # only target-side problems leave the drafter itself writable
        assert ingest.read_drafter(d) and (root / "out").exists()
        shutil.rmtree(root / "out")
    assert not (root / "out").exists()
    assert _snapshot(root) == before


@pytest.mark.parametrize("broken", [c for c in CASES if c != "missing tokenizer"], indirect=True)
def test_inspect_refuses_the_same_inputs(broken, capsys):
    t, d, needle, root = broken
    code = run(["inspect", str(d), "--target", str(t)])
    errtext = capsys.readouterr().err.strip()
    assert code == 2 and len(errtext.splitlines()) == 1 and needle in errtext, errtext
