"""Draft lengths per batch size, and the TensorRT-LLM key that makes the runtime draft them.

A plan's draft lengths cover every batch size ``1 .. max_batch_size`` as *runs*: ranges of
batch sizes with one draft length each, non-increasing (0 = drafting off). TensorRT-LLM is
told them through ``max_concurrency`` (one length, then off) or ``draft_len_schedule``
(``{batch size: draft length}``). What a schedule means depends on the targeted release
(``trtllm_releases.Release.schedule_lookup``):

* ``upper_bound`` (``tensorrt_llm/_torch/speculative/utils.py::get_draft_len_for_batch_size``,
  ``bisect_left``): the first key >= the batch size applies; above the largest key the
  release's floor. A run ``first..last -> n`` is written as ``{last: n}``; a trailing run at
  the floor needs no key.
* ``lower_bound`` (``tensorrt_llm/_torch/speculative/drafter.py::Drafter.get_draft_len_for_batch_size``,
  ``bisect_right``): the largest key <= the batch size applies. A run is ``{first: n}``.

Every release in the table drafts the floor above the largest key, 0 (drafting stops): the
floor fix, PR #16888, is open. Under attention data-parallelism TensorRT-LLM looks up each
rank's OWN batch size, with no cross-rank sync, so the keys are per-rank batch sizes (as
``serving.max_batch_size`` is).

:func:`emit` writes the key, :func:`lookup` reads it back the way the release does, and
:func:`lengths` evaluates a key at every batch size; the planner checks that what it emits
reads back as what it planned.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass

from dflash_trt.errors import RecipeError
from dflash_trt.plan.recipe import SpeculativeSpec
from dflash_trt.plan.trtllm_releases import Release


@dataclass(frozen=True)
class Run:
    """Batch sizes ``first .. last`` (inclusive) draft ``draft_len`` tokens."""

    first: int
    last: int
    draft_len: int

    def as_dict(self) -> dict:
        return {"batch_from": self.first, "batch_to": self.last, "draft_len": self.draft_len}


def schedule_runs(lengths: list[int]) -> list[Run]:
    """``lengths[b - 1]`` is the draft length at batch ``b``; consecutive equal lengths merged."""
    out: list[Run] = []
    for b, n in enumerate(lengths, start=1):
        if out and out[-1].draft_len == n:
            out[-1] = Run(out[-1].first, b, n)
        else:
            out.append(Run(b, b, n))
    return out


def check_schedule(schedule: dict[int, int], max_draft_len: int) -> dict[int, int]:
    """TensorRT-LLM's rules (``DecodingBaseConfig.validate_draft_len_schedule_and_sort``); sorted."""
    if not schedule:
        raise RecipeError("speculative.draft_len_schedule is empty; give {batch size: draft length}")
    for b, n in schedule.items():
        if b < 1:
            raise RecipeError(f"speculative.draft_len_schedule: batch size key {b} must be >= 1")
        if not 0 <= n <= max_draft_len:
            raise RecipeError(f"speculative.draft_len_schedule {{{b}: {n}}}: draft lengths must be between 0 and "
                              f"max_draft_len ({max_draft_len})")
    smallest = min(schedule)
    if schedule[smallest] != max_draft_len:
        raise RecipeError(f"speculative.draft_len_schedule[{smallest}] is {schedule[smallest]}: "
                          f"the smallest batch-size key must map to max_draft_len ({max_draft_len})")
    return dict(sorted(schedule.items()))


def lookup(schedule: dict[int, int] | None, batch: int, max_draft_len: int, release: Release) -> int:
    """The draft length ``release`` runs at ``batch`` for this ``draft_len_schedule``."""
    floor = release.draft_len_floor
    if schedule is None:
        return max_draft_len
    keys = sorted(schedule)
    if release.schedule_lookup == "upper_bound":
        i = bisect_left(keys, batch)
        return max(schedule[keys[i]], floor) if i < len(keys) else floor
    i = bisect_right(keys, batch)
    return max(schedule[keys[i - 1]], floor) if i else max_draft_len


def lengths(max_batch_size: int, max_draft_len: int, release: Release, *, schedule: dict[int, int] | None = None,
            max_concurrency: int | None = None) -> list[int]:
    """Draft length at every batch size 1..max_batch_size, as ``release`` reads the keys."""
    if max_concurrency is not None:  # DecodingBaseConfig: max_concurrency N means {N: max_draft_len}
        return [max_draft_len if b <= max_concurrency else release.draft_len_floor
                for b in range(1, max_batch_size + 1)]
    return [lookup(schedule, b, max_draft_len, release) for b in range(1, max_batch_size + 1)]


def emit_schedule(plan_runs: list[Run], release: Release) -> dict[int, int]:
    """The ``draft_len_schedule`` that makes ``release`` draft ``plan_runs``."""
    if release.schedule_lookup == "lower_bound":
        return {r.first: r.draft_len for r in plan_runs}
    keep = list(plan_runs)
    if len(keep) > 1 and keep[-1].draft_len == release.draft_len_floor:
        keep.pop()  # above the largest key the release drafts its floor anyway
    return {r.last: r.draft_len for r in keep}


def batch_grid(max_batch_size: int) -> list[int]:
    """1, 2, 4, ... below ``max_batch_size``, then ``max_batch_size``."""
    return [1 << i for i in range(max_batch_size.bit_length()) if 1 << i < max_batch_size] + [max_batch_size]


def choose_schedule(want: list[int], spec: SpeculativeSpec, max_len: int,
           release: Release) -> tuple[str, int | None, dict | None, list[int]]:
    """The recipe's back-off (``speculative.schedule``) for the planned lengths ``want``
    (``want[b - 1]`` at batch ``b``, non-increasing): (schedule, max_concurrency,
    draft_len_schedule, the lengths ``release`` then drafts at every batch size)."""
    n_batch, floor = len(want), release.draft_len_floor
    want = [max(n, floor) for n in want]
    mode = spec.schedule
    on = sum(1 for n in want if n)  # batch sizes 1..on draft (want is non-increasing)
    if mode == "auto":
        mode = ("draft_len_schedule" if len({n for n in want if n}) > 1
                else "max_concurrency" if on < n_batch else "none")
    if mode == "max_concurrency":
        conc = spec.max_concurrency or (on if on < n_batch else None)
        if conc is not None:
            return mode, conc, None, lengths(n_batch, max_len, release, max_concurrency=conc)
        mode = "none"
    if mode == "draft_len_schedule":
        if spec.draft_len_schedule:
            sched = check_schedule(dict(spec.draft_len_schedule), max_len)
        else:
            sched = emit_schedule(schedule_runs(want), release)
        drafted = lengths(n_batch, max_len, release, schedule=sched)
        if not spec.draft_len_schedule and drafted != want:  # what we write must read back as planned
            raise AssertionError(f"draft_len_schedule {sched} does not read back as planned on {release.version}")
        return mode, None, sched, drafted
    return "none", None, None, [max_len] * n_batch


def describe(plan_runs: list[Run]) -> str:
    """``1-16: 15, 17-32: 12, 33-64: off`` for a plan table."""
    def one(r: Run) -> str:
        span = f"{r.first}" if r.first == r.last else f"{r.first}-{r.last}"
        return f"{span}: {r.draft_len if r.draft_len else 'off'}"

    return ", ".join(one(r) for r in plan_runs)
