"""Planner: memory arithmetic against hand-computed cases, TP choice, draft length, back-off.

The expected numbers are written out by hand from the published Qwen3-8B config (36
layers, hidden 4096, 32/8 heads x 128, FFN 12288, vocab 151936, untied) and the z-lab
drafter (5 layers, same head layout, block 16), never by calling the code under test.
"""

from __future__ import annotations

import pytest

from dflash_trt.errors import HardwareError, RecipeError
from dflash_trt.ingest import DraftRun
from dflash_trt.plan import deployment as P
from dflash_trt.plan import hardware as hw
from dflash_trt.plan import recipe as R
from dflash_trt.plan.model_shapes import DraftShape, TargetShape
from dflash_trt.plan.recipe import ParallelSpec, ServingSpec, SpeculativeSpec

CONFIGS = R._bundled_dir() / "configs"
GiB = 1 << 30


@pytest.fixture(scope="module")
def qwen():
    return TargetShape.from_dir(CONFIGS / "Qwen--Qwen3-8B"), DraftShape.from_dir(CONFIGS / "z-lab--Qwen3-8B-DFlash-b16")


def on(t, d, gpu, precision, kv_cache="auto", gpus=1):
    """The pair on ``gpus`` x ``gpu`` at ``precision``: what the planner sizes."""
    return P.Deployment(target=t, drafter=d, gpu=hw.get_gpu(gpu), gpus=gpus, precision=precision, kv_cache=kv_cache)


def test_qwen3_8b_parameter_split(qwen):
    t, d = qwen
    # per layer: q 4096*4096 + k,v 2*4096*1024 + o 4096*4096 + MLP 3*4096*12288 = 192,937,984
    assert t.linear_params == 36 * (4096 * 4096 + 2 * 4096 * 1024 + 4096 * 4096 + 3 * 4096 * 12288) == 6_945_767_424
    assert t.embed_params == t.lm_head_params == 151936 * 4096 == 622_329_856
    assert t.other_params == 36 * (2 * 4096 + 2 * 128) + 4096 == 308_224  # norms (+ q/k norms)
    assert t.params == 8_190_735_360  # Qwen--Qwen3-8B/sizes.json: the published parameter count
    assert t.n_linear == 36 * 7
    # drafter: 5 layers of 192,946,432 (192,937,984 + norms 2*4096 + 2*128) + fc 5*4096*4096 + 2 norms
    assert d.params == 5 * 192_946_432 + 5 * 4096 * 4096 + 2 * 4096 == 1_048_626_432
    assert d.bytes == 2_097_252_864 and d.block_size == 16


def test_weight_bytes_by_precision(qwen):
    t, _ = qwen
    bf16_rest = 2 * (622_329_856 * 2 + 308_224)  # embed + lm_head + norms stay BF16
    assert P.weight_bytes(t, "bf16") == 16_381_470_720  # Qwen--Qwen3-8B/sizes.json total_size
    assert P.weight_bytes(t, "fp8") == 6_945_767_424 + 252 * 8 + bf16_rest == 9_435_705_312
    assert P.weight_bytes(t, "nvfp4") == (3_472_883_712 + 434_110_464 + 252 * 8 + bf16_rest) == 6_396_932_064


def test_qwen3_8b_h100_fp8_memory_by_hand(qwen):
    t, d = qwen
    m = P.memory(
        on(t, d, "h100", "fp8"), tp=1, serving=ServingSpec(max_batch_size=16, max_seq_len=8192, max_num_tokens=8192)
    )
    assert m.weights == 9_435_705_312
    assert m.drafter == 2_097_252_864
    assert m.drafter_arena == 2 * 17 * 5 * (8192 + 16) * 8 * 128 * 2 == 2_857_697_280
    assert m.kv_cache == 2 * 36 * 8 * 128 * 2 * 8192 * 16 == 19_327_352_832
    assert m.activations == 8192 * (8 * 4096 + 3 * 12288) * 2 + 16 * 16 * 151936 * 4 == 1_296_433_152
    assert m.reserve == 2 * GiB
    # CUDA graphs at batch 1, 2, 4, 8, 16 (enable_padding): the pool of the largest, 16 rows x 16 tokens
    # through the target and the drafter (8 x 4096 + 3 x 12288 each) plus their FP32 logits, + 16 MiB a graph
    assert m.graph_batch_sizes == (1, 2, 4, 8, 16)
    assert m.cuda_graphs == 256 * 69632 * 2 * 2 + 256 * 151936 * 4 + 5 * 16 * 2**20 == 310_771_712
    assert m.headroom == 4 * GiB
    assert m.total == 37_161_925_088 + 310_771_712 + 4 * GiB == 41_767_664_096
    assert m.capacity == 80_000_000_000 and m.fits and m.missing == 0
    # the KV pool's share: free after weights, drafter and reserve; beside the pool the dense arena,
    # activations, graphs and headroom: floor(1000 x (free - beside) / free) / 1000
    free = 80_000_000_000 - 9_435_705_312 - 2_097_252_864 - 2 * GiB
    beside = 2_857_697_280 + 1_296_433_152 + 310_771_712 + 4 * GiB
    assert m.fraction == int(1000 * (free - beside) / free) / 1000 == 0.867


def test_qwen3_8b_b200_nvfp4_memory_by_hand(qwen):
    t, d = qwen
    m = P.memory(
        on(t, d, "b200", "nvfp4"), tp=1, serving=ServingSpec(max_batch_size=64, max_seq_len=8192, max_num_tokens=8192)
    )
    assert m.weights == 6_396_932_064
    assert m.drafter_arena == 2 * 65 * 5 * 8208 * 8 * 128 * 2 == 10_926_489_600
    assert m.kv_cache == 2 * 36 * 8 * 128 * 2 * 8192 * 64 == 77_309_411_328
    assert m.activations == 8192 * 69632 * 2 + 64 * 16 * 151936 * 4 == 1_763_180_544
    # 11 graphs (1, 2, 4, 8, 16, 24, ..., 64); the pool at 64 rows x 16 tokens; 4 GiB headroom
    pool = 1024 * 69632 * 2 * 2 + 1024 * 151936 * 4
    assert m.cuda_graphs == pool + 11 * 16 * 2**20
    assert m.total == 100_640_750_048 + pool + 11 * 16 * 2**20 + 4 * GiB and m.fits  # of 180e9


def test_fp8_kv_cache_halves_the_kv(qwen):
    t, d = qwen
    serving = ServingSpec(max_batch_size=16, max_seq_len=8192, max_num_tokens=8192)
    a = P.memory(on(t, d, "h100", "fp8", "auto"), 1, serving)
    b = P.memory(on(t, d, "h100", "fp8", "fp8"), 1, serving)
    assert 2 * b.kv_cache == a.kv_cache == 19_327_352_832


def test_smallest_tp_that_fits(qwen):
    t, d = qwen
    serving = ServingSpec(max_batch_size=64, max_seq_len=8192)
    # tp=1 on H100: 9.44 GB + 77.3 GB of KV alone exceed 80 GB. tp=2, by hand:
    # weights 2*622,329,856 + (9,435,705,312 - 1,244,659,712) / 2 = 5,340,182,512
    # KV 2*36*4*128*2*8192*64 = 38,654,705,664; activations 8192*(32768 + 3*6144)*2 + 64*16*151936*4
    # drafter arena per rank: 8 KV heads / 2 ranks: 2*65*5*(8192 + 15 + 1)*4*128*2 = 5,463,244,800
    tp, m = P.choose_tp(on(t, d, "h100", "fp8", gpus=8), ParallelSpec(), serving)
    assert tp == 2
    assert m.weights == 5_340_182_512 and m.kv_cache == 38_654_705_664
    assert m.drafter_arena == 5_463_244_800
    assert m.activations == 8192 * (32768 + 3 * 6144) * 2 + 64 * 16 * 151936 * 4
    # + 11 graphs, the pool at 64 x 16 tokens (the target's FFN split over 2 ranks), + 4 GiB headroom
    pool = 1024 * (8 * 4096 + 3 * 6144) * 2 + 1024 * 69632 * 2 + 1024 * 151936 * 4
    assert m.total == 55_164_060_144 + pool + 11 * 16 * 2**20 + 4 * GiB


def test_does_not_fit_says_how_much_is_missing(qwen):
    t, d = qwen
    with pytest.raises(HardwareError, match=r"does not fit on 1x H100: at tp=1 .* GiB missing"):
        P.choose_tp(on(t, d, "h100", "fp8"), ParallelSpec(), ServingSpec(max_batch_size=64))
    with pytest.raises(HardwareError, match="parallel.tp=4 needs 4 GPUs"):
        P.choose_tp(on(t, d, "h100", "fp8", gpus=2), ParallelSpec(tp=4), ServingSpec())


def test_gpt_oss_uses_the_shipped_mxfp4_bytes():
    t = TargetShape.from_dir(CONFIGS / "openai--gpt-oss-120b")
    assert t.shipped_precision == "mxfp4" and t.experts == 128 and t.experts_per_token == 4
    assert P.weight_bytes(t, "mxfp4") == 65_248_815_744  # openai--gpt-oss-120b/sizes.json, ~65 GB as shipped
    assert abs(t.params - 116_829_156_672) < 10_000  # dequantized count (+ sinks)


def test_acceptance_model():
    alpha = P.fit_alpha(6.5, 16)
    assert P.expected_tau(alpha, 15) == pytest.approx(6.5, abs=1e-6)
    assert P.expected_tau(alpha, 3) == pytest.approx(1 + alpha + alpha**2 + alpha**3)
    assert P.fit_alpha(1.0, 16) == 0.0 and P.fit_alpha(20, 16) > 0.99


def test_draft_length_and_backoff(qwen):
    t, d = qwen
    p = P.make_plan(on(t, d, "h100", "fp8"), ServingSpec(max_batch_size=16), SpeculativeSpec())
    assert 1 <= p.max_draft_len <= 15 and p.attention_backend == "FA4" and p.acceptance == 6.5
    assert p.curve[0].batch == 1 and p.curve[0].speedup > 3  # memory-bound batch 1: tau ~6.5
    # Huge batches of short sequences with a weak drafter: verification turns compute-bound
    # and drafting must stop paying at some batch size.
    weak = SpeculativeSpec(acceptance=1.6)
    p = P.make_plan(on(t, d, "b200", "nvfp4", "fp8"), ServingSpec(max_batch_size=1024, max_seq_len=512), weak)
    # no release in the table has the draft-length floor (PR #16888 open): where drafting stops paying
    # it drafts the floor, one token, never 0 (the zero-draft trap), and the plan says what that costs
    floored = [r.batch for r in p.curve if r.draft_len == 1]
    assert floored and not any(r.draft_len == 0 for r in p.curve), p.curve
    assert p.schedule == "draft_len_schedule" and max(p.draft_len_schedule) == 1024
    assert p.draft_len_schedule[1] == p.max_draft_len and 0 not in p.draft_len_schedule.values()
    assert any("drafting does not pay" in w and "costs up to" in w for w in p.warnings), p.warnings
    lens = [r.draft_len for r in p.curve]
    assert lens == sorted(lens, reverse=True)  # drafting only backs off as batches grow
    p2 = P.make_plan(
        on(t, d, "b200", "nvfp4", "fp8"),
        ServingSpec(max_batch_size=1024, max_seq_len=512),
        SpeculativeSpec(acceptance=1.6, schedule="max_concurrency"),
    )
    assert p2.max_concurrency is None and p2.draft_len_schedule == p.draft_len_schedule


def test_on_a_release_with_the_floor_the_rule_follows_it(qwen, monkeypatch):
    """Installed classes with ``DecodingBaseConfig.min_runtime_draft_len`` 1: TensorRT-LLM floors every
    length itself, so the planner may stop writing keys early and write max_concurrency again."""
    from dflash_trt.plan import schedule as S

    t, d = qwen
    monkeypatch.setattr(S, "installed_floor", lambda: (1, False, "9.9.9"))
    weak = SpeculativeSpec(acceptance=1.6)
    p = P.make_plan(on(t, d, "b200", "nvfp4", "fp8"), ServingSpec(max_batch_size=1024, max_seq_len=512), weak)
    assert p.draft_len_schedule == {1: 15}  # above the largest key the release drafts its floor, 1
    assert p.draft_lengths[-1].draft_len == 1 and not any(r.draft_len == 0 for r in p.curve)
    assert not any("drafting does not pay" in w for w in p.warnings)  # the runtime floors it: nothing to pay
    p2 = P.make_plan(
        on(t, d, "b200", "nvfp4", "fp8"),
        ServingSpec(max_batch_size=1024, max_seq_len=512),
        SpeculativeSpec(acceptance=1.6, schedule="max_concurrency", max_concurrency=8),
    )
    assert p2.max_concurrency == 8 and p2.draft_lengths[-1] == DraftRun(batch_from=9, batch_to=1024, draft_len=1)


def test_explicit_draft_length_is_checked_against_the_block(qwen):
    t, d = qwen
    with pytest.raises(RecipeError, match="between 1 and block size - 1 \\(15\\)"):
        P.make_plan(on(t, d, "h100", "fp8"), ServingSpec(max_batch_size=8), SpeculativeSpec(max_draft_len=16))
    p = P.make_plan(on(t, d, "h100", "fp8"), ServingSpec(max_batch_size=8), SpeculativeSpec(max_draft_len=7))
    assert p.max_draft_len == 7


@pytest.mark.parametrize(
    "name, tp, precision, backend",
    [
        ("qwen3-8b-b200-nvfp4", 1, "nvfp4", "TRTLLM"),
        ("qwen3-8b-b200-fp8", 1, "fp8", "TRTLLM"),
        ("qwen3-8b-h200-fp8", 1, "fp8", "FA4"),
        ("qwen3-8b-h100-fp8", 1, "fp8", "FA4"),
        ("llama3.1-8b-b200-nvfp4", 1, "nvfp4", "TRTLLM"),
        ("llama3.1-8b-h100-fp8", 1, "fp8", "FA4"),
        ("gpt-oss-120b-8xb300", 8, "mxfp4", "TRTLLM"),
        ("gpt-oss-120b-8xh200", 8, "mxfp4", "FA4"),
    ],
)
def test_every_bundled_recipe_plans_offline(name, tp, precision, backend):
    from dflash_trt.deploy import pipeline

    p = pipeline.plan_resolved(pipeline.resolve_recipe(R.load_recipe(name)))
    assert (p.tp, p.precision, p.attention_backend) == (tp, precision, backend)
    assert p.memory.fits and p.max_draft_len <= p.block_size - 1
