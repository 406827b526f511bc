"""The scheduler: continuous batching over the speculative round, one step at a time.

One :meth:`Scheduler.step`:

1. **admit**: requests waiting are admitted first come first served, up to ``max_batch`` live
   rows; their prompts are prefilled together in one target forward (``loop.admit``) and the
   rows that go on join the running batch (``Batch.merge``: target caches and drafter paged
   caches merged through the backend);
2. **round**: one draft / verify / accept / commit round for the whole live batch, with the
   draft length the schedule gives for the live batch size; rows that finish (stop token,
   length) or are cancelled (``Request.should_stop``) leave the batch (``Batch.filter``).

The draft length follows TensorRT-LLM's lookup (``tensorrt_llm/_torch/speculative/utils.py``,
``get_draft_len_for_batch_size``): without a schedule every round drafts ``B - 1`` tokens;
with one, the value of the FIRST key >= the live batch size applies, and above the largest key
drafting is off (a round of block size 1, which still feeds the drafter the last commit so
drafting can resume when the batch shrinks). ``max_concurrency: N`` is the schedule
``{N: max_draft_len}``.

A row's tokens do not depend on what shares its batch: at temperature 0 they are the target's
own greedy decoding; a seeded row draws its noise per token index (``sampling.gumbel``), so it
reproduces whatever joins, leaves or changes the draft length around it.
:func:`~dflash_trt.runtime.loop.generate` is the simple batch API over the same functions.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import torch

from dflash_trt.errors import DFlashError
from dflash_trt.runtime.backend import Backend
from dflash_trt.runtime.loop import Batch, Request, admit, block_size_for, run_round
from dflash_trt.runtime.stats import Stats


def draft_len_for_batch_size(schedule: dict[int, int] | None, batch_size: int, max_draft_len: int) -> int:
    """TensorRT-LLM's ``get_draft_len_for_batch_size``: no schedule -> ``max_draft_len``; else the
    value of the first key >= ``batch_size``; 0 (no drafting) above the largest key.
    ``{4: 4, 8: 2, 32: 1}``: batch 1-4 -> 4, 5-8 -> 2, 9-32 -> 1, 33+ -> 0."""
    if schedule is None:
        return max_draft_len
    for key in sorted(schedule):
        if key >= batch_size:
            return schedule[key]
    return 0


@dataclass
class Step:
    """What one :meth:`Scheduler.step` did: the requests admitted and finished in it, the live batch
    size and draft length of its round (0 / None without a round), and its counters."""

    admitted: list[Request] = field(default_factory=list)
    finished: list[Request] = field(default_factory=list)
    batch_size: int = 0
    draft_len: int | None = None
    stats: Stats = field(default_factory=lambda: Stats(block_size=1))  # replaced by the step's own
    seconds: float = 0.0


class Scheduler:
    """Requests in, tokens out, one step at a time (not thread-safe: one thread owns it)."""

    def __init__(self, backend: Backend, *, block_size: int | None = None, max_batch: int = 8,
                 draft_len_schedule: dict[int, int] | None = None):
        trained = backend.drafter_block_size
        B = block_size_for(block_size, trained)
        if B > 1 and (trained is None or B > trained):
            raise DFlashError(f"block size {B} needs a drafter trained for at least that block "
                              f"(this one: {trained})")
        if max_batch < 1:
            raise DFlashError(f"max_batch must be >= 1, got {max_batch}")
        self.backend, self.block_size, self.max_batch = backend, B, max_batch
        self.schedule = dict(draft_len_schedule) if draft_len_schedule else None
        self.batch: Batch | None = None
        self.waiting: deque[Request] = deque()

    @property
    def running(self) -> list[Request]:
        return list(self.batch.rows) if self.batch is not None else []

    @property
    def idle(self) -> bool:
        return self.batch is None and not self.waiting

    def add(self, request: Request) -> None:
        """Queue ``request``; it is admitted at a coming step, in the order added."""
        if not request.prompt:
            raise DFlashError("every prompt needs at least one token")
        self.waiting.append(request)

    def draft_len(self, batch_size: int) -> int:
        """Draft tokens per row in a round of ``batch_size`` live rows (at most B - 1)."""
        return min(self.block_size - 1, draft_len_for_batch_size(self.schedule, batch_size, self.block_size - 1))

    @torch.inference_mode()
    def step(self) -> Step:
        """Admit what fits, then one round for the live batch (see the module docstring)."""
        start = time.perf_counter()
        step = Step(stats=Stats(block_size=self.block_size))
        self._admit(step)
        if self.batch is not None:
            rows = self.batch.rows
            step.batch_size = len(rows)
            step.draft_len = self.draft_len(len(rows))
            if not run_round(self.backend, self.batch, step.draft_len + 1, step.stats):
                self.batch = None
            step.finished += [r for r in rows if r.finish_reason is not None]
        step.seconds = time.perf_counter() - start
        return step

    def _admit(self, step: Step) -> None:
        room = self.max_batch - (len(self.batch.rows) if self.batch is not None else 0)
        new: list[Request] = []
        while self.waiting and len(new) < room:
            req = self.waiting.popleft()
            if req.max_new_tokens <= 0 or (req.should_stop is not None and req.should_stop()):
                req.finish_reason = "length" if req.max_new_tokens <= 0 else "cancelled"
                step.finished.append(req)
                continue
            new.append(req)
        if not new:
            return
        step.admitted = new
        joined = admit(self.backend, new, self.block_size > 1, step.stats)
        step.finished += [r for r in new if r.finish_reason is not None]
        if joined is None:
            return
        if self.batch is None:
            self.batch = joined
        else:
            self.batch.merge(self.backend, joined)

    def abort(self) -> list[Request]:
        """Drop every running and waiting request (after a failed step); returns them."""
        dropped = self.running + list(self.waiting)
        self.batch, self.waiting = None, deque()
        return dropped
