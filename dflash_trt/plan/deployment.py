"""Deployment planning: memory per GPU, tensor-parallel size, draft length and back-off.

Everything here is arithmetic on config shapes (:mod:`dflash_trt.plan.model_shapes`) and datasheet
figures (:mod:`dflash_trt.plan.hardware`); no weights are needed. Bytes are exact integers.

Memory per GPU at tensor-parallel size ``t`` (the plan fits when the sum <= GPU memory)
-------------------------------------------------------------------------------------
* target weights at precision::

      bf16 :  2 B x linear                    fp8 :  1 B x linear + 8 B x n_linear
      nvfp4:  0.5 B x linear + linear/16 B (FP8 block scales) + 8 B x n_linear
      (8 B per linear = FP32 weight_scale[_2] + input_scale)
      + 2 B x (embedding + lm_head + norms/biases/routers)   -- kept BF16 (exclude_modules)

  As shipped (BF16, or a pre-quantized checkpoint such as gpt-oss MXFP4) the checkpoint's
  real byte count is used when known (safetensors headers, ``sizes.json``).
  Per GPU: ``embedding + (total - embedding) / t`` (the input embedding is replicated).
* drafter: BF16 parameters, replicated on every rank (conservative).
* drafter context arena (TensorRT-LLM ``_torch/speculative/dflash.py``,
  ``compute_dflash_ctx_buffer_bytes``), per rank, with L = max_draft_len::

      2 x (max_batch_size + 1) x L_draft x (min(max_seq_len, drafter max_position_embeddings) + L + 1)
        x ceil(n_kv_draft / t) x head_dim x 2 B

  (the TRTLLM draft attention backend rounds each slot up to 32-token pages and keeps the
  arena inside the draft KV-cache pool; VANILLA and FA4 allocate it as worker-owned buffers).
  Before the draft length is chosen the trained block's ``B - 1`` bounds L.
* separate draft KV pool, per release and draft backend (``Release.draft_kv_manager``, PR #19410):
  releases before it give VANILLA and FA4 a managed draft KV cache too, reserved but never read;
  it is charged as the paged arena (the size the TRTLLM backend's pool has). From PR #19410 only
  TRTLLM has one, and there it IS the arena (not counted twice).
* KV cache for the worst case, every sequence at ``max_seq_len``::

      2 x layers x ceil(n_kv / t) x head_dim x kv_bytes x max_seq_len x max_batch_size

  (kv_bytes 2 for auto/BF16, 1 for FP8; KV heads are split across ranks, replicated
  when t > n_kv.) ``TargetShape.sequence_bytes`` counts the other families: MLA's latent on
  every rank, Gated DeltaNet states per sequence instead of K/V (``family_shapes``).
* activations: ``max_num_tokens x (8 x hidden + 3 x ceil(intermediate / t)) x 2 B`` for
  the widest prefill step plus ``max_batch_size x (L + 1) x vocab x 4 B`` of FP32 verification
  logits (DFlash verifies the K drafts + the bonus, ``dflash.py`` ``_draft_tokens_per_req``);
  and a fixed runtime reserve of 2 GiB (CUDA context, cuBLAS/NCCL workspaces).
* through start-up (:mod:`dflash_trt.plan.startup`): the CUDA graphs TensorRT-LLM captures (its batch
  sizes and the schedule's keys) and 4 GiB of post-arena headroom; ``free_gpu_memory_fraction``
  chosen so the KV pool leaves them (and the dense arena) their room. Defaults that do not fit are
  lowered, values the user set are honoured or refused (:mod:`dflash_trt.plan.sizing`).

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

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass

from dflash_trt.errors import HardwareError, RecipeError
from dflash_trt.ingest import CurvePoint, DraftRun, Plan, PlanMemory, PlannedMtp, Prediction, VllmPlan
from dflash_trt.plan import mtp as mtp_mod
from dflash_trt.plan import perf_model, schedule_vllm, silicon, sizing, startup, trtllm_releases, uncertainty
from dflash_trt.plan import schedule as sched_mod
from dflash_trt.plan import trtllm_rules as rules
from dflash_trt.plan.acceptance import expected_tau, fit_alpha  # noqa: F401 - planner's public names
from dflash_trt.plan.hardware import GPU
from dflash_trt.plan.model_shapes import DraftShape, TargetShape
from dflash_trt.plan.perf_model import Acceptance, Calibration, StepModel
from dflash_trt.plan.recipe import ParallelSpec, ServingSpec, SpeculativeSpec, TrtllmSpec

GiB = 1 << 30
RUNTIME_RESERVE = 2 * GiB
PLANNING_CONTEXT = 2048
MIN_SPEEDUP = 1.05
DEFAULT_TAU = {"qwen3": 6.5, "qwen3_moe": 6.5, "qwen3_5": 6.5, "qwen3_5_moe": 6.5, "llama": 4.0, "gpt_oss": 4.5}


@dataclass(frozen=True)
class Deployment:
    """What the planner sizes: the pair's shapes, the GPUs, the precision the target runs at."""

    target: TargetShape
    drafter: DraftShape
    gpu: GPU
    gpus: int           # GPUs available in all (per node x nodes)
    precision: str      # resolved: bf16 | fp8 | nvfp4 | mxfp4 (not the recipe's "auto")
    kv_cache: str       # auto | fp8
    mtp_layers: int = 0  # MTP layers the target's config declares (plan.mtp.layers)


# --- Memory -----------------------------------------------------------------------------


def weight_bytes(t: TargetShape, precision: str) -> int:
    """Total target weight bytes at ``precision`` (see the module docstring)."""
    bf16_rest = 2 * (t.embed_params + t.lm_head_params + t.other_params)
    if t.shipped_precision is not None and precision == t.shipped_precision and t.shipped_bytes:
        return t.shipped_bytes
    if precision == "bf16":
        return t.shipped_bytes if (t.shipped_bytes and t.shipped_precision is None) else 2 * t.params
    if precision == "fp8":
        return t.linear_params + 8 * t.n_linear + bf16_rest
    if precision == "nvfp4":
        return t.linear_params // 2 + t.linear_params // 16 + 8 * t.n_linear + bf16_rest
    if precision == "mxfp4":  # experts 4.25 bits (E8M0 scale per 32), the rest BF16
        return (2 * (t.linear_params - t.expert_params) + t.expert_params * 17 // 32 + bf16_rest)
    raise RecipeError(f"unknown precision {precision!r}")


@dataclass
class Memory:
    """Bytes per GPU."""

    weights: int
    drafter: int
    drafter_arena: int
    kv_cache: int
    activations: int
    reserve: int
    capacity: int
    arena_in_kv_pool: bool = False   # TRTLLM draft attention: the arena lives in the draft KV pool
    draft_kv_pool: int = 0           # a separate managed draft KV cache drafting does not use (PR #19410)
    cuda_graphs: int = 0             # the captured decode graphs' pool (plan.startup)
    headroom: int = 0                # post-arena consumers (plan.startup.HEADROOM)
    graph_batch_sizes: tuple[int, ...] = ()
    user_fraction: float | None = None   # free_gpu_memory_fraction the user set (None: chosen)

    @property
    def total(self) -> int:
        return (self.weights + self.drafter + self.drafter_arena + self.draft_kv_pool + self.kv_cache
                + self.activations + self.reserve + self.cuda_graphs + self.headroom)

    @property
    def free_after_load(self) -> int:
        """Free when TensorRT-LLM sizes the KV pool (weights, drafter and CUDA context resident)."""
        return self.capacity - self.weights - self.drafter - self.reserve

    @property
    def in_pool(self) -> int:
        return self.kv_cache + self.draft_kv_pool + (self.drafter_arena if self.arena_in_kv_pool else 0)

    @property
    def after_pool(self) -> int:
        arena = 0 if self.arena_in_kv_pool else self.drafter_arena
        return arena + self.activations + self.cuda_graphs + self.headroom

    @property
    def fraction(self) -> float:
        """``kv_cache_config.free_gpu_memory_fraction``: the user's, else the largest that leaves start-up its room."""
        if self.user_fraction is not None:
            return self.user_fraction
        return startup.best_fraction(self.free_after_load, self.after_pool)

    @property
    def missing(self) -> int:
        free, f = self.free_after_load, self.fraction
        short = (self.total - self.capacity, self.in_pool - int(f * free), self.after_pool - int((1 - f) * free))
        return max(0, *short)

    @property
    def fits(self) -> bool:
        return self.missing == 0 and self.fraction >= startup.MIN_FRACTION

    def budget(self) -> startup.Budget:
        return startup.Budget(self.free_after_load, self.in_pool, self.after_pool, self.fraction,
                              "recipe" if self.user_fraction is not None else "chosen", self.graph_batch_sizes)

    def as_dict(self) -> dict:
        backend = "TRTLLM" if self.arena_in_kv_pool else "VANILLA"
        return {**asdict(self), "total": self.total, "fits": self.fits, "missing": self.missing,
                "budget": self.budget().as_dict(),
                "pr19466": startup.pr19466(self.capacity, self.weights, self.fraction, self.drafter_arena, backend)}


def kv_bytes_per_token(t: TargetShape, tp: int, kv_cache: str) -> int:
    kvb = 1 if kv_cache == "fp8" else 2
    return 2 * t.layers * math.ceil(t.kv_heads / tp) * t.head_dim * kvb


def drafter_arena(d: DraftShape, tp: int, serving: ServingSpec, draft_len: int, backend: str = "VANILLA") -> int:
    """The drafter's context K/V buffers per rank: TensorRT-LLM ``_torch/speculative/dflash.py``,
    ``compute_dflash_ctx_buffer_bytes`` (slots = max_batch_size + 1, one for padding)."""
    # the checkpoint's block_size per slot, not the runtime draft length (PR #17935's review)
    capacity = min(serving.max_seq_len, d.max_position_embeddings or serving.max_seq_len) + max(d.block_size,
                                                                                                  draft_len + 1)
    if backend == "TRTLLM":  # paged: whole 32-token pages per slot
        capacity = math.ceil(capacity / 32) * 32
    return 2 * (serving.max_batch_size + 1) * d.layers * capacity * math.ceil(d.kv_heads / tp) * d.head_dim * 2


def memory(dep: Deployment, tp: int, serving: ServingSpec, draft_len: int | None = None,
           backend: str = "VANILLA", release: trtllm_releases.Release | None = None,
           schedule: dict[int, int] | None = None) -> Memory:
    """Memory per GPU at tensor-parallel size ``tp`` (formulas in the module docstring; CUDA graphs,
    headroom and the fraction: :mod:`startup`); ``draft_len`` None: the trained block's ``B - 1``,
    an upper bound; ``release`` None: the default release's row; ``schedule``: the
    ``draft_len_schedule`` whose keys add graphs."""
    release = release or trtllm_releases.get_release(trtllm_releases.DEFAULT_RELEASE)
    t, d = dep.target, dep.drafter
    batch, seq, tokens = serving.max_batch_size, serving.max_seq_len, serving.max_num_tokens
    L = d.block_size - 1 if draft_len is None else draft_len
    total = weight_bytes(t, dep.precision)
    embed = 2 * t.embed_params
    per_gpu = embed + (total - embed) // tp
    kv = t.sequence_bytes(tp, dep.kv_cache, seq) * batch
    act = tokens * (8 * t.hidden + 3 * math.ceil(t.intermediate / tp)) * 2
    act += batch * (L + 1) * t.vocab * 4
    unused_pool = backend != "TRTLLM" and release.separate_draft_kv(backend)
    sizes = startup.captured_batch_sizes(batch, schedule) if serving.cuda_graphs else []
    user = "kv_cache_free_gpu_memory_fraction" in serving.model_fields_set
    return Memory(weights=per_gpu, drafter=d.bytes, drafter_arena=drafter_arena(d, tp, serving, L, backend),
                  kv_cache=kv, activations=act, reserve=RUNTIME_RESERVE, capacity=dep.gpu.memory_bytes,
                  arena_in_kv_pool=backend == "TRTLLM",
                  draft_kv_pool=drafter_arena(d, tp, serving, L, "TRTLLM") if unused_pool else 0,
                  cuda_graphs=startup.graph_bytes(t, d, tp, sizes, L), headroom=startup.HEADROOM,
                  graph_batch_sizes=tuple(sizes),
                  user_fraction=serving.kv_cache_free_gpu_memory_fraction if user else None)


def tp_candidates(t: TargetShape, gpus: int, ep: int = 1) -> list[int]:
    """Tensor-parallel sizes the model's head layout allows, smallest first, up to ``gpus``."""
    out, n = [], 1
    while n <= gpus:
        heads_ok = t.heads % n == 0 and (t.kv_heads % n == 0 or n % t.kv_heads == 0)
        ep_ok = n % ep == 0 and (not t.experts or t.experts % ep == 0)
        if heads_ok and ep_ok:
            out.append(n)
        n *= 2
    return out


# --- Step model -------------------------------------------------------------------------


def step_model(dep: Deployment, tp: int, ctx: int, calibration: Calibration | None = None,
               stack: str | None = None) -> StepModel:
    """The deployment's step times at ``tp`` and decode context ``ctx`` (:mod:`perf_model`)."""
    cal = calibration or perf_model.shipped_calibration()
    k = cal.constants(stack or perf_model.stack_for(dep.gpu))
    return StepModel(dep.target, dep.drafter, dep.gpu, dep.precision, dep.kv_cache, tp, ctx, k,
                     weight_bytes(dep.target, dep.precision), cal.shared)


# --- The plan ---------------------------------------------------------------------------


def _best_len(roof: StepModel, b: int, longest: int, alpha: Acceptance) -> int:
    """The longest draft within 1% of the best predicted speedup (flat curves keep long drafts)."""
    speed = {n: roof.speedup(b, n, alpha) for n in range(1, longest + 1)}
    top = max(speed.values())
    return max(n for n, v in speed.items() if v >= 0.99 * top)


def _gib(n: float) -> str:
    return f"{n / GiB:.1f} GiB"


def choose_tp(dep: Deployment, parallel: ParallelSpec, serving: ServingSpec,
              backend: str = "VANILLA", release: trtllm_releases.Release | None = None) -> tuple[int, Memory]:
    """The smallest TP that fits, or a HardwareError saying how much is missing."""
    t, gpu, gpus, tp, ep = dep.target, dep.gpu, dep.gpus, parallel.tp, parallel.ep
    if tp != "auto":
        if tp > gpus:
            raise HardwareError(f"parallel.tp={tp} needs {tp} GPUs; only {gpus} given (--gpus)")
        if tp not in tp_candidates(t, tp, ep):
            raise HardwareError(f"parallel.tp={tp} does not divide the target's {t.heads} heads / "
                                f"{t.kv_heads} KV heads (or ep={ep})")
        m = memory(dep, tp, serving, backend=backend, release=release)
        if not m.fits:
            raise HardwareError(f"does not fit at tp={tp} on {gpu.name}: needs {_gib(m.total)} per GPU of "
                                f"{_gib(m.capacity)}, {_gib(m.missing)} missing")
        return tp, m
    cands = tp_candidates(t, gpus, ep)
    if not cands:
        raise HardwareError(f"no tensor-parallel size <= {gpus} divides the target's heads (ep={ep})")
    for n in cands:
        m = memory(dep, n, serving, backend=backend, release=release)
        if m.fits:
            return n, m
    n = cands[-1]
    m = memory(dep, n, serving, backend=backend, release=release)
    raise HardwareError(
        f"does not fit on {gpus}x {gpu.name}: at tp={n} it needs {_gib(m.total)} per GPU of {_gib(m.capacity)} "
        f"({_gib(m.missing)} missing: weights {_gib(m.weights)}, KV cache {_gib(m.kv_cache)}, drafter arena "
        f"{_gib(m.drafter_arena + m.draft_kv_pool)}); use more GPUs, a lower precision, or a smaller "
        "max_seq_len/max_batch_size"
    )


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
        rows.append(Prediction(batch=b, draft_len=n, tokens_per_second_per_user=round(user, 3),
                               baseline_tokens_per_second_per_user=round(base, 3),
                               output_tokens_per_second_per_gpu=round(b * user / gpus, 3),
                               baseline_output_tokens_per_second_per_gpu=round(b * base / gpus, 3),
                               speedup=round(user / base, 3)))
    return rows


def make_plan(dep: Deployment, serving: ServingSpec, spec: SpeculativeSpec, parallel: ParallelSpec | None = None,
         trtllm: TrtllmSpec | None = None, calibration: Calibration | None = None,
         errors: list[uncertainty.RowError] | None = None, release: trtllm_releases.Release | None = None,
         stack: str | None = None, tables: Callable[[int], silicon.Tables | None] | None = None) -> Plan:
    """Plan a deployment from the recipe's serving, speculative, parallel and trtllm sections;
    step times from ``calibration`` (default: the package's, :func:`perf_model.shipped_calibration`); every
    predicted speedup's range from ``errors`` (the user's own rows' leave-one-out errors), else
    the published rows' (:mod:`uncertainty`); ``release``: the targeted release's row as completed
    from the installed classes (``deploy.trtllm_installed``), default the table's."""
    t, d, gpu, parallel = dep.target, dep.drafter, dep.gpu, parallel or ParallelSpec()
    release = release or trtllm_releases.get_release((trtllm or TrtllmSpec()).release)
    rules.refuse_disaggregated(serving.disaggregated)
    warnings: list[str] = []
    if t.max_position_embeddings and serving.max_seq_len > t.max_position_embeddings:
        warnings.append(f"max_seq_len {serving.max_seq_len} exceeds the target's max_position_embeddings "
                        f"{t.max_position_embeddings}")
    backend = rules.attention_backend(spec.attention_backend, gpu, release, warnings, d.head_dim)
    tp_, _, serving, sized = sizing.size_serving(lambda s: choose_tp(dep, parallel, s, backend, release), serving,
                                                 f"{dep.gpus}x {gpu.name}")
    warnings += [f"{c['key']} lowered from {c['from']} to {c['to']}: {c['why']}" for c in sized]
    block = spec.block_size or d.block_size
    if block > d.block_size:
        raise RecipeError(f"speculative.block_size {block} exceeds the drafter's trained block {d.block_size} "
                          "(TensorRT-LLM refuses a runtime block wider than the checkpoint's, PR #17935)")
    if block < 2:
        raise RecipeError("speculative.block_size must be >= 2 to draft anything")
    tau = min(float(spec.acceptance or DEFAULT_TAU.get(t.model_type, 1 + 0.25 * (block - 1))), float(block))
    acc = Acceptance.from_tau(tau, block, spec.per_position_acceptance)
    cal = calibration or perf_model.shipped_calibration()
    stack = stack or perf_model.stack_for(gpu)
    roof = step_model(dep, tp_, max(1, min(serving.max_seq_len // 2, PLANNING_CONTEXT)), cal, stack)
    if tables is not None:   # tables(tp); the user's calibration was refitted over them (calibrate.from_files)
        roof = silicon.combined(roof, tables(tp_), refitted=calibration is not None)
    if spec.max_draft_len == "auto":
        max_len = _best_len(roof, 1, block - 1, acc)
    else:
        max_len = int(spec.max_draft_len)
        if not 1 <= max_len <= block - 1:
            raise RecipeError(f"speculative.max_draft_len {max_len} must be between 1 and block size - 1 ({block - 1})")
    if roof.speedup(1, max_len, acc) < MIN_SPEEDUP:
        warnings.append(f"the step model predicts no gain from drafting even at batch 1 on {gpu.name} "
                        f"(tau {tau:.2f}); drafting stays on at max_draft_len {max_len}")
    serving = rules.token_budget(lambda s: memory(dep, tp_, s, max_len, backend, release), serving, max_len,
                                 gpu.name, warnings)
    want = _wanted(roof, serving.max_batch_size, max_len, acc)
    mode, max_conc, sched, lengths = sched_mod.choose_schedule(want, spec, max_len, release)
    warnings += sched_mod.floor_cost(want, lengths, lambda b, n: roof.speedup(b, n, acc), release)
    mem = memory(dep, tp_, serving, max_len, backend, release, sched)
    if not mem.fits:   # the schedule's keys add graphs (startup.captured_batch_sizes)
        raise HardwareError(f"with the draft_len_schedule's CUDA graphs the plan needs {_gib(mem.total)} per GPU "
                            f"on {gpu.name}, {_gib(mem.missing)} missing: lower serving.max_batch_size")
    tail = rules.recompute_tail(spec.context_recompute_tail, serving.enable_block_reuse, release, warnings)
    plan = Plan(gpu=gpu.name, gpus=dep.gpus, tp=tp_, ep=parallel.ep, precision=dep.precision, kv_cache=dep.kv_cache,
                memory=PlanMemory.model_validate(mem.as_dict()), block_size=block, max_draft_len=max_len,
                acceptance=round(tau, 3),
                alpha=round(acc.alpha, 4),
                attention_backend=backend, schedule=mode, max_concurrency=max_conc, draft_len_schedule=sched,
                curve=_curve(roof, lengths, acc), warnings=warnings, calibration=cal.describe(stack),
                predicted=predicted(roof, lengths, acc, tp_),
                draft_lengths=[DraftRun(batch_from=r.first, batch_to=r.last, draft_len=r.draft_len)
                               for r in sched_mod.schedule_runs(lengths)], trtllm_release=release.version,
                max_num_tokens=serving.max_num_tokens, context_recompute_tail=tail,
                enable_chunked_prefill=rules.chunked_prefill(serving, tail, warnings),
                moe_backend=rules.moe_backend(t.model_type, gpu, release),
                max_batch_size=serving.max_batch_size, max_seq_len=serving.max_seq_len,
                kv_cache_free_gpu_memory_fraction=mem.fraction, sized=sized, stack=stack,
                step_sources=silicon.sources(roof, cal.describe(stack), calibration is not None, lengths))
    tabled = isinstance(roof, silicon.SiliconStepModel) and roof.uses_tables
    _ranges(plan, stack, errors, silicon.loo_errors() if tabled and not errors else None)
    _arms(plan, roof, dep.mtp_layers, acc)
    if any(lengths):
        n, entries = schedule_vllm.from_lengths(lengths)
        plan.vllm_schedule = VllmPlan(num_speculative_tokens=n, num_speculative_tokens_per_batch_size=entries)
    return plan


def _arms(plan: Plan, roof: StepModel, mtp_layers: int, acc: Acceptance) -> None:
    """The MTP arm's predicted speedup beside DFlash's, and which arm wins, per curve row."""
    arm = mtp_mod.plan_arm(roof, mtp_layers, acc) if mtp_layers else None
    plan.mtp = PlannedMtp.model_validate(arm.as_dict()) if arm else None
    for row in plan.curve:
        m = None
        if arm:
            m = row.mtp_speedup = round(mtp_mod.speedup(roof, row.batch, arm.draft_len, mtp_mod.acceptance(acc)), 3)
        row.winner = mtp_mod.arm_winner(row.speedup if row.draft_len else 1.0, m)


def _ranges(plan: Plan, stack: str, errors: list[uncertainty.RowError] | None,
            model_rows: list[uncertainty.RowError] | None = None) -> None:
    """Each curve and predicted row's ``speedup_range`` [low, high] and what it rests on
    (``model_rows``: the step model's own leave-one-out rows where not the calibrated model's)."""
    own = bool(errors)
    rows = errors if errors else (model_rows or uncertainty.shipped_errors())
    table: list[CurvePoint | Prediction] = [*plan.curve, *plan.predicted]
    for row in table:
        r = uncertainty.speedup_range(row.speedup, rows, stack, plan.gpu, row.batch, own=own)
        row.speedup_range, row.range_basis = [r.low, r.high], r.basis
