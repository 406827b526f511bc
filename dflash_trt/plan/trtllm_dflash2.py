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
* Every layer of the published DFlash2 drafters is non-causal inside a sliding window
  (``is_causal: false``, sliding 2048), so TRTLLM draft attention is refused for them; that rule
  is keyed on the layers, not the family: ``trtllm_rules.draft_attention_backend`` (PR #19159).
* A reduced draft vocabulary (``d2t``) is refused at model load time (PR #19159 moved the check
  there from ``DFlashWorker.set_draft_model``): DFlash2 codebooks index the full vocabulary.

The rules are :class:`DFlash2Rules` (``trtllm_family`` documents the hook).

Releases: the ``dflash2`` column of ``trtllm_releases.Release`` (one table for every per-release
fact): PR #18155 (merged 2026-09-13) is in the 1.4.0rc1 tag and not in 1.3.0rc26 (established
from the tags' release pages); 1.3.0rc27's is not established, so it is refused.
"""

from __future__ import annotations

from dflash_trt.errors import RecipeError
from dflash_trt.model import DFlash2Family
from dflash_trt.plan import trtllm_releases
from dflash_trt.plan.trtllm_family import TrtllmRules, register_trtllm_rules


def serves(release: str) -> bool:
    """Whether TensorRT-LLM ``release`` serves DFlash2 drafters (its row's ``dflash2``; unknown: no)."""
    row = trtllm_releases.KNOWN.get(str(release))
    return row is not None and row.dflash2


def serving_releases() -> list[str]:
    """The releases whose ``dflash2`` column is True, in the table's order."""
    return [r.version for r in trtllm_releases.RELEASES if r.dflash2]


class DFlash2Rules(TrtllmRules):
    """DFlash2: the releases of the table's ``dflash2`` column. Its draft attention follows the
    layer rule every family shares (``trtllm_rules.draft_attention_backend``): no override here."""

    def serves(self, release):
        return serves(release)

    def check(self, cfg, release):
        """Served by ``release`` (``_is_dflash2_architecture``), with candidates to choose between
        (``_validate_dflash2_config``), or a one-line RecipeError."""
        super().check(cfg, release)
        if cfg.selector_top_k < 2:
            raise RecipeError(
                f"TensorRT-LLM refuses a DFlash2 selector_top_k of {cfg.selector_top_k} (no candidates "
                "to choose between); the drafter needs selector_top_k >= 2"
            )


register_trtllm_rules(DFlash2Family, DFlash2Rules)
