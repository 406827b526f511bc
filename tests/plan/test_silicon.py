"""The target's step from aiconfigurator-core's measured tables (plan.silicon): the width asked for
without MTP layer scaling, the fallback and its reason, every term's source, --stack, --calibration.

Tests that need the library skip where it is not installed (it is an x86_64 / Python 3.11+ extra);
the rest run everywhere, the library hidden where they test its absence."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dflash_trt.cli import run
from dflash_trt.deploy import pipeline
from dflash_trt.plan import deployment, mtp, perf_model, silicon, uncertainty
from dflash_trt.plan import recipe as R

CONFIGS = R._bundled_dir() / "configs"
QWEN = str(CONFIGS / "Qwen--Qwen3-8B")


def test_importing_plan_loads_no_tables():
    code = "import sys, dflash_trt.plan; print('aiconfigurator_core' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_without_the_library_the_plan_says_so(monkeypatch, capsys):
    monkeypatch.setattr(silicon, "installed", lambda: None)
    assert silicon.silicon_tables(QWEN, "H200", "trtllm", "bf16", 1, 36, "1.4.0rc1") is None
    assert run(["plan", "qwen3-8b-h100-fp8", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)["plan"]
    assert "aiconfigurator-core not installed" in plan["step_sources"]["target_forward"]
    assert plan["step_sources"]["drafter"].startswith("calibrated model")


def test_a_gpu_or_stack_the_tables_lack_falls_back_naming_why():
    pytest.importorskip("aiconfigurator_core")
    t = silicon.silicon_tables(QWEN, "RTX PRO 6000 Blackwell", "trtllm", "bf16", 1, 36, "1.4.0rc1")
    assert t is not None and t.reason == "the tables hold no RTX PRO 6000 Blackwell"
    t = silicon.silicon_tables(QWEN, "H200", "transformers", "bf16", 1, 36, "1.4.0rc1")
    assert t is not None and t.reason == "the tables hold no transformers stack"
    assert silicon.table_version("h200_sxm", "trtllm", "1.3.0rc10") is None  # nothing at or below it


def test_width_k_plus_1_is_the_mtp_engine_with_its_layer_scale_divided_out():
    pytest.importorskip("aiconfigurator_core")
    from aiconfigurator_core.sdk.engine import EngineHandle

    t = silicon.silicon_tables(QWEN, "H200", "trtllm", "bf16", 1, 36, "1.4.0rc1")
    assert t is not None and t.reason is None and t.version == "1.3.0rc20"
    kw = dict(
        backend_version="1.3.0rc20",
        tp_size=1,
        moe_tp_size=1,
        moe_ep_size=1,
        gemm_quant_mode="bfloat16",
        kvcache_quant_mode="bfloat16",
        fmha_quant_mode="bfloat16",
    )
    # FACTS §15: Qwen3-8B BF16, H200, TP1, 1.3.0rc20 tables, ISL 1024: 5.27 ms at batch 1; nextn 15: 9.385 ms
    assert t.forward_ms(1, 1, 1024) == pytest.approx(5.27, abs=0.01)
    engine = EngineHandle.compile(QWEN, "h200_sxm", "trtllm", nextn=15, **kw)
    assert engine.decode_step_latency(1, 1024, 512) == pytest.approx(9.385, abs=0.03)
    mtp15 = engine.decode_step_latency(1, 1024, 2)  # at the decode context itself, as the planner asks
    assert t._width_ms(1, 16, 1024) == pytest.approx(mtp15 * 36 / (36 + 15), rel=1e-9)
    assert t.forward_ms(1, 1, 1024) < t.forward_ms(1, 12, 1024) < t.forward_ms(1, 16, 1024)


def test_a_width_is_priced_from_the_width_1_step_not_interpolated():
    # the library's step at width w over b rows is its width-1 step over b x w rows, to the last digit
    # (what forward_ms builds on, one engine for every width, none interpolated between compiled widths)
    pytest.importorskip("aiconfigurator_core")
    t = silicon.silicon_tables(QWEN, "H200", "trtllm", "bf16", 1, 36, "1.4.0rc1")
    assert t is not None
    for b, w, ctx in ((1, 4, 64), (3, 16, 2048), (32, 10, 320)):
        assert t._width_ms(b, w, ctx) == pytest.approx(t._width_ms(b * w, 1, ctx), rel=1e-9)
    # a width between the old compiled ones (8, 16) at a short context: the library's own step
    assert t.forward_ms(32, 10, 16) == pytest.approx(t._width_ms(32, 10, 16), rel=1e-9)


def test_a_verify_reads_each_rows_context_once():
    # the library's w decode rows per request read its K/V w times; a verify reads it once: what a
    # longer context adds to a verify is what it adds to one decode row per request, whatever w
    pytest.importorskip("aiconfigurator_core")
    t = silicon.silicon_tables(QWEN, "H200", "trtllm", "bf16", 1, 36, "1.4.0rc1")
    assert t is not None
    for b, w in ((1, 16), (8, 4), (32, 10)):
        added = t.forward_ms(b, w, 4096) - t.forward_ms(b, w, 16)
        assert added == pytest.approx(t.forward_ms(b, 1, 4096) - t.forward_ms(b, 1, 16), rel=1e-9)
        assert added < (t._width_ms(b, w, 4096) - t._width_ms(b, w, 16)) / 2  # the library's, per token
    # the MTP arm's step is that verify times the MTP layers' (L + n) / L: one footing with DFlash
    assert t.mtp_step_ms(4, 3, 1024) == pytest.approx(t.forward_ms(4, 4, 1024) * 39 / 36, rel=1e-9)


def _make(stack=None, calibration=None, tables=True):
    r = R.load_recipe("qwen3-8b-h200-fp8")
    res = pipeline.resolve_recipe(r)
    dep = deployment.Deployment(
        target=res.target, drafter=res.drafter, gpu=res.gpu, gpus=res.gpus, precision=res.precision, kv_cache="auto"
    )

    def factory(tp):
        return silicon.silicon_tables(
            str(res.target_dir), res.gpu.name, stack or "trtllm", res.precision, tp, res.target.layers, r.trtllm.release
        )

    return deployment.make_plan(
        dep,
        r.serving,
        r.speculative,
        r.parallel,
        r.trtllm,
        calibration=calibration,
        stack=stack,
        tables=factory if tables else None,
    )


def test_every_term_names_its_source_and_calibration_corrects_the_rest():
    pytest.importorskip("aiconfigurator_core")
    p = _make()
    assert p.step_sources["target_forward"].startswith("aiconfigurator-core 0.12.0 measured tables (trtllm")
    assert p.step_sources["mtp_step"] == p.step_sources["target_forward"]
    assert "beside the tables" in p.step_sources["loop"] and p.step_sources["drafter"].startswith("calibrated")
    # a user's calibration (refitted over the tables' step, calibrate.from_files) corrects the rest
    own = _make(calibration=perf_model.shipped_calibration())
    assert own.step_sources["target_forward"] == p.step_sources["target_forward"]
    assert (
        own.step_sources["drafter"].startswith("user calibration") and "over the tables" in own.step_sources["drafter"]
    )
    assert own.curve != p.curve  # the user's constants set the drafter and loop terms
    # the ranges rest on the combined model's own leave-one-out rows, not the calibrated model's
    row = p.curve[0]
    r = uncertainty.speedup_range(row.speedup, silicon.loo_errors(), "trtllm", p.gpu, row.batch)
    assert row.speedup_range == [r.low, r.high] and len(silicon.loo_errors()) == 13


def test_plan_predicts_for_the_chosen_stack(capsys):
    pytest.importorskip("aiconfigurator_core")
    assert run(["plan", "qwen3-8b-h200-fp8", "--stack", "vllm", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)["plan"]
    assert plan["stack"] == "vllm" and "(vllm current, h200_sxm)" in plan["step_sources"]["target_forward"]
    assert run(["plan", "qwen3-8b-h200-fp8", "--stack", "tgi"]) == 2
    assert "--stack 'tgi'" in capsys.readouterr().err


def test_the_mtp_arm_steps_on_the_same_tables():
    pytest.importorskip("aiconfigurator_core")
    t = silicon.silicon_tables(QWEN, "H200", "trtllm", "bf16", 1, 36, "1.4.0rc1")
    r = R.load_recipe("qwen3-8b-h200-fp8")
    res = pipeline.resolve_recipe(r)
    dep = deployment.Deployment(
        target=res.target, drafter=res.drafter, gpu=res.gpu, gpus=1, precision="bf16", kv_cache="auto"
    )
    m = silicon.combined(deployment.step_model(dep, 1, 1024), t)
    assert mtp.step(m, 4, 3) == pytest.approx(m.k.step_s + t.mtp_step_ms(4, 3, 1024) / 1000)
    assert m.ar_step(4) == pytest.approx(m.k.step_s + t.forward_ms(4, 1, 1024) / 1000)
