"""The typed plan: the manifest stores it as a model, its JSON keeps every key path the plan dict
had before it was typed (additions only), a plan from an older build reads or is told to rebuild
in one line, and the schema the docs publish covers what is serialised."""

from __future__ import annotations

import json

import pytest

from dflash_trt import ingest
from dflash_trt import plan as planner
from dflash_trt.deploy import pipeline
from dflash_trt.errors import CheckpointError
from dflash_trt.ingest.plan_record import WRITTEN_WHEN_SET
from dflash_trt.plan import recipe as R

# Key paths of ``plan --json``'s plan for qwen3.5-4b-h100-bf16 (the one with an MTP arm), as the
# untyped planner (a dataclass's asdict) wrote them; ``draft_len_schedule``'s keys are data, not schema.
BEFORE = [
    "acceptance",
    "alpha",
    "attention_backend",
    "block_size",
    "calibration",
    "context_recompute_tail",
    "curve",
    "curve[].batch",
    "curve[].draft_len",
    "curve[].mtp_speedup",
    "curve[].range_basis",
    "curve[].speedup",
    "curve[].speedup_range",
    "curve[].winner",
    "draft_len_schedule",
    "draft_lengths",
    "draft_lengths[].batch_from",
    "draft_lengths[].batch_to",
    "draft_lengths[].draft_len",
    "enable_chunked_prefill",
    "ep",
    "gpu",
    "gpus",
    "kv_cache",
    "max_concurrency",
    "max_draft_len",
    "max_num_tokens",
    "memory",
    "memory.activations",
    "memory.arena_in_kv_pool",
    "memory.capacity",
    "memory.draft_kv_pool",
    "memory.drafter",
    "memory.drafter_arena",
    "memory.fits",
    "memory.kv_cache",
    "memory.missing",
    "memory.reserve",
    "memory.total",
    "memory.weights",
    "moe_backend",
    "mtp",
    "mtp.acceptance",
    "mtp.alpha",
    "mtp.layers",
    "mtp.num_nextn_predict_layers",
    "mtp.source",
    "mtp.tau_ratio_to_dflash",
    "precision",
    "predicted",
    "predicted[].baseline_output_tokens_per_second_per_gpu",
    "predicted[].baseline_tokens_per_second_per_user",
    "predicted[].batch",
    "predicted[].draft_len",
    "predicted[].output_tokens_per_second_per_gpu",
    "predicted[].range_basis",
    "predicted[].speedup",
    "predicted[].speedup_range",
    "predicted[].tokens_per_second_per_user",
    "schedule",
    "tp",
    "trtllm_release",
    "vllm_schedule",
    "vllm_schedule.num_speculative_tokens",
    "vllm_schedule.num_speculative_tokens_per_batch_size",
    "warnings",
]


def key_paths(o, pre: str = "") -> set[str]:
    out: set[str] = set()
    if isinstance(o, dict):
        for k, v in o.items():
            p = f"{pre}.{k}" if pre else k
            out |= {p} | (set() if p == "draft_len_schedule" else key_paths(v, p))
    elif isinstance(o, list):
        for v in o:
            out |= key_paths(v, pre + "[]")
    return out


@pytest.fixture(scope="module")
def mtp_plan() -> ingest.Plan:
    return pipeline.plan_resolved(pipeline.resolve_recipe(R.load_recipe("qwen3.5-4b-h100-bf16", [])))


def test_plan_is_the_typed_model_and_keeps_every_key_path(mtp_plan):
    assert isinstance(mtp_plan, planner.Plan) and planner.Plan is ingest.Plan
    assert isinstance(mtp_plan.curve[0], ingest.CurvePoint) and isinstance(mtp_plan.mtp, ingest.PlannedMtp)
    data = json.loads(json.dumps(mtp_plan.to_json()))
    assert set(BEFORE) <= key_paths(data)  # additions only
    assert data["memory"]["total"] == mtp_plan.memory.total and data["memory"]["fits"] is True
    # draft_len_schedule keys stay JSON strings of the batch-size bounds
    assert all(k.isdigit() for k in data["draft_len_schedule"])


def test_rows_write_only_the_keys_they_have():
    p = pipeline.plan_resolved(pipeline.resolve_recipe(R.load_recipe("tiny", [])))
    data = p.to_json()
    assert p.mtp is None and data["mtp"] is None  # the plan's own fields always written
    assert all("mtp_speedup" not in row for row in data["curve"])  # a row's absent key stays absent
    assert "tuned" not in data and "arms" not in data  # tune's sections only once tune set them
    required = {k: getattr(p, k) for k, f in ingest.Plan.model_fields.items() if f.is_required()}
    bare = ingest.Plan(**required).to_json()  # defaults written too (null included)
    assert set(bare) == set(ingest.Plan.model_fields) - WRITTEN_WHEN_SET and bare["vllm_schedule"] is None


def test_plan_json_reads_back_equal(mtp_plan):
    """What the manifest holds (and a plan written before typing: the same JSON) validates to the
    same plan, field for field, derived memory totals included."""
    data = json.loads(json.dumps(mtp_plan.to_json()))
    again = ingest.Plan.model_validate(data)
    assert again == mtp_plan and again.to_json() == mtp_plan.to_json()
    assert again.draft_len_schedule == mtp_plan.draft_len_schedule  # int keys again
    assert again.lengths()[0] == again.max_draft_len and again.draft_len_at(10_000) == 0


@pytest.mark.parametrize(
    "broken, where",
    [
        (lambda p: p.pop("tp"), "plan.tp"),
        (lambda p: p.update(schedule="sometimes"), "plan.schedule"),
        (lambda p: p["curve"][0].pop("speedup"), "plan.curve.0.speedup"),
    ],
)
def test_an_older_or_edited_plan_is_told_to_rebuild_in_one_line(tmp_path, mtp_plan, broken, where):
    plan = json.loads(json.dumps(mtp_plan.to_json()))
    broken(plan)
    (tmp_path / ingest.Layout.MANIFEST).write_text(json.dumps({"format": ingest.BUNDLE_FORMAT, "plan": plan}))
    with pytest.raises(CheckpointError) as exc:
        ingest.read_manifest(tmp_path)
    msg = str(exc.value)
    assert "\n" not in msg and where in msg and "rebuild the bundle" in msg


def test_a_manifest_holds_the_plan_as_a_model(tmp_path, mtp_plan):
    m = ingest.Manifest(name="x", plan=mtp_plan)
    ingest.write_manifest(tmp_path, m)
    back = ingest.read_manifest(tmp_path)
    assert isinstance(back.plan, ingest.Plan) and back.plan == mtp_plan
    assert json.loads((tmp_path / ingest.Layout.MANIFEST).read_text())["plan"] == mtp_plan.to_json()


def test_the_published_schema_covers_the_serialised_plan(mtp_plan):
    schema = planner.plan_schema()
    assert schema["title"] == "Plan" and set(schema["required"]) >= {"tp", "memory", "schedule", "trtllm_release"}
    top = {p.split(".")[0].split("[")[0] for p in key_paths(mtp_plan.to_json())}
    assert top <= set(schema["properties"])
    memory = schema["$defs"]["PlanMemory"]["properties"]
    assert {"total", "fits", "missing"} <= set(memory)  # the derived totals are stored too
    assert schema["$defs"]["CurvePoint"]["properties"]["speedup"]["description"]
