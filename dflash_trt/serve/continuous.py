"""Continuous batching for the embedded server: the runtime's scheduler behind the queue.

The worker thread owns one :class:`dflash_trt.runtime.Scheduler` over the pair's backend (the
one its run spec opened). Before every step it hands the scheduler the oldest waiting jobs that
fit in ``max_batch`` live rows (first come, first served); the step prefills them, merges them
into the running batch and runs one round, so a short request that arrives behind long ones
starts at the next round instead of after them. Each job keeps its own sampling parameters, stop
tokens and length, and leaves the batch when it finishes or its client goes away. The draft
length of each round comes from the live batch size and the bundle's ``draft_len_schedule``
(TensorRT-LLM's lookup; see ``runtime.scheduler``).
"""

from __future__ import annotations

import time

from dflash_trt.runtime import Pair, Request, Scheduler, Step
from dflash_trt.serve.batcher import Batcher, Job


class ContinuousBatcher(Batcher):
    """Jobs join the running batch at every round and leave it when done."""

    def __init__(self, pair: Pair, *, draft_len_schedule: dict[int, int] | None = None, **kw):
        super().__init__(pair, **kw)
        self.scheduler = Scheduler(pair.backend, block_size=self.block_size, max_batch=self.max_batch,
                                   draft_len_schedule=draft_len_schedule)
        self._jobs: dict[Request, Job] = {}

    def _request(self, job: Job) -> Request:
        return Request(job.prompt, job.max_tokens, job.sampling, self.stops_for(job),
                       on_commit=lambda new: job.committed(new, self.metrics),
                       should_stop=lambda: job.cancelled, match_stop=job.match_stop)

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
                self._jobs[req] = job
                self.scheduler.add(req)
            self._running = list(self._jobs.values())
            self._gauge()
        return True

    def _loop(self) -> None:
        while self._admit():
            try:
                step = self.scheduler.step()
            except Exception as exc:  # a runtime failure fails the running jobs, not the server
                for req in self.scheduler.abort():
                    self._jobs.pop(req).fail(f"generation failed: {type(exc).__name__}: {exc}")
                continue
            self._account(step)

    def _account(self, step: Step) -> None:
        now = time.perf_counter()
        for req in step.admitted:
            self._jobs[req].started_at = now - step.seconds
        for req in step.finished:
            job = self._jobs.pop(req)
            job.rounds, job.round_tokens = req.rounds, req.committed
            job.finish(req.finish_reason)
            if self.metrics is not None:
                self.metrics.observe_request(job)
        if self.metrics is not None:  # tokens this step: each admitted row's first, then the round's
            self.metrics.observe_round(step.stats, step.batch_size, step.seconds,
                                       len(step.admitted) + step.stats.committed, draft_len=step.draft_len)
        with self._cond:
            self._running = list(self._jobs.values())
            self._gauge()
