"""The target forward in the form ONNX Runtime runs fastest: ``target_ort.onnx``.

``target.onnx`` is transformers' own forward traced (every family that stacks its cache; the
TensorRT form): on the embedded pair about 1,550 nodes, each RMSNorm six of them, each attention a
dozen (repeat-kv, transposes, the mask arithmetic, two MatMuls and a Softmax), q/k/v and gate/up
separate GEMMs. ONNX Runtime on a CPU pays per node, so for a small target that graph costs more
in dispatch than in arithmetic. This graph is the same forward of a plain decoder (Llama, Qwen2,
Qwen3: what ``runtime.decoder.lean_forward`` runs) written at opset 23: RMSNorm one
``RMSNormalization`` node, attention one ``Attention`` node (grouped-query, boolean mask), q/k/v and
gate/up each one MatMul over a stacked [in, out] matrix. Same inputs and outputs as ``target.onnx``
(``graph_io.TARGET_INPUTS`` / ``TARGET_OUTPUTS``), so the graph runtimes take either; checked
against transformers' forward on a cache with holes (``onnx_target.check_target_onnx``).

Written for plain decoders whose weights fit :data:`MAX_BYTES` (the models a CPU runs); others
keep ``target.onnx`` alone.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.export import Dim

from dflash_trt.errors import require
from dflash_trt.export.graph_io import DYNAMIC_AXES, TARGET_INPUTS, TARGET_OUTPUTS
from dflash_trt.export.onnx_native import export_opset23
from dflash_trt.export.onnx_target import target_example_inputs
from dflash_trt.runtime import STATIC_ROPE, plain_decoder

NATIVE_TARGET_FILE = "target_ort.onnx"
MAX_BYTES = 1 << 30  # the lean forward's own bound (``decoder.FUSE_BYTES``): a second copy of the weights


def native_target_problem(model: nn.Module) -> str | None:
    """Why ``model`` gets no ``target_ort.onnx`` (None: it does)."""
    if not plain_decoder(model):
        return "not a plain decoder (Llama, Qwen2, Qwen3 without sliding windows)"
    rope_type = getattr(model.model.rotary_emb, "rope_type", "default")
    if rope_type not in STATIC_ROPE:  # the graph's RoPE is one inv_freq for every length
        return f"its RoPE ({rope_type}) changes with the sequence length"
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    if size > MAX_BYTES:
        return f"its weights ({size / 2**30:.1f} GiB) exceed the {MAX_BYTES >> 30} GiB of the CPU form"
    return None


def _t(*linears) -> torch.Tensor:
    """The stacked [in, out] matrix of ``linears``' weights (their outputs side by side)."""
    return torch.cat([m.weight.detach() for m in linears]).t().contiguous()


def _bias(*linears) -> torch.Tensor | None:
    biases = [getattr(m, "bias", None) for m in linears]
    return None if biases[0] is None else torch.cat([b.detach() for b in biases])


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


class NativeTarget(nn.Module):
    """``onnx_target.TargetWithTaps``' forward over prepared weights (see the module docstring)."""

    def __init__(self, model: nn.Module, layer_ids: list[int]):
        super().__init__()
        cfg = model.config
        inner = model.model
        self.h, self.kvh = cfg.num_attention_heads, cfg.num_key_value_heads
        self.d = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.eps = float(cfg.rms_norm_eps)
        self.layer_ids = list(layer_ids)
        self.n = len(inner.layers)
        self.has_bias = inner.layers[0].self_attn.q_proj.bias is not None
        self.has_qk_norm = getattr(inner.layers[0].self_attn, "q_norm", None) is not None
        for i, layer in enumerate(inner.layers):
            a, m = layer.self_attn, layer.mlp
            self.register_buffer(f"qkv{i}", _t(a.q_proj, a.k_proj, a.v_proj), persistent=False)
            if self.has_bias:
                self.register_buffer(f"qkv_bias{i}", _bias(a.q_proj, a.k_proj, a.v_proj), persistent=False)
            self.register_buffer(f"o{i}", _t(a.o_proj), persistent=False)
            if a.o_proj.bias is not None:
                self.register_buffer(f"o_bias{i}", a.o_proj.bias.detach(), persistent=False)
            self.register_buffer(f"gate_up{i}", _t(m.gate_proj, m.up_proj), persistent=False)
            self.register_buffer(f"down{i}", _t(m.down_proj), persistent=False)
            if m.gate_proj.bias is not None:  # Llama's mlp_bias
                self.register_buffer(f"gate_up_bias{i}", _bias(m.gate_proj, m.up_proj), persistent=False)
                self.register_buffer(f"down_bias{i}", m.down_proj.bias.detach(), persistent=False)
            self.register_buffer(f"ln1_{i}", layer.input_layernorm.weight.detach(), persistent=False)
            self.register_buffer(f"ln2_{i}", layer.post_attention_layernorm.weight.detach(), persistent=False)
            if self.has_qk_norm:  # q_norm on each q head, then k_norm on each k head: [h + kvh, 1, d]
                qk_norm = torch.cat(
                    [a.q_norm.weight.detach().expand(self.h, -1), a.k_norm.weight.detach().expand(self.kvh, -1)]
                )
                self.register_buffer(f"qk_norm{i}", qk_norm[:, None].contiguous(), persistent=False)
        self.register_buffer("embed", model.get_input_embeddings().weight.detach(), persistent=False)
        self.register_buffer("norm", inner.norm.weight.detach(), persistent=False)
        out = model.get_output_embeddings()
        self.register_buffer("head", _t(out), persistent=False)
        self.register_buffer("head_bias", None if out.bias is None else out.bias.detach(), persistent=False)
        rotary = inner.rotary_emb
        self.register_buffer("inv_freq", rotary.inv_freq.detach().float(), persistent=False)
        self.rope_scale = float(getattr(rotary, "attention_scaling", 1.0))

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), weight, self.eps)

    def forward(self, input_ids, attention_mask, position_ids, past_k, past_v):
        b, T = input_ids.shape
        S = past_k.shape[3]
        h, kvh, d = self.h, self.kvh, self.d
        x = F.embedding(input_ids, self.embed)
        freqs = position_ids[..., None].float() * self.inv_freq  # [b, T, d/2]
        emb = torch.cat([freqs, freqs], dim=-1)[:, None]  # [b, 1, T, d]
        cos, sin = (emb.cos() * self.rope_scale).to(x.dtype), (emb.sin() * self.rope_scale).to(x.dtype)
        col = torch.arange(S + T, device=x.device)
        causal = col[None, :] <= S + torch.arange(T, device=x.device)[:, None]  # [T, S+T]
        mask = (attention_mask.bool()[:, None, :] & causal[None])[:, None]  # [b, 1, T, S+T]
        taps = set(self.layer_ids)
        hidden, new_k, new_v = {}, [], []
        for i in range(self.n):
            buf = lambda name, i=i: getattr(self, f"{name}{i}")  # noqa: E731
            qkv = self._norm(x, buf("ln1_")) @ buf("qkv")
            if self.has_bias:
                qkv = qkv + buf("qkv_bias")
            qk, v = qkv.view(b, T, h + 2 * kvh, d).transpose(1, 2).split([h + kvh, kvh], dim=1)  # [b, heads, T, d]
            if self.has_qk_norm:
                qk = F.rms_norm(qk, (d,), None, self.eps) * buf("qk_norm")
            qk = qk * cos + _rotate_half(qk) * sin  # RoPE on q and k at once
            q, k = qk.split([h, kvh], dim=1)
            new_k.append(k)
            new_v.append(v)
            keys, vals = torch.cat([past_k[i], k], dim=2), torch.cat([past_v[i], v], dim=2)
            att = F.scaled_dot_product_attention(q, keys, vals, attn_mask=mask, scale=d**-0.5, enable_gqa=h != kvh)
            att = att.transpose(1, 2).reshape(b, T, h * d) @ buf("o")
            if hasattr(self, f"o_bias{i}"):
                att = att + buf("o_bias")
            x = x + att
            mlp_bias = hasattr(self, f"down_bias{i}")
            gu = self._norm(x, buf("ln2_")) @ buf("gate_up")
            g, u = (gu + buf("gate_up_bias") if mlp_bias else gu).chunk(2, dim=-1)
            down = (F.silu(g) * u) @ buf("down")
            x = x + (down + buf("down_bias") if mlp_bias else down)
            if i in taps:
                hidden[i] = x
        x = self._norm(x, self.norm)
        if self.n - 1 in taps:  # transformers' last hidden state is the normed one
            hidden[self.n - 1] = x
        logits = x @ self.head
        if self.head_bias is not None:
            logits = logits + self.head_bias
        target_hidden = torch.cat([hidden[i] for i in self.layer_ids], dim=-1)
        return logits, target_hidden, torch.stack(new_k), torch.stack(new_v)


def export_native_target_onnx(
    hf_model: nn.Module, layer_ids: list[int], out_dir, *, filename: str = NATIVE_TARGET_FILE
) -> Path:
    """Export :class:`NativeTarget` with ``target.onnx``'s I/O and dynamic axes; ``onnx.checker``-clean."""
    require("onnx", "onnx", "ONNX export")
    require("onnxscript", "onnx", "ONNX export")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    module = NativeTarget(hf_model, layer_ids).eval()
    inputs = target_example_inputs(hf_model)
    dyn = {name: {axis: Dim.DYNAMIC for axis in axes} for name, axes in DYNAMIC_AXES["target"].items()}
    return export_opset23(module, inputs, TARGET_INPUTS, TARGET_OUTPUTS, dyn, out / filename)
