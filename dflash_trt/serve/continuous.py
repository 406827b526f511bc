"""Continuous batching for the embedded server: the runtime's scheduler behind the queue.

The worker thread owns one :class:`dflash_trt.runtime.Scheduler` over the pair's backend (the
one its run spec opened). Before every step it hands the scheduler the oldest waiting jobs that
fit in ``max_batch`` live rows (first come, first served); the step prefills them, merges them
into the running batch and runs one round, so a short request that arrives behind long ones
starts at the next round instead of after them. Each job keeps its own sampling parameters, stop
tokens and length, and leaves the batch when it finishes or its client goes away. The draft
length of each round comes from the live batch size and the bundle's ``draft_len_schedule``
(TensorRT-LLM's lookup; see ``runtime.scheduler``).

Failures are isolated per request: a prefill that fails fails that request alone (the scheduler
retries the others one by one); a job whose tokens cannot be handed on (``stream``) is failed
and its row cancelled, the others untouched; a round that raises is rerun row by row on rebuilt
caches, and only a row whose own round fails is failed (``step``; see ``runtime.scheduler``),
the others go on with unchanged tokens. Should a step still raise (the scheduler's own state
lost), every request it held is failed and the worker goes on with the queue. Every failed
request gets an error event (an OpenAI error object), frees its slot, and is counted in
``dflash_request_failures_total{stage}``.
"""

from __future__ import annotations

import logging
import time

from dflash_trt.runtime import Pair, Request, Scheduler, Step
from dflash_trt.serve.batcher import Batcher, Job

logger = logging.getLogger(__name__)


class ContinuousBatcher(Batcher):
    """Jobs join the running batch at every round and leave it when done."""

    def __init__(
        self, pair: Pair, *, draft_len_schedule: dict[int, int] | None = None, context_len: int | None = None, **kw
    ):
        super().__init__(pair, **kw)
        self.scheduler = Scheduler(
            pair.backend,
            block_size=self.block_size,
            max_batch=self.max_batch,
            draft_len_schedule=draft_len_schedule,
            context_len=context_len,
        )
        self._jobs: dict[Request, Job] = {}

    def check(self, job: Job) -> None:
        """The scheduler's admission rule for ``job``, asked before it is queued (``Refused``)."""
        self.scheduler.check(job.request.prompt, job.request.max_new_tokens)

    def _request(self, job: Job) -> Request:
        def on_commit(new: list[int]) -> None:
            if job.finished:  # failed while streaming: its row leaves at this commit
                return
            try:
                job.committed(new, self.metrics)
            except Exception as exc:  # handing the tokens on failed: this job alone
                self._fail(job, "stream", exc)

        req = job.request  # the job's own: the scheduler runs it, the job reads its tokens and rounds
        req.stop_token_ids, req.on_commit, req.match_stop = self.stops_for(job), on_commit, job.match_stop
        req.should_stop = lambda: job.cancelled or job.finished
        return req

    def _admit(self) -> bool:
        """Block until there is work; hand the scheduler what fits. False: stopped and drained."""
        with self._cond:
            while not self._jobs and (not self._pending or self._paused):
                if self._stopping and not self._pending:
                    return False
                self._cond.wait()
            while self._pending and not self._paused and len(self._jobs) < self.max_batch:
                job = self._pending.popleft()
                req = self._request(job)
                try:
                    self.scheduler.add(req)
                except Exception as exc:  # refused by the scheduler: this job alone
                    self._fail(job, "admit", exc)
                    continue
                self._jobs[req] = job
            self._running = list(self._jobs.values())
            self._gauge()
        return True

    def _loop(self) -> None:
        while self._admit():
            try:
                step = self.scheduler.step()
            except Exception as exc:  # the scheduler's state is lost: its rows fail, the queue goes on
                logger.error("a scheduler step raised; its %d requests fail", len(self._jobs), exc_info=exc)
                self.scheduler.abort()
                self._drop_all("step", exc)
                continue
            self._account(step)

    def _drop_all(self, stage: str, exc: BaseException | str) -> None:
        """Fail every job the scheduler held (it dropped them all): no job is left waiting forever."""
        why = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"  # its traceback: logged once
        for req in list(self._jobs):
            self._fail(self._jobs.pop(req), stage, why)
        with self._cond:
            self._running = []
            self._gauge()

    def _account(self, step: Step) -> None:
        now = time.perf_counter()
        for req in step.admitted:
            self._jobs[req].started_at = now - step.seconds
        for req in step.failed:
            self._fail(self._jobs[req], "admit", req.error or "prefill failed")
        for req in step.failed_rounds:
            self._fail(self._jobs[req], "step", req.error or "round failed")
        for req in step.finished:
            job = self._jobs.pop(req)
            if job.finished:  # failed (admit, stream): its error event is out
                continue
            job.finish(req.finish_reason or "stop")  # set on every finished row
            if self.metrics is not None:
                self.metrics.observe_request(job)
        if self._jobs and self.scheduler.idle:  # never spin on jobs the scheduler no longer has
            self._drop_all("step", "the request was lost by the scheduler")
        if self.metrics is not None:  # tokens this step: each admitted row's first, then the round's
            self.metrics.observe_round(
                step.stats,
                step.batch_size,
                step.seconds,
                len(step.admitted) + step.stats.committed,
                draft_len=step.draft_len,
                isolated=step.isolated,
            )
        with self._cond:
            self._running = list(self._jobs.values())
            self._gauge()
