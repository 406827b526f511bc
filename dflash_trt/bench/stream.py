"""One OpenAI-compatible endpoint as the load generator sees it: each streamed completion is one
:class:`~dflash_trt.bench.latency.Record`.

Invariant: a request never raises; a refusal, an error event or a broken stream is a Record with
``ok=False`` and its status and error, so a load counts it instead of stopping. A Record with
``ok=True`` holds one (time since its start, tokens) event per chunk that carried text. Tokens
per chunk: the server's per-chunk usage where it sends it (``stream_options.
continuous_usage_stats``, vLLM; asked for in the warm-up and dropped when the server refuses
it), else logprob entries, else the final ``usage.completion_tokens`` spread over the chunks by
their text (:func:`~dflash_trt.bench.latency.chunk_tokens`). τ is read from ``/metrics``
(:mod:`~dflash_trt.bench.spec_metrics`), and a per-request τ where the embedded server sends one.
"""

from __future__ import annotations

import json
import time

from dflash_trt.bench.datasets import Prompt
from dflash_trt.bench.latency import Record, chunk_tokens
from dflash_trt.bench.spec_metrics import parse_spec_metrics
from dflash_trt.errors import DFlashError, require


class Endpoint:
    """A client of one server's ``/v1/models``, completions (or chat completions) and ``/metrics``."""

    def __init__(self, url: str, model: str | None = None, chat: bool = False, timeout: float = 600.0, on_scrape=None):
        """``on_scrape(body)``: every /metrics body read (None when none came), in order: one
        before and one after each level (``dflash-trt verify`` reads more of them than τ)."""
        httpx = require("httpx", "bench", "benchmarking an endpoint")
        self.http_error = httpx.HTTPError  # httpx is the bench extra: required here, not at import
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
        try:
            r = await self.client.get("/v1/models")
        except self.http_error as exc:
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
