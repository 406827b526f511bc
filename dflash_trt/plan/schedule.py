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

**The zero-draft rule** (:func:`zero_draft_rule`; TensorRT-LLM PR #16888, open). Where the one-model
path drafts 0, every step takes ``skip_drafting``: the drafter's per-request context rows for
those tokens are allocated but never written, and once the batch shrinks and drafting resumes
"the acceptance rate silently collapsed for the remainder of every affected request" (output
stays correct, nothing is raised). So on a release without a floor (the table's
``draft_len_floor`` 0 when TensorRT-LLM is not installed; the installed
``DecodingBaseConfig.min_runtime_draft_len`` / ``keep_drafter_warm`` when it is) no plan, tune or
written config drafts 0 at any batch size 1..max_batch_size: every length is >= 1, the largest
``draft_len_schedule`` key is >= max_batch_size, and ``max_concurrency`` (which means 0 above
it) is never written. Where drafting does not pay, the floor, one token, is the shortest
draft (the plan says what it costs). On a release with the floor the runtime floors every
length itself and the rule follows it; a release that keeps the drafter warm at 0 may stop
drafting. :func:`choose` (``plan``, ``tune``) and ``deploy``'s config check (``build``, every
written config) all ask :func:`zero_draft_rule`.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
from bisect import bisect_left, bisect_right
from dataclasses import dataclass

from dflash_trt.errors import RecipeError
from dflash_trt.plan.recipe import SpeculativeSpec
from dflash_trt.plan.trtllm_releases import Release

logger = logging.getLogger(__name__)
TRAP = (
    "the zero-draft trap (TensorRT-LLM PR #16888: where drafting stops the drafter's context rows are never "
    "written and acceptance collapses for the rest of every request that lived through it)"
)


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
            raise RecipeError(
                f"speculative.draft_len_schedule {{{b}: {n}}}: draft lengths must be between 0 and "
                f"max_draft_len ({max_draft_len})"
            )
    smallest = min(schedule)
    if schedule[smallest] != max_draft_len:
        raise RecipeError(
            f"speculative.draft_len_schedule[{smallest}] is {schedule[smallest]}: "
            f"the smallest batch-size key must map to max_draft_len ({max_draft_len})"
        )
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


def lengths(
    max_batch_size: int,
    max_draft_len: int,
    release: Release,
    *,
    schedule: dict[int, int] | None = None,
    max_concurrency: int | None = None,
) -> list[int]:
    """Draft length at every batch size 1..max_batch_size, as ``release`` reads the keys."""
    if max_concurrency is not None:  # DecodingBaseConfig: max_concurrency N means {N: max_draft_len}
        return [
            max_draft_len if b <= max_concurrency else release.draft_len_floor for b in range(1, max_batch_size + 1)
        ]
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


def choose_schedule(
    want: list[int], spec: SpeculativeSpec, max_len: int, release: Release
) -> tuple[str, int | None, dict | None, list[int]]:
    """The recipe's back-off (``speculative.schedule``) for the planned lengths ``want``
    (``want[b - 1]`` at batch ``b``, non-increasing): (schedule, max_concurrency,
    draft_len_schedule, the lengths ``release`` then drafts at every batch size). Obeys
    :func:`zero_draft_rule`: a user's schedule that would draft 0 there is a RecipeError."""
    rule = zero_draft_rule(release)
    release, n_batch = rule.release, len(want)
    want = rule.floor(want)
    mode = spec.schedule
    on = sum(1 for n in want if n)  # batch sizes 1..on draft (want is non-increasing)
    if mode == "auto" or (mode == "max_concurrency" and rule.trap and spec.max_concurrency is None):
        mode = (
            "draft_len_schedule" if len({n for n in want if n}) > 1 else "max_concurrency" if on < n_batch else "none"
        )
    if mode == "max_concurrency":
        conc = spec.max_concurrency or (on if on < n_batch else None)
        if conc is not None and conc < n_batch:
            bad = rule.refusal(n_batch, max_len, max_concurrency=conc)
            if bad:
                raise RecipeError(f"speculative.{bad}")
            return mode, conc, None, lengths(n_batch, max_len, release, max_concurrency=conc)
        mode = "none"  # a max_concurrency >= max_batch_size never applies: not written
    if mode == "draft_len_schedule":
        if spec.draft_len_schedule:
            sched = check_schedule(dict(spec.draft_len_schedule), max_len)
            bad = rule.refusal(n_batch, max_len, schedule=sched)
            if bad:
                raise RecipeError(f"speculative.{bad}")
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


# --- the zero-draft rule ----------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """What a DFlash config may ask ``release`` to draft at the least (module docstring)."""

    release: Release  # the row, its draft_len_floor as the installed classes report it where installed
    keeps_warm: bool  # the drafter still runs at draft length 0 (its context rows stay written)
    source: str  # where the floor was read

    @property
    def trap(self) -> bool:
        """Drafting 0 at some batch size would leave the drafter's context rows unwritten."""
        return self.release.draft_len_floor == 0 and not self.keeps_warm

    @property
    def shortest(self) -> int:
        """The shortest draft a plan gives any batch size 1..max_batch_size."""
        return 1 if self.trap else self.release.draft_len_floor

    def floor(self, want: list[int]) -> list[int]:
        """``want`` with every length raised to :attr:`shortest`."""
        return [max(n, self.shortest) for n in want]

    def refusal(
        self,
        max_batch_size: int,
        max_draft_len: int,
        *,
        schedule: dict[int, int] | None = None,
        max_concurrency: int | None = None,
    ) -> str | None:
        """One line when this schedule (or ``max_concurrency``) would draft 0 at a batch size up to
        ``max_batch_size`` on a release with the trap; None when it is safe."""
        if not self.trap:
            return None
        ver = self.release.version
        if max_concurrency is not None:
            return (
                f"max_concurrency {max_concurrency} turns drafting off above it, and TensorRT-LLM {ver} has no "
                f"draft-length floor: {TRAP}; use a draft_len_schedule whose largest key is >= max_batch_size "
                f"({max_batch_size}), e.g. {{{max_concurrency}: {max_draft_len}, {max_batch_size}: 1}}"
            )
        if schedule is None:
            return None
        drafted = lengths(max_batch_size, max_draft_len, self.release, schedule=schedule)
        if 0 not in drafted:
            return None
        at = drafted.index(0) + 1
        fix = (
            "no draft length 0"
            if 0 in schedule.values()
            else f"a largest key >= max_batch_size, e.g. {max_batch_size}: 1"
        )
        return (
            f"draft_len_schedule {dict(sorted(schedule.items()))} drafts 0 tokens from batch size {at} up to "
            f"max_batch_size {max_batch_size} on TensorRT-LLM {ver}, which has no draft-length floor: {TRAP}; "
            f"give it {fix}"
        )


def installed_floor() -> tuple[int, bool, str] | None:
    """(min_runtime_draft_len, keep_drafter_warm, version) of the installed TensorRT-LLM's
    ``DFlashDecodingConfig``; None when it is not installed. A release whose ``DecodingBaseConfig``
    has no ``min_runtime_draft_len`` has no floor (0, not warm). Imported here, lazily, because
    only a GPU machine has it (importing it initialises CUDA)."""
    if importlib.util.find_spec("tensorrt_llm") is None:
        return None
    try:
        from tensorrt_llm import version as trt_version  # optional: tensorrt_llm
        from tensorrt_llm.llmapi import llm_args  # optional: tensorrt_llm
    except ImportError as exc:  # a broken install: the table decides, and the log says why
        logger.warning("tensorrt_llm is installed but its LLM-API classes do not import (%s)", exc)
        return None
    ver = str(getattr(trt_version, "__version__", "installed"))
    if not hasattr(llm_args.DecodingBaseConfig, "min_runtime_draft_len"):
        return 0, False, ver
    cfg = llm_args.DFlashDecodingConfig.model_construct(max_draft_len=1)  # the floor is a per-mode property
    return int(cfg.min_runtime_draft_len), bool(getattr(cfg, "keep_drafter_warm", False)), ver


def zero_draft_rule(release: Release) -> Rule:
    """THE zero-draft rule for ``release``: the installed TensorRT-LLM's classes where it is
    installed, else the release table's row. ``plan``, ``tune`` and every written config obey it."""
    found = installed_floor()
    if found is None:
        return Rule(release, False, f"the release table's row for TensorRT-LLM {release.version}")
    floor_, warm, ver = found
    return Rule(
        dataclasses.replace(release, draft_len_floor=floor_),
        warm,
        f"the installed TensorRT-LLM {ver}'s DecodingBaseConfig",
    )


def floor_cost(want: list[int], drafted: list[int], speedup, release: Release) -> list[str]:
    """The line saying where :func:`zero_draft_rule` drafts the floor although drafting does not pay
    (``want`` 0, ``drafted`` > 0) and what that costs against drafting off: ``speedup(b, n)``, the
    step model's predicted speedup at batch ``b`` drafting ``n``. Nothing where the release floors itself."""
    rule = zero_draft_rule(release)
    raised = [b for b in range(1, len(want) + 1) if want[b - 1] == 0 and drafted[b - 1] > 0]
    if not raised or not rule.trap:
        return []
    speed = [speedup(b, drafted[b - 1]) for b in raised]
    span = f"{raised[0]}" if len(raised) == 1 else f"{raised[0]}-{raised[-1]}"
    return [
        f"batch {span}: drafting does not pay, but TensorRT-LLM {release.version} has no draft-length floor "
        f"({rule.source}) and turning drafting off there walks into {TRAP}; the plan drafts {rule.shortest} "
        f"token(s) there instead, the shortest draft, predicted {min(speed):.2f}-{max(speed):.2f}x of drafting "
        f"off (costs up to {max(0.0, 1 - min(speed)):.0%} of throughput at those batch sizes)"
    ]
