"""The schema TensorRT-LLM's LLM-API config is checked against, and the checks on a config dict.

:class:`LlmApiConfig` and its sections mirror the TensorRT-LLM fields a DFlash bundle sets
(``extra="forbid"``: a key TensorRT-LLM would not accept cannot slip into a config; what
TensorRT-LLM accepts, aliases and all, is not refused); :func:`validate_trtllm_config` adds the
keys and values the targeted release has (:mod:`trtllm_releases`' table) and the zero-draft rule.
Sources: :mod:`dflash_trt.deploy.trtllm_config` (which emits configs from this schema) lists them."""

from __future__ import annotations

from typing import Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from dflash_trt.deploy import trtllm_judge
from dflash_trt.errors import DFlashError, RecipeError
from dflash_trt.plan import Release, check_schedule, get_release, zero_draft_rule

KV_DTYPES = ("auto", "fp8", "fp8_ds_mla", "nvfp4", "float16", "bfloat16", "float32")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class CudaGraphConfig(_Strict):
    """``CudaGraphConfig`` (``BaseCudaGraphConfig.validate_base_cuda_graph_config``)."""

    enable_padding: bool = Field(False, description="Pad a batch up to the nearest captured size.")
    max_batch_size: int = Field(
        0, ge=0, description="Capture graphs for sizes up to this (0: 128, or max(batch_sizes))."
    )
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
        None, description="Hybrid targets: dtype of the Mamba / Gated DeltaNet SSM state cache."
    )

    @field_validator("dtype", mode="before")
    @classmethod
    def _dtype(cls, v):
        v = str(v).lower()
        if v not in KV_DTYPES:
            raise ValueError(f"kv_cache_config.dtype must be one of {', '.join(KV_DTYPES)}")
        return v


MoeBackend = Literal[
    "AUTO",
    "CUTLASS",
    "CUTEDSL",
    "CUTEDSL_FC12",
    "TRTLLM",
    "DEEPGEMM",
    "DENSEGEMM",
    "VANILLA",
    "TRITON",
    "MARLIN",
    "MEGAMOE_DEEPGEMM",
    "MEGAMOE_CUTEDSL",
]


class MoeConfig(_Strict):
    """``MoeConfig.backend`` (the one MoE field a bundle pins)."""

    backend: MoeBackend = "AUTO"


class DFlashDecodingConfig(_Strict):
    """``DFlashDecodingConfig`` (``DecodingBaseConfig`` fields and validators); which keys a
    release has is :mod:`trtllm_releases`' table, checked by :func:`validate`."""

    decoding_type: Literal["DFlash"] = "DFlash"
    max_draft_len: int | None = Field(None, ge=0, description="Draft tokens per step (<= drafter block - 1).")
    max_total_draft_tokens: int | None = None
    speculative_model: str | None = Field(
        None,
        validation_alias=AliasChoices("speculative_model", "speculative_model_dir"),
        description="Drafter directory (z-lab format) or hub id.",
    )
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
        None, ge=0, description="Completed requests the speculation gate averages over (0: gate off)."
    )
    acceptance_rate_threshold: float | None = Field(
        None,
        ge=0,
        le=1,
        description="Not a rate: the mean accepted draft tokens per iteration (over "
        "acceptance_rate_window_size requests) below which TensorRT-LLM switches speculation off for the whole "
        "server, for good; validated to [0, 1].",
    )
    use_rejection_sampling: bool = False
    allow_advanced_sampling: bool = False
    advanced_sampling_mode: Literal["full", "no_topk", "no_topp", "no_topk_no_topp"] = "full"
    enable_penalty: bool = False
    # 1.4.0rc1 on
    context_recompute_tail: int | None = Field(
        None, description="Prompt tokens recomputed on prefix-cache hits; 0: none, negative: the whole prompt."
    )
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
            raise ValueError(
                "FLASHINFER cannot verify K + 1 tokens per sequence, so DFlash cannot run on it "
                "(TensorRT-LLM PR #19466 rejects it); use TRTLLM"
            )
        return self


def _release_keys(data: dict, release: Release) -> None:
    """The keys and values ``release`` does not have, refused in one line."""
    spec = dict(data.get("speculative_config") or {})
    if spec.get("decoding_type", "DFlash") != "DFlash":  # the release table lists DFlashDecodingConfig's keys
        return
    for key in spec:
        name = "speculative_model" if key == "speculative_model_dir" else key
        if not release.accepts(name):
            raise DFlashError(
                f"TensorRT-LLM config: speculative_config.{key} does not exist in TensorRT-LLM {release.version}"
            )
    backend = spec.get("attention_backend", "VANILLA")
    if backend not in release.attention_backends:
        raise DFlashError(
            f"TensorRT-LLM config: speculative_config.attention_backend {backend} does not exist in "
            f"TensorRT-LLM {release.version} ({', '.join(release.attention_backends)})"
        )


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
    bad = zero_draft_rule(release).refusal(
        cfg.max_batch_size,
        spec.max_draft_len or 0,
        schedule=spec.draft_len_schedule,
        max_concurrency=spec.max_concurrency,
    )
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
    return (
        f"speculative_config.acceptance_rate_threshold is {spec['acceptance_rate_threshold']}: TensorRT-LLM "
        "switches speculation off for the whole server, permanently, once the mean accepted draft tokens per "
        "iteration over the last acceptance_rate_window_size requests falls below it, so a measurement of this "
        "config may measure no drafting at all; remove it from trtllm/config.yaml (and restart the server) to "
        "measure"
    )
