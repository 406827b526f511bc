"""What stands in front of the routes: the API key and the request-body limit (pure ASGI).

* With an API key set, every request but ``GET``/``HEAD /health`` (load balancers probe it) must carry
  ``Authorization: Bearer KEY``, as OpenAI clients send it; otherwise 401 with OpenAI's error
  object (``code: invalid_api_key``). Keys are compared in constant time.
* A body larger than ``max_body_bytes`` is answered 413 before it is read into memory: by its
  ``Content-Length`` when sent, else as the chunks arrive.

Both answer with the same error object the routes use (``responses.error_body``).
"""

from __future__ import annotations

import hmac
import json

from dflash_trt.serve.responses import error_body

OPEN_PATHS = {("GET", "/health"), ("HEAD", "/health")}


class _TooLarge(Exception):
    pass


async def _send_error(send, status: int, message: str, code: str) -> None:
    body = json.dumps(error_body(message, "invalid_request_error", None, code)).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class Guard:
    """ASGI middleware: API key (when set) and the body-size limit, in that order."""

    def __init__(self, app, api_key: str | None, max_body_bytes: int, on_refused=None):
        self.app, self.api_key, self.max_body_bytes = app, api_key, max_body_bytes
        self.on_refused = on_refused or (lambda status: None)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.lower(): v for k, v in scope.get("headers", [])}
        if self.api_key and (scope["method"], scope["path"]) not in OPEN_PATHS:
            got = headers.get(b"authorization", b"").decode("latin-1")
            if not hmac.compare_digest(got.encode(), f"Bearer {self.api_key}".encode()):
                self.on_refused(401)
                return await _send_error(
                    send,
                    401,
                    "Incorrect or missing API key: send 'Authorization: "
                    "Bearer <key>' (the server was started with --api-key).",
                    "invalid_api_key",
                )
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            self.on_refused(413)
            return await _send_error(
                send,
                413,
                f"Request body of {int(length)} bytes exceeds this server's limit of {self.max_body_bytes} bytes.",
                "request_too_large",
            )
        seen = 0

        async def limited():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_body_bytes:
                    raise _TooLarge
            return message

        started = False

        async def tracked_send(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited, tracked_send)
        except _TooLarge:
            if not started:
                self.on_refused(413)
                await _send_error(
                    send,
                    413,
                    f"Request body exceeds this server's limit of {self.max_body_bytes} bytes.",
                    "request_too_large",
                )
