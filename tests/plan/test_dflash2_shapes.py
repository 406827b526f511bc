"""Planning counts a DFlash2 drafter's extra parameters: the convolutions and the selector, equal
to a real ``DFlash2Drafter`` module's, in the plan's drafter memory; the step model charges the
selector's walk without streaming its codebooks."""

from __future__ import annotations

import dataclasses
import json

from dflash_trt.plan import deployment as P
from dflash_trt.plan import hardware as hw
from dflash_trt.plan import recipe as R
from dflash_trt.plan.model_shapes import DraftShape, TargetShape
from dflash_trt.plan.recipe import ServingSpec
from tests.helpers import tiny_dflash2_drafter, tiny_drafter, tiny_target

CONFIGS = R._bundled_dir() / "configs"
DFLASH2_SIZES = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")


def _published():
    cfg = json.loads((CONFIGS / "z-lab--Qwen3.8-27B-DFlash2" / "config.json").read_text())
    plain = json.loads(json.dumps(cfg))
    for k in DFLASH2_SIZES:
        del plain["dflash_config"][k]
    return DraftShape.from_config(cfg), DraftShape.from_config(plain)


def test_the_count_is_a_real_dflash2_modules():
    model = tiny_target(layers=4)
    for kw in ({}, dict(conv_kernel_size=3, conv_group_size=8, selector_rank=12, selector_top_k=5)):
        d = tiny_dflash2_drafter(model, **kw)
        shape = DraftShape.from_config(d.cfg.to_zlab())
        named = dict(d.named_parameters())
        assert shape.params == sum(p.numel() for p in named.values())
        assert shape.conv_params == sum(p.numel() for n, p in named.items() if "_conv." in n) > 0
        assert shape.selector_params == sum(p.numel() for n, p in named.items() if "candidate_selector" in n)
    plain = tiny_drafter(model)
    shape = DraftShape.from_config(plain.cfg.to_zlab())
    assert shape.params == sum(p.numel() for p in plain.parameters()) and shape.selector_params == 0


def test_the_published_27b_drafter_by_hand():
    d2, d1 = _published()
    # codebooks 2 x [248320, 256] (~127M) + hidden_projection [256, 5120]
    assert d2.selector_params == 2 * 248320 * 256 + 256 * 5120 == 128_450_560
    # 5 layers x 2 DynamicConv x (base_kernel 2*2*5120 + kernel_projection 2*2*(5120/16)*5120)
    assert d2.conv_params == 5 * 2 * (2 * 2 * 5120 + 2 * 2 * 320 * 5120) == 65_740_800
    assert d2.params == d1.params + 65_740_800 + 128_450_560
    assert (d2.selector_rank, d2.selector_top_k) == (256, 16) and d1.selector_rank == 0


def test_the_plans_drafter_memory_holds_them():
    d2, d1 = _published()
    t = TargetShape.from_dir(CONFIGS / "Qwen--Qwen3-8B")
    serving = ServingSpec(max_batch_size=8, max_seq_len=4096, max_num_tokens=4096)
    mem = {
        d: P.memory(
            P.Deployment(target=t, drafter=d, gpu=hw.get_gpu("h200"), gpus=1, precision="bf16", kv_cache="auto"),
            1,
            serving,
        )
        for d in (d1, d2)
    }
    assert mem[d2].drafter - mem[d1].drafter == 2 * (65_740_800 + 128_450_560)


def test_the_step_model_charges_the_walk_not_a_codebook_stream():
    d2, _ = _published()
    t = TargetShape.from_dir(CONFIGS / "Qwen--Qwen3-8B")
    no_selector = dataclasses.replace(
        d2, params=d2.params - d2.selector_params, selector_params=0, selector_rank=0, selector_top_k=0
    )
    dep = P.Deployment(target=t, drafter=no_selector, gpu=hw.get_gpu("h200"), gpus=1, precision="bf16", kv_cache="auto")
    roof = P.step_model(dep, 1, 2048)
    without = roof.draft_forward(1, 7, 4.0)
    with_sel = P.step_model(dataclasses.replace(dep, drafter=d2), 1, 2048).draft_forward(1, 7, 4.0)
    streamed = 2 * 2 * 248320 * 256 / roof._bandwidth()  # reading both codebooks once per round
    assert without < with_sel < without + 0.05 * streamed  # the walk costs; the codebooks are only gathered
