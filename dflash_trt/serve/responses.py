"""OpenAI response bodies, SSE chunks and the streamed response of the embedded server.

Bodies follow the OpenAI completions / chat completions API: a full response is
``{"id", "object", "created", "model", "choices", "usage", "dflash"}``; a stream is SSE
``data:`` chunks ``{"id", "object", "created", "model", "choices": [delta]}`` (plus a last
usage chunk when ``stream_options.include_usage``), ending in ``data: [DONE]``. Imported by
the routes once fastapi is known to be installed (it imports fastapi).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from fastapi.responses import StreamingResponse

from dflash_trt.serve.batcher import Job

DONE = "data: [DONE]\n\n"


def error_body(message: str, type_: str, param: str | None, code: str | None) -> dict:
    """OpenAI's error object."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


@dataclass(frozen=True)
class Reply:
    """The head every body and chunk of one response carries: id, creation time, model."""

    chat: bool
    model: str
    id: str
    created: int

    @classmethod
    def new(cls, chat: bool, model: str) -> Reply:
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        return cls(chat, model, rid, int(time.time()))

    def head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    @property
    def chunk_object(self) -> str:
        return "chat.completion.chunk" if self.chat else "text_completion"


def usage(job: Job) -> dict:
    return {
        "prompt_tokens": len(job.prompt),
        "completion_tokens": len(job.tokens),
        "total_tokens": len(job.prompt) + len(job.tokens),
    }


def extension(job: Job, block_size: int) -> dict:
    """The ``"dflash"`` field: τ of this request, its rounds, the block size B."""
    tau = job.acceptance_length
    return {
        "acceptance_length": round(tau, 4) if tau is not None else None,
        "rounds": job.rounds,
        "block_size": block_size,
    }


def completion_body(reply: Reply, text: str, job: Job, block_size: int) -> dict:
    """The non-streaming response of a finished job (a cancelled one reports ``abort``)."""
    reason = job.finish_reason if job.finish_reason != "cancelled" else "abort"
    choice: dict[str, Any] = {"index": 0, "finish_reason": reason, "logprobs": None}
    if reply.chat:
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    return {
        **reply.head("chat.completion" if reply.chat else "text_completion"),
        "choices": [choice],
        "usage": usage(job),
        "dflash": extension(job, block_size),
    }


def sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def chunk(reply: Reply, delta: str | None, finish: str | None = None, role: bool = False) -> str:
    """One SSE chunk: a chat ``delta`` (``role`` on the first) or a completion's ``text``."""
    if reply.chat:
        d: dict[str, Any] = {}
        if role:
            d["role"] = "assistant"
        if delta is not None:
            d["content"] = delta
        choice = {"index": 0, "delta": d, "logprobs": None, "finish_reason": finish}
    else:
        choice = {"index": 0, "text": delta or "", "logprobs": None, "finish_reason": finish}
    return sse({**reply.head(reply.chunk_object), "choices": [choice]})


async def stream_events(
    reply: Reply, events: asyncio.Queue, job: Job, tokenizer, block_size: int, include_usage: bool
) -> AsyncIterator[str]:
    """SSE chunks from the job's events (``text``: what its :class:`~dflash_trt.serve.stops.TextStream`
    says is safe to send, never past a stop string; then ``done`` or ``error``), then [DONE]."""
    if reply.chat:
        yield chunk(reply, "", role=True)
    while True:
        kind, payload = await events.get()
        if kind == "text":
            yield chunk(reply, payload)
        elif kind == "tokens":
            continue
        elif kind == "done":
            yield chunk(reply, None if reply.chat else "", finish=payload)
            if include_usage:
                yield sse(
                    {
                        **reply.head(reply.chunk_object),
                        "choices": [],
                        "usage": usage(job),
                        "dflash": extension(job, block_size),
                    }
                )
            break
        else:  # error mid-stream: an OpenAI-style error event, then the end marker
            yield sse(error_body(str(payload), "server_error", None, None))
            break
    yield DONE


class JobStream(StreamingResponse):
    """A streamed job: whatever ends the response (done, client gone, error) frees the job's slot
    and calls ``closed(gone)``, ``gone`` true when the client left before the job finished."""

    def __init__(self, content, job: Job, closed: Callable[[bool], None], **kw):
        super().__init__(content, **kw)
        self.job, self.closed = job, closed

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            gone = not self.job.finished or self.job.finish_reason == "cancelled"
            self.job.cancel()
            self.closed(gone)
