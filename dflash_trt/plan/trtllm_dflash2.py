"""TensorRT-LLM and DFlash2 drafters: which releases serve them, and what their config must say.

What TensorRT-LLM's source says (``main``, September 2026):

* DFlash2 runs on the ordinary DFlash path: ``DFlashForCausalLM``
  (``tensorrt_llm/_torch/models/modeling_dflash.py``) recognises the drafter by its architecture
  (``_is_dflash2_architecture``: the "dflash2" stem of ``DFlash2DraftModel``), wraps every
  sublayer in ``DFlash2BlockConv`` and scores candidates with ``DFlash2CandidateSelector``
  (``dflash2_walk_candidate_paths``); ``select_candidate_path`` rewrites the block logits to
  the walk's scores on its candidates (-inf elsewhere), so greedy and rejection-sampling
  acceptance both read the proposal. Pinned by
  ``tests/unittest/_torch/speculative/hw_agnostic/test_dflash2_semantics.py``.
* So ``speculative_config`` is the ordinary ``DFlashDecodingConfig`` (``decoding_type: DFlash``,
  ``speculative_model``, ``max_draft_len`` <= block - 1, ``mask_token_id``,
  ``target_layer_ids``): no DFlash2 key exists or is needed; the drafter's ``config.json``
  (architecture, the four ``dflash_config`` sizes, top-level ``is_causal``) carries the rest.
* ``_validate_dflash2_config`` refuses a partial recipe (any of the four sizes missing) and
  ``selector_top_k`` < 2 ("no candidates to choose between").
* ``validate_block_attention_windows`` refuses the TRTLLM draft-attention backend for a layer
  that is non-causal inside a finite sliding window, as every layer of the published DFlash2
  drafters is (``is_causal: false``, sliding 2048): flashinfer's trtllm-gen kernel has no such
  mode. VANILLA and FA4 pass both window bounds (PR #19159, merged 2026-09-14).
* ``DFlashWorker.set_draft_model`` (``tensorrt_llm/_torch/speculative/dflash.py``) refuses a
  DFlash2 drafter with a reduced draft vocabulary (``d2t``): its codebooks index the full one.

Releases: the DFlash2 drafters were published on 2026-08-18 and the path above is on ``main``
from early September 2026. Which releases serve DFlash2 is the ``dflash2`` column of
``trtllm_releases.Release`` (one table for every per-release fact): True for 1.4.0rc1 only,
inferred from dates (the code is not read at its tag); the 1.3.0 candidates are refused.
"""

from __future__ import annotations

from dflash_trt.errors import RecipeError
from dflash_trt.plan import trtllm_releases

#: Draft-attention backends that run a non-causal sliding window (``validate_block_attention_windows``).
WINDOWED_NON_CAUSAL_BACKENDS = ("VANILLA", "FA4")


def serves(release: str) -> bool:
    """Whether TensorRT-LLM ``release`` serves DFlash2 drafters (its row's ``dflash2``; unknown: no)."""
    row = trtllm_releases.KNOWN.get(str(release))
    return row is not None and row.dflash2


def serving_releases() -> list[str]:
    """The releases whose ``dflash2`` column is True, in the table's order."""
    return [r.version for r in trtllm_releases.RELEASES if r.dflash2]


def non_causal_window(cfg) -> bool:
    """Whether any layer of drafter config ``cfg`` is windowed and non-causal (the published DFlash2 rule)."""
    return any(cfg.layer_window(i) is not None and not cfg.layer_causal(i) for i in range(cfg.num_hidden_layers))


def check(cfg, release: str) -> None:
    """A DFlash2 drafter config ``cfg`` (``DrafterConfig``) served by TensorRT-LLM ``release``, or
    a one-line RecipeError; plain DFlash drafters pass untouched."""
    if not cfg.is_dflash2:
        return
    if not serves(release):
        raise RecipeError(f"TensorRT-LLM {release} does not serve DFlash2 drafters (DFlash2DraftModel); set "
                          f"trtllm.release to {' or '.join(serving_releases())}, "
                          "or run the pair on the reference runtime")
    if cfg.selector_top_k < 2:
        raise RecipeError(f"TensorRT-LLM refuses a DFlash2 selector_top_k of {cfg.selector_top_k} (no candidates "
                          "to choose between); the drafter needs selector_top_k >= 2")


def attention_backend(requested: str, cfg, sm: int, release_backends: tuple[str, ...]) -> str:
    """``speculative.attention_backend`` for a DFlash2 drafter whose layers are non-causal inside a
    window: TRTLLM refused in one line; ``auto`` becomes FA4 on SM90 where the release has it,
    else VANILLA. Any other drafter, and an explicit VANILLA / FA4, pass as requested."""
    if not (cfg.is_dflash2 and non_causal_window(cfg)):
        return requested
    if requested == "TRTLLM":
        raise RecipeError("speculative.attention_backend TRTLLM cannot run this DFlash2 drafter's non-causal sliding "
                          "window (TensorRT-LLM refuses it); use VANILLA or FA4 (SM90), or leave it auto")
    if requested == "auto":
        return "FA4" if sm == 90 and "FA4" in release_backends else "VANILLA"
    return requested
