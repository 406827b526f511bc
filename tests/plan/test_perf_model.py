"""The step model and its fit: a synthetic data set gives back the constants it was made with,
the shipped constants are the fit of the shipped measurements, and the terms move the way the
published runs do (dense speedups fall with concurrency; MoE verifies touch more experts)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from dflash_trt.errors import DFlashError
from dflash_trt.plan import hardware as hw
from dflash_trt.plan import perf_fit as F
from dflash_trt.plan import perf_model as M
from dflash_trt.plan import recipe as R

PAIRS = {
    "qwen3-8b": ("Qwen--Qwen3-8B", "z-lab--Qwen3-8B-DFlash-b16"),
    "qwen3-4b": ("Qwen--Qwen3-4B", "z-lab--Qwen3-4B-DFlash-b16"),
    "llama": ("meta-llama--Llama-3.1-8B-Instruct", "z-lab--LLaMA3.1-8B-Instruct-DFlash-UltraChat"),
}


def _case(pair, gpu, c, L, tau, **kw):
    t, d = PAIRS[pair]
    row = F.Row(
        id=f"{pair}-{gpu}-{c}-{L}",
        stack=kw.pop("stack", "sglang"),
        gpu=gpu,
        target=t,
        drafter=d,
        precision=kw.pop("precision", "bf16"),
        tp=kw.pop("tp", 1),
        concurrency=c,
        draft_len=L,
        tau=tau,
        **kw,
    )
    return F.case_of(row)


def _observe(case, k, shared, noise=1.0):
    """The row with what the model says it measured (speedup and both tokens/s)."""
    p = case.predict(k, shared)
    row = replace(
        case.row,
        speedup=p["speedup"] * noise,
        tokens_per_s=p["tokens_per_s"],
        baseline_tokens_per_s=p["baseline_tokens_per_s"],
    )
    return replace(case, row=row)


def test_the_fit_recovers_the_constants_a_synthetic_data_set_was_made_with():
    truth = M.StackConstants(bandwidth_share=0.7, compute_share=0.45, step_s=6e-4, layer_s=12e-6)
    shared = replace(M.Shared(), gemm_tail_rows=30.0)
    grid = [
        (p, g, c, L, tau)
        for p, tau in (("qwen3-8b", 6.5), ("qwen3-4b", 7.5), ("llama", 4.0))
        for g in ("B200", "H100")
        for c in (1, 4, 16, 64)
        for L in (3, 9)
    ]
    cases = [_observe(_case(p, g, c, L, tau), truth, shared) for p, g, c, L, tau in grid]
    cal = F.fit(cases, start=M.Calibration({}, M.Shared()))  # starts from the defaults, not the truth
    got = cal.constants("sglang")
    for name in F.CONSTANTS:
        assert getattr(got, name) == pytest.approx(getattr(truth, name), rel=0.05), name
    assert cal.shared.gemm_tail_rows == pytest.approx(30.0, rel=0.1)
    assert cal.rows["sglang"]["step_s"] == len(cases)


def test_each_stack_gets_its_own_constants_only_where_its_rows_carry_them():
    many = [_case("qwen3-8b", "B200", c, 9, 6.0, speedup=3.0) for c in (1, 2, 4, 8, 16, 32, 64, 128)]
    few = [_case("qwen3-8b", "H100", c, 9, 6.0, speedup=3.0, stack="vllm") for c in (1, 8)]
    layout = F.Layout.of(many + few, ("trtllm",))
    assert {k for e, k in layout.offsets if e == "sglang"} == set(F.CONSTANTS)
    assert {k for e, k in layout.offsets if e == "vllm"} == {"layer_s"}
    assert not [k for e, k in layout.offsets if e == "trtllm"]  # no rows: the pool's values
    assert layout.rows["vllm"] == {"bandwidth_share": 10, "compute_share": 10, "step_s": 10, "layer_s": 2}


def test_the_shipped_constants_are_the_fit_of_the_shipped_measurements():
    rows = F.load_rows()
    assert len({r.id for r in rows}) == len(rows) and all(r.source for r in rows)
    refit = F.fit([F.case_of(r) for r in rows], stacks=M.STACKS)
    shipped = M.shipped_calibration()
    for e in M.STACKS:
        for name in F.CONSTANTS:
            assert getattr(shipped.constants(e), name) == pytest.approx(getattr(refit.constants(e), name), rel=0.02), (
                f"{e}.{name}: run bench/fit_perf_model.py --write"
            )


def test_leave_one_out_predicts_rows_it_did_not_see_and_reports_trends():
    truth = M.StackConstants(0.75, 0.5, 8e-4, 6e-6)
    cases = [_observe(_case("qwen3-4b", "B200", c, 15, 7.5), truth, M.Shared()) for c in (1, 4, 8, 16, 32)]
    full = F.fit(cases)
    table = F.leave_one_out(cases, full)
    assert [t["id"] for t in table] == [c.row.id for c in cases]
    for t in table:
        assert t["loo"]["speedup"] == pytest.approx(t["observed"]["speedup"], rel=0.08)
    trend = F.trends(cases, {t["id"]: t["loo"] for t in table})
    assert trend == [
        {
            "stack": "sglang",
            "gpu": "B200",
            "target": "Qwen--Qwen3-4B",
            "concurrency": (1, 32),
            "measured": "falls",
            "predicted": "falls",
            "right": True,
        }
    ]


def _shipped_model(pair, gpu, precision="bf16", tp=1, ctx=512, stack="trtllm"):
    t, d = F._shapes(*PAIRS[pair]) if pair in PAIRS else F._shapes(*pair)
    cal = M.shipped_calibration()
    return M.StepModel(
        t,
        d,
        hw.get_gpu(gpu),
        precision,
        "auto",
        tp,
        ctx,
        cal.constants(stack),
        F.weight_bytes(t, precision),
        cal.shared,
    )


def test_dense_speedups_fall_with_concurrency_as_the_published_runs_do():
    m = _shipped_model("qwen3-4b", "B200", stack="sglang")
    acc = M.Acceptance.from_tau(7.8, 16)
    s = [m.speedup(b, 15, acc) for b in (1, 8, 32, 64)]
    # decode only (no prefill stalls): flat to batch 8, then verification turns compute-bound
    assert s[1] < 1.02 * s[0] and s[1] > s[2] > s[3] and s[0] > 1.5 * s[-1]


def test_a_moe_verify_touches_more_experts_than_a_decode_step():
    m = _shipped_model(("openai--gpt-oss-120b", "z-lab--gpt-oss-120b-DFlash"), "H200", precision="mxfp4")
    assert m._touched(1, 1) < m._touched(1, 10) < m._touched(32, 10) <= 1
    assert m._weights_read(1, 10) > 2 * m._weights_read(1, 1)


def test_tau_from_per_position_acceptance_and_geometric_beyond():
    acc = M.Acceptance(alpha=0.5, per_position=(0.9, 0.7))
    assert acc.tau(1) == pytest.approx(1.9) and acc.tau(2) == pytest.approx(2.6)
    assert acc.tau(3) == pytest.approx(2.6 + 0.35)
    geo = M.Acceptance.from_tau(6.5, 16)
    assert geo.tau(15) == pytest.approx(6.5, abs=1e-6)


def test_the_cpu_plans_from_this_machines_memory_and_the_reference_calibration():
    import os

    gpu = hw.get_gpu("cpu")
    assert gpu.memory_bytes == pytest.approx(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), rel=1e-3)
    assert M.stack_for(gpu) == "reference" and M.stack_for(hw.get_gpu("h100")) == "trtllm"
    from dflash_trt.deploy import pipeline

    p = pipeline.plan_resolved(pipeline.resolve_recipe(R.load_recipe("tiny")))
    assert p.memory.capacity == gpu.memory_bytes and p.calibration.startswith("reference calibration")
    assert not math.isclose(p.memory.capacity, 64e9)


def test_files_say_stack_and_the_old_word_engine_is_refused(tmp_path):
    """Calibration and measurement files say "stack(s)"; the pre-release "engine(s)" is an error
    (CHANGELOG: removed, no release read it), one line naming the file."""
    import json

    new = M.shipped_calibration().as_dict()
    assert "stacks" in new and "engines" not in new
    assert M.Calibration.from_dict(json.loads(json.dumps(new))) == M.Calibration.from_dict(new)
    old = {("engines" if k == "stacks" else k): v for k, v in new.items()}
    with pytest.raises(DFlashError, match="not a dflash-trt calibration"):
        M.Calibration.from_dict(old)
    rows = json.loads((M.data_dir() / F.MEASUREMENTS_FILE).read_text())["rows"]
    assert all("stack" in r and "engine" not in r for r in rows)
    f = tmp_path / "old.json"
    f.write_text(json.dumps({"rows": [{("engine" if k == "stack" else k): v for k, v in r.items()} for r in rows]}))
    with pytest.raises(DFlashError, match="cannot read measurements"):
        F.load_rows(f)
