"""A bundle's ``onnx/``: the drafter round, the target and the embedding, each checked against PyTorch.

The drafter graph is the one its architecture needs: ``export.export_drafter_onnx`` (logits out)
for a DFlash drafter, ``export_dflash2.export_dflash2_drafter_onnx`` (the candidate selector's
walk: tokens, q over the candidates, the candidates) for a DFlash2 one. The manifest's
``engine.drafter_graph`` says which, so the graph runtimes know the drafter's I/O. This module
sits above both exporters (``export_dflash2`` imports ``export``), so neither imports the other
back.
"""

from __future__ import annotations

from pathlib import Path

from dflash_trt.errors import DFlashError
from dflash_trt.export import onnx_dflash2 as export_dflash2
from dflash_trt.export.onnx_graphs import (
    DRAFTER_ONNX_ATOL,
    TARGET_ONNX_ATOL,
    check_drafter_onnx,
    check_target_onnx,
    export_drafter_onnx,
    export_embed_onnx,
    export_target_onnx,
    target_export_problem,
)

#: temperatures a DFlash2 drafter graph is checked at: the greedy walk and a sampled one
DFLASH2_CHECK_TEMPERATURES = (0.0, 0.8)


def export_drafter(drafter, head, onnx_dir: Path, page_size: int, say) -> tuple[str, dict[str, float]]:
    """``drafter.onnx`` for ``drafter`` through the target head ``head`` [V, H], checked;
    (the graph kind, "dflash" | "dflash2", its max errors). A graph that disagrees is one line."""
    if not drafter.cfg.is_dflash2:
        say("exporting the drafter to ONNX (dflash::KVInjection, dflash::BlockDiffusionAttention)")
        path = export_drafter_onnx(drafter, onnx_dir, head_weight=head, page_size=page_size)
        err = check_drafter_onnx(drafter, path, head_weight=head, page_size=page_size)
        if max(err.values()) > DRAFTER_ONNX_ATOL:
            raise DFlashError(f"exported drafter ONNX disagrees with PyTorch (max error {max(err.values()):.2e})")
        return "dflash", err
    say("exporting the DFlash2 drafter to ONNX (the DFlash round, then the candidate selector's walk)")
    path = export_dflash2.export_dflash2_drafter_onnx(drafter, onnx_dir, head_weight=head, page_size=page_size)
    err: dict[str, float] = {}
    for t in DFLASH2_CHECK_TEMPERATURES:
        got = export_dflash2.check_dflash2_drafter_onnx(drafter, path, head_weight=head, temperature=t,
                                                        page_size=page_size)
        differing = got.pop("tokens_differing") + got.pop("candidates_differing")
        if differing:
            raise DFlashError(f"exported DFlash2 drafter ONNX proposes other tokens than PyTorch at temperature {t} "
                              f"({differing} tokens / candidates differ)")
        worst = max(got.values())
        if worst > DRAFTER_ONNX_ATOL:
            raise DFlashError(f"exported DFlash2 drafter ONNX disagrees with PyTorch at temperature {t} "
                              f"(max error {worst:.2e})")
        for k, v in got.items():
            err[k] = max(err.get(k, 0.0), v)
    return "dflash2", err


def export_graphs(drafter, hf_model, onnx_dir, profile, say=lambda msg: None) -> dict:
    """``onnx/``: the drafter round (through the target's head), the target and the embedding,
    each checked against PyTorch. Returns the manifest's ``engine`` section (without the engine
    build's outcome). A graph that disagrees is one DFlashError line."""
    problem = target_export_problem(hf_model.config)
    if problem:  # before the (slow) drafter export
        raise DFlashError(f"target {getattr(hf_model.config, 'model_type', '?')} does not export to target.onnx: "
                          f"{problem}; build it with --engine trtllm")
    onnx_dir = Path(onnx_dir)
    head = hf_model.get_output_embeddings().weight.detach()
    kind, d_err = export_drafter(drafter, head, onnx_dir, profile.page_size, say)
    say("exporting the target to ONNX (target_hidden + KV cache I/O)")
    t_path = export_target_onnx(hf_model, drafter.cfg.target_layer_ids, onnx_dir)
    t_err = check_target_onnx(hf_model, drafter.cfg.target_layer_ids, t_path, batch=3, past=9, T=4)
    if max(t_err.values()) > TARGET_ONNX_ATOL:
        raise DFlashError(f"exported target ONNX disagrees with PyTorch (max error {max(t_err.values()):.2e})")
    export_embed_onnx(hf_model.get_input_embeddings().weight, drafter.cfg.input_embedding_scale, onnx_dir)
    return {"onnx": sorted(p.name for p in onnx_dir.glob("*.onnx")), "drafter_graph": kind,
            "drafter_onnx_max_error": d_err, "target_onnx_max_error": t_err, "profile": profile.model_dump()}
