"""ONNX round trip: the drafter with the dflash custom ops, and the target with target_hidden + KV cache."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
pytest.importorskip("onnxruntime_extensions")
pytest.importorskip("onnxscript")

from dflash_trt.export import onnx_graphs as engine


def tiny_drafter(seed=0):
    from dflash_trt.model.config import DrafterConfig
    from dflash_trt.model.drafter import Drafter

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
        attention_bias=True,
        dtype="float32",
    )
    d = Drafter(cfg).eval()
    with torch.no_grad():
        for name, p in d.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return d


@pytest.fixture(scope="module")
def drafter_onnx(tmp_path_factory):
    drafter = tiny_drafter()
    head = torch.randn(drafter.cfg.vocab_size, drafter.cfg.hidden_size) * 0.2
    path = engine.export_drafter_onnx(drafter, tmp_path_factory.mktemp("onnx"), head_weight=head)
    return drafter, head, path


def test_drafter_onnx_graph(drafter_onnx):
    import onnx

    from dflash_trt.plugins import onnx_ops

    _, _, path = drafter_onnx
    model = onnx.load(str(path))
    onnx_ops.register_onnx_schemas()
    onnx.checker.check_model(model, full_check=True)
    custom = [n for n in model.graph.node if n.domain == "dflash"]
    assert [n.op_type for n in custom] == ["KVInjection", "BlockDiffusionAttention", "BlockDiffusionAttention"]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in custom[1].attribute}
    assert attrs["layer"] == 0 and attrs["window"] == 6 and attrs["causal"] == 1
    assert attrs["num_heads"] == 4 and attrs["num_kv_heads"] == 2 and attrs["block_size"] == 8
    assert [i.name for i in model.graph.input] == engine.DRAFTER_INPUTS


def test_drafter_onnx_matches_pytorch(drafter_onnx):
    drafter, head, path = drafter_onnx
    # batch / new tokens differ from the export's example: the dims are dynamic
    err = engine.check_drafter_onnx(drafter, path, head_weight=head, batch=3, T=4, seed=11)
    assert err["k_cache"] < engine.DRAFTER_ONNX_ATOL and err["v_cache"] < engine.DRAFTER_ONNX_ATOL
    assert err["logits"] < engine.DRAFTER_ONNX_ATOL, err


def test_drafter_onnx_parity_can_fail(drafter_onnx):
    drafter, head, path = drafter_onnx
    with torch.no_grad():
        drafter.layers[1].self_attn.k_proj.weight.mul_(1.5)  # the graph keeps the old weights
    try:
        err = engine.check_drafter_onnx(drafter, path, head_weight=head, batch=2, T=3, seed=12)
    finally:
        with torch.no_grad():
            drafter.layers[1].self_attn.k_proj.weight.div_(1.5)
    assert err["k_cache"] > 1e-3


def test_target_onnx_with_taps_and_kv_cache(tmp_path):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
    )
    model = Qwen3ForCausalLM(cfg).eval()
    path = engine.export_target_onnx(model, [0, 2], tmp_path)
    err = engine.check_target_onnx(model, [0, 2], path, batch=3, past=9, T=4)
    assert max(err.values()) < 1e-4, err


def test_build_engines_explains_what_it_needs(tmp_path):
    from dflash_trt.errors import DFlashError
    from dflash_trt.export import engines
    from dflash_trt.plan.recipe import ServingSpec

    ok, why = engines.engine_support()
    if ok:
        pytest.skip("this machine can build engines")
    assert "tensorrt" in why and "GPU" in why
    with pytest.raises(DFlashError, match="tensorrt"):
        engines.build_engines(tmp_path, tmp_path / "engines", engines.profile_for(ServingSpec(), 8))


def test_kernel_benchmark_script_imports_and_helps():
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "bench" / "kernels.py"
    out = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "--json" in out.stdout


def _dynamic_axes(path) -> dict[str, set[int]]:
    """Input name -> the axes the exported graph leaves symbolic."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return {
        i.name: {a for a, d in enumerate(i.type.tensor_type.shape.dim) if not d.HasField("dim_value")}
        for i in model.graph.input
    }


def _check_profile_covers(graph, path):
    """Every symbolic axis has a profile dimension, and the TensorRT profile keeps static axes."""
    import onnx

    from dflash_trt.export import engines
    from dflash_trt.plan.recipe import ServingSpec

    profile = engines.profile_for(ServingSpec(max_batch_size=4, max_seq_len=256, max_num_tokens=128), 8)
    named = engine.DYNAMIC_AXES[graph]
    for name, axes in _dynamic_axes(path).items():
        assert axes == set(named.get(name, {})), (graph, name, axes)
    for i in onnx.load(str(path), load_external_data=False).graph.input:
        shape = [d.dim_value if d.HasField("dim_value") else -1 for d in i.type.tensor_type.shape.dim]
        lo, opt, hi = engines.profile_shapes(graph, i.name, shape, profile)
        assert all(a <= b <= c for a, b, c in zip(lo, opt, hi, strict=True))
        assert [x for x, s in zip(hi, shape, strict=True) if s >= 0] == [s for s in shape if s >= 0]
        if i.name == "past_k":
            assert lo[3] == 0 and hi[3] == profile.max_seq_len - 1 and hi[1] == 4  # an empty past at prefill


def test_every_dynamic_axis_has_a_profile_dimension(drafter_onnx, tmp_path):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    _check_profile_covers("drafter", drafter_onnx[2])
    cfg = Qwen3Config(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
    )
    path = engine.export_embed_onnx(Qwen3ForCausalLM(cfg).get_input_embeddings().weight, 1.0, tmp_path)
    _check_profile_covers("embed", path)


def test_embed_graph_is_the_targets_embedding_times_the_drafters_scale(tmp_path):
    import onnxruntime as ort
    from transformers import LlamaConfig, LlamaForCausalLM

    from dflash_trt.model import Target

    torch.manual_seed(0)
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=100,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=2,
        )
    ).eval()
    path = engine.export_embed_onnx(model.get_input_embeddings().weight, 2.5, tmp_path)
    ids = torch.randint(0, 100, (3, 7))
    got = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"input_ids": ids.numpy()})[0]
    assert torch.equal(torch.from_numpy(got), Target(model).embed(ids, 2.5).detach())


@pytest.mark.parametrize(
    "model_type, kw, needle",
    [
        ("llama", {}, None),
        ("qwen3", {}, None),
        (
            "qwen3",
            dict(layer_types=["sliding_attention", "full_attention"], use_sliding_window=True, sliding_window=8),
            "sliding-window",
        ),
        ("gpt_oss", {}, "sliding-window"),
        ("qwen3_5_text", {}, "recurrent/conv state (hybrid)"),
        ("deepseek_v3", {}, "MLA"),
    ],
)
def test_targets_whose_cache_does_not_stack_are_named(model_type, kw, needle):
    from transformers import AutoConfig

    cfg = AutoConfig.for_model(model_type, num_hidden_layers=2 if model_type != "qwen3_5_text" else 4, **kw)
    problem = engine.target_export_problem(cfg)
    assert (problem is None) if needle is None else (needle in problem), problem
