"""Memory through start-up: what TensorRT-LLM allocates AFTER the KV pool, and the fraction that leaves room for it.

Invariant: a plan fits when every byte TensorRT-LLM allocates from start-up to the first served
request fits on the GPU, in the order it allocates them, not only the bytes resident at the end
of loading. The order (``tensorrt_llm/_torch/pyexecutor/_util.py``, PRs #18343, #19410, #19466):

1. weights, the drafter's weights and the CUDA context (``memory_model.memory``'s weights, drafter,
   reserve) are resident when TensorRT-LLM measures free memory;
2. the KV pool takes ``free_gpu_memory_fraction`` of that free memory: the target's KV cache and,
   with the TRTLLM draft attention backend, the drafter's context paged through the draft KV
   manager (PR #18343 / #19410; a release that still gives VANILLA/FA4 a separate draft KV
   manager charges that pool here too);
3. what is left, ``(1 - fraction) x free``, must hold the dense drafter context arena (VANILLA/FA4:
   worker-owned buffers outside the fraction), the activations, the CUDA graphs and at least
   :data:`HEADROOM` of post-arena consumers. PR #19466 (open) saw fractions 0.90/0.85 run out of
   memory allocating the arena and 0.80/0.75 die 0.1-0.2 GiB short in CUDA-graph capture, with
   post-arena consumers of 2-4 GiB, not monotone in batch size: hence 4 GiB, never less.

CUDA graphs: TensorRT-LLM captures one decode graph per batch size of
``CudaGraphConfig._generate_cuda_graph_batch_sizes`` (with padding: 1, 2, 4, 8, 16, ..., 128, then
+64 steps, then ``max_batch_size``) and ``DecodeCudaGraphConfig._merge_schedule_keys`` adds every
``draft_len_schedule`` key at or under the graph maximum (a stored ``llm_args.py``, release
unknown: charged for every release, the safe side). The graphs share one memory pool, so the pool
is the largest graph's intermediates (the decode step at ``max_batch_size`` x ``(L + 1)`` tokens:
target and drafter activations and FP32 verification logits) plus :data:`GRAPH_OVERHEAD` per
captured graph (an assumption, not a measurement: its static inputs and outputs).

``free_gpu_memory_fraction`` is chosen as the largest value (in steps of 0.001, at most
:data:`MAX_FRACTION`, TensorRT-LLM's default) that leaves step 3 its room; a fraction the user
set is honoured when it leaves that room, else refused in one line.

PR #19466's estimate, printed beside ours and marked as from an open pull request
(``tensorrt_llm/_torch/speculative/dflash.py::derive_dflash_ctx_memory_budget_bytes`` and its
tests): ``budget = (GPU memory - weights - 4 GiB) x (1 - fraction) x 0.70``; the context buffers
(``compute_dflash_ctx_buffer_bytes``) over it warn on TRTLLM and raise on VANILLA/FA4.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

GiB = 1 << 30
MiB = 1 << 20
HEADROOM = 4 * GiB  # post-arena consumers: 2-4 GiB measured in PR #19466
GRAPH_OVERHEAD = 16 * MiB  # per captured graph (static buffers); an assumption
MAX_FRACTION = 0.90  # KvCacheConfig.free_gpu_memory_fraction's default
MIN_FRACTION = 0.05  # below it the KV pool is not worth serving from
PR19466_SAFETY = 0.70  # _DFLASH_BUDGET_SAFETY_FACTOR (PR #19466, open)
PR19466_OVERHEAD = 4 * GiB  # _DFLASH_BUDGET_RUNTIME_OVERHEAD_BYTES (PR #19466, open)


def captured_batch_sizes(
    max_batch_size: int, schedule: dict[int, int] | None = None, enable_padding: bool = True
) -> list[int]:
    """The decode batch sizes TensorRT-LLM captures a graph for (module docstring)."""
    if enable_padding:
        sizes = [1, 2, 4] + [8 * i for i in range(1, 17)]
        while sizes[-1] + 64 <= max_batch_size:
            sizes.append(sizes[-1] + 64)
    else:
        sizes = list(range(1, 32)) + [32, 64, 128]
        sizes += [2**i for i in range(8, math.ceil(math.log2(max(max_batch_size, 2))))]
    sizes = sorted(s for s in set(sizes) if s <= max_batch_size)
    if not sizes or sizes[-1] != max_batch_size:
        sizes.append(max_batch_size)
    extra = {k for k in (schedule or {}) if k <= sizes[-1]}  # _merge_schedule_keys
    return sorted(set(sizes) | extra)


def graph_pool(target, drafter, tp: int, batch: int, draft_len: int) -> int:
    """The shared graph pool: the decode step at ``batch`` rows of ``draft_len + 1`` tokens
    (``target``/``drafter``: TargetShape / DraftShape), same per-token terms as the activations."""
    tokens = batch * (draft_len + 1)
    act = tokens * (8 * target.hidden + 3 * math.ceil(target.intermediate / tp)) * 2
    act += tokens * (8 * drafter.hidden + 3 * drafter.intermediate) * 2
    return act + tokens * target.vocab * 4


def graph_bytes(target, drafter, tp: int, sizes: list[int], draft_len: int) -> int:
    """CUDA graphs for the captured ``sizes``: the pool of the largest plus an overhead each."""
    if not sizes:
        return 0
    return graph_pool(target, drafter, tp, max(sizes), draft_len) + GRAPH_OVERHEAD * len(sizes)


@dataclass(frozen=True)
class Budget:
    """The start-up budget of one plan, bytes per GPU."""

    free_after_load: int  # what TensorRT-LLM measures free before the KV pool
    in_pool: int  # what the KV pool must hold (target KV, paged draft context)
    after_pool: int  # what must fit beside it (dense arena, activations, graphs, headroom)
    fraction: float  # free_gpu_memory_fraction written in the config
    fraction_source: str  # "chosen" | "recipe"
    graph_batch_sizes: tuple[int, ...]

    @property
    def left_after_pool(self) -> int:
        return int(self.free_after_load * (1 - self.fraction)) - self.after_pool

    def as_dict(self) -> dict:
        # JSON-shaped (the plan stores it as written): the batch sizes a list, as they read back
        return {
            **asdict(self),
            "graph_batch_sizes": list(self.graph_batch_sizes),
            "left_after_pool": self.left_after_pool,
        }


def best_fraction(free: int, after_pool: int) -> float:
    """The largest fraction (0.001 steps, <= MAX_FRACTION) leaving ``after_pool`` bytes outside the pool."""
    if free <= 0:
        return 0.0
    return min(MAX_FRACTION, math.floor(1000 * (free - after_pool) / free) / 1000)


def pr19466(capacity: int, weights: int, fraction: float, buffers: int, backend: str) -> dict:
    """PR #19466's config-time estimate (open pull request; module docstring) at ``fraction``."""
    budget = max(0, int((capacity - weights - PR19466_OVERHEAD) * (1 - fraction) * PR19466_SAFETY))
    over = buffers > budget
    verdict = "fits" if not over else ("warns" if backend == "TRTLLM" else "raises")
    return {
        "source": "TensorRT-LLM PR #19466 (open, 2026-09-21; not in a release)",
        "budget": budget,
        "buffers": buffers,
        "fraction": fraction,
        "verdict": verdict,
    }
