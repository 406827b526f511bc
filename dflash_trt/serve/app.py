"""The embedded OpenAI-compatible server on the reference runtime (FastAPI + uvicorn).

Endpoints: ``/v1/completions`` and ``/v1/chat/completions`` (streaming as SSE ``data:``
chunks ending in ``data: [DONE]``; chat prompts through the target tokenizer's chat
template), ``/v1/models``, ``/health``, ``/metrics`` (Prometheus, see
:mod:`dflash_trt.serve.metrics`).

Behaviour a client can rely on:

- every model call goes through the pair's backend, the one its run spec opened
  (``runtime.resolve_run``), and batching is continuous on every backend
  (:mod:`dflash_trt.serve.continuous`: a request joins the running batch at the next round and
  leaves it when done); at
  temperature 0 every completion equals the target's own greedy decoding, and a request with
  a seed gives the same tokens, whatever else shares its batch;
- admission is first come first served; the wait queue is bounded: a request that finds it
  full gets 429 and nothing else changes, and an idle server never answers 429;
- a bad request gets an OpenAI-style error body (``{"error": {"message", "type",
  "param", "code"}}``), 400 (404 for an unknown model, as OpenAI does), and the server
  keeps serving;
- a client that disconnects frees its slot at the runtime's next round;
- SIGTERM stops accepting connections, lets in-flight requests finish for at most
  ``drain_timeout`` seconds (``serve --drain-timeout``, default 30), then fails what is left
  (an error event / 503 error object) and exits 0;
- a failure while admitting, stepping or streaming one request fails that request alone (its
  slot freed, ``dflash_request_failures_total{stage}`` counted); the others keep running.

Extensions to the OpenAI bodies: ``top_k``, ``ignore_eos``, and in responses
``"dflash": {"acceptance_length": τ of this request, "rounds": n}``.

This module wires the app (:func:`create_app`) and runs it (:func:`serve`,
:class:`ServerThread`); the handlers are in :mod:`dflash_trt.serve.routes`, the bodies and
SSE chunks in :mod:`dflash_trt.serve.responses`, what one app serves in
:mod:`dflash_trt.serve.state`.
"""

from __future__ import annotations

import asyncio
import threading
import time
from contextlib import asynccontextmanager
from typing import Any

from dflash_trt.errors import require
from dflash_trt.logs import uvicorn_log_config
from dflash_trt.runtime import Pair
from dflash_trt.serve.continuous import ContinuousBatcher
from dflash_trt.serve.metrics import ServerMetrics
from dflash_trt.serve.render import ChatRenderer
from dflash_trt.serve.spec import ServeSpec
from dflash_trt.serve.state import ServerState

DRAIN_TIMEOUT_S = 30.0  # serve --drain-timeout: how long SIGTERM lets in-flight requests run


def create_app(pair: Pair, model_name: str | None = None, *, spec: ServeSpec | None = None, **settings):
    """Build the FastAPI app serving ``pair`` under ``spec`` (:class:`~dflash_trt.serve.spec.ServeSpec`;
    or its fields as keywords); the batch worker starts with the app's lifespan.
    ``max_batch`` defaults to the bundle's planned ``max_batch_size`` (else 8). ``api_key``: every
    request but ``/health`` needs ``Authorization: Bearer KEY`` (401 otherwise); bodies over
    ``max_body_bytes`` are answered 413 (``serve/guard.py``). A chat template renders in a child
    process for at most ``template_timeout_s`` seconds and ``template_max_chars`` characters
    (``serve/render.py``; 400 past either)."""
    fastapi = require("fastapi", "serve", "the embedded server")
    from dflash_trt.serve import routes  # start-up: fastapi (routes imports it)
    from dflash_trt.serve.guard import Guard  # start-up: fastapi (through serve.responses)

    s = spec or ServeSpec(model_name=model_name, **settings)
    cfg = pair.target.config
    B = pair.block_size(s.block_size)
    metrics = ServerMetrics(B)
    context_len = s.max_model_len or int(getattr(cfg, "max_position_embeddings", 0) or 4096)
    batcher = ContinuousBatcher(
        pair,
        draft_len_schedule=pair.draft_len_schedule,
        context_len=context_len,
        max_batch=s.max_batch or pair.max_batch_size or 8,
        max_queue=s.max_queue,
        block_size=B,
        metrics=metrics,
        torch_threads=s.torch_threads,
    )
    server = ServerState(
        pair,
        s.model_name or model_name or pair.name,
        context_len=context_len,
        block_size=B,
        default_max_tokens=s.default_max_tokens,
        batcher=batcher,
        metrics=metrics,
        chat=_renderer(pair.tokenizer, s.template_timeout_s, s.template_max_chars),
    )
    app = fastapi.FastAPI(title="dflash-trt embedded server", lifespan=_lifespan(server, batcher))
    app.state.server = server
    app.state.batcher, app.state.metrics, app.state.model_name = batcher, metrics, server.model_name
    app.state.drain = batcher.close  # stop taking requests (503), keep running what was admitted
    app.state.abandon = batcher.abandon  # the drain ran out of time: fail what is left
    app.state.drain_timeout = DRAIN_TIMEOUT_S
    app.state.busy = server.busy
    routes.install(app)
    app.add_middleware(Guard, api_key=s.api_key, max_body_bytes=s.max_body_bytes, on_refused=metrics.request_done)
    return app


def _lifespan(server: ServerState, batcher: ContinuousBatcher):
    """The app's lifespan: the worker and the template renderer start with it; on shutdown the
    renderer closes and what is queued finishes (for at most the app's drain timeout)."""

    @asynccontextmanager
    async def lifespan(app):
        batcher.start()
        if server.chat is not None:
            server.chat.start()
        try:
            yield
        finally:  # uvicorn has already let in-flight requests finish; finish anything queued (bounded)
            if server.chat is not None:
                server.chat.close()  # a render still running (a template that loops) ends now
            await asyncio.to_thread(batcher.stop, app.state.drain_timeout)

    return lifespan


def _renderer(tokenizer, timeout_s: float, max_chars: int) -> ChatRenderer | None:
    if not getattr(tokenizer, "chat_template", None):
        return None
    return ChatRenderer(tokenizer, timeout_s=timeout_s, max_chars=max_chars)


# ---- running it ----------------------------------------------------------------------------
def serve(
    app,
    host: str = "127.0.0.1",
    port: int = 8000,
    log_level: str = "info",
    drain_timeout: float = DRAIN_TIMEOUT_S,
    log_format: str = "text",
) -> int:
    """Run uvicorn in this thread until SIGTERM/SIGINT, then drain and return 0.

    The first signal stops admission (new requests get 503, /health says "draining"), lets
    every admitted request finish (queued ones included) for at most ``drain_timeout`` seconds,
    then fails what is left (``batcher.abandon``) and shuts uvicorn down; a second signal exits
    at once.
    """
    uvicorn: Any = require("uvicorn", "serve", "the embedded server")
    app.state.drain_timeout = drain_timeout

    class DrainingServer(uvicorn.Server):
        draining_since: float | None = None

        def handle_exit(self, sig, frame) -> None:
            if self.draining_since is not None:  # second signal: stop now
                self.should_exit = self.force_exit = True
                return
            self.draining_since = time.monotonic()
            getattr(app.state, "drain", lambda: None)()

        async def on_tick(self, counter: int) -> bool:
            if self.draining_since is not None:
                if not getattr(app.state, "busy", lambda: False)():
                    return True
                if time.monotonic() - self.draining_since >= drain_timeout:
                    getattr(app.state, "abandon", lambda: None)()
                    return True
            return await super().on_tick(counter)

    server = DrainingServer(
        uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level=log_level,
            log_config=uvicorn_log_config(log_level, log_format),
            timeout_graceful_shutdown=max(1, int(drain_timeout) // 10 + 1),
        )
    )
    server.run()
    return 0


class ServerThread:
    """uvicorn in a background thread on an ephemeral port (tests, in-process benchmarks)."""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0):
        uvicorn: Any = require("uvicorn", "serve", "the embedded server")
        self.server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.host = host

    def __enter__(self) -> ServerThread:
        self.thread.start()
        deadline = time.time() + 60
        while not self.server.started:
            if not self.thread.is_alive() or time.time() > deadline:
                raise RuntimeError("the embedded server did not start")
            time.sleep(0.01)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://{self.host}:{self.port}"
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(60)
