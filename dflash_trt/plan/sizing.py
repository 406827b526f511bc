"""Sized, not refused: the serving limits a plan lowers to fit, and the ones it must honour.

Invariant: a value the user set (in the recipe file, with ``--set`` or a flag: pydantic's
``model_fields_set`` of :class:`ServingSpec`) is never changed; a default that does not fit is
lowered until the plan fits, and every key changed is named with its old and new value and why.
When only user-set values stand in the way, the refusal is one line naming them.

The order (each step halves one key; the first serving that fits at some tensor-parallel size
wins, so more GPUs are used before limits are lowered):

1. ``max_batch_size`` down to :data:`BATCH_FLOOR` (concurrency costs least to give up first: the
   per-user speed the plan predicts is unchanged);
2. ``max_seq_len`` down to :data:`SEQ_FLOOR`;
3. ``max_batch_size`` down to 1, then ``max_seq_len`` down to :data:`SEQ_MIN`.

``kv_cache_free_gpu_memory_fraction`` is not a sized key: left out, :mod:`startup` chooses it; set,
it is honoured, or refused in one line when it leaves start-up too little room.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

from dflash_trt.errors import HardwareError
from dflash_trt.plan.recipe import ServingSpec

GiB = 1 << 30
BATCH_FLOOR = 8
SEQ_FLOOR = 2048
SEQ_MIN = 256
SIZED = ("max_batch_size", "max_seq_len")
FRACTION = "kv_cache_free_gpu_memory_fraction"


def user_set(serving: ServingSpec) -> frozenset[str]:
    """The serving keys the user set explicitly."""
    return frozenset(serving.model_fields_set)


def _halve(serving: ServingSpec, key: str, floor: int) -> ServingSpec | None:
    value = getattr(serving, key)
    if value <= floor:
        return None
    return serving.model_copy(update={key: max(floor, value // 2)})


def lowered(serving: ServingSpec, fixed: frozenset[str]) -> Iterator[ServingSpec]:
    """Successively smaller servings, lowering only keys not in ``fixed`` (module docstring's order)."""
    s = serving
    for key, floor in (
        ("max_batch_size", BATCH_FLOOR),
        ("max_seq_len", SEQ_FLOOR),
        ("max_batch_size", 1),
        ("max_seq_len", SEQ_MIN),
    ):
        if key in fixed:
            continue
        while (nxt := _halve(s, key, floor)) is not None:
            s = nxt
            yield s


def changes(before: ServingSpec, after: ServingSpec, why: str) -> list[dict]:
    """One entry per key the sizing changed: ``{key, from, to, why}``."""
    return [
        {"key": f"serving.{k}", "from": getattr(before, k), "to": getattr(after, k), "why": why}
        for k in SIZED
        if getattr(before, k) != getattr(after, k)
    ]


def size_serving(
    choose: Callable[[ServingSpec], tuple[int, Any]], serving: ServingSpec, where: str
) -> tuple[int, Any, ServingSpec, list[dict]]:
    """``(tp, memory, serving, changes)``: ``choose(serving)`` is ``deployment.choose_tp`` at that
    serving (a HardwareError when nothing fits); ``where`` names the GPUs for the messages."""
    fixed = user_set(serving)
    try:
        tp, mem = choose(serving)
        return tp, mem, serving, []
    except HardwareError as exc:
        first = exc
    if FRACTION in fixed:  # the user's fraction in the way, where the planner's own would fit: say so
        free = ServingSpec(**serving.model_dump(include=set(fixed - {FRACTION})))
        try:
            _, mem = choose(free)
        except HardwareError:
            pass
        else:
            line = fraction_refusal(replace(mem, user_fraction=serving.kv_cache_free_gpu_memory_fraction), serving)
            if line:
                raise HardwareError(line)
    for s in lowered(serving, fixed):
        try:
            tp, mem = choose(s)
        except HardwareError:
            continue
        need = re.search(r"needs ([\d.]+ GiB) per GPU of ([\d.]+ GiB)", first.args[0])
        at = f" ({need[1]} per GPU of {need[2]} with CUDA graphs and 4 GiB start-up headroom)" if need else ""
        why = (
            f"{serving.max_batch_size} x {serving.max_seq_len} tokens does not fit on {where}{at}; "
            f"{s.max_batch_size} x {s.max_seq_len} fits at tp={tp} ({mem.total / GiB:.1f} GiB)"
        )
        return tp, mem, s, changes(serving, s, why)
    raise _refusal(first, serving, fixed)


def _refusal(first: HardwareError, serving: ServingSpec, fixed: frozenset[str]) -> HardwareError:
    """The one-line refusal: what does not fit, and which user-set values kept the planner from sizing."""
    held = [f"serving.{k}={getattr(serving, k)}" for k in (*SIZED, FRACTION) if k in fixed]
    msg = first.args[0]
    if held:
        msg += f" (even at the smallest defaults the planner may choose; set explicitly: {', '.join(held)})"
    return HardwareError(msg)


def fraction_refusal(mem, serving: ServingSpec) -> str | None:
    """One line when the user's ``kv_cache_free_gpu_memory_fraction`` is what makes ``mem`` (a
    ``memory_model.Memory``) not fit, although the planner's own fraction would; else None."""
    if FRACTION not in serving.model_fields_set or mem.fits:
        return None
    if mem.total > mem.capacity:
        return None
    f, free = mem.fraction, mem.free_after_load
    if mem.after_pool > (1 - f) * free:
        best = (free - mem.after_pool) / free
        return (
            f"serving.{FRACTION} {f} leaves {(1 - f) * free / GiB:.1f} GiB beside the KV pool, and start-up "
            f"needs {mem.after_pool / GiB:.1f} GiB there (drafter arena, activations, CUDA graphs, 4 GiB "
            f"headroom; PR #19466 saw 0.80-0.90 fail this way): set it <= {int(best * 100) / 100:.2f}, "
            "or leave it out and the planner chooses it"
        )
    return (
        f"serving.{FRACTION} {f} gives the KV pool {f * free / GiB:.1f} GiB and it needs "
        f"{mem.in_pool / GiB:.1f} GiB: raise it, or leave it out and the planner chooses it"
    )
