"""plan --calibration: measurements of the user's own server move the plan toward them."""

from __future__ import annotations

import json

import pytest

from dflash_trt.cli import run
from dflash_trt.deploy import pipeline
from dflash_trt.plan import deployment as P
from dflash_trt.plan import perf_model as M
from dflash_trt.plan import recipe as R
from dflash_trt.plan import silicon

RECIPE, SETS = "qwen3-8b-h100-fp8", ["serving.max_seq_len=256", "serving.max_batch_size=16"]
LEVELS = (1, 4, 16)
TRUE_TAU = 4.0


def _truth_model(plan, r):
    """A deployment that is not the shipped calibration: slower steps, less bandwidth."""
    res = pipeline.resolve_recipe(r)
    dep = P.Deployment(res.target, res.drafter, res.gpu, res.gpus, res.precision, r.precision.kv_cache)
    cal = M.Calibration({"trtllm": M.StackConstants(0.55, 0.35, 5e-3, 15e-6)}, M.shipped_calibration().shared)
    return P.step_model(dep, plan.tp, 64 + 128 // 2, cal)


def _lengths(plan):
    return plan.lengths()


def _bench_json(path, plan, model):
    """What `bench --endpoint DFLASH --baseline AR --json` would write for that deployment."""
    lengths = _lengths(plan)

    def level(c, drafting):
        L = lengths[c - 1] if drafting else 0
        acc = M.Acceptance.from_tau(TRUE_TAU, L + 1) if L else None
        user = model.per_user(c, L, acc) if L else model.per_user(c, 0, M.Acceptance(0.5))
        return {
            "concurrency": c,
            "tokens_per_second_per_user": user,
            "output_tokens_per_second": c * user,
            "acceptance_length": TRUE_TAU if L else 1.0,
        }

    report = {
        "max_tokens": 128,
        "endpoint": {"url": "http://dflash", "model": "m", "levels": [level(c, True) for c in LEVELS]},
        "baseline": {"url": "http://ar", "model": "m", "levels": [level(c, False) for c in LEVELS]},
    }
    path.write_text(json.dumps(report))
    return report


def _error(plan, report):
    """Mean |predicted / measured - 1| of tokens/s per user, DFlash and baseline, at the levels."""
    pred = {r.batch: r.model_dump() for r in plan.predicted}
    errs = []
    for side, key in (("endpoint", "tokens_per_second_per_user"), ("baseline", "baseline_tokens_per_second_per_user")):
        for lv in report[side]["levels"]:
            errs.append(abs(pred[lv["concurrency"]][key] / lv["tokens_per_second_per_user"] - 1))
    return sum(errs) / len(errs)


def test_calibration_moves_the_plan_toward_the_measurements(tmp_path, capsys, monkeypatch):
    # the shipped calibrated model as the starting point (without the measured tables of plan.silicon,
    # which a plan uses where aiconfigurator-core is installed): the calibration refits its constants
    monkeypatch.setattr(silicon, "installed", lambda: None)
    r = R.load_recipe(RECIPE, SETS)
    first = pipeline.plan_resolved(pipeline.resolve_recipe(r))
    report = _bench_json(tmp_path / "bench.json", first, _truth_model(first, r))
    calibrated = pipeline.plan_resolved(pipeline.resolve_recipe(r), calibration=[tmp_path / "bench.json"])
    before, after = _error(first, report), _error(calibrated, report)
    assert before > 0.3 and after < 0.1 and after < before / 4, (before, after)
    assert calibrated.calibration.startswith("trtllm calibration (your measurements: bench.json, 6 levels")
    assert calibrated.acceptance < first.acceptance  # the measured tau (4.0 at its length) replaces 6.5
    # through the command line, with the calibration it used printed
    assert (
        run(["plan", RECIPE, *sum((["--set", s] for s in SETS), []), "--calibration", str(tmp_path / "bench.json")])
        == 0
    )
    assert "step model: trtllm calibration (your measurements: bench.json" in capsys.readouterr().out


def _tables_of(r, plan):
    res = pipeline.resolve_recipe(r)
    return silicon.silicon_tables(
        str(res.target_dir),
        res.gpu.name,
        "trtllm",
        res.precision,
        plan.tp,
        res.target.layers,
        r.trtllm.release,
        r.precision.kv_cache,
    )


def test_calibration_corrects_the_combined_model_and_keeps_the_tables(tmp_path):
    # on a GPU the tables hold, the user's rows refit the drafter, per-layer and loop terms over the
    # tables' target step: the measured-kernel target cost stays, the prediction moves to the rows
    pytest.importorskip("aiconfigurator_core")
    r = R.load_recipe(RECIPE, SETS)
    first = pipeline.plan_resolved(pipeline.resolve_recipe(r))
    assert first.step_sources["target_forward"].startswith("aiconfigurator-core")
    tables = _tables_of(r, first)
    slow = M.StackConstants(0.55, 0.35, 5e-3, 15e-6)  # a slower loop and drafter than the combined model's
    truth = silicon.combined(_truth_model(first, r), tables, refitted=True)
    assert truth.k == _truth_model(first, r).k and truth.k.step_s == slow.step_s
    report = _bench_json(tmp_path / "bench.json", first, truth)
    calibrated = pipeline.plan_resolved(pipeline.resolve_recipe(r), calibration=[tmp_path / "bench.json"])
    before, after = _error(first, report), _error(calibrated, report)
    assert before > 0.2 and after < 0.05 and after < before / 4, (before, after)
    assert calibrated.step_sources["target_forward"] == first.step_sources["target_forward"]
    assert "over the tables' target step" in calibrated.step_sources["drafter"]
    assert "over the measured tables' target step" in calibrated.calibration
    # without the file nothing changes: the same plan as before the calibrated one
    again = pipeline.plan_resolved(pipeline.resolve_recipe(r))
    assert again.curve == first.curve and again.predicted == first.predicted
    assert again.step_sources == first.step_sources


def test_a_plan_says_which_calibration_it_used(capsys):
    assert run(["plan", RECIPE, "--json"]) == 0
    p = json.loads(capsys.readouterr().out)["plan"]
    assert p["calibration"].startswith("trtllm calibration (") and "measurement rows per constant" in p["calibration"]
    assert [r["batch"] for r in p["predicted"]] == [r["batch"] for r in p["curve"]]
    row = p["predicted"][0]
    assert row["speedup"] == pytest.approx(
        row["tokens_per_second_per_user"] / row["baseline_tokens_per_second_per_user"], rel=1e-2
    )


@pytest.mark.parametrize(
    "content, says",
    [
        ("{", "invalid JSON"),
        ('{"levels": []}', "not the JSON of"),
        ('{"endpoint": {"levels": []}}', "no level with tokens/s"),
    ],
)
def test_a_bad_calibration_file_is_one_line(tmp_path, capsys, content, says):
    f = tmp_path / "c.json"
    f.write_text(content)
    assert run(["plan", RECIPE, "--calibration", str(f)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err
    assert run(["plan", RECIPE, "--calibration", str(tmp_path / "missing.json")]) == 2
    assert "cannot read" in capsys.readouterr().err
