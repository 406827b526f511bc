"""Target features (``target_hidden``): computed online at every step, or read from a feature folder.

Online (the default): each rank runs the frozen target over its rows of the batch, as the
paper's recipe must at scale (its cache would take tens of TB).

**The feature folder** (``--feature-cache DIR``; its contract, checks and reading are
``feature_folder.py``'s): the reference runtime writes it here (the default producer, once,
split between the ranks), and :func:`write_capture` writes it from a serving engine's capture
(TensorRT-LLM, vLLM, SGLang), converted. A folder of ours whose key (:func:`cache_key`: target
weights, taps, dtype, token ids) differs is refused, not overwritten.

The size is printed before the first shard is written; shards are renamed into place when
complete, so a full disk is a one-line error that leaves every finished shard, and the rerun
writes only the others.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import shutil
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from dflash_trt.errors import DFlashError
from dflash_trt.model import Target
from dflash_trt.train.checkpoint import write_json
from dflash_trt.train.data import Regenerated
from dflash_trt.train.dist import Ranks
from dflash_trt.train.feature_folder import FORMAT, CachedFeatures, check_folder, shard_name, tokenizer_digest
from dflash_trt.train.settings import Progress

logger = logging.getLogger(__name__)

FULL = {errno.ENOSPC, errno.EDQUOT}
PRODUCER = "dflash-trt reference runtime"


def target_hidden(target: Target, layer_ids: list[int], tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """[b, T, n_tap*H]: the target's tapped hidden states over right-padded ``tokens`` [b, T]."""
    with torch.no_grad():
        attn = (torch.arange(tokens.shape[1], device=tokens.device)[None] < lengths[:, None]).long()
        out = target.model(input_ids=tokens, attention_mask=attn, output_hidden_states=True, use_cache=False)
        return torch.cat([out.hidden_states[i + 1] for i in layer_ids], dim=-1)


class OnlineFeatures:
    """``target_hidden`` of a batch, from the target itself."""

    def __init__(self, target: Target, layer_ids: list[int]):
        self.target, self.layer_ids = target, list(layer_ids)

    def __call__(self, idx: torch.Tensor, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return target_hidden(self.target, self.layer_ids, tokens, lengths)


def cache_key(target: Target, layer_ids: list[int], regen: Regenerated) -> str:
    """What the features depend on: the target's config and weights (64 strided values of every
    tensor: two fine-tunes of one base differ there), the taps, the dtype, the token ids."""
    h = hashlib.sha256()
    h.update(json.dumps([target.config.to_json_string(), list(layer_ids), str(target.dtype)]).encode())
    for p in target.model.parameters():
        flat = p.detach().reshape(-1)
        h.update(flat[:: max(1, flat.numel() // 64)][:64].float().cpu().numpy().tobytes())
    width = int(regen.lengths.max())
    for a in range(0, len(regen), 1024):  # the token ids in chunks: the set stays on disk
        h.update(regen.rows(torch.arange(a, min(len(regen), a + 1024)), width).contiguous().numpy().tobytes())
    h.update(regen.lengths.contiguous().numpy().tobytes())
    return h.hexdigest()


def plan_shards(lengths: list[int], token_bytes: int, shard_mb: float) -> list[tuple[int, int]]:
    """Consecutive row ranges [a, b) of about ``shard_mb`` each (at least one sequence)."""
    limit, shards, start, size = shard_mb * 2**20, [], 0, 0
    for i, n in enumerate(lengths):
        if i > start and size + n * token_bytes > limit:
            shards.append((start, i))
            start, size = i, 0
        size += n * token_bytes
    shards.append((start, len(lengths)))
    return shards


def _finished(path: Path, key: str) -> bool:
    try:
        with safe_open(str(path), "pt") as f:
            return (f.metadata() or {}).get("key") == key
    except Exception:  # noqa: BLE001 - a torn or foreign file is simply not finished
        logger.debug("%s does not read back as a finished shard; it is redone", path, exc_info=True)
        return False


def _write_shard(
    folder: Path,
    k: int,
    rows: tuple[int, int],
    target: Target,
    layer_ids: list[int],
    regen: Regenerated,
    key: str,
    done_before: int,
    total: int,
    batch: int = 8,
) -> None:
    """Compute and write shard ``k`` (rows [a, b)) under a temporary name, then rename it."""
    a, b = rows
    parts, offsets, ids = [], [0], []
    for s in range(a, b, batch):
        lengths = regen.lengths[s : min(b, s + batch)]
        tokens = regen.rows(torch.arange(s, s + len(lengths)), int(lengths.max())).to(target.device)
        hidden = target_hidden(target, layer_ids, tokens, lengths.to(target.device)).cpu()
        for h, n in zip(hidden, lengths.tolist(), strict=True):
            parts.append(h[:n])
            offsets.append(offsets[-1] + n)
        ids.extend(t[:n] for t, n in zip(tokens.cpu(), lengths.tolist(), strict=True))
    tensors = {
        "hidden": torch.cat(parts).contiguous(),
        "offsets": torch.tensor(offsets),
        "tokens": torch.cat(ids).contiguous(),
    }
    path, tmp = folder / shard_name(k), folder / (shard_name(k) + ".tmp")
    try:
        save_file(tensors, str(tmp), metadata={"key": key, "rows": f"{a}:{b}"})
        tmp.replace(path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        why = "the disk is full" if exc.errno in FULL else f"cannot write {path.name} ({exc.strerror or exc})"
        raise DFlashError(
            f"--feature-cache {folder}: {why} after {done_before} of {total} shards; the finished "
            "shards stay: free space (or choose another folder) and rerun to write the rest"
        ) from None


def open_cache(
    folder: str | Path,
    target_ref: str,
    target: Target,
    layer_ids: list[int],
    regen: Regenerated,
    ranks: Ranks,
    progress: Progress,
    shard_mb: float = 1024.0,
    tokenizer=None,
) -> CachedFeatures:
    """The features for this target and set in ``folder``, checked; ours are written first where missing."""
    folder = Path(folder).expanduser()
    hidden = int(target.model.get_input_embeddings().weight.shape[1])
    table_path = folder / "cache.json"
    if table_path.exists():
        table = json.loads(table_path.read_text())
        check_folder(folder, table, layer_ids, hidden, tokenizer, regen)
        if table.get("producer", PRODUCER) == PRODUCER and table.get("key") != cache_key(target, layer_ids, regen):
            raise DFlashError(
                f"--feature-cache {folder} holds the features of another target or data set: "
                "choose another folder, or empty this one"
            )
        progress.log(
            f"reading the features in {folder} ({_human(table['bytes'])}, {len(table['shards'])} shards, "
            f"{table.get('producer', PRODUCER)})"
        )
        return CachedFeatures(folder, table)
    key = cache_key(target, layer_ids, regen)
    plan = ranks.together(lambda: _plan(folder, key, target, layer_ids, regen, ranks, progress, shard_mb))
    todo = plan.pop("todo")
    ranks.together(lambda: _write_mine(folder, key, target, layer_ids, regen, ranks, progress, plan, todo))

    def seal() -> None:
        if ranks.main:
            lost = [k for k in range(len(plan["shards"])) if not _finished(folder / shard_name(k), key)]
            if lost:
                raise DFlashError(
                    f"--feature-cache {folder}: shard {lost[0]} is missing after every rank wrote "
                    "its share; is the folder shared by every node?"
                )
            write_json(table_path, _our_table(key, target_ref, layer_ids, tokenizer, plan))

    ranks.together(seal)
    return CachedFeatures(folder, json.loads(table_path.read_text()))


def _our_table(key: str, target_ref: str, layer_ids: list[int], tokenizer, plan: dict) -> dict:
    """``cache.json`` of a folder the reference runtime wrote: the plan's shard table, with what made it."""
    return {
        "format": FORMAT,
        "producer": PRODUCER,
        "key": key,
        "target": target_ref,
        "layer_ids": list(layer_ids),
        "hidden_size": plan["dim"] // len(layer_ids),
        **(
            {} if tokenizer is None else {"vocab_size": len(tokenizer), "tokenizer_sha256": tokenizer_digest(tokenizer)}
        ),
        **plan,
    }


def _plan(
    folder: Path,
    key: str,
    target: Target,
    layer_ids: list[int],
    regen: Regenerated,
    ranks: Ranks,
    progress: Progress,
    shard_mb: float,
) -> dict:
    """The shard table of the cache (what cache.json will hold), the folder created, its size said."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DFlashError(f"--feature-cache {folder}: cannot create it ({exc.strerror or exc})") from None
    dim = len(layer_ids) * int(target.model.get_input_embeddings().weight.shape[1])
    token_bytes = dim * target.dtype.itemsize
    shards = plan_shards(regen.lengths.tolist(), token_bytes, shard_mb)
    total = int(regen.lengths.sum()) * token_bytes
    # Decided before any rank writes (together() returns only when every rank planned), so
    # every rank splits the same list.
    todo = [k for k in range(len(shards)) if not _finished(folder / shard_name(k), key)]
    if ranks.main:
        progress.log(
            f"feature cache: {_human(total)} in {len(shards)} shards to {folder} "
            f"({len(shards) - len(todo)} already written; {_human(shutil.disk_usage(folder).free)} free)"
        )
    return {
        "shards": shards,
        "dim": dim,
        "dtype": str(target.dtype).removeprefix("torch."),
        "bytes": total,
        "sequences": len(regen),
        "todo": todo,
    }


def _write_mine(
    folder: Path,
    key: str,
    target: Target,
    layer_ids: list[int],
    regen: Regenerated,
    ranks: Ranks,
    progress: Progress,
    plan: dict,
    todo: list[int],
) -> None:
    """This rank's share of the shards not written yet."""
    shards = plan["shards"]
    if ranks.main:
        progress.phase("caching target features", len(shards))
        progress.advance(len(shards) - len(todo), {})
    for n, k in enumerate(ranks.mine(todo)):
        _write_shard(
            folder, k, tuple(shards[k]), target, layer_ids, regen, key, len(shards) - len(todo) + n, len(shards)
        )
        if ranks.main:
            progress.advance(min(len(shards), len(shards) - len(todo) + (n + 1) * ranks.world), {})


def write_capture(
    folder: str | Path,
    sequences,
    *,
    layer_ids: list[int],
    hidden_size: int,
    tokenizer,
    producer: str,
    shard_mb: float = 1024.0,
) -> dict:
    """Write a feature folder from another producer's capture (a serving engine's hidden states,
    converted): ``sequences`` yields (token ids [n], hidden [n, len(layer_ids)*hidden_size]) in the
    regenerated set's order, rows aligned as the module docstring says. Shards are written as
    they fill (bounded memory), ``cache.json`` last; returns it."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    dim, limit = len(layer_ids) * hidden_size, shard_mb * 2**20
    shards, pending, start, n, dtype = [], [], 0, 0, None

    def flush() -> None:
        hidden = torch.cat([h for _, h in pending]).contiguous()
        offsets = torch.tensor([0] + [len(t) for t, _ in pending]).cumsum(0)
        save_file(
            {"hidden": hidden, "offsets": offsets, "tokens": torch.cat([t for t, _ in pending]).long()},
            str(folder / shard_name(len(shards))),
        )
        shards.append((start, start + len(pending)))

    for ids, hidden in sequences:
        if hidden.shape != (len(ids), dim):
            raise DFlashError(f"sequence {n}: hidden states {tuple(hidden.shape)}, expected ({len(ids)}, {dim})")
        dtype = dtype or hidden.dtype
        pending.append((torch.as_tensor(ids), hidden.to(dtype)))
        n += 1
        if sum(h.numel() for _, h in pending) * dtype.itemsize >= limit:
            flush()
            start, pending = n, []
    if pending:
        flush()
    table = {
        "format": FORMAT,
        "producer": producer,
        "layer_ids": list(layer_ids),
        "hidden_size": hidden_size,
        "dim": dim,
        "dtype": str(dtype).removeprefix("torch."),
        "vocab_size": len(tokenizer),
        "tokenizer_sha256": tokenizer_digest(tokenizer),
        "sequences": n,
        "shards": shards,
        "bytes": sum((folder / shard_name(k)).stat().st_size for k in range(len(shards))),
    }
    write_json(folder / "cache.json", table)
    return table


def _human(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    return f"{n:.1f} TB"
