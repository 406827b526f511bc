"""ONNX export of one DFlash2 drafter round: the DFlash round, then the candidate selector's walk.

The graph (``drafter.onnx`` for a DFlash2 drafter) is ``export.DrafterRound`` (KV injection with
``dflash::KVInjection``, the block forward with ``dflash::BlockDiffusionAttention``; DFlash2's
convolutions come in through ``DFlash2Drafter.block_forward`` as standard Pad/Mul/Add nodes), the
target's LM head, ``output_multiplier`` / softcapping, ``TopK``, and the selector's walk over the
B-1 draft positions in standard ops (``plugins.selector.walk_graph``: every transition scored at
once, then a pair of gathers per position). One graph serves
greedy and sampled drafting: ``temperature`` 0 takes the argmax, above 0 the walk draws each
position by inverse CDF of the given ``uniforms``::

    inputs : export.DRAFTER_INPUTS, then anchor [b] int64 (block position 0, the walk's first
             predecessor), uniforms [b, B-1] float32 in [0, 1), temperature [1] float32
    outputs: tokens [b, B-1] int64, q [b, B-1, k] float32 (the walk's distribution over each
             position's candidates: the proposal rejection sampling uses), candidates [b, B-1, k]
             int64, k_cache_out, v_cache_out
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.export import Dim

from dflash_trt import plugins
from dflash_trt.errors import DFlashError, require
from dflash_trt.export.onnx_graphs import DRAFTER_INPUTS, DrafterRound, example_round, run_drafter_onnx
from dflash_trt.plugins import onnx_ops

DFLASH2_INPUTS = DRAFTER_INPUTS + ["anchor", "uniforms", "temperature"]
DFLASH2_OUTPUTS = ["tokens", "q", "candidates", "k_cache_out", "v_cache_out"]
#: the dynamic axes of the inputs DFlash2 adds, named as ``export.DYNAMIC_AXES`` names the others
#: (the TensorRT profile reads both; ``temperature`` [1] is static)
DFLASH2_DYNAMIC_AXES = {"anchor": {0: "batch"}, "uniforms": {0: "batch"}}


class DFlash2Round(nn.Module):
    """``DrafterRound`` (hidden states out) + the head + the selector's walk, traceable."""

    def __init__(self, drafter, head_weight: torch.Tensor, kernels: str = "reference"):
        super().__init__()
        if not hasattr(drafter, "candidate_selector"):
            raise DFlashError("DFlash2Round needs a DFlash2 drafter; export others with export.export_drafter_onnx")
        self.drafter = drafter
        self.round = DrafterRound(drafter, kernels=kernels)
        self.head = nn.Linear(head_weight.shape[1], head_weight.shape[0], bias=False)
        self.head.weight = nn.Parameter(head_weight.detach().clone(), requires_grad=False)

    def forward(
        self, target_hidden, n_new, block_embeds, k_cache, v_cache, page_table, lengths, anchor, uniforms, temperature
    ):
        hidden, k_cache, v_cache = self.round(target_hidden, n_new, block_embeds, k_cache, v_cache, page_table, lengths)
        return (*walk_block(self.drafter, self.head, hidden, anchor, uniforms, temperature), k_cache, v_cache)


def walk_block(drafter, head: nn.Module, hidden, anchor, uniforms, temperature):
    """A DFlash2 round's tail in traceable ops, shared by both drafter graphs (this module's and
    ``onnx_native``'s): the head over block positions 1..B-1 of ``hidden`` [b, B, H], their top-k,
    and the selector's walk. (tokens [b, B-1], q [b, B-1, k], candidates [b, B-1, k])."""
    h = hidden[:, 1:]  # [b, B-1, H]
    sel = drafter.candidate_selector
    unary, cand = sel.candidates(drafter.logits(h, head))  # [b, B-1, k]
    tokens, q = plugins.selector_walk_graph(
        unary,
        cand,
        sel.hidden_projection(h),
        sel.predecessor_codebook,
        sel.successor_codebook,
        anchor,
        temperature,
        uniforms,
    )
    return tokens, q, cand


def selector_inputs(drafter, batch: int, seed: int, temperature: float) -> dict:
    """The inputs a DFlash2 round adds (seeded): an anchor [b], uniforms [b, B-1], a temperature [1]."""
    g = torch.Generator().manual_seed(seed + 1000)
    cfg = drafter.cfg
    return {
        "anchor": torch.randint(cfg.vocab_size, (batch,), generator=g),
        "uniforms": torch.rand(batch, cfg.block_size - 1, generator=g),
        "temperature": torch.tensor([float(temperature)]),
    }


def reference_proposal(drafter, head_weight: torch.Tensor, inputs: dict, cache, temperature: float):
    """PyTorch's proposal for one round's ``inputs`` (``inject`` advances ``cache``, then ``draft``,
    the head, the selector's ``walk`` on the same uniforms): (tokens, q or None at 0, candidates)."""
    head = nn.Linear(head_weight.shape[1], head_weight.shape[0], bias=False)
    head.weight = nn.Parameter(head_weight)
    with torch.no_grad():
        drafter.inject(inputs["target_hidden"], inputs["n_new"], cache)
        h = drafter.draft(inputs["block_embeds"], cache)[:, 1:]
        sel = drafter.candidate_selector
        unary, cand = sel.candidates(drafter.logits(h, head))
        tokens, q = sel.walk(h, unary, cand, inputs["anchor"], temperature, inputs["uniforms"])
    return tokens, q, cand


def proposal_errors(tokens, q, cand, want) -> dict:
    """A graph's proposal (numpy) against :func:`reference_proposal`'s ``want``: how many tokens and
    candidates differ (as sets per position), and q's max abs error where the walk sampled."""
    want_tokens, want_q, want_cand = want
    out = {
        "tokens_differing": int((tokens != want_tokens.numpy()).sum()),
        "candidates_differing": int((np.sort(cand, -1) != np.sort(want_cand.numpy(), -1)).sum()),
    }
    if want_q is not None:
        out["q"] = float(np.abs(q - want_q.numpy()).max())
    return out


def example_inputs(
    drafter, batch: int = 2, T: int = 5, page_size: int = 4, seed: int = 0, temperature: float = 0.0
) -> tuple[dict, object]:
    """``export.example_round``'s inputs plus an anchor, uniforms and a temperature."""
    inputs, cache = example_round(drafter, batch=batch, T=T, page_size=page_size, seed=seed)
    inputs.update(selector_inputs(drafter, batch, seed, temperature))
    return inputs, cache


def export_dflash2_drafter_onnx(
    drafter, out_dir, *, head_weight: torch.Tensor, page_size: int = 4, filename: str = "drafter.onnx"
) -> Path:
    """Export one DFlash2 round (see the module doc), checked with ``onnx.checker``; the .onnx path."""
    onnx = require("onnx", "onnx", "ONNX export")
    require("onnxscript", "onnx", "ONNX export")
    cfg = drafter.cfg
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    module = DFlash2Round(drafter, head_weight).eval()
    inputs, _ = example_inputs(drafter, page_size=page_size)
    table = onnx_ops.translation_table(
        num_layers=cfg.num_hidden_layers,
        num_heads=cfg.num_attention_heads,
        num_kv_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim,
        block_size=cfg.block_size,
        page_size=page_size,
        rope_theta=cfg.rope_theta,
    )
    b, T, P, M = Dim("batch"), Dim("new_tokens"), Dim("pages"), Dim("max_pages")
    dyn = {
        "target_hidden": {0: b, 1: T},
        "n_new": {0: b},
        "block_embeds": {0: b},
        "k_cache": {1: P},
        "v_cache": {1: P},
        "page_table": {0: b, 1: M},
        "lengths": {0: b},
        "anchor": {0: b},
        "uniforms": {0: b},
        "temperature": None,
    }
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        prog = torch.onnx.export(
            module,
            tuple(inputs[n] for n in DFLASH2_INPUTS),
            dynamo=True,
            dynamic_shapes=dyn,
            custom_translation_table=table,
            input_names=DFLASH2_INPUTS,
            output_names=DFLASH2_OUTPUTS,
            optimize=True,
            verbose=False,
        )
    model = prog.model_proto
    onnx_ops.register_onnx_schemas()
    onnx.checker.check_model(model, full_check=True)
    path = out / filename
    onnx.save(model, str(path))
    return path


def check_dflash2_drafter_onnx(
    drafter,
    onnx_path,
    *,
    head_weight: torch.Tensor,
    temperature: float = 0.0,
    page_size: int = 4,
    batch: int = 3,
    T: int = 4,
    seed: int = 1,
) -> dict:
    """onnxruntime vs PyTorch (``inject`` + ``draft`` + ``logits`` + the selector's ``walk``) on
    fresh inputs whose batch / T / cache sizes differ from the export's. Returns the max abs
    errors of q and the caches, and how many tokens / candidates differ."""
    inputs, cache = example_inputs(drafter, batch=batch, T=T, page_size=page_size, seed=seed, temperature=temperature)
    tokens, q, cand, k_out, v_out = run_drafter_onnx(onnx_path, inputs)
    want = reference_proposal(drafter, head_weight, inputs, cache, temperature)
    return {
        "k_cache": float(np.abs(k_out - cache.k.numpy()).max()),
        "v_cache": float(np.abs(v_out - cache.v.numpy()).max()),
        **proposal_errors(tokens, q, cand, want),
    }
