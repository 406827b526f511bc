"""The drafter's ONNX Runtime form (``export/onnx_native.py``): standard ops only, the same round as
``Drafter.inject`` + ``draft`` on causal, windowed and grouped-query layers, and the dense cache
the runtime keeps for it holds what the paged cache holds."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

from dflash_trt.export import onnx_native
from dflash_trt.export.onnx_graphs import DRAFTER_ONNX_ATOL, example_round
from dflash_trt.runtime.graph_backend import DenseKVCache
from tests.export.test_onnx_graphs import tiny_drafter


def test_the_native_round_is_standard_onnx_and_matches_pytorch(tmp_path):
    """The tiny drafter has a windowed causal layer, a full one, GQA and biases: every mask branch.
    Checked at shapes unlike the export's (batch 3 and 1, another T, slack columns)."""
    import onnx

    drafter = tiny_drafter()
    head = torch.randn(drafter.cfg.vocab_size, drafter.cfg.hidden_size) * 0.2
    path = onnx_native.export_native_drafter_onnx(drafter, tmp_path, head)
    model = onnx.load(str(path))
    assert {o.domain for o in model.opset_import} <= {"", "ai.onnx"}
    assert {n.domain for n in model.graph.node} <= {"", "ai.onnx"}
    assert [i.name for i in model.graph.input] == onnx_native.NATIVE_INPUTS
    assert sum(n.op_type == "Attention" for n in model.graph.node) == drafter.cfg.num_hidden_layers
    for shape in ({"batch": 3, "T": 4, "seed": 1}, {"batch": 1, "T": 1, "seed": 2}):
        err = onnx_native.check_native_drafter_onnx(drafter, path, head, **shape)
        assert max(err.values()) < DRAFTER_ONNX_ATOL, (shape, err)


def test_the_dense_cache_holds_what_the_paged_cache_holds():
    """DenseKVCache.append (rows of different n_new, growth by chunks) and select give the
    paged cache's context, column for column; the slack columns stay zero."""
    drafter = tiny_drafter()
    cfg = drafter.cfg
    _, paged = example_round(drafter, batch=3, T=5, prior=7)
    dense = DenseKVCache(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, batch=3)
    dense.chunk = 4
    k_ref, v_ref = onnx_native.dense_from_paged(paged)  # [L, b, kvh, len, d]
    n_new = paged.lengths.clone()
    dense.reserve(n_new)
    junk = torch.randn(*k_ref.shape[:3], 3, k_ref.shape[4])  # columns past every row's n_new: dropped
    k_new, v_new = torch.cat([k_ref, junk], 3), torch.cat([v_ref, junk], 3)
    dense.append(k_new, v_new, n_new)
    assert dense.lengths.tolist() == paged.lengths.tolist() and dense.k.shape[3] % 4 == 0
    for i, n in enumerate(n_new.tolist()):
        assert torch.equal(dense.k[:, i, :, :n], k_ref[:, i, :, :n])
        assert torch.equal(dense.v[:, i, :, :n], v_ref[:, i, :, :n])
        assert not dense.k[:, i, :, n:].any()
    dense.select(torch.tensor([2, 0]))
    assert dense.lengths.tolist() == [int(n_new[2]), int(n_new[0])] and dense.k.is_contiguous()
