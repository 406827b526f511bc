"""Chat templates rendered where a stuck render cannot stall the server: bounded in time and size.

Invariant: no chat template runs in the server's process. Each render goes to one of a few
child processes (:mod:`dflash_trt.serve.render_child`, jinja2's sandbox as transformers sets
it up, the same function ``apply_chat_template`` calls) over its own small thread pool, never
the threads tokenisation and the event loop's ``to_thread`` share. A render that overruns
``timeout_s`` is answered 400 and its child is killed and replaced; a text over ``max_chars``
(or a render that exhausts the child's memory cap) is answered 400 too. :meth:`close` kills
the children, so a server that is stopping is never held by a template.
"""

from __future__ import annotations

import asyncio
import json
import logging
import queue
import socket
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from pathlib import Path

from dflash_trt.serve.protocol import APIError

logger = logging.getLogger(__name__)

CHILD = Path(__file__).with_name("render_child.py")
START_TIMEOUT_S = 60.0  # a child's imports, not counted in a render's time


class _Child:
    """One renderer process and the connection to it."""

    def __init__(self, setup: dict):
        mine, theirs = socket.socketpair()
        self.proc = subprocess.Popen(
            [sys.executable, "-P", str(CHILD), str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
        )
        theirs.close()
        self.conn = Connection(mine.detach())
        self.conn.send_bytes(json.dumps(setup, default=str).encode())
        if not self.conn.poll(START_TIMEOUT_S):
            self.kill()
            raise RuntimeError(f"the chat-template renderer did not start within {START_TIMEOUT_S:.0f} s")
        self.conn.recv_bytes(64)

    def kill(self) -> None:
        self.proc.kill()
        self.conn.close()
        self.proc.wait()


class ChatRenderer:
    """Render a tokenizer's chat template in ``workers`` child processes, bounded per render."""

    def __init__(
        self,
        tokenizer,
        *,
        workers: int = 2,
        timeout_s: float = 5.0,
        max_chars: int = 8 << 20,
        memory_bytes: int = 1 << 30,
    ):
        self.timeout_s, self.max_chars, self.workers = timeout_s, max_chars, workers
        self.setup = {
            "template": tokenizer.get_chat_template(),
            "special": dict(tokenizer.special_tokens_map),
            "max_chars": max_chars,
            "memory_bytes": memory_bytes,
        }
        self._idle: queue.Queue[_Child] = queue.Queue()
        self._all: set[_Child] = set()
        self._lock = threading.Lock()
        self._closed = False
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="chat-render")

    def start(self) -> None:
        """Start the children in the background (the first render waits for one)."""
        for _ in range(self.workers):
            threading.Thread(target=self._add_child, daemon=True, name="chat-render-start").start()

    def _add_child(self) -> None:
        try:
            child = _Child(self.setup)
        except Exception:
            logger.exception("a chat-template renderer failed to start")
            return
        with self._lock:
            if self._closed:
                child.kill()
                return
            self._all.add(child)
        self._idle.put(child)

    def _retire(self, child: _Child) -> None:
        """Kill ``child``; a new one starts in the background (the request that retired it is
        answered now, not after the new child's imports)."""
        with self._lock:
            self._all.discard(child)
        child.kill()
        if not self._closed:
            threading.Thread(target=self._add_child, daemon=True, name="chat-render-start").start()

    async def render(self, messages: list[dict], add_generation_prompt: bool) -> str:
        """The template's text for ``messages``, or an :class:`APIError` 400."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self._render, messages, add_generation_prompt)

    def _render(self, messages: list[dict], add_generation_prompt: bool) -> str:
        if self._closed:
            raise _shutting_down()
        try:
            child = self._idle.get(timeout=START_TIMEOUT_S)
        except queue.Empty:
            with self._lock:
                short = len(self._all) < self.workers
            if short and not self._closed:  # a start failed: try again for the next request
                threading.Thread(target=self._add_child, daemon=True, name="chat-render-start").start()
            raise APIError(503, "no chat-template renderer is running", "service_unavailable") from None
        try:
            reply = self._ask(child, {"messages": messages, "add_generation_prompt": add_generation_prompt})
        except BaseException:
            self._retire(child)  # overran its time or died: killed, and a new one takes its place
            raise
        (self._retire if "too_large" in reply else self._idle.put)(child)
        if "ok" in reply:
            return reply["ok"]
        if "error" in reply:
            raise APIError(400, f"the chat template rejected the messages: {reply['error']}", param="messages")
        n = f" ({reply['too_large']} characters)" if reply["too_large"] else ""
        raise APIError(
            400,
            f"the chat template's text is over this server's limit of {self.max_chars} characters{n}",
            param="messages",
            code="template_too_large",
        )

    def _ask(self, child: _Child, request: dict) -> dict:
        try:
            child.conn.send_bytes(json.dumps(request).encode())
            if not child.conn.poll(self.timeout_s):
                raise APIError(
                    400,
                    f"the chat template did not finish rendering within {self.timeout_s:g} s",
                    param="messages",
                    code="template_timeout",
                )
            return json.loads(child.conn.recv_bytes(4 * self.max_chars + 4096))
        except (EOFError, OSError, ValueError):
            if self._closed:
                raise _shutting_down() from None
            raise APIError(
                400, "the chat template could not be rendered (its renderer stopped)", param="messages"
            ) from None

    def close(self) -> None:
        """Kill every child now: a render in progress ends (503), none start."""
        with self._lock:
            self._closed = True
            children, self._all = list(self._all), set()
        for child in children:
            child.kill()
        self._pool.shutdown(wait=False, cancel_futures=True)


def _shutting_down() -> APIError:
    return APIError(503, "the server is shutting down", "service_unavailable", code="shutting_down")
