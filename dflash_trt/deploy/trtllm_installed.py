"""The targeted release's row, completed by field from the TensorRT-LLM installed here.

Invariant: where ``tensorrt_llm`` is installed on the machine that plans (a build host with the
GPU stack, or the serving machine itself) and its version is the targeted release or newer, a
feature its classes carry by field is planned with even when the release table
(:mod:`dflash_trt.plan.trtllm_releases`) lacks it for that release, and each one so used is
reported in one line. Nothing is taken away: a field the table has and the classes lack is the
judge's to refuse at serve time (:mod:`trtllm_judge`). Without an installed release, or with an
older one, the table's row stands as written.

Which field gives which feature (:data:`trtllm_judge.FEATURES`):

* ``DFlashDecodingConfig.attention_backend`` admitting ``FA4`` -> the FA4 draft attention;
* any ``DFlashDecodingConfig`` field -> a key the config may write (``context_recompute_tail``,
  ``skip_ctx_buffer_budget_check``, ...);
* ``DecodingBaseConfig.min_runtime_draft_len`` -> the draft-length floor (PR #16888): its default
  becomes the row's ``draft_len_floor`` (drafting never stops above the largest key).

Reading the classes imports ``tensorrt_llm.llmapi`` (seconds, and it initialises CUDA), so it
happens only where the package is found; ``DFLASH_IGNORE_INSTALLED_TRTLLM=1`` plans from the table alone.
"""

from __future__ import annotations

import logging
import os
from dataclasses import replace

from dflash_trt.deploy import trtllm_judge
from dflash_trt.plan import Release, get_release

ALL_BACKENDS = ("VANILLA", "TRTLLM", "FA4")  # trtllm_releases.ALL_BACKENDS: every draft attention, in its order

logger = logging.getLogger(__name__)


def with_features(row: Release, feats: dict, version: str) -> tuple[Release, list[str]]:
    """``row`` with the features ``feats`` (:func:`trtllm_judge.installed_features`) carry by field
    that the row lacks, and one line per feature so used."""
    used: list[str] = []
    update: dict = {}
    dflash = set(feats["fields"].get("DFlashDecodingConfig", ()))
    backends = tuple(b for b in ALL_BACKENDS if b in feats["attention_backends"] or b in row.attention_backends)
    for b in backends:
        if b not in row.attention_backends:
            used.append(f"the {b} draft attention (DFlashDecodingConfig.attention_backend admits it)")
    if backends != row.attention_backends:
        update["attention_backends"] = backends
    keys = dflash - row.dflash_keys - {"speculative_model_dir"}
    if keys:
        update["dflash_keys"] = row.dflash_keys | keys
        used += [f"speculative_config.{k} (a DFlashDecodingConfig field)" for k in sorted(keys)]
    floor = feats["defaults"].get("min_runtime_draft_len")
    if (
        isinstance(floor, int)
        and floor > row.draft_len_floor
        and "min_runtime_draft_len" in dflash | set(feats["fields"].get("DecodingBaseConfig", ()))
    ):
        update["draft_len_floor"] = floor
        used.append(f"the draft-length floor min_runtime_draft_len={floor} (PR #16888: drafting never stops)")
    lines = [
        f"TensorRT-LLM {version} installed here has {u}, which dflash-trt's table lacks for {row.version}: "
        "planned with it"
        for u in used
    ]
    return (replace(row, **update) if update else row), lines


def release_row(planned: str, warnings: list[str] | None = None) -> Release:
    """The row for ``planned``, completed from the installed release's classes where that applies
    (module docstring); each feature used appended to ``warnings``."""
    row = get_release(planned)
    if os.environ.get("DFLASH_IGNORE_INSTALLED_TRTLLM") == "1":
        return row
    have = trtllm_judge.installed_trtllm()
    if have is None:
        return row
    try:
        if trtllm_judge.version_key(have) < trtllm_judge.version_key(planned):
            return row
        feats = trtllm_judge.installed_features()
    except (ImportError, ValueError) as exc:  # a broken install or an unreadable version: the table stands
        logger.info("not reading TensorRT-LLM %s's classes: %s", have, exc)
        return row
    row, lines = with_features(row, feats, have)
    if warnings is not None:
        warnings += lines
    return row
