"""TensorRT-LLM (PyTorch backend) config and launch command for a bundle.

TensorRT-LLM is never imported: the project writes the YAML that ``trtllm-serve --config``
reads and the exact command line, and checks its own output against :class:`LlmApiConfig`
(:mod:`trtllm_schema`: the models and the checks on a config dict), a schema mirroring the
TensorRT-LLM fields it models (``extra="forbid"``: a key TensorRT-LLM would not accept cannot slip
into a config; what TensorRT-LLM accepts, aliases and all, is not refused). Which keys the targeted
release has is :mod:`trtllm_releases`' table, checked by :func:`validate_trtllm_config`. Sources, per model below:

* ``TorchLlmArgs`` / ``BaseLlmArgs`` / ``KvCacheConfig`` / ``CudaGraphConfig`` / ``MoeConfig`` /
  ``DecodingBaseConfig`` / ``DFlashDecodingConfig``: ``tensorrt_llm/llmapi/llm_args.py`` and the
  per-release API reference (https://nvidia.github.io/TensorRT-LLM/<release>/llm-api/reference.html).
  ``cuda_graph_config`` defaults to a ``CudaGraphConfig()`` (graphs on): off is an explicit
  ``null``. ``speculative_model_dir`` is an alias of ``speculative_model``.
* ``trtllm-serve`` options: ``tensorrt_llm/commands/serve.py`` (``--config``, with
  ``--extra_llm_api_options`` the older alias).

* curated-config keys (``examples/configs/curated/``): ``disable_mm_encoder: true`` for text-only
  use of a Qwen VLM target (the vision tower is not built: ``TorchLlmArgs.disable_mm_encoder``,
  honoured by the Qwen3-VL / Qwen3.5 models) and ``kv_cache_config.mamba_ssm_cache_dtype`` for
  hybrid targets (Gated DeltaNet / Mamba states; ``KvCacheConfig.mamba_ssm_cache_dtype``,
  ``auto | float16 | bfloat16 | float32``): written as the target's own state dtype, float32
  unless its config says otherwise.
* disaggregated serving (``cache_transceiver_config``) is refused in one line: the generation
  server drafts without the prompt and acceptance collapses; TensorRT-LLM only warns (PR #19352).

Paths in ``config.yaml`` are relative to the bundle directory; ``serve.sh`` (:mod:`serve_sh`)
runs from there, after ``judge.py`` (:mod:`trtllm_judge`, copied verbatim) has let the installed
release's own LLM-API classes judge the config."""

from __future__ import annotations

import shlex
from pathlib import Path

import yaml

from dflash_trt.deploy import serve_sh, trtllm_installed, trtllm_judge
from dflash_trt.deploy.trtllm_schema import (
    DFlashDecodingConfig,  # noqa: F401 - read through this module as before the split
    LlmApiConfig,
    speculation_gate,  # noqa: F401 - read through this module as before the split
    validate_trtllm_config,
)
from dflash_trt.errors import DFlashError, RecipeError
from dflash_trt.plan import target_attn_backend

DRAFTER_REL = "./drafter"
MTP_CONFIG = "config.mtp.yaml"


def check_layer_ids(ids: list[int], zlab_ids: list[int]) -> None:
    """``speculative_config.target_layer_ids`` are z-lab ids: TensorRT-LLM captures the hidden state
    after decoder layer i, 0-based (``tensorrt_llm/_torch/speculative/dflash.py``, DFlashSpecMetadata).
    speculators' ``aux_hidden_state_layer_ids`` are ``output_hidden_states`` indices, one higher: passed
    straight through, every capture lands one layer late and acceptance collapses without an error."""
    ids, zlab = sorted(ids), sorted(zlab_ids)
    if ids == zlab:
        return
    if ids == [i + 1 for i in zlab]:
        raise DFlashError(
            f"TensorRT-LLM config: target_layer_ids {ids} are the drafter's speculators ids "
            f"(output_hidden_states, +1); TensorRT-LLM reads z-lab ids {zlab}"
        )
    raise DFlashError(f"TensorRT-LLM config: target_layer_ids {ids} are not the drafter's {zlab}")


def _speculative(recipe, plan, drafter) -> dict:
    sp = recipe.speculative
    spec = {
        "decoding_type": "DFlash",
        "max_draft_len": plan.max_draft_len,
        "speculative_model": DRAFTER_REL,
        "attention_backend": plan.attention_backend,
        "use_rejection_sampling": sp.use_rejection_sampling,
    }
    if drafter is not None:  # explicit, so the bundle is auditable without reading the drafter
        if drafter.mask_token_id is not None:
            spec["mask_token_id"] = drafter.mask_token_id
        # the bundle's drafter has them ascending (bundle_drafter): TensorRT-LLM sorts the captured layers
        spec["target_layer_ids"] = sorted(drafter.target_layer_ids)
        check_layer_ids(spec["target_layer_ids"], drafter.target_layer_ids)
    if plan.schedule == "max_concurrency":
        spec["max_concurrency"] = plan.max_concurrency
    elif plan.schedule == "draft_len_schedule":
        spec["draft_len_schedule"] = dict(plan.draft_len_schedule)
    if plan.context_recompute_tail is not None:
        spec["context_recompute_tail"] = plan.context_recompute_tail
    return spec


def _mtp(plan) -> dict:
    if not plan.mtp:
        raise RecipeError("the target's config declares no MTP layers: there is no MTP arm to write")
    return {"decoding_type": "MTP", "num_nextn_predict_layers": plan.mtp.num_nextn_predict_layers}


def _curated(data: dict, target) -> None:
    """The curated configs' keys for a VLM target served text-only and a hybrid target
    (``target`` a TargetShape; None: neither)."""
    if target is None:
        return
    if getattr(target, "vision_params", 0):
        data["disable_mm_encoder"] = True
    states = getattr(target, "state_groups", ())
    if states:
        ssm = {4: "float32", 2: "bfloat16"}.get(getattr(states[0], "recurrent_bytes", 4), "float32")
        data["kv_cache_config"]["mamba_ssm_cache_dtype"] = ssm


def config(recipe, plan, drafter=None, target=None, arm: str = "dflash") -> LlmApiConfig:
    """The LLM-API config for a recipe and its plan (validated for the plan's release);
    ``drafter`` a DraftShape, ``target`` a TargetShape (for the curated VLM / hybrid keys);
    ``arm="mtp"``: the same deployment drafting with the target's own MTP layers instead
    (``plan.mtp``), what users compare DFlash with."""
    s = recipe.serving
    # the plan's sizes (lowered from defaults that did not fit: plan.sized) and its chosen fraction
    batch = getattr(plan, "max_batch_size", 0) or s.max_batch_size
    fraction = getattr(plan, "kv_cache_free_gpu_memory_fraction", None) or s.kv_cache_free_gpu_memory_fraction
    data = {
        "tensor_parallel_size": plan.tp,
        "max_batch_size": batch,
        "max_num_tokens": plan.max_num_tokens or s.max_num_tokens,
        "max_seq_len": getattr(plan, "max_seq_len", 0) or s.max_seq_len,
        "enable_chunked_prefill": plan.enable_chunked_prefill,
        "disable_overlap_scheduler": s.disable_overlap_scheduler,
        "enable_iter_perf_stats": s.iter_perf_stats,
        # BaseLlmArgs: CUDA graphs are on unless the config says cuda_graph_config: null
        "cuda_graph_config": {"enable_padding": True, "max_batch_size": batch} if s.cuda_graphs else None,
        "kv_cache_config": {
            "dtype": plan.kv_cache,
            "free_gpu_memory_fraction": fraction,
            "enable_block_reuse": s.enable_block_reuse,
        },
        "speculative_config": _speculative(recipe, plan, drafter) if arm == "dflash" else _mtp(plan),
    }
    if arm == "dflash":  # explicit: a head_dim of 256 (Gemma-4) would auto-select FlashInfer
        data["attn_backend"] = target_attn_backend(None)
    if plan.ep > 1:
        data["moe_expert_parallel_size"] = plan.ep
    if plan.moe_backend:
        data["moe_config"] = {"backend": plan.moe_backend}
    _curated(data, target)
    return validate_trtllm_config(data, trtllm_installed.release_row(plan.trtllm_release))


def trtllm_yaml(cfg: LlmApiConfig, release: str | None = None) -> str:
    """The YAML ``trtllm-serve --config`` reads: the keys the config sets, no defaults filled
    in (a release may not have a key), so ``cuda_graph_config: null`` (graphs off) stays."""
    data = cfg.model_dump(mode="json", exclude_unset=True)
    spec = data.get("speculative_config") or {}
    if spec.get("draft_len_schedule"):  # JSON mode turns int keys into strings; YAML keeps ints
        spec["draft_len_schedule"] = {int(k): v for k, v in spec["draft_len_schedule"].items()}
    head = (
        f"# TensorRT-LLM {release} LLM-API config for a dflash-trt bundle (trtllm-serve --config)\n" if release else ""
    )
    return head + yaml.safe_dump(data, sort_keys=False)


def serve_args(
    cfg: LlmApiConfig, host: str, port: int, target: str = "./target", config_path: str = "./trtllm/config.yaml"
) -> list[str]:
    """``trtllm-serve`` argv, run from the bundle directory."""
    args = [
        "trtllm-serve",
        target,
        "--config",
        config_path,
        "--host",
        host,
        "--port",
        str(port),
        "--tp_size",
        str(cfg.tensor_parallel_size),
    ]
    if cfg.moe_expert_parallel_size:
        args += ["--ep_size", str(cfg.moe_expert_parallel_size)]
    args += [
        "--max_batch_size",
        str(cfg.max_batch_size),
        "--max_num_tokens",
        str(cfg.max_num_tokens),
        "--max_seq_len",
        str(cfg.max_seq_len),
    ]
    if cfg.kv_cache_config.free_gpu_memory_fraction is not None:
        args += ["--kv_cache_free_gpu_memory_fraction", str(cfg.kv_cache_config.free_gpu_memory_fraction)]
    return args


def serve_script(cfg: LlmApiConfig, host: str, port: int, check: serve_sh.ServeCheck | None = None) -> str:
    """A relocatable ``serve.sh``: cd to the bundle, check the TensorRT-LLM version and the
    GPUs (``check``), exec trtllm-serve, extra args passed through."""
    return serve_sh.render(" ".join(shlex.quote(a) for a in serve_args(cfg, host, port)), check)


def write(
    out_dir: Path,
    cfg: LlmApiConfig,
    host: str,
    port: int,
    check: serve_sh.ServeCheck | None = None,
    mtp: LlmApiConfig | None = None,
) -> None:
    """Write ``config.yaml``, ``judge.py`` and ``serve.sh`` into ``out_dir`` (the bundle's ``trtllm/``);
    ``mtp``: also ``config.mtp.yaml``, the MTP arm (``./trtllm/serve.sh --config ./trtllm/config.mtp.yaml``:
    trtllm-serve's last ``--config`` wins)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if mtp is not None:
        (out_dir / MTP_CONFIG).write_text(trtllm_yaml(mtp, check.release if check else None))
    (out_dir / "config.yaml").write_text(trtllm_yaml(cfg, check.release if check else None))
    (out_dir / "judge.py").write_text(Path(trtllm_judge.__file__).read_text())  # what serve.sh runs
    script = out_dir / "serve.sh"
    script.write_text(serve_script(cfg, host, port, check))
    script.chmod(0o755)


def load_trtllm_config(bundle: Path, release: str | None = None) -> LlmApiConfig:
    """Read and validate a bundle's ``trtllm/config.yaml`` (against ``release``'s keys when given)."""
    return validate_trtllm_config(yaml.safe_load((Path(bundle) / "trtllm" / "config.yaml").read_text()), release)
