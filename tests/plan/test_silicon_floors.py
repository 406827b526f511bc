"""A planned step below the smallest size aiconfigurator-core's tables collected falls back to the
calibrated model, and the plan says so (plan.silicon_floors). Needs the library (an x86_64 extra)."""

from __future__ import annotations

import json

import pytest

from dflash_trt.deploy import pipeline
from dflash_trt.plan import deployment, silicon, silicon_floors
from dflash_trt.plan import recipe as R
from dflash_trt.plan.model_shapes import TargetShape

pytest.importorskip("aiconfigurator_core")
QWEN = R._bundled_dir() / "configs" / "Qwen--Qwen3-8B"


def test_the_floors_are_the_library_tables_own_smallest_points():
    import pandas as pd

    root = silicon_floors._root()
    assert root is not None
    gemm = pd.read_parquet(root / "h200_sxm" / "gemm" / "trtllm" / "1.3.0rc20" / "gemm_perf.parquet")
    bf16 = silicon_floors.floors("h200_sxm", "trtllm", "1.3.0rc20", "bfloat16", "bfloat16")
    block = silicon_floors.floors("h200_sxm", "trtllm", "1.3.0rc20", "fp8_block", "bfloat16")
    assert bf16["GEMM n"] == gemm[gemm.gemm_dtype == "bfloat16"].n.min() == 32
    assert block["GEMM k"] == gemm[gemm.gemm_dtype == "fp8_block"].k.min() == 128  # per dtype
    assert {"attention batch", "attention context", "MoE tokens"} <= set(bf16)


def _model(tmp_path, hidden):
    """The qwen3-8b-h200-fp8 pair's step model, its target narrowed to ``hidden`` (a real Qwen3 layout)."""
    cfg = json.loads((QWEN / "config.json").read_text())
    cfg.update(
        hidden_size=hidden,
        intermediate_size=3 * hidden,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        num_hidden_layers=2,
    )
    tmp_path.mkdir()
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    target = TargetShape.from_dir(tmp_path)
    res = pipeline.resolve_recipe(R.load_recipe("qwen3-8b-h200-fp8"))
    dep = deployment.Deployment(
        target=target, drafter=res.drafter, gpu=res.gpu, gpus=1, precision="bf16", kv_cache="auto"
    )
    tables = silicon.silicon_tables(str(tmp_path), "H200", "trtllm", "bf16", 1, 2, "1.4.0rc1")
    assert tables is not None and tables.reason is None
    calibrated = deployment.step_model(dep, 1, 512)
    return silicon.combined(calibrated, tables), calibrated


def test_a_step_below_the_smallest_collected_gemm_is_the_calibrated_models(tmp_path):
    # hidden 16 < the bf16 GEMM table's smallest n and k (32): the tables would extrapolate
    m, calibrated = _model(tmp_path / "narrow", 16)
    assert m.below(1, 1) == "GEMM n 16 < 32, GEMM k 16 < 32"
    assert m.ar_step(4) == calibrated.ar_step(4) and m.dflash_step(4, 3, 2.5) == calibrated.dflash_step(4, 3, 2.5)
    note = silicon.sources(m, "trtllm calibration (shipped): x", False, [3, 3, 2, 2])["target_forward"]
    assert (
        note.startswith("aiconfigurator-core")
        and "at batch 1-4 below the tables' smallest collected size "
        "(GEMM n 16 < 32, GEMM k 16 < 32): the calibrated model's step there"
        in note
    )
    # at the floor (hidden 32) the tables price it, the loop beside them
    m, calibrated = _model(tmp_path / "at", 32)
    assert m.below(1, 1) is None and m.ar_step(4) != calibrated.ar_step(4)
    assert m.ar_step(4) == pytest.approx(silicon.loop()["loop_s"] + m.tables.forward_ms(4, 1, 512) / 1000)
    assert "below" not in silicon.sources(m, "c: x", False, [3, 3])["target_forward"]


def test_a_published_target_lies_above_the_floors():
    t = silicon.silicon_tables(str(QWEN), "H200", "trtllm", "bf16", 1, 36, "1.4.0rc1")
    assert t is not None and t.below(TargetShape.from_dir(QWEN), 1, 1, 16) is None


def test_a_calibration_whose_source_holds_a_colon_is_named_whole(tmp_path):
    """``sources`` names a calibration by its description up to its constants: a user's refitted
    source (``your measurements: a.json, ...``) keeps its name and its closing parenthesis."""
    m, _ = _model(tmp_path / "m", 32)
    desc = "trtllm calibration (your measurements: a.json, 3 levels; 3 measurement rows per constant): bandwidth 50%"
    named = silicon.sources(m, desc, True, [3, 3])
    want = "your measurements: a.json, 3 levels; 3 measurement rows per constant"
    assert named["drafter"] == f"user calibration (trtllm calibration ({want}), over the tables' target step)"
    assert "bandwidth" not in named["loop"] and want in named["loop"]
