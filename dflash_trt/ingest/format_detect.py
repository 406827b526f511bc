"""Which published DFlash drafter format a checkpoint is in, from its config and tensor names.

Invariant: :func:`detect` names one format that :mod:`dflash_trt.ingest.formats` normalises to the
z-lab form (its table says what each is recognised by), or raises one line; nothing is converted
and no weight is read. Every other drafter family is refused here, by name, before conversion:
DSpark (Markov/confidence heads: not DFlash), speculators-format DFlash2, Domino correction heads,
unknown projector types, drafters with attention sinks, speculators models of other kinds,
architectures defined only by the checkpoint's custom code, language models passed as drafters,
and anything without DFlash markers. JetSpec (in-block causal), the NeMo alias, LiLiCorr, MLA and
Gemma-4-backbone drafters and GGUF-only ones: :mod:`dflash_trt.ingest.format_guards`.
"""

from __future__ import annotations

from pathlib import Path

from dflash_trt.errors import CheckpointError
from dflash_trt.ingest import format_guards
from dflash_trt.ingest.resolve import transformers_names
from dflash_trt.model import recognise_family

STRIPPABLE_PREFIXES = ("dflash_module.", "model.", "draft_model.")
CAUSAL_LM_SUFFIXES = ("ForCausalLM", "ForConditionalGeneration", "LMHeadModel")


def _dcfg(cfg: dict) -> dict:
    d = cfg.get("dflash_config")
    return d if isinstance(d, dict) else {}


def _base(name: str) -> str:
    for p in STRIPPABLE_PREFIXES:
        if name.startswith(p):
            return name[len(p) :]
    return name


def _refuse_other_families(cfg: dict, names: list[str], where: str) -> None:
    d = _dcfg(cfg)
    archs = [str(a) for a in cfg.get("architectures") or []]
    spec_type = str(cfg.get("speculators_model_type") or "")
    projector = str(d.get("projector_type") or cfg.get("projector_type") or "dflash")
    if (
        spec_type == "dspark"
        or any("dspark" in a.lower() for a in archs)
        or projector == "dspark"
        or "markov_rank" in cfg
        or "markov_rank" in d
        or any(_base(n).startswith(("markov_", "confidence_head.", "confidence_proj.")) for n in names)
    ):
        raise CheckpointError(
            f"{where}: this is a DSpark drafter (Markov/confidence heads), not DFlash; "
            "dflash-trt serves DFlash drafters only: use the model's DFlash drafter"
        )
    if spec_type == "dflash2" or ("dflash2_config" in cfg and "dflash_config" not in cfg):
        raise CheckpointError(
            f"{where}: DFlash2 in the speculators layout is not supported; use the drafter "
            "in its published z-lab form (DFlash2DraftModel with dflash_config)"
        )
    format_guards.refuse(cfg, names, where)  # LiLiCorr, MLA, Gemma-4 backbones
    if projector == "domino" or any(_base(n).startswith(("prefix_gru.", "embed_proj.")) for n in names):
        raise CheckpointError(
            f"{where}: Domino drafters (DFlash + causal correction head) are not supported; use a plain DFlash drafter"
        )
    if projector != "dflash":
        raise CheckpointError(f"{where}: unknown DFlash projector_type {projector!r}; only 'dflash' is supported")
    if d.get("attention_sink_bias") or cfg.get("attention_sink_bias"):
        raise CheckpointError(f"{where}: drafters with attention sinks (attention_sink_bias) are not supported")
    if spec_type and spec_type != "dflash":
        raise CheckpointError(f"{where}: a speculators {spec_type!r} model is not a DFlash drafter")


def detect(cfg: dict, names: list[str], root: Path) -> str:
    """The format name (see module doc), or a one-line CheckpointError for everything else."""
    where = str(root / "config.json")
    _refuse_other_families(cfg, names, where)
    if cfg.get("speculators_model_type") or "speculators_config" in cfg:
        return "speculators"
    archs = [str(a) for a in cfg.get("architectures") or []]
    family = recognise_family(cfg, names)
    if family.name != "dflash":
        return family.name
    if "dflash_config" in cfg or "DFlashDraftModel" in archs or format_guards.NEMO_ALIAS in archs:
        if _is_modelopt(cfg, names, root):
            return "modelopt"
        if format_guards.is_jetspec(cfg):
            return "jetspec"  # z-lab form, in-block causal (format_guards)
        return "zlab" if "block_size" in _dcfg(cfg) or "block_size" not in cfg else "zlab-v1"
    if cfg.get("auto_map") and (not archs or not all(_known_arch(a) for a in archs)):
        raise CheckpointError(
            f"{where}: architecture {archs or '?'} is only defined by custom code in the "
            "checkpoint (auto_map), which dflash-trt never runs; this is not a DFlash drafter"
        )
    if any(a.endswith(CAUSAL_LM_SUFFIXES) for a in archs):
        raise CheckpointError(
            f"{where}: {archs[0]} is a language model, not a DFlash drafter "
            "(no dflash_config / speculators_config); did you swap --target and --drafter?"
        )
    raise CheckpointError(
        f"{where}: unknown drafter format (no dflash_config, speculators_config or "
        "DFlashDraftModel architecture); supported: z-lab, speculators, ModelOpt exports, DFlash2"
    )


def _known_arch(arch: str) -> bool:
    return arch in transformers_names()  # without importing the modeling code (torch)


def _is_modelopt(cfg: dict, names: list[str], root: Path) -> bool:
    q = cfg.get("quantization_config")
    if (root / "hf_quant_config.json").exists() or (isinstance(q, dict) and q.get("quant_method") == "modelopt"):
        return True
    return any(n.startswith(p) and n.endswith("fc.weight") for n in names for p in STRIPPABLE_PREFIXES)
