"""The TensorRT-LLM releases a bundle can target, and what each one reads: ONE table.

Each :class:`Release` row is what the project knows of one release. Where a fact could not
be pinned to a release from TensorRT-LLM's source or its per-release API reference, the
row's ``notes`` say so: fix the row here, not the code that reads it. Sources:

* **Draft-length schedule lookup.** DFlash runs on the one-model path, which calls
  ``tensorrt_llm/_torch/speculative/utils.py::get_draft_len_for_batch_size``: ``bisect_left``
  over the sorted keys, so the FIRST key >= the live batch size applies and above the
  largest key the draft length is the floor (0: drafting off); keys are *upper* bounds
  (``{4: 4, 8: 2, 32: 1}``: batch 1-4 -> 4, 5-8 -> 2, 9-32 -> 1, 33+ -> 0). The older
  two-model ``tensorrt_llm/_torch/speculative/drafter.py::Drafter.get_draft_len_for_batch_size``
  used ``bisect_right`` (the largest key <= the batch size: *lower* bounds). Newer main
  floors one-engine modes at ``DecodingBaseConfig.min_runtime_draft_len`` = 1
  (``tests/unittest/_torch/speculative/hw_agnostic/test_min_runtime_draft_len.py``): a
  release with that floor has ``draft_len_floor=1`` and cannot turn drafting off.
* **Schedule validation** (all releases): ``tensorrt_llm/llmapi/llm_args.py``,
  ``DecodingBaseConfig.validate_draft_len_schedule_and_sort`` (keys >= 1, lengths >= 0 and
  <= max_draft_len, the smallest key maps to max_draft_len) and
  ``validate_max_concurrency_and_draft_len_schedule_mutually_exclusive`` (``max_concurrency: N``
  becomes ``{N: max_draft_len}``).
* **DFlashDecodingConfig fields**: the API reference of each release
  (``nvidia.github.io/TensorRT-LLM/<release>/llm-api/reference/DFlashDecodingConfig.html``):
  ``FA4`` from 1.3.0rc27; ``context_recompute_tail``, ``moe_backend``, ``spec_dec_variant``,
  ``skip_ctx_buffer_budget_check`` from 1.4.0rc1.
* **Token budget**: ``tensorrt_llm/_torch/speculative/dflash.py::validate_dflash_ctx_buffer_budget``
  refuses ``max_batch_size x (1 + max_draft_len) > max_num_tokens`` (1.4.0rc1 on, pinned by
  ``tests/unittest/_torch/speculative/hw_agnostic/test_dflash_config_budget.py``); earlier
  releases corrupt memory at engine init instead, so the planner enforces it for every release.
* **DFlash2 drafters** (``DFlash2DraftModel``): served on the ordinary DFlash path of
  ``tensorrt_llm/_torch/models/modeling_dflash.py`` (``_is_dflash2_architecture``,
  ``DFlash2CandidateSelector``; ``trtllm_dflash2`` has the details) on ``main`` from early
  September 2026, after the drafters' publication (2026-08-18): ``dflash2`` is True for 1.4.0rc1,
  inferred from those dates (its tag's code is not read), False for the 1.3.0 candidates.
* **gpt-oss MoE backend**: ``tensorrt_llm/_torch/model_config.py::ModelConfig.resolve_moe_backend``
  resolves ``AUTO`` to TRTLLM on SM100-119 and TRITON on SM90; the 1.2 deployment guide says
  the default was CUTLASS and the backend had to be set. Releases not confirmed to resolve it
  get it pinned (``moe_config.backend``), which is harmless where AUTO picks the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from dflash_trt.errors import RecipeError

IMAGE = "nvcr.io/nvidia/tensorrt-llm/release"   # NGC release containers, tagged by version

# DFlashDecodingConfig keys (TensorRT-LLM field names; ``speculative_model_dir`` is an alias).
_DFLASH_1_3 = frozenset({
    "decoding_type", "max_draft_len", "max_total_draft_tokens", "speculative_model", "max_concurrency",
    "draft_len_schedule", "load_format", "acceptance_rate_window_size", "acceptance_rate_threshold",
    "use_rejection_sampling", "allow_advanced_sampling", "advanced_sampling_mode", "enable_penalty",
    "mask_token_id", "target_layer_ids", "attention_backend",
})
_DFLASH_1_4 = _DFLASH_1_3 | {"moe_backend", "spec_dec_variant", "context_recompute_tail",
                             "skip_ctx_buffer_budget_check"}

Lookup = Literal["upper_bound", "lower_bound"]


@dataclass(frozen=True)
class Release:
    """What one TensorRT-LLM release reads in a DFlash bundle."""

    version: str
    attention_backends: tuple[str, ...]     # DFlashDecodingConfig.attention_backend values
    dflash_keys: frozenset[str]             # speculative_config keys it accepts
    schedule_lookup: Lookup = "upper_bound"  # upper_bound: first key >= batch; lower_bound: last key <= batch
    draft_len_floor: int = 0                # floor on every scheduled length (0: drafting can stop)
    refuses_token_budget: bool = False      # TensorRT-LLM itself refuses a violated token budget
    pin_gpt_oss_moe: bool = True            # write moe_config.backend for gpt-oss targets
    dflash2: bool = False                   # serves DFlash2 drafters (DFlash2DraftModel)
    notes: str = ""

    @property
    def image(self) -> str:
        return f"{IMAGE}:{self.version}"

    @property
    def context_recompute_tail(self) -> bool:
        return "context_recompute_tail" in self.dflash_keys

    def accepts(self, key: str) -> bool:
        return key in self.dflash_keys


RELEASES: tuple[Release, ...] = (
    Release("1.3.0rc26", ("VANILLA", "TRTLLM"), _DFLASH_1_3,
            notes="the last 1.3.0 candidate before FA4 (the unversioned DFlashDecodingConfig page, "
                  "VANILLA | TRTLLM); DFlash's presence in this exact candidate is inferred"),
    Release("1.3.0rc27", ("VANILLA", "TRTLLM", "FA4"), _DFLASH_1_3, notes="FA4 draft attention (SM90)"),
    Release("1.4.0rc1", ("VANILLA", "TRTLLM", "FA4"), _DFLASH_1_4, refuses_token_budget=True, dflash2=True,
            notes="context_recompute_tail, the token-budget and context-buffer checks; whether AUTO "
                  "resolves the gpt-oss MoE backend here is not confirmed (the 1.4.0rc4 guide says it does); "
                  "DFlash2 drafters served: inferred from dates (the path is on main from September 2026, "
                  "the code at this tag is not read)"),
)
KNOWN: dict[str, Release] = {r.version: r for r in RELEASES}
DEFAULT_RELEASE = RELEASES[-1].version   # the newest the project knows: a recipe's default


def get(version: str) -> Release:
    """The release row, or a RecipeError listing the ones the project knows."""
    try:
        return KNOWN[str(version)]
    except KeyError:
        raise RecipeError(f"trtllm.release {version!r} is not a TensorRT-LLM release this dflash-trt knows; "
                          f"choose one of {', '.join(KNOWN)}") from None


def gpt_oss_moe_backend(sm: int) -> str:
    """``ModelConfig.resolve_moe_backend`` for GptOssForCausalLM at compute capability ``sm``."""
    if 100 <= sm < 120:
        return "TRTLLM"
    if 90 <= sm < 100:
        return "TRITON"
    return "CUTLASS"
