"""Regeneration: the target's own greedy responses to the training prompts.

Two sources, one result. By default the reference runtime regenerates in this process
(batched greedy decoding, ``regen_concurrency`` rows a batch; fine for small targets). With ``regen_endpoint`` any
OpenAI-compatible server does it (trtllm-serve, vLLM, SGLang, ``dflash-trt serve``): the
prompts are sent as token ids at temperature 0, ``regen_concurrency`` at a time per rank, and
the response ids are read back (``return_token_ids``; a server that sends only text has it
re-tokenized, and the metadata says so). Prompts are formatted here, chat template included,
so the server's own template never changes what the drafter is trained on.

Resumable: each rank appends every finished response to its journal,
``.train/regen-<rank>.jsonl`` (a header line with the prompts' fingerprint, then
``{"i": prompt index, "response": [ids], ...}`` per line, flushed as written), so a crash
loses only the work in flight; a rerun reads every journal with the same fingerprint (any
number of ranks wrote them) and regenerates only what is missing. With several ranks, rank r
regenerates prompts ``r, r + world, ...``; rank 0 then streams the journals, in prompt order,
into the shard folder ``regen/`` (:class:`~dflash_trt.train.data.ShardWriter`: at most one
shard of at most ``data.SHARD_BYTES`` held, never the set) and writes ``regen.json`` (the
held-out prompts, and how the set was made). An older single-file ``regen.safetensors`` is
still read.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

from dflash_trt import runtime, serve  # modules, read at call time as the function-level imports were
from dflash_trt.errors import DFlashError
from dflash_trt.model import Target
from dflash_trt.train import data as train_data
from dflash_trt.train.checkpoint import write_json
from dflash_trt.train.dist import Ranks
from dflash_trt.train.settings import DATA_FIELDS, Progress, TrainSettings

RUNTIME = "reference runtime"


def fingerprint(prompts: list[list[int]], gen_len: int) -> str:
    return hashlib.sha256(json.dumps([prompts, gen_len]).encode()).hexdigest()


class Journal:
    """One rank's append-only record of finished responses (see the module docstring)."""

    def __init__(self, work: Path, rank: int, prints: str):
        self.path, self.prints = work / f"regen-{rank}.jsonl", prints
        fresh = not self.path.exists() or _header(self.path) != prints
        self.file = self.path.open("w" if fresh else "a", encoding="utf-8")
        if fresh:
            self._write({"prompts": prints})
        self.synced = time.monotonic()

    @staticmethod
    def read_all(work: Path, prints: str) -> dict[int, tuple[Path, int]]:
        """Where every finished response in every journal written for these prompts is, by
        prompt index: (journal, byte offset of its line). The responses stay on disk."""
        done: dict[int, tuple[Path, int]] = {}
        for path in sorted(work.glob("regen-*.jsonl")):
            if _header(path) != prints:
                continue
            with path.open("rb") as f:
                f.readline()
                offset = f.tell()
                for line in f:
                    try:
                        i = int(json.loads(line)["i"])
                    except (json.JSONDecodeError, UnicodeDecodeError):  # the torn last line of a killed run
                        i = None
                    if i is not None:
                        done[i] = (path, offset)
                    offset += len(line)
        return done

    def add(self, i: int, response: list[int], source: str, retokenized: bool = False) -> None:
        self._write({"i": i, "response": response, "source": source, "retokenized": retokenized})
        if time.monotonic() - self.synced > 5.0:  # flushed each line (a crash keeps it); on disk every 5 s
            os.fsync(self.file.fileno())
            self.synced = time.monotonic()

    def _write(self, obj: dict) -> None:
        self.file.write(json.dumps(obj) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()


def _header(path: Path) -> str | None:
    try:
        with path.open(encoding="utf-8") as f:
            return json.loads(f.readline()).get("prompts")
    except (OSError, ValueError, AttributeError):
        return None


def regenerate_local(
    target: Target,
    prompts: dict[int, list[int]],
    *,
    gen_len: int,
    stops: list[int],
    on_done: Callable[[int, list[int]], None],
    batch_size: int = 32,
) -> None:
    """The target's greedy continuation of every prompt (batched reference runtime)."""
    keys = list(prompts)
    for k in range(0, len(keys), batch_size):
        batch = keys[k : k + batch_size]
        gen = runtime.generate(
            target, None, [prompts[i] for i in batch], max_new_tokens=gen_len, block_size=1, stop_token_ids=stops
        )
        for i, ids in zip(batch, gen.token_ids, strict=True):
            on_done(i, list(ids))


def response_ids(completion, tokenizer, stops: list[int]) -> tuple[list[int], bool]:
    """(response ids, re-tokenized?) of a server's completion, cut after its first stop token.

    A completion that stopped on a stop token but does not carry it (text only, or a server
    that drops it) gets the tokenizer's eos back, as the reference runtime keeps it.
    """
    retok = completion.token_ids is None
    ids = (
        list(completion.token_ids)
        if not retok
        else list(tokenizer(completion.text, add_special_tokens=False, verbose=False)["input_ids"])
    )
    cut = next((n for n, t in enumerate(ids) if t in stops), None)
    if cut is not None:
        ids = ids[: cut + 1]
    elif completion.finish_reason == "stop" and stops:
        eos = getattr(tokenizer, "eos_token_id", None)
        ids.append(eos if eos in stops else stops[0])
    return ids, retok


def regenerate_endpoint(
    url: str,
    prompts: dict[int, list[int]],
    *,
    gen_len: int,
    stops: list[int],
    tokenizer,
    on_done: Callable[[int, list[int], bool], None],
    model: str | None = None,
    concurrency: int = 32,
) -> str:
    """Every prompt's temperature-0 completion from the server at ``url``; returns its model name."""

    def done(i: int, completion) -> None:
        on_done(i, *response_ids(completion, tokenizer, stops))

    return serve.complete_all(url, prompts, gen_len, on_done=done, model=model, concurrency=concurrency)


def _source(s: TrainSettings) -> tuple[str, str | None]:
    """(what the journal records as the source, the model to ask the server for)."""
    if s.regen_endpoint is None:
        return RUNTIME, None

    model = serve.served_model(s.regen_endpoint, s.regen_model)
    return f"{s.regen_endpoint} (model {model})", model


def _regenerate_mine(
    s: TrainSettings,
    work: Path,
    train_prompts: list[list[int]],
    tokenizer,
    target: Target,
    stops: list[int],
    ranks: Ranks,
    progress: Progress,
) -> None:
    """This rank's share of the prompts that no journal holds yet, each journalled as it finishes."""
    prints = fingerprint(train_prompts, s.gen_len)
    done = Journal.read_all(work, prints)
    todo = {i: train_prompts[i] for i in ranks.mine(range(len(train_prompts))) if i not in done}
    if ranks.main:
        if done:
            progress.log(f"regeneration: {len(done)} of {len(train_prompts)} responses already done, resuming")
        progress.phase("regenerating responses with the target", len(train_prompts))
    if not todo:
        return
    count = [len(done)]
    source, model = _source(s)
    journal = Journal(work, ranks.rank, prints)

    def record(i: int, response: list[int], retokenized: bool = False) -> None:
        journal.add(i, response, source, retokenized)
        count[0] += ranks.world  # rank 0's view of the whole run
        if ranks.main:
            progress.advance(min(count[0], len(train_prompts)), {})

    try:
        if s.regen_endpoint is None:
            regenerate_local(
                target, todo, gen_len=s.gen_len, stops=stops, on_done=record, batch_size=s.regen_concurrency
            )
        else:
            regenerate_endpoint(
                s.regen_endpoint,
                todo,
                gen_len=s.gen_len,
                stops=stops,
                tokenizer=tokenizer,
                on_done=record,
                model=model,
                concurrency=s.regen_concurrency,
            )
    finally:
        journal.close()


def _assemble(
    train_prompts: list[list[int]], where: dict[int, tuple[Path, int]], folder: Path, budget: int | None = None
) -> tuple[train_data.Regenerated, dict]:
    """The sharded set from the journals (prompt + response per prompt, in prompt order).

    Streams: each response is read from its journal line (``where``: its file and offset) as
    its turn comes and handed to a :class:`~dflash_trt.train.data.ShardWriter`, so at most one
    shard's rows are held, never the set.
    """
    missing = [i for i in range(len(train_prompts)) if i not in where]
    if missing:
        raise DFlashError(
            f"regeneration is missing {len(missing)} responses (first: prompt {missing[0]}); rerun to finish it"
        )
    writer = train_data.ShardWriter(folder, budget)
    sources, retokenized, files = set(), 0, {}
    try:
        for i, prompt in enumerate(train_prompts):
            path, offset = where[i]
            f = files.get(path) or files.setdefault(path, path.open("rb"))
            f.seek(offset)
            row = json.loads(f.readline())
            writer.add(prompt + list(row["response"]), len(prompt))
            sources.add(str(row.get("source", RUNTIME)))
            retokenized += bool(row.get("retokenized"))
    finally:
        for f in files.values():
            f.close()
    info = {"sources": sorted(sources), "retokenized_responses": retokenized, "temperature": 0.0}
    return train_data.Regenerated.load(writer.close()), info


def set_path(work: Path) -> Path | None:
    """The finished set in ``work``: the shard folder, else an older single file, else None."""
    if (work / "regen" / "index.json").exists():
        return work / "regen"
    old = work / "regen.safetensors"  # written before sharding: still read as one shard
    return old if old.exists() else None


def cached_set(s: TrainSettings, work: Path) -> dict | None:
    """regen.json of a finished regeneration made with these data settings, else None."""
    mpath = work / "regen.json"
    if set_path(work) is None or not mpath.exists():
        return None
    saved = json.loads(mpath.read_text())
    defaults = {name: f.default for name, f in TrainSettings.model_fields.items()}
    made_with = {k: (saved.get("settings") or {}).get(k, defaults.get(k)) for k in DATA_FIELDS}  # older runs
    return saved if made_with == {k: getattr(s, k) for k in DATA_FIELDS} else None


def training_set(
    s: TrainSettings, work: Path, data, tokenizer, target: Target, stops: list[int], ranks: Ranks, progress: Progress
) -> tuple[train_data.Regenerated, dict]:
    """(the regenerated training set, its regen.json: held-out prompts and how the set was made)."""
    saved = cached_set(s, work)
    if saved is not None:
        path = set_path(work)
        progress.log(f"reusing {saved['sequences']} regenerated sequences from {path}")
        return train_data.Regenerated.load(path), saved
    prompts_text, texts = data
    chat = train_data.chat_record(tokenizer, prompts_text, chat_template=s.chat_template, thinking=s.thinking)
    prompts = train_data.build_prompts(
        tokenizer,
        prompts_text,
        texts,
        prompt_len=s.prompt_len,
        gen_len=s.gen_len,
        window_stride=s.window_stride,
        max_samples=s.samples + s.eval_prompts,
        seed=s.seed,
        chat_template=s.chat_template,
        thinking=s.thinking,
    )
    n_eval = min(s.eval_prompts, len(prompts) // 2)
    eval_ids, train_prompts = prompts[:n_eval], prompts[n_eval:]
    ranks.together(lambda: _regenerate_mine(s, work, train_prompts, tokenizer, target, stops, ranks, progress))

    def assemble() -> None:
        if not ranks.main:
            return
        where = Journal.read_all(work, fingerprint(train_prompts, s.gen_len))
        regen, info = _assemble(train_prompts, where, work / "regen")
        write_json(
            work / "regen.json",
            {
                "settings": {k: getattr(s, k) for k in DATA_FIELDS},
                "sequences": len(regen),
                "eval_prompts": eval_ids,
                "regeneration": {**info, "chat": chat},
            },
        )
        for journal in work.glob("regen-*.jsonl"):  # the shards hold it all now
            journal.unlink()
        (work / "regen.safetensors").unlink(missing_ok=True)  # an older set of other settings

    ranks.together(assemble)
    saved = cached_set(s, work)
    if saved is None:
        raise DFlashError(f"{work}: rank 0 did not write the regenerated set (is {work} shared by every node?)")
    return train_data.Regenerated.load(set_path(work)), saved
