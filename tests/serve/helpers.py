"""A hand-made bundle for the serving tests: target + drafter (tests.helpers.save_pair), a chat
template on the tokenizer, ``trtllm/serve.sh`` and a minimal ``manifest.json`` (through
``ingest.Manifest``, as build writes it)."""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from dflash_trt.ingest import Manifest, write_manifest
from tests.helpers import save_pair

CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)

SERVE_SH = """#!/usr/bin/env bash
# trtllm-serve for this bundle; extra arguments ("$@") come last and override.
set -euo pipefail
DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
exec trtllm-serve "$DIR/../target" \\
    --config "$DIR/config.yaml" \\
    --host 0.0.0.0 --port 8000 \\
    "$@"
"""


def make_bundle(root: Path, name: str = "tiny-bundle", manifest_extra: dict | None = None) -> Path:
    from transformers import AutoTokenizer

    root.mkdir(parents=True, exist_ok=True)
    tdir, _ = save_pair(root)
    tok = AutoTokenizer.from_pretrained(tdir)
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(tdir)
    (root / "trtllm").mkdir()
    (root / "trtllm" / "config.yaml").write_text("speculative_config:\n  decoding_type: DFlash\n  max_draft_len: 7\n")
    sh = root / "trtllm" / "serve.sh"
    sh.write_text(SERVE_SH)
    sh.chmod(sh.stat().st_mode | stat.S_IEXEC)
    manifest = {"name": name, "serve": {"gpus_per_node": 8}}
    manifest.update(manifest_extra or {})
    write_manifest(root, Manifest(**manifest))
    return root


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def subprocess_env() -> dict:
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])  # the repository: tests.* importable
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    return env


@contextlib.contextmanager
def served(bundle: Path, *flags: str, wait_s: float = 120) -> Iterator[tuple[subprocess.Popen, str]]:
    """``dflash-trt serve BUNDLE --server embedded FLAGS`` in a subprocess, once ``/health`` says
    200: ``(process, base url)``; killed on the way out if still running."""
    import httpx

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "dflash_trt", "serve", str(bundle), "--server", "embedded", "--port", str(port), *flags],
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + wait_s
        while True:
            assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else "exited"
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.time() < deadline, "the server did not come up"
            time.sleep(0.2)
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
