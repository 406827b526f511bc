"""The chat-template renderer's child process (run by path: ``python -P render_child.py FD``).

Invariant: this process holds nothing of the server's (no models, no tokenizer, no key): only
the template text and the tokenizer's special tokens. It answers one JSON message per request
on the connection ``FD``, ``{"ok": text}`` or ``{"error": line}`` or ``{"too_large": n}``; its
parent kills it when a render overruns its time. Its address space is capped at what it had
after the imports plus ``memory_bytes``, so a template that builds an enormous text fails here
(MemoryError) instead of in the server; a text longer than ``max_chars`` is not sent back.

Run by path, not as ``-m dflash_trt.serve...``: the package's ``__init__`` imports torch, which
this process never needs (start-up 0.7 s instead of seconds).
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sys
import threading
import time
from multiprocessing.connection import Connection


def _die_with_parent() -> None:
    """End this process when the server is gone, even in the middle of a render (a thread: the
    interpreter switches to it inside a looping template too; PR_SET_PDEATHSIG would fire when
    the server's thread that started this process ends, not the server)."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def _cap_memory(budget: int) -> None:
    """Address space: what the imports took plus ``budget`` bytes."""
    try:
        with open("/proc/self/status") as f:
            vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
        resource.setrlimit(resource.RLIMIT_AS, (vm + budget, vm + budget))
    except (OSError, ValueError, StopIteration):
        pass


def _render(render, template: str, special: dict, request: dict, max_chars: int) -> dict:
    try:
        rendered, _ = render(
            conversations=[request["messages"]],
            chat_template=template,
            add_generation_prompt=request["add_generation_prompt"],
            **special,
        )
    except MemoryError:
        return {"too_large": None}
    except Exception as exc:  # jinja errors, raise_exception() in the template, sandbox refusals
        return {"error": f"{type(exc).__name__}: {exc}"[:300]}
    text = rendered[0]
    return {"too_large": len(text)} if len(text) > max_chars else {"ok": text}


def main(fd: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when this process ends
    _die_with_parent()
    conn = Connection(fd)
    setup = json.loads(conn.recv_bytes())
    # imported once the parent watch runs: a server gone during this slow import ends this process
    from transformers.utils.chat_template_utils import render_jinja_template  # start-up: transformers

    _cap_memory(int(setup["memory_bytes"]))
    conn.send_bytes(b'{"ready": true}')
    while True:
        try:
            request = json.loads(conn.recv_bytes())
        except EOFError:
            return
        reply = _render(render_jinja_template, setup["template"], setup["special"], request, setup["max_chars"])
        try:
            conn.send_bytes(json.dumps(reply).encode())
        except MemoryError:
            conn.send_bytes(b'{"too_large": null}')


if __name__ == "__main__":
    main(int(sys.argv[1]))
