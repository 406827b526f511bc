"""TensorRT-LLM (PyTorch backend) config and launch command for a bundle.

TensorRT-LLM is never imported: the project writes the YAML that ``trtllm-serve --config``
reads and the exact command line, and checks its own output against :class:`LlmApiConfig`,
a schema of the documented LLM-API fields it emits (``extra="forbid"``: a key TensorRT-LLM
would not accept cannot slip into a config). Sources, per model below:

* ``TorchLlmArgs`` / ``LlmArgs``: https://nvidia.github.io/TensorRT-LLM/llm-api/reference.html
  (1.3.0rc27, 1.4.0rc4 pages), ``tensorrt_llm/llmapi/llm_args.py``.
* ``DFlashDecodingConfig``: https://nvidia.github.io/TensorRT-LLM/1.3.0rc27/llm-api/reference/DFlashDecodingConfig.html
  (``FA4`` from 1.3.0rc27; ``context_recompute_tail`` from 1.4.0rc1).
* ``trtllm-serve`` options: https://nvidia.github.io/TensorRT-LLM/commands/trtllm-serve/ (``--config``;
  ``--extra_llm_api_options`` is the older alias).

Paths in ``config.yaml`` are relative to the bundle directory; ``serve.sh`` runs from there.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from dflash_trt.errors import DFlashError


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CudaGraphConfig(_Strict):
    """``tensorrt_llm.llmapi.CudaGraphConfig``: ``batch_sizes``, ``max_batch_size``, ``enable_padding``."""

    enable_padding: bool = Field(False, description="Pad a batch up to the nearest captured size.")
    max_batch_size: int | None = Field(None, ge=1, description="Capture graphs for sizes up to this.")
    batch_sizes: list[int] | None = Field(None, description="Explicit batch sizes to capture.")

    @model_validator(mode="after")
    def _one(self):
        if self.max_batch_size is not None and self.batch_sizes is not None:
            raise ValueError("give cuda_graph_config.max_batch_size or batch_sizes, not both")
        return self


class KvCacheConfig(_Strict):
    """``tensorrt_llm.llmapi.KvCacheConfig``: ``dtype``, ``free_gpu_memory_fraction``, ``enable_block_reuse``."""

    dtype: Literal["auto", "fp8"] = Field("auto", description="KV cache dtype; auto follows the checkpoint.")
    free_gpu_memory_fraction: float | None = Field(None, gt=0, le=1, description="Share of free memory for KV blocks.")
    enable_block_reuse: bool = Field(True, description="Prefix-cache block reuse.")


class DFlashDecodingConfig(_Strict):
    """``tensorrt_llm.llmapi.DFlashDecodingConfig`` (fields and bounds as documented, 1.3.0rc27/1.4.0rc1)."""

    decoding_type: Literal["DFlash"] = "DFlash"
    max_draft_len: int = Field(ge=1, description="Draft tokens per step (<= drafter block - 1).")
    speculative_model: str = Field(description="Drafter directory (z-lab format) or hub id.")
    mask_token_id: int | None = Field(None, ge=0, description="Default: read from the drafter's config.")
    target_layer_ids: list[int] | None = Field(None, description="Default: read from the drafter's config.")
    attention_backend: Literal["VANILLA", "TRTLLM", "FA4"] = "VANILLA"
    max_concurrency: int | None = Field(None, gt=0, description="Speculation off above this batch size.")
    draft_len_schedule: dict[int, int] | None = Field(None, description="{batch size >=: draft len}; 0 = off.")
    acceptance_rate_window_size: int | None = Field(None, ge=0)
    acceptance_rate_threshold: float | None = Field(None, ge=0, le=1)
    use_rejection_sampling: bool = False
    context_recompute_tail: int | None = Field(None, ge=0, description="TensorRT-LLM >= 1.4.0rc1 only.")

    @model_validator(mode="after")
    def _schedule(self):
        if self.max_concurrency is not None and self.draft_len_schedule is not None:
            raise ValueError("give max_concurrency or draft_len_schedule, not both")
        s = self.draft_len_schedule
        if s is not None:
            # DecodingBaseConfig.validate_draft_len_schedule_and_sort
            if s.get(1) != self.max_draft_len:
                raise ValueError("draft_len_schedule must include {1: max_draft_len}")
            if any(b < 1 or n < 0 or n > self.max_draft_len for b, n in s.items()):
                raise ValueError("draft_len_schedule: batch >= 1 and 0 <= draft len <= max_draft_len")
        return self


class LlmApiConfig(_Strict):
    """The top-level ``TorchLlmArgs`` keys a DFlash bundle sets (``trtllm-serve --config`` YAML)."""

    tensor_parallel_size: int = Field(1, ge=1)
    moe_expert_parallel_size: int | None = Field(None, ge=1)
    max_batch_size: int = Field(ge=1)
    max_num_tokens: int = Field(ge=1)
    max_seq_len: int = Field(ge=1, description="Set it: it also sizes the drafter's context arena.")
    attn_backend: Literal["TRTLLM", "FLASHINFER", "VANILLA"] = "TRTLLM"
    disable_overlap_scheduler: bool = False
    trust_remote_code: Literal[False] = False
    cuda_graph_config: CudaGraphConfig | None = None
    kv_cache_config: KvCacheConfig
    speculative_config: DFlashDecodingConfig


def validate(data: dict) -> LlmApiConfig:
    """Check a config dict against the schema; a DFlashError names the first bad key."""
    try:
        return LlmApiConfig.model_validate(data)
    except ValidationError as exc:
        e = exc.errors()[0]
        loc = ".".join(str(x) for x in e["loc"])
        raise DFlashError(f"TensorRT-LLM config: {loc}: {e['msg']}") from None


def config(recipe, plan, drafter=None, drafter_rel: str = "./drafter") -> LlmApiConfig:
    """The LLM-API config for a recipe and its plan (validated); ``drafter`` a DraftShape."""
    s, sp = recipe.serving, recipe.speculative
    spec = {
        "decoding_type": "DFlash",
        "max_draft_len": plan.max_draft_len,
        "speculative_model": drafter_rel,
        "attention_backend": plan.attention_backend,
        "use_rejection_sampling": sp.use_rejection_sampling,
    }
    if drafter is not None:  # explicit, so the bundle is auditable without reading the drafter
        if drafter.mask_token_id is not None:
            spec["mask_token_id"] = drafter.mask_token_id
        spec["target_layer_ids"] = list(drafter.target_layer_ids)
    if plan.schedule == "max_concurrency":
        spec["max_concurrency"] = plan.max_concurrency
    elif plan.schedule == "draft_len_schedule":
        spec["draft_len_schedule"] = dict(plan.draft_len_schedule)
    if sp.context_recompute_tail is not None:
        spec["context_recompute_tail"] = sp.context_recompute_tail
    data = {
        "tensor_parallel_size": plan.tp,
        "max_batch_size": s.max_batch_size,
        "max_num_tokens": s.max_num_tokens,
        "max_seq_len": s.max_seq_len,
        "disable_overlap_scheduler": s.disable_overlap_scheduler,
        "kv_cache_config": {"dtype": plan.kv_cache, "free_gpu_memory_fraction": s.kv_cache_free_gpu_memory_fraction,
                            "enable_block_reuse": s.enable_block_reuse},
        "speculative_config": spec,
    }
    if plan.ep > 1:
        data["moe_expert_parallel_size"] = plan.ep
    if s.cuda_graphs:
        data["cuda_graph_config"] = {"enable_padding": True, "max_batch_size": s.max_batch_size}
    return validate(data)


def to_yaml(cfg: LlmApiConfig) -> str:
    data = cfg.model_dump(mode="json", exclude_none=True)
    spec = data.get("speculative_config") or {}
    if spec.get("draft_len_schedule"):  # JSON mode turns int keys into strings; YAML keeps ints
        spec["draft_len_schedule"] = {int(k): v for k, v in spec["draft_len_schedule"].items()}
    return yaml.safe_dump(data, sort_keys=False)


def serve_args(cfg: LlmApiConfig, host: str, port: int, target: str = "./target",
               config_path: str = "./trtllm/config.yaml") -> list[str]:
    """``trtllm-serve`` argv, run from the bundle directory."""
    args = ["trtllm-serve", target, "--config", config_path, "--host", host, "--port", str(port),
            "--tp_size", str(cfg.tensor_parallel_size)]
    if cfg.moe_expert_parallel_size:
        args += ["--ep_size", str(cfg.moe_expert_parallel_size)]
    args += ["--max_batch_size", str(cfg.max_batch_size), "--max_num_tokens", str(cfg.max_num_tokens),
             "--max_seq_len", str(cfg.max_seq_len)]
    if cfg.kv_cache_config.free_gpu_memory_fraction is not None:
        args += ["--kv_cache_free_gpu_memory_fraction", str(cfg.kv_cache_config.free_gpu_memory_fraction)]
    return args


def serve_script(cfg: LlmApiConfig, host: str, port: int) -> str:
    """A relocatable ``serve.sh``: cd to the bundle, exec trtllm-serve, extra args passed through."""
    cmd = " ".join(shlex.quote(a) for a in serve_args(cfg, host, port))
    return (
        "#!/usr/bin/env bash\n"
        "# Serve this DFlash bundle with TensorRT-LLM (>= 1.3.0rc; PyTorch backend).\n"
        "# Paths are relative to the bundle directory; extra arguments are passed to trtllm-serve.\n"
        "set -euo pipefail\n"
        'cd "$(dirname "${BASH_SOURCE[0]}")/.."\n'
        f'exec {cmd} "$@"\n'
    )


def write(out_dir: Path, cfg: LlmApiConfig, host: str, port: int) -> None:
    """Write ``config.yaml`` and ``serve.sh`` into ``out_dir`` (the bundle's ``trtllm/``)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.yaml").write_text(to_yaml(cfg))
    script = out_dir / "serve.sh"
    script.write_text(serve_script(cfg, host, port))
    script.chmod(0o755)


def load(bundle: Path) -> LlmApiConfig:
    """Read and validate a bundle's ``trtllm/config.yaml``."""
    return validate(yaml.safe_load((Path(bundle) / "trtllm" / "config.yaml").read_text()))
