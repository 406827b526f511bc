"""Ingest: model references to local directories, checkpoints read and checked from disk.

Stage order: ``resolve`` (embedded / local / hub) -> ``files`` (the one safetensors header
reader, shard indexes, hashes) -> ``formats`` (every published drafter format, recognised by
``format_detect``, normalised to z-lab) -> ``drafter`` / ``target`` (specs read from configs and
headers; weights loaded only on request) -> ``compat`` (does a drafter belong to a target) ->
``pair`` (:class:`PairSpec`: the pair read once, what every later stage takes) -> ``bundle`` (the
layout, typed manifest and check of what ``build`` writes and ``runtime`` / ``serve`` / ``bench``
read), and ``plan_record`` (the typed plan that manifest holds; ``dflash_trt.plan`` computes and
exports it).

``files`` also holds the tables every stage shares: the one dtype table (``DTYPES``, with
``DTYPE_BITS`` / ``TORCH_NAMES`` / ``FLOAT_DTYPES`` / ``RUNTIME_DTYPES`` read from it) and the one
list of tokenizer files (``TOKENIZER_FILES``).

Other subpackages import from here, never from the modules inside.
"""

from __future__ import annotations

from dflash_trt.ingest.bundle import (
    BUNDLE_FORMAT,
    HASHED_FORMATS,
    Bundle,
    DrafterInfo,
    EngineProfile,
    GraphsInfo,
    Layout,
    Manifest,
    ServeInfo,
    TrtllmInfo,
    bundle_hashes,
    check_files,
    check_format,
    read_manifest,
    write_manifest,
)
from dflash_trt.ingest.bundle_check import LoadCheck, check_bundle, check_fields, check_paths, open_bundle
from dflash_trt.ingest.chat import chat_mismatch, serving_chat, trained_chat
from dflash_trt.ingest.compat import PairReport, check_pair, validate_pair
from dflash_trt.ingest.drafter import (
    DrafterSpec,
    check_pair_runtime,
    is_drafter,
    load_drafter,
    read_drafter,
    write_zlab,
)
from dflash_trt.ingest.families import FAMILIES as TARGET_FAMILIES
from dflash_trt.ingest.families import TargetFamily, target_family_of
from dflash_trt.ingest.files import (
    DTYPE_BITS,
    DTYPES,
    FLOAT_DTYPES,
    RUNTIME_DTYPES,
    TOKENIZER_FILES,
    TORCH_NAMES,
    TensorInfo,
    WeightSet,
    check_links,
    checkpoint_file,
    read_header,
    read_headers,
    scan,
    sha256_files,
    tokenizer_files,
    torch_dtype,
)
from dflash_trt.ingest.format_guards import GGUF_ONLY, refuse_gguf, refused_id, trtllm_refusal
from dflash_trt.ingest.pair import PairSpec, read_pair
from dflash_trt.ingest.plan_record import (
    Arms,
    CurvePoint,
    DraftRun,
    MeasuredArm,
    Plan,
    PlanMemory,
    PlannedMtp,
    Prediction,
    Tuned,
    TunedLevel,
    VllmPlan,
    plan_schema,
)
from dflash_trt.ingest.resolve import EMBEDDED_PREFIX, embedded_dir, open_dir, read_json, resolve
from dflash_trt.ingest.target import TargetSpec, read_modelopt_quant_config, read_target, target_quantization

__all__ = [
    "Arms",
    "CurvePoint",
    "DraftRun",
    "MeasuredArm",
    "Plan",
    "PlanMemory",
    "PlannedMtp",
    "Prediction",
    "Tuned",
    "TunedLevel",
    "VllmPlan",
    "plan_schema",
    "TARGET_FAMILIES",
    "TargetFamily",
    "target_family_of",
    "chat_mismatch",
    "serving_chat",
    "trained_chat",
    "BUNDLE_FORMAT",
    "Bundle",
    "DTYPES",
    "DTYPE_BITS",
    "DrafterInfo",
    "DrafterSpec",
    "EngineProfile",
    "GraphsInfo",
    "HASHED_FORMATS",
    "EMBEDDED_PREFIX",
    "FLOAT_DTYPES",
    "Layout",
    "LoadCheck",
    "Manifest",
    "PairReport",
    "PairSpec",
    "check_pair",
    "read_pair",
    "RUNTIME_DTYPES",
    "ServeInfo",
    "TOKENIZER_FILES",
    "TORCH_NAMES",
    "TargetSpec",
    "TensorInfo",
    "TrtllmInfo",
    "WeightSet",
    "bundle_hashes",
    "check_bundle",
    "check_fields",
    "check_paths",
    "check_links",
    "checkpoint_file",
    "check_files",
    "check_format",
    "check_pair_runtime",
    "embedded_dir",
    "is_drafter",
    "load_drafter",
    "open_bundle",
    "open_dir",
    "read_drafter",
    "GGUF_ONLY",
    "refuse_gguf",
    "refused_id",
    "trtllm_refusal",
    "read_header",
    "read_headers",
    "read_json",
    "read_manifest",
    "read_modelopt_quant_config",
    "read_target",
    "resolve",
    "scan",
    "sha256_files",
    "target_quantization",
    "tokenizer_files",
    "torch_dtype",
    "validate_pair",
    "write_manifest",
    "write_zlab",
]
