"""A lean drafter round for the reference runtime: the drafter's arithmetic over prepared weights,
without the per-call machinery of the reference ops.

Why: on a CPU a drafter round is a few dozen small tensor calls per layer, and for small models
the time goes to their overhead. The reference round (``Drafter.inject`` + ``Drafter.draft``
through ``plugins``, the specification of both DFlash ops) builds RoPE tables and the visibility
mask and gathers the paged context per layer, and runs ``nn.Linear`` over [out, in] weights;
measured on the embedded DFlash2 pair (one core, fp32) it took 3.1 ms a round against 2.7 ms
for a whole 16-layer target step. This round (1.1 ms there in isolation, 1.4–1.6 ms inside the
bench's loop) is the same computation:

* KV injection: ``fc`` -> ``hidden_norm`` -> one GEMM over every layer's K and V, k_norm, RoPE
  from a table of every position (computed once, as the reference computes each position), the
  paged scatter of the committed tokens;
* the block: every layer's context gathered from the pages in one index per K and V, the
  visibility mask built once per round (none when every row sees its whole context), fused
  q/k/v and gate/up GEMMs over [in, out] copies (``decoder.Matrix``), DFlash2's dynamic
  convolutions around each sublayer;
* the draft logits through the target's head (its lean [in, out] copy when there is one).

The paged cache is the same object the reference and every exported graph use, so rows join,
leave and repack as before. :func:`lean_drafter` returns None for a drafter it does not cover
(a class other than ``Drafter`` and ``DFlash2Drafter``, a reduced draft vocabulary, a kernel
choice other than the reference) and for one whose round it does not reproduce on a probe: the
backend then runs the reference, which is always correct.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from dflash_trt import plugins
from dflash_trt.model import DFlash2Drafter, Drafter
from dflash_trt.plugins import PagedKVCache, block_visibility, rms_norm
from dflash_trt.runtime.decoder import FUSE_BYTES, Matrix, matrix, rope

MAX_TABLE = 1 << 16  # RoPE tables for drafters of up to this many positions (else computed per round)


@dataclass
class _Conv:
    """One DynamicConv (DFlash2): the kernel projection and the two static kernels [K, 1, G, gs]."""

    projection: Matrix
    base: torch.Tensor
    group_size: int


@dataclass
class _Layer:
    qkv: Matrix
    o: Matrix
    qk_norm: torch.Tensor  # [h + kvh, d]
    gate_up: Matrix
    down: Matrix
    ln1: torch.Tensor
    ln2: torch.Tensor
    causal: bool
    window: int | None
    attention_conv: _Conv | None
    mlp_conv: _Conv | None


def _conv(module, fuse: bool) -> _Conv | None:
    if module is None:
        return None
    K, H = module.base_kernel.shape[1:]
    gs = module.group_size
    return _Conv(matrix(fuse, module.kernel_projection), module.base_kernel.detach().view(2, K, 1, H // gs, gs), gs)


def _dynamic_conv(x: torch.Tensor, dyn: torch.Tensor, base: torch.Tensor, gs: int) -> torch.Tensor:
    """``plugins.grouped_dynamic_conv`` over one block: x [b, n, H]; dyn [b, n, K, G]; base [K, 1, G, gs]
    (the same products and sums; no in-place update, so the ONNX export traces it too)."""
    b, n, H = x.shape
    xs = x.view(b, n, H // gs, gs)
    out = (base[0] + dyn[:, :, 0, :, None]) * xs
    for o in range(1, min(base.shape[0], n)):
        out = out + (base[o] + dyn[:, :, o, :, None]) * F.pad(xs[:, : n - o], (0, 0, 0, 0, o, 0))
    return out.view(b, n, H)


class LeanDrafter:
    """``inject``, ``draft``, ``logits`` and ``propose``: what the drafter's own methods of those
    names compute (``Drafter.logits`` through the target's head given here)."""

    def __init__(self, drafter: Drafter, head: Matrix, fuse: bool):
        cfg = self.cfg = drafter.cfg
        self.drafter, self.head = drafter, head
        self.h, self.kvh, self.d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.eps = cfg.rms_norm_eps
        self.fc = matrix(fuse, drafter.fc)
        self.hidden_norm = drafter.hidden_norm.weight
        modules: list[Any] = list(drafter.layers)
        attns = [layer.self_attn for layer in modules]
        self.kv = Matrix(
            [w for a in attns for w in (a.k_proj.weight, a.v_proj.weight)],
            [b for a in attns for b in (a.k_proj.bias, a.v_proj.bias)],
            fuse,
        )
        self.k_norm = torch.stack([a.k_norm.weight for a in attns])  # [L, d]
        self.layers = []
        for i, layer in enumerate(modules):
            a, m = layer.self_attn, layer.mlp
            self.layers.append(
                _Layer(
                    qkv=matrix(fuse, a.q_proj, a.k_proj, a.v_proj),
                    o=matrix(fuse, a.o_proj),
                    qk_norm=torch.cat([a.q_norm.weight.expand(self.h, -1), a.k_norm.weight.expand(self.kvh, -1)]),
                    gate_up=matrix(fuse, m.gate_proj, m.up_proj),
                    down=matrix(fuse, m.down_proj),
                    ln1=layer.input_layernorm.weight,
                    ln2=layer.post_attention_layernorm.weight,
                    causal=cfg.layer_causal(i),
                    window=cfg.layer_window(i),
                    attention_conv=_conv(getattr(layer, "attention_conv", None), fuse),
                    mlp_conv=_conv(getattr(layer, "mlp_conv", None), fuse),
                )
            )
        self.norm = drafter.norm.weight
        selector = getattr(drafter, "candidate_selector", None)
        self.selector = matrix(fuse, selector.hidden_projection) if selector is not None else None
        P = cfg.max_position_embeddings
        self.table = self.rope_at(torch.arange(P, device=self.norm.device)) if 0 < P <= MAX_TABLE else None

    def rope_at(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed sin (``decoder.rope``) at ``positions``, as ``Drafter.rope`` computes them."""
        cos, sin = self.drafter.rope(positions, self.norm.dtype)
        half = sin.shape[-1] // 2
        return cos, torch.cat([-sin[..., :half], sin[..., half:]], -1)

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.table is not None and int(positions.max()) < len(self.table[0]):
            return self.table[0][positions], self.table[1][positions]
        return self.rope_at(positions)

    # -- KV injection ----------------------------------------------------------------------
    def inject(self, target_hidden: torch.Tensor, n_new: torch.Tensor, cache: PagedKVCache) -> None:
        """``plugins.kv_injection``: the first n_new[i] of target_hidden [b, T, n_tap*H] land at
        ``cache.lengths[i] + t``; advances ``cache.lengths``."""
        b, T, _ = target_hidden.shape
        if b == 0 or T == 0:
            return
        cache.reserve(n_new)
        L, kvh, d = len(self.layers), self.kvh, self.d
        ctx = rms_norm(self.fc(target_hidden.to(self.norm.dtype)), self.hidden_norm, self.eps)
        kv = self.kv(ctx).view(b, T, L, 2, kvh, d)
        positions = cache.lengths[:, None] + torch.arange(T, device=kv.device)  # [b, T]
        cos, sin = self.cos_sin(positions)
        k = rope(
            rms_norm(kv[:, :, :, 0], self.k_norm[:, None], self.eps), cos[:, :, None, None], sin[:, :, None, None]
        )  # [b, T, L, kvh, d]
        v = kv[:, :, :, 1]
        ps = cache.page_size
        if b == 1:  # one row: its first n_new tokens, in order
            n = int(n_new[0])
            rows, cols = torch.zeros(n, dtype=torch.long, device=kv.device), torch.arange(n, device=kv.device)
        else:
            rows, cols = (torch.arange(T, device=kv.device)[None] < n_new[:, None]).nonzero(as_tuple=True)
        pos = positions[rows, cols]
        page = cache.page_table.long()[rows, pos // ps]
        off = pos % ps
        cache.k[:, page, off] = k[rows, cols].transpose(0, 1).to(cache.k.dtype)
        cache.v[:, page, off] = v[rows, cols].transpose(0, 1).to(cache.v.dtype)
        cache.lengths = cache.lengths + n_new

    # -- the block -------------------------------------------------------------------------
    def draft(self, block_embeds: torch.Tensor, cache: PagedKVCache) -> torch.Tensor:
        """``Drafter.draft``: one forward over block_embeds [b, B, H] -> normed hidden [b, B, H]."""
        b, B, _ = block_embeds.shape
        dev = block_embeds.device
        lengths = cache.lengths
        S = int(lengths.max()) if b else 0
        pos = torch.arange(S, device=dev)
        pages = cache.page_table.long().clamp_min(0)[:, pos // cache.page_size]  # [b, S]
        ctx_k = cache.k[:, pages, (pos % cache.page_size)[None]]  # [L, b, S, kvh, d]
        ctx_v = cache.v[:, pages, (pos % cache.page_size)[None]]
        ragged = bool((lengths != S).any())
        masks: dict[tuple[bool, int | None], torch.Tensor | None] = {}

        def attend(i: int, layer: _Layer, q, k, v):
            key = (layer.causal, layer.window)
            if key not in masks:
                masks[key] = (
                    block_visibility(lengths, S, B, layer.causal, layer.window)[:, None]
                    if ragged or layer.causal or layer.window is not None
                    else None
                )
            keys = torch.cat([ctx_k[i].to(q.dtype), k], dim=1).transpose(1, 2)  # [b, kvh, S+B, d]
            vals = torch.cat([ctx_v[i].to(q.dtype), v], dim=1).transpose(1, 2)
            return F.scaled_dot_product_attention(
                q.transpose(1, 2), keys, vals, attn_mask=masks[key], scale=self.d**-0.5, enable_gqa=self.h != self.kvh
            )

        cos, sin = self.cos_sin(lengths[:, None] + torch.arange(B, device=dev))
        return self.layers_forward(block_embeds, cos, sin, attend)

    def layers_forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend) -> torch.Tensor:
        """The layer stack over block tokens x [b, B, H] (``Drafter.block_forward``): cos / signed
        sin [b, B, d] at their positions; ``attend(i, layer, q, k, v)`` with q [b, B, h, d] and the
        block's own k, v [b, B, kvh, d] (RoPE applied) returns attention [b, h, B, d] over layer i's
        context and the block."""
        b, B, _ = x.shape
        h, kvh, d = self.h, self.kvh, self.d
        cos, sin = cos[:, :, None], sin[:, :, None]
        for i, L in enumerate(self.layers):
            hn, dyn = self._conv_in(L.attention_conv, rms_norm(x, L.ln1, self.eps))
            qkv = L.qkv(hn).view(b, B, h + 2 * kvh, d)
            qk = rope(rms_norm(qkv[:, :, : h + kvh], L.qk_norm, self.eps), cos, sin)
            out = attend(i, L, qk[:, :, :h], qk[:, :, h:], qkv[:, :, h + kvh :])
            x = x + self._conv_out(L.attention_conv, L.o(out.transpose(1, 2).reshape(b, B, h * d)), dyn)
            hn, dyn = self._conv_in(L.mlp_conv, rms_norm(x, L.ln2, self.eps))
            g, u = L.gate_up(hn).chunk(2, -1)
            x = x + self._conv_out(L.mlp_conv, L.down(F.silu(g) * u), dyn)
        return rms_norm(x, self.norm, self.eps)

    @staticmethod
    def _conv_in(conv: _Conv | None, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        if conv is None:
            return h, None
        K = conv.base.shape[1]
        dyn = conv.projection(h).view(*h.shape[:-1], 2, K, -1)  # [b, B, 2, K, G]
        return _dynamic_conv(h, dyn[:, :, 0], conv.base[0], conv.group_size), dyn[:, :, 1]

    @staticmethod
    def _conv_out(conv: _Conv | None, y: torch.Tensor, dyn: torch.Tensor | None) -> torch.Tensor:
        if conv is None or dyn is None:
            return y
        return _dynamic_conv(y, dyn, conv.base[1], conv.group_size)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``Drafter.logits`` through the target's head (no reduced vocabulary here)."""
        logits = self.head(hidden)
        if self.cfg.output_multiplier != 1.0:
            logits = logits * self.cfg.output_multiplier
        if self.cfg.final_logit_softcapping:
            cap = self.cfg.final_logit_softcapping
            logits = torch.tanh(logits / cap) * cap
        return logits

    def propose(
        self, hidden: torch.Tensor, logits: torch.Tensor, anchor: torch.Tensor, temperature: float
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``DFlash2Drafter.propose`` (gen None): at temperature 0 the walk from every transition's
        score at once (``plugins.selector_walk_greedy``), else the drafter's own walk."""
        sel = getattr(self.drafter, "candidate_selector", None)
        if temperature > 0 or sel is None or self.selector is None:
            return self.drafter.propose(hidden, logits, anchor, temperature, None)  # type: ignore[operator]
        unary, cand = torch.topk(logits.float(), sel.top_k, dim=-1)
        return plugins.selector_walk_greedy(
            unary, cand, self.selector(hidden), sel.predecessor_codebook, sel.successor_codebook, anchor
        ), None


def lean_drafter(drafter: Drafter, head: Matrix | None, head_module: torch.nn.Module) -> LeanDrafter | None:
    """A :class:`LeanDrafter` when ``drafter`` runs the reference kernels without a reduced vocabulary
    and its round reproduces the reference on a probe (same dtype, a small tolerance), else None.
    ``head``: the target's lean head (None: ``head_module``'s weight as it is, never copied). Kept on the
    drafter and rebuilt only when a parameter changes (identity, version, dtype)."""
    if type(drafter) not in (Drafter, DFlash2Drafter):  # a subclass may compute its round otherwise
        return None
    if drafter.kernels != "reference" or drafter.lm_head is not None:
        return None
    key = (
        tuple((t.data_ptr(), t._version, t.dtype) for t in drafter.parameters()),
        id(head_module),
        head_module.weight._version,
    )
    cached = getattr(drafter, "_dflash_lean", None)
    if cached is None or cached[0] != key:
        cached = (key, _probed(drafter, head, head_module))
        drafter._dflash_lean = cached
    return cached[1]


@torch.no_grad()
def _probed(drafter: Drafter, head: Matrix | None, head_module: torch.nn.Module) -> LeanDrafter | None:
    cfg = drafter.cfg
    weights = sum(p.numel() * p.element_size() for p in drafter.parameters())
    fuse = weights <= FUSE_BYTES
    if head is None:  # the target's own head as it is: a copy of a large vocabulary's head is gigabytes
        head = matrix(False, head_module)
    lean = LeanDrafter(drafter, head, fuse)
    dev, dtype = drafter.fc.weight.device, drafter.dtype
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 5, drafter.fc.in_features, generator=gen).to(dev, dtype)
    embeds = torch.randn(2, cfg.block_size, cfg.hidden_size, generator=gen).to(dev, dtype)
    want_cache, got_cache = drafter.new_cache(2, device=dev), drafter.new_cache(2, device=dev)
    # two rounds: the second reads the context the first injected; rows of equal context
    # lengths (no mask) in the first, of different lengths (the visibility mask) in the second
    for n_new in (torch.tensor([5, 5], device=dev), torch.tensor([3, 5], device=dev)):
        drafter.inject(hidden, n_new, want_cache)
        want = drafter.logits(drafter.draft(embeds, want_cache), head_module).float()
        lean.inject(hidden, n_new, got_cache)
        got = lean.logits(lean.draft(embeds, got_cache)).float()
        tol = 5e-2 if dtype in (torch.float16, torch.bfloat16) else 1e-4  # RMSNorm's statistics are float32
        if not (got - want).abs().max() <= tol * (1 + want.abs().max()):
            return None
    return lean
