"""Triton kernels for the two DFlash ops, and their host-side launchers.

Imported lazily (it imports triton). With ``TRITON_INTERPRET=1`` set *before* this module
is first imported, the kernels run on CPU tensors through Triton's interpreter; that is
how the tests run them. Otherwise they need CUDA tensors.

Calling convention (shared with the TensorRT AOT plugins in ``plugins/trt.py``): every
kernel takes ``(input pointers..., runtime scalars..., output pointers..., constexprs)``,
which is the order TensorRT's ahead-of-time Python plugins pass arguments in. All
tensors are dense row-major; the launchers make them so (and refuse a non-contiguous
cache, which must be written in place).

* ``_kv_scatter_kernel``: one program per (token, layer). k_norm (RMSNorm over head_dim
  in float32), RoPE (rotate-half; cos/sin from ``inv_freq`` and ``rope_scale`` in-kernel,
  position ``lengths[i] + t``), and the scatter of K and V into the paged pools at
  ``page_table[i, pos // page_size]``, offset ``pos % page_size``; tokens with
  ``t >= n_new[i]`` write nothing.
* ``_block_attention_kernel``: flash-attention style, one program per (sequence, kv head,
  tile of the rep*B query rows that share that kv head). Online softmax in float32 over
  the context tiles (read through the page table; tiles wholly outside a sliding window
  are skipped) and then the block's own K/V, with the causal and window masks of
  ``block_attention.visibility``.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634


def interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _check_device(*tensors: torch.Tensor) -> None:
    if interpreted():
        return
    for t in tensors:
        if t.device.type != "cuda":
            raise RuntimeError(
                "the Triton kernels need CUDA tensors (or TRITON_INTERPRET=1 set before "
                "triton is imported, to interpret them on CPU)"
            )


def _pow2(n: int, floor: int = 1) -> int:
    return max(floor, triton.next_power_of_2(max(int(n), 1)))


# ---------------------------------------------------------------------------------------
# KV injection: k_norm + RoPE + paged scatter, all layers in one launch
# ---------------------------------------------------------------------------------------


@triton.jit
def _kv_scatter_kernel(
    kv_ptr,
    knorm_ptr,
    inv_freq_ptr,
    n_new_ptr,
    len_ptr,
    pt_ptr,
    kc_in_ptr,
    vc_in_ptr,
    T,
    max_pages,
    layer_stride,
    page_size,
    eps,
    rope_scale,
    kc_ptr,
    vc_ptr,
    L: tl.constexpr,
    KVH: tl.constexpr,
    D: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    # kc_in_ptr / vc_in_ptr: the cache inputs, unused; the kernel writes through kc_ptr /
    # vc_ptr, which TensorRT aliases to them (torch passes the same tensors twice)
    tok = tl.program_id(0)  # i * T + t
    layer = tl.program_id(1)
    i = tok // T
    t = tok % T
    n_new = tl.load(n_new_ptr + i)
    if t < n_new:
        HALF: tl.constexpr = D // 2
        pos = tl.load(len_ptr + i).to(tl.int64) + t
        page = tl.load(pt_ptr + i.to(tl.int64) * max_pages + pos // page_size).to(tl.int64)
        off = pos % page_size
        hh = tl.arange(0, BLOCK_H)
        jj = tl.arange(0, BLOCK_HALF)
        mask = (hh[:, None] < KVH) & (jj[None, :] < HALF)
        # kv row layout: [b, T, L, 2, KVH, D]
        row = (tok.to(tl.int64) * L + layer) * (2 * KVH * D)
        idx = hh[:, None] * D + jj[None, :]
        k1 = tl.load(kv_ptr + row + idx, mask=mask, other=0.0).to(tl.float32)
        k2 = tl.load(kv_ptr + row + idx + HALF, mask=mask, other=0.0).to(tl.float32)
        v1 = tl.load(kv_ptr + row + KVH * D + idx, mask=mask, other=0.0)
        v2 = tl.load(kv_ptr + row + KVH * D + idx + HALF, mask=mask, other=0.0)
        # k_norm: RMSNorm over head_dim in float32
        ss = tl.sum(k1 * k1, axis=1) + tl.sum(k2 * k2, axis=1)
        rstd = 1.0 / tl.sqrt(ss / D + eps)
        w1 = tl.load(knorm_ptr + layer * D + jj, mask=jj < HALF, other=0.0).to(tl.float32)
        w2 = tl.load(knorm_ptr + layer * D + HALF + jj, mask=jj < HALF, other=0.0).to(tl.float32)
        k1 = k1 * rstd[:, None] * w1[None, :]
        k2 = k2 * rstd[:, None] * w2[None, :]
        # RoPE, rotate-half layout: freq j serves columns j and j + D/2
        inv = tl.load(inv_freq_ptr + jj, mask=jj < HALF, other=0.0).to(tl.float32)
        ang = pos.to(tl.float32) * inv
        c = (tl.cos(ang) * rope_scale)[None, :]
        s = (tl.sin(ang) * rope_scale)[None, :]
        r1 = k1 * c - k2 * s
        r2 = k2 * c + k1 * s
        dst = layer * layer_stride + ((page * page_size + off) * KVH) * D + idx
        tl.store(kc_ptr + dst, r1.to(kc_ptr.dtype.element_ty), mask=mask)
        tl.store(kc_ptr + dst + HALF, r2.to(kc_ptr.dtype.element_ty), mask=mask)
        tl.store(vc_ptr + dst, v1.to(vc_ptr.dtype.element_ty), mask=mask)
        tl.store(vc_ptr + dst + HALF, v2.to(vc_ptr.dtype.element_ty), mask=mask)


def kv_scatter(
    kv: torch.Tensor,
    k_norm_weight: torch.Tensor,
    inv_freq: torch.Tensor,
    n_new: torch.Tensor,
    lengths: torch.Tensor,
    page_table: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    *,
    eps: float,
    rope_scale: float,
    num_kv_heads: int,
    head_dim: int,
) -> None:
    """kv: [b, T, L*2*kvh*d] (the one GEMM's output); caches [L, pages, page_size, kvh, d]."""
    b, T = kv.shape[:2]
    L = k_norm_weight.shape[0]
    if b == 0 or T == 0:
        return
    if head_dim % 2:
        raise ValueError("RoPE needs an even head_dim")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("the paged caches must be contiguous: they are written in place")
    _check_device(kv, k_cache, v_cache)
    kv = kv.contiguous()
    page_table = page_table.contiguous()
    layer_stride = k_cache[0].numel() if L else 0
    _kv_scatter_kernel[(b * T, L)](
        kv,
        k_norm_weight.contiguous(),
        inv_freq.float().contiguous(),
        n_new.contiguous(),
        lengths.contiguous(),
        page_table,
        k_cache,
        v_cache,
        T,
        page_table.shape[1],
        layer_stride,
        k_cache.shape[2],
        float(eps),
        float(rope_scale),
        k_cache,
        v_cache,
        L=L,
        KVH=num_kv_heads,
        D=head_dim,
        BLOCK_H=_pow2(num_kv_heads),
        BLOCK_HALF=_pow2(head_dim // 2),
    )


# ---------------------------------------------------------------------------------------
# Block-diffusion attention over the paged context
# ---------------------------------------------------------------------------------------


@triton.jit
def _dot(a, b, IEEE: tl.constexpr, UPCAST: tl.constexpr):
    """fp32-accumulating dot; IEEE for float32 operands (no TF32), UPCAST works around the
    interpreter's wrong bf16/fp16 ``tl.dot`` (triton 3.9) by computing in float32 there."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    elif IEEE:
        return tl.dot(a, b, input_precision="ieee")
    else:
        return tl.dot(a, b)


@triton.jit
def _online_softmax_step(m_i, l_i, acc, s, v, IEEE: tl.constexpr, UPCAST: tl.constexpr):
    """Fold one tile of (base-2) scores ``s`` and values ``v`` into the running max, sum
    and output (flash attention's online softmax)."""
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, IEEE, UPCAST)
    return m_new, l_i, acc


# One piece on purpose (~70 lines): a kernel body is the program one (sequence, kv head, row
# tile) runs, and its two passes (paged context tiles, then the block's own keys) fold into one
# running state (q, m_i, l_i, acc). As @triton.jit helpers, each pass would take that state plus
# ~15 pointers, strides and constexprs; the fold itself is already _online_softmax_step.
@triton.jit
def _block_attention_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    kc_ptr,
    vc_ptr,
    pt_ptr,
    len_ptr,
    B,
    max_pages,
    layer_stride,
    layer,
    page_size,
    window,
    qk_scale,
    o_ptr,
    KVH: tl.constexpr,
    REP: tl.constexpr,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_B: tl.constexpr,
    CAUSAL: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    IEEE: tl.constexpr,
    UPCAST: tl.constexpr,
):
    i = tl.program_id(0)
    g = tl.program_id(1)  # kv head
    mt = tl.program_id(2)  # tile of the REP * B query rows of this kv head
    H: tl.constexpr = KVH * REP
    m = mt * BLOCK_M + tl.arange(0, BLOCK_M)
    m_ok = m < REP * B
    hq = g * REP + m // B
    t = m % B
    dd = tl.arange(0, BLOCK_D)
    d_ok = dd < D
    n = tl.load(len_ptr + i).to(tl.int64)
    q_off = ((i.to(tl.int64) * B + t) * H + hq) * D
    q = tl.load(q_ptr + q_off[:, None] + dd[None, :], mask=m_ok[:, None] & d_ok[None, :], other=0.0)
    q_pos = n + t

    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    # context keys 0..n-1, through the page table
    lo = n * 0
    if USE_WINDOW:
        # no query sees a key at or below n - window: skip whole tiles there
        lo = tl.maximum(n - window + 1, 0)
        lo = (lo // BLOCK_N) * BLOCK_N
    cache_base = (n * 0 + layer_stride) * layer  # int64 (n is); layer may be a constexpr
    for start in range(lo, n, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        k_ok = pos < n
        page = tl.load(pt_ptr + i.to(tl.int64) * max_pages + pos // page_size, mask=k_ok, other=0).to(tl.int64)
        row = cache_base + ((page * page_size + pos % page_size) * KVH + g) * D
        kmask = k_ok[:, None] & d_ok[None, :]
        kt = tl.load(kc_ptr + row[:, None] + dd[None, :], mask=kmask, other=0.0).to(q.dtype)
        vt = tl.load(vc_ptr + row[:, None] + dd[None, :], mask=kmask, other=0.0).to(q.dtype)
        s = _dot(q, tl.trans(kt), IEEE, UPCAST) * qk_scale
        vis = k_ok[None, :]
        if USE_WINDOW:
            vis = vis & ((q_pos[:, None] - pos[None, :]) < window)
        s = tl.where(vis, s, float("-inf"))
        m_i, l_i, acc = _online_softmax_step(m_i, l_i, acc, s, vt, IEEE, UPCAST)

    # the block's own keys, positions n..n+B-1
    tb = tl.arange(0, BLOCK_B)
    b_ok = tb < B
    brow = ((i.to(tl.int64) * B + tb) * KVH + g) * D
    bmask = b_ok[:, None] & d_ok[None, :]
    kb = tl.load(k_ptr + brow[:, None] + dd[None, :], mask=bmask, other=0.0)
    vb = tl.load(v_ptr + brow[:, None] + dd[None, :], mask=bmask, other=0.0)
    s = _dot(q, tl.trans(kb), IEEE, UPCAST) * qk_scale
    vis = b_ok[None, :]
    if CAUSAL:
        vis = vis & (tb[None, :] <= t[:, None])
    if USE_WINDOW:
        diff = t[:, None] - tb[None, :]
        vis = vis & (tl.where(diff < 0, -diff, diff) < window)
    s = tl.where(vis, s, float("-inf"))
    m_i, l_i, acc = _online_softmax_step(m_i, l_i, acc, s, vb, IEEE, UPCAST)
    out = acc / l_i[:, None]
    tl.store(o_ptr + q_off[:, None] + dd[None, :], out.to(o_ptr.dtype.element_ty), mask=m_ok[:, None] & d_ok[None, :])


def block_attention_launch_config(
    B: int, num_heads: int, num_kv_heads: int, head_dim: int, block_n: int = 64, max_block_m: int = 128
) -> dict:
    """Tile sizes and grid factors shared by the torch launcher and the TensorRT AOT plugin."""
    rep = num_heads // num_kv_heads
    block_m = min(_pow2(rep * B, 16), max_block_m)
    return dict(
        REP=rep,
        BLOCK_D=_pow2(head_dim, 16),
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_B=_pow2(B, 16),
        m_tiles=triton.cdiv(rep * B, block_m),
    )


def block_attention(
    q,
    k,
    v,
    k_cache,
    v_cache,
    page_table,
    lengths,
    *,
    causal: bool,
    window: int | None,
    scale: float,
    layer: int = 0,
    out: torch.Tensor | None = None,
    block_n: int | None = None,
) -> torch.Tensor:
    """Launch the kernel. ``k_cache``/``v_cache``: one layer's [pages, page_size, kvh, d]
    pools, or all layers' [L, pages, page_size, kvh, d] with ``layer`` picking one."""
    b, B, h, d = q.shape
    kvh = k.shape[2]
    if h % kvh:
        raise ValueError("query heads must be a multiple of kv heads")
    if out is None:
        out = torch.empty_like(q)
    if b == 0 or B == 0:
        return out
    _check_device(q, k, v, k_cache, v_cache)
    k_cache, v_cache, layer = _all_layers(k_cache, v_cache, layer)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    page_table = page_table.contiguous()
    cfg = block_attention_launch_config(B, h, kvh, d, block_n=block_n or (16 if interpreted() else 64))
    use_window = window is not None
    _block_attention_kernel[(b, kvh, cfg["m_tiles"])](
        q,
        k,
        v,
        k_cache,
        v_cache,
        page_table,
        lengths.contiguous(),
        B,
        page_table.shape[1],
        k_cache[0].numel(),
        layer,
        k_cache.shape[2],
        int(window) if use_window else 0,
        float(scale) * LOG2E,
        out,
        **_block_attention_meta(cfg, kvh, d, causal=bool(causal), use_window=use_window, dtype=q.dtype),
    )
    return out


def _all_layers(k_cache, v_cache, layer) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The caches as contiguous all-layer pools [L, pages, page_size, kvh, d] and the layer to read
    (one layer's pool [pages, page_size, kvh, d] is layer 0 of one)."""
    if k_cache.dim() == 4:
        k_cache, v_cache, layer = k_cache[None], v_cache[None], 0
    return k_cache.contiguous(), v_cache.contiguous(), int(layer)


def _block_attention_meta(cfg: dict, kvh: int, d: int, *, causal: bool, use_window: bool, dtype) -> dict:
    """The kernel's meta-parameters (compile-time constants) for one launch config: heads, tiles, the
    mask modes, IEEE dots for float32, and an fp32 upcast of half inputs under the interpreter."""
    return dict(
        KVH=kvh,
        REP=cfg["REP"],
        D=d,
        BLOCK_D=cfg["BLOCK_D"],
        BLOCK_M=cfg["BLOCK_M"],
        BLOCK_N=cfg["BLOCK_N"],
        BLOCK_B=cfg["BLOCK_B"],
        CAUSAL=causal,
        USE_WINDOW=use_window,
        IEEE=dtype == torch.float32,
        UPCAST=interpreted() and dtype != torch.float32,
    )
