"""The MTP arm and the plan's ranges: configs, the step model's MTP term, the winner per batch,
and the ranges the leave-one-out errors give (contract level: nothing runs MTP here)."""

from __future__ import annotations

import json

import pytest
import yaml

from dflash_trt.deploy import pipeline
from dflash_trt.deploy import trtllm_config as trtllm
from dflash_trt.errors import DFlashError, RecipeError
from dflash_trt.plan import mtp, uncertainty
from dflash_trt.plan import recipe as R
from dflash_trt.plan.model_shapes import read_config  # noqa: F401 - the configs the arm reads
from dflash_trt.plan.perf_model import data_dir


@pytest.fixture(scope="module")
def qwen35():
    r = pipeline.resolve_recipe(R.load_recipe("qwen3.5-4b-h100-bf16", []))
    return r, pipeline.plan_resolved(r)


def test_mtp_layers_read_from_the_real_configs():
    configs = data_dir().parent.parent / "recipes" / "configs"
    assert mtp.mtp_layers_of(configs / "Qwen--Qwen3.5-4B") == 1  # text_config.mtp_num_hidden_layers
    assert mtp.mtp_layers_of(configs / "Qwen--Qwen3-8B") == 0
    assert mtp.mtp_layers({"model_type": "deepseek_v3", "num_nextn_predict_layers": 1}) == 1
    assert mtp.mtp_layers({"text_config": {"mtp_num_hidden_layers": 2}}) == 2


def test_plan_has_the_mtp_arm_and_a_winner_per_batch(qwen35):
    r, p = qwen35
    assert r.mtp_layers == 1 and p.mtp.layers == 1
    assert 1 <= p.mtp.num_nextn_predict_layers <= mtp.MAX_DRAFT
    for row in p.curve:
        arms = {"dflash": row.speedup if row.draft_len else 1.0, "mtp": row.mtp_speedup, "autoregressive": 1.0}
        assert row.winner == max(arms, key=arms.get)
    d = json.loads(json.dumps(p.to_json()))
    assert d["mtp"]["acceptance"] < d["acceptance"]  # published: MTP τ below DFlash's on the same target


def test_no_mtp_arm_without_mtp_layers():
    p = pipeline.plan_resolved(pipeline.resolve_recipe(R.load_recipe("qwen3-8b-h100-fp8", [])))
    assert p.mtp is None and all("mtp_speedup" not in row for row in p.to_json()["curve"])
    assert {row.winner for row in p.curve} <= {"dflash", "autoregressive"}


def test_mtp_step_model(qwen35):
    r, p = qwen35
    from dflash_trt.plan.deployment import step_model

    m = step_model(pipeline.planner.Deployment(r.target, r.drafter, r.gpu, r.gpus, r.precision, "auto"), 1, 2048)
    assert mtp.speedup(m, 1, 0, mtp.acceptance(pipeline.planner.Acceptance(alpha=0.8))) == 1.0
    steps = [mtp.step(m, 4, n) for n in range(0, 8)]
    assert steps == sorted(steps)  # every extra draft costs an MTP pass
    assert mtp.step(m, 4, 3) - mtp.step(m, 4, 2) > mtp.mtp_forward(m, 4) * 0.99


def test_mtp_config_is_validated_and_round_trips(qwen35, tmp_path):
    r, p = qwen35
    cfg = trtllm.config(r.recipe, p, target=r.target, arm="mtp")
    assert cfg.speculative_config.decoding_type == "MTP"
    trtllm.write(tmp_path, trtllm.config(r.recipe, p, r.drafter, r.target), "0.0.0.0", 8000, mtp=cfg)
    data = yaml.safe_load((tmp_path / trtllm.MTP_CONFIG).read_text())
    assert data["speculative_config"] == {
        "decoding_type": "MTP",
        "num_nextn_predict_layers": p.mtp.num_nextn_predict_layers,
    }
    assert trtllm.validate_trtllm_config(data, p.trtllm_release).speculative_config.num_nextn_predict_layers >= 1
    bad = dict(data, speculative_config={**data["speculative_config"], "mask_token_id": 5})
    with pytest.raises(DFlashError, match="mask_token_id"):
        trtllm.validate_trtllm_config(bad)
    lossy = dict(data, speculative_config={**data["speculative_config"], "use_relaxed_acceptance_for_thinking": True})
    with pytest.raises(DFlashError, match="lossless"):
        trtllm.validate_trtllm_config(lossy)


def test_no_mtp_config_for_a_target_without_mtp():
    r = pipeline.resolve_recipe(R.load_recipe("qwen3-8b-h100-fp8", []))
    with pytest.raises(RecipeError, match="no MTP layers"):
        trtllm.config(r.recipe, pipeline.plan_resolved(r), target=r.target, arm="mtp")


# --- ranges ------------------------------------------------------------------------------


def _err(stack, gpu, c, e, i=0):
    return uncertainty.RowError(f"r{i}", stack, gpu, c, "speedup", e)


def test_comparable_rows_tiers():
    rows = [
        _err("trtllm", "B200", 1, 0.1, 1),
        _err("trtllm", "B300", 1, -0.05, 2),
        _err("trtllm", "B200", 32, 0.3, 3),
        _err("sglang", "H200", 8, 0.2, 4),
        _err("sglang", "H100", 8, 0.0, 5),
    ]
    got, label = uncertainty.comparable(rows, "trtllm", "GB200", 1)
    assert {e.id for e in got} == {"r1", "r2"} and label == "trtllm Blackwell c1"
    got, label = uncertainty.comparable(rows, "trtllm", "B200", 8)
    assert {e.id for e in got} == {"r1", "r2", "r3"}  # no c2-8 rows: any concurrency
    got, label = uncertainty.comparable(rows, "trtllm", "H200", 8)
    assert {e.id for e in got} == {"r4", "r5"} and label == "all stacks Hopper"


def test_range_brackets_the_prediction_and_own_rows_narrow_it(qwen35):
    r, p = qwen35
    for row in p.curve:
        lo, hi = row.speedup_range
        assert lo <= row.speedup <= hi and lo < hi
    rng = uncertainty.speedup_range(
        3.0, [_err("trtllm", "B200", 1, 0.25), _err("trtllm", "B200", 1, -0.1)], "trtllm", "B200", 1
    )
    assert (rng.low, rng.high) == (2.4, pytest.approx(3.333, abs=1e-3))  # measured = predicted / (1 + e)
    own = [_err("trtllm", "H100", 1, 0.02, 1), _err("trtllm", "H100", 1, -0.01, 2)]
    dep = pipeline.planner.Deployment(r.target, r.drafter, r.gpu, r.gpus, r.precision, "auto", 1)
    narrow = pipeline.planner.make_plan(
        dep, r.recipe.serving, r.recipe.speculative, r.recipe.parallel, r.recipe.trtllm, errors=own
    )
    for a, b in zip(p.curve, narrow.curve, strict=True):
        assert b.speedup_range[1] - b.speedup_range[0] < a.speedup_range[1] - a.speedup_range[0]
        assert b.range_basis.startswith("your measurements")


def test_shipped_loo_table_covers_every_published_row():
    from dflash_trt.plan import perf_fit

    ids = {e.id for e in uncertainty.shipped_errors()}
    assert ids == {r.id for r in perf_fit.load_rows()}


def test_your_measurements_narrow_the_ranges(tmp_path, capsys):
    """plan --calibration: the ranges rest on the user's own levels (leave-one-out over them)."""
    from dflash_trt.cli import run
    from tests.plan import test_calibrate as tc

    r = R.load_recipe(tc.RECIPE, tc.SETS)
    first = pipeline.plan_resolved(pipeline.resolve_recipe(r))
    tc._bench_json(tmp_path / "bench.json", first, tc._truth_model(first, r))
    assert (
        run(
            [
                "plan",
                tc.RECIPE,
                *sum((["--set", s] for s in tc.SETS), []),
                "--json",
                "--calibration",
                str(tmp_path / "bench.json"),
            ]
        )
        == 0
    )
    cal = json.loads(capsys.readouterr().out)["plan"]
    for a, b in zip(first.curve, cal["curve"], strict=True):
        assert b["range_basis"].startswith("your measurements")
        assert b["speedup_range"][0] <= b["speedup"] <= b["speedup_range"][1]
        width = (b["speedup_range"][1] - b["speedup_range"][0]) / b["speedup"]
        assert width < (a.speedup_range[1] - a.speedup_range[0]) / a.speedup


def test_winner_is_the_fastest_arm():
    assert mtp.arm_winner(1.5, 1.8) == "mtp" and mtp.arm_winner(2.0, 1.8) == "dflash"
    assert mtp.arm_winner(0.9, None) == "autoregressive" and mtp.arm_winner(0.9, 0.95) == "autoregressive"
