"""The embedded tiny pair: shipped files, lossless generation, real acceptance, CLI defaults."""

from __future__ import annotations

import json

import pytest

# Tiny matrices: one thread avoids OpenMP stalls on a shared CPU (10x faster here).
from dflash_trt import ingest
from dflash_trt.cli import run
from dflash_trt.plan import recipe

TARGET, DRAFTER = "embedded:tiny/target", "embedded:tiny/drafter"


@pytest.fixture(scope="module")
def pair():
    from dflash_trt.runtime.pair import load_pair

    return load_pair(TARGET, DRAFTER, dtype="float32")


@pytest.fixture(scope="module")
def heldout():
    from dflash_trt.bench.inprocess import read_prompts

    return read_prompts(ingest.embedded_dir("tiny") / "heldout_prompts.jsonl")


def test_shipped_files_are_small_and_in_the_agreed_formats():
    root = ingest.embedded_dir("tiny")
    files = [p for p in root.rglob("*") if p.is_file()]
    total = sum(p.stat().st_size for p in files)
    assert total < 16 * 2**20, f"embedded pair is {total / 2**20:.1f} MiB"
    assert not list(root.rglob("*.bin")) and not list(root.rglob("*.pt"))
    tcfg = json.loads((ingest.resolve(TARGET) / "config.json").read_text())
    dcfg = json.loads((ingest.resolve(DRAFTER) / "config.json").read_text())
    assert tcfg["architectures"] == ["Qwen3ForCausalLM"]
    assert dcfg["architectures"] == ["DFlash2DraftModel"] and dcfg["block_size"] == 8  # z-lab's DFlash2 form
    assert dcfg["hidden_size"] == tcfg["hidden_size"]
    assert all(0 <= i < tcfg["num_hidden_layers"] for i in dcfg["dflash_config"]["target_layer_ids"])
    # the drafter is much cheaper than the target: fewer layers
    assert dcfg["num_hidden_layers"] * 4 <= tcfg["num_hidden_layers"]


def test_tokenizer_has_the_mask_token_the_drafter_uses(pair):
    assert pair.tokenizer.mask_token == "<|mask|>"
    assert pair.tokenizer.mask_token_id == pair.drafter.cfg.mask_token_id
    assert pair.tokenizer.eos_token == "<|endoftext|>" and pair.stop_token_ids == [pair.tokenizer.eos_token_id]
    text = "def f(x):\n    return x  # ok\n"
    assert pair.decode(pair.encode(text)) == text


def test_shipped_pair_is_lossless_and_accepts_drafts(pair, heldout):
    from dflash_trt.runtime.loop import generate

    prompts = [pair.encode(p) for p in heldout[:4]]
    spec = generate(pair.target, pair.drafter, prompts, max_new_tokens=48, stop_token_ids=pair.stop_token_ids)
    ar = generate(pair.target, None, prompts, max_new_tokens=48, block_size=1, stop_token_ids=pair.stop_token_ids)
    assert spec.token_ids == ar.token_ids
    assert spec.stats.block_size == 8
    assert spec.stats.acceptance_length > 1.5, spec.stats.as_dict()


def test_heldout_prompts_come_from_files_the_target_never_saw():
    root = ingest.embedded_dir("tiny")
    lines = [json.loads(x) for x in (root / "heldout_prompts.jsonl").read_text().splitlines() if x.strip()]
    assert len(lines) >= 8
    info = json.loads((root / "target" / "training.json").read_text())
    held = set(info["heldout_files"])
    for line in lines:
        assert line["source"].split(":")[0].removeprefix("Lib/") in held
        assert line["prompt"].rstrip().endswith(":")


def test_tiny_recipe_names_the_embedded_pair():
    r = recipe.load_recipe("tiny")
    assert (r.target.id, r.drafter.id) == (TARGET, DRAFTER)
    assert r.gpu.name == "cpu" and r.precision.weights == "bf16" and r.graphs is False
    assert ingest.resolve(r.target.id).is_dir() and ingest.resolve(r.drafter.id).is_dir()


def test_generate_without_arguments_uses_the_embedded_pair(capsys):
    assert run(["generate", "--prompt", "def fibonacci(n):", "-n", "24", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert len(res["token_ids"]) > 0 and res["text"]
    assert res["block_size"] == 8 and res["acceptance_length"] >= 1.0


def test_bench_without_arguments_uses_the_heldout_prompts(capsys):
    assert run(["bench", "-n", "8", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["prompts"] >= 8 and rep["lossless"] is True and rep["block_size"] == 8


def test_drafter_without_target_is_a_user_error(capsys):
    assert run(["generate", "--prompt", "x", "--drafter", "somewhere"]) == 2
    assert "--drafter needs --target" in capsys.readouterr().err
