"""A tokenizer is judged by its own properties, never by how it treats a sentence we chose.

``inspect`` says "tokenizer ok" and ``build``, ``generate`` and the server start only after
:func:`probe` passes: a garbage or mis-structured ``tokenizer.json`` otherwise passes the file-name
check and fails later. The properties, each a defect when it fails:

1. it loads with ``trust_remote_code=False``;
2. every id of its vocabulary (added tokens included) is inside the target's vocabulary
   (``0 <= id < vocab_size``): an id outside would index past the embedding;
3. text decoded from ids of its own vocabulary re-encodes to the same text: a spread sample of
   its regular (non-special) ids is decoded in runs, ``t = decode(run)``, and ``decode(encode(t))``
   must equal ``t`` after the tokenizer's own normaliser, whitespace runs counted as one space.
   A run whose text encodes to the unknown token is text outside the vocabulary's reach (a
   WordPiece ``##`` piece at the start of a word, a word-level entry its pre-tokenizer splits):
   it is not judged, but some run must be, with some text.

Property 3 holds for every consistent tokenizer whatever its kind: byte-level BPE (a decode may
yield U+FFFD for a partial byte, which re-encodes to itself), SentencePiece with or without byte
fallback (a leading ``▁`` may add or drop a space), word-level (tokens are joined by spaces),
and normalising tokenizers (an upper-case entry of a lower-casing vocabulary comes back lower
case, which its normaliser makes equal). It fails for a decoder that does not invert its
pre-tokenizer (a byte-level vocabulary without its ByteLevel decoder, a Metaspace vocabulary
with a byte-level decoder), which would garble every reply. A run whose text spells a special
token is not judged either (the re-encode would read it as that token). No English sentence is demanded:
a word-level or domain vocabulary need not cover one. Results are cached per directory and stamps.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable
from pathlib import Path

from dflash_trt.ingest.files import tokenizer_files

SAMPLE = 512  # regular ids tried (all of them for a smaller vocabulary), spread over the vocabulary
RUN = 8  # consecutive sampled ids decoded together: tokens meet at their edges as in text


def probe(path: str | Path, vocab_size: int | None = None) -> str | None:
    """None when the tokenizer in ``path`` has the three properties (module docstring); else why not."""
    path = Path(path)
    stamps = tuple((n, (path / n).stat().st_mtime_ns, (path / n).stat().st_size) for n in tokenizer_files(path))
    return _probe(str(path), stamps, vocab_size)


@functools.lru_cache(maxsize=32)
def _probe(path: str, stamps: tuple, vocab_size: int | None) -> str | None:
    from transformers import AutoTokenizer  # start-up: transformers

    quiet = logging.getLogger("transformers")
    level, quiet.level = quiet.level, logging.ERROR
    try:
        tok = AutoTokenizer.from_pretrained(path, trust_remote_code=False)
        vocab = dict(tok.get_vocab())
        added = getattr(tok, "added_tokens_decoder", {}) or {}
        special = set(tok.all_special_ids) | {i for i, t in added.items() if getattr(t, "special", False)}
        normaliser = getattr(getattr(tok, "backend_tokenizer", None), "normalizer", None)
        return judge(
            path,
            vocab,
            special,
            vocab_size,
            encode=lambda s: list(tok(s, add_special_tokens=False)["input_ids"]),
            decode=lambda ids: str(tok.decode(ids, skip_special_tokens=True)),
            normalise=normaliser.normalize_str if normaliser is not None else None,
            unknown=tok.unk_token_id,
        )
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # noqa: BLE001 - any failure of the parser is "does not load" (a Rust
        return _does_not_load(path, exc)  # panic from tokenizers derives from BaseException only)
    finally:
        quiet.level = level


def probe_light(path: str | Path, vocab_size: int | None = None) -> str | None:
    """:func:`probe` for a config-only read (plan, ``build --dry-run``): ``tokenizer.json`` read by
    the ``tokenizers`` library alone (no torch, no transformers), judged by the same properties;
    None when it passes or there is no ``tokenizer.json``."""
    f = Path(path) / "tokenizer.json"
    if not f.is_file():
        return None
    from tokenizers import Tokenizer  # start-up: tokenizers

    try:
        tok = Tokenizer.from_file(str(f))
        vocab = tok.get_vocab(with_added_tokens=True)
        special = {i for i, t in tok.get_added_tokens_decoder().items() if t.special}
        return judge(
            str(path),
            vocab,
            special,
            vocab_size,
            encode=lambda s: tok.encode(s, add_special_tokens=False).ids,
            decode=lambda ids: tok.decode(ids, skip_special_tokens=True),
            normalise=tok.normalizer.normalize_str if tok.normalizer is not None else None,
            unknown=_unknown(tok),
        )
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # noqa: BLE001 - as in _probe: a Rust panic too is "does not load"
        return _does_not_load(str(path), exc)


def _unknown(tok) -> int | None:
    """The id of the model's unknown token (BPE, WordPiece, WordLevel: ``unk_token``; Unigram: ``unk_id``)."""
    model = json.loads(tok.to_str()).get("model") or {}
    if model.get("unk_id") is not None:
        return int(model["unk_id"])
    return tok.token_to_id(model["unk_token"]) if isinstance(model.get("unk_token"), str) else None


def _does_not_load(path: str, exc: BaseException) -> str:
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
    return f"{path}: the tokenizer does not load ({type(exc).__name__}: {first})"


def judge(
    path: str,
    vocab: dict[str, int],
    special: set[int],
    vocab_size: int | None,
    *,
    encode: Callable[[str], list[int]],
    decode: Callable[[list[int]], str],
    normalise: Callable[[str], str] | None,
    unknown: int | None,
) -> str | None:
    """Properties 2 and 3 of the module docstring on a loaded tokenizer; None, or why it fails."""
    for token, i in vocab.items():
        if not isinstance(i, int) or i < 0 or (vocab_size is not None and i >= vocab_size):
            return (
                f"{path}: the tokenizer's token {token!r} has id {i}, outside the target's vocabulary of {vocab_size}"
            )
    regular = sorted(set(vocab.values()) - special - {unknown})
    spells = [t for t, i in vocab.items() if (i in special or i == unknown) and t]

    def key(text: str) -> str:
        return " ".join((normalise(" ".join(text.split())) if normalise else text).split())

    step = max(1, len(regular) // SAMPLE)
    sample, judged = regular[::step][:SAMPLE], False
    for start in range(0, len(sample), RUN):
        text = decode(sample[start : start + RUN])
        if not text.strip() or any(s in text for s in spells):
            continue
        ids = encode(text)
        if not ids:
            return f"{path}: the tokenizer encodes the text of its own tokens ({text[:60]!r}) to no tokens"
        if unknown in ids:
            continue
        judged, back = True, decode(ids)
        if key(back) != key(text):
            return (
                f"{path}: the tokenizer does not re-encode the text of its own tokens: {text[:60]!r} "
                f"came back as {back[:60]!r} (its decoder does not invert its encoder)"
            )
    return None if judged else f"{path}: no text of the tokenizer's own tokens encodes back without the unknown token"
