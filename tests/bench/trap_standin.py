"""A ``trtllm-serve`` stand-in (:mod:`tests.bench.trtllm_standin`) that walks into the zero-draft trap.

What it reproduces (TensorRT-LLM PR #16888's description of released builds): the draft length
is looked up per step from the number of requests in flight with a schedule ``{top: max_draft_len}``
and no floor, so above ``top`` every step skips drafting; the drafter's context rows for the
tokens committed then are never written, and once drafting resumes, every request that lived
through such a step drafts from unwritten rows for the rest of its life. The stand-in decodes
each request in segments of ``segment`` tokens (requests interleave between segments), and a
request that saw a zero-draft segment (its own or another's) drafts from then on with a copy of
the drafter whose context projection (``fc``) is noise: what attending to uninitialised rows
amounts to. Verification is the target's, so the output stays the target's greedy decoding;
only acceptance falls. ``floor=1`` is the fixed release (PR #16888): never 0, nothing stale.
"""

from __future__ import annotations

import collections
import copy
import threading
import time

import torch

from dflash_trt.runtime import SamplingParams, generate
from tests.bench.trtllm_standin import StandIn


class _TurnLock:
    """A lock handed over in arrival order: a request that finishes a segment queues behind the
    ones already waiting, so segments interleave as a batching server's steps do (``threading.Lock``
    promises no order: on two busy cores one survivor could run to its end before a short one
    got a turn, leaving the probe's low-concurrency window empty)."""

    def __init__(self):
        self._cv = threading.Condition()
        self._queue: collections.deque = collections.deque()
        self._held = False

    def __enter__(self):
        me = object()
        with self._cv:
            self._queue.append(me)
            self._cv.wait_for(lambda: not self._held and self._queue[0] is me)
            self._queue.popleft()
            self._held = True
        return self

    def __exit__(self, *exc):
        with self._cv:
            self._held = False
            self._cv.notify_all()


class TrapStandIn(StandIn):
    def __init__(self, bundle, *, top: int, segment: int = 16, floor: int = 0, **kw):
        super().__init__(bundle, **kw)
        self.lock = _TurnLock()  # segments in turn (see _TurnLock)
        self.top, self.segment, self.floor = top, segment, floor
        self.zero_steps = 0
        self.stale = copy.deepcopy(self.pair.drafter)
        gen = torch.Generator().manual_seed(0)
        with torch.no_grad():
            self.stale.fc.weight.copy_(torch.randn(self.stale.fc.weight.shape, generator=gen))

    def complete(self, prompt_ids: list[int], max_tokens: int, temperature: float, logprobs: int | None) -> dict:
        with self.count_lock:
            self.in_flight += 1
            seen = self.zero_steps
        out: list[int] = []
        try:
            while len(out) < max_tokens:
                with self.lock, torch.inference_mode():
                    if self._segment(prompt_ids, out, max_tokens, seen):
                        break
        finally:
            with self.count_lock:
                self.in_flight -= 1
        text = self.pair.decode(out)
        choice = {
            "index": 0,
            "text": text,
            "finish_reason": "length",
            "logprobs": self._logprobs(prompt_ids, out, logprobs) if logprobs else None,
        }
        return {
            "id": f"cmpl-{self.iter}",
            "object": "text_completion",
            "model": self.name,
            "choices": [choice],
            "usage": {
                "prompt_tokens": len(prompt_ids),
                "completion_tokens": len(out),
                "total_tokens": len(prompt_ids) + len(out),
            },
        }

    def _segment(self, ids: list[int], out: list[int], max_tokens: int, seen: int) -> bool:
        """One segment of a request; True when it stopped."""
        batch = self.in_flight
        L = self.max_draft_len if batch <= self.top else self.floor
        if L == 0:
            self.zero_steps += 1
        drafter = self.stale if (self.zero_steps > seen and L) else self.pair.drafter
        start = time.perf_counter()
        gen = generate(
            self.pair.target,
            drafter,
            [ids + out],
            max_new_tokens=min(self.segment, max_tokens - len(out)),
            sampling=SamplingParams(temperature=0.0),
            block_size=L + 1,
            stop_token_ids=[],
        )
        out += list(gen.token_ids[0])
        self._record(gen.stats, L, batch, 1e3 * (time.perf_counter() - start))
        return not gen.token_ids[0]
