"""Deploy: a recipe becomes a bundle, atomically.

Modules: ``resolve`` (the recipe's pair read once, checked and planned), ``pipeline`` (resolve ->
validate -> quantize -> plan -> emit, in order, written to a temporary directory and swapped in at
the end), ``output`` (that swap), ``quantize`` (ModelOpt),
``drafter`` (the drafter as shipped: z-lab layout, target layers sorted), ``trtllm_config`` (the
LLM-API config TensorRT-LLM reads, checked against the release's schema:
``trtllm_schema``), ``trtllm_judge`` (the
installed TensorRT-LLM's own classes judge that config; copied into every bundle) and ``serve_sh``
(the launch script that checks the GPU machine before it serves).

Other subpackages import the names below, never the modules inside.
"""

from __future__ import annotations

from dflash_trt.deploy.output import lock, recover, replace_files
from dflash_trt.deploy.pipeline import BuildResult, build, check_trtllm_bundle, default_out
from dflash_trt.deploy.resolve import plan_resolved, resolve_recipe
from dflash_trt.deploy.trtllm_config import load_trtllm_config, trtllm_yaml
from dflash_trt.deploy.trtllm_judge import installed_trtllm, judge_trtllm_config
from dflash_trt.deploy.trtllm_schema import LlmApiConfig, speculation_gate, validate_trtllm_config

__all__ = [
    "BuildResult",
    "LlmApiConfig",
    "build",
    "check_trtllm_bundle",
    "default_out",
    "installed_trtllm",
    "judge_trtllm_config",
    "load_trtllm_config",
    "lock",
    "plan_resolved",
    "recover",
    "replace_files",
    "resolve_recipe",
    "speculation_gate",
    "trtllm_yaml",
    "validate_trtllm_config",
]
