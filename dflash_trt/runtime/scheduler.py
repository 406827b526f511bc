"""The scheduler: continuous batching over the speculative round, one step at a time.

One :meth:`Scheduler.step`:

1. **admit**: requests waiting are admitted first come first served, up to ``max_batch`` live
   rows; their prompts are prefilled together in one target forward (``loop.admit``) and the
   rows that go on join the running batch (``Batch.merge``: target caches and drafter paged
   caches merged through the backend);
2. **round**: one draft / verify / accept / commit round for the whole live batch, with the
   draft length the schedule gives for the live batch size; rows that finish (stop token,
   length) or are cancelled (``Request.should_stop``) leave the batch (``Batch.filter``).

Failures are isolated per row. A joint prefill that raises is retried one request at a time. A
shared round that raises leaves its batch's caches in an unknown state but no row changed (every
model call of ``run_round`` comes before any token is taken), so the batch is dropped and each of
its rows is rebuilt alone from its prompt and its tokens so far (``loop.readmit``: one prefill,
no token drawn twice) and runs the round alone; a row whose own rebuild or round raises is failed
(``Step.failed_rounds``), the others are merged back and the next round is shared again. Their
tokens are unchanged by this, as by any change of what shares their batch (below).

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

import logging
import time
from collections import deque
from dataclasses import dataclass, field

import torch

from dflash_trt.errors import DFlashError
from dflash_trt.runtime.backend import Backend
from dflash_trt.runtime.batch import Batch, Request
from dflash_trt.runtime.loop import admit, block_size_for, readmit, run_round
from dflash_trt.runtime.stats import Stats

logger = logging.getLogger(__name__)


class Refused(DFlashError):
    """A request the scheduler does not admit (:meth:`Scheduler.check`), in one line; ``param`` names
    what to change ("prompt" | "max_new_tokens"; None: the request's shape as a whole) and
    ``context`` is True when the refusal is the context length's."""

    def __init__(self, message: str, param: str | None = None, context: bool = False):
        super().__init__(message)
        self.param, self.context = param, context


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


def _failed(req: Request, exc: BaseException, failed: list[Request]) -> None:
    """Finish ``req`` as failed (``finish_reason = "error"``), the reason kept on it, listed in ``failed``."""
    req.finish_reason = "error"
    req.error = f"{type(exc).__name__}: {exc}"
    failed.append(req)
    logger.error(
        "a request failed alone (its prompt of %d tokens, %d generated): %s",
        len(req.prompt),
        len(req.token_ids),
        req.error,
        exc_info=exc,
    )


@dataclass
class Step:
    """What one :meth:`Scheduler.step` did: the requests admitted and finished in it, the live batch
    size and draft length of its round (0 / None without a round), and its counters."""

    admitted: list[Request] = field(default_factory=list)
    finished: list[Request] = field(default_factory=list)  # failed ones too (finish_reason "error")
    failed: list[Request] = field(default_factory=list)  # their prefill raised (Request.error says why)
    failed_rounds: list[Request] = field(default_factory=list)  # their own round (or rebuild) raised
    batch_size: int = 0
    draft_len: int | None = None
    #: the live batch's round raised and each row was rerun alone (``_isolate``): a batch that
    #: keeps doing so still answers every row, only slower, so it is counted where an operator sees it
    isolated: bool = False
    stats: Stats = field(default_factory=lambda: Stats(block_size=1))  # replaced by the step's own
    seconds: float = 0.0


class Scheduler:
    """Requests in, tokens out, one step at a time (not thread-safe: one thread owns it)."""

    def __init__(
        self,
        backend: Backend,
        *,
        block_size: int | None = None,
        max_batch: int = 8,
        draft_len_schedule: dict[int, int] | None = None,
        context_len: int | None = None,
    ):
        trained = backend.drafter_block_size
        B = block_size_for(block_size, trained)
        if B > 1 and (trained is None or B > trained):
            raise DFlashError(f"block size {B} needs a drafter trained for at least that block (this one: {trained})")
        if max_batch < 1:
            raise DFlashError(f"max_batch must be >= 1, got {max_batch}")
        backend.check_batch(max_batch, B)  # a graph backend's engine profile: once, here
        self.backend, self.block_size, self.max_batch = backend, B, max_batch
        #: the longest prompt + completion admitted, in tokens (None: the backend's own bound only)
        self.context_len = context_len
        self.schedule = dict(draft_len_schedule) if draft_len_schedule else None
        self.batch: Batch | None = None
        self.waiting: deque[Request] = deque()

    @property
    def running(self) -> list[Request]:
        return list(self.batch.rows) if self.batch is not None else []

    @property
    def idle(self) -> bool:
        return self.batch is None and not self.waiting

    def check(self, prompt: list[int], max_new_tokens: int) -> None:
        """The admission rule, its one owner: raise :class:`Refused` (one line) for a request this
        scheduler will not run: an empty prompt, one past ``context_len`` with its completion, or
        one outside the shapes the backend runs (a graph backend's engine profile). Reads only what
        is fixed when the scheduler is made, so another thread may ask before queueing."""
        n, ctx = len(prompt), self.context_len
        if n == 0:
            raise Refused("the prompt is empty", "prompt")
        if ctx is not None and n >= ctx:
            raise Refused(f"the prompt has {n} tokens; this model's context is {ctx} tokens", "prompt", True)
        if ctx is not None and n + max_new_tokens > ctx:
            raise Refused(
                f"prompt ({n} tokens) + max_tokens ({max_new_tokens}) exceeds this model's context of {ctx} tokens",
                "max_new_tokens",
                True,
            )
        try:
            self.backend.check_request([prompt], max_new_tokens, self.block_size)
        except Refused:
            raise
        except DFlashError as exc:
            raise Refused(str(exc)) from None

    def add(self, request: Request) -> None:
        """Queue ``request``; it is admitted at a coming step, in the order added. What
        :meth:`check` refuses is refused here, alone."""
        self.check(request.prompt, request.max_new_tokens)
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
            try:
                going = run_round(self.backend, self.batch, step.draft_len + 1, step.stats)
            except Exception as exc:
                step.isolated = True
                logger.warning("a round of %d rows raised; each row reruns alone", len(rows), exc_info=exc)
                self.batch = self._isolate(rows, step.draft_len + 1, step, exc)
            else:
                if not going:
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
        for joined in self._prefill(new, step):
            if self.batch is None:
                self.batch = joined
            else:
                self.batch.merge(self.backend, joined)
        step.finished += [r for r in new if r.finish_reason is not None]

    def _prefill(self, new: list[Request], step: Step) -> list:
        """The batches that go on after prefilling ``new`` together. A prefill that raises is
        retried one request at a time, so only a request whose own prefill fails is failed
        (``finish_reason = "error"``, ``Request.error``); one that already took its first token
        is rebuilt from it (``loop.readmit``), never given a first token twice. The running batch
        is untouched either way."""
        draft = self.block_size > 1
        try:
            joined = admit(self.backend, new, draft, step.stats)
            return [joined] if joined is not None else []
        except Exception as exc:
            if len(new) == 1:
                _failed(new[0], exc, step.failed)
                return []
        out = []
        for req in new:
            if req.finish_reason is not None:  # finished at its first token before the failure
                continue
            try:
                joined = (
                    readmit(self.backend, req, draft, step.stats)
                    if req.token_ids
                    else admit(self.backend, [req], draft, step.stats)
                )
            except Exception as exc:
                _failed(req, exc, step.failed)
                continue
            if joined is not None:
                out.append(joined)
        return out

    def _isolate(self, rows: list[Request], B: int, step: Step, exc: Exception) -> Batch | None:
        """The batch of ``rows`` raised in its round (``exc``): run each live row's round alone in a
        rebuilt batch (``loop.readmit``), fail the rows whose own rebuild or round raises, and
        return the others merged (None when none goes on). A batch of one row is failed at once."""
        if len(rows) == 1:
            if rows[0].finish_reason is None:
                _failed(rows[0], exc, step.failed_rounds)
            return None
        out: Batch | None = None
        for req in rows:
            if req.finish_reason is not None:
                continue
            try:
                solo = readmit(self.backend, req, self.block_size > 1, step.stats)
                going = run_round(self.backend, solo, B, step.stats)
            except Exception as own:
                _failed(req, own, step.failed_rounds)
                continue
            if not going:
                continue
            if out is None:
                out = solo
            else:
                out.merge(self.backend, solo)
        return out

    def abort(self) -> list[Request]:
        """Drop every running and waiting request (after a failed step); returns them."""
        dropped = self.running + list(self.waiting)
        self.batch, self.waiting = None, deque()
        return dropped
