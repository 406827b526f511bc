"""What the targeted TensorRT-LLM release demands of a plan: the token budget, draft attention
backends per release, the recompute tail, the drafter arena per rank, ignored drafter keys.

Memory figures are written out by hand from the published configs (Qwen3-8B: 36 layers,
hidden 4096, 8 KV heads x 128, FFN 12288, vocab 151936; its z-lab drafter: 5 layers, 8 KV
heads x 128, block 16; gpt-oss-120b's drafter: 8 layers, 8 KV heads x 64)."""

from __future__ import annotations

import json

import pytest
import yaml

from dflash_trt.cli import run
from dflash_trt.deploy import pipeline
from dflash_trt.deploy import trtllm_config as trtllm
from dflash_trt.errors import HardwareError, RecipeError
from dflash_trt.plan import recipe as R


def _plan(name, sets=()):
    r = R.load_recipe(name, list(sets))
    res = pipeline.resolve_recipe(r)
    return r, pipeline.plan_resolved(res), res


def qwen_h100_total(S: int, B: int, tokens: int, graphs: int = 16) -> int:
    """Bytes per GPU for qwen3-8b-h100-fp8 at tp=1, max_draft_len 15 (the module docstring of plan.py),
    with ``graphs`` captured CUDA graphs (plan.startup: the pool at B x 16 tokens + 16 MiB each) and
    4 GiB start-up headroom."""
    weights, drafter, reserve = 9_435_705_312, 2_097_252_864, 2 * 1024**3
    arena = 2 * (B + 1) * 5 * (S + 15 + 1) * 8 * 128 * 2
    kv = 2 * 36 * 8 * 128 * 2 * S * B
    act = tokens * (8 * 4096 + 3 * 12288) * 2 + B * 16 * 151936 * 4
    pool = B * 16 * (69632 * 2 * 2 + 151936 * 4) + graphs * 16 * 2**20
    return weights + drafter + arena + kv + act + reserve + pool + 4 * 1024**3


# TensorRT-LLM's captured batch sizes up to 100 with padding: 1, 2, 4, 8, 16, ..., 96, then 100
GRAPHS_100 = (1, 2, 4, *range(8, 97, 8), 100)


def test_token_budget_raises_max_num_tokens_when_memory_allows():
    assert qwen_h100_total(2000, 100, 1600) <= 80e9
    r, p, res = _plan(
        "qwen3-8b-h100-fp8",
        [
            "serving.max_batch_size=100",
            "serving.max_seq_len=2000",
            "serving.max_num_tokens=16",
            "speculative.max_draft_len=15",
        ],
    )
    assert p.max_num_tokens == 100 * (1 + 15) == 1600
    keys = {k for k in (p.draft_len_schedule or {}) if k <= 100}  # _merge_schedule_keys adds them
    assert p.memory.graph_batch_sizes == tuple(sorted(set(GRAPHS_100) | keys))
    assert p.memory.total == qwen_h100_total(2000, 100, 1600, len(p.memory.graph_batch_sizes))
    assert any("100 x 16 = 1600 exceeds max_num_tokens 16" in w and "raised to 1600" in w for w in p.warnings)
    cfg = trtllm.config(r, p, res.drafter)
    assert cfg.max_num_tokens == 1600 and cfg.enable_chunked_prefill  # max_seq_len 2000 > 1600
    args = trtllm.serve_args(cfg, "h", 1)
    assert "--max_num_tokens" in args and args[args.index("--max_num_tokens") + 1] == "1600"


def test_token_budget_refuses_with_the_numbers_when_memory_does_not_allow(capsys):
    # a max_seq_len that fits only without the raise (no schedule: 16 graphs; 0.1 GB for the fraction's 0.001 steps)
    S = next(
        S
        for S in range(3000, 4000, 8)
        if qwen_h100_total(S, 100, 16) <= 79.9e9 and qwen_h100_total(S, 100, 1600) > 80e9
    )
    sets = [
        "serving.max_batch_size=100",
        f"serving.max_seq_len={S}",
        "serving.max_num_tokens=16",
        "speculative.max_draft_len=15",
        "speculative.schedule=none",
    ]
    with pytest.raises(HardwareError) as e:
        _plan("qwen3-8b-h100-fp8", sets)
    msg = str(e.value)
    assert "100 x 16 = 1600 exceeds max_num_tokens 16" in msg and "does not fit on H100" in msg
    assert "serving.max_batch_size <= 1" in msg  # 16 // (1 + 15)
    assert run(["plan", "qwen3-8b-h100-fp8", *[x for s in sets for x in ("--set", s)]]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "token budget" in err


def test_fa4_is_refused_for_a_release_before_1_3_0rc27(capsys):
    sets = ["--set", "trtllm.release=1.3.0rc26", "--set", "speculative.attention_backend=FA4"]
    assert run(["plan", "qwen3-8b-h100-fp8", *sets]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "FA4 does not exist in TensorRT-LLM 1.3.0rc26" in err
    r, p, _ = _plan("qwen3-8b-h100-fp8", ["trtllm.release=1.3.0rc27", "speculative.attention_backend=FA4"])
    assert p.attention_backend == "FA4" and p.trtllm_release == "1.3.0rc27"
    r, p, _ = _plan("qwen3-8b-h100-fp8", ["trtllm.release=1.3.0rc26"])  # auto: the best this release has
    assert p.attention_backend == "VANILLA" and any("no FA4" in w for w in p.warnings)


def test_trtllm_draft_attention_needs_sm100_or_sm103():
    with pytest.raises(HardwareError, match="SM100/SM103"):
        _plan("qwen3-8b-h100-fp8", ["speculative.attention_backend=TRTLLM"])


def test_unknown_release_is_one_line(capsys):
    assert run(["plan", "tiny", "--set", "trtllm.release=1.2.0"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "1.2.0" in err and "1.4.0rc1" in err


def test_block_reuse_gets_the_recompute_tail_on_1_4_and_a_warning_before():
    r, p, res = _plan("qwen3-8b-h100-fp8", ["serving.enable_block_reuse=true"])
    spec = yaml.safe_load(trtllm.trtllm_yaml(trtllm.config(r, p, res.drafter)))["speculative_config"]
    assert p.context_recompute_tail == spec["context_recompute_tail"] == 512
    assert p.enable_chunked_prefill  # TensorRT-LLM applies the tail only with chunked prefill
    r, p, res = _plan("qwen3-8b-h100-fp8", ["serving.enable_block_reuse=true", "speculative.context_recompute_tail=-1"])
    assert p.context_recompute_tail == -1
    r, p, res = _plan("qwen3-8b-h100-fp8", ["serving.enable_block_reuse=true", "trtllm.release=1.3.0rc27"])
    assert p.context_recompute_tail is None
    assert "context_recompute_tail" not in trtllm.config(r, p, res.drafter).speculative_config.model_fields_set
    assert sum("prefix-cache hits give the drafter no hidden states" in w for w in p.warnings) == 1
    with pytest.raises(RecipeError, match="needs TensorRT-LLM 1.4.0rc1"):
        _plan("qwen3-8b-h100-fp8", ["speculative.context_recompute_tail=64", "trtllm.release=1.3.0rc27"])


def test_drafter_arena_is_per_rank_at_the_planned_draft_length():
    """gpt-oss-120b at TP8: 8 KV heads over 8 ranks, 1 per rank; was ~16 GiB with all heads and the block."""
    r, p, _ = _plan("gpt-oss-120b-8xb300")  # TRTLLM draft attention: 32-token pages, inside the KV pool
    L = p.max_draft_len
    pages = -(-(16384 + L + 1) // 32) * 32
    assert p.memory.drafter_arena == 2 * 65 * 8 * pages * 1 * 64 * 2
    assert p.memory.arena_in_kv_pool and p.memory.drafter_arena < 2.1 * 2**30
    r, p, _ = _plan("gpt-oss-120b-8xh200")  # FA4: contiguous, beside the pool
    assert p.memory.drafter_arena == 2 * 65 * 8 * (16384 + p.max_draft_len + 1) * 1 * 64 * 2
    assert not p.memory.arena_in_kv_pool
    r, p, _ = _plan("qwen3-8b-h100-fp8")  # min(max_seq_len 8192, drafter max_position_embeddings 40960)
    assert p.memory.drafter_arena == 2 * 33 * 5 * (8192 + p.max_draft_len + 1) * 8 * 128 * 2


def test_drafter_keys_trtllm_ignores_are_a_warning(tmp_path, capsys):
    from tests.helpers import save_pair

    tdir, ddir = save_pair(tmp_path)
    cfg = json.loads((ddir / "config.json").read_text())
    cfg["dflash_config"].update(final_logit_softcapping=30.0, causal=True)
    (ddir / "config.json").write_text(json.dumps(cfg))
    assert run(["plan", "--target", str(tdir), "--drafter", str(ddir), "--set", "serving.max_seq_len=256"]) == 0
    lines = [x for x in capsys.readouterr().err.splitlines() if "does not read" in x]
    assert len(lines) == 1
    assert "causal=True" in lines[0] and "final_logit_softcapping=30.0" in lines[0] and "lossless" in lines[0]
