"""An OpenAI-compatible completions client that speaks token ids (for regeneration).

It sends ``POST /v1/completions`` with ``prompt`` as a list of token ids (the OpenAI API
allows it; trtllm-serve, vLLM, SGLang and the embedded server accept it), so the server does
not re-tokenize what the caller already tokenized, and asks for the response's ids with
``return_token_ids`` (vLLM's extension, also honoured by the embedded server). A server that
ignores the field answers with text only: :attr:`Completion.token_ids` is then None and the
caller decides how to tokenize the text.

:func:`complete_all` runs many prompts with at most ``concurrency`` in flight and hands each
completion to a callback as it arrives, so a caller that records them loses at most the
requests in flight when it crashes. Connection errors, 429 and 5xx answers are retried with
backoff; anything else is a :class:`DFlashError` naming the server and its message.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from dflash_trt.errors import DFlashError, require

RETRY_STATUS = {429, 500, 502, 503, 504}


@dataclass
class Completion:
    """One finished completion: the server's response ids (None when it sent only text), and its
    OpenAI ``logprobs`` object when asked for and sent (``tokens``, ``token_logprobs``,
    ``top_logprobs``)."""

    token_ids: list[int] | None
    text: str
    finish_reason: str | None
    logprobs: dict | None = None


class CompletionClient:
    """``/v1/completions`` at ``url`` (with or without a trailing ``/v1``), one model."""

    def __init__(self, url: str, model: str | None = None, timeout: float = 600.0, retries: int = 4):
        httpx = require("httpx", "serve", "regenerating through an endpoint")
        self.url = url.rstrip("/").removesuffix("/v1")
        self.model, self.retries = model, retries
        self.http = httpx.AsyncClient(
            base_url=self.url,
            timeout=timeout,
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=None),
        )

    async def close(self) -> None:
        await self.http.aclose()

    async def discover(self) -> str:
        """The model to ask for: the one given, else the first that ``/v1/models`` lists."""
        r = await self._send("GET", "/v1/models", None)
        names = [m.get("id") for m in (r.json().get("data") or []) if isinstance(m, dict)]
        if self.model is None:
            if not names:
                raise DFlashError(f"{self.url} lists no models; name one (--regen-model)")
            self.model = str(names[0])
        elif names and self.model not in names:
            raise DFlashError(f"{self.url} serves {', '.join(map(str, names))}, not {self.model}")
        return self.model

    async def complete(self, prompt_ids: list[int], max_tokens: int, temperature: float = 0.0, **extra) -> Completion:
        """One non-streamed completion of ``prompt_ids`` (``extra``: more body fields)."""
        body = {
            "model": self.model,
            "prompt": list(prompt_ids),
            "max_tokens": max_tokens,
            "temperature": temperature,
            "return_token_ids": True,
            **extra,
        }
        choice = ((await self._send("POST", "/v1/completions", body)).json().get("choices") or [{}])[0]
        ids = choice.get("token_ids")
        ids = [int(t) for t in ids] if isinstance(ids, list) else None
        lp = choice.get("logprobs")
        return Completion(
            ids, str(choice.get("text") or ""), choice.get("finish_reason"), lp if isinstance(lp, dict) else None
        )

    async def _send(self, method: str, path: str, body: dict | None):
        """The response to one request, retrying what a busy or restarting server answers."""
        import httpx  # optional: httpx (the serve extra, required when this client was made)

        for attempt in range(self.retries + 1):
            try:
                r = await self.http.request(method, path, json=body)
            except httpx.HTTPError as exc:
                if attempt == self.retries:
                    raise DFlashError(f"cannot reach {self.url}{path}: {type(exc).__name__}: {exc}") from None
            else:
                if r.status_code == 200:
                    return r
                if r.status_code not in RETRY_STATUS or attempt == self.retries:
                    raise DFlashError(f"{self.url}{path} answered {r.status_code}: {_message(r)}")
            await asyncio.sleep(min(30.0, 0.5 * 2**attempt))
        raise AssertionError("unreachable")


def _message(r) -> str:
    """The error message of an OpenAI-style error body, else the start of the body."""
    try:
        err = r.json().get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
    except ValueError:
        pass
    return r.text[:200].replace("\n", " ")


def served_model(url: str, model: str | None = None) -> str:
    """The model name requests to ``url`` carry: ``model`` (checked against what the server
    lists), or the first model it lists when ``model`` is None."""

    async def run() -> str:
        client = CompletionClient(url, model)
        try:
            return await client.discover()
        finally:
            await client.close()

    return asyncio.run(run())


def complete_all(
    url: str,
    prompts: dict[int, list[int]],
    max_tokens: int,
    *,
    on_done: Callable[[int, Completion], None],
    model: str | None = None,
    concurrency: int = 32,
    temperature: float = 0.0,
    **extra,
) -> str:
    """Complete every prompt (key -> token ids), at most ``concurrency`` in flight.

    ``on_done(key, completion)`` is called in this thread as each one finishes, in completion
    order. Returns the model name used. The first error stops the run (requests in flight are
    cancelled) and is raised.
    """
    if concurrency < 1:
        raise DFlashError("the concurrency must be >= 1")

    async def run() -> str:
        client = CompletionClient(url, model)
        try:
            name = await client.discover()
            todo = iter(list(prompts))  # a pool of workers, not one task per prompt
            finished: asyncio.Queue = asyncio.Queue()

            async def worker() -> None:
                try:
                    for key in todo:
                        await finished.put((key, await client.complete(prompts[key], max_tokens, temperature, **extra)))
                except Exception as exc:  # noqa: BLE001 - handed to the caller's thread below
                    await finished.put((None, exc))

            workers = [asyncio.create_task(worker()) for _ in range(min(concurrency, len(prompts)))]
            try:
                for _ in range(len(prompts)):
                    key, result = await finished.get()
                    if key is None:
                        raise result
                    on_done(key, result)
            finally:
                for w in workers:
                    w.cancel()
                await asyncio.gather(*workers, return_exceptions=True)
            return name
        finally:
            await client.close()

    return asyncio.run(run())
