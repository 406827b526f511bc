"""Request batching for the embedded server: a bounded queue and one worker thread.

Requests become :class:`Job` objects. The worker takes the oldest waiting job and every
other waiting job that can share a runtime call with it (same sampling parameters; seeded
jobs run alone so a seed reproduces whatever else is queued), up to ``max_batch``, and
runs them through :func:`dflash_trt.runtime.generate` as one batch. Tokens are handed to
each job as they are committed (``on_commit``), so streaming is real; a job whose client
went away, or that reached its own ``max_tokens``, leaves the batch at the next round
(``should_stop``). Jobs that arrive while a batch runs wait for the next one (no
mid-batch joins: the reference runtime's batch is fixed at prefill).

The worker runs torch in its own thread (torch releases the GIL), so the event loop
keeps accepting, streaming and rejecting requests while a batch runs.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from dflash_trt.runtime import Pair
from dflash_trt.runtime import generate
from dflash_trt.runtime import SamplingParams


class QueueFull(Exception):
    """The wait queue is at its bound: the server answers 429."""


class Draining(Exception):
    """The server is shutting down and takes no new work: 503."""


_ids = itertools.count()


@dataclass(eq=False)
class Job:
    """One request's generation. ``sink(kind, payload)`` receives ``("tokens", [ids])``
    after each commit and one final ``("done", finish_reason)`` or ``("error", message)``;
    it is called from the worker thread."""

    prompt: list[int]
    max_tokens: int
    sampling: SamplingParams = SamplingParams()
    ignore_eos: bool = False
    sink: Callable[[str, object], None] = lambda kind, payload: None
    id: int = field(default_factory=lambda: next(_ids))
    tokens: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    rounds: int = 0                 # speculative rounds this job took part in (prefill excluded)
    round_tokens: int = 0           # tokens those rounds committed (before max_tokens truncation)
    enqueued_at: float = field(default_factory=time.perf_counter)
    started_at: float | None = None
    first_token_at: float | None = None
    finished_at: float | None = None
    _cancel: threading.Event = field(default_factory=threading.Event)

    def cancel(self) -> None:
        """Ask the worker to drop this job (the client went away). Idempotent."""
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def acceptance_length(self) -> float | None:
        """This request's τ: tokens committed per target forward, over its rounds."""
        return self.round_tokens / self.rounds if self.rounds else None

    def group_key(self) -> tuple:
        s = self.sampling
        if s.greedy:
            return ("greedy", self.ignore_eos)
        if s.seed is not None:
            return ("seeded", self.id)
        return ("sampled", s.temperature, s.top_p, s.top_k, self.ignore_eos)


class Batcher:
    """Bounded FIFO of jobs and the worker thread that runs them in batches."""

    def __init__(self, pair: Pair, *, max_batch: int = 8, max_queue: int = 64, block_size: int | None = None,
                 batch_window_s: float = 0.005, metrics=None, torch_threads: int | None = None):
        if max_batch < 1 or max_queue < 0:
            raise ValueError("max_batch must be >= 1 and max_queue >= 0")
        self.pair = pair
        self.max_batch, self.max_queue = max_batch, max_queue
        self.block_size = pair.block_size(block_size)
        self.batch_window_s = batch_window_s
        self.metrics = metrics
        # torch threads for the worker: one core is left to the event loop (streaming,
        # admission). Two OpenMP pools competing for every core made batches 50x slower.
        self.torch_threads = torch_threads or max(1, (os.cpu_count() or 2) - 1)
        self._pending: deque[Job] = deque()
        self._running: list[Job] = []
        self._cond = threading.Condition()
        self._paused = False
        self._stopping = False
        self._thread: threading.Thread | None = None

    # ---- control ----------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="dflash-batcher", daemon=True)
            self._thread.start()

    def close(self) -> None:
        """Stop taking jobs (submit raises Draining); queued and running jobs still finish."""
        with self._cond:
            self._stopping = True
            self._paused = False
            self._cond.notify_all()

    def stop(self, timeout: float | None = None) -> None:
        """Stop taking jobs, finish every queued and running one, then end the worker."""
        with self._cond:
            self._stopping = True
            self._paused = False
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    def pause(self) -> None:
        """Hold queued jobs (running batches finish); for maintenance and for tests."""
        with self._cond:
            self._paused = True

    def resume(self) -> None:
        with self._cond:
            self._paused = False
            self._cond.notify_all()

    @property
    def queue_depth(self) -> int:
        return len(self._pending)

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def accepting(self) -> bool:
        return not self._stopping

    def submit(self, job: Job) -> None:
        with self._cond:
            if self._stopping:
                raise Draining("the server is shutting down")
            if len(self._pending) >= self.max_queue:
                raise QueueFull(f"the request queue is full ({self.max_queue} waiting); retry later")
            self._pending.append(job)
            self._gauge()
            self._cond.notify_all()

    # ---- worker -----------------------------------------------------------------------
    def _gauge(self) -> None:
        if self.metrics is not None:
            self.metrics.set_queue(len(self._pending), len(self._running))

    def _take(self) -> list[Job] | None:
        """Block for work; returns the next batch, or None when stopped and drained."""
        with self._cond:
            while not self._pending or (self._paused and not self._stopping):
                if self._stopping and not self._pending:
                    return None
                self._cond.wait()
        if self.batch_window_s and len(self._pending) < self.max_batch:
            time.sleep(self.batch_window_s)  # let requests sent together arrive together
        with self._cond:
            key = self._pending[0].group_key()
            batch = [j for j in self._pending if j.group_key() == key][: self.max_batch]
            for j in batch:
                self._pending.remove(j)
            self._running = batch
            self._gauge()
        return batch

    def _loop(self) -> None:
        import torch

        torch.set_num_threads(self.torch_threads)  # per thread: the worker's own pool
        while True:
            batch = self._take()
            if batch is None:
                return
            live = [j for j in batch if not j.cancelled]
            for j in batch:
                if j.cancelled:
                    self._finish(j, "cancelled")
            if live:
                self._run(live)
            with self._cond:
                self._running = []
                self._gauge()

    def _run(self, jobs: list[Job]) -> None:
        pair = self.pair
        stops = () if jobs[0].ignore_eos else tuple(pair.stop_token_ids)
        now = time.perf_counter()
        for j in jobs:
            j.started_at = now

        def on_commit(row: int, new: list[int]) -> None:
            j = jobs[row]
            if j.first_token_at is None:
                j.first_token_at = time.perf_counter()
            else:
                j.rounds += 1
                j.round_tokens += len(new)
            room = j.max_tokens - len(j.tokens)
            new = new[:room]
            if new and not j.cancelled:
                j.tokens.extend(new)
                j.sink("tokens", new)

        def should_stop(row: int) -> bool:
            j = jobs[row]
            return j.cancelled or len(j.tokens) >= j.max_tokens

        drafter = pair.drafter if self.block_size > 1 else None
        try:
            gen = generate(pair.target, drafter, [j.prompt for j in jobs],
                           max_new_tokens=max(j.max_tokens for j in jobs), sampling=jobs[0].sampling,
                           block_size=self.block_size, stop_token_ids=stops,
                           on_commit=on_commit, should_stop=should_stop)
        except Exception as exc:  # a runtime failure fails this batch, not the server
            for j in jobs:
                j.finish_reason = "error"
                j.finished_at = time.perf_counter()
                j.sink("error", f"generation failed: {type(exc).__name__}: {exc}")
            if self.metrics is not None:
                self.metrics.observe_failure(len(jobs))
            return
        for j in jobs:
            if j.cancelled:
                reason = "cancelled"
            elif j.tokens and j.tokens[-1] in stops:
                reason = "stop"
            else:
                reason = "length"
            self._finish(j, reason)
        if self.metrics is not None:
            self.metrics.observe_batch(gen.stats, jobs)

    @staticmethod
    def _finish(j: Job, reason: str) -> None:
        j.finish_reason = reason
        j.finished_at = time.perf_counter()
        j.sink("done", reason)
