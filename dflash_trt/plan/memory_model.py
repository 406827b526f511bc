"""Deployment memory per GPU: what the planner sizes, and the smallest tensor-parallel size that fits.

Everything here is arithmetic on config shapes (:mod:`dflash_trt.plan.model_shapes`) and datasheet
figures (:mod:`dflash_trt.plan.hardware`); no weights are needed. Bytes are exact integers.
:mod:`dflash_trt.plan.deployment` plans on it (draft lengths, back-off, the plan).

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
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from dflash_trt.errors import HardwareError, RecipeError
from dflash_trt.plan import startup, trtllm_releases
from dflash_trt.plan.hardware import GPU
from dflash_trt.plan.model_shapes import DraftShape, TargetShape
from dflash_trt.plan.recipe import ParallelSpec, ServingSpec

GiB = 1 << 30
RUNTIME_RESERVE = 2 * GiB


@dataclass(frozen=True)
class Deployment:
    """What the planner sizes: the pair's shapes, the GPUs, the precision the target runs at."""

    target: TargetShape
    drafter: DraftShape
    gpu: GPU
    gpus: int  # GPUs available in all (per node x nodes)
    precision: str  # resolved: bf16 | fp8 | nvfp4 | mxfp4 (not the recipe's "auto")
    kv_cache: str  # auto | fp8
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
        return 2 * (t.linear_params - t.expert_params) + t.expert_params * 17 // 32 + bf16_rest
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
    arena_in_kv_pool: bool = False  # TRTLLM draft attention: the arena lives in the draft KV pool
    draft_kv_pool: int = 0  # a separate managed draft KV cache drafting does not use (PR #19410)
    cuda_graphs: int = 0  # the captured decode graphs' pool (plan.startup)
    headroom: int = 0  # post-arena consumers (plan.startup.HEADROOM)
    graph_batch_sizes: tuple[int, ...] = ()
    user_fraction: float | None = None  # free_gpu_memory_fraction the user set (None: chosen)

    @property
    def total(self) -> int:
        return (
            self.weights
            + self.drafter
            + self.drafter_arena
            + self.draft_kv_pool
            + self.kv_cache
            + self.activations
            + self.reserve
            + self.cuda_graphs
            + self.headroom
        )

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
        return startup.Budget(
            self.free_after_load,
            self.in_pool,
            self.after_pool,
            self.fraction,
            "recipe" if self.user_fraction is not None else "chosen",
            self.graph_batch_sizes,
        )

    def as_dict(self) -> dict:
        backend = "TRTLLM" if self.arena_in_kv_pool else "VANILLA"
        return {
            **asdict(self),
            "total": self.total,
            "fits": self.fits,
            "missing": self.missing,
            "budget": self.budget().as_dict(),
            "pr19466": startup.pr19466(self.capacity, self.weights, self.fraction, self.drafter_arena, backend),
        }


def kv_bytes_per_token(t: TargetShape, tp: int, kv_cache: str) -> int:
    kvb = 1 if kv_cache == "fp8" else 2
    return 2 * t.layers * math.ceil(t.kv_heads / tp) * t.head_dim * kvb


def drafter_arena(d: DraftShape, tp: int, serving: ServingSpec, draft_len: int, backend: str = "VANILLA") -> int:
    """The drafter's context K/V buffers per rank: TensorRT-LLM ``_torch/speculative/dflash.py``,
    ``compute_dflash_ctx_buffer_bytes`` (slots = max_batch_size + 1, one for padding)."""
    # the checkpoint's block_size per slot, not the runtime draft length (PR #17935's review)
    capacity = min(serving.max_seq_len, d.max_position_embeddings or serving.max_seq_len) + max(
        d.block_size, draft_len + 1
    )
    if backend == "TRTLLM":  # paged: whole 32-token pages per slot
        capacity = math.ceil(capacity / 32) * 32
    return 2 * (serving.max_batch_size + 1) * d.layers * capacity * math.ceil(d.kv_heads / tp) * d.head_dim * 2


def memory(
    dep: Deployment,
    tp: int,
    serving: ServingSpec,
    draft_len: int | None = None,
    backend: str = "VANILLA",
    release: trtllm_releases.Release | None = None,
    schedule: dict[int, int] | None = None,
) -> Memory:
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
    return Memory(
        weights=per_gpu,
        drafter=d.bytes,
        drafter_arena=drafter_arena(d, tp, serving, L, backend),
        kv_cache=kv,
        activations=act,
        reserve=RUNTIME_RESERVE,
        capacity=dep.gpu.memory_bytes,
        arena_in_kv_pool=backend == "TRTLLM",
        draft_kv_pool=drafter_arena(d, tp, serving, L, "TRTLLM") if unused_pool else 0,
        cuda_graphs=startup.graph_bytes(t, d, tp, sizes, L),
        headroom=startup.HEADROOM,
        graph_batch_sizes=tuple(sizes),
        user_fraction=serving.kv_cache_free_gpu_memory_fraction if user else None,
    )


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


def _gib(n: float) -> str:
    return f"{n / GiB:.1f} GiB"


def choose_tp(
    dep: Deployment,
    parallel: ParallelSpec,
    serving: ServingSpec,
    backend: str = "VANILLA",
    release: trtllm_releases.Release | None = None,
) -> tuple[int, Memory]:
    """The smallest TP that fits, or a HardwareError saying how much is missing."""
    t, gpu, gpus, tp, ep = dep.target, dep.gpu, dep.gpus, parallel.tp, parallel.ep
    if tp != "auto":
        if tp > gpus:
            raise HardwareError(f"parallel.tp={tp} needs {tp} GPUs; only {gpus} given (--gpus)")
        if tp not in tp_candidates(t, tp, ep):
            raise HardwareError(
                f"parallel.tp={tp} does not divide the target's {t.heads} heads / {t.kv_heads} KV heads (or ep={ep})"
            )
        m = memory(dep, tp, serving, backend=backend, release=release)
        if not m.fits:
            raise HardwareError(
                f"does not fit at tp={tp} on {gpu.name}: needs {_gib(m.total)} per GPU of "
                f"{_gib(m.capacity)}, {_gib(m.missing)} missing"
            )
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
