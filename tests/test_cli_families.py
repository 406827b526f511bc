"""The commands on pairs of the new families, from disk: gemma-4 generates (it used to crash
on a per-layer head_dim) and is refused by ``build`` without ``--graphs`` in one line, since
TensorRT-LLM's Gemma4 model has no hidden-state capture hook."""

from __future__ import annotations

import json

import pytest
import torch

from dflash_trt.cli import run
from tests.families import family_drafter, family_target
from tests.helpers import char_tokenizer, hf_greedy


@pytest.fixture(scope="module")
def gemma_pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("gemma4")
    model = family_target("gemma4", dtype=torch.float32)
    drafter = family_drafter(model, block_size=8).float()
    model.save_pretrained(root / "target", safe_serialization=True)
    char_tokenizer().save_pretrained(root / "target")
    drafter.save(root / "drafter")
    return model, root / "target", root / "drafter"


def test_generate_on_a_gemma4_pair_is_lossless(gemma_pair, capsys):
    model, tdir, ddir = gemma_pair
    assert run(["generate", "-t", str(tdir), "-d", str(ddir), "-p", "hello gemma", "-n", "16", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    prompt = char_tokenizer()("hello gemma")["input_ids"]
    want = hf_greedy(model, prompt, 16)
    assert res["token_ids"] == (want[: want.index(2) + 1] if 2 in want else want)


def test_build_for_tensorrt_llm_refuses_gemma4_in_one_line(gemma_pair, capsys):
    _, tdir, ddir = gemma_pair
    assert run(["build", "--target", str(tdir), "--drafter", str(ddir), "--gpu", "b200", "--dry-run"]) == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error")]
    assert len(lines) == 1 and "no hidden-state capture hook" in lines[0] and "--graphs" in lines[0]
    assert run(["build", "--target", str(tdir), "--drafter", str(ddir), "--gpu", "b200", "--dry-run", "--graphs"]) == 0
