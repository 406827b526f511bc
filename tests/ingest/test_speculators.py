"""speculators-format drafters deploy as published: +1 layer ids, non-causal sliding layers by
default (speculators 0.9), one window per sliding layer, z-lab ids in the TensorRT-LLM config."""

from __future__ import annotations

import json

import pytest

from dflash_trt import ingest
from dflash_trt.deploy import trtllm_config
from dflash_trt.errors import CheckpointError, DFlashError, RecipeError
from dflash_trt.plan import DraftShape, drafter_attention_backend, get_release, windowed_non_causal
from tests.helpers import tiny_drafter
from tests.ingest.formats_writers import write_speculators


def _rewrite(path, **layer_or_top):
    cfg = json.loads((path / "config.json").read_text())
    for k, v in layer_or_top.items():
        if k.startswith("tl_"):
            cfg["transformer_layer_config"][k[3:]] = v
        elif v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (path / "config.json").write_text(json.dumps(cfg))
    return path


@pytest.fixture
def spec_dir(tiny_pair_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(tiny_pair_dir[0]).eval()
    d = tiny_drafter(target, seed=7)
    return write_speculators(tmp_path / "spec", d.cfg, d.state_dict()), d.cfg


def test_speculators_09_layers_are_sliding_and_non_causal_by_default(spec_dir):
    path, cfg = spec_dir
    n = cfg.num_hidden_layers
    _rewrite(path, tl_layer_types=["sliding_attention"] * n, tl_sliding_window=64, sliding_window_non_causal=None)
    c = ingest.read_drafter(path, require_weights=False).config
    assert c.layer_types == ["sliding_attention"] * n and c.sliding_window == 64
    assert all(not c.layer_causal(i) and c.layer_window(i) == 64 for i in range(n))
    assert windowed_non_causal(c) == list(range(n))  # the key of the release table's draft-attention rule
    rc1 = get_release("1.4.0rc1")  # so a Blackwell plan never gets TRTLLM draft attention
    assert drafter_attention_backend("auto", c, 100, rc1) == "VANILLA"
    with pytest.raises(RecipeError, match="non-causal sliding window"):
        drafter_attention_backend("TRTLLM", c, 100, rc1)
    _rewrite(path, sliding_window_non_causal=False)  # explicit false: z-lab's causal windows
    c = ingest.read_drafter(path, require_weights=False).config
    assert all(c.layer_causal(i) for i in range(n)) and not windowed_non_causal(c)


def test_per_layer_windows_must_agree(spec_dir):
    path, cfg = spec_dir
    n = cfg.num_hidden_layers
    _rewrite(path, tl_layer_types=["sliding_attention"] * n, tl_sliding_window=[32] * n)
    assert ingest.read_drafter(path, require_weights=False).config.sliding_window == 32
    _rewrite(path, tl_sliding_window=[32] * (n - 1) + [64])
    with pytest.raises(CheckpointError, match="per-layer sliding windows"):
        ingest.read_drafter(path, require_weights=False)


def test_the_trtllm_config_gets_zlab_ids_and_catches_speculators_ids(spec_dir):
    path, cfg = spec_dir
    aux = json.loads((path / "config.json").read_text())["aux_hidden_state_layer_ids"]
    assert aux == [i + 1 for i in cfg.target_layer_ids]
    shape = DraftShape.from_dir(path, zlab=ingest.read_drafter(path, require_weights=False).config.to_zlab())
    assert list(shape.target_layer_ids) == cfg.target_layer_ids  # 0-based, as TensorRT-LLM captures
    trtllm_config.check_layer_ids(list(shape.target_layer_ids), cfg.target_layer_ids)
    with pytest.raises(DFlashError, match=r"speculators ids \(output_hidden_states, \+1\)"):
        trtllm_config.check_layer_ids(aux, cfg.target_layer_ids)  # the trap: ids passed straight through
