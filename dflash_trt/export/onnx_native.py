"""The drafter round in standard ONNX ops only: the form ONNX Runtime runs natively.

``drafter.onnx`` carries the two ``dflash::`` custom ops (the TensorRT form: plugins write the
paged cache in place). ONNX Runtime can only run those as Python custom ops, which copy the
page pool every round; ``drafter_ort.onnx`` is the same round over a *dense per-row* context
cache in standard ops (opset 23: each layer's block attention is one ``Attention`` node with a
boolean mask and grouped-query heads; the injection is MatMul / RMSNorm / RoPE arithmetic), so no
Python runs inside a round:

    inputs : target_hidden [b, T, n_tap*H], n_new [b] int64, block_embeds [b, B, H],
             k_ctx, v_ctx [L, b, kvh, S, d] (row i's column j holds position j; valid where
             j < lengths[i]; S is the runtime's capacity, columns past a row's length are ignored),
             lengths [b] int64 (committed context length before this round)
    outputs: logits [b, B, V], k_new, v_new [L, b, kvh, T, d] (this round's context K/V: k_norm and
             RoPE at position lengths[i] + t; columns t >= n_new[i] are padding the runtime drops)

Layer l's block attention sees, for query t of row i at position p = lengths[i] + n_new[i] + t,
the keys ``cat(k_ctx[l], k_new[l], k_block)`` under one boolean mask: context column j where
j < lengths[i], new column t' where t' < n_new[i], every block key (block keys t' <= t only on a
causal layer), and on a windowed layer only keys at |p - position| < window. The graph returns
the new K/V instead of an updated cache, so it never copies the cache out: the runtime writes
the ``n_new`` valid columns into its buffer (``runtime.graph_backend.DenseKVCache``) in place.
Same semantics as ``plugins.kv_injection`` + ``plugins.block_attention`` (the check holds it to
``DRAFTER_ONNX_ATOL``).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.export import Dim

from dflash_trt import plugins
from dflash_trt.errors import require
from dflash_trt.export import onnx_dflash2
from dflash_trt.export.onnx_graphs import example_round

NATIVE_FILE = "drafter_ort.onnx"
#: opset 23: block attention is one standard ``Attention`` node (GQA, boolean mask); its CPU kernel
#: is in ONNX Runtime >= 1.23 (microsoft/onnxruntime#25156)
OPSET = 23
NATIVE_INPUTS = ["target_hidden", "n_new", "block_embeds", "k_ctx", "v_ctx", "lengths"]
NATIVE_OUTPUTS = ["logits", "k_new", "v_new"]
NATIVE_AXES = {
    "target_hidden": {0: "batch", 1: "tokens"},
    "n_new": {0: "batch"},
    "block_embeds": {0: "batch"},
    "k_ctx": {1: "batch", 3: "seq"},
    "v_ctx": {1: "batch", 3: "seq"},
    "lengths": {0: "batch"},
}
#: a DFlash2 drafter's form: the same round, then the candidate selector's walk (``onnx_dflash2``'s
#: extra inputs and outputs: anchor [b], uniforms [b, B-1], temperature [1] in; tokens, q and the
#: candidates out, before this round's K/V)
DFLASH2_NATIVE_INPUTS = NATIVE_INPUTS + ["anchor", "uniforms", "temperature"]
DFLASH2_NATIVE_OUTPUTS = ["tokens", "q", "candidates", "k_new", "v_new"]
DFLASH2_NATIVE_AXES = {**NATIVE_AXES, "anchor": {0: "batch"}, "uniforms": {0: "batch"}, "temperature": {}}


def key_mask(lengths, n_new, S: int, T: int, B: int, causal: bool, window: int | None) -> torch.Tensor:
    """Boolean [b, 1, B, S+T+B]: which of (context, new, block) keys each block query sees."""
    dev, b = lengths.device, lengths.shape[0]
    j, t, tb = (torch.arange(n, device=dev) for n in (S, T, B))
    ctx_len = lengths + n_new  # [b]
    k_pos = torch.cat([j[None].expand(b, -1), lengths[:, None] + t, ctx_len[:, None] + tb], 1)
    valid = torch.cat(
        [j[None] < lengths[:, None], t[None] < n_new[:, None], torch.ones(b, B, dtype=torch.bool, device=dev)], 1
    )  # [b, S+T+B]
    vis = valid[:, None, :].expand(-1, B, -1)  # [b, B, K]
    if causal:
        block_ok = torch.cat([torch.ones(B, S + T, dtype=torch.bool, device=dev), tb[None, :] <= tb[:, None]], 1)
        vis = vis & block_ok[None]
    if window is not None:
        q_pos = ctx_len[:, None] + tb  # [b, B]
        vis = vis & ((q_pos[:, :, None] - k_pos[:, None, :]).abs() < window)
    return vis[:, None]


def masked_attention(q, keys, vals, mask, scale: float) -> torch.Tensor:
    """q [b, B, h, d]; keys, vals [b, kvh, K, d]; mask [b, 1, B, K] -> [b, B, h, d]. Exported as
    one opset-23 ``Attention`` node (grouped-query: query head h reads kv head h // (h / kvh))."""
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), keys, vals, attn_mask=mask, scale=scale, enable_gqa=q.shape[2] != keys.shape[1]
    )
    return out.transpose(1, 2)


class NativeRound(nn.Module):
    """One drafter round (injection + block forward + the target's head) over a dense cache."""

    def __init__(self, drafter, head_weight: torch.Tensor):
        super().__init__()
        self.drafter = drafter
        wkv, bkv, k_norm = plugins.fused_kv_weights(drafter)
        self.register_buffer("kv_weight", wkv.detach().clone(), persistent=False)
        self.register_buffer("kv_bias", None if bkv is None else bkv.detach().clone(), persistent=False)
        self.register_buffer("k_norm_weight", k_norm.detach().clone(), persistent=False)
        self.head = nn.Linear(head_weight.shape[1], head_weight.shape[0], bias=False)
        self.head.weight = nn.Parameter(head_weight.detach().clone(), requires_grad=False)

    def new_kv(self, target_hidden, lengths):
        """This round's context K/V [L, b, kvh, T, d] each (k_norm, then RoPE at lengths + t)."""
        d, cfg = self.drafter, self.drafter.cfg
        b, T, _ = target_hidden.shape
        L, kvh, hd = cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim
        kv = plugins.fused_kv(
            target_hidden, d.fc.weight, d.hidden_norm.weight, self.kv_weight, self.kv_bias, cfg.rms_norm_eps
        )
        kv = kv.view(b, T, L, 2, kvh, hd).permute(2, 3, 0, 4, 1, 5)  # [L, 2, b, kvh, T, d]
        k = plugins.rms_norm(kv[:, 0], self.k_norm_weight[:, None, None, None, :], cfg.rms_norm_eps)
        cos, sin = d.rope(lengths[:, None] + torch.arange(T, device=lengths.device), k.dtype)  # [b, T, d]
        k = k * cos[None, :, None] + plugins.rotate_half(k) * sin[None, :, None]
        return k, kv[:, 1]

    def forward(self, target_hidden, n_new, block_embeds, k_ctx, v_ctx, lengths):
        hidden, k_new, v_new = self.hidden(target_hidden, n_new, block_embeds, k_ctx, v_ctx, lengths)
        return self.drafter.logits(hidden, self.head), k_new, v_new

    def hidden(self, target_hidden, n_new, block_embeds, k_ctx, v_ctx, lengths):
        """The block's normed hidden states [b, B, H] and this round's context K/V."""
        d, cfg = self.drafter, self.drafter.cfg
        k_new, v_new = self.new_kv(target_hidden, lengths)
        S, T, B = k_ctx.shape[3], target_hidden.shape[1], block_embeds.shape[1]
        masks = {}

        def attend(i, q, k, v):
            key = (cfg.layer_causal(i), cfg.layer_window(i))
            if key not in masks:
                masks[key] = key_mask(lengths, n_new, S, T, B, *key)
            keys = torch.cat([k_ctx[i], k_new[i], k.transpose(1, 2)], dim=2)  # [b, kvh, S+T+B, d]
            vals = torch.cat([v_ctx[i], v_new[i], v.transpose(1, 2)], dim=2)
            return masked_attention(q, keys, vals, masks[key], cfg.head_dim**-0.5)

        positions = (lengths + n_new)[:, None] + torch.arange(B, device=block_embeds.device)
        return d.block_forward(block_embeds, positions, attend), k_new, v_new


class NativeDFlash2Round(NativeRound):
    """A DFlash2 round over a dense cache: :class:`NativeRound`'s hidden states, the head, then the
    candidate selector's walk in standard ops (``onnx_dflash2.DFlash2Round``'s tail)."""

    def forward(self, target_hidden, n_new, block_embeds, k_ctx, v_ctx, lengths, anchor, uniforms, temperature):
        hidden, k_new, v_new = self.hidden(target_hidden, n_new, block_embeds, k_ctx, v_ctx, lengths)
        return (*onnx_dflash2.walk_block(self.drafter, self.head, hidden, anchor, uniforms, temperature), k_new, v_new)


def is_dflash2(drafter) -> bool:
    """Whether ``drafter`` walks a candidate selector (its native form is :class:`NativeDFlash2Round`)."""
    return hasattr(drafter, "candidate_selector")


def dense_from_paged(cache, capacity: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """A ``PagedKVCache``'s context as the dense [L, b, kvh, S, d] the native graph reads."""
    L = cache.k.shape[0]
    ks, vs = zip(*(cache.gather(i) for i in range(L)), strict=True)  # [b, len, kvh, d] each
    k, v = (torch.stack(x).transpose(2, 3) for x in (ks, vs))  # [L, b, kvh, len, d]
    pad = (capacity or k.shape[3]) - k.shape[3]
    if pad > 0:
        k, v = (torch.cat([x, x.new_zeros(*x.shape[:3], pad, x.shape[4])], 3) for x in (k, v))
    return k.contiguous(), v.contiguous()


def native_example(
    drafter, batch: int = 2, T: int = 5, seed: int = 0, prior: int = 7, slack: int = 3, temperature: float = 0.0
):
    """(inputs, paged cache holding the same context) for one round; the dense cache has ``slack``
    zero columns past the longest row, as the runtime's capacity leaves them. A DFlash2 drafter's
    inputs add an anchor, uniforms and ``temperature``."""
    paged, cache = example_round(drafter, batch=batch, T=T, seed=seed, prior=prior)
    k, v = dense_from_paged(cache, int(cache.lengths.max()) + slack)
    inputs = {
        "target_hidden": paged["target_hidden"],
        "n_new": paged["n_new"],
        "block_embeds": paged["block_embeds"],
        "k_ctx": k,
        "v_ctx": v,
        "lengths": paged["lengths"],
    }
    if is_dflash2(drafter):
        inputs.update(onnx_dflash2.selector_inputs(drafter, batch, seed, temperature))
    return inputs, cache


def export_native_drafter_onnx(drafter, out_dir, head_weight: torch.Tensor, *, filename: str = NATIVE_FILE) -> Path:
    """Export :class:`NativeRound` (:class:`NativeDFlash2Round` for a DFlash2 drafter) with dynamic
    batch / tokens / capacity; ``onnx.checker``-clean."""
    require("onnx", "onnx", "ONNX export")
    require("onnxscript", "onnx", "ONNX export")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    two = is_dflash2(drafter)
    module = (NativeDFlash2Round if two else NativeRound)(drafter, head_weight).eval()
    names, outputs, axes = (
        (DFLASH2_NATIVE_INPUTS, DFLASH2_NATIVE_OUTPUTS, DFLASH2_NATIVE_AXES)
        if two
        else (NATIVE_INPUTS, NATIVE_OUTPUTS, NATIVE_AXES)
    )
    inputs, _ = native_example(drafter, batch=3)  # sizes unlike L, kvh (no accidental specialisation)
    dims = {n: Dim(n) for n in ("batch", "tokens", "seq")}
    dyn = {name: ({axis: dims[dim] for axis, dim in ax.items()} or None) for name, ax in axes.items()}
    return export_opset23(module, inputs, names, outputs, dyn, out / filename)


def export_opset23(
    module: nn.Module, inputs: dict, names: list[str], outputs: list[str], dyn: dict, path: Path
) -> Path:
    """``module`` on ``inputs[n] for n in names`` through the dynamo exporter at :data:`OPSET`
    (optimized), checked with ``onnx.checker`` (full) and saved at ``path``: ONNX Runtime's forms."""
    onnx = require("onnx", "onnx", "ONNX export")
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        prog = torch.onnx.export(
            module,
            tuple(inputs[n] for n in names),
            dynamo=True,
            dynamic_shapes=dyn,
            input_names=names,
            output_names=outputs,
            optimize=True,
            opset_version=OPSET,
            verbose=False,
        )
    onnx.checker.check_model(prog.model_proto, full_check=True)
    onnx.save(prog.model_proto, str(path))
    return path


def check_native_drafter_onnx(
    drafter, onnx_path, head_weight: torch.Tensor, *, batch: int = 3, T: int = 4, seed: int = 1
) -> dict[str, float]:
    """onnxruntime (no custom ops) vs ``Drafter.inject`` + ``draft`` + ``logits`` on fresh shapes;
    max abs error of the logits and of the new K/V's valid columns against the paged cache."""
    import onnxruntime as ort  # optional: onnx

    inputs, cache = native_example(drafter, batch=batch, T=T, seed=seed)
    sess = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    logits, k_new, v_new = sess.run(NATIVE_OUTPUTS, {k: v.numpy() for k, v in inputs.items()})
    before = cache.lengths.clone()
    n_new = inputs["n_new"]
    with torch.no_grad():
        drafter.inject(inputs["target_hidden"], n_new, cache)  # advances cache.lengths
        head = nn.Linear(head_weight.shape[1], head_weight.shape[0], bias=False)
        head.weight = nn.Parameter(head_weight)
        want = drafter.logits(drafter.draft(inputs["block_embeds"], cache), head)
    return {"logits": float(np.abs(logits - want.numpy()).max()), **new_kv_errors(k_new, v_new, cache, before, n_new)}


def new_kv_errors(k_new, v_new, cache, before: torch.Tensor, n_new: torch.Tensor) -> dict[str, float]:
    """A native graph's new K/V [L, b, kvh, T, d] (numpy) against the columns ``inject`` wrote into
    the paged ``cache`` after each row's ``before`` committed ones: max abs error of each, over the
    first n_new[i] columns of row i (the rest are padding the runtime drops)."""
    k_all, v_all = dense_from_paged(cache)  # [L, b, kvh, len, d]
    err = {"k_new": 0.0, "v_new": 0.0}
    for i in range(len(n_new)):
        cols = slice(int(before[i]), int(before[i] + n_new[i]))
        for name, got, ref in (("k_new", k_new, k_all), ("v_new", v_new, v_all)):
            diff = np.abs(got[:, i, :, : int(n_new[i])] - ref[:, i, :, cols].numpy()).max()
            err[name] = max(err[name], float(diff))
    return err


def check_native_dflash2_onnx(
    drafter,
    onnx_path,
    head_weight: torch.Tensor,
    *,
    temperature: float = 0.0,
    batch: int = 3,
    T: int = 4,
    seed: int = 1,
) -> dict[str, float]:
    """:func:`check_native_drafter_onnx` for the DFlash2 form: onnxruntime against
    ``onnx_dflash2.reference_proposal`` on the same uniforms. The max abs errors of q and the new
    K/V, and how many tokens / candidates differ (which must be none)."""
    import onnxruntime as ort  # optional: onnx

    inputs, cache = native_example(drafter, batch=batch, T=T, seed=seed, temperature=temperature)
    sess = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    tokens, q, cand, k_new, v_new = sess.run(DFLASH2_NATIVE_OUTPUTS, {k: v.numpy() for k, v in inputs.items()})
    before = cache.lengths.clone()
    want = onnx_dflash2.reference_proposal(drafter, head_weight, inputs, cache, temperature)
    return {
        **new_kv_errors(k_new, v_new, cache, before, inputs["n_new"]),
        **onnx_dflash2.proposal_errors(tokens, q, cand, want),
    }
