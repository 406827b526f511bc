"""The plan as a typed value: what ``plan`` computes, what the manifest stores under ``plan``,
what ``verify``, ``tune``, ``bench`` and the plan table read back (attributes, never keys).

The models live here, beside the :class:`~dflash_trt.ingest.bundle.Manifest` that holds them,
because ``ingest`` sits below ``plan`` (which computes them) and the runtime reads manifests too;
``dflash_trt.plan`` exports :class:`Plan` under the same name. The invariant: the JSON a plan
serialises to (:meth:`Plan.to_json`, the manifest's ``plan`` and ``build/plan --json``'s) keeps
every key path a plan dict had before it was typed (``memory.total``, ``curve[i].speedup_range``,
``draft_len_schedule."4"``, ...); fields are only ever added. A row's optional keys that were
absent before (a curve row's ``mtp_speedup`` when the target has no MTP heads) stay absent: rows
are written as given (``exclude_unset``), the plan itself in full. :func:`plan_schema` is the
JSON Schema the docs publish.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Row(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CurvePoint(_Row):
    """One batch size of the plan's curve (1, 2, 4, ..., max_batch_size)."""

    batch: int = Field(description="Live sequences in one step.")
    draft_len: int = Field(description="What the targeted TensorRT-LLM release drafts at this batch size (0: off).")
    speedup: float = Field(description="Predicted tokens/s per user with drafting over without.")
    speedup_range: list[float] | None = Field(
        None, description="[low, high] of the speedup from the leave-one-out errors of the rows it rests on."
    )
    range_basis: str | None = Field(None, description="What the range rests on (stack, GPU, levels, rows).")
    mtp_speedup: float | None = Field(
        None, description="The target's own MTP heads' predicted speedup (only where the target has them)."
    )
    winner: Literal["dflash", "mtp", "autoregressive"] | None = Field(
        None, description="The arm the step model predicts fastest here."
    )


class Prediction(_Row):
    """Predicted throughput at one batch size, with the planned draft length and without drafting
    (what ``bench --plot`` overlays)."""

    batch: int
    draft_len: int
    tokens_per_second_per_user: float
    baseline_tokens_per_second_per_user: float
    output_tokens_per_second_per_gpu: float
    baseline_output_tokens_per_second_per_gpu: float
    speedup: float
    speedup_range: list[float] | None = Field(None, description="[low, high], as a curve point's.")
    range_basis: str | None = None


class DraftRun(_Row):
    """Batch sizes ``batch_from .. batch_to`` (inclusive) draft ``draft_len`` tokens (0: off)."""

    batch_from: int
    batch_to: int
    draft_len: int


class PlannedMtp(_Row):
    """The target's own MTP heads as the other arm (``plan.mtp``)."""

    layers: int = Field(description="MTP layers in the checkpoint.")
    num_nextn_predict_layers: int = Field(description="MTP draft length written to config.mtp.yaml.")
    acceptance: float = Field(description="Predicted τ of the MTP arm at that draft length.")
    alpha: float
    tau_ratio_to_dflash: float
    source: str = Field(description="Where the MTP/DFlash τ ratio comes from.")


class VllmPlan(_Row):
    """The same draft lengths for vLLM, converted from what TensorRT-LLM drafts."""

    num_speculative_tokens: int
    num_speculative_tokens_per_batch_size: list[list[int]] = Field(
        description="[[batch_lo, batch_hi, K], ...], inclusive ranges; gaps inherit."
    )


class MeasuredArm(BaseModel):
    """One concurrency of a measured arms sweep (``bench/conclusions.arms``)."""

    model_config = ConfigDict(extra="allow")

    concurrency: int
    dflash: float | None = None
    mtp: float | None = None
    autoregressive: float | None = None
    winner: str
    margin: float | None = None


class Arms(_Row):
    """``plan.arms``: which arm won where, measured (``tune --arms``)."""

    date: str
    source: str
    measured: list[MeasuredArm]


class Spread(_Row):
    """A figure over its repeats (``bench.spread.interval``)."""

    values: list[float]
    mean: float
    min: float
    max: float


class TunedLevel(_Row):
    concurrency: int
    output_tokens_per_second: float | None
    acceptance_length: float | None
    output_tokens_per_second_spread: Spread | None = Field(None, description="Over the level's repeats.")
    tpot_ms: dict[str, float | None] | None = Field(None, description="TPOT per request: mean, median, p90, p99.")


class Tuned(_Row):
    """``plan.tuned``: what ``tune`` measured and chose."""

    date: str
    winners: dict[int, int] = Field(description="{concurrency: the draft length chosen}.")
    calibration: str
    arms: list[MeasuredArm] | None = None
    measured: dict[str, list[TunedLevel]] = Field(description="{draft length swept: its levels}.")


class PlanMemory(_Row):
    """Bytes per GPU as the planner sized them (``plan.memory_model.Memory``; its docstring gives each
    term), with the totals it derived, stored as computed."""

    weights: int
    drafter: int
    drafter_arena: int
    kv_cache: int
    activations: int
    reserve: int
    capacity: int
    arena_in_kv_pool: bool = Field(False, description="TRTLLM draft attention: the arena lives in the draft KV pool.")
    draft_kv_pool: int = Field(0, description="A separate managed draft KV cache drafting does not use (PR #19410).")
    # The start-up memory budget (plan.startup): written where the planner sizes it.
    cuda_graphs: int = Field(0, description="The captured decode graphs' pool.")
    headroom: int = Field(0, description="Post-arena consumers.")
    graph_batch_sizes: tuple[int, ...] = Field((), description="The decode graphs' batch sizes (padding on).")
    user_fraction: float | None = Field(None, description="free_gpu_memory_fraction the user set (None: chosen).")
    budget: dict[str, Any] | None = Field(None, description="The KV pool's share at start-up, and what it rests on.")
    pr19466: dict[str, Any] | None = None
    total: int = Field(description="The sum of the terms: what the plan needs per GPU.")
    fits: bool = Field(description="Whether the total fits the GPU.")
    missing: int = Field(description="Bytes over the GPU's capacity (0: it fits).")

    # The start-up budget's terms, as the planner derived them (plan.memory_model.Memory's properties).
    def _budget(self) -> dict[str, Any]:
        if self.budget is None:
            raise ValueError("this plan predates the start-up memory budget: rebuild the bundle")
        return self.budget

    @property
    def fraction(self) -> float:
        """``kv_cache_config.free_gpu_memory_fraction``: the user's, else the one the planner chose."""
        return float(self._budget()["fraction"])

    @property
    def free_after_load(self) -> int:
        """Free when TensorRT-LLM sizes the KV pool (weights, drafter and CUDA context resident)."""
        return int(self._budget()["free_after_load"])

    @property
    def in_pool(self) -> int:
        """What the KV pool must hold."""
        return int(self._budget()["in_pool"])

    @property
    def after_pool(self) -> int:
        """What must fit beside the KV pool."""
        return int(self._budget()["after_pool"])


WRITTEN_WHEN_SET = {
    "tuned",
    "arms",
    "max_batch_size",
    "max_seq_len",
    "kv_cache_free_gpu_memory_fraction",
    "sized",
    "stack",
    "step_sources",
}


class Plan(_Row):
    """The deployment plan: parallelism, memory, draft lengths and the predictions they rest on."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    gpu: str = Field(description="The GPU catalog entry planned for.")
    gpus: int = Field(description="GPUs available in all.")
    tp: int = Field(description="Tensor-parallel size chosen (the smallest that fits).")
    ep: int
    precision: str = Field(description="The target's weights: bf16 | fp8 | nvfp4 | mxfp4.")
    kv_cache: str
    memory: PlanMemory
    block_size: int
    max_draft_len: int
    acceptance: float = Field(description="Expected τ at a full block.")
    alpha: float = Field(description="Per-position acceptance of the geometric model.")
    attention_backend: str
    schedule: Literal["max_concurrency", "draft_len_schedule", "none"]
    max_concurrency: int | None = None
    draft_len_schedule: dict[int, int] | None = Field(
        None, description="TensorRT-LLM's {batch-size upper bound: draft length}."
    )
    curve: list[CurvePoint] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)
    draft_lengths: list[DraftRun] = Field(
        default_factory=list, description="What the targeted release drafts at every batch size."
    )
    trtllm_release: str
    max_num_tokens: int = Field(0, description="After the token budget (may be raised over the recipe's).")
    enable_chunked_prefill: bool = False
    context_recompute_tail: int | None = None
    moe_backend: str | None = Field(None, description="moe_config.backend pinned for the release; None: AUTO.")
    calibration: str = Field("", description="Which constants the step model used.")
    predicted: list[Prediction] = Field(default_factory=list)
    mtp: PlannedMtp | None = None
    vllm_schedule: VllmPlan | None = None
    # The serving limits the plan is for, sized down from unset defaults that did not fit, the KV
    # pool's share, and the serving stack the step model predicts for with each term's source
    # (main's plan.sizing / plan.startup / plan.silicon): written where the planner sets them.
    max_batch_size: int = 0
    max_seq_len: int = 0
    kv_cache_free_gpu_memory_fraction: float | None = None
    sized: list[dict[str, Any]] = Field(default_factory=list, description="[{key, from, to, why}]")
    stack: str = "trtllm"
    step_sources: dict[str, Any] = Field(default_factory=dict)
    tuned: Tuned | None = Field(None, description="What tune measured and chose (set by tune).")
    arms: Arms | None = Field(None, description="Which arm won where, measured (set by tune --arms).")

    def model_post_init(self, _context: Any) -> None:
        # The plan's own fields are always written (null included), as before it was typed;
        # tune's sections and the sizing fields only once set, the rows' optional keys only where given.
        self.__pydantic_fields_set__.update(set(type(self).model_fields) - WRITTEN_WHEN_SET)

    def to_json(self) -> dict[str, Any]:
        """The JSON object the manifest's ``plan`` and ``--json`` hold."""
        return self.model_dump(mode="json", exclude_unset=True)

    def describe_draft_lengths(self) -> str:
        """``1-16: 15, 17-64: 12`` (what TensorRT-LLM drafts, by batch size)."""

        def one(r: DraftRun) -> str:
            span = f"{r.batch_from}" if r.batch_from == r.batch_to else f"{r.batch_from}-{r.batch_to}"
            return f"{span}: {r.draft_len if r.draft_len else 'off'}"

        return ", ".join(one(r) for r in self.draft_lengths)

    def lengths(self) -> list[int]:
        """The draft length at every batch size 1..max (``draft_lengths`` expanded)."""
        return [r.draft_len for r in self.draft_lengths for _ in range(r.batch_from, r.batch_to + 1)]

    def draft_len_at(self, batch: int) -> int:
        """What the plan has the release draft at ``batch`` live rows (past the last run: off)."""
        lengths = self.lengths()
        if not lengths:
            return self.max_draft_len
        return lengths[batch - 1] if batch <= len(lengths) else 0


def plan_schema() -> dict[str, Any]:
    """The JSON Schema of a plan as serialised (the manifest's ``plan``, ``--json``'s ``plan``)."""
    return Plan.model_json_schema(mode="serialization")
