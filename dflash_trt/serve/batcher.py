"""Request batching for the embedded server: a bounded queue and one worker thread.

Requests become :class:`Job` objects in a first-come-first-served queue (:class:`Batcher`).
Admission: a job is refused (429) only when the jobs already waiting fill ``max_queue`` beyond
the batch slots free right now, so an idle server never refuses; a closing server answers 503.
The worker is :class:`~dflash_trt.serve.continuous.ContinuousBatcher`, the runtime's scheduler
on every backend: a job joins the running batch at the next round and leaves when done.

Tokens are handed to each job as they are committed (``sink("tokens", ...)``), so streaming is
real; a job whose client went away leaves the batch at the next round. The worker runs torch
in its own thread (torch releases the GIL), so the event loop keeps accepting, streaming and
rejecting requests while a round runs.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from dflash_trt.runtime import Pair, Request, SamplingParams
from dflash_trt.serve.stops import TextStream


class QueueFull(Exception):
    """The wait queue is at its bound: the server answers 429."""


class Draining(Exception):
    """The server is shutting down and takes no new work: 503."""


logger = logging.getLogger(__name__)
_ids = itertools.count()


@dataclass(eq=False)
class Job:
    """One request as the server serves it: the runtime's :class:`~dflash_trt.runtime.Request`
    (prompt, limits, sampling, its tokens and rounds: the one place they are counted) and what
    serving adds, the sink, the text stream and the timestamps. ``sink(kind, payload)`` receives
    ``("tokens", [ids])`` after each commit (then ``("text", str)``, the text now safe to stream,
    when the job has a ``text``: its stop strings, :mod:`dflash_trt.serve.stops`) and one final
    ``("done", finish_reason)`` or ``("error", message)``; it is called from the worker thread.
    ``finish_reason`` is what the client is told (``"error"`` too), set when the job ends."""

    request: Request
    ignore_eos: bool = False
    text: TextStream | None = None  # the detokenized output, cut at a stop string
    sink: Callable[[str, object], None] = lambda kind, payload: None
    id: int = field(default_factory=lambda: next(_ids))
    finish_reason: str | None = None
    enqueued_at: float = field(default_factory=time.perf_counter)
    started_at: float | None = None  # its prefill began (queue time: started - enqueued)
    first_token_at: float | None = None
    last_token_at: float | None = None
    finished_at: float | None = None
    gaps: list[float] = field(default_factory=list)  # seconds between consecutive commits (ITL)
    _cancel: threading.Event = field(default_factory=threading.Event)

    @classmethod
    def new(cls, prompt: list[int], max_tokens: int, sampling: SamplingParams | None = None, **kw) -> Job:
        return cls(Request(list(prompt), max_tokens, sampling or SamplingParams()), **kw)

    @property
    def prompt(self) -> list[int]:
        return self.request.prompt

    @property
    def max_tokens(self) -> int:
        return self.request.max_new_tokens

    @property
    def sampling(self) -> SamplingParams:
        return self.request.sampling

    @property
    def tokens(self) -> list[int]:
        """The tokens generated so far (the request's, as each commit kept them)."""
        return self.request.token_ids

    @property
    def rounds(self) -> int:
        return self.request.rounds

    def cancel(self) -> None:
        """Ask the worker to drop this job (the client went away). Idempotent."""
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def committed(self, new: list[int], metrics=None) -> None:
        """Tokens committed for this job: timestamps, the inter-commit gap, then the sink."""
        now = time.perf_counter()
        if self.first_token_at is None:
            self.first_token_at = now
        elif self.last_token_at is not None:
            self.gaps.append(now - self.last_token_at)
            if metrics is not None:
                metrics.itl.observe(self.gaps[-1])
        self.last_token_at = now
        if new and not self.cancelled:  # the request holds them already (runtime.batch.take)
            self.sink("tokens", new)
            self._send_text()

    def _send_text(self) -> None:
        if self.text is not None and (delta := self.text.pop()):
            self.sink("text", delta)

    def match_stop(self, new: list[int]) -> int | None:
        """``runtime.Request.match_stop``: the tokens of ``new`` up to a stop string's match."""
        return self.text.feed(new) if self.text is not None else None

    def finish(self, reason: str) -> None:
        if self.text is not None and reason != "cancelled":
            self.text.finish()
            self._send_text()
        self.finish_reason = reason
        self.finished_at = time.perf_counter()
        self.sink("done", reason)

    def fail(self, message: str) -> None:
        self.finish_reason = "error"
        self.finished_at = time.perf_counter()
        self.sink("error", message)

    @property
    def acceptance_length(self) -> float | None:
        """This request's τ: tokens committed per target forward, over its rounds."""
        return self.request.acceptance_length


class Batcher:
    """Bounded FIFO of jobs and the worker thread that runs them (subclasses: the policy)."""

    def __init__(
        self,
        pair: Pair,
        *,
        max_batch: int = 8,
        max_queue: int = 64,
        block_size: int | None = None,
        metrics=None,
        torch_threads: int | None = None,
    ):
        if max_batch < 1 or max_queue < 0:
            raise ValueError("max_batch must be >= 1 and max_queue >= 0")
        self.pair = pair
        self.max_batch, self.max_queue = max_batch, max_queue
        self.block_size = pair.block_size(block_size)
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
            self._thread = threading.Thread(target=self._worker, name="dflash-batcher", daemon=True)
            self._thread.start()

    def close(self) -> None:
        """Stop taking jobs (submit raises Draining); queued and running jobs still finish."""
        with self._cond:
            self._stopping = True
            self._paused = False
            self._cond.notify_all()

    def stop(self, timeout: float | None = None) -> None:
        """Stop taking jobs, finish every queued and running one, then end the worker."""
        self.close()
        if self._thread is not None:
            self._thread.join(timeout)

    def abandon(self, message: str = "the server is shutting down") -> None:
        """Fail every queued and running job now (a drain out of time): each gets an error event;
        running rows are cancelled and leave at the worker's next round."""
        with self._cond:
            self._stopping = True
            left = list(self._pending) + list(self._running)
            self._pending.clear()
            self._cond.notify_all()
        for job in left:
            if not job.finished:
                job.cancel()
                job.fail(message)

    def _fail(self, job: Job, stage: str, exc: BaseException | str) -> None:
        """Fail ``job`` alone: its error event, its row cancelled, the failure counted."""
        why = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
        # an exception's traceback is kept here (one given as text was logged where it was caught)
        logger.error(
            "request %d failed (%s): %s", job.id, stage, why, exc_info=exc if isinstance(exc, BaseException) else None
        )
        job.cancel()
        if not job.finished:
            job.fail(f"generation failed ({stage}): {why}")
        if self.metrics is not None:
            self.metrics.request_failed(stage)

    def pause(self) -> None:
        """Hold queued jobs (running ones finish); for maintenance and for tests."""
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

    def free_slots(self) -> int:
        """Batch slots a job could take now without waiting (0 while paused)."""
        return 0 if self._paused else max(0, self.max_batch - len(self._running))

    def check(self, job: Job) -> None:
        """Raise ``runtime.Refused`` (one line) for a job this batcher will not run; asked before
        :meth:`submit` (default: any runs)."""
        return None

    def submit(self, job: Job) -> None:
        """Queue ``job``: refused (QueueFull) only when ``max_queue`` jobs would wait beyond the
        free slots, so an idle server always admits."""
        with self._cond:
            if self._stopping:
                raise Draining("the server is shutting down")
            if len(self._pending) >= self.max_queue + self.free_slots():
                raise QueueFull(f"the request queue is full ({self.max_queue} waiting); retry later")
            self._pending.append(job)
            self._gauge()
            self._cond.notify_all()

    # ---- worker -----------------------------------------------------------------------
    def _gauge(self) -> None:
        if self.metrics is not None:
            self.metrics.set_queue(len(self._pending), len(self._running))

    def _worker(self) -> None:
        torch.set_num_threads(self.torch_threads)  # per thread: the worker's own pool
        self._loop()

    def _loop(self) -> None:
        raise NotImplementedError

    def stops_for(self, job: Job) -> frozenset[int]:
        return frozenset() if job.ignore_eos else frozenset(self.pair.stop_token_ids)
