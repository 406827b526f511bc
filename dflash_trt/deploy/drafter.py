"""The bundle's drafter: z-lab form, as TensorRT-LLM's DFlash loader reads it.

From any supported drafter format (``ingest.load_drafter``) to ``OUT/drafter``:

* **BF16.** TensorRT-LLM serves DFlash drafters in fp16/bf16 only; an fp32 (or fp16) source
  is cast to BF16 and the cast is noted in the manifest.
* **Ascending target layers.** ``DFlashSpecMetadata.__post_init__``
  (``tensorrt_llm/_torch/speculative/dflash.py``) SORTS ``layers_to_capture`` and lays the
  captured hidden states out in that order, so ``fc``'s input columns must come in ascending
  layer order. An unsorted drafter gets its ``target_layer_ids`` sorted and the column
  blocks of ``fc.weight`` [H, n_tap*H] permuted to match: ``fc`` sees the same features in
  the same places, so the drafts are unchanged.
* **block_size at the top level and in dflash_config.** The generic
  ``DFlashForCausalLM.__init__`` (``tensorrt_llm/_torch/models/modeling_dflash.py``) reads
  ``block_size`` from the config's top level only; newer drafters keep it in ``dflash_config``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from dflash_trt import ingest
from dflash_trt.model import drafter_for

if TYPE_CHECKING:  # torch loads when a build writes weights, not when `plan` or `--dry-run` imports deploy
    from dflash_trt.model import Drafter


def sort_target_layers(drafter: Drafter) -> Drafter:
    """The same drafter with ascending ``target_layer_ids`` and ``fc``'s column blocks permuted
    to match (itself when already ascending). fc.weight: [H, n_tap*H], block j = tap j."""
    import torch  # start-up: torch

    ids = list(drafter.cfg.target_layer_ids)
    order = sorted(range(len(ids)), key=lambda j: ids[j])
    if order == list(range(len(ids))):
        return drafter
    H = drafter.cfg.hidden_size
    state = {k: v.detach().clone() for k, v in drafter.state_dict().items()}
    w = state["fc.weight"]
    state["fc.weight"] = torch.cat([w[:, j * H : (j + 1) * H] for j in order], dim=1)
    cfg = drafter.cfg.model_copy(update={"target_layer_ids": [ids[j] for j in order]})
    out = drafter_for(cfg)(cfg).to(drafter.dtype)  # cast first: loading into fp32 parameters would round fp64 weights
    out.load_state_dict(state)
    out.kernels = drafter.kernels
    return out.eval()


def write_bundle_drafter(src: ingest.DrafterSpec, out: Path) -> dict:
    """Write ``src`` (any supported format, as ingest read it) as the bundle's BF16 z-lab drafter at
    ``out``; returns the manifest's ``drafter`` section (what was changed, and why)."""
    import torch  # start-up: torch

    stored = src.dtype  # the weights' dtype on disk
    drafter = ingest.load_drafter(src, dtype=torch.bfloat16)
    source_ids = list(drafter.cfg.target_layer_ids)
    notes = []
    if stored != "bfloat16":
        notes.append(f"cast from {stored} to bfloat16 (TensorRT-LLM serves DFlash drafters in fp16/bf16)")
    drafter = sort_target_layers(drafter)
    if drafter.cfg.target_layer_ids != source_ids:
        notes.append(
            f"target_layer_ids {source_ids} sorted to {drafter.cfg.target_layer_ids}, fc columns permuted "
            "to match (TensorRT-LLM captures the layers in ascending order)"
        )
    drafter.cfg = drafter.cfg.model_copy(update={"dtype": "bfloat16"})
    drafter.save(out)
    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["block_size"] = drafter.cfg.block_size
    cfg["dflash_config"]["block_size"] = drafter.cfg.block_size
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")
    return {
        "dtype": "bfloat16",
        "source_dtype": stored,
        "target_layer_ids": list(drafter.cfg.target_layer_ids),
        "source_target_layer_ids": source_ids,
        "block_size": drafter.cfg.block_size,
        "notes": notes,
    }
