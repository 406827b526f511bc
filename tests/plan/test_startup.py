"""Memory through start-up (plan.startup), sizing instead of refusing (plan.sizing), attention backends by rule.

Hand figures from the published Qwen3-8B config and its z-lab drafter (tests/plan/test_deployment.py's
docstring); TensorRT-LLM's captured batch sizes from ``CudaGraphConfig._generate_cuda_graph_batch_sizes``
and ``DecodeCudaGraphConfig._merge_schedule_keys``."""

from __future__ import annotations

import json

import pytest

from dflash_trt.cli import run
from dflash_trt.deploy import pipeline
from dflash_trt.deploy import trtllm_config as trtllm
from dflash_trt.errors import DFlashError, HardwareError, RecipeError
from dflash_trt.plan import deployment as P
from dflash_trt.plan import hardware as hw
from dflash_trt.plan import recipe as R
from dflash_trt.plan import startup, trtllm_releases, trtllm_rules
from dflash_trt.plan.model_shapes import DraftShape, TargetShape
from dflash_trt.plan.recipe import ServingSpec

CONFIGS = R._bundled_dir() / "configs"
GiB = 1 << 30
PAIR = ["--target", str(CONFIGS / "Qwen--Qwen3-8B"), "--drafter", str(CONFIGS / "z-lab--Qwen3-8B-DFlash-b16")]


@pytest.fixture(scope="module")
def qwen():
    return TargetShape.from_dir(CONFIGS / "Qwen--Qwen3-8B"), DraftShape.from_dir(CONFIGS / "z-lab--Qwen3-8B-DFlash-b16")


def _dep(qwen, gpu="h100"):
    t, d = qwen
    return P.Deployment(target=t, drafter=d, gpu=hw.get_gpu(gpu), gpus=1, precision="fp8", kv_cache="auto")


def test_captured_batch_sizes_follow_tensorrt_llm_and_add_schedule_keys():
    assert startup.captured_batch_sizes(1) == [1]
    assert startup.captured_batch_sizes(20) == [1, 2, 4, 8, 16, 20]
    assert startup.captured_batch_sizes(256) == [1, 2, 4, *range(8, 129, 8), 192, 256]
    # keys at or under the graph maximum each add a graph; a key above it adds none
    assert startup.captured_batch_sizes(32, {13: 15, 23: 11, 64: 4}) == [1, 2, 4, 8, 13, 16, 23, 24, 32]
    assert startup.captured_batch_sizes(40, enable_padding=False) == [*range(1, 33), 40]


def test_dense_arena_sits_beside_the_pool_and_the_paged_one_inside(qwen):
    serving = ServingSpec(max_batch_size=16, max_seq_len=8192)
    dense = P.memory(_dep(qwen), 1, serving, backend="VANILLA")
    paged = P.memory(_dep(qwen, "b200"), 1, serving, backend="TRTLLM")
    assert dense.after_pool == dense.drafter_arena + dense.activations + dense.cuda_graphs + 4 * GiB
    assert dense.in_pool == dense.kv_cache
    assert paged.in_pool == paged.kv_cache + paged.drafter_arena
    assert paged.after_pool == paged.activations + paged.cuda_graphs + 4 * GiB
    # per slot the checkpoint's block (16), whatever the runtime draft length (PR #17935's review)
    assert P.drafter_arena(qwen[1], 1, serving, 3) == 2 * 17 * 5 * (8192 + 16) * 8 * 128 * 2


def test_pr19466_estimate_by_hand():
    est = startup.pr19466(100 * GiB, 50 * GiB, 0.8, 7 * GiB, "VANILLA")
    assert est["budget"] == int((100 - 50 - 4) * GiB * 0.2 * 0.70) and est["verdict"] == "raises"
    assert startup.pr19466(100 * GiB, 50 * GiB, 0.8, 7 * GiB, "TRTLLM")["verdict"] == "warns"
    assert startup.pr19466(100 * GiB, 50 * GiB, 0.8, 6 * GiB, "VANILLA")["verdict"] == "fits"
    assert "open" in est["source"]


def test_the_readme_pair_on_h100_is_sized_not_refused(capsys):
    """`build --target T --drafter D --gpu h100 --precision fp8 --dry-run` was refused at 96.6 of 74.5 GiB."""
    assert run(["plan", *PAIR, "--gpu", "h100", "--precision", "fp8", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)["plan"]
    assert plan["sized"] == [{"key": "serving.max_batch_size", "from": 64, "to": 32, "why": plan["sized"][0]["why"]}]
    assert "does not fit on 1x H100" in plan["sized"][0]["why"]
    assert plan["max_batch_size"] == 32 and plan["max_seq_len"] == 8192 and plan["memory"]["fits"]
    assert any(w.startswith("serving.max_batch_size lowered from 64 to 32") for w in plan["warnings"])
    assert run(["build", *PAIR, "--gpu", "h100", "--precision", "fp8", "--dry-run"]) == 0


def test_a_value_the_user_set_is_honoured_or_refused_in_one_line(capsys):
    # the user's max_seq_len stays; the default batch is lowered around it
    assert (
        run(["plan", *PAIR, "--gpu", "h100", "--precision", "fp8", "--set", "serving.max_seq_len=16384", "--json"]) == 0
    )
    plan = json.loads(capsys.readouterr().out)["plan"]
    assert plan["max_seq_len"] == 16384 and [c["key"] for c in plan["sized"]] == ["serving.max_batch_size"]
    # the user's batch cannot be lowered: one line naming it, exit 2
    assert (
        run(
            [
                "plan",
                *PAIR,
                "--gpu",
                "h100",
                "--precision",
                "fp8",
                "--set",
                "serving.max_batch_size=64",
                "--set",
                "serving.max_seq_len=8192",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "serving.max_batch_size=64, serving.max_seq_len=8192" in err


def test_a_user_fraction_that_starves_start_up_is_refused_naming_it(capsys):
    base = ["plan", "qwen3-8b-h100-fp8", "--set"]
    assert run([*base, "serving.kv_cache_free_gpu_memory_fraction=0.95"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "serving.kv_cache_free_gpu_memory_fraction 0.95" in err
    assert "set it <= 0.8" in err
    assert run([*base, "serving.kv_cache_free_gpu_memory_fraction=0.7", "--json"]) == 0  # honoured
    plan = json.loads(capsys.readouterr().out)["plan"]
    assert plan["kv_cache_free_gpu_memory_fraction"] == 0.7 and plan["memory"]["budget"]["fraction_source"] == "recipe"


def test_plan_prints_our_budget_beside_the_open_pr_estimate(capsys):
    assert run(["plan", "qwen3-8b-h100-fp8"]) == 0
    out = capsys.readouterr().out
    assert "CUDA graphs (" in out and "start-up headroom" in out
    assert "free_gpu_memory_fraction 0.8" in out and "PR #19466 estimate (an open pull request" in out


def test_config_writes_the_planned_sizes_and_fraction():
    r = R.load_recipe("qwen3-8b-h100-fp8", ["serving.max_batch_size=16"])
    res = pipeline.resolve_recipe(r)
    p = pipeline.plan_resolved(res)
    cfg = trtllm.config(r, p, res.drafter)
    assert cfg.kv_cache_config.free_gpu_memory_fraction == p.memory.fraction > 0.85  # more room at batch 16
    assert cfg.attn_backend == "TRTLLM" and cfg.max_batch_size == 16


@pytest.mark.parametrize(
    "gpu,backend,match",
    [
        ("b200", "FA4", "FA4 is SM90 only"),
        ("h100", "TRTLLM", "TRTLLM needs an SM100/SM103"),
    ],
)
def test_a_draft_backend_the_rule_forbids_is_refused_naming_the_rule(gpu, backend, match):
    with pytest.raises((HardwareError, RecipeError), match=match):
        trtllm_rules.attention_backend(backend, hw.get_gpu(gpu), trtllm_releases.get_release("1.4.0rc1"), [])


def test_head_dim_and_gpu_pick_the_draft_backend():
    rel, w = trtllm_releases.get_release("1.4.0rc1"), []
    assert trtllm_rules.attention_backend("auto", hw.get_gpu("h100"), rel, w, 128) == "FA4"
    assert trtllm_rules.attention_backend("auto", hw.get_gpu("b200"), rel, w, 256) == "TRTLLM"
    assert trtllm_rules.attention_backend("auto", hw.get_gpu("h100"), rel, w, 512) == "VANILLA"
    assert "head_dim 512" in w[0]
    with pytest.raises(RecipeError, match="FA4 takes head_dim 8-256"):
        trtllm_rules.attention_backend("FA4", hw.get_gpu("h100"), rel, [], 260)
    assert trtllm_rules.attention_backend("VANILLA", hw.get_gpu("b200"), rel, []) == "VANILLA"  # always allowed


def test_the_target_attn_backend_is_never_flashinfer_for_dflash():
    assert trtllm_rules.target_attn_backend(None) == "TRTLLM"
    with pytest.raises(RecipeError, match="FLASHINFER cannot verify K \\+ 1 tokens"):
        trtllm_rules.target_attn_backend("FLASHINFER")
    r = R.load_recipe("qwen3-8b-h100-fp8")
    res = pipeline.resolve_recipe(r)
    data = trtllm.config(r, pipeline.plan_resolved(res), res.drafter).model_dump(mode="json", exclude_unset=True)
    with pytest.raises(DFlashError, match="FLASHINFER cannot verify"):
        trtllm.validate_trtllm_config({**data, "attn_backend": "FLASHINFER"})
    mtp = {**data, "attn_backend": "FLASHINFER", "speculative_config": {"decoding_type": "MTP"}}
    assert trtllm.validate_trtllm_config(mtp).attn_backend == "FLASHINFER"  # the rule is DFlash's, not every arm's
