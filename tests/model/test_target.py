"""The target side of every family: VLM checkpoints served text-only, the embedding the drafter sees."""

from __future__ import annotations

import math

import pytest
import torch

from dflash_trt.model import Target, load_target
from dflash_trt.runtime.loop import generate
from tests.families import family_drafter, family_target
from tests.helpers import hf_greedy, prompts, wrap


@pytest.mark.parametrize("family", ["qwen3_5_vlm", "gemma4_vlm", "kimi_k25"])
def test_a_vlm_checkpoint_loads_and_generates_text_only(family, tmp_path):
    """Qwen3.5/3.6, gemma-4 and Kimi K2.5 ship ``...ForConditionalGeneration`` checkpoints:
    load_target takes them from disk (Kimi's has no AutoModelForCausalLM mapping) and the
    pair decodes exactly what the saved model decodes on text."""
    model = family_target(family, dtype=torch.float32)
    model.save_pretrained(tmp_path, safe_serialization=True)
    loaded = load_target(tmp_path, dtype=torch.float32)
    ps = prompts(2, seed=4, lo=3, hi=12)
    truth = [hf_greedy(model, p, 12) for p in ps]
    drafter = family_drafter(loaded, block_size=4).float()
    out = generate(wrap(loaded, drafter), drafter, ps, max_new_tokens=12, block_size=4)
    assert out.token_ids == truth


def test_the_drafter_sees_the_targets_own_embedding():
    """The z-lab reference embeds the block with the target's embed_tokens module: Gemma's
    scales rows by sqrt(hidden), plain embeddings do not."""
    ids = torch.tensor([[3, 7, 11]])
    gemma = family_target("gemma4")
    rows = gemma.get_input_embeddings().weight[ids]
    assert torch.allclose(Target(gemma).embed(ids), rows * math.sqrt(gemma.config.hidden_size))
    qwen = family_target("qwen3")
    assert torch.equal(Target(qwen).embed(ids, scale=2.0), qwen.get_input_embeddings().weight[ids] * 2.0)
