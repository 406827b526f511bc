"""A lean forward for plain decoder targets (Llama, Qwen2, Qwen3): the same weights and the same
arithmetic as transformers' modules, without their per-call machinery.

Why: on the reference runtime a round is a handful of small forwards, and for small models the
time goes to framework overhead, not arithmetic: transformers' decorators, output recording,
mask construction and module dispatch cost several times the matrix work per layer (measured
on the embedded pair: about 60% of a verify forward). This forward is gpt-fast's
(``pytorch-labs/gpt-fast``, ``model.py``) over transformers' own parameters and its cache
object: per layer one fused QKV projection, q/k RMSNorm (Qwen3), RoPE from the model's own
rotary module (every RoPE variant transformers implements), SDPA over the cache, and one
fused gate/up projection. The attention mask is built once per forward, not per layer.

:func:`lean_forward` returns None for anything else (sliding or linear-attention layers,
soft-capping, other activations) and for a model whose logits it does not reproduce on a
probe input: the backend then runs transformers' forward, which is always correct.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

FAMILIES = ("llama", "qwen2", "qwen3")
FUSE_BYTES = 1 << 30  # models up to 1 GiB get fused, [in, out] copies of their matrices
STATIC_ROPE = ("default", "linear", "llama3", "yarn")  # RoPE types whose tables do not change with length


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' RMSNorm (float32 statistics, cast back, then the weight), one fused kernel
    for the normalisation: the same numbers as the module's five operations."""
    return weight * F.rms_norm(x.float(), (x.shape[-1],), None, eps).to(x.dtype)


def rope(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """``x * cos + rotate_half(x) * sin`` with rotate_half as one roll: ``sin_signed`` is sin with
    its first half negated, so every product and sum is the module's own."""
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin_signed


def _signed(sin: torch.Tensor) -> torch.Tensor:
    half = sin.shape[-1] // 2
    return torch.cat([-sin[..., :half], sin[..., half:]], -1)


class Matrix:
    """One linear map ``x -> x @ W.T + b`` over the model's weights W [out, in]: as prepared
    ``[in, out]`` copy (``fuse``; several W stack into one, their outputs side by side), or the
    model's own tensors, one GEMM each.

    Why the copy: on a CPU, ``x @ W_t`` over a contiguous [in, out] matrix runs the small GEMMs
    of a decode step well faster than ``F.linear`` over [out, in] (measured on one core, fp32,
    the embedded target's shapes: [8, 128] x [128, 768] 12 us against 22, the [128, 4096] head
    81 us against 140; [1, 128] rows 6 against 10)."""

    def __init__(self, weights: list[torch.Tensor], biases: list[torch.Tensor | None], fuse: bool):
        self.fused = fuse
        if fuse:
            self.w: Any = torch.cat(weights).t().contiguous()  # [in, out]
            self.b: Any = None if biases[0] is None else torch.cat(biases)  # type: ignore[arg-type]
        else:
            self.w, self.b = weights, biases

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused:
            y = x @ self.w
            return y if self.b is None else y + self.b
        outs = [F.linear(x, w, b) for w, b in zip(self.w, self.b, strict=True)]
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)


def matrix(fuse: bool, *linears) -> Matrix:
    """A :class:`Matrix` of ``nn.Linear``-like modules (``.weight``, optional ``.bias``), stacked."""
    return Matrix([m.weight for m in linears], [getattr(m, "bias", None) for m in linears], fuse)


@dataclass
class _Layer:
    qkv: Matrix  # q_proj, k_proj, v_proj: [.., (h + 2*kvh) * d]
    o: Matrix
    qk_norm: torch.Tensor | None  # [h + kvh, d]: q_norm per q head, then k_norm per k head (Qwen3)
    gate_up: Matrix  # gate_proj, up_proj: [.., 2*I]
    down: Matrix
    ln1: torch.Tensor
    ln2: torch.Tensor


def _layer(layer, h: int, kvh: int, fuse: bool) -> _Layer:
    """One layer's weights; ``fuse``: prepared [in, out] copies, q/k/v and gate/up stacked."""
    a, m = layer.self_attn, layer.mlp
    qn, kn = getattr(a, "q_norm", None), getattr(a, "k_norm", None)
    qk_norm = None
    if qn is not None and kn is not None:
        qk_norm = torch.cat([qn.weight.expand(h, -1), kn.weight.expand(kvh, -1)])
    return _Layer(
        qkv=matrix(fuse, a.q_proj, a.k_proj, a.v_proj),
        o=matrix(fuse, a.o_proj),
        qk_norm=qk_norm,
        gate_up=matrix(fuse, m.gate_proj, m.up_proj),
        down=matrix(fuse, m.down_proj),
        ln1=layer.input_layernorm.weight,
        ln2=layer.post_attention_layernorm.weight,
    )


class LeanDecoder:
    """``forward(ids, positions, col_valid, cache, layer_ids)`` -> (logits, target_hidden or None)."""

    def __init__(self, model):
        cfg = model.config
        self.model, self.inner = model, model.model
        self.h, self.kvh = cfg.num_attention_heads, cfg.num_key_value_heads
        self.d = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.eps = cfg.rms_norm_eps
        # The [in, out] copies cost the model's matrices once more (the head's too): worth it where
        # per-call overhead dominates (small models), not for large ones.
        fuse = sum(p.numel() * p.element_size() for p in model.parameters()) <= FUSE_BYTES
        self.layers = [_layer(layer, self.h, self.kvh, fuse) for layer in self.inner.layers]
        out = model.get_output_embeddings()
        self.head = matrix(fuse, out)
        self.weight = out.weight  # a parameter of the model (device, dtype, the RoPE probe)
        self.rope_table = self._rope_table(cfg)

    def _rope_table(self, cfg) -> tuple[torch.Tensor, torch.Tensor] | None:
        """cos/sin [P, d] of every position, once, from the model's rotary module, for RoPE types
        that do not depend on the sequence length (the per-position arithmetic is elementwise,
        so a lookup gives the same numbers as the module)."""
        rotary = self.inner.rotary_emb
        P = int(getattr(cfg, "max_position_embeddings", 0) or 0)
        if getattr(rotary, "rope_type", "default") not in STATIC_ROPE or not 0 < P <= 1 << 16:
            return None
        x = self.weight[:1, None]
        cos, sin = rotary(x, torch.arange(P, device=x.device)[None])
        return cos[0], _signed(sin[0])

    def cos_sin(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed sin (see :func:`rope`) [b, T, d] at ``positions`` [b, T]."""
        if self.rope_table is not None and int(positions.max()) < len(self.rope_table[0]):
            return self.rope_table[0][positions], self.rope_table[1][positions]
        cos, sin = self.inner.rotary_emb(x, positions)
        return cos, _signed(sin)

    def _attention(self, L: _Layer, x, cos, sin, mask, cache, i):
        b, T, _ = x.shape
        h, kvh, d = self.h, self.kvh, self.d
        qkv = L.qkv(rms_norm(x, L.ln1, self.eps)).view(b, T, h + 2 * kvh, d)
        qk, v = qkv[:, :, : h + kvh], qkv[:, :, h + kvh :]
        if L.qk_norm is not None:  # q_norm on q heads, k_norm on k heads
            qk = rms_norm(qk, L.qk_norm, self.eps)
        qk = qk.transpose(1, 2)  # [b, h+kvh, T, d]
        qk = rope(qk, cos, sin)  # on q and k at once
        k, v = cache.update(qk[:, h:], v.transpose(1, 2), i)  # [b, kvh, S+T, d]
        out = F.scaled_dot_product_attention(qk[:, :h], k, v, attn_mask=mask, scale=d**-0.5, enable_gqa=h != kvh)
        return L.o(out.transpose(1, 2).reshape(b, T, h * d))

    def forward(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        col_valid: torch.Tensor,
        cache,
        layer_ids: list[int] | None,
        logits_at: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """ids, positions [b, T]; col_valid [b, S+T] bool over the S cached columns and the T
        new ones. Returns logits [b, T, V] ([b, 1, V] at ``logits_at`` [b] when given) and, for
        ``layer_ids``, target_hidden [b, T, n_tap*H]."""
        b, T = ids.shape
        S = col_valid.shape[1] - T
        x = self.inner.embed_tokens(ids)
        cos, sin = self.cos_sin(x, positions)  # [b, T, d]
        cos, sin = cos[:, None], sin[:, None]
        dev = ids.device
        causal = torch.arange(S + T, device=dev) <= S + torch.arange(T, device=dev)[:, None]  # [T, S+T]
        mask = (col_valid[:, None, :] & causal)[:, None]  # [b, 1, T, S+T]
        taps = set(layer_ids or ())
        hidden = []
        for i, L in enumerate(self.layers):
            x = x + self._attention(L, x, cos, sin, mask, cache, i)
            g, u = L.gate_up(rms_norm(x, L.ln2, self.eps)).chunk(2, -1)
            x = x + L.down(F.silu(g) * u)
            if i in taps:
                hidden.append(x)
        x = rms_norm(x, self.inner.norm.weight, self.eps)
        if len(self.layers) - 1 in taps:  # transformers' last hidden state is the normed one
            hidden[-1] = x
        if logits_at is not None:
            x = x[torch.arange(b, device=dev), logits_at][:, None]  # [b, 1, H]
        logits = self.head(x)
        ordered = [hidden[sorted(taps).index(i)] for i in layer_ids] if layer_ids else None
        return logits, (torch.cat(ordered, dim=-1) if ordered else None)


def plain_decoder(model) -> bool:
    cfg = model.config
    if getattr(cfg, "model_type", None) not in FAMILIES or getattr(cfg, "hidden_act", "silu") != "silu":
        return False
    if any(t != "full_attention" for t in (getattr(cfg, "layer_types", None) or ())):
        return False
    if getattr(cfg, "use_sliding_window", False) or getattr(cfg, "final_logit_softcapping", None):
        return False
    inner = getattr(model, "model", None)
    return all(hasattr(inner, a) for a in ("embed_tokens", "layers", "norm", "rotary_emb"))


def lean_forward(model) -> LeanDecoder | None:
    """A :class:`LeanDecoder` for ``model`` when it is a plain decoder whose logits it reproduces
    on a probe input (same dtype, a small tolerance), else None. Kept on the model and rebuilt
    only when a parameter changes (identity, version, dtype: the fused weights are copies)."""
    key = tuple((t.data_ptr(), t._version, t.dtype) for t in model.parameters())
    cached = getattr(model, "_dflash_lean", None)
    if cached is None or cached[0] != key:
        cached = (key, _probed(model) if plain_decoder(model) else None)
        model._dflash_lean = cached
    return cached[1]


@torch.no_grad()  # not inference_mode: the fused copies must be usable outside it too
def _probed(model) -> LeanDecoder | None:
    from transformers import DynamicCache  # start-up: transformers (importing the runtime does not import it)

    lean = LeanDecoder(model)
    vocab = model.config.vocab_size
    ids = torch.arange(7, device=lean.weight.device)[None] * 131 % vocab  # [1, 7]
    pos = torch.arange(7, device=ids.device)[None]
    want = model(input_ids=ids, position_ids=pos).logits.float()
    got = lean.forward(ids, pos, torch.ones_like(ids, dtype=torch.bool), DynamicCache(config=model.config), None)[0]
    tol = {torch.float64: 1e-9, torch.float32: 1e-4}.get(lean.weight.dtype, 5e-2)
    return lean if ((got.float() - want).abs().max() <= tol * (1 + want.abs().max())) else None
