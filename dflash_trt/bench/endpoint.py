"""Benchmark any OpenAI-compatible endpoint at several concurrencies (and compare two).

Per concurrency level: a warm-up (``warmup`` requests, default one per concurrent slot, not
counted), then ``repeats`` passes of ``requests`` streamed completions with at most
``concurrency`` in flight. Each request is a :class:`~dflash_trt.bench.latency.Record` of
(time, tokens) chunk events (:mod:`~dflash_trt.bench.stream` sends it and reads its stream);
every figure (TTFT, TPOT, ITL per chunk and per token, end-to-end latency, tokens/s per user
with and without TTFT, throughput) is defined once in :mod:`dflash_trt.bench.latency`.

Invariant: a level reports its figures over all its repeats' requests, and per figure the
interval over repeats (``spread``: values, mean, min, max; :mod:`~dflash_trt.bench.spread`);
repeats more than ``spread.NOISY`` apart set ``noisy``. τ comes from the server's ``/metrics``
around the measured repeats (:mod:`~dflash_trt.bench.spec_metrics`), never from the warm-up.

A conclusion is drawn only beyond the spread (:mod:`~dflash_trt.bench.conclusions`): ``compare``
says where drafting pays, does not, or is indistinguishable; ``arms`` names a winner only where
it beats the runner-up beyond noise.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

from dflash_trt.bench import load, spread
from dflash_trt.bench.conclusions import arms, compare, noise_warnings
from dflash_trt.bench.datasets import Prompt
from dflash_trt.bench.latency import Record, summarize
from dflash_trt.bench.load import Level
from dflash_trt.bench.spec_metrics import parse_spec_metrics, tau_between
from dflash_trt.bench.stream import Endpoint
from dflash_trt.errors import DFlashError

__all__ = [
    "PROMPTS",
    "arms",
    "compare",
    "merge_levels",
    "parse_spec_metrics",
    "run",
    "tau_between",
]

PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number, with a docstring.",
    "Explain in three sentences why the sky is blue.",
    "Solve step by step: a train travels 180 km in 2.5 hours. What is its average speed?",
    "List five practical tips for writing clear technical documentation.",
    "Translate to French: 'The meeting has been moved to Thursday afternoon.'",
    "Write a SQL query that returns the ten customers with the highest total order value.",
    "Summarize the plot of Romeo and Juliet in one paragraph.",
    "What is the derivative of x^3 * sin(x)? Show your work.",
]
REPEATS = 3  # passes per level: the fewest that give a spread with a middle
SPREAD_KEYS = ("output_tokens_per_second", "tokens_per_second_per_user", "request_throughput")
SPREAD_MEDIANS = ("ttft_ms", "tpot_ms", "itl_per_token_ms")


# ---- one level ---------------------------------------------------------------------------------
def _spread(passes: list[dict]) -> dict:
    """Per figure, its interval over the repeats."""
    out = {k: spread.interval([p[k] for p in passes]) for k in SPREAD_KEYS}
    out.update({f"{k}_median": spread.interval([p[k]["median"] for p in passes]) for k in SPREAD_MEDIANS})
    if passes and "goodput" in passes[0]:
        out["goodput"] = spread.interval([p["goodput"]["goodput"] for p in passes])
    return out


async def _level(ep: Endpoint, prompts: list[Prompt], lv: Level, n: int | None, opts: dict) -> dict:
    """Warm-up, then ``repeats`` passes; the figures over all their records, the spread over passes."""
    args = (opts["max_tokens"], opts["temperature"], opts["ignore_eos"])

    async def send(p: Prompt, t0: float) -> Record:
        return await ep.request(p, *args, t0=t0)

    warm = lv.concurrency if opts["warmup"] is None else opts["warmup"]
    if warm:
        await load.closed_loop(send, prompts, lv.concurrency or 1, warm, None, 0)
    before = await ep.scrape()
    records: list[Record] = []
    passes, walls = [], []
    for k in range(opts["repeats"]):
        recs, wall = await load.one_pass(send, prompts, lv, n, k * (n or 0))
        for r in recs:
            r.repeat = k
        records += recs
        walls.append(wall)
        passes.append(summarize(recs, wall, opts["goodput"]))
    after = await ep.scrape()
    errors = [f"{r.status or '-'} {r.error}" for r in records if not r.ok]
    key = (
        {"concurrency": lv.concurrency}
        if lv.concurrency
        else {"request_rate": lv.request_rate, "burstiness": lv.burstiness}
    )
    level = {
        **key,
        "requests": len(records),
        "requests_per_repeat": n,
        "duration": lv.duration,
        "repeats": opts["repeats"],
        "warmup": warm,
        **summarize(records, sum(walls), opts["goodput"]),
        "errors": errors[:5],
        "acceptance_length": tau_between(before, after),
        "spread": _spread(passes),
    }
    level["noisy"] = spread.noisy(level["spread"]["output_tokens_per_second"])
    level["_records"] = records  # the raw records; run() decides whether the report keeps them
    return level


async def _run_endpoint(
    url: str, model: str | None, prompts: list[Prompt], levels: list[Level], opts: dict, progress, on_scrape=None
) -> dict:
    ep = Endpoint(url, model, opts["chat"], on_scrape=on_scrape)
    try:
        name = await ep.discover()
        await ep.warm_up(prompts[0].text, min(8, opts["max_tokens"]), opts["temperature"], opts["ignore_eos"])
        out: dict[str, list] = {"levels": [], "rate_levels": []}
        for lv in levels:
            n = lv.requests
            if n is None and lv.duration is None:
                n = max(len(prompts), 2 * (lv.concurrency or 1))
            rec = await _level(ep, prompts, lv, n, opts)
            out["levels" if lv.concurrency else "rate_levels"].append(rec)
            if progress:
                progress(url, lv.concurrency or lv.label)
        return {
            "url": ep.url,
            "model": name,
            "levels": out["levels"],
            **({"rate_levels": out["rate_levels"]} if out["rate_levels"] else {}),
        }
    finally:
        await ep.close()


def _levels(
    concurrency, request_rate, burstiness: float, requests: int | None, duration: float | None, seed: int
) -> list[Level]:
    cs = sorted(set(int(c) for c in concurrency))
    if (cs and cs[0] < 1) or (not cs and not request_rate):
        raise DFlashError("--concurrency needs positive integers, e.g. 1,4,16,32")
    if duration is not None and not duration > 0:
        raise DFlashError("--duration must be positive (seconds)")
    rates = sorted(set(float(r) for r in request_rate or ()))
    if rates and not (rates[0] > 0 and burstiness > 0):
        raise DFlashError("--request-rate and --burstiness must be positive")
    common = Level(requests=requests, duration=duration, seed=seed)
    return [replace(common, concurrency=c) for c in cs] + [
        replace(common, request_rate=r, burstiness=burstiness) for r in rates
    ]


def run(
    url: str,
    *,
    model: str | None = None,
    baseline: str | None = None,
    baseline_model: str | None = None,
    mtp: str | None = None,
    mtp_model: str | None = None,
    prompts: list[str] | list[Prompt] | None = None,
    concurrency=(1, 4, 16, 32),
    requests: int | None = None,
    max_tokens: int = 128,
    temperature: float = 0.0,
    chat: bool = False,
    ignore_eos: bool = False,
    repeats: int = REPEATS,
    warmup: int | None = None,
    request_rate=(),
    burstiness: float = 1.0,
    duration: float | None = None,
    goodput: dict[str, float] | None = None,
    seed: int = 0,
    records: bool = False,
    progress=None,
    on_scrape=None,
) -> dict:
    """Benchmark ``url`` (and ``baseline``, ``mtp``) at each concurrency (closed loop) and each
    request rate (open loop, :mod:`~dflash_trt.bench.load`); returns the report dict.
    ``warmup``: requests before each level (None: one per concurrent slot); ``records``: keep each
    request's record in its level. ``on_scrape(body)`` sees every /metrics body of ``url``."""
    levels = _levels(concurrency, request_rate, burstiness, requests, duration, seed)
    if max_tokens < 1:
        raise DFlashError("--max-tokens must be >= 1")
    if repeats < 1:
        raise DFlashError("--repeats must be >= 1")
    texts = [p if isinstance(p, Prompt) else Prompt(p) for p in (prompts or PROMPTS)]
    opts = {
        "max_tokens": max_tokens,
        "temperature": temperature,
        "chat": chat,
        "ignore_eos": ignore_eos,
        "repeats": repeats,
        "warmup": warmup,
        "goodput": goodput,
    }
    report: dict = {
        "max_tokens": max_tokens,
        "temperature": temperature,
        "chat": chat,
        "repeats": repeats,
        **({"goodput_limits_ms": goodput} if goodput else {}),
        "endpoint": asyncio.run(_run_endpoint(url, model, texts, levels, opts, progress, on_scrape)),
    }
    if baseline:
        report["baseline"] = asyncio.run(_run_endpoint(baseline, baseline_model, texts, levels, opts, progress))
        report["comparison"] = compare(report["endpoint"], report["baseline"])
    if mtp:  # the same target drafting with its own MTP layers (a bundle's trtllm/config.mtp.yaml)
        report["mtp"] = asyncio.run(_run_endpoint(mtp, mtp_model, texts, levels, opts, progress))
    return _conclude(report, records)


def _conclude(report: dict, keep_records: bool) -> dict:
    """The measured report with its arms (where more than one side ran) and noise warnings, each
    level's raw records kept (``keep_records``) or dropped."""
    if "mtp" in report or "baseline" in report:
        report["arms"] = arms(report)
    report["warnings"] = noise_warnings(report)
    for side in ("endpoint", "baseline", "mtp"):
        for lv in [*(report.get(side) or {}).get("levels", []), *(report.get(side) or {}).get("rate_levels", [])]:
            recs = lv.pop("_records")
            if keep_records:
                lv["records"] = [r.as_dict() for r in recs]
    return report


def merge_levels(passes: list[dict], keep_records: bool = False) -> dict:
    """One level from single-repeat measurements of it taken apart in time (each run with
    ``records=True``): the figures re-derived from all their records, the spread over the
    passes, τ the mean of the passes'."""
    records = [replace(Record.from_dict(d), repeat=k) for k, lv in enumerate(passes) for d in lv["records"]]
    taus = [lv["acceptance_length"] for lv in passes if lv.get("acceptance_length") is not None]
    first = passes[0]
    limits = (first.get("goodput") or {}).get("limits_ms")
    level = {
        **{k: first[k] for k in ("concurrency", "request_rate", "burstiness") if k in first},
        "requests": len(records),
        "requests_per_repeat": first["requests_per_repeat"],
        "duration": first.get("duration"),
        "repeats": len(passes),
        "warmup": first.get("warmup"),
        **summarize(records, sum(lv["seconds"] for lv in passes), limits),
        "errors": [e for lv in passes for e in lv.get("errors", [])][:5],
        "acceptance_length": round(sum(taus) / len(taus), 4) if taus else None,
        "spread": _spread(passes),
    }
    level["noisy"] = spread.noisy(level["spread"]["output_tokens_per_second"])
    if keep_records:
        level["records"] = [r.as_dict() for r in records]
    return level
