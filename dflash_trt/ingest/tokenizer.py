"""A tokenizer is checked by using it: it loads (no remote code) and round-trips a probe text.

``inspect`` says "tokenizer ok" and ``build`` ships a bundle only after :func:`probe` passes:
a garbage or mis-structured ``tokenizer.json`` otherwise passes the file-name check and fails
later, at ``generate`` or in the server. Invariant checked: every id of ``encode(PROBE)`` is in
the target's vocabulary and ``decode`` gives the probe back (whitespace aside: SentencePiece
tokenizers may add or fold a leading space). Results are cached per directory and file stamps.
"""

from __future__ import annotations

import functools
from pathlib import Path

from dflash_trt.ingest.files import tokenizer_files

PROBE = "Hello, world! 12345 the quick brown fox.\ndef f(x):\n    return x + 1\n"


def probe(path: str | Path, vocab_size: int | None = None) -> str | None:
    """None when the tokenizer in ``path`` loads and round-trips :data:`PROBE`; else why not (one line)."""
    path = Path(path)
    stamps = tuple((n, (path / n).stat().st_mtime_ns, (path / n).stat().st_size) for n in tokenizer_files(path))
    return _probe(str(path), stamps, vocab_size)


@functools.lru_cache(maxsize=32)
def _probe(path: str, stamps: tuple, vocab_size: int | None) -> str | None:
    import logging

    from transformers import AutoTokenizer

    quiet = logging.getLogger("transformers")
    level, quiet.level = quiet.level, logging.ERROR
    try:
        tok = AutoTokenizer.from_pretrained(path, trust_remote_code=False)
        ids = tok(PROBE, add_special_tokens=False)["input_ids"]
        text = str(tok.decode(ids, skip_special_tokens=True))
    except Exception as exc:  # noqa: BLE001 - any failure of a third-party parser is "does not load"
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        return f"{path}: the tokenizer does not load ({type(exc).__name__}: {first})"
    finally:
        quiet.level = level
    if not ids:
        return f"{path}: the tokenizer encodes a probe text to no tokens"
    bad = [i for i in ids if not isinstance(i, int) or i < 0 or (vocab_size is not None and i >= vocab_size)]
    if bad:
        return f"{path}: the tokenizer gives id {bad[0]}, outside the target's vocabulary of {vocab_size}"
    if "".join(text.split()) != "".join(PROBE.split()):
        return f"{path}: the tokenizer does not round-trip a probe text ({PROBE.strip()!r} came back as {text!r})"
    return None


def probe_light(path: str | Path, vocab_size: int | None = None) -> str | None:
    """:func:`probe` for a config-only read (plan, ``build --dry-run``): ``tokenizer.json`` parsed by
    the ``tokenizers`` library alone (no torch, no transformers) and a probe encoded inside the
    vocabulary; None when it passes or has no ``tokenizer.json``. The round trip, which needs the
    tokenizer_config's settings, is the full probe's, when the bundle is built."""
    f = Path(path) / "tokenizer.json"
    if not f.is_file():
        return None
    from tokenizers import Tokenizer

    try:
        tok = Tokenizer.from_file(str(f))
        ids = tok.encode(PROBE, add_special_tokens=False).ids
    except Exception as exc:  # noqa: BLE001 - any failure of the parser is "does not load"
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        return f"{path}: the tokenizer does not load ({type(exc).__name__}: {first})"
    if not ids:
        return f"{path}: the tokenizer encodes a probe text to no tokens"
    bad = [i for i in ids if i < 0 or (vocab_size is not None and i >= vocab_size)]
    if bad:
        return f"{path}: the tokenizer gives id {bad[0]}, outside the target's vocabulary of {vocab_size}"
    return None
