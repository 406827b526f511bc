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
* **Which release has which pull request** (late 2026). The repository snapshot (2.5 GB) is
  over what this project's tools can fetch, so ``git merge-base --is-ancestor`` was not run
  on any tag; what is established comes from the GitHub release pages (each tag's commit, its
  date, "N commits to main since this release") and each pull request's merge into ``main``
  (squash merges). A pull request merged weeks before a tag's date counts as in it, one merged
  after it as not (a cherry-pick onto a release branch would not show here):
  ``v1.3.0rc26`` (commit c295dd9, 2026-09-09) and ``v1.4.0rc1`` (commit 0372799, 2026-10-22,
  its notes cite pull requests up to #20205). The pull requests:
  #17935 (``block_size`` from ``dflash_config``, 2026-08-18), #18155 (DFlash2, 2026-09-13),
  #19159 (TRTLLM draft attention refused for non-causal sliding windows, ``d2t`` checked at
  load time, 2026-09-14), #19352 (disaggregated serving with DFlash only warns, 2026-09-17),
  #19410 (no separate draft KV manager for VANILLA / FA4, 2026-09-18). #16888 (the
  draft-length floor) is open: every release here stops drafting above the largest key.
  Not established: ``v1.3.0rc27``'s date (its API page shows FA4; whether it holds the
  September pull requests is unknown, so its row assumes it does not), and any release after
  ``v1.4.0rc1`` (no release page for 1.4.0rc2 or 1.4.0 was found): those are not rows, and
  ``serve.sh`` judges them with the installed release's own classes
  (:mod:`dflash_trt.deploy.trtllm_judge`).
* **Draft KV memory per release and backend** (PR #19410,
  ``tensorrt_llm/_torch/speculative/dflash.py`` / ``_torch/pyexecutor/_util.py``): before it
  every draft attention backend got a separate managed draft KV cache next to the worker's
  own context buffers; after it only TRTLLM does (its context lives in that paged pool).
  ``draft_kv_manager`` lists the backends that get one; ``memory_model.memory`` charges it.
* **Target-family capture verdicts**: ``capture`` is a placeholder the target-family issues
  fill ((architecture, verdict) pairs per release); empty rows mean "as ``ingest`` says".
* **gpt-oss MoE backend**: ``tensorrt_llm/_torch/model_config.py::ModelConfig.resolve_moe_backend``
  resolves ``AUTO`` to TRTLLM on SM100-119 and TRITON on SM90; the 1.2 deployment guide says
  the default was CUTLASS and the backend had to be set. Releases not confirmed to resolve it
  get it pinned (``moe_config.backend``), which is harmless where AUTO picks the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from dflash_trt.errors import RecipeError

IMAGE = "nvcr.io/nvidia/tensorrt-llm/release"  # NGC release containers, tagged by version

# DFlashDecodingConfig keys (TensorRT-LLM field names; ``speculative_model_dir`` is an alias).
_DFLASH_1_3 = frozenset(
    {
        "decoding_type",
        "max_draft_len",
        "max_total_draft_tokens",
        "speculative_model",
        "max_concurrency",
        "draft_len_schedule",
        "load_format",
        "acceptance_rate_window_size",
        "acceptance_rate_threshold",
        "use_rejection_sampling",
        "allow_advanced_sampling",
        "advanced_sampling_mode",
        "enable_penalty",
        "mask_token_id",
        "target_layer_ids",
        "attention_backend",
    }
)
_DFLASH_1_4 = _DFLASH_1_3 | {
    "moe_backend",
    "spec_dec_variant",
    "context_recompute_tail",
    "skip_ctx_buffer_budget_check",
}

Lookup = Literal["upper_bound", "lower_bound"]


ALL_BACKENDS = ("VANILLA", "TRTLLM", "FA4")


@dataclass(frozen=True)
class Release:
    """What one TensorRT-LLM release reads in a DFlash bundle."""

    version: str
    attention_backends: tuple[str, ...]  # DFlashDecodingConfig.attention_backend values
    dflash_keys: frozenset[str]  # speculative_config keys it accepts
    schedule_lookup: Lookup = "upper_bound"  # upper_bound: first key >= batch; lower_bound: last key <= batch
    draft_len_floor: int = 0  # floor on every scheduled length (0: drafting stops; PR #16888 open)
    refuses_token_budget: bool = False  # TensorRT-LLM itself refuses a violated token budget
    pin_gpt_oss_moe: bool = True  # write moe_config.backend for gpt-oss targets
    dflash2: bool = False  # serves DFlash2 drafters (DFlash2DraftModel, PR #18155)
    block_size_from_dflash_config: bool = False  # reads dflash_config.block_size (PR #17935); else top level
    refuses_windowed_trtllm: bool = False  # refuses TRTLLM draft attention for non-causal windows (PR #19159)
    draft_kv_manager: tuple[str, ...] = ALL_BACKENDS  # backends given a separate draft KV manager (PR #19410)
    warns_disaggregated: bool = False  # warns (only) on DFlash with disaggregated serving (PR #19352)
    tag: str = ""  # the tag's commit and date, where established
    capture: tuple[tuple[str, str], ...] = ()  # (target architecture, capture verdict): target-family issues
    notes: str = ""

    @property
    def image(self) -> str:
        return f"{IMAGE}:{self.version}"

    @property
    def context_recompute_tail(self) -> bool:
        return "context_recompute_tail" in self.dflash_keys

    def accepts(self, key: str) -> bool:
        return key in self.dflash_keys

    def separate_draft_kv(self, backend: str) -> bool:
        """Whether ``backend`` gets a managed draft KV cache besides the worker's context buffers."""
        return backend in self.draft_kv_manager


RELEASES: tuple[Release, ...] = (
    Release(
        "1.3.0rc26",
        ("VANILLA", "TRTLLM"),
        _DFLASH_1_3,
        block_size_from_dflash_config=True,
        tag="c295dd9, released 2026-09-09",
        notes="tag established (release page); #17935 merged before it (block_size read from dflash_config); "
        "#18155, #19159, #19352, #19410 merged after it (no DFlash2, a draft KV manager for every "
        "backend, no disaggregated warning); VANILLA | TRTLLM from the unversioned DFlashDecodingConfig "
        "page",
    ),
    Release(
        "1.3.0rc27",
        ALL_BACKENDS,
        _DFLASH_1_3,
        notes="FA4 draft attention (SM90) from its API page; its tag's date was not established, so "
        "whether it holds #17935, #18155, #19159, #19352, #19410 is unknown: the row assumes none "
        "(DFlash2 refused, a draft KV manager charged for every backend, block_size written at both "
        "places as for every release)",
    ),
    Release(
        "1.4.0rc1",
        ALL_BACKENDS,
        _DFLASH_1_4,
        refuses_token_budget=True,
        dflash2=True,
        block_size_from_dflash_config=True,
        refuses_windowed_trtllm=True,
        draft_kv_manager=("TRTLLM",),
        warns_disaggregated=True,
        tag="0372799, released 2026-10-22",
        notes="tag established (release page, notes citing PRs up to #20205); #17935, #18155, #19159, "
        "#19352, #19410 merged into main before it (its tree was not read: the snapshot is over the "
        "fetch limit); context_recompute_tail and the token-budget checks (API page); #16888 open "
        "(drafting stops above the largest key); whether AUTO resolves the gpt-oss MoE backend here "
        "is not confirmed (the 1.4.0rc4 guide says it does)",
    ),
)
KNOWN: dict[str, Release] = {r.version: r for r in RELEASES}
DEFAULT_RELEASE = RELEASES[-1].version  # the newest the project knows: a recipe's default


def get_release(version: str) -> Release:
    """The release row, or a RecipeError listing the ones the project knows."""
    try:
        return KNOWN[str(version)]
    except KeyError:
        raise RecipeError(
            f"trtllm.release {version!r} is not a TensorRT-LLM release this dflash-trt knows; "
            f"choose one of {', '.join(KNOWN)}"
        ) from None


def gpt_oss_moe_backend(sm: int) -> str:
    """``ModelConfig.resolve_moe_backend`` for GptOssForCausalLM at compute capability ``sm``."""
    if 100 <= sm < 120:
        return "TRTLLM"
    if 90 <= sm < 100:
        return "TRITON"
    return "CUTLASS"
