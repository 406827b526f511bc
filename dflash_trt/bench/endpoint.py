"""Benchmark any OpenAI-compatible endpoint at several concurrencies (and compare two).

Per concurrency level: a warm-up (``warmup`` requests, default one per concurrent slot, not
counted), then ``repeats`` passes of ``requests`` streamed completions with at most
``concurrency`` in flight. Each request is a :class:`~dflash_trt.bench.latency.Record` of
(time, tokens) chunk events; every figure (TTFT, TPOT, ITL per chunk and per token, end-to-end
latency, tokens/s per user with and without TTFT, throughput) is defined once in
:mod:`dflash_trt.bench.latency`. A level reports them over all its repeats' requests, and per
figure the interval over repeats (``spread``: values, mean, min, max; :mod:`~dflash_trt.bench.spread`);
repeats more than ``spread.NOISY`` apart set ``noisy``.

Tokens per chunk: the server's per-chunk usage where it sends it (``stream_options.
continuous_usage_stats``, vLLM; asked for in the warm-up and dropped when the server refuses
it), else logprob entries, else the final ``usage.completion_tokens`` spread over the chunks by
their text (:func:`~dflash_trt.bench.latency.chunk_tokens`).

A conclusion is drawn only beyond the spread: ``compare`` says where drafting pays, does not,
or is indistinguishable; ``arms`` names a winner only where it beats the runner-up beyond
noise. τ comes from the server's ``/metrics`` around the measured repeats
(:mod:`~dflash_trt.bench.spec_metrics`).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace

from dflash_trt.bench import load, spread
from dflash_trt.bench.datasets import Prompt
from dflash_trt.bench.latency import Record, chunk_tokens, summarize
from dflash_trt.bench.load import Level
from dflash_trt.bench.spec_metrics import parse_spec_metrics, tau_between
from dflash_trt.errors import DFlashError, require

__all__ = [
    "PROMPTS",
    "Endpoint",
    "arms",
    "compare",
    "merge_levels",
    "parse_spec_metrics",
    "run",
    "tau_between",
    "throughput_interval",
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


# ---- one endpoint -----------------------------------------------------------------------------
class Endpoint:
    def __init__(self, url: str, model: str | None = None, chat: bool = False, timeout: float = 600.0, on_scrape=None):
        """``on_scrape(body)``: every /metrics body read (None when none came), in order: one
        before and one after each level (``dflash-trt verify`` reads more of them than τ)."""
        httpx = require("httpx", "bench", "benchmarking an endpoint")
        self.on_scrape = on_scrape or (lambda body: None)
        self.url = url.rstrip("/")
        if self.url.endswith("/v1"):
            self.url = self.url[:-3]
        self.chat = chat
        self.continuous_usage = True  # dropped by warm_up when the server refuses it
        self.client = httpx.AsyncClient(
            base_url=self.url,
            timeout=timeout,
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=None),
        )
        self.model = model

    async def close(self) -> None:
        await self.client.aclose()

    async def discover(self) -> str:
        import httpx

        try:
            r = await self.client.get("/v1/models")
        except httpx.HTTPError as exc:
            raise DFlashError(f"cannot reach {self.url}: {exc}") from None
        if r.status_code != 200:
            raise DFlashError(f"{self.url}/v1/models answered {r.status_code}; is it an OpenAI-compatible server?")
        data = r.json().get("data") or []
        if self.model is None:
            if not data:
                raise DFlashError(f"{self.url} lists no models; pass --model")
            self.model = data[0]["id"]
        return self.model

    async def warm_up(self, prompt: str, max_tokens: int, temperature: float, ignore_eos: bool) -> None:
        """One short request; a server that refuses per-chunk usage (400) is asked without it."""
        first = await self.request(prompt, max_tokens, temperature, ignore_eos)
        if not first.ok and first.status == 400:
            self.continuous_usage = False
            first = await self.request(prompt, max_tokens, temperature, ignore_eos)
        if not first.ok:
            raise DFlashError(f"{self.url}: the warm-up request failed ({first.status or '-'} {first.error})")

    async def scrape(self) -> dict | None:
        try:
            r = await self.client.get("/metrics")
        except Exception:  # noqa: BLE001 - τ is optional
            self.on_scrape(None)
            return None
        self.on_scrape(r.text if r.status_code == 200 else None)
        return parse_spec_metrics(r.text) if r.status_code == 200 else None

    def body(self, prompt: str, max_tokens: int, temperature: float, ignore_eos: bool) -> tuple[str, dict]:
        opts = {"include_usage": True, **({"continuous_usage_stats": True} if self.continuous_usage else {})}
        body: dict = {
            "model": self.model,
            "max_tokens": max_tokens,
            "temperature": temperature,
            "stream": True,
            "stream_options": opts,
        }
        if ignore_eos:
            body["ignore_eos"] = True
        if self.chat:
            return "/v1/chat/completions", {**body, "messages": [{"role": "user", "content": prompt}]}
        return "/v1/completions", {**body, "prompt": prompt}

    async def request(
        self, prompt: str | Prompt, max_tokens: int, temperature: float, ignore_eos: bool, t0: float | None = None
    ) -> Record:
        """One streamed completion as a :class:`Record` (``t0``: when the load began); a
        :class:`Prompt` with its own ``max_tokens`` asks for that many."""
        p = prompt if isinstance(prompt, Prompt) else Prompt(prompt)
        path, body = self.body(p.text, p.max_tokens or max_tokens, temperature, ignore_eos)
        start = time.perf_counter()
        rec = Record(ok=False, start=start - (t0 if t0 is not None else start), category=p.category)
        ext: dict = {}
        times, texts, cum, lps = [], [], [], []
        usage: dict = {}
        try:
            async with self.client.stream("POST", path, json=body) as r:
                rec.status = r.status_code
                if r.status_code != 200:
                    rec.error = (await r.aread()).decode(errors="replace")[:200]
                    return rec
                async for line in r.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    obj = json.loads(data)
                    if "error" in obj:
                        rec.error = str(obj["error"].get("message"))
                        return rec
                    usage = obj.get("usage") or usage
                    ext = obj.get("dflash") or ext  # the embedded server's per-request τ
                    for ch in obj.get("choices") or []:
                        text = ch.get("text") if "text" in ch else (ch.get("delta") or {}).get("content")
                        if text:
                            times.append(time.perf_counter() - start)
                            texts.append(text)
                            cum.append((obj.get("usage") or {}).get("completion_tokens"))
                            lps.append(_logprob_count(ch.get("logprobs")))
        except Exception as exc:  # noqa: BLE001 - a failed request is a result, not a crash
            rec.error = f"{type(exc).__name__}: {exc}"
            return rec
        rec.e2el = time.perf_counter() - start
        counts, rec.tokens_from = chunk_tokens(texts, cum, lps, usage.get("completion_tokens"))
        rec.chunks = list(zip(times, counts or [0] * len(times), strict=True))
        rec.prompt_tokens = usage.get("prompt_tokens")
        rec.acceptance_length, rec.rounds = ext.get("acceptance_length"), ext.get("rounds")
        rec.ok = True
        return rec


def _logprob_count(lp) -> int | None:
    """Tokens a chunk's ``logprobs`` covers (completions: ``tokens``; chat: ``content``)."""
    if not isinstance(lp, dict):
        return None
    entries = lp.get("tokens") if "tokens" in lp else lp.get("content")
    return len(entries) if isinstance(entries, list) else None


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
    common = {"requests": requests, "duration": duration, "seed": seed}
    return [Level(concurrency=c, **common) for c in cs] + [
        Level(request_rate=r, burstiness=burstiness, **common) for r in rates
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
    if mtp or baseline:
        report["arms"] = arms(report)
    report["warnings"] = noise_warnings(report)
    for side in ("endpoint", "baseline", "mtp"):
        for lv in [*(report.get(side) or {}).get("levels", []), *(report.get(side) or {}).get("rate_levels", [])]:
            recs = lv.pop("_records")
            if records:
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


def noise_warnings(report: dict) -> list[str]:
    """One line per side whose repeats disagreed beyond ``spread.NOISY`` at some level."""
    out = []
    for side in ("endpoint", "baseline", "mtp"):
        noisy = [lv["concurrency"] for lv in (report.get(side) or {}).get("levels", []) if lv.get("noisy")]
        if noisy:
            out.append(
                f"{side}: repeats at concurrency {', '.join(map(str, noisy))} differ by more than "
                f"{spread.NOISY:.0%} in output tokens/s; the machine was noisy (more --repeats, or a "
                "quieter machine)"
            )
    return out


ARMS = (("dflash", "endpoint"), ("mtp", "mtp"), ("autoregressive", "baseline"))


def throughput_interval(lv: dict) -> dict | None:
    """A level's output tokens/s: its interval over repeats with ``mean`` set to the level's own
    figure (all its tokens over all its repeats' time; a level without repeats: that one figure)."""
    if not lv.get("output_tokens_per_second"):
        return None
    iv = (lv.get("spread") or {}).get("output_tokens_per_second") or spread.interval([lv["output_tokens_per_second"]])
    return {**iv, "mean": lv["output_tokens_per_second"]}


def arms(report: dict) -> list[dict]:
    """Per concurrency: each measured arm's output tokens/s (DFlash: ``endpoint``, MTP: ``mtp``,
    autoregressive: ``baseline``; over all repeats), the winner (the most tokens/s, named only
    where it beats the runner-up beyond their spread, else "indistinguishable") and its margin over
    the runner-up (winner mean / runner-up mean - 1)."""
    rates: dict[int, dict[str, dict]] = {}
    for arm, key in ARMS:
        for lv in (report.get(key) or {}).get("levels", []):
            if (iv := throughput_interval(lv)) is not None:
                rates.setdefault(int(lv["concurrency"]), {})[arm] = iv
    rows = []
    for c in sorted(rates):
        r = rates[c]
        order = sorted(r, key=lambda a: r[a]["mean"], reverse=True)
        second = r[order[1]] if len(order) > 1 else None
        margin = r[order[0]]["mean"] / second["mean"] - 1 if second and second["mean"] else None
        winner = order[0] if second is None or spread.beyond(r[order[0]], second) else "indistinguishable"
        rows.append(
            {
                "concurrency": c,
                **{a: round(r[a]["mean"], 2) if a in r else None for a, _ in ARMS},
                "winner": winner,
                "leader": order[0],
                "margin": None if margin is None else round(margin, 4),
            }
        )
    return rows


def compare(ep: dict, base: dict) -> dict:
    """Speedup per concurrency (endpoint output tokens/s over the baseline's, with its interval
    over repeats) and a verdict each: "pays", "does not pay" or "indistinguishable"; the first
    concurrency where drafting does not pay beyond noise (``stops_paying_at``). Per request rate
    the same (``by_rate``: at a rate both sides serve alike, the speedup is read in the latency,
    ``tpot_ratio``), and per prompt category the ratio of decode tokens/s per user."""
    rows = _compare_rows(ep["levels"], base["levels"], "concurrency")
    stops = next((r["concurrency"] for r in rows if r["verdict"] == "does not pay"), None)
    out = {"speedup": rows, "stops_paying_at": stops}
    if ep.get("rate_levels") and base.get("rate_levels"):
        out["by_rate"] = _compare_rows(ep["rate_levels"], base["rate_levels"], "request_rate")
    return out


def _compare_rows(mine: list[dict], theirs: list[dict], key: str) -> list[dict]:
    b = {lv[key]: lv for lv in theirs}
    rows = []
    for lv in mine:
        other = b.get(lv[key])
        a_iv, b_iv = throughput_interval(lv), throughput_interval(other) if other else None
        if other is None or a_iv is None or b_iv is None or not b_iv["mean"]:
            continue
        v = spread.verdict(a_iv, b_iv)
        row = {
            key: lv[key],
            "speedup": round(a_iv["mean"] / b_iv["mean"], 4),
            "interval": spread.ratio(a_iv, b_iv),
            "verdict": {"higher": "pays", "lower": "does not pay"}.get(v, "indistinguishable"),
        }
        mt, bt = (lv.get("tpot_ms") or {}).get("median"), (other.get("tpot_ms") or {}).get("median")
        row["tpot_ratio"] = round(mt / bt, 4) if mt and bt else None  # DFlash TPOT / baseline TPOT
        cats, other_cats = lv.get("categories") or {}, other.get("categories") or {}
        per = {
            c: _ratio(x.get("tokens_per_second_per_user"), other_cats[c].get("tokens_per_second_per_user"))
            for c, x in cats.items()
            if c in other_cats
        }
        if per:
            row["category_speedup"] = per
        rows.append(row)
    return rows


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 4) if a and b else None
