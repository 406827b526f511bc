"""TensorRT-LLM (PyTorch backend) config and launch command for a bundle.

TensorRT-LLM is never imported: the project writes the YAML that ``trtllm-serve --config``
reads and the exact command line, and checks its own output against :class:`LlmApiConfig`,
a schema mirroring the TensorRT-LLM fields it models (``extra="forbid"``: a key TensorRT-LLM
would not accept cannot slip into a config; what TensorRT-LLM accepts, aliases and all, is
not refused). Which keys the targeted release has is :mod:`trtllm_releases`' table, checked
by :func:`validate`. Sources, per model below:

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
from typing import Literal

import yaml
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from dflash_trt.deploy import serve_sh, trtllm_installed, trtllm_judge
from dflash_trt.errors import DFlashError, RecipeError
from dflash_trt.plan import Release, check_schedule, get_release, target_attn_backend, zero_draft_rule

DRAFTER_REL = "./drafter"
MTP_CONFIG = "config.mtp.yaml"
KV_DTYPES = ("auto", "fp8", "fp8_ds_mla", "nvfp4", "float16", "bfloat16", "float32")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class CudaGraphConfig(_Strict):
    """``CudaGraphConfig`` (``BaseCudaGraphConfig.validate_base_cuda_graph_config``)."""

    enable_padding: bool = Field(False, description="Pad a batch up to the nearest captured size.")
    max_batch_size: int = Field(
        0, ge=0, description="Capture graphs for sizes up to this (0: 128, or max(batch_sizes)).")
    batch_sizes: list[int] | None = Field(None, description="Explicit batch sizes to capture.")

    @model_validator(mode="after")
    def _compatible(self):
        if self.batch_sizes and self.max_batch_size not in (0, max(self.batch_sizes)):
            raise ValueError("cuda_graph_config.max_batch_size must equal max(batch_sizes) when both are given")
        return self


class KvCacheConfig(_Strict):
    """``KvCacheConfig``: the fields a DFlash bundle sets (``dtype`` lower-cased as TensorRT-LLM does)."""

    dtype: str = Field("auto", description="auto (the checkpoint's), fp8, fp8_ds_mla, nvfp4, or a torch dtype name.")
    free_gpu_memory_fraction: float | None = Field(None, ge=0, le=1, description="Share of free memory for KV blocks.")
    enable_block_reuse: bool = Field(True, description="Prefix-cache block reuse (TensorRT-LLM's default: on).")
    max_tokens: int | None = Field(None, ge=1, description="Cap on KV-cache tokens.")
    tokens_per_block: int = Field(32, ge=1, description="Tokens per KV block.")
    mamba_ssm_cache_dtype: Literal["auto", "float16", "bfloat16", "float32"] | None = Field(
        None, description="Hybrid targets: dtype of the Mamba / Gated DeltaNet SSM state cache.")

    @field_validator("dtype", mode="before")
    @classmethod
    def _dtype(cls, v):
        v = str(v).lower()
        if v not in KV_DTYPES:
            raise ValueError(f"kv_cache_config.dtype must be one of {', '.join(KV_DTYPES)}")
        return v


MoeBackend = Literal["AUTO", "CUTLASS", "CUTEDSL", "CUTEDSL_FC12", "TRTLLM", "DEEPGEMM", "DENSEGEMM", "VANILLA",
                     "TRITON", "MARLIN", "MEGAMOE_DEEPGEMM", "MEGAMOE_CUTEDSL"]


class MoeConfig(_Strict):
    """``MoeConfig.backend`` (the one MoE field a bundle pins)."""

    backend: MoeBackend = "AUTO"


class DFlashDecodingConfig(_Strict):
    """``DFlashDecodingConfig`` (``DecodingBaseConfig`` fields and validators); which keys a
    release has is :mod:`trtllm_releases`' table, checked by :func:`validate`."""

    decoding_type: Literal["DFlash"] = "DFlash"
    max_draft_len: int | None = Field(None, ge=0, description="Draft tokens per step (<= drafter block - 1).")
    max_total_draft_tokens: int | None = None
    speculative_model: str | None = Field(None,
                                          validation_alias=AliasChoices("speculative_model", "speculative_model_dir"),
                                          description="Drafter directory (z-lab format) or hub id.")
    mask_token_id: int | None = Field(None, description="Default: read from the drafter's dflash_config.")
    target_layer_ids: list[int] | None = Field(None, description="Default: read from the drafter's dflash_config.")
    attention_backend: Literal["VANILLA", "TRTLLM", "FA4"] = "VANILLA"
    max_concurrency: int | None = Field(None, gt=0, description="Speculation off above this batch size.")
    draft_len_schedule: dict[int, int] | None = Field(None, description="{batch size: draft len}; read per release.")
    load_format: str | None = None
    # speculation_gate.py: NOT a rate. Over the last ``window_size`` completed requests the rolling
    # mean of ACCEPTED DRAFT TOKENS PER ITERATION is compared with ``threshold``; below it,
    # speculation is switched off for the whole server, permanently. dflash-trt never writes it,
    # and verify / tune / bench refuse a config that sets it (bench.measurement_conflict).
    acceptance_rate_window_size: int | None = Field(
        None, ge=0, description="Completed requests the speculation gate averages over (0: gate off).")
    acceptance_rate_threshold: float | None = Field(
        None, ge=0, le=1, description="Not a rate: the mean accepted draft tokens per iteration (over "
        "acceptance_rate_window_size requests) below which TensorRT-LLM switches speculation off for the whole "
        "server, for good; validated to [0, 1].")
    use_rejection_sampling: bool = False
    allow_advanced_sampling: bool = False
    advanced_sampling_mode: Literal["full", "no_topk", "no_topp", "no_topk_no_topp"] = "full"
    enable_penalty: bool = False
    # 1.4.0rc1 on
    context_recompute_tail: int | None = Field(None, description="Prompt tokens recomputed on prefix-cache hits; "
                                               "0: none, negative: the whole prompt.")
    moe_backend: MoeBackend | None = None
    spec_dec_variant: int | None = Field(None, gt=0)
    skip_ctx_buffer_budget_check: bool = False

    @model_validator(mode="after")
    def _schedule(self):
        # DecodingBaseConfig.validate_max_concurrency_and_draft_len_schedule_mutually_exclusive
        if self.max_concurrency is not None and self.draft_len_schedule is not None:
            raise ValueError("max_concurrency and draft_len_schedule are mutually exclusive")
        if self.draft_len_schedule is not None:  # DecodingBaseConfig.validate_draft_len_schedule_and_sort
            try:
                self.draft_len_schedule = check_schedule(self.draft_len_schedule, self.max_draft_len or 0)
            except RecipeError as exc:
                raise ValueError(str(exc).removeprefix("speculative.")) from None
        return self


class MTPDecodingConfig(_Strict):
    """``MTPDecodingConfig`` (``tensorrt_llm/llmapi/llm_args.py``): the target's own MTP layers.
    ``max_draft_len`` follows ``num_nextn_predict_layers`` (``set_max_total_draft_tokens``); a
    checkpoint with one MTP layer runs it EAGLE-style for every draft token (``spec_dec_mode``:
    MTP_EAGLE_ONE_MODEL unless ``use_mtp_vanilla``), several run one layer per token."""

    decoding_type: Literal["MTP"] = "MTP"
    num_nextn_predict_layers: int = Field(1, gt=0, description="Draft tokens per step (MTP modules run).")
    max_draft_len: int | None = Field(None, ge=0, description="Overwritten with num_nextn_predict_layers.")
    use_relaxed_acceptance_for_thinking: bool = False
    relaxed_topk: int = Field(1, ge=1)
    relaxed_delta: float = Field(0.0, ge=0)
    use_mtp_vanilla: bool = False
    mtp_eagle_one_model: bool = True
    begin_thinking_phase_token: int | None = None
    end_thinking_phase_token: int | None = None
    max_concurrency: int | None = Field(None, gt=0, description="Speculation off above this batch size.")
    draft_len_schedule: dict[int, int] | None = None

    @model_validator(mode="after")
    def _lossless(self):
        # relaxed acceptance accepts a draft that is not the target's top-1: not lossless
        if self.use_relaxed_acceptance_for_thinking:
            raise ValueError("use_relaxed_acceptance_for_thinking is not lossless; a dflash-trt bundle leaves it off")
        return self


class LlmApiConfig(_Strict):
    """The top-level ``TorchLlmArgs`` keys a DFlash bundle sets (``trtllm-serve --config`` YAML).
    ``cuda_graph_config`` left out means TensorRT-LLM's default (graphs on); ``None`` means off."""

    tensor_parallel_size: int = Field(1, ge=1)
    moe_expert_parallel_size: int | None = Field(None, ge=1)
    max_batch_size: int = Field(ge=1)
    max_num_tokens: int = Field(ge=1)
    max_seq_len: int = Field(ge=1, description="Set it: it also sizes the drafter's context arena.")
    enable_chunked_prefill: bool = False
    attn_backend: Literal["TRTLLM", "FLASHINFER", "VANILLA"] = "TRTLLM"
    disable_overlap_scheduler: bool = False
    # TorchLlmArgs.enable_iter_perf_stats: trtllm-serve's GET /metrics returns the iteration stats
    # (specDecodingStats: acceptance) only when it is on (tensorrt_llm/serve/openai_server.py)
    enable_iter_perf_stats: bool = False
    trust_remote_code: Literal[False] = False
    disable_mm_encoder: bool | None = Field(None, description="Text-only use of a VLM target: no vision tower.")
    cuda_graph_config: CudaGraphConfig | None = Field(default_factory=CudaGraphConfig)
    moe_config: MoeConfig | None = None
    kv_cache_config: KvCacheConfig = Field(default_factory=KvCacheConfig)
    speculative_config: DFlashDecodingConfig | MTPDecodingConfig = Field(discriminator="decoding_type")

    @model_validator(mode="after")
    def _dflash_attn(self):
        # FlashInfer cannot take K + 1 tokens per sequence (trtllm_rules.target_attn_backend)
        if self.attn_backend == "FLASHINFER" and self.speculative_config.decoding_type == "DFlash":
            raise ValueError("FLASHINFER cannot verify K + 1 tokens per sequence, so DFlash cannot run on it "
                             "(TensorRT-LLM PR #19466 rejects it); use TRTLLM")
        return self


def _release_keys(data: dict, release: Release) -> None:
    """The keys and values ``release`` does not have, refused in one line."""
    spec = dict(data.get("speculative_config") or {})
    if spec.get("decoding_type", "DFlash") != "DFlash":  # the release table lists DFlashDecodingConfig's keys
        return
    for key in spec:
        name = "speculative_model" if key == "speculative_model_dir" else key
        if not release.accepts(name):
            raise DFlashError(f"TensorRT-LLM config: speculative_config.{key} does not exist in TensorRT-LLM "
                              f"{release.version}")
    backend = spec.get("attention_backend", "VANILLA")
    if backend not in release.attention_backends:
        raise DFlashError(f"TensorRT-LLM config: speculative_config.attention_backend {backend} does not exist in "
                          f"TensorRT-LLM {release.version} ({', '.join(release.attention_backends)})")


def validate_trtllm_config(data: dict, release: str | Release | None = None) -> LlmApiConfig:
    """Check a config dict against the schema (and the keys ``release`` has: a version, or its row
    as completed from the installed classes); a DFlashError names the first bad key."""
    disaggregated = trtllm_judge.refuse_disaggregated(data)
    if disaggregated:
        raise DFlashError(f"TensorRT-LLM config: {disaggregated}")
    try:
        cfg = LlmApiConfig.model_validate(data)
    except ValidationError as exc:
        e = exc.errors()[0]
        loc = ".".join(str(x) for x in e["loc"])
        raise DFlashError(f"TensorRT-LLM config: {loc}: {e['msg']}") from None
    if release is not None:
        rel = release if isinstance(release, Release) else get_release(release)
        _release_keys(data, rel)
        _zero_draft(cfg, rel)
    return cfg


def _zero_draft(cfg: LlmApiConfig, release: Release) -> None:
    """A DFlash config that would draft 0 tokens at a batch size up to ``max_batch_size`` on a
    release without the floor (:func:`dflash_trt.plan.zero_draft_rule`), refused in one line."""
    spec = cfg.speculative_config
    if not isinstance(spec, DFlashDecodingConfig):
        return
    bad = zero_draft_rule(release).refusal(cfg.max_batch_size, spec.max_draft_len or 0,
                                           schedule=spec.draft_len_schedule, max_concurrency=spec.max_concurrency)
    if bad:
        raise DFlashError(f"TensorRT-LLM config: speculative_config.{bad}")


def speculation_gate(data: dict) -> str | None:
    """One line when a config sets TensorRT-LLM's speculation gate, which no measurement run
    (``verify --endpoint``, ``tune``, ``bench``) may have: ``acceptance_rate_threshold``
    (``tensorrt_llm/_torch/speculative/speculation_gate.py``) is compared with the mean ACCEPTED DRAFT
    TOKENS PER ITERATION over the last ``acceptance_rate_window_size`` requests, and below it
    speculation is off for the whole server, for good: what is then measured is not the bundle."""
    spec = (data or {}).get("speculative_config") if isinstance(data, dict) else None
    if not isinstance(spec, dict) or not spec.get("acceptance_rate_threshold"):
        return None
    return (f"speculative_config.acceptance_rate_threshold is {spec['acceptance_rate_threshold']}: TensorRT-LLM "
            "switches speculation off for the whole server, permanently, once the mean accepted draft tokens per "
            "iteration over the last acceptance_rate_window_size requests falls below it, so a measurement of this "
            "config may measure no drafting at all; remove it from trtllm/config.yaml (and restart the server) to "
            "measure")


def check_layer_ids(ids: list[int], zlab_ids: list[int]) -> None:
    """``speculative_config.target_layer_ids`` are z-lab ids: TensorRT-LLM captures the hidden state
    after decoder layer i, 0-based (``tensorrt_llm/_torch/speculative/dflash.py``, DFlashSpecMetadata).
    speculators' ``aux_hidden_state_layer_ids`` are ``output_hidden_states`` indices, one higher: passed
    straight through, every capture lands one layer late and acceptance collapses without an error."""
    ids, zlab = sorted(ids), sorted(zlab_ids)
    if ids == zlab:
        return
    if ids == [i + 1 for i in zlab]:
        raise DFlashError(f"TensorRT-LLM config: target_layer_ids {ids} are the drafter's speculators ids "
                          f"(output_hidden_states, +1); TensorRT-LLM reads z-lab ids {zlab}")
    raise DFlashError(f"TensorRT-LLM config: target_layer_ids {ids} are not the drafter's {zlab}")


def _speculative(recipe, plan, drafter) -> dict:
    sp = recipe.speculative
    spec = {"decoding_type": "DFlash", "max_draft_len": plan.max_draft_len, "speculative_model": DRAFTER_REL,
            "attention_backend": plan.attention_backend, "use_rejection_sampling": sp.use_rejection_sampling}
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
        "kv_cache_config": {"dtype": plan.kv_cache, "free_gpu_memory_fraction": fraction,
                            "enable_block_reuse": s.enable_block_reuse},
        "speculative_config": _speculative(recipe, plan, drafter) if arm == "dflash" else _mtp(plan),
    }
    if arm == "dflash":   # explicit: a head_dim of 256 (Gemma-4) would auto-select FlashInfer
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
    head = (f"# TensorRT-LLM {release} LLM-API config for a dflash-trt bundle (trtllm-serve --config)\n"
            if release else "")
    return head + yaml.safe_dump(data, sort_keys=False)


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


def serve_script(cfg: LlmApiConfig, host: str, port: int, check: serve_sh.ServeCheck | None = None) -> str:
    """A relocatable ``serve.sh``: cd to the bundle, check the TensorRT-LLM version and the
    GPUs (``check``), exec trtllm-serve, extra args passed through."""
    return serve_sh.render(" ".join(shlex.quote(a) for a in serve_args(cfg, host, port)), check)


def write(out_dir: Path, cfg: LlmApiConfig, host: str, port: int, check: serve_sh.ServeCheck | None = None,
          mtp: LlmApiConfig | None = None) -> None:
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
