"""Draft-length schedules mean what the plan says, read the way TensorRT-LLM reads them.

``trtllm_draft_len`` below is TensorRT-LLM's own lookup, written out here from
``tensorrt_llm/_torch/speculative/utils.py::get_draft_len_for_batch_size`` (``bisect_left``:
the first key >= the batch size; above the largest key 0) together with
``DecodingBaseConfig``'s translation of ``max_concurrency: N`` into ``{N: max_draft_len}``.
It is deliberately not the project's ``schedule.lookup``: the emitted keys are checked
against the runtime's reading, not against themselves.
"""

from __future__ import annotations

import random
from bisect import bisect_left

import pytest
import yaml

from dflash_trt.cli import run
from dflash_trt.deploy import pipeline
from dflash_trt.deploy import trtllm_config as trtllm
from dflash_trt.errors import DFlashError, RecipeError
from dflash_trt.plan import recipe as R
from dflash_trt.plan import schedule, trtllm_releases

CURRENT = [
    "gpt-oss-120b-8xb300",
    "gpt-oss-120b-8xh200",
    "llama3.1-8b-b200-nvfp4",
    "llama3.1-8b-h100-fp8",
    "qwen3-8b-b200-fp8",
    "qwen3-8b-b200-nvfp4",
    "qwen3-8b-h100-fp8",
    "qwen3-8b-h200-fp8",
    "tiny",
]


def trtllm_draft_len(spec: dict, batch: int) -> int:
    """TensorRT-LLM's draft length at ``batch`` for an emitted speculative_config (one-model path)."""
    schedule_ = spec.get("draft_len_schedule")
    if spec.get("max_concurrency") is not None:
        schedule_ = {int(spec["max_concurrency"]): spec["max_draft_len"]}
    if schedule_ is None:
        return spec["max_draft_len"]
    keys = sorted(schedule_)
    idx = bisect_left(keys, batch)
    return schedule_[keys[idx]] if idx < len(keys) else 0


def _plan(name, sets=()):
    r = R.load_recipe(name, list(sets))
    res = pipeline.resolve_recipe(r)
    p = pipeline.plan_resolved(res)
    spec = yaml.safe_load(trtllm.trtllm_yaml(trtllm.config(r, p, res.drafter)))["speculative_config"]
    return r, p, spec


def _expand(draft_lengths) -> list[int]:
    out = []
    for row in draft_lengths:
        out += [row.draft_len] * (row.batch_to - row.batch_from + 1)
    return out


def _check_plan_against_trtllm(r, p, spec):
    n = r.serving.max_batch_size
    planned = _expand(p.draft_lengths)
    assert len(planned) == n and p.draft_lengths[0].batch_from == 1
    assert [trtllm_draft_len(spec, b) for b in range(1, n + 1)] == planned, (spec, p.draft_lengths)
    assert planned == sorted(planned, reverse=True)  # monotone non-increasing
    assert planned[0] == p.max_draft_len == spec["max_draft_len"]
    # the zero-draft rule (PR #16888): no release in the table has the floor, so TensorRT-LLM's own
    # lookup must find a length >= 1 at every batch size up to max_batch_size, and no max_concurrency
    assert 0 not in planned and "max_concurrency" not in spec, (spec, p.draft_lengths)
    if "draft_len_schedule" in spec:
        assert max(spec["draft_len_schedule"]) >= n
    for row in p.curve:  # the plan table shows the same
        assert row.draft_len == trtllm_draft_len(spec, row.batch)


@pytest.mark.parametrize("name", sorted(R.bundled_recipes()))
def test_every_bundled_recipe_drafts_what_its_plan_says(name):
    try:
        r, p, spec = _plan(name)
    except DFlashError:
        assert name not in CURRENT, f"{name} no longer plans"
        pytest.skip(f"{name} refuses to plan (an incomplete recipe)")
    _check_plan_against_trtllm(r, p, spec)


@pytest.mark.parametrize("name", CURRENT)
@pytest.mark.parametrize("batch", [1, 3, 17, 45, 100])
def test_any_max_batch_size_drafts_what_the_plan_says(name, batch):
    try:
        r, p, spec = _plan(name, [f"serving.max_batch_size={batch}"])
    except DFlashError as exc:  # some batches do not fit the GPU: a one-line refusal, not a wrong schedule
        assert "does not fit" in str(exc) or "token budget" in str(exc)
        pytest.skip(str(exc))
    _check_plan_against_trtllm(r, p, spec)


def test_the_old_inverted_schedules_are_gone():
    """gpt-oss on 8x B300 used to emit {1: 7, 2: 6}: TensorRT-LLM drafted nothing from batch 3 up."""
    r, p, spec = _plan("gpt-oss-120b-8xb300")
    assert all(trtllm_draft_len(spec, b) >= 6 for b in range(1, 65))
    r, p, spec = _plan("qwen3-8b-h200-fp8")
    assert trtllm_draft_len(spec, 2) == p.max_draft_len == 15


def test_a_schedule_for_max_batch_size_1024():
    r, p, spec = _plan(
        "qwen3-8b-b200-nvfp4", ["serving.max_batch_size=1024", "serving.max_seq_len=512", "speculative.acceptance=3.0"]
    )
    _check_plan_against_trtllm(r, p, spec)
    planned = _expand(p.draft_lengths)
    assert p.schedule == "draft_len_schedule" and len(spec["draft_len_schedule"]) > 5
    # backs off, then the floor (never off: the zero-draft trap), and the plan says what the floor costs
    assert planned[0] == 15 and any(1 < n < 15 for n in planned) and planned[-1] == 1
    assert planned == sorted(planned, reverse=True) and max(spec["draft_len_schedule"]) == 1024
    floor = [w for w in p.warnings if "drafting does not pay" in w]
    assert len(floor) == 1 and "PR #16888" in floor[0] and "drafts 1 token(s) there" in floor[0], p.warnings
    assert "of throughput" in floor[0]
    r, p, spec = _plan(
        "qwen3-8b-b200-nvfp4", ["serving.max_batch_size=1024", "serving.max_seq_len=512", "speculative.acceptance=1.6"]
    )
    _check_plan_against_trtllm(r, p, spec)  # a weak drafter: one length, then the floor (never max_concurrency)
    assert spec["draft_len_schedule"] == {1: 15, 1024: 1}


def test_schedule_none_drafts_the_constant_length():
    r, p, spec = _plan("tiny")
    assert r.speculative.schedule == "none" and "draft_len_schedule" not in spec and "max_concurrency" not in spec
    assert [row.draft_len for row in p.curve] == [7, 7, 7, 7]
    assert [r.model_dump() for r in p.draft_lengths] == [{"batch_from": 1, "batch_to": 8, "draft_len": 7}]


def test_trtllms_documented_example_is_accepted_and_read_as_it_documents():
    r, p, spec = _plan(
        "qwen3-8b-h100-fp8",
        [
            "speculative.max_draft_len=4",
            "speculative.schedule=draft_len_schedule",
            "speculative.draft_len_schedule={4: 4, 8: 2, 32: 1}",
        ],
    )
    assert spec["draft_len_schedule"] == {4: 4, 8: 2, 32: 1}
    assert [r.model_dump() for r in p.draft_lengths] == [
        {"batch_from": 1, "batch_to": 4, "draft_len": 4},
        {"batch_from": 5, "batch_to": 8, "draft_len": 2},
        {"batch_from": 9, "batch_to": 32, "draft_len": 1},
    ]


@pytest.mark.parametrize(
    "sets, needle",
    [
        # TensorRT-LLM's own example stops drafting at 33: on max_batch_size 40 that is the trap
        (
            ["serving.max_batch_size=40", "speculative.draft_len_schedule={4: 4, 8: 2, 32: 1}"],
            "drafts 0 tokens from batch size 33 up to max_batch_size 40",
        ),
        (["speculative.draft_len_schedule={4: 4, 8: 0}"], "drafts 0 tokens from batch size 5 up to max_batch_size 32"),
    ],
)
def test_a_users_schedule_that_drafts_0_is_refused_naming_the_trap(sets, needle, capsys):
    with pytest.raises(RecipeError, match=needle) as exc:
        _plan("qwen3-8b-h100-fp8", ["speculative.max_draft_len=4", "speculative.schedule=draft_len_schedule", *sets])
    msg = str(exc.value)
    assert "zero-draft trap" in msg and "PR #16888" in msg and "1.4.0rc1" in msg and "\n" not in msg
    # and at the door: one line, exit 2
    assert (
        run(
            [
                "plan",
                "qwen3-8b-h100-fp8",
                "--set",
                "speculative.max_draft_len=4",
                "--set",
                "speculative.schedule=draft_len_schedule",
                *[a for x in sets for a in ("--set", x)],
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "zero-draft trap" in err


# a key below 1 is refused by the recipe's range on batch sizes (BatchSize), before the schedule's own check
@pytest.mark.parametrize(
    "bad, needle",
    [
        ({2: 3, 8: 1}, "smallest batch-size key must map"),
        ({1: 4, 8: 9}, "between 0 and max_draft_len"),
        ({0: 4}, r"schedule\.0\.\[key\]: Input should be greater than or equal to 1"),
    ],
)
def test_a_schedule_trtllm_refuses_is_refused(bad, needle):
    with pytest.raises(RecipeError, match=needle):
        _plan(
            "qwen3-8b-h100-fp8",
            [
                "speculative.max_draft_len=4",
                "speculative.schedule=draft_len_schedule",
                f"speculative.draft_len_schedule={bad}",
            ],
        )


def test_max_concurrency_is_refused_where_it_means_the_trap_and_dropped_where_it_never_applies():
    with pytest.raises(RecipeError, match="max_concurrency 12 turns drafting off above it.*zero-draft trap"):
        _plan("qwen3-8b-h100-fp8", ["speculative.schedule=max_concurrency", "speculative.max_concurrency=12"])
    r, p, spec = _plan("qwen3-8b-h100-fp8", ["speculative.schedule=max_concurrency", "speculative.max_concurrency=32"])
    assert "max_concurrency" not in spec and p.schedule == "none"  # max_batch_size 32: it never applies
    _check_plan_against_trtllm(r, p, spec)
    # without a value, the planner's back-off is written as a schedule that ends at the floor
    r, p, spec = _plan(
        "qwen3-8b-b200-nvfp4",
        [
            "serving.max_batch_size=1024",
            "serving.max_seq_len=512",
            "speculative.acceptance=1.6",
            "speculative.schedule=max_concurrency",
        ],
    )
    assert spec["draft_len_schedule"] == {1: 15, 1024: 1}
    _check_plan_against_trtllm(r, p, spec)


def _random_lengths(rng, n, top):
    """A random non-increasing sequence of draft lengths over batch sizes 1..n, starting at top."""
    cuts = sorted(rng.sample(range(2, n + 1), k=min(n - 1, rng.randint(0, 5)))) if n > 1 else []
    out, value, prev = [], top, 1
    for c in cuts + [n + 1]:
        out += [value] * (c - prev)
        prev, value = c, rng.randint(0, value)
    return out


@pytest.mark.parametrize("lookup, floor", [("upper_bound", 0), ("lower_bound", 0), ("upper_bound", 1)])
def test_emit_reads_back_for_each_release_semantics(lookup, floor):
    release = trtllm_releases.Release("test", ("VANILLA",), frozenset(), schedule_lookup=lookup, draft_len_floor=floor)
    rng = random.Random(0)
    for _ in range(200):
        n, top = rng.randint(1, 300), rng.randint(1, 15)
        want = [max(v, floor) for v in _random_lengths(rng, n, top)]
        sched = schedule.emit_schedule(schedule.schedule_runs(want), release)
        schedule.check_schedule(sched, top)  # TensorRT-LLM's validator accepts it
        assert schedule.lengths(n, top, release, schedule=sched) == want
        assert list(sched) == sorted(sched)


def test_lower_bound_keys_are_the_first_batch_of_each_run():
    release = trtllm_releases.Release("old", ("VANILLA",), frozenset(), schedule_lookup="lower_bound")
    runs = schedule.schedule_runs([7] * 4 + [5] * 4 + [0] * 8)
    assert schedule.emit_schedule(runs, release) == {1: 7, 5: 5, 9: 0}
    upper = trtllm_releases.get_release("1.4.0rc1")
    assert schedule.emit_schedule(runs, upper) == {4: 7, 8: 5}


def _fake_trtllm(root, floor: int | None):
    """A stand-in ``tensorrt_llm`` with the LLM-API classes the rule reads: ``DecodingBaseConfig``
    with ``min_runtime_draft_len`` (a per-mode property, newest main) or without it (released builds)."""
    pkg = root / "tensorrt_llm"
    (pkg / "llmapi").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "version.py").write_text('__version__ = "9.9.9"\n')
    prop = (
        ""
        if floor is None
        else (
            f"    @property\n    def min_runtime_draft_len(self):\n        return {floor}\n\n"
            "    @property\n    def keep_drafter_warm(self):\n        return False\n"
        )
    )
    (pkg / "llmapi" / "__init__.py").write_text("")
    (pkg / "llmapi" / "llm_args.py").write_text(
        "from pydantic import BaseModel\n\n\nclass DecodingBaseConfig(BaseModel):\n"
        f"    max_draft_len: int | None = None\n{prop}\n\nclass DFlashDecodingConfig(DecodingBaseConfig):\n    pass\n"
    )
    return root


@pytest.mark.parametrize("floor, trap", [(None, True), (1, False)])
def test_the_rule_reads_the_installed_classes(tmp_path, monkeypatch, floor, trap):
    import sys

    monkeypatch.syspath_prepend(str(_fake_trtllm(tmp_path, floor)))
    for name in [m for m in sys.modules if m.startswith("tensorrt_llm")]:  # another test's stand-in, restored after
        monkeypatch.delitem(sys.modules, name)
    try:
        rule = schedule.zero_draft_rule(trtllm_releases.get_release("1.4.0rc1"))
        assert rule.trap is trap and rule.shortest == 1 and "installed TensorRT-LLM 9.9.9" in rule.source
        bad = rule.refusal(32, 4, schedule={4: 4, 8: 0})
        assert (bad is not None) is trap  # with the floor, TensorRT-LLM drafts 1 where the schedule says 0
    finally:  # this stand-in leaves with the test
        for name in [m for m in sys.modules if m.startswith("tensorrt_llm")]:
            del sys.modules[name]
