"""The recipe's typed model: every field a recipe YAML may hold, with its range and its meaning.

Invariant: a :class:`Recipe` that exists is valid (pydantic models, unknown keys refused, every
number in a range, no NaN, choices in any case, ``validate_assignment`` on), and its field
descriptions are the documentation (``docs/reference/recipe.md`` is generated from them). How a
recipe is read (YAML, ``--set``, command-line flags, the path rule) is :mod:`dflash_trt.plan.recipe`'s;
this module parses nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, get_args, overload

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator

from dflash_trt.plan import trtllm_releases


def any_case(*choices: str) -> BeforeValidator:
    """A choice field's validator: a string naming one of ``choices`` in any case is that choice
    (``BF16`` is ``bf16``, ``vanilla`` is ``VANILLA``); anything else is left for the field to refuse."""
    table = {c.lower(): c for c in choices}
    return BeforeValidator(lambda v: table.get(v.lower(), v) if isinstance(v, str) else v)


_Precision = Literal["bf16", "fp8", "nvfp4", "auto"]
Precision = Annotated[_Precision, any_case(*get_args(_Precision))]
_KvCache = Literal["auto", "fp8"]
KvCache = Annotated[_KvCache, any_case(*get_args(_KvCache))]
_Schedule = Literal["auto", "max_concurrency", "draft_len_schedule", "none"]
_Attention = Literal["auto", "TRTLLM", "FA4", "VANILLA"]
_Engine = Literal["trtllm", "tensorrt"]
Engine = Annotated[_Engine | None, any_case(*get_args(_Engine))]

# Every integer has a range, whatever its digit count (a plan over 10**30 sequences never returns):
MAX_GPUS = 4096  # GPUs per node, nodes, tp, ep
MAX_BATCH = 1 << 16  # sequences in flight, concurrency levels
MAX_TOKENS = 1 << 24  # sequence lengths, token budgets, calibration samples
MAX_BLOCK = 1024  # draft block sizes and draft lengths (published DFlash blocks are 8-16)
BatchSize = Annotated[int, Field(ge=1, le=MAX_BATCH)]
DraftLen = Annotated[int, Field(ge=0, le=MAX_BLOCK)]
Parallel = Annotated[Annotated[int, Field(ge=1, le=MAX_GPUS)] | Literal["auto"], any_case("auto")]
DraftLenOrAuto = Annotated[Annotated[int, Field(ge=0, le=MAX_BLOCK)] | Literal["auto"], any_case("auto")]


class _Strict(BaseModel):
    # no NaN or infinity in any recipe number (a plan computed from one is nonsense)
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


Rate = Annotated[float, Field(ge=0.0, le=1.0)]  # a share of rounds: acceptance rates are in [0, 1]


class ModelRef(_Strict):
    id: str = Field(
        description="Hub id (org/name[@revision]), local directory (starting with ./, ../, / or ~), or 'embedded:NAME'."
    )
    revision: str | None = Field(None, description="Hub revision (branch, tag or commit); overrides '@rev' in id.")
    config: str | None = Field(
        None,
        description="Directory with the model's config files, for offline validation and planning "
        "(relative to the recipe file; typed on the command line, to the working directory).",
    )
    seen: str | None = Field(
        None,
        description="Where a public source names this repository id (a URL or "
        "project/file), when no config or revision recorded here confirms it.",
    )


class GpuSpec(_Strict):
    name: str = Field("cpu", description="GPU model (B200, H100, ...; see `dflash-trt plan --help`), or 'cpu'.")
    count: int = Field(1, ge=1, le=MAX_GPUS, description="GPUs per node available to the deployment.")
    nodes: int = Field(1, ge=1, le=MAX_GPUS, description="Nodes (multi-node serving through trtllm-llmapi-launch).")


class PrecisionSpec(_Strict):
    weights: Precision = Field(
        "bf16",
        description="Target weight precision: bf16, fp8 (Hopper, Ada, Blackwell), nvfp4 (Blackwell), or auto: "
        "the target as shipped (a pre-quantized checkpoint such as gpt-oss MXFP4 is used as it "
        "is; bf16 otherwise).",
    )
    kv_cache: KvCache = Field("auto", description="KV cache dtype: auto (model dtype) or fp8.")
    calib: str | None = Field(
        None, description="Calibration text file (one sample per line, or JSONL with 'prompt'/'text')."
    )
    calib_samples: int = Field(
        64, ge=1, le=MAX_TOKENS, description="Calibration samples for post-training quantization."
    )
    calib_seq_len: int = Field(256, ge=8, le=MAX_TOKENS, description="Tokens per calibration sample.")


class ParallelSpec(_Strict):
    tp: Parallel = Field("auto", description="Tensor-parallel size; auto picks the smallest that fits.")
    ep: int = Field(1, ge=1, le=MAX_GPUS, description="Expert-parallel size (MoE targets).")


class ServingSpec(_Strict):
    max_batch_size: int = Field(64, ge=1, le=MAX_BATCH, description="Most sequences in flight per GPU rank.")
    max_seq_len: int = Field(
        8192,
        ge=16,
        le=MAX_TOKENS,
        description="Prompt + output tokens per sequence; sizes the KV cache and the drafter's context arena.",
    )
    max_num_tokens: int = Field(
        8192, ge=16, le=MAX_TOKENS, description="Tokens per scheduler step (prefill chunk budget)."
    )
    kv_cache_free_gpu_memory_fraction: float = Field(
        0.85, gt=0, le=1, description="Share of free GPU memory for the KV cache after weights load."
    )
    enable_block_reuse: bool = Field(
        False,
        description="Prefix-cache reuse. Off by default: cache hits starve the drafter of hidden states unless "
        "context_recompute_tail is set.",
    )
    cuda_graphs: bool = Field(
        True, description="Capture CUDA graphs for decode batch sizes (off: the config says cuda_graph_config: null)."
    )
    enable_chunked_prefill: bool | None = Field(
        None,
        description="Chunked prefill; None: on where max_seq_len > max_num_tokens or context_recompute_tail is set.",
    )
    disable_overlap_scheduler: bool = Field(False, description="Turn off TensorRT-LLM's overlap scheduler.")
    iter_perf_stats: bool = Field(
        True,
        description="TensorRT-LLM's per-iteration statistics (enable_iter_perf_stats): trtllm-serve's /metrics "
        "then reports acceptance, which `dflash-trt verify --endpoint` reads. Off saves a little "
        "host time per iteration; verify then needs --accept-stats.",
    )
    disaggregated: bool = Field(
        False,
        description="Disaggregated (context/generation) serving. Refused with DFlash: the generation server "
        "drafts without the prompt and acceptance collapses (TensorRT-LLM PR #19352 only warns).",
    )
    enable_thinking: bool | None = Field(
        None,
        description="The chat template's thinking switch this deployment serves with "
        "(chat_template_kwargs.enable_thinking); None: the template's default. plan warns when it "
        "differs from what the drafter was trained with (its training.json).",
    )
    host: str = Field("127.0.0.1", description="Serving address.")
    port: int = Field(8000, ge=1, le=65535, description="Serving port.")


class SpeculativeSpec(_Strict):
    block_size: int | None = Field(
        None, ge=1, le=MAX_BLOCK, description="Draft block size B (default: the drafter's trained block)."
    )
    max_draft_len: DraftLenOrAuto = Field(
        "auto", description="Draft tokens per step (<= B-1); auto: from the planner's roofline."
    )
    schedule: Annotated[_Schedule, any_case(*get_args(_Schedule))] = Field(
        "auto",
        description="How drafting backs off as batches grow: a hard cut-off, a per-batch-size draft length, or never.",
    )
    max_concurrency: int | None = Field(
        None, ge=1, le=MAX_BATCH, description="Turn drafting off above this batch size (schedule=max_concurrency)."
    )
    draft_len_schedule: dict[BatchSize, DraftLen] | None = Field(
        None,
        description="{batch size: draft length} (schedule=draft_len_schedule), read as the targeted TensorRT-LLM "
        "release reads it: each key is the LAST batch size of its length ({4: 4, 8: 2, 32: 1}: 1-4 "
        "-> 4, 5-8 -> 2, 9-32 -> 1, above -> off); the smallest key maps to max_draft_len.",
    )
    acceptance: float | None = Field(
        None,
        ge=1.0,
        le=MAX_BLOCK,
        description="Expected acceptance length tau (>= 1: tokens per target forward) for planning "
        "(default: per-family estimate).",
    )
    per_position_acceptance: list[Rate] | None = Field(
        None,
        description="Measured share of rounds accepting draft position 1, 2, ... (what `dflash-trt bench` "
        "prints); the planner's tau(L) sums them (geometric beyond the last).",
    )
    attention_backend: Annotated[_Attention, any_case(*get_args(_Attention))] = Field(
        "auto", description="Draft attention backend; auto: TRTLLM on SM100/103, FA4 on SM90, VANILLA elsewhere."
    )
    use_rejection_sampling: bool = Field(
        True, description="Rejection sampling at temperature > 0 (keeps the target's distribution)."
    )
    context_recompute_tail: int | None = Field(
        None,
        ge=-1,
        le=MAX_TOKENS,
        description="Prompt tokens recomputed on prefix-cache hits so the drafter gets hidden states; -1: "
        "the whole prompt, 0: none (TensorRT-LLM >= 1.4.0rc1). None: 512 when "
        "enable_block_reuse is on.",
    )


class TrtllmSpec(_Strict):
    release: str = Field(
        trtllm_releases.DEFAULT_RELEASE,
        description="The TensorRT-LLM release the bundle is for "
        f"({', '.join(trtllm_releases.KNOWN)}): which config keys exist, how draft_len_schedule is "
        "read, the container image, the version serve.sh requires.",
    )

    @field_validator("release", mode="before")
    @classmethod
    def _known(cls, v):
        v = str(v)
        if v not in trtllm_releases.KNOWN:
            raise ValueError(f"unknown TensorRT-LLM release {v!r}; known: {', '.join(trtllm_releases.KNOWN)}")
        return v


class Recipe(_Strict):
    name: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        max_length=128,
        description="Recipe name (letters, digits, '.', '_', '-'); the default output directory is dflash-out/<name>.",
    )
    description: str = Field("", description="One line on what this recipe is for.")
    target: ModelRef
    drafter: ModelRef
    gpu: GpuSpec = GpuSpec()
    precision: PrecisionSpec = PrecisionSpec()
    parallel: ParallelSpec = ParallelSpec()
    serving: ServingSpec = ServingSpec()
    speculative: SpeculativeSpec = SpeculativeSpec()
    trtllm: TrtllmSpec = TrtllmSpec()
    graphs: bool = Field(
        False,
        description="Also export the standalone path: ONNX graphs with the DFlash custom ops "
        "(onnx/) and TensorRT engines (engines/, where TensorRT and a GPU are), run by generate/bench/"
        "serve --backend onnx|tensorrt.",
    )
    incomplete: list[str] = Field(
        default_factory=list,
        description="What the published configs lack (one entry "
        "each): with neither the hub nor a cached copy, an offline plan refuses in "
        "one line naming them and the command that fetches them.",
    )

    source: Path | None = Field(None, exclude=True, description="Where the recipe was loaded from (not a YAML key).")

    @overload
    def resolve_path(self, p: str) -> Path: ...
    @overload
    def resolve_path(self, p: None) -> None: ...

    def resolve_path(self, p: str | None) -> Path | None:
        """A path in the recipe, relative to the recipe file."""
        if p is None:
            return None
        path = Path(p).expanduser()
        if not path.is_absolute() and self.source is not None:
            path = self.source.parent / path
        return path

    def to_yaml(self) -> str:
        skip = {"source"} | ({"incomplete"} if not self.incomplete else set())  # complete recipes read as before
        return yaml.safe_dump(self.model_dump(mode="json", exclude=skip), sort_keys=False)
