"""What the targeted TensorRT-LLM release demands of a plan, decided once at plan time.

Each function takes the recipe's choice and the release row (:mod:`trtllm_releases`) and
returns what the config must say, appending one-line warnings; a combination the release
would reject raises a one-line ``RecipeError`` / ``HardwareError`` (exit 2). Sources:

* draft attention backends: ``tensorrt_llm/llmapi/llm_args.py``, ``DFlashDecodingConfig.attention_backend``
  ("TRTLLM requires FlashInfer and an NVIDIA Blackwell GPU with SM100 or SM103"; FA4 from 1.3.0rc27).
* token budget: ``tensorrt_llm/_torch/speculative/dflash.py::validate_dflash_ctx_buffer_budget``:
  ``max_batch_size x (1 + max_draft_len) <= max_num_tokens`` (DFlash's ``tokens_per_gen_step``
  is ``max_draft_len + 1``).
* chunked prefill: ``BaseLlmArgs.enable_chunked_prefill`` defaults to False, so a prompt longer
  than ``max_num_tokens`` would not be scheduled; the spec-recompute tail is only applied with
  chunked prefill on (``KVCacheManager._maybe_apply_spec_recompute_tail``,
  ``tensorrt_llm/_torch/pyexecutor/resource_manager.py``).
* ``context_recompute_tail`` (1.4.0rc1+): a prefix-cache hit only runs the uncached tail through
  the target, so only it yields hidden states for the drafter; the tail caps reuse so at least
  that many prompt tokens are recomputed (0: no cap, negative: the whole prompt).
* gpt-oss MoE backend: ``tensorrt_llm/_torch/model_config.py::ModelConfig.resolve_moe_backend``.
* drafter keys: ``tensorrt_llm/_torch/models/modeling_dflash.py::DFlashForCausalLM`` reads
  ``mask_token_id``, ``target_layer_ids``, ``use_swa``/``swa_window_size`` from ``dflash_config``
  and ``block_size`` from the top level (``dflash_config.block_size`` first from PR #17935, which
  also refuses a runtime block wider than the checkpoint's); the keys in
  :data:`IGNORED_DRAFTER_KEYS` it never reads.
* draft attention for windowed non-causal layers (:func:`draft_attention_backend`): one rule on
  the drafter's LAYERS, whatever its family (DFlash2, a speculators-format drafter, a z-lab
  DFlash with sliding layers): ``modeling_dflash.py::validate_block_attention_windows`` refuses
  TRTLLM for a layer that is non-causal inside a finite window (flashinfer's trtllm-gen kernel
  has no such mode; PR #19159, release column ``refuses_windowed_trtllm``). Releases before it
  do not refuse, and the kernel then anchors every query of the block at its last position
  (sglang PR #35209 measured the same kernel): wrong masks, so the rule refuses for every
  release. VANILLA and FA4 pass both window bounds (PR #16914).
* disaggregated serving (:func:`refuse_disaggregated`): the generation server receives the
  target's KV cache but not the drafter's context, so it drafts without the prompt: output
  stays correct, acceptance collapses. TensorRT-LLM only warns (PR #19352).
* quantized drafters (:func:`refuse_quantized_drafter`): TensorRT-LLM's DFlash loader takes an
  fp16/bf16 drafter; peers keep drafters unquantized too (SGLang
  ``--speculative-draft-model-quantization unquant``; vLLM issue #51581: a weight-quantized
  drafter can corrupt output silently).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from dflash_trt.errors import HardwareError, RecipeError
from dflash_trt.plan.hardware import GPU
from dflash_trt.plan.recipe import ServingSpec
from dflash_trt.plan.trtllm_releases import Release, gpt_oss_moe_backend

DEFAULT_RECOMPUTE_TAIL = 512  # prompt tokens recomputed on a prefix-cache hit when block reuse is on
IGNORED_DRAFTER_KEYS = ("causal", "input_embedding_scale", "output_multiplier", "final_logit_softcapping")
GiB = 1 << 30


class Sized(Protocol):
    """What the token budget reads of the plan's memory (``memory_model.Memory``)."""

    @property
    def fits(self) -> bool: ...
    @property
    def total(self) -> int: ...
    @property
    def capacity(self) -> int: ...


def fa4_head_dim(head_dim: int | None) -> bool:
    """FA4 takes head_dim 8-256 in steps of 8 (PR #18553); None: not known, not refused."""
    return head_dim is None or (8 <= head_dim <= 256 and head_dim % 8 == 0)


def attention_backend(
    requested: str, gpu: GPU, release: Release, warnings: list[str], head_dim: int | None = None
) -> str:
    """DFlashDecodingConfig.attention_backend: the recipe's, or the GPU's best the release has, by
    one rule on the GPU and the drafter's head dimension (its windows: :func:`draft_attention_backend`):
    TRTLLM on SM100/SM103, FA4 on SM90 where the release has it and the head dimension is FA4's,
    VANILLA elsewhere. A requested backend the rule forbids is refused in one line naming the rule."""
    if requested != "auto":
        if requested not in release.attention_backends:
            raise RecipeError(
                f"speculative.attention_backend {requested} does not exist in TensorRT-LLM "
                f"{release.version} (it has {', '.join(release.attention_backends)}); FA4 needs "
                "trtllm.release 1.3.0rc27 or later"
            )
        if requested == "TRTLLM" and gpu.kind == "gpu" and gpu.sm not in (100, 103):
            raise HardwareError(
                f"speculative.attention_backend TRTLLM needs an SM100/SM103 GPU (B200, B300, GB200); "
                f"{gpu.name} is SM{gpu.sm}: use FA4 on Hopper or VANILLA"
            )
        if requested == "FA4" and gpu.kind == "gpu" and gpu.sm != 90:
            raise HardwareError(
                f"speculative.attention_backend FA4 is SM90 only (PR #18553); {gpu.name} is "
                f"SM{gpu.sm}: use TRTLLM on SM100/SM103, or VANILLA"
            )
        if requested == "FA4" and not fa4_head_dim(head_dim):
            raise RecipeError(
                f"speculative.attention_backend FA4 takes head_dim 8-256 in steps of 8 (PR #18553); "
                f"the drafter's is {head_dim}: use VANILLA"
            )
        return requested
    best = gpu.draft_attention_backend
    if best == "FA4" and not fa4_head_dim(head_dim):
        warnings.append(
            f"the drafter's head_dim {head_dim} is outside FA4's 8-256 (steps of 8); using VANILLA, "
            "which needs the flash_attn package"
        )
        return "VANILLA"
    if best not in release.attention_backends:
        warnings.append(
            f"TensorRT-LLM {release.version} has no {best} draft attention; using VANILLA, which needs "
            "the flash_attn package (TensorRT-LLM's requirements do not install it)"
        )
        return "VANILLA"
    return best


def target_attn_backend(requested: str | None) -> str:
    """The target's ``attn_backend`` for a DFlash config: TRTLLM, written explicitly (a head_dim of
    256, as Gemma-4's, makes TensorRT-LLM auto-select FlashInfer otherwise); FLASHINFER refused in
    one line: it cannot take the K + 1 tokens per sequence a DFlash verify step feeds it (PR #19466
    rejects it for DFlash)."""
    if requested is None or requested == "TRTLLM":
        return "TRTLLM"
    if requested == "FLASHINFER":
        raise RecipeError(
            "attn_backend FLASHINFER cannot verify K + 1 tokens per sequence, so DFlash cannot run on it "
            "(TensorRT-LLM PR #19466 rejects it); use TRTLLM"
        )
    return requested


def windowed_non_causal(cfg) -> list[int]:
    """The layers of drafter config ``cfg`` that are non-causal inside a finite sliding window
    (``cfg``: ``num_hidden_layers``, ``layer_window(i)``, ``layer_causal(i)``)."""
    return [i for i in range(cfg.num_hidden_layers) if cfg.layer_window(i) is not None and not cfg.layer_causal(i)]


def draft_attention_backend(requested: str, cfg, sm: int, release: Release) -> str:
    """``speculative.attention_backend`` given the drafter's layers: TRTLLM refused in one line
    when any layer is non-causal inside a window; ``auto`` then becomes FA4 on SM90 where the
    release has it, else VANILLA. Drafters without such layers pass ``requested`` unchanged."""
    layers = windowed_non_causal(cfg)
    if not layers:
        return requested
    if requested == "TRTLLM":
        refused = (
            "refuses it (PR #19159)"
            if release.refuses_windowed_trtllm
            else "has no such mode, and this release would run it with wrong masks"
        )
        raise RecipeError(
            f"speculative.attention_backend TRTLLM cannot run this drafter: its layer(s) "
            f"{', '.join(map(str, layers))} use a non-causal sliding window, which TensorRT-LLM "
            f"{release.version}'s TRTLLM draft attention {refused}; use VANILLA, FA4 (SM90), or auto"
        )
    if requested == "auto":
        return "FA4" if sm == 90 and "FA4" in release.attention_backends else "VANILLA"
    return requested


def refuse_disaggregated(disaggregated: bool) -> None:
    """A one-line RecipeError for DFlash under disaggregated serving (PR #19352 only warns)."""
    if disaggregated:
        raise RecipeError(
            "serving.disaggregated: DFlash with disaggregated serving drafts without the prompt (the "
            "generation server gets the target's KV cache, not the drafter's context): output stays "
            "correct but acceptance collapses, and TensorRT-LLM only warns (PR #19352); serve aggregated"
        )


def refuse_quantized_drafter(quant: dict | None, drafter: str = "the drafter") -> None:
    """A one-line RecipeError when the drafter checkpoint is quantized (``quant``: what
    ``ingest.target_quantization`` reads from its directory; None: unquantized)."""
    if quant:
        how = quant.get("quant_algo") or quant.get("quant_method") or quant.get("method") or "quantized"
        raise RecipeError(
            f"{drafter} is quantized ({how}): TensorRT-LLM's DFlash loader takes an fp16/bf16 drafter, "
            "and a quantized drafter loses acceptance or, in some stacks, output (SGLang serves drafters "
            "--speculative-draft-model-quantization unquant; vLLM issue #51581); use its BF16 checkpoint"
        )


def token_budget(
    memory_at: Callable[[ServingSpec], Sized],
    serving: ServingSpec,
    max_draft_len: int,
    gpu_name: str,
    warnings: list[str],
) -> ServingSpec:
    """``serving`` with ``max_num_tokens`` raised to the DFlash token budget when memory allows
    (``memory_at(serving)`` is the plan's Memory); else a one-line refusal with the numbers."""
    need = serving.max_batch_size * (1 + max_draft_len)
    if serving.max_num_tokens >= need:
        return serving
    budget = (
        f"TensorRT-LLM's DFlash token budget max_batch_size x (1 + max_draft_len) = "
        f"{serving.max_batch_size} x {1 + max_draft_len} = {need} "
        f"exceeds max_num_tokens {serving.max_num_tokens}"
    )
    raised = serving.model_copy(update={"max_num_tokens": need})
    m = memory_at(raised)
    if not m.fits:
        fits = serving.max_num_tokens // (1 + max_draft_len)
        raise HardwareError(
            f"{budget}, and raising max_num_tokens to {need} does not fit on {gpu_name} "
            f"({m.total / GiB:.1f} of {m.capacity / GiB:.1f} GiB): "
            f"set serving.max_batch_size <= {fits} or a smaller speculative.max_draft_len"
        )
    warnings.append(f"{budget}: max_num_tokens raised to {need}")
    return raised


def recompute_tail(tail: int | None, block_reuse: bool, release: Release, warnings: list[str]) -> int | None:
    """``context_recompute_tail`` for the config (None: not written)."""
    if tail is not None and not release.context_recompute_tail:
        raise RecipeError(
            f"speculative.context_recompute_tail needs TensorRT-LLM 1.4.0rc1 or later; "
            f"trtllm.release is {release.version}"
        )
    if not block_reuse:
        return tail
    if not release.context_recompute_tail:
        warnings.append(
            f"enable_block_reuse on TensorRT-LLM {release.version}: prefix-cache hits give the drafter "
            "no hidden states for the reused prompt (acceptance drops; output stays lossless); "
            "1.4.0rc1 adds context_recompute_tail"
        )
        return None
    return DEFAULT_RECOMPUTE_TAIL if tail is None else tail


def chunked_prefill(serving: ServingSpec, tail: int | None, warnings: list[str]) -> bool:
    """``enable_chunked_prefill``: on where prompts may exceed one step or the recompute tail is set."""
    needed = serving.max_seq_len > serving.max_num_tokens or bool(tail)
    if serving.enable_chunked_prefill is False and needed:
        warnings.append(
            f"serving.enable_chunked_prefill is off: prompts over max_num_tokens {serving.max_num_tokens} "
            "will not be scheduled" + (" and context_recompute_tail is not applied" if tail else "")
        )
        return False
    return True if serving.enable_chunked_prefill else needed


def moe_backend(model_type: str, gpu: GPU, release: Release) -> str | None:
    """``moe_config.backend`` pinned for gpt-oss where the release does not resolve AUTO itself."""
    if model_type != "gpt_oss" or gpu.kind != "gpu" or not release.pin_gpt_oss_moe:
        return None
    return gpt_oss_moe_backend(gpu.sm)


def ignored_drafter_keys(cfg) -> str | None:
    """One warning line naming the drafter settings (a ``DrafterConfig``) TensorRT-LLM does not apply."""
    defaults = {
        "causal": (None, False),
        "input_embedding_scale": (1.0,),
        "output_multiplier": (1.0,),
        "final_logit_softcapping": (None, 0, 0.0),
    }
    found = [f"{k}={getattr(cfg, k)}" for k in IGNORED_DRAFTER_KEYS if getattr(cfg, k) not in defaults[k]]
    if not found:
        return None
    return (
        f"the drafter sets {', '.join(found)}, which TensorRT-LLM's DFlash loader does not read: the GPU "
        "deployment will not apply them (output stays lossless; acceptance may drop)"
    )
