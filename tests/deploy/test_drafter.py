"""The bundle's drafter: ascending target layers with fc's columns permuted (same drafts), BF16,
block_size at the top level and in dflash_config."""

from __future__ import annotations

import json

import torch

from dflash_trt import ingest
from dflash_trt.deploy import drafter as bundle_drafter
from dflash_trt.runtime import generate
from dflash_trt.runtime.backend import TorchBackend
from tests.helpers import prompts, tiny_drafter, tiny_target, wrap


def _drafts(target_model, drafter, batch):
    """Every block of draft tokens the reference runtime proposes, per round."""
    seen = []
    backend = TorchBackend(wrap(target_model, drafter), drafter)
    plain = backend.draft_block

    def draft_block(*args):
        tokens, q = plain(*args)
        seen.append(tokens.tolist())
        return tokens, q

    backend.draft_block = draft_block
    res = generate(None, None, batch, max_new_tokens=24, stop_token_ids=[], backend=backend)
    return seen, res.token_ids, res.stats.accepted_at


def test_sorting_target_layers_permutes_fc_and_keeps_the_drafts():
    model = tiny_target(layers=4)  # float64: no summation-order noise
    drafter = tiny_drafter(model, target_layer_ids=[2, 0, 1])
    batch = prompts(3, seed=4)
    before = _drafts(model, drafter, batch)
    fresh = tiny_drafter(model, target_layer_ids=[2, 0, 1])  # same seed: the same weights
    sorted_ = bundle_drafter.sort_target_layers(fresh)
    assert sorted_.cfg.target_layer_ids == [0, 1, 2] and sorted_.dtype == torch.float64
    H = model.config.hidden_size
    w, v = fresh.fc.weight, sorted_.fc.weight
    assert torch.equal(v[:, 0:H], w[:, H : 2 * H]) and torch.equal(v[:, 2 * H :], w[:, 0:H])  # layer 0 was tap 1
    after = _drafts(model, sorted_, batch)
    assert after == before and len(before[0]) > 3  # drafts, outputs, acceptance: identical
    assert not torch.equal(sorted_.fc.weight, fresh.fc.weight)


def test_an_already_sorted_drafter_is_left_as_it_is():
    model = tiny_target(layers=4)
    drafter = tiny_drafter(model)
    assert bundle_drafter.sort_target_layers(drafter) is drafter


def test_an_fp32_drafter_is_written_bf16_sorted_with_block_size_in_both_places(tmp_path):
    model = tiny_target(layers=4, dtype=torch.float32)
    src = tmp_path / "src"
    tiny_drafter(model, target_layer_ids=[2, 0, 1], block_size=8).save(src)
    assert json.loads((src / "config.json").read_text())["dtype"] == "float32"
    info = bundle_drafter.write_bundle_drafter(ingest.read_drafter(src), tmp_path / "out")
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["dtype"] == "bfloat16" and cfg["block_size"] == 8 and cfg["dflash_config"]["block_size"] == 8
    assert cfg["dflash_config"]["target_layer_ids"] == [0, 1, 2]
    headers = ingest.read_headers(tmp_path / "out")
    assert {t.dtype for t in headers.values()} == {"BF16"}
    assert info["source_dtype"] == "float32" and info["dtype"] == "bfloat16"
    assert info["source_target_layer_ids"] == [2, 0, 1] and info["target_layer_ids"] == [0, 1, 2]
    assert len(info["notes"]) == 2 and "cast from float32" in info["notes"][0] and "sorted" in info["notes"][1]
    back = ingest.load_drafter(tmp_path / "out", dtype=torch.bfloat16)  # reads back
    assert ingest.read_drafter(tmp_path / "out").dtype == "bfloat16" and back.cfg.block_size == 8
    ref = bundle_drafter.sort_target_layers(ingest.load_drafter(src)).fc.weight.to(torch.bfloat16)
    assert torch.equal(back.fc.weight, ref)
