"""Build: recipe -> hardware rules -> shapes -> plan -> quantize -> TensorRT-LLM config -> bundle.

Modules: ``recipe`` (the typed YAML), ``hardware`` (the GPU catalog and precision rules),
``model_shapes`` (parameter counts from configs), ``plan`` (memory, TP, draft lengths),
``quantize`` (ModelOpt), ``trtllm`` (the LLM-API config and launch script), ``export``
(the standalone path's ONNX graphs), ``engines`` (their TensorRT engines and the shapes they
are built for), ``pipeline`` (the stages in order, written atomically). Other subpackages import from here, never from inside.
"""
from __future__ import annotations

from dflash_trt.build.recipe import Recipe
from dflash_trt.build.pipeline import BuildResult, build, check_bundle, default_out

__all__ = [
    "recipe",
    "pipeline",
    "BuildResult",
    "Recipe",
    "build",
    "check_bundle",
    "default_out",
]
