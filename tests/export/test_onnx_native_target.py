"""The target's ONNX Runtime form (``export/onnx_native_target.py``): fused opset-23 nodes, the
same forward as transformers' on a cache with holes, for the plain decoder families it covers."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

from dflash_trt.export.onnx_graphs import TARGET_INPUTS, TARGET_ONNX_ATOL, TARGET_OUTPUTS, check_target_onnx
from dflash_trt.export.onnx_native_target import export_native_target_onnx, native_target_problem
from tests.helpers import tiny_target


def _llama_with_biases():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        attention_bias=True,
        mlp_bias=True,
    )
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2)
    return model.float().eval()


def _qwen2_with_biases():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
    )
    model = Qwen2ForCausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2)  # biases too: a q/k/v bias that were zero would pass unread
    return model.float().eval()


@pytest.mark.parametrize(
    "make",
    [
        lambda: tiny_target("qwen3", dtype=torch.float32),
        pytest.param(lambda: tiny_target("llama", dtype=torch.float32), marks=pytest.mark.slow),
        pytest.param(_qwen2_with_biases, marks=pytest.mark.slow),
        pytest.param(_llama_with_biases, marks=pytest.mark.slow),
    ],
    ids=["qwen3", "llama", "qwen2-bias", "llama-bias"],
)
def test_the_native_target_is_fused_standard_onnx_and_matches_transformers(tmp_path, make):
    import onnx

    model = make()
    layers = model.config.num_hidden_layers
    taps = [0, layers - 1]  # the last layer's tap is transformers' normed hidden state
    assert native_target_problem(model) is None
    path = export_native_target_onnx(model, taps, tmp_path)
    graph = onnx.load(str(path)).graph
    assert [i.name for i in graph.input] == TARGET_INPUTS and [o.name for o in graph.output] == TARGET_OUTPUTS
    assert {n.domain for n in graph.node} <= {"", "ai.onnx"}
    ops = [n.op_type for n in graph.node]
    assert ops.count("Attention") == layers and "RMSNormalization" in ops and "Softmax" not in ops
    for shape in ({"batch": 3, "past": 9, "T": 4, "seed": 1}, {"batch": 1, "past": 1, "T": 1, "seed": 2}):
        err = check_target_onnx(model, taps, path, **shape)
        assert max(err.values()) < TARGET_ONNX_ATOL, (shape, err)


def test_targets_it_does_not_cover_are_named():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        use_sliding_window=True,
        sliding_window=4,
        max_window_layers=0,
        layer_types=["sliding_attention"] * 2,
    )
    assert "not a plain decoder" in native_target_problem(Qwen3ForCausalLM(cfg))


def test_a_rope_that_changes_with_length_is_named():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        rope_scaling={"rope_type": "dynamic", "factor": 2.0},
    )
    assert "changes with the sequence length" in native_target_problem(LlamaForCausalLM(cfg))
