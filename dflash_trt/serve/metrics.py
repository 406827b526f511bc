"""Prometheus metrics of the embedded server (one registry per app).

Names (all prefixed ``dflash_``):

- ``acceptance_length``: τ, tokens committed per sequence per target forward, since start.
- ``per_position_acceptance{position="k"}``: share of rounds whose draft position k was
  accepted, since start (k = 1 .. B-1).
- ``spec_rounds_total``, ``spec_committed_tokens_total``, ``spec_accepted_total{position}``:
  the counters behind those two, so a scraper can compute τ over any window
  (``Δcommitted / Δrounds``; ``dflash-trt bench --endpoint`` does).
- ``tokens_per_second``: generated tokens per second of the last batch.
- ``queue_depth``, ``running_requests``: waiting and running requests now.
- ``requests_total{status}``: finished requests by HTTP status (499: client went away).
- ``prompt_tokens_total``, ``generation_tokens_total``, ``batch_size`` (histogram),
  ``time_to_first_token_seconds``, ``request_seconds`` (histograms), ``block_size``.
"""

from __future__ import annotations

from dflash_trt.errors import require
from dflash_trt.runtime import Stats


class ServerMetrics:
    def __init__(self, block_size: int):
        pc = require("prometheus_client", "serve", "the server's /metrics endpoint")
        self._pc = pc
        pc.disable_created_metrics()  # no *_created series: they double the page for nothing
        self.registry = r = pc.CollectorRegistry()
        self.block_size = block_size
        self.requests = pc.Counter("dflash_requests", "Finished requests by HTTP status.", ["status"], registry=r)
        self.prompt_tokens = pc.Counter("dflash_prompt_tokens", "Prompt tokens of admitted requests.", registry=r)
        self.generation_tokens = pc.Counter("dflash_generation_tokens", "Tokens sent to clients.", registry=r)
        self.rounds = pc.Counter("dflash_spec_rounds", "Sequence-rounds: one per sequence per target forward "
                                 "(prefill excluded).", registry=r)
        self.committed = pc.Counter("dflash_spec_committed_tokens", "Tokens committed in those rounds "
                                    "(accepted drafts + bonus).", registry=r)
        self.accepted = pc.Counter("dflash_spec_accepted", "Rounds whose draft position k was accepted.",
                                   ["position"], registry=r)
        self.tau = pc.Gauge("dflash_acceptance_length", "τ: mean tokens committed per sequence per target "
                            "forward, since start.", registry=r)
        self.per_position = pc.Gauge("dflash_per_position_acceptance", "Acceptance rate of draft position k, "
                                     "since start.", ["position"], registry=r)
        self.tps = pc.Gauge("dflash_tokens_per_second", "Generated tokens per second of the last batch.", registry=r)
        self.queue_depth = pc.Gauge("dflash_queue_depth", "Requests waiting for a batch.", registry=r)
        self.running = pc.Gauge("dflash_running_requests", "Requests in the running batch.", registry=r)
        self.batch_size = pc.Histogram("dflash_batch_size", "Requests per runtime batch.",
                                       buckets=(1, 2, 4, 8, 16, 32, 64, 128), registry=r)
        self.ttft = pc.Histogram("dflash_time_to_first_token_seconds", "Queue + prefill time.", registry=r)
        self.latency = pc.Histogram("dflash_request_seconds", "Queue to last token.", registry=r)
        pc.Gauge("dflash_block_size", "Draft block size B (1: autoregressive).", registry=r).set(block_size)
        self._rounds = 0
        self._committed = 0
        self._accepted_at = [0] * max(0, block_size - 1)
        for k in range(1, block_size):  # every position is present from the start
            self.per_position.labels(position=str(k)).set(0)
            self.accepted.labels(position=str(k))
        for status in ("200", "400", "404", "429", "499", "500", "503"):
            self.requests.labels(status=status)

    def set_queue(self, waiting: int, running: int) -> None:
        self.queue_depth.set(waiting)
        self.running.set(running)

    def observe_batch(self, stats: Stats, jobs) -> None:
        self.batch_size.observe(len(jobs))
        self.rounds.inc(stats.rounds)
        self.committed.inc(stats.committed)
        self._rounds += stats.rounds
        self._committed += stats.committed
        for k, a in enumerate(stats.accepted_at, 1):
            self.accepted.labels(position=str(k)).inc(a)
            if k - 1 < len(self._accepted_at):
                self._accepted_at[k - 1] += a
        if self._rounds:
            self.tau.set(self._committed / self._rounds)
            for k, a in enumerate(self._accepted_at, 1):
                self.per_position.labels(position=str(k)).set(a / self._rounds)
        sent = sum(len(j.tokens) for j in jobs)
        self.generation_tokens.inc(sent)
        if stats.seconds > 0:
            self.tps.set(sent / stats.seconds)
        for j in jobs:
            if j.first_token_at is not None:
                self.ttft.observe(j.first_token_at - j.enqueued_at)
            if j.finished_at is not None:
                self.latency.observe(j.finished_at - j.enqueued_at)

    def observe_failure(self, n: int) -> None:
        pass  # the server counts the 500s when it answers them

    def request_done(self, status: int) -> None:
        self.requests.labels(status=str(status)).inc()

    def render(self) -> tuple[bytes, str]:
        return self._pc.generate_latest(self.registry), self._pc.CONTENT_TYPE_LATEST
