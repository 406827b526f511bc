"""ONNX export of a DFlash2 drafter round (convolutions + selector walk in standard ops) matches PyTorch."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
pytest.importorskip("onnxruntime_extensions")
pytest.importorskip("onnxscript")

from dflash_trt.export import onnx_dflash2 as ex2
from dflash_trt.model import DFlash2Drafter, DrafterConfig


def tiny_dflash2(seed=0) -> DFlash2Drafter:
    torch.manual_seed(seed)
    cfg = DrafterConfig(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        vocab_size=128,
        block_size=8,
        mask_token_id=127,
        target_layer_ids=[0, 2],
        rope_theta=10000.0,
        layer_types=["sliding_attention", "full_attention"],
        sliding_window=6,
        causal=False,
        dtype="float32",
        output_multiplier=0.5,
        final_logit_softcapping=20.0,
        conv_kernel_size=2,
        conv_group_size=16,
        selector_rank=8,
        selector_top_k=6,
    )
    d = DFlash2Drafter(cfg).eval()
    with torch.no_grad():
        for name, p in d.named_parameters():
            if "conv" in name or "candidate_selector" in name:
                p.normal_(0.0, 0.3)
    return d


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    d = tiny_dflash2()
    head = torch.randn(d.cfg.vocab_size, d.cfg.hidden_size) * 0.3
    return d, head, ex2.export_dflash2_drafter_onnx(d, tmp_path_factory.mktemp("onnx"), head_weight=head)


def test_graph_has_the_dflash_ops_and_the_selector_inputs(exported):
    import onnx

    _, _, path = exported
    model = onnx.load(str(path))
    assert [i.name for i in model.graph.input] == ex2.DFLASH2_INPUTS
    assert [o.name for o in model.graph.output] == ex2.DFLASH2_OUTPUTS
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("BlockDiffusionAttention") == 2 and "KVInjection" in ops and "TopK" in ops


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_onnx_matches_pytorch(exported, temperature):
    d, head, path = exported
    err = ex2.check_dflash2_drafter_onnx(d, path, head_weight=head, temperature=temperature, batch=3, T=4, seed=7)
    assert err["tokens_differing"] == 0 and err["candidates_differing"] == 0, err
    assert max(v for k, v in err.items() if k in ("k_cache", "v_cache", "q")) < 1e-4, err


def test_onnx_parity_can_fail(exported):
    d, head, path = exported
    with torch.no_grad():
        d.candidate_selector.successor_codebook.mul_(-3.0)  # the graph keeps the old codebook
    try:
        err = ex2.check_dflash2_drafter_onnx(d, path, head_weight=head, temperature=0.8, batch=3, T=4, seed=8)
    finally:
        with torch.no_grad():
            d.candidate_selector.successor_codebook.div_(-3.0)
    assert err["tokens_differing"] > 0 or err["q"] > 1e-3
