"""Dispatch for the DFlash ops and the paged context cache they share.

The reference implementations here are what the runtime runs by default; they define
what the fast kernels must compute. ``kernels="triton"`` routes to the Triton kernels.
"""

from __future__ import annotations

import torch
from torch import nn

KERNELS = ("reference", "triton")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm in float32, cast back, then scaled (Hugging Face Llama/Qwen3 numerics)."""
    dtype = x.dtype
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [b, T, heads, d]; cos/sin: [b, T, d]."""
    return x * cos[:, :, None] + rotate_half(x) * sin[:, :, None]


class PagedKVCache:
    """The drafter's context KV cache: committed positions only, paged per sequence.

    ``k``/``v``: [layers, pages, page_size, kv_heads, head_dim]; ``page_table``: [b, max
    pages] (int32, page ids in allocation order, so sequences interleave and a table is
    generally not contiguous); ``lengths``: [b] committed context length.
    """

    def __init__(self, num_layers: int, batch: int, num_kv_heads: int, head_dim: int,
                 page_size: int = 16, device=None, dtype=torch.float32, pages: int = 8):
        self.page_size = page_size
        self.k = torch.zeros(num_layers, pages, page_size, num_kv_heads, head_dim, device=device, dtype=dtype)
        self.v = torch.zeros_like(self.k)
        self.page_table = torch.zeros(batch, 0, dtype=torch.int32, device=device)
        self.lengths = torch.zeros(batch, dtype=torch.long, device=device)
        self.used_pages = 0

    @property
    def batch(self) -> int:
        return self.lengths.shape[0]

    def reserve(self, extra: torch.Tensor) -> None:
        """Make room for ``extra[i]`` more positions in sequence i (allocating pages)."""
        per_seq = ((self.lengths + extra + self.page_size - 1) // self.page_size).tolist()
        held = (self.page_table >= 0).sum(1).tolist()  # tables fill left to right
        # New pages go out round-robin across sequences (page index first), so tables interleave.
        todo = sorted((p, i) for i in range(self.batch) for p in range(held[i], per_seq[i]))
        if not todo:
            return
        need = max(per_seq)
        if need > self.page_table.shape[1]:
            pad = torch.full((self.batch, need - self.page_table.shape[1]), -1, dtype=torch.int32,
                             device=self.lengths.device)
            self.page_table = torch.cat([self.page_table, pad], dim=1)
        self._grow_pool(self.used_pages + len(todo))
        cols, rows = zip(*todo)
        ids = torch.arange(self.used_pages, self.used_pages + len(todo), dtype=torch.int32)
        self.page_table[list(rows), list(cols)] = ids.to(self.page_table.device)
        self.used_pages += len(todo)

    def _grow_pool(self, pages: int) -> None:
        if pages <= self.k.shape[1]:
            return
        new = max(pages, 2 * self.k.shape[1])
        grow = lambda t: torch.cat([t, t.new_zeros(t.shape[0], new - t.shape[1], *t.shape[2:])], dim=1)
        self.k, self.v = grow(self.k), grow(self.v)

    def slots(self, n_new: torch.Tensor, T: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(page, offset) of the T write positions of each sequence; -1 pages where t >= n_new."""
        t = torch.arange(T, device=self.lengths.device)
        pos = self.lengths[:, None] + t
        valid = t[None] < n_new[:, None]
        page_idx = torch.where(valid, pos // self.page_size, 0)
        page = torch.gather(self.page_table.long(), 1, page_idx) if self.page_table.shape[1] else page_idx
        page = torch.where(valid, page, -1)
        return page, pos % self.page_size

    def gather(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Contiguous [b, max_len, kv_heads, d] copies of one layer's context (reference use)."""
        max_len = int(self.lengths.max().item()) if self.batch else 0
        pos = torch.arange(max_len, device=self.lengths.device)
        page = torch.gather(self.page_table.long().clamp_min(0), 1,
                            (pos // self.page_size)[None].expand(self.batch, -1)) if max_len else \
            torch.zeros(self.batch, 0, dtype=torch.long, device=self.lengths.device)
        off = (pos % self.page_size)[None].expand(self.batch, -1)
        return self.k[layer][page, off], self.v[layer][page, off]

    def select(self, rows: torch.Tensor) -> None:
        """Keep only these sequences (finished ones leave the batch); pages stay allocated."""
        self.page_table = self.page_table[rows]
        self.lengths = self.lengths[rows]


def fused_kv_weights(drafter: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """All layers' k_proj and v_proj stacked for one GEMM: [L*2*kvh*d, H], bias, k_norm [L, d].

    Cached on the drafter, keyed on the source tensors' identities and versions, so it is
    rebuilt after a dtype/device move or an optimizer step and not on every round."""
    srcs = [t for layer in drafter.layers for t in (
        layer.self_attn.k_proj.weight, layer.self_attn.v_proj.weight, layer.self_attn.k_norm.weight,
        layer.self_attn.k_proj.bias, layer.self_attn.v_proj.bias) if t is not None]
    key = tuple((t.data_ptr(), t._version, t.dtype, t.requires_grad and torch.is_grad_enabled()) for t in srcs)
    cached = getattr(drafter, "_fused_kv_cache", None)
    if cached is not None and cached[0] == key:
        return cached[1]
    fused = _stack_kv(drafter)
    if not any(t.requires_grad and torch.is_grad_enabled() for t in srcs):  # never cache autograd graphs
        drafter._fused_kv_cache = (key, fused)
    return fused


def _stack_kv(drafter: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    ws, bs, kn = [], [], []
    for layer in drafter.layers:
        a = layer.self_attn
        ws += [a.k_proj.weight, a.v_proj.weight]
        if a.k_proj.bias is not None:
            bs += [a.k_proj.bias, a.v_proj.bias]
        kn.append(a.k_norm.weight)
    return torch.cat(ws, 0), (torch.cat(bs, 0) if bs else None), torch.stack(kn, 0)


def kv_injection(drafter: nn.Module, taps: torch.Tensor, n_new: torch.Tensor, cache: PagedKVCache,
                 kernels: str = "reference") -> None:
    """Inject context K/V for new committed tokens; advances ``cache.lengths`` by ``n_new``."""
    from dflash_trt.plugins import kv_injection as kvi

    cfg = drafter.cfg
    cache.reserve(n_new)
    wkv, bkv, k_norm = fused_kv_weights(drafter)
    args = dict(
        taps=taps, n_new=n_new, lengths=cache.lengths, fc_weight=drafter.fc.weight,
        norm_weight=drafter.hidden_norm.weight, kv_weight=wkv, kv_bias=bkv, k_norm_weight=k_norm,
        inv_freq=drafter.inv_freq, rope_scale=drafter.rope_scaling_factor, eps=cfg.rms_norm_eps,
        k_cache=cache.k, v_cache=cache.v, page_table=cache.page_table,
        num_kv_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim,
    )
    if kernels == "triton":
        kvi.kv_injection_triton(**args)
    elif kernels == "reference":
        kvi.kv_injection_reference(**args)
    else:
        raise ValueError(f"unknown kernels {kernels!r}; choose one of {KERNELS}")
    cache.lengths = cache.lengths + n_new


def block_attention(q, k, v, k_cache, v_cache, page_table, lengths, *, causal: bool,
                    window: int | None, scale: float, kernels: str = "reference") -> torch.Tensor:
    """[b, B, h, d] output; see ``plugins.block_attention`` for the exact semantics."""
    from dflash_trt.plugins import block_attention as ba

    if kernels == "triton":
        return ba.block_attention_triton(q, k, v, k_cache, v_cache, page_table, lengths,
                                         causal=causal, window=window, scale=scale)
    if kernels != "reference":
        raise ValueError(f"unknown kernels {kernels!r}; choose one of {KERNELS}")
    return ba.block_attention_reference(q, k, v, k_cache, v_cache, page_table, lengths,
                                        causal=causal, window=window, scale=scale)
