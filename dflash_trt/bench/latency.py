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
- a level's ``output_tokens_per_second`` (all output tokens / wall time),
  ``request_throughput`` (completed requests / wall time), ``achieved_request_rate`` (requests
  sent per second) and ``goodput`` (completed requests within every TTFT/TPOT/e2el limit per
  second);
- per category (where prompts carry one): τ (from the server's per-request figure, weighted by
  rounds), decode tokens/s per user and TPOT.

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
    acceptance_length: float | None = None  # τ of this request, where the server reports it
    rounds: int | None = None  # its verify rounds (weights τ when requests are pooled)
    repeat: int = 0  # the pass of its level it was sent in (``start`` counts from it)

    @property
    def output_tokens(self) -> int | None:
        return sum(n for _, n in self.chunks) if self.tokens_from else None

    def as_dict(self) -> dict:
        # times unrounded: a summary re-derived from the JSON equals the one reported
        return {
            "ok": self.ok,
            "status": self.status,
            "error": self.error,
            "start_s": self.start,
            "e2el_s": self.e2el,
            "chunks": [[t, n] for t, n in self.chunks],
            "output_tokens": self.output_tokens,
            "prompt_tokens": self.prompt_tokens,
            "tokens_from": self.tokens_from,
            "category": self.category,
            "acceptance_length": self.acceptance_length,
            "rounds": self.rounds,
            "repeat": self.repeat,
        }

    @classmethod
    def from_dict(cls, d: dict) -> Record:
        """A record as :meth:`as_dict` wrote it (``--json`` output re-read for re-analysis)."""
        return cls(
            ok=d["ok"],
            start=d.get("start_s", 0.0),
            chunks=[(t, n) for t, n in d.get("chunks", [])],
            e2el=d.get("e2el_s", 0.0),
            status=d.get("status", 0),
            error=d.get("error"),
            tokens_from=d.get("tokens_from"),
            prompt_tokens=d.get("prompt_tokens"),
            category=d.get("category"),
            acceptance_length=d.get("acceptance_length"),
            rounds=d.get("rounds"),
            repeat=d.get("repeat", 0),
        )


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
    for i in sorted(range(n), key=lambda i: (-(share[i] - counts[i]), i))[: total - sum(counts)]:
        counts[i] += 1
    while total >= n and 0 in counts:
        counts[counts.index(max(counts))] -= 1
        counts[counts.index(0)] += 1
    return counts


def chunk_tokens(
    texts: Sequence[str], cumulative: Sequence[int | None], logprobs: Sequence[int | None], final: int | None
) -> tuple[list[int] | None, str | None]:
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

    return {
        "mean": r(statistics.fmean(xs)) if xs else None,
        "median": r(percentile(xs, 0.5)),
        "p90": r(percentile(xs, 0.9)),
        "p99": r(percentile(xs, 0.99)),
    }


def meets(r: Record, limits: dict[str, float]) -> bool:
    """``r`` completed within every limit (ms; ``ttft``, ``tpot``, ``e2el``). A request of one
    token has no TPOT and meets that limit; one without a token misses TTFT's."""
    got = {"ttft": ttft(r), "tpot": tpot(r), "e2el": r.e2el}
    return r.ok and all(
        ((v := got[k]) is None and k == "tpot") or (v is not None and MS * v <= ms) for k, ms in limits.items()
    )


def goodput(records: Sequence[Record], wall: float, limits: dict[str, float]) -> dict:
    """Requests per second that met every limit, and their share of all sent."""
    good = sum(meets(r, limits) for r in records)
    return {
        "limits_ms": dict(limits),
        "good_requests": good,
        "goodput": round(good / wall, 4) if wall > 0 else None,
        "good_fraction": round(good / len(records), 4) if records else None,
    }


def tau(records: Sequence[Record]) -> float | None:
    """τ over requests that report it, weighted by their rounds (committed / rounds)."""
    rated = [r for r in records if r.acceptance_length is not None and r.rounds]
    rounds = sum(r.rounds or 0 for r in rated)
    return round(sum((r.acceptance_length or 0) * (r.rounds or 0) for r in rated) / rounds, 4) if rounds else None


def by_category(records: Sequence[Record]) -> dict[str, dict] | None:
    """Per category (where records carry one): requests, τ, decode tokens/s per user, TPOT."""
    cats = sorted({r.category for r in records if r.category is not None})
    if not cats:
        return None
    out = {}
    for c in cats:
        mine = [r for r in records if r.category == c and r.ok]
        users = [x for x in map(per_user, mine) if x is not None]
        out[c] = {
            "requests": len(mine),
            "acceptance_length": tau(mine),
            "tokens_per_second_per_user": round(statistics.median(users), 3) if users else None,
            "tpot_ms": distribution([x for x in map(tpot, mine) if x is not None]),
        }
    return out


def achieved_rate(records: Sequence[Record]) -> float | None:
    """Requests sent per second: per repeat, (sent - 1) over the span from its first send to its
    last; summed over repeats."""
    sent = span = 0.0
    for k in {r.repeat for r in records}:
        starts = sorted(r.start for r in records if r.repeat == k)
        sent, span = sent + len(starts) - 1, span + starts[-1] - starts[0]
    return round(sent / span, 4) if span > 0 else None


def summarize(records: Sequence[Record], wall: float, limits: dict[str, float] | None = None) -> dict:
    """A load level's figures from its records and its wall time (seconds)."""
    ok = [r for r in records if r.ok]
    counted = [r for r in ok if r.tokens_from]
    tokens = sum(r.output_tokens or 0 for r in counted)
    users = [x for x in map(per_user, ok) if x is not None]
    users_ttft = [x for x in map(per_user_with_ttft, ok) if x is not None]
    out = {
        "ok": len(ok),
        "failed": len(records) - len(ok),
        "seconds": wall,
        "output_tokens": tokens if counted else None,
        "output_tokens_per_second": round(tokens / wall, 3) if counted and wall > 0 else None,
        "request_throughput": round(len(ok) / wall, 4) if wall > 0 else None,
        "achieved_request_rate": achieved_rate(records),
        "tokens_per_second_per_user": round(statistics.median(users), 3) if users else None,
        "tokens_per_second_per_user_with_ttft": round(statistics.median(users_ttft), 3) if users_ttft else None,
        "ttft_ms": distribution([x for x in map(ttft, ok) if x is not None]),
        "tpot_ms": distribution([x for x in map(tpot, ok) if x is not None]),
        "itl_ms": distribution([x for r in ok for x in itl_per_chunk(r)]),
        "itl_per_token_ms": distribution([x for r in ok for x in itl_per_token(r)]),
        "e2el_ms": distribution([r.e2el for r in ok]),
        "tokens_from": sorted({r.tokens_from for r in counted if r.tokens_from}) or None,
        "request_acceptance_length": tau(ok),
        "categories": by_category(records),
    }
    if limits:
        out["goodput"] = goodput(records, wall, limits)
    return out
