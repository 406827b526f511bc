"""Plan: what a recipe implies, from configs alone (no torch, no writes).

Modules: ``recipe_model`` / ``recipe`` (the typed recipe; its YAML and ``--set``), ``hardware``
(the GPU catalog and precision rules), ``family_shapes`` / ``model_shapes`` (parameter, KV and
state bytes read from configs),
``published`` (which fields a config-only recipe still lacks), ``trtllm_releases`` /
``trtllm_rules`` / ``trtllm_family`` / ``trtllm_dflash2`` (TensorRT-LLM's releases, the rules each one
applies, and each drafter family's),
``schedule`` (draft lengths as TensorRT-LLM reads them), ``schedule_vllm`` (converted for vLLM),
``mtp`` (the target's own MTP heads as the other arm), ``uncertainty`` / ``calibrate_loo`` (the
ranges from leave-one-out errors), ``acceptance`` (τ from a per-position
rate), ``perf_model`` (the step model the speedups come from), ``perf_fit`` (its constants fitted
on measurements), ``calibrate`` (refitted on yours), ``memory_model`` (memory per GPU, the TP
that fits), ``deployment`` (draft lengths: the plan itself, a typed :class:`Plan` whose models
``ingest`` defines beside the manifest that stores them; ``plan_schema`` is its JSON Schema),
``bundle_manifest`` (that manifest with its recipe typed: what ``build`` writes, and its reader).

Importing this package imports neither torch nor transformers (``tests/plan/test_face.py``).
Other subpackages import the names below, never the modules inside.
"""

from __future__ import annotations

from dflash_trt.ingest import Plan, plan_schema
from dflash_trt.plan.acceptance import expected_tau, fit_alpha
from dflash_trt.plan.bundle_manifest import BundleManifest, read_bundle_manifest
from dflash_trt.plan.calibrate import bundle_deployment, calibration_from_files, cases_from_bench, refit
from dflash_trt.plan.calibrate_loo import calibration_errors
from dflash_trt.plan.deployment import PLANNING_CONTEXT, make_plan, predicted, step_model
from dflash_trt.plan.hardware import GPU, PRECISIONS, check_precision, get_gpu
from dflash_trt.plan.memory_model import Deployment
from dflash_trt.plan.model_shapes import DraftShape, TargetShape, quant_precision, read_sizes
from dflash_trt.plan.mtp import arm_winner, mtp_layers, mtp_layers_of
from dflash_trt.plan.perf_model import Acceptance, Calibration, shipped_calibration, stack_for
from dflash_trt.plan.published import lacking
from dflash_trt.plan.recipe import (
    MAX_TOKENS,
    FieldValue,
    PrecisionSpec,
    Recipe,
    SpeculativeSpec,
    apply_overrides,
    bundled_recipes,
    load_recipe,
    recipe_from_dict,
)
from dflash_trt.plan.recipe_status import Status, recipe_status, unpinned_drafter
from dflash_trt.plan.schedule import TRAP as ZERO_DRAFT_TRAP
from dflash_trt.plan.schedule import batch_grid, check_schedule, choose_schedule, schedule_runs, zero_draft_rule
from dflash_trt.plan.schedule_vllm import trtllm_to_vllm, vllm_lengths, vllm_to_trtllm
from dflash_trt.plan.silicon import silicon_tables
from dflash_trt.plan.trtllm_capture import CAPTURES as TRTLLM_CAPTURES
from dflash_trt.plan.trtllm_capture import capture_missing, capture_supported
from dflash_trt.plan.trtllm_dflash2 import DFlash2Rules
from dflash_trt.plan.trtllm_family import (
    TrtllmRules,
    check_drafter,
    drafter_attention_backend,
    register_trtllm_rules,
    rules_for,
)
from dflash_trt.plan.trtllm_releases import DEFAULT_RELEASE, Release, get_release
from dflash_trt.plan.trtllm_releases import IMAGE as TRTLLM_IMAGE
from dflash_trt.plan.trtllm_releases import KNOWN as KNOWN_RELEASES
from dflash_trt.plan.trtllm_rules import (
    ignored_drafter_keys,
    refuse_disaggregated,
    refuse_quantized_drafter,
    target_attn_backend,
    windowed_non_causal,
)

__all__ = [
    "Acceptance",
    "BundleManifest",
    "Calibration",
    "DEFAULT_RELEASE",
    "DFlash2Rules",
    "Deployment",
    "DraftShape",
    "FieldValue",
    "MAX_TOKENS",
    "GPU",
    "KNOWN_RELEASES",
    "PLANNING_CONTEXT",
    "PRECISIONS",
    "Plan",
    "PrecisionSpec",
    "Recipe",
    "Release",
    "SpeculativeSpec",
    "TRTLLM_IMAGE",
    "TrtllmRules",
    "TargetShape",
    "batch_grid",
    "apply_overrides",
    "arm_winner",
    "bundle_deployment",
    "bundled_recipes",
    "calibration_errors",
    "calibration_from_files",
    "cases_from_bench",
    "check_drafter",
    "check_precision",
    "check_schedule",
    "choose_schedule",
    "drafter_attention_backend",
    "expected_tau",
    "fit_alpha",
    "get_gpu",
    "get_release",
    "ignored_drafter_keys",
    "load_recipe",
    "make_plan",
    "mtp_layers",
    "mtp_layers_of",
    "plan_schema",
    "predicted",
    "quant_precision",
    "read_bundle_manifest",
    "read_sizes",
    "recipe_from_dict",
    "refit",
    "register_trtllm_rules",
    "rules_for",
    "refuse_disaggregated",
    "refuse_quantized_drafter",
    "schedule_runs",
    "shipped_calibration",
    "silicon_tables",
    "stack_for",
    "step_model",
    "target_attn_backend",
    "trtllm_to_vllm",
    "vllm_lengths",
    "vllm_to_trtllm",
    "windowed_non_causal",
    "ZERO_DRAFT_TRAP",
    "zero_draft_rule",
    "TRTLLM_CAPTURES",
    "Status",
    "capture_missing",
    "capture_supported",
    "lacking",
    "recipe_status",
    "unpinned_drafter",
]
