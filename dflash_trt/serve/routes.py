"""The embedded server's routes: one function per endpoint, and what they share.

Every handler reads what the app serves from ``request.app.state.server`` (a
:class:`~dflash_trt.serve.state.ServerState`). What the generation endpoints share lives here
once: :func:`accept` (model name, fields this server cannot honour), :func:`make_job` (token ids,
sampling, then the scheduler's own admission check: context length, engine profile),
:func:`submit` (the bounded queue: 429 / 503) and :func:`respond` (full or streamed). Every
refusal is an :class:`APIError`; the handlers in ``ERROR_HANDLERS`` answer it, and FastAPI's
validation errors, through :func:`error`, the one place that writes an error body and counts it.
:func:`install` adds ``ROUTES`` and ``ERROR_HANDLERS`` to an app.

Imported by ``create_app`` once fastapi is known to be installed (it imports fastapi).
"""

# No `from __future__ import annotations` here: FastAPI reads the endpoint annotations
# (Request, the body models) as objects when a route is added.
import asyncio

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from dflash_trt.runtime import Refused, SamplingParams
from dflash_trt.serve.batcher import Draining, Job, QueueFull
from dflash_trt.serve.fields import MESSAGE_CHARS, quoted
from dflash_trt.serve.protocol import APIError, ChatRequest, CompletionRequest, validation_message
from dflash_trt.serve.responses import JobStream, Reply, completion_body, error_body, stream_events
from dflash_trt.serve.state import ServerState
from dflash_trt.serve.stops import TextStream

#: the request field a scheduler refusal names (``runtime.Refused.param``), as OpenAI spells it
OPENAI_PARAM: dict[str | None, str | None] = {"max_new_tokens": "max_tokens"}


def server_of(request: Request) -> ServerState:
    return request.app.state.server


# ---- errors: every refusal is answered here -----------------------------------------------
def error(
    server: ServerState,
    status: int,
    message: str,
    type_: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
) -> JSONResponse:
    """An OpenAI-style error response, counted in ``dflash_requests_total{status}``."""
    server.metrics.request_done(status)
    param = quoted(param) if param is not None else None
    return JSONResponse(error_body(quoted(message, MESSAGE_CHARS), type_, param, code), status_code=status)


async def api_error(request: Request, exc: APIError) -> JSONResponse:
    return error(server_of(request), exc.status, exc.message, exc.type, exc.param, exc.code)


async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    """Unknown routes (404), wrong methods (405) and the like, as OpenAI error objects too."""
    kind = {404: "NotFoundError", 405: "invalid_request_error"}.get(exc.status_code, "invalid_request_error")
    path = quoted(request.url.path)
    messages = {
        404: f"No route {quoted(request.method)} {path} on this server.",
        405: f"Method {quoted(request.method)} is not allowed on {path}.",
    }
    message = messages.get(exc.status_code, str(exc.detail))
    return error(server_of(request), exc.status_code, message, kind)


async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
    message, param = validation_message(list(exc.errors()))
    return error(server_of(request), 400, message, param=param)


async def internal_error(request: Request, exc: Exception) -> JSONResponse:
    """Anything unforeseen in a handler: still an OpenAI error object, counted (never plain text)."""
    return error(server_of(request), 500, f"internal error: {type(exc).__name__}", "server_error")


async def tokenize(fn, *args, param: str):
    """Tokenise off the event loop (a large body takes a while: /health and streams keep going);
    text the tokenizer cannot encode (a lone surrogate, ...) is the client's 400, naming ``param``."""
    try:
        return await asyncio.to_thread(fn, *args)
    except APIError:
        raise
    except (UnicodeError, ValueError, TypeError) as exc:
        raise APIError(
            400, f"the {param} cannot be tokenized: {type(exc).__name__}: {str(exc)[:200]}", param=param
        ) from None


def chat_ids(tokenizer, text: str) -> list[int]:
    """The rendered chat's token ids (its special tokens are in the text already)."""
    return tokenizer(text, add_special_tokens=False)["input_ids"]


# ---- request -> job ---------------------------------------------------------------------
def accept(request: Request, req) -> ServerState:
    """The checks every generation request passes first: the model it names, supported fields."""
    server = server_of(request)
    if req.model is not None and req.model != server.model_name:
        raise APIError(
            404,
            f"The model `{quoted(req.model)}` does not exist; this server serves `{server.model_name}`.",
            "NotFoundError",
            "model",
            "model_not_found",
        )
    req.check_supported()
    return server


def make_job(server: ServerState, req, prompt_ids: list[int], requested: int | None, default: int) -> Job:
    """A job for ``prompt_ids``: its ids in the vocabulary, sampling valid, and admitted by the
    scheduler's rule (``runtime.Scheduler.check``: not empty, within the context, the engine profile),
    answered 400 here, before the job is queued.

    ``requested``: the client's max tokens (None: ``default``, capped by what the context leaves).
    """
    max_tokens = requested if requested is not None else max(1, min(default, server.context_len - len(prompt_ids)))
    vocab = int(server.pair.target.config.vocab_size)
    if any(not 0 <= t < vocab for t in prompt_ids):
        raise APIError(400, f"prompt token ids must be in [0, {vocab})", param="prompt")
    try:
        sampling = SamplingParams(temperature=req.temperature, top_p=req.top_p, top_k=req.top_k, seed=req.seed)
    except Exception as exc:  # DFlashError from the checks in SamplingParams
        raise APIError(400, str(exc)) from None
    # the text as it is committed, cut at a stop string: what a stream sends (serve/stops.py)
    text = TextStream(server.pair.tokenizer, req.stops()) if req.stream or req.stop else None
    job = Job.new(prompt_ids, max_tokens, sampling, ignore_eos=req.ignore_eos, text=text)
    try:
        server.batcher.check(job)  # the scheduler's admission rule (context, engine profile), its one owner
    except Refused as exc:
        raise APIError(
            400,
            str(exc),
            param=OPENAI_PARAM.get(exc.param, exc.param),
            code="context_length_exceeded" if exc.context else None,
        ) from None
    return job


def submit(server: ServerState, job: Job) -> asyncio.Queue:
    """Queue ``job`` for the batch worker; its events (kind, payload) arrive on the returned queue."""
    loop = asyncio.get_running_loop()
    events: asyncio.Queue = asyncio.Queue()

    def sink(kind: str, payload: object) -> None:
        loop.call_soon_threadsafe(events.put_nowait, (kind, payload))

    job.sink = sink
    try:
        server.batcher.submit(job)
    except QueueFull as exc:
        raise APIError(429, str(exc), "rate_limit_error", code="queue_full") from None
    except Draining as exc:
        raise APIError(503, str(exc), "service_unavailable", code="shutting_down") from None
    server.metrics.prompt_tokens.inc(len(job.prompt))
    return events


# ---- job -> response --------------------------------------------------------------------
async def respond(request: Request, server: ServerState, req, job: Job, chat: bool):
    """Submit ``job`` and answer with its full response or its stream (``req.stream``)."""
    events = submit(server, job)
    server.open_responses += 1
    if req.stream:  # the stream's own end (JobStream) closes the count
        try:
            return respond_stream(server, req, job, events, chat)
        except BaseException:
            server.open_responses -= 1
            raise
    try:
        return await respond_full(request, server, job, events, chat)
    finally:
        server.open_responses -= 1


def respond_stream(server: ServerState, req, job: Job, events: asyncio.Queue, chat: bool) -> JobStream:
    reply = Reply.new(chat, server.model_name)
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    body = stream_events(reply, events, job, server.pair.tokenizer, server.block_size, include_usage)

    def closed(gone: bool) -> None:
        server.open_responses -= 1
        server.metrics.request_done(499 if gone else 200)

    return JobStream(
        body,
        job,
        closed,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def respond_full(request: Request, server: ServerState, job: Job, events: asyncio.Queue, chat: bool):
    reply = Reply.new(chat, server.model_name)
    loop = asyncio.get_running_loop()
    checked = loop.time()
    while True:  # non-streaming: wait for the end, noticing a client that goes away
        try:
            kind, payload = await asyncio.wait_for(events.get(), timeout=0.5)
        except asyncio.TimeoutError:
            kind = None
        # at least every 0.5 s, also while tokens keep coming: a busy job is cancelled too
        if kind is None or loop.time() - checked >= 0.5:
            checked = loop.time()
            if await request.is_disconnected():
                job.cancel()
                server.metrics.request_done(499)
                return Response(status_code=499)
        if kind is None:
            continue
        if kind == "error":
            raise APIError(500, str(payload), "server_error")
        if kind == "done":
            break
    text = job.text.text if job.text is not None else server.pair.decode(job.tokens)
    body = completion_body(reply, text, job, server.block_size)
    server.metrics.request_done(200)
    return body


# ---- endpoints --------------------------------------------------------------------------
async def health(request: Request):
    if not server_of(request).batcher.accepting:
        return JSONResponse({"status": "draining"}, status_code=503)
    return {"status": "ok"}


async def models(request: Request):
    server = server_of(request)
    return {
        "object": "list",
        "data": [
            {
                "id": server.model_name,
                "object": "model",
                "created": server.created,
                "owned_by": "dflash-trt",
                "max_model_len": server.context_len,
            }
        ],
    }


async def prometheus(request: Request):
    body, ctype = server_of(request).metrics.render()
    return Response(body, media_type=ctype)


async def completions(request: Request, req: CompletionRequest):
    server = accept(request, req)
    prompt = req.prompt_value()
    ids = prompt if isinstance(prompt, list) else await tokenize(server.pair.encode, prompt, param="prompt")
    job = make_job(server, req, ids, req.max_tokens, server.default_max_tokens)
    body = await respond(request, server, req, job, chat=False)
    if req.return_token_ids and isinstance(body, dict):  # full responses only; regeneration reads them
        body["choices"][0]["token_ids"] = list(job.tokens)
    return body


async def chat_completions(request: Request, req: ChatRequest):
    server = accept(request, req)
    messages = req.template_messages(server.pair.tokenizer)  # 400 when the tokenizer has no chat template
    assert server.chat is not None  # create_app makes one for every template
    text = await server.chat.render(messages, req.add_generation_prompt)
    ids = await tokenize(chat_ids, server.pair.tokenizer, text, param="messages")
    job = make_job(server, req, ids, req.max_completion_tokens or req.max_tokens, server.context_len)
    return await respond(request, server, req, job, chat=True)


ROUTES = (
    ("GET", "/health", health),
    ("HEAD", "/health", health),  # load balancers probe with HEAD too
    ("GET", "/v1/models", models),
    ("GET", "/metrics", prometheus),
    ("POST", "/v1/completions", completions),
    ("POST", "/v1/chat/completions", chat_completions),
)
ERROR_HANDLERS = (
    (APIError, api_error),
    (RequestValidationError, invalid_request),
    (StarletteHTTPException, http_error),
    (Exception, internal_error),
)


def install(app: FastAPI) -> None:
    """Add the error handlers and the routes to ``app``."""
    for exc_type, handler in ERROR_HANDLERS:
        app.add_exception_handler(exc_type, handler)  # type: ignore[arg-type]  # each handler takes its own type
    for method, path, endpoint in ROUTES:
        app.add_api_route(path, endpoint, methods=[method])
