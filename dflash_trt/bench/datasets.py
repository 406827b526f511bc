"""Prompt sets in the formats users bring, as one list of :class:`Prompt`.

Formats (``fmt="auto"`` tells them apart by their first record):

- ``jsonl``, the project's: one JSON object per line with a string ``prompt`` (or chat
  ``messages``: the last user turn is the prompt), optional ``category`` (or ``kind``) and
  ``max_tokens``;
- ``sharegpt``: a JSON list (or JSONL) of ``{"conversations": [{"from": "human", "value": ...},
  {"from": "gpt", "value": ...}, ...]}`` (``role``/``content`` also read), as ``vllm bench serve
  --dataset-name sharegpt`` reads it: the first human turn is the prompt, the reply after it
  sets the request's output length (in tokens where a tokenizer is given);
- ``text``: one prompt per line (``\\n`` inside a line stands for a newline); ``auto`` reads a
  file whose lines mix JSON objects and text lines each as it looks;
- ``hf:NAME[:SPLIT]``: a Hugging Face dataset through ``datasets.load_dataset`` (installed
  separately, imported only here; the column read is the first of ``prompt``, ``question``,
  ``instruction``, ``text``, ``conversations``; ``category``/``kind``/``subject`` as category).

Length controls: ``input_len`` cuts every prompt to that many tokens (the tokenizer's when
given, else whitespace-separated words); ``output_len`` sets every request's output length (else
a record's own, else the run's max tokens). ``seed`` shuffles the order (None keeps it);
``limit`` keeps the first that many after it.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, replace
from pathlib import Path

from dflash_trt.errors import DFlashError, read_text

FORMATS = ("auto", "jsonl", "sharegpt", "text")
CATEGORY_KEYS = ("category", "kind", "subject")
HF_COLUMNS = ("prompt", "question", "instruction", "text", "conversations")


@dataclass(frozen=True)
class Prompt:
    text: str
    category: str | None = None
    max_tokens: int | None = None  # this request's output length; None: the run's max tokens


def load(
    source: str | Path,
    fmt: str = "auto",
    *,
    input_len: int | None = None,
    output_len: int | None = None,
    seed: int | None = None,
    limit: int | None = None,
    tokenizer=None,
) -> list[Prompt]:
    """The prompts of ``source`` (a file, or ``hf:NAME[:SPLIT]``) with the length controls applied."""
    if fmt not in FORMATS:
        raise DFlashError(f"--dataset-format {fmt!r}: expected one of {', '.join(FORMATS)}")
    src = str(source)
    rows = _huggingface(src, tokenizer) if src.startswith("hf:") else _file(Path(src), fmt, tokenizer)
    if not rows:
        raise DFlashError(f"{src}: no prompts")
    if seed is not None:
        random.Random(seed).shuffle(rows)
    if limit is not None:
        rows = rows[:limit]
    if input_len is not None:
        rows = cut(rows, input_len, tokenizer)
    if output_len is not None:
        rows = [replace(p, max_tokens=output_len) for p in rows]
    return rows


def cut(rows: list[Prompt], n: int, tokenizer=None) -> list[Prompt]:
    """Every prompt cut to ``n`` tokens (``tokenizer``'s; None: whitespace-separated words)."""
    return [replace(p, text=_cut(p.text, n, tokenizer)) for p in rows]


def _cut(text: str, n: int, tokenizer) -> str:
    if tokenizer is not None:
        ids = tokenizer.encode(text, add_special_tokens=False)
        return text if len(ids) <= n else tokenizer.decode(ids[:n])
    words = text.split()
    return text if len(words) <= n else " ".join(words[:n])


def _file(path: Path, fmt: str, tokenizer) -> list[Prompt]:
    if not path.exists():
        raise DFlashError(f"prompts file {path} does not exist")
    text = read_text(path, "prompts file")
    head = text.lstrip()[:1]
    if fmt == "sharegpt" or (fmt == "auto" and (head == "[" or (head == "{" and _is_sharegpt(text)))):
        return _sharegpt(path, text, tokenizer)
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if fmt == "jsonl" or (fmt == "auto" and line.lstrip().startswith("{")):  # auto: JSONL and text lines mix
            rows.append(_record(_json(path, n, line), f"{path}:{n}"))
        else:
            rows.append(Prompt(line.replace("\\n", "\n")))
    return rows


def _json(path: Path, n: int, line: str):
    try:
        return json.loads(line)
    except json.JSONDecodeError as exc:
        raise DFlashError(f"{path}:{n}: invalid JSON: {exc.msg}") from None
    except RecursionError:
        raise DFlashError(f"{path}:{n}: JSON nested too deeply") from None


def _is_sharegpt(text: str) -> bool:
    first = next((line for line in text.splitlines() if line.strip()), "")
    try:
        obj = json.loads(first)
    except (json.JSONDecodeError, RecursionError):
        return False
    return isinstance(obj, dict) and ("conversations" in obj or "conversation" in obj)


def _valid(text: str, where: str) -> str:
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise DFlashError(f"{where}: the prompt is not valid text (a lone surrogate)") from None
    return text


def _category(obj: dict) -> str | None:
    v = next((obj[k] for k in CATEGORY_KEYS if obj.get(k) is not None), None)
    return None if v is None else str(v)


def _record(obj, where: str) -> Prompt:
    """A project JSONL record: ``prompt`` (or chat ``messages``), ``category``/``kind``, ``max_tokens``."""
    if isinstance(obj, dict) and not isinstance(obj.get("prompt"), str) and isinstance(obj.get("messages"), list):
        users = [m.get("content") for m in obj["messages"] if isinstance(m, dict) and m.get("role") == "user"]
        if users and isinstance(users[-1], str):
            obj = {**obj, "prompt": users[-1]}
    if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str):
        raise DFlashError(f"{where}: JSONL lines need a string 'prompt' field")
    mt = obj.get("max_tokens")
    if mt is not None and (isinstance(mt, bool) or not isinstance(mt, int) or mt < 1):
        raise DFlashError(f"{where}: max_tokens must be a positive integer, not {mt!r}")
    return Prompt(_valid(obj["prompt"], where), _category(obj), mt)


def _turns(obj) -> list[tuple[str, str]] | None:
    conv = obj.get("conversations", obj.get("conversation")) if isinstance(obj, dict) else None
    if not isinstance(conv, list):
        return None
    out = []
    for t in conv:
        if isinstance(t, dict):
            who, what = t.get("from", t.get("role")), t.get("value", t.get("content"))
            if isinstance(who, str) and isinstance(what, str):
                out.append(
                    (
                        "user"
                        if who in ("human", "user")
                        else "assistant"
                        if who in ("gpt", "assistant", "chatgpt", "bing")
                        else who,
                        what,
                    )
                )
    return out


def _conversation(obj, where: str, tokenizer) -> Prompt | None:
    """The first human turn (and the length of the reply after it), or None for a conversation
    without one (ShareGPT holds such records; vLLM skips them too)."""
    turns = _turns(obj)
    if turns is None:
        raise DFlashError(f"{where}: a ShareGPT record needs a 'conversations' list")
    first = next((i for i, (who, _) in enumerate(turns) if who == "user"), None)
    if first is None:
        return None
    reply = next((what for who, what in turns[first + 1 :] if who == "assistant"), None)
    out_len = None
    if reply and tokenizer is not None:
        out_len = max(1, len(tokenizer.encode(reply, add_special_tokens=False)))
    return Prompt(_valid(turns[first][1], where), _category(obj), out_len)


def _sharegpt(path: Path, text: str, tokenizer) -> list[Prompt]:
    if text.lstrip().startswith("["):
        try:
            records = json.loads(text)
        except (json.JSONDecodeError, RecursionError) as exc:
            raise DFlashError(f"{path}: invalid JSON ({getattr(exc, 'msg', 'nested too deeply')})") from None
        where = [f"{path}[{i}]" for i in range(len(records))]
    else:
        lines = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
        records, where = [_json(path, n, line) for n, line in lines], [f"{path}:{n}" for n, _ in lines]
    rows = [_conversation(r, w, tokenizer) for r, w in zip(records, where, strict=True)]
    return [r for r in rows if r is not None]


def _huggingface(src: str, tokenizer) -> list[Prompt]:
    """``hf:NAME[:SPLIT]`` through ``datasets`` (an optional package, imported here only)."""
    try:
        import datasets  # optional: only a Hugging Face dataset needs it
    except ImportError:
        raise DFlashError(
            f"{src}: reading a Hugging Face dataset needs the 'datasets' package (pip install datasets)"
        ) from None
    name, _, split = src[3:].partition(":")
    ds = datasets.load_dataset(name, split=split or "train")
    column = next((c for c in HF_COLUMNS if c in ds.column_names), None)
    if column is None:
        raise DFlashError(
            f"{src}: no prompt column (looked for {', '.join(HF_COLUMNS)}; has {', '.join(ds.column_names)})"
        )
    rows = []
    for i, row in enumerate(ds):
        where = f"{src}[{i}]"
        if column == "conversations":
            p = _conversation(row, where, tokenizer)
        elif isinstance(row[column], str):
            p = Prompt(_valid(row[column], where), _category(row))
        else:
            raise DFlashError(f"{where}: column {column!r} is not text")
        if p is not None:
            rows.append(p)
    return rows
