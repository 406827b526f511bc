"""Draft-length schedules between stacks: TensorRT-LLM's ``draft_len_schedule`` and vLLM's
``num_speculative_tokens_per_batch_size``. They mean different things, so one is converted into
the other, never copied.

* TensorRT-LLM (:mod:`dflash_trt.plan.schedule`): ``{batch size: draft length}``, read per
  release (``upper_bound``: the first key >= the batch applies, above the largest key the
  release's floor, 0 on every release in the table).
* vLLM (``vllm/v1/spec_decode/dynamic/utils.py::build_dynamic_sd_schedule_lookup`` and
  ``validate_and_normalize_dynamic_sd_schedule``): a list of ``[bs_lo, bs_hi, K]`` *inclusive*
  ranges, sorted and non-overlapping, the first starting at 1; a batch size in a gap between
  ranges, and every batch size above the last range, inherits the K of the range before it;
  every K is capped at ``num_speculative_tokens`` (which must be > 0).

Invariant (property-tested in ``tests/plan/test_schedule_vllm.py``): for every batch size
``1 .. max_batch_size`` the converted schedule makes its stack draft the same length as the
original makes its own. Batch sizes above ``max_batch_size`` never occur (the server admits no
more), so neither schedule is asked about them.
"""

from __future__ import annotations

from dflash_trt.errors import RecipeError
from dflash_trt.plan import schedule as trt
from dflash_trt.plan.trtllm_releases import Release

VllmSchedule = list[list[int]]  # [[bs_lo, bs_hi, K], ...]


def check_vllm(entries: VllmSchedule) -> VllmSchedule:
    """vLLM's rules for the 3-item form (``validate_and_normalize_dynamic_sd_schedule``); sorted."""
    if not entries:
        raise RecipeError("num_speculative_tokens_per_batch_size must not be empty")
    out = []
    for e in entries:
        if len(e) != 3:
            raise RecipeError(f"num_speculative_tokens_per_batch_size entry {e}: give [bs_lo, bs_hi, K]")
        lo, hi, k = (int(x) for x in e)
        if lo <= 0 or hi < lo or k < 0:
            raise RecipeError(f"num_speculative_tokens_per_batch_size entry {e}: needs 1 <= bs_lo <= bs_hi, K >= 0")
        out.append([lo, hi, k])
    out.sort()
    if out[0][0] != 1:
        raise RecipeError("num_speculative_tokens_per_batch_size: the first range must start at batch size 1")
    for a, b in zip(out, out[1:], strict=False):
        if b[0] <= a[1]:
            raise RecipeError(f"num_speculative_tokens_per_batch_size: ranges {a} and {b} overlap")
    return out


def vllm_lengths(entries: VllmSchedule, num_speculative_tokens: int, max_batch_size: int) -> list[int]:
    """The K vLLM drafts at every batch size ``1 .. max_batch_size`` (gaps and the tail inherit)."""
    if num_speculative_tokens <= 0:
        raise RecipeError("num_speculative_tokens must be > 0 for a per-batch-size schedule")
    out, i, entries = [], -1, check_vllm(entries)
    for b in range(1, max_batch_size + 1):
        while i + 1 < len(entries) and entries[i + 1][0] <= b:
            i += 1
        out.append(min(num_speculative_tokens, entries[i][2]))
    return out


def from_lengths(lengths: list[int]) -> tuple[int, VllmSchedule]:
    """(num_speculative_tokens, ranges) that make vLLM draft ``lengths[b - 1]`` at batch ``b``."""
    top = max(lengths)
    if top <= 0:
        raise RecipeError("vLLM needs num_speculative_tokens > 0: this schedule never drafts")
    return top, [[r.first, r.last, r.draft_len] for r in trt.schedule_runs(lengths)]


def trtllm_to_vllm(
    schedule: dict[int, int] | None, max_draft_len: int, release: Release, max_batch_size: int
) -> tuple[int, VllmSchedule]:
    """A TensorRT-LLM ``draft_len_schedule`` (as ``release`` reads it) as vLLM's
    ``(num_speculative_tokens, num_speculative_tokens_per_batch_size)``."""
    return from_lengths(trt.lengths(max_batch_size, max_draft_len, release, schedule=schedule))


def vllm_to_trtllm(
    entries: VllmSchedule, num_speculative_tokens: int, release: Release, max_batch_size: int
) -> tuple[int, dict[int, int]]:
    """vLLM's schedule as TensorRT-LLM's ``(max_draft_len, draft_len_schedule)`` for ``release``."""
    want = vllm_lengths(entries, num_speculative_tokens, max_batch_size)
    if want[0] <= 0:
        raise RecipeError(
            "TensorRT-LLM cannot start a schedule with drafting off at batch size 1 "
            "(the smallest key must map to max_draft_len)"
        )
    if any(n < release.draft_len_floor for n in want):
        raise RecipeError(
            f"TensorRT-LLM {release.version} never drafts fewer than {release.draft_len_floor} "
            "tokens: this vLLM schedule turns drafting off"
        )
    if max(want) != want[0]:  # DecodingBaseConfig: the smallest key maps to max_draft_len, the most
        raise RecipeError(
            "TensorRT-LLM drafts the most at the smallest batch size; this vLLM schedule drafts "
            f"{max(want)} above batch 1's {want[0]}"
        )
    sched = trt.check_schedule(trt.emit_schedule(trt.schedule_runs(want), release), want[0])
    return want[0], sched
