"""Benchmark any OpenAI-compatible endpoint at several concurrencies (and compare two).

Per concurrency level, ``requests`` streamed completions are sent with at most
``concurrency`` in flight. Measured on the client, per request: time to first token (first
chunk with text), inter-token latency (gaps between text chunks; a speculative server sends
several tokens per chunk, so this is the latency a reader sees), end-to-end latency and
output tokens (the server's ``usage`` when it sends it, else one per chunk). Reported per
level: output tokens/s (all tokens / wall time), tokens/s per user (median over requests of
decode tokens / decode time), TTFT and ITL median and p99, and τ when the server reports it.

τ is read from the server's ``/metrics`` before and after each level:

- dflash-trt's embedded server: ``dflash_spec_committed_tokens_total / dflash_spec_rounds_total``;
- vLLM: ``1 + vllm:spec_decode_num_accepted_tokens_total / vllm:spec_decode_num_drafts_total``;
- SGLang: the ``sglang:spec_accept_length`` gauge (read after the level);
- TensorRT-LLM (``trtllm-serve``, PyTorch backend with ``enable_iter_perf_stats``): a JSON
  list of iteration rows whose ``specDecodingStats`` carry ``numAcceptedTokens`` and
  ``numRequestsWithDraftTokens``; τ = (accepted + requests) / requests. trtllm-serve hands
  each row out once, so the scrape after a level covers exactly that level.
"""

from __future__ import annotations

import asyncio
import json
import math
import statistics
import time
from dataclasses import dataclass, field

from dflash_trt.errors import DFlashError, require

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


@dataclass
class Result:
    ok: bool
    status: int = 0
    error: str | None = None
    ttft: float | None = None
    itl: list[float] = field(default_factory=list)
    latency: float = 0.0
    output_tokens: int = 0


def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    k = (len(s) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def _ms(x: float | None) -> float | None:
    return round(1e3 * x, 3) if x is not None else None


# ---- τ from /metrics ---------------------------------------------------------------------------
def parse_spec_metrics(body: str) -> dict | None:
    """Speculative-decoding counters from a /metrics body, or None when it reports none.

    Returns ``{"kind": ..., "num": float, "den": float}`` (τ = Δnum / Δden between two
    scrapes) or ``{"kind": "gauge", "tau": float}`` for servers that only report a gauge.
    """
    text = body.strip()
    if text.startswith("[") or text.startswith("{"):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError:
            return None
        rows = rows if isinstance(rows, list) else [rows]
        acc = req = 0
        found = False
        for row in rows:
            spec = row.get("specDecodingStats") if isinstance(row, dict) else None
            if not isinstance(spec, dict) or row.get("attentionDpRank", 0) != 0:
                continue
            found = True
            acc += int(spec.get("numAcceptedTokens", 0))
            req += int(spec.get("numRequestsWithDraftTokens", 0))
        return {"kind": "trtllm", "num": acc + req, "den": req, "windowed": True} if found else None
    values: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        parts = line.rsplit(None, 1)
        if len(parts) != 2:
            continue
        key = parts[0].split("{", 1)[0]
        try:
            values[key] = values.get(key, 0.0) + float(parts[1])
        except ValueError:
            continue
    if "dflash_spec_rounds_total" in values:
        return {"kind": "dflash", "num": values.get("dflash_spec_committed_tokens_total", 0.0),
                "den": values["dflash_spec_rounds_total"]}
    if "vllm:spec_decode_num_drafts_total" in values:
        d = values["vllm:spec_decode_num_drafts_total"]
        return {"kind": "vllm", "num": d + values.get("vllm:spec_decode_num_accepted_tokens_total", 0.0), "den": d}
    if "sglang:spec_accept_length" in values:
        return {"kind": "gauge", "tau": values["sglang:spec_accept_length"]}
    return None


def tau_between(before: dict | None, after: dict | None) -> float | None:
    """τ over the window between two scrapes (see :func:`parse_spec_metrics`)."""
    if after is None:
        return None
    if after["kind"] == "gauge":
        return after["tau"] or None
    if after.get("windowed"):  # trtllm-serve: the rows since the previous scrape
        num, den = after["num"], after["den"]
    elif before is not None and before["kind"] == after["kind"]:
        num, den = after["num"] - before["num"], after["den"] - before["den"]
    else:
        return None
    return round(num / den, 4) if den > 0 else None


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

    async def scrape(self) -> dict | None:
        try:
            r = await self.client.get("/metrics")
        except Exception:  # noqa: BLE001 - τ is optional
            self.on_scrape(None)
            return None
        self.on_scrape(r.text if r.status_code == 200 else None)
        return parse_spec_metrics(r.text) if r.status_code == 200 else None

    async def request(self, prompt: str, max_tokens: int, temperature: float, ignore_eos: bool) -> Result:
        body: dict = {"model": self.model, "max_tokens": max_tokens, "temperature": temperature, "stream": True,
                      "stream_options": {"include_usage": True}}
        if ignore_eos:
            body["ignore_eos"] = True
        if self.chat:
            path, body["messages"] = "/v1/chat/completions", [{"role": "user", "content": prompt}]
        else:
            path, body["prompt"] = "/v1/completions", prompt
        start = time.perf_counter()
        res = Result(ok=False)
        last = None
        chunks = 0
        try:
            async with self.client.stream("POST", path, json=body) as r:
                res.status = r.status_code
                if r.status_code != 200:
                    res.error = (await r.aread()).decode(errors="replace")[:200]
                    return res
                async for line in r.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    obj = json.loads(data)
                    if "error" in obj:
                        res.error = str(obj["error"].get("message"))
                        return res
                    if obj.get("usage"):
                        res.output_tokens = int(obj["usage"].get("completion_tokens") or 0)
                    for ch in obj.get("choices") or []:
                        text = ch.get("text") if "text" in ch else (ch.get("delta") or {}).get("content")
                        if text:
                            now = time.perf_counter()
                            if last is None:
                                res.ttft = now - start
                            else:
                                res.itl.append(now - last)
                            last = now
                            chunks += 1
        except Exception as exc:  # noqa: BLE001 - a failed request is a result, not a crash
            res.error = f"{type(exc).__name__}: {exc}"
            return res
        res.latency = time.perf_counter() - start
        res.output_tokens = res.output_tokens or chunks
        res.ok = True
        return res


async def _level(ep: Endpoint, prompts: list[str], concurrency: int, n_requests: int, max_tokens: int,
                 temperature: float, ignore_eos: bool) -> dict:
    before = await ep.scrape()
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int) -> Result:
        async with sem:
            return await ep.request(prompts[i % len(prompts)], max_tokens, temperature, ignore_eos)

    start = time.perf_counter()
    results = await asyncio.gather(*(one(i) for i in range(n_requests)))
    wall = time.perf_counter() - start
    after = await ep.scrape()
    ok = [r for r in results if r.ok]
    tokens = sum(r.output_tokens for r in ok)
    ttft = [r.ttft for r in ok if r.ttft is not None]
    itl = [x for r in ok for x in r.itl]
    per_user = [(r.output_tokens - 1) / (r.latency - r.ttft) for r in ok
                if r.ttft is not None and r.output_tokens > 1 and r.latency > r.ttft]
    errors = [f"{r.status or '-'} {r.error}" for r in results if not r.ok]
    return {
        "concurrency": concurrency,
        "requests": n_requests,
        "ok": len(ok),
        "failed": len(results) - len(ok),
        "errors": errors[:5],
        "seconds": round(wall, 4),
        "output_tokens": tokens,
        "output_tokens_per_second": round(tokens / wall, 3) if wall > 0 else 0.0,
        "tokens_per_second_per_user": round(statistics.median(per_user), 3) if per_user else None,
        "ttft_ms": {"median": _ms(_pct(ttft, 0.5)), "p99": _ms(_pct(ttft, 0.99))},
        "itl_ms": {"median": _ms(_pct(itl, 0.5)), "p99": _ms(_pct(itl, 0.99))},
        "acceptance_length": tau_between(before, after),
    }


async def _run_endpoint(url: str, model: str | None, prompts: list[str], levels: list[int], requests: int | None,
                        max_tokens: int, temperature: float, chat: bool, ignore_eos: bool, progress,
                        on_scrape=None) -> dict:
    ep = Endpoint(url, model, chat, on_scrape=on_scrape)
    try:
        name = await ep.discover()
        warm = await ep.request(prompts[0], min(8, max_tokens), temperature, ignore_eos)
        if not warm.ok:
            raise DFlashError(f"{ep.url}: the warm-up request failed ({warm.status or '-'} {warm.error})")
        out = []
        for c in levels:
            n = requests or max(len(prompts), 2 * c)
            out.append(await _level(ep, prompts, c, n, max_tokens, temperature, ignore_eos))
            if progress:
                progress(url, c)
        return {"url": ep.url, "model": name, "levels": out}
    finally:
        await ep.close()


def run(url: str, *, model: str | None = None, baseline: str | None = None, baseline_model: str | None = None,
        mtp: str | None = None, mtp_model: str | None = None,
        prompts: list[str] | None = None, concurrency: list[int] = (1, 4, 16, 32), requests: int | None = None,
        max_tokens: int = 128, temperature: float = 0.0, chat: bool = False, ignore_eos: bool = False,
        progress=None, on_scrape=None) -> dict:
    """Benchmark ``url`` (and ``baseline``) at each concurrency; returns the report dict.
    ``on_scrape(body)`` sees every /metrics body of ``url`` (see :class:`Endpoint`)."""
    levels = sorted(set(int(c) for c in concurrency))
    if not levels or levels[0] < 1:
        raise DFlashError("--concurrency needs positive integers, e.g. 1,4,16,32")
    if max_tokens < 1:
        raise DFlashError("--max-tokens must be >= 1")
    prompts = list(prompts or PROMPTS)
    args = (prompts, levels, requests, max_tokens, temperature, chat, ignore_eos, progress)
    report = {"max_tokens": max_tokens, "temperature": temperature, "chat": chat,
              "endpoint": asyncio.run(_run_endpoint(url, model, *args, on_scrape=on_scrape))}
    if baseline:
        report["baseline"] = asyncio.run(_run_endpoint(baseline, baseline_model, *args))
        report["comparison"] = compare(report["endpoint"], report["baseline"])
    if mtp:  # the same target drafting with its own MTP layers (a bundle's trtllm/config.mtp.yaml)
        report["mtp"] = asyncio.run(_run_endpoint(mtp, mtp_model, *args))
    if mtp or baseline:
        report["arms"] = arms(report)
    return report


ARMS = (("dflash", "endpoint"), ("mtp", "mtp"), ("autoregressive", "baseline"))


def arms(report: dict) -> list[dict]:
    """Per concurrency: each measured arm's output tokens/s (DFlash: ``endpoint``, MTP: ``mtp``,
    autoregressive: ``baseline``), the winner (the most tokens/s; only arms measured there
    compete) and its margin over the runner-up (winner / runner-up - 1)."""
    rates: dict[int, dict[str, float]] = {}
    for arm, key in ARMS:
        for lv in (report.get(key) or {}).get("levels", []):
            if lv.get("output_tokens_per_second"):
                rates.setdefault(int(lv["concurrency"]), {})[arm] = float(lv["output_tokens_per_second"])
    rows = []
    for c in sorted(rates):
        r = rates[c]
        order = sorted(r, key=lambda a: r[a], reverse=True)
        margin = r[order[0]] / r[order[1]] - 1 if len(order) > 1 and r[order[1]] else None
        rows.append({"concurrency": c, **{a: round(r[a], 2) if a in r else None for a, _ in ARMS},
                     "winner": order[0], "margin": None if margin is None else round(margin, 4)})
    return rows


def compare(ep: dict, base: dict) -> dict:
    """Speedup per concurrency, and the first concurrency where drafting stops paying."""
    b = {lv["concurrency"]: lv for lv in base["levels"]}
    rows, stops = [], None
    for lv in ep["levels"]:
        other = b.get(lv["concurrency"])
        if other is None or not other["output_tokens_per_second"]:
            continue
        s = lv["output_tokens_per_second"] / other["output_tokens_per_second"]
        rows.append({"concurrency": lv["concurrency"], "speedup": round(s, 4)})
        if s < 1.0 and stops is None:
            stops = lv["concurrency"]
    return {"speedup": rows, "stops_paying_at": stops}


# ---- the figure -------------------------------------------------------------------------------
def throughput_unit(device: str | None) -> str:
    """What the throughput axis is divided by: a GPU only where the bundle's plan says the server
    runs on GPUs; a CPU run is one process; without a bundle the device is unknown (per server)."""
    if device is None:
        return "server"
    return "process (CPU)" if device.lower() == "cpu" else "GPU"


def plot(report: dict, path, predicted: list[dict] | None = None, gpus: int = 1, device: str | None = None,
         name: str | None = None) -> None:
    """The charts deployments are compared by, in one PNG:

    * throughput per GPU (output tokens/s / ``gpus``) against tokens/s per user, one point per
      concurrency, for the endpoint (DFlash) and the baseline on one chart: the curve NVIDIA
      quotes DFlash results on; with ``predicted`` (a plan's ``predicted`` rows) the planner's
      curves dashed beside them;
    * time to first token and inter-token latency (median, p99 dotted) against concurrency;
    * with a baseline, the speedup against concurrency (without one, three panels, none blank).

    Titled with ``name`` (the bundle, else the served model), max tokens and temperature; the
    throughput unit follows ``device`` (:func:`throughput_unit`).
    """
    mpl = require("matplotlib", "bench", "--plot")
    mpl.use("Agg")
    import matplotlib.pyplot as plt

    has_base = "baseline" in report
    fig, grid = plt.subplots(2, 2, figsize=(11, 8.4)) if has_base else plt.subplots(1, 3, figsize=(15, 4.6))
    axes = grid if has_base else [[grid[0], grid[1]], [grid[2], None]]
    run = [f"max {report['max_tokens']} tokens" if "max_tokens" in report else "",
           f"temperature {report['temperature']}" if "temperature" in report else ""]
    fig.suptitle(", ".join([name or report["endpoint"]["model"], *filter(None, run)]))
    styles = (("endpoint", "DFlash" if has_base else "endpoint", "o-", "tab:blue"),
              ("baseline", "baseline", "s-", "tab:gray"))
    _frontier(axes[0][0], report, styles, predicted, max(1, gpus), throughput_unit(device))
    for ax, key, title in ((axes[0][1], "ttft_ms", "time to first token"),
                           (axes[1][0], "itl_ms", "inter-token latency")):
        for name, label, style, color in styles:
            if name in report:
                lv = report[name]["levels"]
                c = [x["concurrency"] for x in lv]
                ax.plot(c, [_nan(x[key]["median"]) for x in lv], style, color=color, label=f"{label} median")
                ax.plot(c, [_nan(x[key]["p99"]) for x in lv], ":", color=color, label=f"{label} p99")
        _axes(ax, "concurrency", "ms", title)
    ax = axes[1][1]
    if has_base:
        rows = report["comparison"]["speedup"]
        ax.plot([r["concurrency"] for r in rows], [r["speedup"] for r in rows], "o-", color="tab:green",
                label="measured")
        if predicted:
            ax.plot([r["batch"] for r in predicted], [r["speedup"] for r in predicted], "--", color="tab:green",
                    label="planner")
        ax.axhline(1.0, color="gray", linestyle=":")
        _axes(ax, "concurrency", "speedup over baseline", "speedup")
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=110)
    plt.close(fig)


def _frontier(ax, report: dict, styles, predicted: list[dict] | None, gpus: int, unit: str = "GPU") -> None:
    """Throughput per ``unit`` against tokens/s per user, each point labelled with its concurrency."""
    for name, label, style, color in styles:
        if name not in report:
            continue
        lv = [x for x in report[name]["levels"] if x.get("tokens_per_second_per_user")]
        xs, ys = [x["tokens_per_second_per_user"] for x in lv], [x["output_tokens_per_second"] / gpus for x in lv]
        ax.plot(xs, ys, style, color=color, label=f"{label} ({report[name]['model']})")
        for x, y, v in zip(xs, ys, lv, strict=True):
            ax.annotate(str(v["concurrency"]), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    if predicted:
        ax.plot([r["tokens_per_second_per_user"] for r in predicted],
                [r["output_tokens_per_second_per_gpu"] for r in predicted], "--", color="tab:blue",
                label="planner: DFlash")
        ax.plot([r["baseline_tokens_per_second_per_user"] for r in predicted],
                [r["baseline_output_tokens_per_second_per_gpu"] for r in predicted], "--", color="tab:gray",
                label="planner: baseline")
    _axes(ax, "tokens/s per user", f"output tokens/s per {unit}", f"throughput per {unit} vs tokens/s per user",
          log=False)


def _nan(x: float | None) -> float:
    return math.nan if x is None else x


def _axes(ax, xlabel: str, ylabel: str, title: str, log: bool = True) -> None:
    if log:
        ax.set_xscale("log", base=2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
