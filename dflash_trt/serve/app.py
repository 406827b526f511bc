"""The embedded OpenAI-compatible server on the reference runtime (FastAPI + uvicorn).

Endpoints: ``/v1/completions`` and ``/v1/chat/completions`` (streaming as SSE ``data:``
chunks ending in ``data: [DONE]``; chat prompts through the target tokenizer's chat
template), ``/v1/models``, ``/health``, ``/metrics`` (Prometheus, see
:mod:`dflash_trt.serve.metrics`).

Behaviour a client can rely on:

- concurrent requests are batched through the runtime's batch > 1 path
  (:mod:`dflash_trt.serve.batcher`); at temperature 0 every completion equals the target's own
  greedy decoding, whatever else shares its batch;
- the wait queue is bounded: a request that finds it full gets 429 and nothing else changes;
- a bad request gets an OpenAI-style error body (``{"error": {"message", "type",
  "param", "code"}}``), 400 (404 for an unknown model, as OpenAI does), and the server
  keeps serving;
- a client that disconnects frees its slot at the runtime's next round;
- SIGTERM stops accepting connections, lets in-flight requests finish, then exits 0.

Extensions to the OpenAI bodies: ``top_k``, ``ignore_eos``, and in responses
``"dflash": {"acceptance_length": τ of this request, "rounds": n}``.
"""

# No `from __future__ import annotations` here: FastAPI reads the endpoint annotations
# (Request, the body models) at definition time, and Request is imported lazily.
import asyncio
import os
import functools
import json
import threading
import time
import uuid
from contextlib import asynccontextmanager
from typing import Any

from dflash_trt.serve.batcher import Batcher, Draining, Job, QueueFull
from dflash_trt.errors import require
from dflash_trt.runtime import Pair
from dflash_trt.runtime import SamplingParams
from dflash_trt.serve.protocol import APIError, ChatRequest, CompletionRequest, IncrementalDetokenizer, validation_message


def create_app(pair: Pair, model_name: str | None = None, *, max_queue: int = 64, max_batch: int = 8,
               block_size: int | None = None, max_model_len: int | None = None,
               default_max_tokens: int = 16, batch_window_s: float = 0.005, torch_threads: int | None = None):
    """Build the FastAPI app serving ``pair``; the batch worker starts with the app's lifespan."""
    fastapi = require("fastapi", "serve", "the embedded server")
    from fastapi import Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, Response

    from dflash_trt.serve.metrics import ServerMetrics

    name = model_name or pair.name
    cfg = pair.target.config
    ctx_len = max_model_len or int(getattr(cfg, "max_position_embeddings", 0) or 4096)
    B = block_size or (pair.drafter.cfg.block_size if pair.drafter is not None else 1)
    metrics = ServerMetrics(B)
    batcher = Batcher(pair, max_batch=max_batch, max_queue=max_queue, block_size=B, metrics=metrics,
                      batch_window_s=batch_window_s, torch_threads=torch_threads)
    created = int(time.time())

    @asynccontextmanager
    async def lifespan(app):
        batcher.start()
        try:
            yield
        finally:  # uvicorn has already let in-flight requests finish; finish anything queued
            await asyncio.to_thread(batcher.stop)

    app = fastapi.FastAPI(title="dflash-trt embedded server", lifespan=lifespan)
    app.state.batcher, app.state.metrics, app.state.model_name = batcher, metrics, name
    open_responses = [0]  # requests admitted whose response is not finished yet

    def busy() -> bool:
        return bool(open_responses[0] or batcher.queue_depth or batcher.running)

    app.state.drain = batcher.close   # stop taking requests (503), keep running what was admitted
    app.state.busy = busy

    def error(status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
              code: str | None = None):
        metrics.request_done(status)
        return JSONResponse({"error": {"message": message, "type": type_, "param": param, "code": code}},
                            status_code=status)

    @app.exception_handler(APIError)
    async def _api_error(request, exc: APIError):
        return error(exc.status, exc.message, exc.type, exc.param, exc.code)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request, exc: RequestValidationError):
        message, param = validation_message(exc.errors())
        return error(400, message, param=param)

    @app.get("/health")
    async def health():
        if not batcher.accepting:
            return JSONResponse({"status": "draining"}, status_code=503)
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": name, "object": "model", "created": created,
                                            "owned_by": "dflash-trt", "max_model_len": ctx_len}]}

    @app.get("/metrics")
    async def prometheus():
        body, ctype = metrics.render()
        return Response(body, media_type=ctype)

    # ---- request -> job ------------------------------------------------------------------
    def check_model(req) -> None:
        if req.model is not None and req.model != name:
            raise APIError(404, f"The model `{req.model}` does not exist; this server serves `{name}`.",
                           "NotFoundError", "model", "model_not_found")

    def make_job(req, prompt_ids: list[int], requested: int | None, default: int) -> Job:
        n = len(prompt_ids)
        if n == 0:
            raise APIError(400, "the prompt is empty", param="prompt")
        if n >= ctx_len:
            raise APIError(400, f"the prompt has {n} tokens; this model's context is {ctx_len} tokens",
                           param="prompt", code="context_length_exceeded")
        if requested is not None and n + requested > ctx_len:
            raise APIError(400, f"prompt ({n} tokens) + max_tokens ({requested}) exceeds this model's context "
                           f"of {ctx_len} tokens", param="max_tokens", code="context_length_exceeded")
        max_tokens = requested if requested is not None else min(default, ctx_len - n)
        vocab = pair.target.config.vocab_size
        if any(not 0 <= t < vocab for t in prompt_ids):
            raise APIError(400, f"prompt token ids must be in [0, {vocab})", param="prompt")
        try:
            sampling = SamplingParams(temperature=req.temperature, top_p=req.top_p, top_k=req.top_k, seed=req.seed)
        except Exception as exc:  # DFlashError from the checks in SamplingParams
            raise APIError(400, str(exc)) from None
        return Job(prompt=prompt_ids, max_tokens=max_tokens, sampling=sampling, ignore_eos=req.ignore_eos)

    def submit(job: Job) -> asyncio.Queue:
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()
        job.sink = lambda kind, payload: loop.call_soon_threadsafe(events.put_nowait, (kind, payload))
        try:
            batcher.submit(job)
        except QueueFull as exc:
            raise APIError(429, str(exc), "rate_limit_error", code="queue_full") from None
        except Draining as exc:
            raise APIError(503, str(exc), "service_unavailable", code="shutting_down") from None
        metrics.prompt_tokens.inc(len(job.prompt))
        return events

    def usage(job: Job) -> dict:
        return {"prompt_tokens": len(job.prompt), "completion_tokens": len(job.tokens),
                "total_tokens": len(job.prompt) + len(job.tokens)}

    def extension(job: Job) -> dict:
        tau = job.acceptance_length
        return {"acceptance_length": round(tau, 4) if tau is not None else None, "rounds": job.rounds,
                "block_size": B}

    async def respond(request: Request, req, job: Job, chat: bool):
        events = submit(job)
        open_responses[0] += 1
        if req.stream:  # the stream's own end (JobStream) closes the count
            try:
                return respond_stream(req, job, events, chat)
            except BaseException:
                open_responses[0] -= 1
                raise
        try:
            return await respond_full(request, job, events, chat)
        finally:
            open_responses[0] -= 1

    def respond_stream(req, job: Job, events: asyncio.Queue, chat: bool):
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        include_usage = bool(req.stream_options and req.stream_options.get("include_usage"))
        body = stream_events(events, job, rid, int(time.time()), chat, include_usage)

        def closed(gone: bool) -> None:
            open_responses[0] -= 1
            metrics.request_done(499 if gone else 200)

        return _JobStream(body, job, closed, media_type="text/event-stream",
                          headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def respond_full(request: Request, job: Job, events: asyncio.Queue, chat: bool):
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        now = int(time.time())
        obj = "chat.completion" if chat else "text_completion"
        while True:  # non-streaming: wait for the end, noticing a client that goes away
            try:
                kind, payload = await asyncio.wait_for(events.get(), timeout=0.5)
            except asyncio.TimeoutError:
                if await request.is_disconnected():
                    job.cancel()
                    metrics.request_done(499)
                    return Response(status_code=499)
                continue
            if kind == "error":
                raise APIError(500, str(payload), "server_error")
            if kind == "done":
                break
        text = pair.decode(job.tokens)
        reason = job.finish_reason if job.finish_reason != "cancelled" else "abort"
        choice: dict[str, Any] = {"index": 0, "finish_reason": reason, "logprobs": None}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        metrics.request_done(200)
        return {"id": rid, "object": obj, "created": now, "model": name, "choices": [choice],
                "usage": usage(job), "dflash": extension(job)}

    async def stream_events(events: asyncio.Queue, job: Job, rid: str, now: int, chat: bool, include_usage: bool):
        obj = "chat.completion.chunk" if chat else "text_completion"

        def chunk(delta: str | None, finish: str | None = None, role: bool = False) -> str:
            if chat:
                d: dict[str, Any] = {}
                if role:
                    d["role"] = "assistant"
                if delta is not None:
                    d["content"] = delta
                choice = {"index": 0, "delta": d, "logprobs": None, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": delta or "", "logprobs": None, "finish_reason": finish}
            return _sse({"id": rid, "object": obj, "created": now, "model": name, "choices": [choice]})

        detok = IncrementalDetokenizer(pair.tokenizer)
        if chat:
            yield chunk("", role=True)
        while True:
            kind, payload = await events.get()
            if kind == "tokens":
                text = detok.add(payload)
                if text:
                    yield chunk(text)
            elif kind == "done":
                rest = detok.flush()
                if rest:
                    yield chunk(rest)
                yield chunk(None if chat else "", finish=payload)
                if include_usage:
                    yield _sse({"id": rid, "object": obj, "created": now, "model": name, "choices": [],
                                "usage": usage(job), "dflash": extension(job)})
                break
            else:  # error mid-stream: an OpenAI-style error event, then the end marker
                yield _sse({"error": {"message": str(payload), "type": "server_error", "param": None,
                                      "code": None}})
                break
        yield "data: [DONE]\n\n"

    # ---- endpoints -----------------------------------------------------------------------
    @app.post("/v1/completions")
    async def completions(request: Request, req: CompletionRequest):
        check_model(req)
        req.check_supported()
        prompt = req.prompt_value()
        ids = prompt if isinstance(prompt, list) else pair.encode(prompt)
        job = make_job(req, ids, req.max_tokens, default_max_tokens)
        return await respond(request, req, job, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request, req: ChatRequest):
        check_model(req)
        req.check_supported()
        ids = req.encode(pair.tokenizer)
        job = make_job(req, ids, req.max_completion_tokens or req.max_tokens, ctx_len)
        return await respond(request, req, job, chat=True)

    return app


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


@functools.lru_cache(maxsize=None)
def _stream_response_class():
    from fastapi.responses import StreamingResponse

    class JobStream(StreamingResponse):
        """A streamed job: whatever ends the response (done, client gone, error) frees the job's slot."""

        def __init__(self, content, job: Job, closed, **kw):
            super().__init__(content, **kw)
            self.job, self.closed = job, closed

        async def __call__(self, scope, receive, send):
            try:
                await super().__call__(scope, receive, send)
            finally:
                gone = not self.job.finished or self.job.finish_reason == "cancelled"
                self.job.cancel()
                self.closed(gone)

    return JobStream


def _JobStream(content, job, closed, **kw):
    return _stream_response_class()(content, job, closed, **kw)


# ---- running it ----------------------------------------------------------------------------
def serve(app, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info") -> int:
    """Run uvicorn in this thread until SIGTERM/SIGINT, then drain and return 0.

    The first signal stops admission (new requests get 503, /health says "draining"), lets
    every admitted request finish (queued ones included), then shuts uvicorn down; a
    second signal exits at once.
    """
    uvicorn = require("uvicorn", "serve", "the embedded server")

    class DrainingServer(uvicorn.Server):
        draining = False

        def handle_exit(self, sig, frame) -> None:
            if self.draining:  # second signal: stop now
                self.should_exit = self.force_exit = True
                return
            self.draining = True
            getattr(app.state, "drain", lambda: None)()

        async def on_tick(self, counter: int) -> bool:
            if self.draining and not getattr(app.state, "busy", lambda: False)():
                return True
            return await super().on_tick(counter)

    server = DrainingServer(uvicorn.Config(app, host=host, port=port, log_level=log_level))
    server.run()
    return 0


class ServerThread:
    """uvicorn in a background thread on an ephemeral port (tests, in-process benchmarks)."""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0):
        uvicorn = require("uvicorn", "serve", "the embedded server")
        self.server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.host = host

    def __enter__(self) -> "ServerThread":
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


# ---- will it fit? ----------------------------------------------------------------------------
_STORED_BYTES = {"float32": 4, "float64": 8, "bfloat16": 2, "float16": 2}


def weight_bytes(model_dir, runtime_itemsize: int) -> int:
    """Bytes the weights of a checkpoint directory take once loaded at ``runtime_itemsize``
    bytes per parameter, estimated from its safetensors sizes and config (nothing loaded)."""
    from pathlib import Path

    model_dir = Path(model_dir)
    stored = sum(f.stat().st_size for f in model_dir.glob("*.safetensors"))
    per_param = 2.0
    cfg_path = model_dir / "config.json"
    if cfg_path.is_file():
        try:
            cfg = json.loads(cfg_path.read_text())
        except json.JSONDecodeError:
            cfg = {}
        per_param = _STORED_BYTES.get(str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"), 2.0)
        quant = json.dumps(cfg.get("quantization_config") or {}).upper()
        if "NVFP4" in quant or "FP4" in quant:
            per_param = 0.5625  # two e2m1 per byte + an fp8 scale per 16
        elif "FP8" in quant:
            per_param = 1.0
    return int(stored / per_param * runtime_itemsize)


def physical_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
        return None


def check_fits_cpu(name: str, model_dirs, runtime_itemsize: int, fraction: float = 0.8) -> None:
    """Refuse, in one line, a model whose weights would not fit in ``fraction`` of this machine's RAM."""
    from dflash_trt.errors import HardwareError

    need = sum(weight_bytes(d, runtime_itemsize) for d in model_dirs)
    total = physical_memory()
    if total is not None and need > fraction * total:
        raise HardwareError(
            f"{name}: its weights need ~{need / 2**30:.1f} GiB at {runtime_itemsize * 8}-bit on the CPU "
            f"but this machine has {total / 2**30:.1f} GiB; too large for the reference runtime: serve it "
            "with trtllm-serve on a GPU (dflash-trt serve OUT --runtime trtllm, where TensorRT-LLM is installed)")
