"""Build: recipe -> hardware rules -> shapes -> plan -> quantize -> TensorRT-LLM config -> bundle.

Modules: ``recipe`` (the typed YAML), ``hardware`` (the GPU catalog and precision rules),
``model_shapes`` (parameter counts from configs), ``plan`` (memory, TP, draft lengths),
``quantize`` (ModelOpt), ``trtllm`` (the LLM-API config and launch script), ``export``
(the standalone path's ONNX graphs; ``export_dflash2`` a DFlash2 drafter's, ``graphs`` which
drafter graph a bundle gets), ``engines`` (their TensorRT engines and the shapes they
are built for), ``pipeline`` (the stages in order, written atomically), ``perf_model`` (the
step model the plan's speedups come from), ``perf_fit`` (its constants fitted on measurements),
``calibrate`` (refitted on yours), ``schedule`` (draft lengths as TensorRT-LLM reads them).
Other subpackages import from here, never from inside.
"""
from __future__ import annotations

from dflash_trt.build.recipe import Recipe
from dflash_trt.build.pipeline import BuildResult, build, check_bundle, default_out

__all__ = [
    "recipe",
    "pipeline",
    "calibrate",
    "hardware",
    "perf_fit",
    "perf_model",
    "plan",
    "schedule",
    "trtllm",
    "trtllm_releases",
    "BuildResult",
    "Recipe",
    "build",
    "check_bundle",
    "default_out",
]
