"""``graphs.export_drafter`` gives each drafter its own graph: a DFlash2 drafter the selector walk's
(checked greedy and sampled), a DFlash drafter the logits round."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
pytest.importorskip("onnxruntime_extensions")
pytest.importorskip("onnxscript")

from dflash_trt.export import bundle_graphs as graphs
from dflash_trt.export import onnx_dflash2 as export_dflash2
from dflash_trt.export import onnx_graphs as export
from dflash_trt.export import onnx_native
from dflash_trt.export.rounds import DFlash2Export
from tests.helpers import tiny_dflash2_drafter, tiny_drafter, tiny_target


def _inputs(path) -> list[str]:
    import onnx

    return [i.name for i in onnx.load(str(path)).graph.input]


@pytest.fixture(scope="module")
def target():
    return tiny_target(dtype=torch.float32, layers=2)


def test_a_dflash2_drafter_gets_the_selector_graph_checked_at_two_temperatures(target, tmp_path):
    d = tiny_dflash2_drafter(target, selector_top_k=6)
    head = target.get_output_embeddings().weight.detach()
    said = []
    kind, err = graphs.export_drafter(d, head, tmp_path, 4, said.append)
    assert kind == "dflash2" and "selector" in said[0] and "ONNX Runtime form" in said[1]
    assert _inputs(tmp_path / "drafter.onnx") == export_dflash2.DFLASH2_INPUTS
    assert _inputs(tmp_path / "drafter_ort.onnx") == onnx_native.DFLASH2_NATIVE_INPUTS  # the walk, natively
    assert set(err) == {"k_cache", "v_cache", "q", "ort_k_new", "ort_v_new", "ort_q"}
    assert max(err.values()) < export.DRAFTER_ONNX_ATOL
    assert DFlash2Export.temperatures[0] == 0.0 and DFlash2Export.temperatures[1] > 0
    _profile_covers(tmp_path / "drafter.onnx")


def _profile_covers(path):
    """Every input of the drafter graph gets a TensorRT (min, opt, max) within the profile; its
    dynamic axes are the named ones (a DFlash2 graph's anchor and uniforms included)."""
    import onnx

    from dflash_trt.export import engines
    from dflash_trt.plan.recipe import ServingSpec

    profile = engines.profile_for(ServingSpec(max_batch_size=4, max_seq_len=256, max_num_tokens=128), 8)
    for i in onnx.load(str(path)).graph.input:
        shape = [d.dim_value if d.HasField("dim_value") else -1 for d in i.type.tensor_type.shape.dim]
        lo, opt, hi = engines.profile_shapes("drafter", i.name, shape, profile)
        assert all(a <= b <= c for a, b, c in zip(lo, opt, hi, strict=True)), i.name
        if i.name in ("anchor", "uniforms"):
            assert (lo[0], hi[0]) == (1, 4) and shape[1:] == hi[1:]


def test_a_dflash_drafter_keeps_the_logits_graph(target, tmp_path):
    d = tiny_drafter(target).float()
    kind, err = graphs.export_drafter(d, target.get_output_embeddings().weight.detach(), tmp_path, 4, lambda m: None)
    assert kind == "dflash" and _inputs(tmp_path / "drafter.onnx") == export.DRAFTER_INPUTS
    assert max(err.values()) < export.DRAFTER_ONNX_ATOL
