"""Drafter formats that load and then run wrong somewhere: each is named, and either runs where
it runs right or is refused, in one line, for the path that would run it wrong.

Invariant: a drafter reaches a runtime only in a form that runtime computes as it was trained.

- **JetSpec** (``dflash_config.causal: true``, in-block causal attention): runs in dflash-trt's
  runtime (reference, Triton, ONNX / TensorRT graphs apply ``causal`` per layer:
  ``plugins.attention.visibility``); refused for TensorRT-LLM, which does not read ``causal``
  (:func:`trtllm_refusal`).
- **NeMo alias** (``architectures: ["Qwen3DFlashDraftModel"]``): read as z-lab ``DFlashDraftModel``
  (vLLM rewrites it the same way).
- **LiLiCorr** (``lilicorr`` in the architecture / ``model_type`` / ``projector_type``, or
  ``correlator`` keys or tensors): refused; the learned correlator is run by neither dflash-trt
  nor TensorRT-LLM (vLLM ModelRunnerV2, llama.cpp and Edge-LLM 0.12 run it).
- **MLA DFlash** (``attention_mode: "mla"``, SpecForge; ``KimiK3DFlashDraftModel``, NeMo; MLA keys
  such as ``kv_lora_rank``): refused; dflash-trt's draft layers and TensorRT-LLM's generic DFlash
  path (``_validate_gqa_shape``) are GQA.
- **Gemma-4 backbone** (the drafter's own ``model_type`` ``gemma4`` / ``gemma4_text``, e.g.
  ``deepseek-ai/dflash_gemma4_12b_block7``): refused; its layers would run as Qwen3 layers (z-lab's
  gemma-4 drafters are ``qwen3`` backbones and load).
- **GGUF only** (``*.gguf`` and no ``*.safetensors``, or a known GGUF-only hub id): refused by name
  (weights load from safetensors only), with the conversion where one is known.

Sources: vLLM (the ``DFlashDraftModel`` alias, the Domino refusal), TensorRT-LLM
``_torch/models/modeling_dflash.py`` (``causal`` not read; ``_validate_gqa_shape``).
"""

from __future__ import annotations

from pathlib import Path

from dflash_trt.errors import CheckpointError

NEMO_ALIAS = "Qwen3DFlashDraftModel"
MLA_KEYS = ("kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim")
# GGUF-only drafters the project knows, and what to use instead
GGUF_ONLY = {
    "incoai/Qwen3.8-27B-DFlash2-GGUF": "use its safetensors original z-lab/Qwen3.8-27B-DFlash2 (recipe "
    "qwen3.8-27b-dflash2-h200-fp8)",
    "nvidia/NVIDIA-Nemotron-3.5-Bolt-E4B-4GB-DFlash": "no safetensors release or conversion is known",
}


# drafters a source describes as a refused format, refused by id before anything is read
BY_ID = {
    "deepseek-ai/dflash_gemma4_12b_block7": "a Gemma-4 backbone (model_type gemma4_text), whose layers "
    "dflash-trt and TensorRT-LLM would run as Qwen3 layers: use z-lab's qwen3-backbone gemma-4 drafter"
}


def refused_id(ref: str) -> str | None:
    """Why the drafter hub id ``ref`` (``@revision`` ignored) is refused by name; None if it is not."""
    ref = ref.split("@")[0]
    if ref in GGUF_ONLY:
        return f"{ref}: published as GGUF only (dflash-trt loads safetensors only): {GGUF_ONLY[ref]}"
    return f"{ref}: {BY_ID[ref]}" if ref in BY_ID else None


def _dcfg(cfg: dict) -> dict:
    d = cfg.get("dflash_config")
    return d if isinstance(d, dict) else {}


def is_jetspec(cfg: dict) -> bool:
    """In-block causal attention declared for every layer (JetSpec)."""
    return _dcfg(cfg).get("causal") is True or cfg.get("causal") is True


def refuse(cfg: dict, names: list[str], where: str) -> None:
    """A one-line CheckpointError for LiLiCorr, MLA and Gemma-4-backbone drafters (module doc)."""
    d = _dcfg(cfg)
    archs = [str(a) for a in cfg.get("architectures") or []]
    marks = [*archs, str(cfg.get("model_type") or ""), str(d.get("projector_type") or cfg.get("projector_type") or "")]
    if (
        any("lilicorr" in m.lower() for m in marks)
        or any(k.startswith("correlator") for k in (*cfg, *d))
        or any(n.split(".", 1)[0].endswith("correlator") for n in names)
    ):
        raise CheckpointError(
            f"{where}: this is a LiLiCorr drafter (a DFlash backbone plus a learned correlator); "
            "neither dflash-trt nor TensorRT-LLM runs the correlator, and the backbone alone "
            "underperforms: serve it with vLLM (ModelRunnerV2), llama.cpp or Edge-LLM 0.12"
        )
    mode = str(d.get("attention_mode") or cfg.get("attention_mode") or "").lower()
    if mode == "mla" or any("KimiK3DFlash" in a for a in archs) or any(k in cfg or k in d for k in MLA_KEYS):
        raise CheckpointError(
            f"{where}: this is an MLA DFlash drafter (multi-head latent attention draft layers); "
            "dflash-trt's draft layers and TensorRT-LLM's DFlash path (_validate_gqa_shape) are "
            "GQA only: serve it with the engine it was trained for (SpecForge / SGLang, NeMo)"
        )
    if str(cfg.get("model_type") or "") in ("gemma4", "gemma4_text"):
        raise CheckpointError(
            f"{where}: this DFlash drafter has a Gemma-4 backbone (model_type "
            f"{cfg['model_type']}); dflash-trt and TensorRT-LLM would run its layers as Qwen3 "
            "layers: use a qwen3-backbone drafter for the target (z-lab's gemma-4 drafters)"
        )


def nemo_alias(cfg: dict) -> list[str]:
    """The notes for NeMo's ``Qwen3DFlashDraftModel`` architecture, read as ``DFlashDraftModel``
    (``cfg`` is rewritten in place, as vLLM does)."""
    archs = [str(a) for a in cfg.get("architectures") or []]
    if NEMO_ALIAS not in archs:
        return []
    cfg["architectures"] = ["DFlashDraftModel" if a == NEMO_ALIAS else a for a in archs]
    return [f"NeMo architecture {NEMO_ALIAS} read as DFlashDraftModel (as vLLM does)"]


def refuse_gguf(root: Path, ref: str | None = None) -> None:
    """A directory (or hub id ``ref``) that holds the drafter only as GGUF, refused by name."""
    hint = GGUF_ONLY.get(ref or "")
    ggufs = sorted(p.name for p in root.glob("*.gguf")) if root.is_dir() else []
    if hint is None and not (ggufs and not any(root.glob("*.safetensors"))):
        return
    name = ref or str(root)
    raise CheckpointError(
        f"{name}: the drafter is published as GGUF only ({', '.join(ggufs) or 'GGUF files'}); "
        "dflash-trt loads safetensors only: "
        + (hint or "convert it to a safetensors z-lab checkpoint first (no conversion for DFlash drafters is known)")
    )


def trtllm_refusal(causal: bool | None) -> str | None:
    """One line when a drafter whose config sets ``causal`` must not be served by TensorRT-LLM."""
    if causal is not True:
        return None
    return (
        "JetSpec drafter (dflash_config.causal: true, in-block causal attention): TensorRT-LLM's DFlash loader "
        "does not read causal and would run the block bidirectionally, drafting from what it was not trained "
        "on; build with --graphs (dflash-trt's TensorRT engines apply causal) or run the pair on the reference "
        "runtime (dflash-trt generate / bench / serve)"
    )
