"""TensorRT-LLM's verdict per target family: can its model capture hidden states for DFlash?

DFlash's drafter reads the target's hidden states after the decoder layers it names. In
TensorRT-LLM's PyTorch backend that is the spec-metadata hook each model's decoder loop must
call: ``spec_metadata.maybe_capture_hidden_states(layer_idx, hidden_states, residual)`` (guarded
by ``spec_metadata.is_layer_capture(layer_idx)``), e.g.
``tensorrt_llm/_torch/models/modeling_nemotron_h.py::NemotronHLayer.forward``. A model without
it serves the target but never feeds a drafter: ``build`` (the TensorRT-LLM path) refuses such a
pair in one line and names the runtimes that still run it.

One row per family, keyed by the HF ``architectures[0]`` TensorRT-LLM dispatches on
(``tensorrt_llm/_torch/models/_arch_index.py::MODEL_ARCH_TO_MODULE``). ``since`` is the first
release of ``trtllm_releases`` known to have the hook (the oldest known release where the hook
predates them all; ``None`` with ``missing`` set: no release has it, ``missing`` names the file
that shows it). An architecture absent from ``_arch_index.py`` has no TensorRT-LLM model at all:
``missing`` says so. Read in NVIDIA/TensorRT-LLM's source (``main``, late 2026); a row whose
``since`` could not be pinned to a tag says ``main`` in ``notes`` and uses the newest known
release. Data plus two lookups: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from dflash_trt.plan import trtllm_releases

_OLDEST = trtllm_releases.RELEASES[0].version
_NEWEST = trtllm_releases.RELEASES[-1].version
_MODELS = "tensorrt_llm/_torch/models/"
_NOT_IN_INDEX = _MODELS + "_arch_index.py (no TensorRT-LLM model for this architecture)"


@dataclass(frozen=True)
class Capture:
    """TensorRT-LLM's hidden-state capture for one target family."""

    family: str
    architectures: tuple[str, ...]
    since: str | None  # first known release with the hook; None: missing
    source: str  # the file (and function) read
    missing: str | None = None  # why no release captures (the file that shows it)
    notes: str = ""


CAPTURES: tuple[Capture, ...] = (
    Capture("llama", ("LlamaForCausalLM",), _OLDEST, _MODELS + "modeling_llama.py::LlamaDecoderLayer.forward"),
    Capture(
        "qwen3",
        ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM"),
        _OLDEST,
        _MODELS + "modeling_qwen3.py, modeling_qwen3_moe.py (decoder layer forward)",
    ),
    Capture(
        "qwen3_5",
        (
            "Qwen3_5ForCausalLM",
            "Qwen3_5MoeForCausalLM",
            "Qwen3_5ForConditionalGeneration",
            "Qwen3_5MoeForConditionalGeneration",
        ),
        _OLDEST,
        _MODELS + "modeling_qwen3_5.py",
        notes="hybrid GDN state after acceptance: PR #13782",
    ),
    Capture(
        "qwen3_next",
        ("Qwen3NextForCausalLM",),
        _OLDEST,
        _MODELS + "modeling_qwen3_next.py::Qwen3NextFullAttentionDecoderLayer.forward",
    ),
    Capture("gpt_oss", ("GptOssForCausalLM",), _OLDEST, _MODELS + "modeling_gpt_oss.py"),
    Capture(
        "deepseek_v3",
        (
            "DeepseekV3ForCausalLM",
            "DeepseekV32ForCausalLM",
            "KimiK2ForCausalLM",
            "KimiK25ForConditionalGeneration",
            "GlmMoeDsaForCausalLM",
        ),
        _OLDEST,
        _MODELS + "modeling_deepseekv3.py (GlmMoeDsaForCausalLM maps there in _arch_index.py)",
    ),
    Capture(
        "laguna",
        ("LagunaForCausalLM",),
        _OLDEST,
        _MODELS + "modeling_laguna.py (its DFlash drafter subclass reads dflash_config.block_size)",
    ),
    Capture(
        "nemotron_h",
        ("NemotronHForCausalLM", "NemotronHPuzzleForCausalLM"),
        _NEWEST,
        _MODELS + "modeling_nemotron_h.py::NemotronHLayer.forward",
        notes="read on main; tag not pinned",
    ),
    Capture(
        "kimi_linear",
        ("KimiLinearForCausalLM", "KimiK3ForConditionalGeneration"),
        _NEWEST,
        _MODELS + "modeling_kimi_linear.py (_trunk_parameters: the DFlash drafter attached by "
        "SpecDecOneEngineForCausalLM)",
        notes="Kimi-K3 target: PR #19040; read on main, tag not pinned",
    ),
    Capture(
        "gemma4",
        ("Gemma4ForCausalLM", "Gemma4ForConditionalGeneration", "Gemma4UnifiedForConditionalGeneration"),
        None,
        _MODELS + "modeling_gemma4.py",
        missing=_MODELS + "modeling_gemma4.py (Gemma4DecoderLayer and "
        "Gemma4TextModel.forward never see spec_metadata; modeling_gemma4_unified.py reuses "
        "Gemma4ForCausalLM as its text core)",
    ),
    Capture(
        "minimax_m2",
        ("MiniMaxM2ForCausalLM",),
        None,
        _MODELS + "modeling_minimaxm2.py",
        missing=_MODELS + "modeling_minimaxm2.py (its decoder loop never sees spec_metadata)",
    ),
    Capture(
        "mimo_v2",
        ("MiMoV2FlashForCausalLM", "MiMoV2ForCausalLM"),
        None,
        _MODELS + "_arch_index.py",
        missing=_NOT_IN_INDEX,
    ),
    Capture(
        "deepseek_v4",
        ("DeepseekV4ForCausalLM",),
        _NEWEST,
        _MODELS + "modeling_deepseekv4.py::DeepseekV4DecoderLayer.forward_MoE (each tapped layer's MoE output)",
        notes="read on main; tag not pinned",
    ),
    Capture(
        "glm5_next",
        ("Glm5NextForCausalLM", "Glm5NextForConditionalGeneration"),
        None,
        _MODELS + "modeling_glm5_next.py",
        missing=_MODELS + "modeling_glm5_next.py (Glm5NextDecoderLayer.forward "
        "and Glm5NextModel.forward never see spec_metadata; only its one-model MTP layer is fed)",
        notes="read on main (commit 044d703d), the VLM wrapper runs this text model; tag not pinned",
    ),
    Capture(
        "muse_glimmer",
        ("MuseGlimmerForCausalLM", "MuseGlimmerForConditionalGeneration"),
        None,
        _MODELS + "_arch_index.py",
        missing=_NOT_IN_INDEX,
    ),
)

_BY_ARCH = {arch: row for row in CAPTURES for arch in row.architectures}


def capture(architecture: str | None) -> Capture | None:
    """The row for a target's ``architectures[0]``; None: TensorRT-LLM's source was not read for it."""
    return _BY_ARCH.get(architecture or "")


def capture_missing(architecture: str | None, release: str) -> str | None:
    """Why TensorRT-LLM ``release`` cannot capture this architecture's hidden states (the file that
    shows it), or None where it can or was not read (planning goes on; ``inspect`` says "not known")."""
    row = capture(architecture)
    if row is None:
        return None
    if row.since is None:
        return row.missing
    order = list(trtllm_releases.KNOWN)
    if release in order and order.index(release) < order.index(row.since):
        return f"{row.source}: the hook arrives after {release} (first known release: {row.since})"
    return None


def capture_supported(architecture: str | None, release: str = _NEWEST) -> bool | None:
    """True: ``release`` captures; False: it does not; None: not read."""
    if capture(architecture) is None:
        return None
    return capture_missing(architecture, release) is None
