"""One read: ``build tiny`` (dry run and real) opens each model's ``config.json`` and safetensors
file once to read it (``ingest.read_pair``); later stages take the ``PairSpec``. Byte-level passes
are not reads of what a file says and are left out of the count: the copy into the bundle and the
sha256 of every input (the manifest's), and transformers' own tokenizer loader (the tokenizer
probe, which opens config.json to pick the tokenizer class). Loading the weights goes through
safetensors' native reader (not Python's ``open``)."""

from __future__ import annotations

import builtins
import io
import traceback
from collections import Counter
from pathlib import Path

import pytest

from dflash_trt import ingest
from dflash_trt.cli import run

TINY = ingest.embedded_dir("tiny").resolve()
WATCHED = {f"{role}/{name}" for role in ("target", "drafter") for name in ("config.json", "model.safetensors")}
BYTES_ONLY = ("shutil.py", "hashlib", "files.py:sha256", "ingest/tokenizer.py")


@pytest.fixture()
def reads(monkeypatch):
    """{role/file: opens that read it}, counted on every ``open`` in the process."""
    counts: Counter[str] = Counter()
    real = io.open

    def counting(file, *args, **kwargs):
        try:
            rel = Path(file).resolve().relative_to(TINY).as_posix()
        except (TypeError, ValueError, OSError):
            rel = None
        if rel in WATCHED:
            stack = [f"{f.filename}:{f.name}" for f in traceback.extract_stack()]
            if not any(marker in frame for frame in stack for marker in BYTES_ONLY):
                counts[rel] += 1
        return real(file, *args, **kwargs)

    monkeypatch.setattr(io, "open", counting)
    monkeypatch.setattr(builtins, "open", counting)
    return counts


def test_dry_run_reads_each_config_and_header_once(reads, capsys):
    assert run(["build", "tiny", "--dry-run"]) == 0
    assert dict(reads) == dict.fromkeys(WATCHED, 1)


def test_build_reads_each_config_and_header_once(reads, tmp_path, capsys):
    assert run(["build", "tiny", "-o", str(tmp_path / "b")]) == 0
    assert dict(reads) == dict.fromkeys(WATCHED, 1)
    assert ingest.check_bundle(tmp_path / "b").manifest.plan.tp == 1
