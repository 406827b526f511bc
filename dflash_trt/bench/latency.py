"""Latency and throughput as the serving benchmarks define them, from (time, tokens) events.

A request is a :class:`Record`: the times its streamed chunks arrived (seconds since the request
was sent) with the tokens each carried, and when its stream ended. Every figure below is a pure
function of records (``vllm bench serve``, SGLang ``bench_serving`` and genai-perf define the
first five; FACTS §15):

- ``ttft``: time to first token, the first chunk's arrival;
- ``e2el``: end-to-end latency, the stream's end;
- ``tpot``: time per output token of one request, ``(e2el - ttft) / (output tokens - 1)``;
- ``itl`` (``itl_ms``): inter-token latency *per chunk*, the gap between consecutive chunks, as
  vLLM and SGLang print it. A speculating server sends several tokens per chunk, so this gap
  grows with τ while the time per token falls;
- ``itl_per_token`` (ours): each gap divided over the tokens its chunk carried, one value per
  token (a chunk of k tokens after a gap g gives k values g / k): the per-token latency a reader
  of a speculating server sees;
- ``tokens_per_second_per_user`` (decode, TTFT left out): ``(output tokens - 1) / (e2el - ttft)``,
  i.e. 1 / tpot; ``tokens_per_second_per_user_with_ttft``: ``output tokens / e2el``;
- a level's ``output_tokens_per_second`` (all output tokens / wall time) and
  ``request_throughput`` (completed requests / wall time).

Distributions are reported as ``mean``, ``median``, ``p90`` and ``p99`` in milliseconds
(:func:`distribution`; percentiles interpolate linearly, as numpy's default does).

Tokens per chunk (:func:`chunk_tokens`) come from what the server offers, best first: cumulative
per-chunk ``usage.completion_tokens`` (vLLM's ``continuous_usage_stats``), then the number of
logprob entries a chunk carries, else the final ``usage.completion_tokens`` spread over the chunks
in proportion to their text (each chunk with text gets at least one). Never the chunk count: a
request whose server sends no usage has no token figures (None).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

MS = 1e3


@dataclass
class Record:
    """One request. ``chunks``: ``(seconds since sent, tokens)`` per streamed chunk with output, in
    arrival order; ``e2el``: seconds until the stream ended; ``start``: seconds since the load began
    when it was sent; ``tokens_from``: where the token counts came from (:func:`chunk_tokens`)."""

    ok: bool
    start: float = 0.0
    chunks: list[tuple[float, int]] = field(default_factory=list)
    e2el: float = 0.0
    status: int = 0
    error: str | None = None
    tokens_from: str | None = None
    prompt_tokens: int | None = None
    category: str | None = None

    @property
    def output_tokens(self) -> int | None:
        return sum(n for _, n in self.chunks) if self.tokens_from else None

    def as_dict(self) -> dict:
        return {"ok": self.ok, "status": self.status, "error": self.error, "start_s": round(self.start, 6),
                "e2el_s": round(self.e2el, 6), "chunks": [[round(t, 6), n] for t, n in self.chunks],
                "output_tokens": self.output_tokens, "prompt_tokens": self.prompt_tokens,
                "tokens_from": self.tokens_from, "category": self.category}


# ---- tokens per chunk -----------------------------------------------------------------------------
def spread_tokens(texts: Sequence[str], total: int) -> list[int]:
    """``total`` tokens over chunks in proportion to their text length (largest remainder, so the
    counts sum to ``total``); where there are enough, a chunk left with none takes one from the
    largest (a chunk with text carried at least one token)."""
    n = len(texts)
    if n == 0:
        return []
    weights = [max(len(t), 1) for t in texts]
    share = [total * w / sum(weights) for w in weights]
    counts = [math.floor(x) for x in share]
    for i in sorted(range(n), key=lambda i: (-(share[i] - counts[i]), i))[:total - sum(counts)]:
        counts[i] += 1
    while total >= n and 0 in counts:
        counts[counts.index(max(counts))] -= 1
        counts[counts.index(0)] += 1
    return counts


def chunk_tokens(texts: Sequence[str], cumulative: Sequence[int | None], logprobs: Sequence[int | None],
                 final: int | None) -> tuple[list[int] | None, str | None]:
    """(tokens per chunk, where from) for chunks with ``texts``; ``cumulative[i]``: the chunk's
    ``usage.completion_tokens`` when sent per chunk, ``logprobs[i]``: its logprob entries, ``final``:
    the closing usage. (None, None) when the server gave no count."""
    if texts and all(c is not None for c in cumulative):
        cum = [int(c) for c in cumulative]  # type: ignore[arg-type]
        return [b - a for a, b in zip([0, *cum[:-1]], cum, strict=True)], "usage per chunk"
    if texts and all(n is not None for n in logprobs):
        return [int(n) for n in logprobs], "logprobs"  # type: ignore[arg-type]
    if final is not None:
        return spread_tokens(texts, int(final)), "usage spread over chunks by text"
    return None, None


# ---- per request --------------------------------------------------------------------------------
def ttft(r: Record) -> float | None:
    return r.chunks[0][0] if r.chunks else None


def tpot(r: Record) -> float | None:
    n, first = r.output_tokens, ttft(r)
    if n is None or first is None or n < 2:
        return None
    return (r.e2el - first) / (n - 1)


def itl_per_chunk(r: Record) -> list[float]:
    return [b[0] - a[0] for a, b in zip(r.chunks, r.chunks[1:], strict=False)]


def itl_per_token(r: Record) -> list[float]:
    if not r.tokens_from:
        return []
    out: list[float] = []
    for gap, (_, n) in zip(itl_per_chunk(r), r.chunks[1:], strict=True):
        out += [gap / n] * n if n > 0 else []
    return out


def per_user(r: Record) -> float | None:
    """Decode tokens/s of one request, TTFT left out: 1 / tpot."""
    t = tpot(r)
    return 1.0 / t if t else None


def per_user_with_ttft(r: Record) -> float | None:
    n = r.output_tokens
    return n / r.e2el if n and r.e2el > 0 else None


# ---- distributions and a level ---------------------------------------------------------------------
def percentile(xs: Sequence[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default); ``q`` in [0, 1]."""
    if not xs:
        return None
    s = sorted(xs)
    k = (len(s) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def distribution(xs: Sequence[float], scale: float = MS, digits: int = 3) -> dict:
    """``{mean, median, p90, p99}`` of ``xs`` times ``scale`` (None each when empty)."""
    def r(x: float | None) -> float | None:
        return None if x is None else round(scale * x, digits)

    return {"mean": r(statistics.fmean(xs)) if xs else None, "median": r(percentile(xs, 0.5)),
            "p90": r(percentile(xs, 0.9)), "p99": r(percentile(xs, 0.99))}


def summarize(records: Sequence[Record], wall: float) -> dict:
    """A load level's figures from its records and its wall time (seconds)."""
    ok = [r for r in records if r.ok]
    counted = [r for r in ok if r.tokens_from]
    tokens = sum(r.output_tokens or 0 for r in counted)
    users = [x for x in map(per_user, ok) if x is not None]
    users_ttft = [x for x in map(per_user_with_ttft, ok) if x is not None]
    return {
        "ok": len(ok), "failed": len(records) - len(ok), "seconds": round(wall, 4),
        "output_tokens": tokens if counted else None,
        "output_tokens_per_second": round(tokens / wall, 3) if counted and wall > 0 else None,
        "request_throughput": round(len(ok) / wall, 4) if wall > 0 else None,
        "tokens_per_second_per_user": round(statistics.median(users), 3) if users else None,
        "tokens_per_second_per_user_with_ttft": round(statistics.median(users_ttft), 3) if users_ttft else None,
        "ttft_ms": distribution([x for x in map(ttft, ok) if x is not None]),
        "tpot_ms": distribution([x for x in map(tpot, ok) if x is not None]),
        "itl_ms": distribution([x for r in ok for x in itl_per_chunk(r)]),
        "itl_per_token_ms": distribution([x for r in ok for x in itl_per_token(r)]),
        "e2el_ms": distribution([r.e2el for r in ok]),
        "tokens_from": sorted({r.tokens_from for r in counted if r.tokens_from}) or None,
    }
