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

from dflash_trt.bench import spread
from dflash_trt.bench.latency import Record, chunk_tokens, summarize
from dflash_trt.bench.spec_metrics import parse_spec_metrics, tau_between
from dflash_trt.errors import DFlashError, require

__all__ = ["PROMPTS", "Endpoint", "arms", "compare", "parse_spec_metrics", "run", "tau_between", "throughput_interval"]

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
REPEATS = 3   # passes per level: the fewest that give a spread with a middle
SPREAD_KEYS = ("output_tokens_per_second", "tokens_per_second_per_user", "request_throughput")
SPREAD_MEDIANS = ("ttft_ms", "tpot_ms", "itl_per_token_ms")


# ---- one endpoint -----------------------------------------------------------------------------
class Endpoint:
    def __init__(self, url: str, model: str | None = None, chat: bool = False, timeout: float = 600.0,
                 on_scrape=None):
        """``on_scrape(body)``: every /metrics body read (None when none came), in order: one
        before and one after each level (``dflash-trt verify`` reads more of them than τ)."""
        httpx = require("httpx", "bench", "benchmarking an endpoint")
        self.on_scrape = on_scrape or (lambda body: None)
        self.url = url.rstrip("/")
        if self.url.endswith("/v1"):
            self.url = self.url[:-3]
        self.chat = chat
        self.continuous_usage = True   # dropped by warm_up when the server refuses it
        self.client = httpx.AsyncClient(base_url=self.url, timeout=timeout,
                                        limits=httpx.Limits(max_connections=None, max_keepalive_connections=None))
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
        body: dict = {"model": self.model, "max_tokens": max_tokens, "temperature": temperature, "stream": True,
                      "stream_options": opts}
        if ignore_eos:
            body["ignore_eos"] = True
        if self.chat:
            return "/v1/chat/completions", {**body, "messages": [{"role": "user", "content": prompt}]}
        return "/v1/completions", {**body, "prompt": prompt}

    async def request(self, prompt: str, max_tokens: int, temperature: float, ignore_eos: bool,
                      t0: float | None = None) -> Record:
        """One streamed completion as a :class:`Record` (``t0``: when the load began)."""
        path, body = self.body(prompt, max_tokens, temperature, ignore_eos)
        start = time.perf_counter()
        rec = Record(ok=False, start=start - (t0 if t0 is not None else start))
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
        rec.ok = True
        return rec


def _logprob_count(lp) -> int | None:
    """Tokens a chunk's ``logprobs`` covers (completions: ``tokens``; chat: ``content``)."""
    if not isinstance(lp, dict):
        return None
    entries = lp.get("tokens") if "tokens" in lp else lp.get("content")
    return len(entries) if isinstance(entries, list) else None


# ---- one level ---------------------------------------------------------------------------------
async def _pass(ep: Endpoint, prompts: list[str], concurrency: int, n: int, offset: int, args: tuple
                ) -> tuple[list[Record], float]:
    sem = asyncio.Semaphore(concurrency)
    t0 = time.perf_counter()

    async def one(i: int) -> Record:
        async with sem:
            return await ep.request(prompts[(offset + i) % len(prompts)], *args, t0=t0)

    records = await asyncio.gather(*(one(i) for i in range(n)))
    return list(records), time.perf_counter() - t0


def _spread(passes: list[dict]) -> dict:
    """Per figure, its interval over the repeats."""
    out = {k: spread.interval([p[k] for p in passes]) for k in SPREAD_KEYS}
    out.update({f"{k}_median": spread.interval([p[k]["median"] for p in passes]) for k in SPREAD_MEDIANS})
    return out


async def _level(ep: Endpoint, prompts: list[str], concurrency: int, n: int, args: tuple, repeats: int,
                 warmup: int) -> dict:
    if warmup:
        await _pass(ep, prompts, concurrency, warmup, 0, args)
    before = await ep.scrape()
    records: list[Record] = []
    passes, walls = [], []
    for k in range(repeats):
        recs, wall = await _pass(ep, prompts, concurrency, n, k * n, args)
        records += recs
        walls.append(wall)
        passes.append(summarize(recs, wall))
    after = await ep.scrape()
    wall = sum(walls)
    errors = [f"{r.status or '-'} {r.error}" for r in records if not r.ok]
    level = {"concurrency": concurrency, "requests": len(records), "requests_per_repeat": n, "repeats": repeats,
             "warmup": warmup, **summarize(records, wall), "errors": errors[:5],
             "acceptance_length": tau_between(before, after), "spread": _spread(passes)}
    level["noisy"] = spread.noisy(level["spread"]["output_tokens_per_second"])
    level["_records"] = records      # the raw records; run() decides whether the report keeps them
    return level


async def _run_endpoint(url: str, model: str | None, prompts: list[str], levels: list[int], requests: int | None,
                        max_tokens: int, temperature: float, chat: bool, ignore_eos: bool, repeats: int,
                        warmup: int | None, progress, on_scrape=None) -> dict:
    ep = Endpoint(url, model, chat, on_scrape=on_scrape)
    try:
        name = await ep.discover()
        await ep.warm_up(prompts[0], min(8, max_tokens), temperature, ignore_eos)
        out = []
        for c in levels:
            n = requests or max(len(prompts), 2 * c)
            out.append(await _level(ep, prompts, c, n, (max_tokens, temperature, ignore_eos), repeats,
                                    c if warmup is None else warmup))
            if progress:
                progress(url, c)
        return {"url": ep.url, "model": name, "levels": out}
    finally:
        await ep.close()


def run(url: str, *, model: str | None = None, baseline: str | None = None, baseline_model: str | None = None,
        mtp: str | None = None, mtp_model: str | None = None,
        prompts: list[str] | None = None, concurrency: list[int] = (1, 4, 16, 32), requests: int | None = None,
        max_tokens: int = 128, temperature: float = 0.0, chat: bool = False, ignore_eos: bool = False,
        repeats: int = REPEATS, warmup: int | None = None, records: bool = False,
        progress=None, on_scrape=None) -> dict:
    """Benchmark ``url`` (and ``baseline``, ``mtp``) at each concurrency; returns the report dict.
    ``warmup``: requests before each level (None: one per concurrent slot); ``records``: keep each
    request's record in its level. ``on_scrape(body)`` sees every /metrics body of ``url``."""
    levels = sorted(set(int(c) for c in concurrency))
    if not levels or levels[0] < 1:
        raise DFlashError("--concurrency needs positive integers, e.g. 1,4,16,32")
    if max_tokens < 1:
        raise DFlashError("--max-tokens must be >= 1")
    if repeats < 1:
        raise DFlashError("--repeats must be >= 1")
    prompts = list(prompts or PROMPTS)
    args = (prompts, levels, requests, max_tokens, temperature, chat, ignore_eos, repeats, warmup, progress)
    report: dict = {"max_tokens": max_tokens, "temperature": temperature, "chat": chat, "repeats": repeats,
                    "endpoint": asyncio.run(_run_endpoint(url, model, *args, on_scrape=on_scrape))}
    if baseline:
        report["baseline"] = asyncio.run(_run_endpoint(baseline, baseline_model, *args))
        report["comparison"] = compare(report["endpoint"], report["baseline"])
    if mtp:  # the same target drafting with its own MTP layers (a bundle's trtllm/config.mtp.yaml)
        report["mtp"] = asyncio.run(_run_endpoint(mtp, mtp_model, *args))
    if mtp or baseline:
        report["arms"] = arms(report)
    report["warnings"] = noise_warnings(report)
    for side in ("endpoint", "baseline", "mtp"):
        for lv in (report.get(side) or {}).get("levels", []):
            recs = lv.pop("_records")
            if records:
                lv["records"] = [r.as_dict() for r in recs]
    return report


def noise_warnings(report: dict) -> list[str]:
    """One line per side whose repeats disagreed beyond ``spread.NOISY`` at some level."""
    out = []
    for side in ("endpoint", "baseline", "mtp"):
        noisy = [lv["concurrency"] for lv in (report.get(side) or {}).get("levels", []) if lv.get("noisy")]
        if noisy:
            out.append(f"{side}: repeats at concurrency {', '.join(map(str, noisy))} differ by more than "
                       f"{spread.NOISY:.0%} in output tokens/s; the machine was noisy (more --repeats, or a "
                       "quieter machine)")
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
        rows.append({"concurrency": c, **{a: round(r[a]["mean"], 2) if a in r else None for a, _ in ARMS},
                     "winner": winner, "leader": order[0], "margin": None if margin is None else round(margin, 4)})
    return rows


def compare(ep: dict, base: dict) -> dict:
    """Speedup per concurrency (endpoint output tokens/s over the baseline's, with its interval
    over repeats) and a verdict each: "pays", "does not pay" or "indistinguishable"; the first
    concurrency where drafting does not pay beyond noise (``stops_paying_at``)."""
    b = {lv["concurrency"]: lv for lv in base["levels"]}
    rows, stops = [], None
    for lv in ep["levels"]:
        other = b.get(lv["concurrency"])
        a_iv, b_iv = throughput_interval(lv), throughput_interval(other) if other else None
        if a_iv is None or b_iv is None or not b_iv["mean"]:
            continue
        v = spread.verdict(a_iv, b_iv)
        verdict = {"higher": "pays", "lower": "does not pay"}.get(v, "indistinguishable")
        rows.append({"concurrency": lv["concurrency"], "speedup": round(a_iv["mean"] / b_iv["mean"], 4),
                     "interval": spread.ratio(a_iv, b_iv), "verdict": verdict})
        if verdict == "does not pay" and stops is None:
            stops = lv["concurrency"]
    return {"speedup": rows, "stops_paying_at": stops}
