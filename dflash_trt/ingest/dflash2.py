"""DFlash2 drafters in their published form: what marks one, its config checks, its tensors.

A DFlash2 drafter (z-lab/Qwen3.8-27B-DFlash2, z-lab/Muse-Glimmer-30B-DFlash2; z-lab's ``dflash``
package, ``dflash/model.py``) is a z-lab drafter (``formats._zlab`` normalises it) with four
more ``dflash_config`` sizes and the tensors of its convolutions and candidate selector.
"""

from __future__ import annotations

from pathlib import Path

from dflash_trt.errors import CheckpointError
from dflash_trt.ingest.resolve import positive_int
from dflash_trt.model import DFLASH2_FIELDS

#: The codebooks as published (no ``.weight``): the names ``DFlash2Drafter`` holds them under.
CODEBOOKS = ("candidate_selector.predecessor_codebook", "candidate_selector.successor_codebook")
#: Name prefixes a DFlash checkpoint's tensors may carry (``formats.STRIPPABLE_PREFIXES``, or none).
PREFIXES = ("", "dflash_module.", "model.", "draft_model.")


def _dflash_config(cfg: dict) -> dict:
    d = cfg.get("dflash_config")
    return d if isinstance(d, dict) else {}


def is_dflash2(cfg: dict, names: list[str]) -> bool:
    """DFlash2 markers: the architecture, its dflash_config sizes, or its tensors."""
    archs = [str(a) for a in cfg.get("architectures") or []]
    return ("DFlash2DraftModel" in archs or any(k in _dflash_config(cfg) for k in DFLASH2_FIELDS)
            or any(n.startswith(p + "candidate_selector.") or ".attention_conv." in n for n in names for p in PREFIXES))


def check_config(cfg: dict, where: Path) -> None:
    """The four DFlash2 sizes, present and consistent (one line each, before any tensor is read)."""
    d = _dflash_config(cfg)
    missing = [k for k in DFLASH2_FIELDS if d.get(k) is None]
    if missing:
        raise CheckpointError(f"{where}: DFlash2 drafter config lacks dflash_config.{', '.join(missing)}; "
                              "the convolutions and the candidate selector cannot be built without them")
    for key in DFLASH2_FIELDS:
        positive_int(d, key, f"{where} (dflash_config)")
    hidden, group = cfg.get("hidden_size"), int(d["conv_group_size"])
    if isinstance(hidden, int) and hidden % group:
        raise CheckpointError(f"{where}: dflash_config.conv_group_size {group} does not divide hidden_size "
                              f"{hidden}; the dynamic convolution shares one tap per group of channels")
    vocab, top_k = cfg.get("vocab_size"), int(d["selector_top_k"])
    if isinstance(vocab, int) and top_k > vocab:
        raise CheckpointError(f"{where}: dflash_config.selector_top_k {top_k} exceeds the vocabulary ({vocab})")
    if d.get("draft_vocab_size"):
        raise CheckpointError(f"{where}: a DFlash2 selector indexes the full vocabulary; a reduced draft "
                              "vocabulary (draft_vocab_size) is not supported")


def expected_shapes(cfg) -> dict[str, tuple[int, ...]]:
    """DFlash2's extra tensors under their published names (``dflash/model.py``)."""
    h, k, g, r = cfg.hidden_size, cfg.conv_kernel_size, cfg.hidden_size // cfg.conv_group_size, cfg.selector_rank
    out = {CODEBOOKS[0]: (cfg.vocab_size, r), CODEBOOKS[1]: (cfg.vocab_size, r),
           "candidate_selector.hidden_projection.weight": (r, h)}
    for n in range(cfg.num_hidden_layers):
        for conv in ("attention_conv", "mlp_conv"):
            out[f"layers.{n}.{conv}.base_kernel"] = (2, k, h)
            out[f"layers.{n}.{conv}.kernel_projection.weight"] = (2 * k * g, h)
    return out
