"""Prometheus metrics of the embedded server (one registry per app).

Names (all prefixed ``dflash_``):

- ``acceptance_length``: τ, tokens committed per sequence per target forward, since start.
- ``per_position_acceptance{position="k"}``: share of rounds whose draft position k was
  accepted, since start (k = 1 .. B-1).
- ``spec_rounds_total``, ``spec_committed_tokens_total``, ``spec_accepted_total{position}``:
  the counters behind those two, so a scraper can compute τ over any window
  (``Δcommitted / Δrounds``; ``dflash-trt bench --endpoint`` does).
- ``tokens_per_second``: generated tokens per second of the last round (continuous batching)
  or batch (static).
- ``queue_depth``, ``running_requests``: waiting and running requests now.
- ``requests_total{status}``: finished requests by HTTP status (499: client went away).
- ``request_failures_total{stage}``: requests failed by the worker, by where it failed (``admit``:
  the prefill that joins it to the batch, ``step``: its own round, rerun alone after a shared round
  raised, ``stream``: handing its tokens on); each failed only its own request (streamed: an error
  event; else a 500 error object).
- ``isolated_rounds_total``: shared rounds (continuous batching) or batches (static) that raised
  and were rerun one row at a time; every row may still be answered, each alone, so a count that
  keeps growing is a batch-level fault (or an unsupported mix of requests) costing throughput.
- ``prompt_tokens_total``, ``generation_tokens_total``, ``block_size``, ``draft_len`` (of the
  last round: the schedule's value for the live batch size).
- ``draft_rounds_total{batch_size, draft_len}``: rounds run at each live batch size and the draft
  length in force there, so a scraper reads the schedule a server applied per batch size
  (``dflash-trt verify`` compares it with the plan).
- histograms: ``batch_size`` (live rows per round; per batch when static),
  ``queue_seconds`` (arrival to prefill), ``time_to_first_token_seconds``,
  ``inter_token_seconds`` (between a request's consecutive commits, what a streaming client
  sees; a commit carries τ tokens on average), ``request_seconds`` (arrival to last token) and
  ``request_acceptance_length`` (τ of each finished request).
"""

from __future__ import annotations

from dflash_trt.errors import require
from dflash_trt.runtime import Stats

FAILURE_STAGES = ("admit", "step", "stream")


class ServerMetrics:
    def __init__(self, block_size: int):
        pc = require("prometheus_client", "serve", "the server's /metrics endpoint")
        self._pc = pc
        pc.disable_created_metrics()  # no *_created series: they double the page for nothing
        self.registry = r = pc.CollectorRegistry()
        self.block_size = block_size
        self._counters(pc, r)
        self._gauges(pc, r)
        self._histograms(pc, r)
        pc.Gauge("dflash_block_size", "Draft block size B (1: autoregressive).", registry=r).set(block_size)
        self.draft_len = pc.Gauge("dflash_draft_len", "Draft tokens per row in the last round.", registry=r)
        self.isolated = pc.Counter(
            "dflash_isolated_rounds",
            "Shared rounds (static: batches) that raised and were rerun one row at a time.",
            registry=r,
        )
        self.draft_rounds = pc.Counter(
            "dflash_draft_rounds",
            "Rounds by live batch size and the draft length in force.",
            ["batch_size", "draft_len"],
            registry=r,
        )
        self._rounds = 0
        self._committed = 0
        self._accepted_at = [0] * max(0, block_size - 1)
        for k in range(1, block_size):  # every position is present from the start
            self.per_position.labels(position=str(k)).set(0)
            self.accepted.labels(position=str(k))
        for status in ("200", "400", "404", "429", "499", "500", "503"):
            self.requests.labels(status=status)
        for stage in FAILURE_STAGES:
            self.failures.labels(stage=stage)

    def _counters(self, pc, r) -> None:
        """Requests by status, failures by stage, prompt and generated tokens, and the rounds behind τ."""
        self.requests = pc.Counter("dflash_requests", "Finished requests by HTTP status.", ["status"], registry=r)
        self.failures = pc.Counter(
            "dflash_request_failures", "Requests failed by the worker, by stage.", ["stage"], registry=r
        )
        self.prompt_tokens = pc.Counter("dflash_prompt_tokens", "Prompt tokens of admitted requests.", registry=r)
        self.generation_tokens = pc.Counter("dflash_generation_tokens", "Tokens sent to clients.", registry=r)
        self.rounds = pc.Counter(
            "dflash_spec_rounds", "Sequence-rounds: one per sequence per target forward (prefill excluded).", registry=r
        )
        self.committed = pc.Counter(
            "dflash_spec_committed_tokens", "Tokens committed in those rounds (accepted drafts + bonus).", registry=r
        )
        self.accepted = pc.Counter(
            "dflash_spec_accepted", "Rounds whose draft position k was accepted.", ["position"], registry=r
        )

    def _gauges(self, pc, r) -> None:
        """τ and per-position acceptance since start, tokens per second, waiting and running requests."""
        self.tau = pc.Gauge(
            "dflash_acceptance_length",
            "τ: mean tokens committed per sequence per target forward, since start.",
            registry=r,
        )
        self.per_position = pc.Gauge(
            "dflash_per_position_acceptance",
            "Acceptance rate of draft position k, since start.",
            ["position"],
            registry=r,
        )
        self.tps = pc.Gauge(
            "dflash_tokens_per_second", "Generated tokens per second of the last round (batch when static).", registry=r
        )
        self.queue_depth = pc.Gauge("dflash_queue_depth", "Requests waiting for a batch.", registry=r)
        self.running = pc.Gauge("dflash_running_requests", "Requests in the running batch.", registry=r)

    def _histograms(self, pc, r) -> None:
        """Batch sizes, the latencies a client sees, and each finished request's τ."""
        self.batch_size = pc.Histogram(
            "dflash_batch_size",
            "Live requests per runtime round (per batch when static).",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128),
            registry=r,
        )
        self.queue_time = pc.Histogram("dflash_queue_seconds", "Arrival to the start of prefill.", registry=r)
        self.ttft = pc.Histogram("dflash_time_to_first_token_seconds", "Queue + prefill time.", registry=r)
        self.itl = pc.Histogram(
            "dflash_inter_token_seconds",
            "Time between a request's consecutive commits.",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
            registry=r,
        )
        self.latency = pc.Histogram("dflash_request_seconds", "Queue to last token.", registry=r)
        self.request_tau = pc.Histogram(
            "dflash_request_acceptance_length",
            "τ of each finished request.",
            buckets=tuple(range(1, max(2, self.block_size) + 1)),
            registry=r,
        )

    def set_queue(self, waiting: int, running: int) -> None:
        self.queue_depth.set(waiting)
        self.running.set(running)

    def observe_round(
        self,
        stats: Stats,
        batch_size: int,
        seconds: float,
        tokens: int,
        draft_len: int | None = None,
        isolated: bool = False,
    ) -> None:
        """Counters of one runtime round (continuous) or batch (static): its Stats, live rows,
        wall time and generated tokens; ``isolated``: the shared round raised and its rows ran alone."""
        if isolated:
            self.isolated.inc()
        if batch_size:
            self.batch_size.observe(batch_size)
        if draft_len is not None:
            self.draft_len.set(draft_len)
            if batch_size:
                self.draft_rounds.labels(batch_size=str(batch_size), draft_len=str(draft_len)).inc()
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
        if seconds > 0 and tokens:
            self.tps.set(tokens / seconds)

    def observe_request(self, job) -> None:
        """A finished request's tokens, queue time, TTFT, latency and τ."""
        self.generation_tokens.inc(len(job.tokens))
        if job.started_at is not None:
            self.queue_time.observe(max(0.0, job.started_at - job.enqueued_at))
        if job.first_token_at is not None:
            self.ttft.observe(job.first_token_at - job.enqueued_at)
        if job.finished_at is not None:
            self.latency.observe(job.finished_at - job.enqueued_at)
        if job.acceptance_length is not None:
            self.request_tau.observe(job.acceptance_length)

    def request_failed(self, stage: str) -> None:
        self.failures.labels(stage=stage).inc()

    def request_done(self, status: int) -> None:
        self.requests.labels(status=str(status)).inc()

    def render(self) -> tuple[bytes, str]:
        return self._pc.generate_latest(self.registry), self._pc.CONTENT_TYPE_LATEST
