"""A stand-in ``tensorrt_llm`` package that follows the real LLM-API contract, for the judge's tests.

What it mirrors (TensorRT-LLM's source; key names from the 1.4.0rc1 API reference,
``llm-api/reference/DFlashDecodingConfig.html`` and ``TorchLlmArgs``):

* ``tensorrt_llm/version.py`` with ``__version__`` (what serve.sh reads without importing);
* ``tensorrt_llm.llmapi.llm_args``: ``StrictBaseModel`` (pydantic, ``extra="forbid"``), the
  section classes, ``DecodingBaseConfig.from_dict`` dispatching on ``decoding_type``,
  ``TorchLlmArgs.from_kwargs``, and ``update_llm_args_with_extra_dict`` (which newer releases
  re-export from ``tensorrt_llm.llmapi.llm_utils``; ``old_layout`` leaves that module out);
* importing ``tensorrt_llm`` itself records it in ``IMPORTED`` (serve.sh's version read must not).

``drop`` removes fields (``"DFlashDecodingConfig.context_recompute_tail"``,
``"TorchLlmArgs.disable_mm_encoder"``): a release that no longer has a key. ``add`` adds or
replaces them (``{"DecodingBaseConfig.min_runtime_draft_len": "int = 1"}``: a release with the
draft-length floor of PR #16888). ``commit`` writes ``__git_commit__`` into ``version.py``.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

DFLASH_FIELDS = {  # DFlashDecodingConfig at 1.4.0rc1 (its API page), DecodingBaseConfig's included
    "max_draft_len": "int | None = Field(None, ge=0)",
    "max_total_draft_tokens": "int | None = None",
    "speculative_model": "str | None = None",
    "moe_backend": "str | None = None",
    "max_concurrency": "int | None = Field(None, gt=0)",
    "draft_len_schedule": "dict[int, int] | None = None",
    "load_format": "str | None = None",
    "acceptance_rate_window_size": "int | None = None",
    "acceptance_rate_threshold": "float | None = None",
    "use_rejection_sampling": "bool = False",
    "allow_advanced_sampling": "bool = False",
    "advanced_sampling_mode": "str = 'full'",
    "enable_penalty": "bool = False",
    "spec_dec_variant": "int | None = None",
    "mask_token_id": "int | None = None",
    "target_layer_ids": "list[int] | None = None",
    "context_recompute_tail": "int | None = 0",
    "decoding_type": "Literal['DFlash'] = 'DFlash'",
    "attention_backend": "Literal['VANILLA', 'TRTLLM', 'FA4'] = 'VANILLA'",
    "skip_ctx_buffer_budget_check": "bool = False",
}
LLM_ARGS_FIELDS = {  # TorchLlmArgs keys a DFlash bundle writes (and the disaggregated one)
    "model": "str",
    "tensor_parallel_size": "int = 1",
    "moe_expert_parallel_size": "int | None = None",
    "max_batch_size": "int | None = None",
    "max_num_tokens": "int | None = None",
    "max_seq_len": "int | None = None",
    "enable_chunked_prefill": "bool = False",
    "attn_backend": "str = 'TRTLLM'",
    "disable_overlap_scheduler": "bool = False",
    "trust_remote_code": "bool = False",
    "enable_iter_perf_stats": "bool = False",
    "cuda_graph_config": "CudaGraphConfig | None = Field(default_factory=CudaGraphConfig)",
    "moe_config": "MoeConfig | None = None",
    "kv_cache_config": "KvCacheConfig = Field(default_factory=KvCacheConfig)",
    "speculative_config": "DFlashDecodingConfig | None = None",
    "disable_mm_encoder": "bool = False",
    "cache_transceiver_config": "dict | None = None",
}
KV_FIELDS = {
    "dtype": "str = 'auto'",
    "free_gpu_memory_fraction": "float | None = None",
    "enable_block_reuse": "bool = True",
    "max_tokens": "int | None = None",
    "tokens_per_block": "int = 32",
    "mamba_ssm_cache_dtype": "Literal['auto', 'float16', 'bfloat16', 'float32'] = 'auto'",
}


def _fields(cls: str, fields: dict[str, str], drop: set[str], add: dict[str, str] | None = None) -> str:
    fields = {**fields, **{k.split(".", 1)[1]: v for k, v in (add or {}).items() if k.startswith(f"{cls}.")}}
    return "\n".join(f"    {k}: {v}" for k, v in fields.items() if f"{cls}.{k}" not in drop) or "    pass"


def write(
    root: Path,
    version: str,
    drop: tuple[str, ...] = (),
    old_layout: bool = False,
    add: dict[str, str] | None = None,
    commit: str | None = None,
) -> Path:
    """Write the package under ``root`` (a sys.path entry); returns ``root``."""
    pkg = root / "tensorrt_llm"
    (pkg / "llmapi").mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text("IMPORTED = True\n")
    (pkg / "version.py").write_text(
        f'__version__ = "{version}"\n' + (f'__git_commit__ = "{commit}"\n' if commit else "")
    )
    (pkg / "llmapi" / "__init__.py").write_text("from .llm_args import DFlashDecodingConfig, TorchLlmArgs\n")
    d = set(drop)
    (pkg / "llmapi" / "llm_args.py").write_text(
        textwrap.dedent("""\
        from __future__ import annotations
        from typing import Literal
        from pydantic import BaseModel, ConfigDict, Field


        class StrictBaseModel(BaseModel):
            model_config = ConfigDict(extra="forbid")


        class CudaGraphConfig(StrictBaseModel):
            batch_sizes: list[int] | None = None
            max_batch_size: int = Field(0, ge=0)
            enable_padding: bool = False


        class MoeConfig(StrictBaseModel):
            backend: str = "AUTO"


        class KvCacheConfig(StrictBaseModel):
        {kv}


        class DecodingBaseConfig(StrictBaseModel):
        {base}

            @classmethod
            def from_dict(cls, data: dict):
                kinds = {{"DFlash": DFlashDecodingConfig}}
                kind = data.get("decoding_type")
                if kind not in kinds:
                    raise ValueError(f"Invalid decoding type: {{kind}}")
                return kinds[kind](**data)


        class DFlashDecodingConfig(DecodingBaseConfig):
        {dflash}


        class TorchLlmArgs(StrictBaseModel):
        {args}

            @classmethod
            def from_kwargs(cls, **kwargs):
                return cls(**kwargs)


        def update_llm_args_with_extra_dict(llm_args, llm_args_dict, extra_llm_api_options=None):
            field_mapping = {{"kv_cache_config": KvCacheConfig, "speculative_config": DecodingBaseConfig,
                             "moe_config": MoeConfig}}
            for name, kind in field_mapping.items():
                if name in llm_args_dict:
                    if name == "speculative_config":
                        llm_args_dict[name] = kind.from_dict(llm_args_dict[name])
                    else:
                        llm_args_dict[name] = kind(**llm_args_dict[name])
            return llm_args | llm_args_dict
        """).format(
            kv=_fields("KvCacheConfig", KV_FIELDS, d, add),
            base=_fields("DecodingBaseConfig", {}, d, add),
            dflash=_fields("DFlashDecodingConfig", DFLASH_FIELDS, d, add),
            args=_fields("TorchLlmArgs", LLM_ARGS_FIELDS, d, add),
        )
    )
    utils = pkg / "llmapi" / "llm_utils.py"
    if old_layout:
        utils.unlink(missing_ok=True)
    else:
        utils.write_text("from .llm_args import update_llm_args_with_extra_dict  # noqa: F401\n")
    return root
