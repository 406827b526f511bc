"""Deployment planning: memory per GPU, tensor-parallel size, draft length and back-off.

Everything here is arithmetic on config shapes (:mod:`dflash_trt.plan.model_shapes`) and datasheet
figures (:mod:`dflash_trt.plan.hardware`); no weights are needed. Bytes are exact integers.
Memory per GPU and the tensor-parallel size that fits: :mod:`dflash_trt.plan.memory_model` (its
docstring gives every term); the step model, draft lengths and the plan: here.

Step model for draft length and back-off
----------------------------------------
Step times come from :mod:`dflash_trt.plan.perf_model` (every term and why it is there) with
the constants fitted for the stack the plan is for (TensorRT-LLM on a GPU, the reference
runtime on ``cpu``): the package's calibration, or the user's (``plan --calibration``). A
decode context of ``S = min(max_seq_len / 2, 2048)`` per sequence; then::

    speedup(b, L) = tau(L) x t_AR(b) / t_DFlash(b, L)

Acceptance: ``tau(L) = 1 + p_1 + ... + p_L`` from the recipe's ``speculative.per_position_acceptance``
where given, else geometric, ``alpha`` fitted so that a full block gives the expected tau (recipe
``speculative.acceptance``, else a per-family estimate: Qwen3 6.5 at B=16 (the DFlash paper,
arXiv 2602.06036), Llama-3.1 4.0, gpt-oss 4.5)::

    tau(L) = 1 + alpha + ... + alpha^L = (1 - alpha^(L+1)) / (1 - alpha)

``max_draft_len`` maximises speedup(1, L) over 1 <= L <= B - 1 (draft lengths within 1% of
the best speedup count as equal; the longest is kept). For EVERY batch size 1 ..
``max_batch_size`` the best L <= the previous batch size's is taken; from the first batch
size where even the best gives speedup < 1.05 drafting is off, or, on a release without a
draft-length floor, the floor: one token (the zero-draft rule, :func:`schedule.zero_draft_rule`;
the plan's warnings say where and what it costs). Those per-batch lengths,
as runs (:mod:`dflash_trt.plan.schedule`), become ``max_concurrency`` (one length, then
off) or a ``draft_len_schedule`` written for the targeted TensorRT-LLM release's lookup;
what the plan reports is what that release drafts at each batch size.
"""

from __future__ import annotations

from collections.abc import Callable

from dflash_trt.errors import HardwareError, RecipeError
from dflash_trt.ingest import CurvePoint, DraftRun, Plan, PlanMemory, PlannedMtp, Prediction, VllmPlan
from dflash_trt.plan import mtp as mtp_mod
from dflash_trt.plan import perf_model, schedule_vllm, silicon, sizing, trtllm_releases, uncertainty
from dflash_trt.plan import schedule as sched_mod
from dflash_trt.plan import trtllm_rules as rules
from dflash_trt.plan.acceptance import expected_tau, fit_alpha  # noqa: F401 - planner's public names
from dflash_trt.plan.hardware import GPU
from dflash_trt.plan.memory_model import (
    Deployment,
    Memory,
    _gib,
    choose_tp,
    drafter_arena,  # noqa: F401 - read through this module as before the split
    memory,
    weight_bytes,
)
from dflash_trt.plan.model_shapes import DraftShape, TargetShape
from dflash_trt.plan.perf_model import Acceptance, Calibration, StepModel
from dflash_trt.plan.recipe import ParallelSpec, ServingSpec, SpeculativeSpec, TrtllmSpec

PLANNING_CONTEXT = 2048
MIN_SPEEDUP = 1.05
DEFAULT_TAU = {"qwen3": 6.5, "qwen3_moe": 6.5, "qwen3_5": 6.5, "qwen3_5_moe": 6.5, "llama": 4.0, "gpt_oss": 4.5}


# --- Step model -------------------------------------------------------------------------


def step_model(
    dep: Deployment, tp: int, ctx: int, calibration: Calibration | None = None, stack: str | None = None
) -> StepModel:
    """The deployment's step times at ``tp`` and decode context ``ctx`` (:mod:`perf_model`)."""
    cal = calibration or perf_model.shipped_calibration()
    k = cal.constants(stack or perf_model.stack_for(dep.gpu))
    return StepModel(
        dep.target,
        dep.drafter,
        dep.gpu,
        dep.precision,
        dep.kv_cache,
        tp,
        ctx,
        k,
        weight_bytes(dep.target, dep.precision),
        cal.shared,
    )


# --- The plan ---------------------------------------------------------------------------


def _best_len(roof: StepModel, b: int, longest: int, alpha: Acceptance) -> int:
    """The longest draft within 1% of the best predicted speedup (flat curves keep long drafts)."""
    speed = {n: roof.speedup(b, n, alpha) for n in range(1, longest + 1)}
    top = max(speed.values())
    return max(n for n, v in speed.items() if v >= 0.99 * top)


def _wanted(roof: StepModel, max_batch_size: int, max_len: int, alpha: Acceptance) -> list[int]:
    """The step model's draft length at every batch size 1..max_batch_size: non-increasing, and
    off (0) from the first batch size where the best length stops paying (batch 1 always drafts)."""
    out, prev = [max_len], max_len
    for b in range(2, max_batch_size + 1):
        if prev:
            best = _best_len(roof, b, prev, alpha)
            prev = best if roof.speedup(b, best, alpha) >= MIN_SPEEDUP else 0
        out.append(prev)
    return out


def _curve(roof: StepModel, lengths: list[int], alpha: Acceptance) -> list[CurvePoint]:
    """The curve at 1, 2, 4, ..., max_batch_size, for the lengths TensorRT-LLM drafts."""
    rows = []
    for b in sched_mod.batch_grid(len(lengths)):
        n = lengths[b - 1]
        rows.append(CurvePoint(batch=b, draft_len=n, speedup=round(roof.speedup(b, n, alpha) if n else 1.0, 3)))
    return rows


def predicted(roof: StepModel, lengths: list[int], acc: Acceptance, gpus: int) -> list[Prediction]:
    """Tokens/s per user and per GPU, with the planned draft lengths and without drafting, at
    1, 2, 4, ..., max_batch_size (``gpus``: the GPUs one server uses)."""
    rows = []
    for b in sched_mod.batch_grid(len(lengths)):
        n = lengths[b - 1]
        user, base = roof.per_user(b, n, acc), roof.per_user(b, 0, acc)
        rows.append(
            Prediction(
                batch=b,
                draft_len=n,
                tokens_per_second_per_user=round(user, 3),
                baseline_tokens_per_second_per_user=round(base, 3),
                output_tokens_per_second_per_gpu=round(b * user / gpus, 3),
                baseline_output_tokens_per_second_per_gpu=round(b * base / gpus, 3),
                speedup=round(user / base, 3),
            )
        )
    return rows


def make_plan(
    dep: Deployment,
    serving: ServingSpec,
    spec: SpeculativeSpec,
    parallel: ParallelSpec | None = None,
    trtllm: TrtllmSpec | None = None,
    calibration: Calibration | None = None,
    errors: list[uncertainty.RowError] | None = None,
    release: trtllm_releases.Release | None = None,
    stack: str | None = None,
    tables: Callable[[int], silicon.Tables | None] | None = None,
) -> Plan:
    """Plan a deployment from the recipe's serving, speculative, parallel and trtllm sections;
    step times from ``calibration`` (default: the package's, :func:`perf_model.shipped_calibration`); every
    predicted speedup's range from ``errors`` (the user's own rows' leave-one-out errors), else
    the published rows' (:mod:`uncertainty`); ``release``: the targeted release's row as completed
    from the installed classes (``deploy.trtllm_installed``), default the table's."""
    t, d, gpu, parallel = dep.target, dep.drafter, dep.gpu, parallel or ParallelSpec()
    release = release or trtllm_releases.get_release((trtllm or TrtllmSpec()).release)
    tp_, backend, serving, sized, warnings = _placement(dep, serving, spec, parallel, release)
    block, tau, acc = _block_and_acceptance(spec, d, t)
    cal, stack, roof = _planning_step_model(dep, tp_, serving, calibration, stack, tables)
    max_len = _max_draft_len(spec, roof, block, acc)
    warnings += _no_gain(roof, max_len, acc, tau, gpu.name)
    serving = rules.token_budget(
        lambda s: memory(dep, tp_, s, max_len, backend, release), serving, max_len, gpu.name, warnings
    )
    mode, max_conc, sched, lengths = _back_off(roof, serving, spec, max_len, acc, release, warnings)
    mem = _scheduled_memory(dep, tp_, serving, max_len, backend, release, sched)
    tail = rules.recompute_tail(spec.context_recompute_tail, serving.enable_block_reuse, release, warnings)
    plan = Plan(
        gpu=gpu.name,
        gpus=dep.gpus,
        tp=tp_,
        ep=parallel.ep,
        precision=dep.precision,
        kv_cache=dep.kv_cache,
        memory=PlanMemory.model_validate(mem.as_dict()),
        block_size=block,
        max_draft_len=max_len,
        acceptance=round(tau, 3),
        alpha=round(acc.alpha, 4),
        attention_backend=backend,
        schedule=mode,
        max_concurrency=max_conc,
        draft_len_schedule=sched,
        curve=_curve(roof, lengths, acc),
        warnings=warnings,
        calibration=cal.describe(stack),
        predicted=predicted(roof, lengths, acc, tp_),
        draft_lengths=_draft_runs(lengths),
        trtllm_release=release.version,
        **_serving_fields(serving, tail, warnings, t, gpu, release),
        kv_cache_free_gpu_memory_fraction=mem.fraction,
        sized=sized,
        stack=stack,
        step_sources=silicon.sources(roof, cal.describe(stack), calibration is not None, lengths),
    )
    _complete_rows(plan, roof, errors, dep.mtp_layers, acc, lengths)
    return plan


def _placement(
    dep: Deployment,
    serving: ServingSpec,
    spec: SpeculativeSpec,
    parallel: ParallelSpec,
    release: trtllm_releases.Release,
) -> tuple[int, str, ServingSpec, list[dict], list[str]]:
    """Where the pair runs: (tp, attention backend, serving sized to the GPUs, what sizing lowered, warnings so far)."""
    t, d, gpu = dep.target, dep.drafter, dep.gpu
    rules.refuse_disaggregated(serving.disaggregated)
    warnings: list[str] = []
    if t.max_position_embeddings and serving.max_seq_len > t.max_position_embeddings:
        warnings.append(
            f"max_seq_len {serving.max_seq_len} exceeds the target's max_position_embeddings "
            f"{t.max_position_embeddings}"
        )
    backend = rules.attention_backend(spec.attention_backend, gpu, release, warnings, d.head_dim)
    tp_, _, serving, sized = sizing.size_serving(
        lambda s: choose_tp(dep, parallel, s, backend, release), serving, f"{dep.gpus}x {gpu.name}"
    )
    warnings += [f"{c['key']} lowered from {c['from']} to {c['to']}: {c['why']}" for c in sized]
    return tp_, backend, serving, sized, warnings


def _planning_step_model(
    dep: Deployment,
    tp: int,
    serving: ServingSpec,
    calibration: Calibration | None,
    stack: str | None,
    tables: Callable[[int], silicon.Tables | None] | None,
) -> tuple[Calibration, str, StepModel]:
    """(calibration, stack, step model) the plan's speedups come from, at the planning context; the
    step model combined with the silicon ``tables(tp)`` when given."""
    cal = calibration or perf_model.shipped_calibration()
    stack = stack or perf_model.stack_for(dep.gpu)
    roof = step_model(dep, tp, max(1, min(serving.max_seq_len // 2, PLANNING_CONTEXT)), cal, stack)
    if tables is not None:  # tables(tp); the user's calibration was refitted over them (calibrate.from_files)
        roof = silicon.combined(roof, tables(tp), refitted=calibration is not None)
    return cal, stack, roof


def _no_gain(roof: StepModel, max_len: int, acc: Acceptance, tau: float, gpu_name: str) -> list[str]:
    """The warning when even batch 1 gains nothing from drafting (drafting stays on)."""
    if roof.speedup(1, max_len, acc) >= MIN_SPEEDUP:
        return []
    return [
        f"the step model predicts no gain from drafting even at batch 1 on {gpu_name} "
        f"(tau {tau:.2f}); drafting stays on at max_draft_len {max_len}"
    ]


def _back_off(
    roof: StepModel,
    serving: ServingSpec,
    spec: SpeculativeSpec,
    max_len: int,
    acc: Acceptance,
    release: trtllm_releases.Release,
    warnings: list[str],
) -> tuple[str, int | None, dict | None, list[int]]:
    """(schedule, max_concurrency, draft_len_schedule, lengths): the draft length the step model wants
    at each batch size, as the release's back-off drafts it; what a draft-length floor costs is warned."""
    want = _wanted(roof, serving.max_batch_size, max_len, acc)
    mode, max_conc, sched, lengths = sched_mod.choose_schedule(want, spec, max_len, release)
    warnings += sched_mod.floor_cost(want, lengths, lambda b, n: roof.speedup(b, n, acc), release)
    return mode, max_conc, sched, lengths


def _scheduled_memory(
    dep: Deployment,
    tp: int,
    serving: ServingSpec,
    max_len: int,
    backend: str,
    release: trtllm_releases.Release,
    sched: dict | None,
) -> Memory:
    """Memory per GPU with the draft_len_schedule's CUDA graphs (startup.captured_batch_sizes); refused
    when it does not fit."""
    mem = memory(dep, tp, serving, max_len, backend, release, sched)
    if not mem.fits:
        raise HardwareError(
            f"with the draft_len_schedule's CUDA graphs the plan needs {_gib(mem.total)} per GPU "
            f"on {dep.gpu.name}, {_gib(mem.missing)} missing: lower serving.max_batch_size"
        )
    return mem


def _draft_runs(lengths: list[int]) -> list[DraftRun]:
    """The per-batch draft lengths as runs of equal length, as the plan records them."""
    return [
        DraftRun(batch_from=r.first, batch_to=r.last, draft_len=r.draft_len) for r in sched_mod.schedule_runs(lengths)
    ]


def _complete_rows(
    plan: Plan,
    roof: StepModel,
    errors: list[uncertainty.RowError] | None,
    mtp_layers: int,
    acc: Acceptance,
    lengths: list[int],
) -> None:
    """The rows' speedup ranges and MTP arms, and the vLLM schedule, from the plan's step model."""
    tabled = isinstance(roof, silicon.SiliconStepModel) and roof.uses_tables
    _ranges(plan, plan.stack, errors, silicon.loo_errors() if tabled and not errors else None)
    _arms(plan, roof, mtp_layers, acc)
    if any(lengths):
        n, entries = schedule_vllm.from_lengths(lengths)
        plan.vllm_schedule = VllmPlan(num_speculative_tokens=n, num_speculative_tokens_per_batch_size=entries)


def _block_and_acceptance(spec: SpeculativeSpec, d: DraftShape, t: TargetShape) -> tuple[int, float, Acceptance]:
    """The runtime block (at most the drafter's trained one), the expected tau and the acceptance model."""
    block = spec.block_size or d.block_size
    if block > d.block_size:
        raise RecipeError(
            f"speculative.block_size {block} exceeds the drafter's trained block {d.block_size} "
            "(TensorRT-LLM refuses a runtime block wider than the checkpoint's, PR #17935)"
        )
    if block < 2:
        raise RecipeError("speculative.block_size must be >= 2 to draft anything")
    tau = min(float(spec.acceptance or DEFAULT_TAU.get(t.model_type, 1 + 0.25 * (block - 1))), float(block))
    return block, tau, Acceptance.from_tau(tau, block, spec.per_position_acceptance)


def _max_draft_len(spec: SpeculativeSpec, roof: StepModel, block: int, acc: Acceptance) -> int:
    """The recipe's max_draft_len (1 .. block - 1), or on ``auto`` the best at batch 1."""
    if spec.max_draft_len == "auto":
        return _best_len(roof, 1, block - 1, acc)
    max_len = int(spec.max_draft_len)
    if not 1 <= max_len <= block - 1:
        raise RecipeError(f"speculative.max_draft_len {max_len} must be between 1 and block size - 1 ({block - 1})")
    return max_len


def _serving_fields(
    serving: ServingSpec,
    tail: int | None,
    warnings: list[str],
    t: TargetShape,
    gpu: GPU,
    release: trtllm_releases.Release,
) -> dict:
    """The plan's serving fields: token budget, recompute tail, chunked prefill, MoE backend, sizes."""
    return dict(
        max_num_tokens=serving.max_num_tokens,
        context_recompute_tail=tail,
        enable_chunked_prefill=rules.chunked_prefill(serving, tail, warnings),
        moe_backend=rules.moe_backend(t.model_type, gpu, release),
        max_batch_size=serving.max_batch_size,
        max_seq_len=serving.max_seq_len,
    )


def _arms(plan: Plan, roof: StepModel, mtp_layers: int, acc: Acceptance) -> None:
    """The MTP arm's predicted speedup beside DFlash's, and which arm wins, per curve row."""
    arm = mtp_mod.plan_arm(roof, mtp_layers, acc) if mtp_layers else None
    plan.mtp = PlannedMtp.model_validate(arm.as_dict()) if arm else None
    for row in plan.curve:
        m = None
        if arm:
            m = row.mtp_speedup = round(mtp_mod.speedup(roof, row.batch, arm.draft_len, mtp_mod.acceptance(acc)), 3)
        row.winner = mtp_mod.arm_winner(row.speedup if row.draft_len else 1.0, m)


def _ranges(
    plan: Plan,
    stack: str,
    errors: list[uncertainty.RowError] | None,
    model_rows: list[uncertainty.RowError] | None = None,
) -> None:
    """Each curve and predicted row's ``speedup_range`` [low, high] and what it rests on
    (``model_rows``: the step model's own leave-one-out rows where not the calibrated model's)."""
    own = bool(errors)
    rows = errors if errors else (model_rows or uncertainty.shipped_errors())
    table: list[CurvePoint | Prediction] = [*plan.curve, *plan.predicted]
    for row in table:
        r = uncertainty.speedup_range(row.speedup, rows, stack, plan.gpu, row.batch, own=own)
        row.speedup_range, row.range_basis = [r.low, r.high], r.basis
