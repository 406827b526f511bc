"""What a running deployment says about itself: acceptance, draft lengths and GPU memory, read
from two ``/metrics`` scrapes (a window) or from TensorRT-LLM's acceptance files.

A :class:`Window` holds counts, so the windows of several load levels add up:

- ``rounds`` / ``committed``: sequence-rounds (one sequence, one target forward) and the tokens
  they committed (accepted drafts + the bonus token): τ = committed / rounds.
- ``accepted_at[k-1]``: rounds whose draft position k was accepted (prefix acceptance), so the
  per-position acceptance rate is ``accepted_at[k-1] / rounds``.
- ``draft_rounds[(b, L)]``: rounds run with ``b`` live rows drafting ``L`` tokens each: the
  schedule the server applied.
- ``gpu_memory``: the largest GPU memory in use it reported, bytes (per rank).

Servers read:

- the embedded server (``serve/metrics.py``): Prometheus counters ``dflash_spec_rounds_total``,
  ``dflash_spec_committed_tokens_total``, ``dflash_spec_accepted_total{position}``,
  ``dflash_draft_rounds_total{batch_size,draft_len}``, subtracted between the two scrapes;
- ``trtllm-serve`` (``tensorrt_llm/serve/openai_server.py``, ``GET /metrics``, iteration stats
  with ``enable_iter_perf_stats``): a JSON list of the iterations since the previous scrape, each
  with ``gpuMemUsage``, ``inflightBatchingStats.numGenRequests`` and ``specDecodingStats``
  (``numDraftTokens``, ``numAcceptedTokens``, ``numRequestsWithDraftTokens``); an iteration's
  draft length is ``numDraftTokens / numRequestsWithDraftTokens``, and an iteration whose
  ``numGenRequests`` rows drafted nothing (``specDecodingStats`` present, every count 0:
  ``py_executor.py::_update_iter_stats`` fills it whenever speculation is configured) ran them
  at draft length 0, one token each. Only attention-DP rank 0's rows are read, as
  ``bench.endpoint`` does;
- TensorRT-LLM's acceptance recorder (``tensorrt_llm/_torch/speculative/accept_stats.py``, on
  when ``TLLM_DFLASH_ACCEPT_STATS_DIR`` is set): per rank ``dflash_accept_stats_rank{r}.json``
  with ``accepted_draft_hist[a]`` = verify steps that accepted exactly ``a`` drafts, cumulative
  since the server started (so :func:`accept_files` is read before and after, and subtracted).
  AL = mean accepted + 1 and P(position k accepted) = P(accepted >= k) (``summarize_hist``).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from dflash_trt.errors import DFlashError

ACCEPT_FILE_PREFIX = "dflash_accept_stats_rank"


@dataclass
class Window:
    stack: str = "unknown"  # embedded | trtllm | unknown (what the scrapes looked like)
    rounds: int = 0
    committed: int = 0
    accepted_at: list[int] = field(default_factory=list)
    draft_rounds: Counter = field(default_factory=Counter)  # (batch size, draft length) -> rounds
    gpu_memory: int | None = None

    @property
    def tau(self) -> float | None:
        return round(self.committed / self.rounds, 4) if self.rounds else None

    @property
    def per_position(self) -> list[float] | None:
        if not self.rounds or not self.accepted_at:
            return None
        return [round(a / self.rounds, 4) for a in self.accepted_at]

    def __add__(self, other: Window) -> Window:
        n = max(len(self.accepted_at), len(other.accepted_at))
        pad = lambda xs: list(xs) + [0] * (n - len(xs))  # noqa: E731
        mems = [m for m in (self.gpu_memory, other.gpu_memory) if m is not None]
        return Window(
            self.stack if self.stack != "unknown" else other.stack,
            self.rounds + other.rounds,
            self.committed + other.committed,
            [a + b for a, b in zip(pad(self.accepted_at), pad(other.accepted_at), strict=True)],
            self.draft_rounds + other.draft_rounds,
            max(mems) if mems else None,
        )


def prometheus(body: str) -> dict[tuple[str, tuple], float]:
    """``{(name, ((label, value), ...)): value}`` of a Prometheus text page."""
    from prometheus_client.parser import text_string_to_metric_families  # optional: prometheus_client (serve extra)

    out: dict[tuple[str, tuple], float] = {}
    for fam in text_string_to_metric_families(body):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _embedded(before: str | None, after: str) -> Window:
    a, b = prometheus(after), prometheus(before) if before else {}
    delta = {k: v - b.get(k, 0.0) for k, v in a.items()}
    get = lambda name, **lab: int(round(delta.get((name, tuple(sorted(lab.items()))), 0.0)))  # noqa: E731
    positions = sorted(int(dict(lab)["position"]) for name, lab in delta if name == "dflash_spec_accepted_total")
    draft: Counter[tuple[int, int]] = Counter()  # (batch size, draft length): rounds
    for (name, lab), v in delta.items():
        if name == "dflash_draft_rounds_total" and round(v) > 0:
            d = dict(lab)
            draft[(int(d["batch_size"]), int(d["draft_len"]))] += int(round(v))
    return Window(
        "embedded",
        get("dflash_spec_rounds_total"),
        get("dflash_spec_committed_tokens_total"),
        [get("dflash_spec_accepted_total", position=str(k)) for k in positions],
        draft,
    )


def _trtllm(after: str) -> Window:
    try:
        rows = json.loads(after)
    except json.JSONDecodeError:
        return Window()
    w = Window("trtllm")
    for row in rows if isinstance(rows, list) else [rows]:
        if not isinstance(row, dict) or row.get("attentionDpRank", 0) != 0:
            continue
        if row.get("gpuMemUsage") is not None:
            w.gpu_memory = max(w.gpu_memory or 0, int(row["gpuMemUsage"]))
        spec = row.get("specDecodingStats")
        if not isinstance(spec, dict):  # speculation not configured (a baseline): nothing drafted or not
            continue
        reqs = int(spec.get("numRequestsWithDraftTokens") or 0)
        gen = int((row.get("inflightBatchingStats") or {}).get("numGenRequests") or 0)
        if not reqs:  # speculating, yet no generation request drafted: draft length 0 at this batch
            w.rounds += gen  # (the zero-draft trap's signature; a context-only iteration has gen 0)
            w.committed += gen
            if gen:
                w.draft_rounds[(gen, 0)] += gen
            continue
        w.rounds += reqs
        w.committed += reqs + int(spec.get("numAcceptedTokens") or 0)
        w.draft_rounds[(gen or reqs, round(int(spec.get("numDraftTokens") or 0) / reqs))] += reqs
    return w


def window(before: str | None, after: str | None) -> Window:
    """What a server did between two /metrics bodies (None: that scrape failed)."""
    if after is None:
        return Window()
    text = after.strip()
    if text.startswith(("[", "{")):  # trtllm-serve: the rows since the previous scrape
        return _trtllm(text)
    if "dflash_spec_rounds_total" in text:
        return _embedded(before, text)
    return Window()


def windows(bodies: list[str | None]) -> list[Window]:
    """One window per load level from ``bench.endpoint``'s scrapes (before, after, before, ...)."""
    return [window(bodies[i], bodies[i + 1]) for i in range(0, len(bodies) - 1, 2)]


# ---- TensorRT-LLM's acceptance files -------------------------------------------------------
def accept_files(stats_dir: str | Path) -> list[int] | None:
    """The accepted-draft histogram of every rank's file summed (None: no file yet). Ratios are
    what verify reads, so TP-replicated ranks (identical files) do not skew them."""
    d = Path(stats_dir)
    if not d.is_dir():
        raise DFlashError(
            f"--accept-stats {d}: no such directory (the TLLM_DFLASH_ACCEPT_STATS_DIR trtllm-serve was started with)"
        )
    total: list[int] | None = None
    for f in sorted(d.glob(f"{ACCEPT_FILE_PREFIX}*.json")):
        try:
            hist = [int(x) for x in json.loads(f.read_text())["accepted_draft_hist"]]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise DFlashError(f"{f}: not a TensorRT-LLM acceptance file ({exc})") from None
        total = hist if total is None else [a + b for a, b in zip(total, hist, strict=False)]
    return total


def hist_window(before: list[int] | None, after: list[int] | None) -> Window:
    """τ and per-position acceptance of the verify steps between two histogram reads
    (``accept_stats.summarize_hist``: AL = mean accepted + 1, P(k accepted) = P(accepted >= k))."""
    if after is None:
        return Window()
    hist = [a - b for a, b in zip(after, before, strict=False)] if before else list(after)
    steps = sum(hist)
    return Window(
        "trtllm", steps, steps + sum(a * n for a, n in enumerate(hist)), [sum(hist[k:]) for k in range(1, len(hist))]
    )
