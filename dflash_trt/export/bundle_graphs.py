"""A bundle's ``onnx/``: the drafter round, the target and the embedding, each checked against PyTorch.

Beside the TensorRT forms, ONNX Runtime's own: ``drafter_ort.onnx`` (``onnx_native``) and, for a
plain decoder target a CPU runs, ``target_ort.onnx`` (``onnx_native_target``).

The drafter graph is the one its family's export round writes (``rounds.round_for``: logits out
for a DFlash drafter, the candidate selector's walk for a DFlash2 one). The manifest's
``graphs.drafter_graph`` records the round's graph kind, so the graph runtimes know the
drafter's I/O.
"""

from __future__ import annotations

from pathlib import Path

from dflash_trt.errors import DFlashError
from dflash_trt.export.graph_io import TARGET_ONNX_ATOL
from dflash_trt.export.onnx_native_target import export_native_target_onnx, native_target_problem
from dflash_trt.export.onnx_target import (
    check_target_onnx,
    export_embed_onnx,
    export_target_onnx,
    target_export_problem,
)
from dflash_trt.export.rounds import round_for
from dflash_trt.model import family_of


def export_drafter(drafter, head, onnx_dir: Path, page_size: int, say) -> tuple[str, dict[str, float]]:
    """``drafter.onnx`` for ``drafter`` through the target head ``head`` [V, H], written and checked by
    its family's export round; (the graph kind, its max errors). A graph that disagrees is one line."""
    rnd = round_for(family_of(drafter.cfg))
    return rnd.graph, rnd.export(drafter, head, Path(onnx_dir), page_size, say)


def export_graphs(drafter, hf_model, onnx_dir, profile, say=lambda msg: None) -> dict:
    """``onnx/``: the drafter round (through the target's head), the target and the embedding,
    each checked against PyTorch. Returns the manifest's ``graphs`` section (without the engine
    build's outcome). A graph that disagrees is one DFlashError line."""
    problem = target_export_problem(hf_model.config)
    if problem:  # before the (slow) drafter export
        raise DFlashError(
            f"target {getattr(hf_model.config, 'model_type', '?')} does not export to target.onnx: "
            f"{problem}; build it without --graphs"
        )
    onnx_dir = Path(onnx_dir)
    head = hf_model.get_output_embeddings().weight.detach()
    kind, d_err = export_drafter(drafter, head, onnx_dir, profile.page_size, say)
    say("exporting the target to ONNX (target_hidden + KV cache I/O)")
    t_path = export_target_onnx(hf_model, drafter.cfg.target_layer_ids, onnx_dir)
    t_err = check_target_onnx(hf_model, drafter.cfg.target_layer_ids, t_path, batch=3, past=9, T=4)
    if max(t_err.values()) > TARGET_ONNX_ATOL:
        raise DFlashError(f"exported target ONNX disagrees with PyTorch (max error {max(t_err.values()):.2e})")
    why_not = native_target_problem(hf_model)
    if why_not is None:
        say("exporting the target's ONNX Runtime form (opset-23 fused nodes)")
        n_path = export_native_target_onnx(hf_model, drafter.cfg.target_layer_ids, onnx_dir)
        n_err = check_target_onnx(hf_model, drafter.cfg.target_layer_ids, n_path, batch=3, past=9, T=4)
        if max(n_err.values()) > TARGET_ONNX_ATOL:
            raise DFlashError(
                f"exported target ONNX Runtime form disagrees with PyTorch (max error {max(n_err.values()):.2e})"
            )
        t_err = {**t_err, **{f"ort_{k}": v for k, v in n_err.items()}}
    else:
        say(f"no target_ort.onnx (the ONNX Runtime backend runs target.onnx): the target is {why_not}")
    export_embed_onnx(hf_model.get_input_embeddings().weight, drafter.cfg.input_embedding_scale, onnx_dir)
    return {
        "onnx": sorted(p.name for p in onnx_dir.glob("*.onnx")),
        "drafter_graph": kind,
        "drafter_onnx_max_error": d_err,
        "target_onnx_max_error": t_err,
        "profile": profile.model_dump(),
    }
