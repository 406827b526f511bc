"""The DFlash plugins: Triton kernels vs the reference, torch custom ops, shape inference, TRT.

The Triton kernels run through Triton's CPU interpreter here: ``TRITON_INTERPRET`` is set
before anything imports triton (it is read when ``@triton.jit`` decorates a kernel).
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import itertools  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("triton")

from dflash_trt import plugins  # noqa: E402
from dflash_trt.plugins import attention as ba  # noqa: E402
from dflash_trt.plugins import injection as kvi  # noqa: E402

if os.environ.get("TRITON_INTERPRET", "0") in ("", "0") and not torch.cuda.is_available():
    pytest.skip("Triton needs CUDA or TRITON_INTERPRET=1", allow_module_level=True)

NAN = float("nan")


def shuffled_page_table(
    lengths: list[int], extra: list[int], page_size: int, gen: torch.Generator, spare: int = 3
) -> tuple[torch.Tensor, int]:
    """Page tables covering lengths[i] + extra[i] positions, page ids explicitly shuffled
    across the pool (plus unused spare pages), unused entries -1."""
    need = [(n + e + page_size - 1) // page_size for n, e in zip(lengths, extra, strict=True)]
    pool = sum(need) + spare
    ids = torch.randperm(pool, generator=gen)
    width = max(need + [1])
    pt = torch.full((len(lengths), width), -1, dtype=torch.int32)
    at = 0
    for i, k in enumerate(need):
        pt[i, :k] = ids[at : at + k].int()
        at += k
    return pt, pool


# ---------------------------------------------------------------------------------------
# block attention: Triton vs reference
# ---------------------------------------------------------------------------------------

SHAPES = [  # (gqa ratio, head_dim, block)
    (1, 64, 4),
    (4, 64, 8),
    (8, 128, 16),
    (4, 128, 4),
    (1, 128, 16),
    (8, 64, 8),
]
MODES = [(False, None), (True, None), (True, 7), (False, 20)]
CASES = [(*s, *m) for s, m in itertools.product(SHAPES, MODES)]


def _attn_inputs(rep, d, B, lengths, page_size, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    b, kvh = len(lengths), 2 if rep < 8 else 1
    h = rep * kvh
    pt, pool = shuffled_page_table(lengths, [0] * b, page_size, gen)
    rnd = lambda *s: torch.randn(*s, generator=gen).to(dtype)  # noqa: E731
    kc, vc = rnd(pool, page_size, kvh, d), rnd(pool, page_size, kvh, d)
    q, k, v = rnd(b, B, h, d), rnd(b, B, kvh, d), rnd(b, B, kvh, d)
    return q, k, v, kc, vc, pt, torch.tensor(lengths, dtype=torch.long)


def _check_attention(rep, d, B, lengths, causal, window, page_size=16, dtype=torch.float32, seed=0, atol=2e-5):
    from dflash_trt.plugins import triton_kernels as tk

    q, k, v, kc, vc, pt, lens = _attn_inputs(rep, d, B, lengths, page_size, dtype, seed)
    scale = d**-0.5
    ref = ba.block_attention_reference(q, k, v, kc, vc, pt, lens, causal=causal, window=window, scale=scale)
    out = torch.full_like(q, NAN)  # poison: unwritten elements fail
    tk.block_attention(q, k, v, kc, vc, pt, lens, causal=causal, window=window, scale=scale, out=out)
    assert out.dtype == q.dtype
    assert not out.isnan().any()
    torch.testing.assert_close(out.float(), ref.float(), atol=atol, rtol=atol)


@pytest.mark.parametrize("rep,d,B,causal,window", CASES)
def test_block_attention_matches_reference(rep, d, B, causal, window):
    # mixed lengths in one batch: empty, single token, non-multiples of the 16-key tile
    # (and of the page size), and more than a few tiles
    seed = hash((rep, d, B, causal, window)) % 1000
    lengths = [0, 1, 19 + seed % 13, 50 + seed % 7]
    _check_attention(rep, d, B, lengths, causal, window, page_size=16 if d == 64 else 8, seed=seed)


@pytest.mark.parametrize("lengths", [[0], [0, 0], [1], [33, 0, 16]])
def test_block_attention_edge_lengths(lengths):
    _check_attention(4, 64, 8, lengths, False, None, page_size=4, seed=len(lengths))


def test_block_attention_public_entry_and_bf16():
    q, k, v, kc, vc, pt, lens = _attn_inputs(4, 64, 8, [5, 23], 16, torch.bfloat16, 7)
    out = plugins.block_attention(q, k, v, kc, vc, pt, lens, causal=False, window=None, scale=0.125, kernels="triton")
    ref = plugins.block_attention(q, k, v, kc, vc, pt, lens, causal=False, window=None, scale=0.125)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref.float(), atol=3e-2, rtol=3e-2)


def test_block_attention_detects_a_wrong_page():
    """The comparison can fail: a corrupted page table changes the result."""
    q, k, v, kc, vc, pt, lens = _attn_inputs(1, 64, 4, [40], 16, torch.float32, 3)
    ref = ba.block_attention_reference(q, k, v, kc, vc, pt, lens, causal=False, window=None, scale=0.125)
    bad = pt.clone()
    bad[0, 0] = (pt[0, 0] + 1) % kc.shape[0]
    out = ba.block_attention_triton(q, k, v, kc, vc, bad, lens, causal=False, window=None, scale=0.125)
    assert (out - ref).abs().max() > 1e-3


# ---------------------------------------------------------------------------------------
# KV injection: Triton vs reference
# ---------------------------------------------------------------------------------------

KV_CASES = [  # (layers, kv heads, head_dim, page_size, T, lengths, n_new, bias)
    (1, 1, 64, 16, 1, [0], [1], False),
    (3, 2, 64, 4, 5, [0, 7, 13], [5, 0, 3], True),
    (2, 4, 128, 16, 6, [17, 1, 0, 31], [6, 2, 1, 4], False),
    (5, 2, 128, 8, 3, [9, 0], [3, 3], True),
    (2, 8, 64, 16, 2, [15, 16], [2, 1], False),
]


@pytest.mark.parametrize("L,kvh,d,ps,T,lengths,n_new,bias", KV_CASES)
def test_kv_injection_matches_reference(L, kvh, d, ps, T, lengths, n_new, bias):
    gen = torch.Generator().manual_seed(L * 100 + kvh * 10 + d)
    rnd = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    b, H, n_tap = len(lengths), 48, 3
    pt, pool = shuffled_page_table(lengths, [T] * b, ps, gen)
    base = torch.full((L, pool, ps, kvh, d), NAN)  # poison: unwritten slots stay NaN
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, d, 2).float() / d))
    args = dict(
        target_hidden=rnd(b, T, n_tap * H),
        n_new=torch.tensor(n_new),
        lengths=torch.tensor(lengths),
        fc_weight=rnd(H, n_tap * H) * 0.1,
        norm_weight=1 + 0.1 * rnd(H),
        kv_weight=rnd(L * 2 * kvh * d, H) * 0.2,
        kv_bias=rnd(L * 2 * kvh * d) if bias else None,
        k_norm_weight=1 + 0.1 * rnd(L, d),
        inv_freq=inv_freq,
        rope_scale=0.9,
        eps=1e-6,
        page_table=pt,
        num_kv_heads=kvh,
        head_dim=d,
    )
    kr, vr, kt, vt = base.clone(), base.clone(), base.clone(), base.clone()
    kvi.kv_injection_reference(k_cache=kr, v_cache=vr, **args)
    kvi.kv_injection_triton(k_cache=kt, v_cache=vt, **args)
    written = (~kr.isnan()).sum().item()
    assert written == sum(n_new) * L * kvh * d
    torch.testing.assert_close(kt, kr, atol=1e-4, rtol=1e-4, equal_nan=True)
    torch.testing.assert_close(vt, vr, atol=1e-5, rtol=1e-5, equal_nan=True)


# ---------------------------------------------------------------------------------------
# the drafter end to end through ops: kernels="triton" == kernels="reference"
# ---------------------------------------------------------------------------------------


def tiny_drafter(seed=0, layer_types=None, window=None):
    from dflash_trt.model.config import DrafterConfig
    from dflash_trt.model.drafter import Drafter

    torch.manual_seed(seed)
    cfg = DrafterConfig(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        vocab_size=128,
        block_size=8,
        mask_token_id=127,
        target_layer_ids=[0, 2],
        rope_theta=10000.0,
        layer_types=layer_types,
        sliding_window=window,
        dtype="float32",
    )
    d = Drafter(cfg).eval()
    with torch.no_grad():
        for name, p in d.named_parameters():
            if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                p.add_(0.1 * torch.randn_like(p))
    return d


@pytest.mark.parametrize("layer_types,window", [(None, None), (["sliding_attention", "full_attention"], 6)])
def test_drafter_triton_matches_reference(layer_types, window):
    drafter = tiny_drafter(layer_types=layer_types, window=window)
    H, B = drafter.cfg.hidden_size, drafter.cfg.block_size
    gen = torch.Generator().manual_seed(1)
    rounds = [
        (torch.randn(3, 9, 2 * H, generator=gen), torch.tensor([9, 4, 1])),
        (torch.randn(3, 5, 2 * H, generator=gen), torch.tensor([2, 5, 0])),
    ]
    embeds = torch.randn(3, B, H, generator=gen)
    outs = {}
    with torch.no_grad():
        for kernels in ("reference", "triton"):
            drafter.kernels = kernels
            cache = drafter.new_cache(3, page_size=4)
            hs = []
            for target_hidden, n_new in rounds:
                drafter.inject(target_hidden, n_new, cache)
                hs.append(drafter.draft(embeds, cache))
            outs[kernels] = (hs, cache)
    (h_ref, c_ref), (h_tri, c_tri) = outs["reference"], outs["triton"]
    assert torch.equal(c_ref.page_table, c_tri.page_table)
    torch.testing.assert_close(c_tri.k, c_ref.k, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(c_tri.v, c_ref.v, atol=1e-5, rtol=1e-5)
    for a, r in zip(h_tri, h_ref, strict=True):
        torch.testing.assert_close(a, r, atol=1e-4, rtol=1e-4)


# ---------------------------------------------------------------------------------------
# torch custom ops, shape inference, TensorRT registration
# ---------------------------------------------------------------------------------------


def test_torch_export_traces_block_attention_custom_op():
    from torch.export import Dim

    from dflash_trt.plugins import torch_ops  # noqa: F401

    class M(torch.nn.Module):
        def forward(self, q, k, v, kc, vc, pt, lens):
            return torch.ops.dflash.block_attention(q * 2, k, v, kc, vc, pt, lens, True, 5, 0.125, 1, "reference") + 1

    q, k, v, kc, vc, pt, lens = _attn_inputs(4, 64, 4, [20, 3], 16, torch.float32, 5)
    kc, vc = torch.stack([kc.flip(0), kc]), torch.stack([vc.flip(0), vc])  # [L=2, ...], layer 1
    b = Dim("b")
    ep = torch.export.export(
        M(), (q, k, v, kc, vc, pt, lens), dynamic_shapes=({0: b}, {0: b}, {0: b}, None, None, {0: b}, {0: b})
    )
    targets = [n.target for n in ep.graph.nodes if n.op == "call_function"]
    assert torch.ops.dflash.block_attention.default in targets
    got = ep.module()(q, k, v, kc, vc, pt, lens)
    want = ba.block_attention_reference(q * 2, k, v, kc[1], vc[1], pt, lens, causal=True, window=5, scale=0.125) + 1
    torch.testing.assert_close(got, want)
    tri = torch.ops.dflash.block_attention(q * 2, k, v, kc, vc, pt, lens, True, 5, 0.125, 1, "triton") + 1
    torch.testing.assert_close(tri, want, atol=2e-5, rtol=2e-5)


def test_kv_injection_custom_op_mutates_and_fakes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    from dflash_trt.plugins import torch_ops  # noqa: F401

    drafter = tiny_drafter()
    cfg = drafter.cfg
    wkv, bkv, kn = plugins.fused_kv_weights(drafter)
    cache = drafter.new_cache(2, page_size=4)
    n_new = torch.tensor([3, 2])
    cache.reserve(n_new)
    target_hidden = torch.randn(2, 3, 2 * cfg.hidden_size)

    def args(kc, vc, kernels):
        return (
            target_hidden,
            n_new,
            cache.lengths,
            drafter.fc.weight,
            drafter.hidden_norm.weight,
            wkv,
            bkv,
            kn,
            drafter.inv_freq,
            kc,
            vc,
            cache.page_table,
            drafter.rope_scaling_factor,
            cfg.rms_norm_eps,
            2,
            32,
            kernels,
        )

    with torch.no_grad():
        kr, vr = cache.k.clone(), cache.v.clone()
        torch.ops.dflash.kv_injection(*args(kr, vr, "reference"))
        kt, vt = cache.k.clone(), cache.v.clone()
        torch.ops.dflash.kv_injection(*args(kt, vt, "triton"))
    assert kr.abs().sum() > 0
    torch.testing.assert_close(kt, kr, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(vt, vr, atol=1e-5, rtol=1e-5)
    schema = torch.ops.dflash.kv_injection.default._schema
    assert {a.name for a in schema.arguments if a.alias_info and a.alias_info.is_write} == {"k_cache", "v_cache"}
    # the functional form's fake gives the caches' shapes without running anything
    with FakeTensorMode(allow_non_fake_inputs=True):
        kv = torch.empty(2, 3, 2 * 2 * 2 * 32)
        ko, vo = torch.ops.dflash.kv_cache_update(
            kv, kn, drafter.inv_freq, n_new, cache.lengths, cache.page_table, cache.k, cache.v, 1.0, 1e-6, 2, 32
        )
        assert ko.shape == cache.k.shape and vo.shape == cache.v.shape


def test_kv_scatter_stage_composes_to_the_reference():
    """fc + hidden_norm + the one GEMM + kv_scatter_reference == kv_injection_reference."""
    drafter = tiny_drafter(seed=3)
    cfg = drafter.cfg
    wkv, bkv, kn = plugins.fused_kv_weights(drafter)
    cache = drafter.new_cache(2, page_size=4)
    n_new = torch.tensor([4, 1])
    cache.reserve(n_new)
    target_hidden = torch.randn(2, 4, 2 * cfg.hidden_size)
    with torch.no_grad():
        kr, vr, ks, vs = (cache.k.clone().fill_(NAN) for _ in range(4))
        kvi.kv_injection_reference(
            target_hidden=target_hidden,
            n_new=n_new,
            lengths=cache.lengths,
            fc_weight=drafter.fc.weight,
            norm_weight=drafter.hidden_norm.weight,
            kv_weight=wkv,
            kv_bias=bkv,
            k_norm_weight=kn,
            inv_freq=drafter.inv_freq,
            rope_scale=1.0,
            eps=cfg.rms_norm_eps,
            k_cache=kr,
            v_cache=vr,
            page_table=cache.page_table,
            num_kv_heads=2,
            head_dim=32,
        )
        kv = plugins.rms_norm(target_hidden @ drafter.fc.weight.T, drafter.hidden_norm.weight, cfg.rms_norm_eps) @ wkv.T
        kvi.kv_scatter_reference(
            kv,
            kn,
            drafter.inv_freq,
            n_new,
            cache.lengths,
            cache.page_table,
            ks,
            vs,
            rope_scale=1.0,
            eps=cfg.rms_norm_eps,
            num_kv_heads=2,
            head_dim=32,
        )
    torch.testing.assert_close(ks, kr, equal_nan=True)
    torch.testing.assert_close(vs, vr, equal_nan=True)


def test_shape_inference():
    from dflash_trt.plugins.op_shapes import block_attention_shapes, kv_injection_shapes

    assert block_attention_shapes((2, 16, 32, 128), (2, 16, 8, 128), (5, 100, 16, 8, 128), "bfloat16") == (
        (2, 16, 32, 128),
        "bfloat16",
    )
    sym = object()  # a symbolic dim passes through unchecked
    assert block_attention_shapes((sym, 16, 32, 128), (sym, 16, 8, 128), (100, 16, 8, 128))[0][0] is sym
    with pytest.raises(ValueError, match="multiple"):
        block_attention_shapes((2, 16, 30, 128), (2, 16, 8, 128), (100, 16, 8, 128))
    with pytest.raises(ValueError, match="head_dim"):
        block_attention_shapes((2, 16, 32, 128), (2, 16, 8, 64), (100, 16, 8, 128))
    with pytest.raises(ValueError, match="block_size"):
        block_attention_shapes((2, 16, 32, 128), (2, 16, 8, 128), (100, 16, 8, 128), block_size=10)
    with pytest.raises(ValueError, match="int8"):
        block_attention_shapes((2, 16, 32, 128), (2, 16, 8, 128), (100, 16, 8, 128), "int8")
    cache = (5, 100, 16, 8, 128)
    assert kv_injection_shapes((3, 4, 5 * 2 * 8 * 128), (5, 128), cache, cache, "float16", "float16") == (
        (cache, cache),
        ("float16", "float16"),
    )
    with pytest.raises(ValueError, match="kv width"):
        kv_injection_shapes((3, 4, 5 * 8 * 128), (5, 128), cache, cache)
    with pytest.raises(ValueError, match="page_size"):
        kv_injection_shapes((3, 4, 5 * 2 * 8 * 128), (5, 128), cache, cache, page_size=32)


def test_register_trt_plugins_says_why_not_here():
    from dflash_trt.plugins.trt import register_trt_plugins

    reg = register_trt_plugins()
    assert not reg
    assert reg.ok is False and ("tensorrt" in reg.reason or "TRITON_INTERPRET" in reg.reason)
