"""Hugging Face Hub references (``org/name[@revision]``) to local snapshot directories.

Only what dflash-trt reads is fetched: configs, tokenizer files and safetensors weights.
Pickled weights (``.bin``, ``.pt``) and Python files are never downloaded, so nothing from
a checkpoint can execute. The cache, ``HF_TOKEN`` and ``HF_HUB_OFFLINE`` are
huggingface_hub's own; the environment is read at call time, not at import.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import socket
import threading
from pathlib import Path
from urllib.parse import urlsplit

from dflash_trt.errors import CheckpointError

ALLOW_PATTERNS = ["*.json", "*.safetensors", "*.model", "*.tiktoken", "*.txt", "*.jinja"]
# What planning reads (configs, quantization config, tokenizer and chat template): no weights.
CONFIG_PATTERNS = ["*.json", "*.model", "*.tiktoken", "*.txt", "*.jinja"]
_SHORT_SHA = re.compile(r"^[0-9a-f]{7,39}$")
IGNORE_PATTERNS = [
    "*.bin",
    "*.pt",
    "*.pth",
    "*.ckpt",
    "*.pkl",
    "*.py",
    "*.pyc",
    "*.msgpack",
    "*.h5",
    "*.gguf",
    "*.onnx",
    "*.tflite",
    "*.ot",
]

_HUB_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:@(?P<rev>[\w./-]+))?$")


def parse_hub_id(ref: str) -> tuple[str, str | None] | None:
    """``(repo_id, revision)`` if ``ref`` reads as a hub id, else None."""
    if ref.startswith(("/", ".", "~")):
        return None
    m = _HUB_ID.match(ref)
    if m is None:
        return None
    return m.group("repo"), m.group("rev")


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}


PROBE_SECONDS = 3.0
_PROXY_VARS = ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy", "HTTP_PROXY", "http_proxy")


@functools.cache
def reachable() -> bool:
    """Whether the hub endpoint (``HF_ENDPOINT``) answers a TCP connection within
    :data:`PROBE_SECONDS`, asked once per process. Without it, huggingface_hub retries an
    unresolvable host with back-off for about 25 s (and prints each retry) before it falls back
    to the cache; with it, a machine without network goes straight to the cache. Behind a proxy
    the endpoint cannot be probed directly: assumed reachable."""
    if any(os.environ.get(v) for v in _PROXY_VARS):
        return True
    url = urlsplit(_endpoint())
    host, port = url.hostname, url.port or (443 if url.scheme == "https" else 80)
    if not host:
        return True
    result: list[bool] = []

    def probe() -> None:  # getaddrinfo ignores socket timeouts: the thread's join bounds it
        try:
            socket.create_connection((host, port), timeout=PROBE_SECONDS).close()
            result.append(True)
        except OSError:
            result.append(False)

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(PROBE_SECONDS)
    return bool(result and result[0])


def _endpoint() -> str:
    from huggingface_hub import constants  # start-up: huggingface_hub

    return str(constants.ENDPOINT)


def _cache_dir() -> str | None:
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    if os.environ.get("HF_HOME"):
        return str(Path(os.environ["HF_HOME"]) / "hub")
    return None


def _repo_folder(repo_id: str) -> Path:
    from huggingface_hub import constants  # start-up: huggingface_hub

    return Path(_cache_dir() or constants.HF_HUB_CACHE) / ("models--" + repo_id.replace("/", "--"))


def expand_revision(repo_id: str, revision: str | None) -> str | None:
    """A short commit prefix (7-39 hex digits, as recipes and model cards quote them) -> the full
    commit of the one cached snapshot, or of a ``refs/`` entry, that starts with it; anything else
    as given. Online, huggingface_hub resolves a prefix the cache does not hold through the hub;
    offline, ``snapshot_download`` only matches a full hash or a ref name, hence this lookup."""
    if not revision or not _SHORT_SHA.match(revision):
        return revision
    folder = _repo_folder(repo_id)
    found = {p.name for p in (folder / "snapshots").glob(f"{revision}*") if p.is_dir()}
    refs = folder / "refs"
    for ref in refs.rglob("*") if refs.is_dir() else ():
        if ref.is_file():
            sha = ref.read_text().strip()
            if sha.startswith(revision):
                found.add(sha)
    return found.pop() if len(found) == 1 else revision


def _check_disk(repo_id: str, revision: str | None, ref: str, role: str, expected_bytes: int | None) -> None:
    """Refuse, before any byte is fetched, a download the cache's disk cannot hold (a snapshot
    already in the cache needs nothing)."""
    from huggingface_hub import constants, snapshot_download  # start-up: huggingface_hub
    from huggingface_hub import errors as hf_errors  # start-up: huggingface_hub

    if not expected_bytes or _offline():
        return
    try:
        snapshot_download(
            repo_id,
            revision=revision,
            cache_dir=_cache_dir(),
            local_files_only=True,
            allow_patterns=ALLOW_PATTERNS,
            ignore_patterns=IGNORE_PATTERNS,
        )
        return
    except (hf_errors.LocalEntryNotFoundError, OSError, ValueError):
        pass
    where = Path(_cache_dir() or constants.HF_HUB_CACHE)
    probe = where
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if free < expected_bytes:
        gib = 1 << 30
        raise CheckpointError(
            f"{role} {ref!r}: needs {expected_bytes / gib:.1f} GiB of disk, {free / gib:.1f} GiB "
            f"free in {where}; free space or point HF_HUB_CACHE elsewhere"
        )


def download(
    repo_id: str, revision: str | None, role: str, expected_bytes: int | None = None, configs_only: bool = False
) -> Path:
    """The local snapshot of ``repo_id`` (from the cache, downloading what is missing).
    ``expected_bytes`` (the checkpoint's size, when a recipe knows it) is checked against the
    cache's free disk space first. ``configs_only``: what planning reads, no weights."""
    from huggingface_hub import errors as hf_errors  # start-up: huggingface_hub
    from huggingface_hub import snapshot_download  # start-up: huggingface_hub

    ref = f"{repo_id}@{revision}" if revision else repo_id
    revision = expand_revision(repo_id, revision)
    if not configs_only:
        _check_disk(repo_id, revision, ref, role, expected_bytes)
    unreachable = not _offline() and not reachable()
    try:
        snapshot = snapshot_download(
            repo_id,
            revision=revision,
            cache_dir=_cache_dir(),
            local_files_only=_offline() or unreachable,
            allow_patterns=CONFIG_PATTERNS if configs_only else ALLOW_PATTERNS,
            ignore_patterns=IGNORE_PATTERNS,
        )
    except (hf_errors.LocalEntryNotFoundError, hf_errors.HfHubHTTPError, OSError, ValueError) as exc:
        raise _download_failure(exc, role, repo_id, ref, revision, unreachable) from exc
    path = Path(snapshot)
    if not (path / "config.json").exists():
        raise CheckpointError(f"{role} {ref!r}: the snapshot has no config.json; is this a model repository?")
    return path


def _download_failure(
    exc: Exception, role: str, repo_id: str, ref: str, revision: str | None, unreachable: bool
) -> CheckpointError:
    """The one line for a snapshot download that failed, by what the hub (or the cache) answered."""
    from huggingface_hub import errors as hf_errors  # start-up: huggingface_hub

    terms = f"https://huggingface.co/{repo_id}"
    if isinstance(exc, hf_errors.LocalEntryNotFoundError):
        host = urlsplit(_endpoint()).hostname
        why = (
            "HF_HUB_OFFLINE is set"
            if _offline()
            else f"the hub ({host}) is unreachable"
            if unreachable
            else "the hub is unreachable"
        )
        return CheckpointError(
            f"{role} {ref!r}: not in the local Hugging Face cache and {why}; download it once with network "
            "access (or unset HF_HUB_OFFLINE), or pass a local directory"
        )
    if isinstance(exc, hf_errors.GatedRepoError):
        return CheckpointError(
            f"{role} {ref!r}: gated repository; accept its terms at {terms} and set HF_TOKEN to a token of that account"
        )
    if isinstance(exc, hf_errors.RevisionNotFoundError):
        return CheckpointError(f"{role} {ref!r}: revision {revision!r} does not exist on the hub")
    if isinstance(exc, hf_errors.RepositoryNotFoundError):
        return CheckpointError(
            f"{role} {ref!r}: no such repository on the Hugging Face Hub (if it is private, set HF_TOKEN)"
        )
    if isinstance(exc, hf_errors.HfHubHTTPError):
        status = getattr(getattr(exc, "response", None), "status_code", None)
        if status in (401, 403):
            return CheckpointError(
                f"{role} {ref!r}: access denied (HTTP {status}); check HF_TOKEN, and accept the "
                f"terms at {terms} if the repository is gated"
            )
        return CheckpointError(f"{role} {ref!r}: hub error: {str(exc).splitlines()[0]}")
    why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    hint = "" if _offline() else "; set HF_HUB_OFFLINE=1 to use the cache only"
    return CheckpointError(f"{role} {ref!r}: cannot fetch from the hub ({why}){hint}")
