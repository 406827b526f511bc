"""Deploy: a recipe becomes a bundle, atomically.

Modules: ``pipeline`` (resolve -> validate -> quantize -> plan -> emit, in order, written to a
temporary directory and swapped in at the end), ``output`` (that swap), ``quantize`` (ModelOpt),
``drafter`` (the drafter as shipped: z-lab layout, target layers sorted), ``trtllm_config`` (the
LLM-API config TensorRT-LLM reads, checked against the release's schema), ``trtllm_judge`` (the
installed TensorRT-LLM's own classes judge that config; copied into every bundle) and ``serve_sh``
(the launch script that checks the GPU machine before it serves).

Other subpackages import the names below, never the modules inside.
"""
from __future__ import annotations

from dflash_trt.deploy.output import lock, recover, replace_files
from dflash_trt.deploy.pipeline import BuildResult, build, check_bundle, default_out, make_plan, resolve
from dflash_trt.deploy.trtllm_config import LlmApiConfig, speculation_gate
from dflash_trt.deploy.trtllm_config import load as load_trtllm_config
from dflash_trt.deploy.trtllm_config import to_yaml as trtllm_yaml
from dflash_trt.deploy.trtllm_config import validate as validate_trtllm_config
from dflash_trt.deploy.trtllm_judge import check as judge_trtllm_config
from dflash_trt.deploy.trtllm_judge import installed_version as installed_trtllm

__all__ = [
    "BuildResult",
    "LlmApiConfig",
    "build",
    "check_bundle",
    "default_out",
    "installed_trtllm",
    "judge_trtllm_config",
    "load_trtllm_config",
    "lock",
    "make_plan",
    "recover",
    "replace_files",
    "resolve",
    "speculation_gate",
    "trtllm_yaml",
    "validate_trtllm_config",
]
