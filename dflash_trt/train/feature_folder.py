"""The feature folder (``--feature-cache DIR``): the one on-disk contract for the target's hidden
states, its checks and its reading. Whoever wrote a folder (the reference runtime, ``features.py``;
a converter of a serving engine's capture, ``features.write_capture``), training reads it the same
way. ``DIR`` holds:

* ``features-<k:05d>.safetensors``, one per shard of consecutive sequences ``[a, b)``:
  ``hidden`` [tokens, n_tap*H] (bfloat16, float16 or float32: the target's precision), the real
  tokens of the shard's sequences back to back; ``offsets`` int64 [b - a + 1], where each
  sequence starts in ``hidden`` (``offsets[0] = 0``); ``tokens`` int64 [tokens], the token ids
  the rows belong to (optional for a converter; checked when present);
* ``cache.json``, written last (it marks the folder complete): ``format`` (1), ``producer``,
  ``layer_ids``, ``hidden_size`` H, ``dim`` = len(layer_ids) x H, ``dtype``, ``vocab_size`` and
  ``tokenizer_sha256`` (:func:`tokenizer_digest`), ``sequences`` N, ``shards`` [[a, b], ...],
  ``bytes``; ours add ``key`` (``features.cache_key``) and ``target``.

Layer ids are z-lab's: id i is the output of decoder layer i (``hidden_states[i + 1]`` of a
transformers forward with ``output_hidden_states``; layer 0's input, the embedding, has no id);
a row concatenates the tapped layers in ``layer_ids`` order. Token alignment: row t of a
sequence is the state at its token t (after reading tokens 0..t), for t = 0 .. length-1, over
prompt and response, no shift, no padding. Sequence j of the folder is sequence j of the
regenerated training set (``.train/regen/``), with its length and token ids.

Invariant: a folder is read (:class:`CachedFeatures`) only after :func:`check_folder` found it
matches the drafter's ``target_layer_ids``, the target's hidden size, the tokenizer and the
regenerated set (its lengths and, where stored, its token ids); a mismatch is one line and exit
code 2. Every step of every rank reads its rows from the shards (memory-mapped).
"""

from __future__ import annotations

import bisect
import hashlib
import json
from pathlib import Path

import torch
from safetensors import safe_open

from dflash_trt.errors import DFlashError
from dflash_trt.train.data import Regenerated

FORMAT = 1
FEATURE_DTYPES = ("bfloat16", "float16", "float32")


class CachedFeatures:
    """``target_hidden`` of a batch, read from a complete cache folder."""

    def __init__(self, folder: Path, table: dict):
        self.folder, self.starts = folder, [a for a, _ in table["shards"]]
        self.files = [safe_open(str(folder / shard_name(k)), "pt") for k in range(len(self.starts))]
        self.offsets = [f.get_tensor("offsets").tolist() for f in self.files]
        self.dim, self.dtype = int(table["dim"]), getattr(torch, table["dtype"])

    def __call__(self, idx: torch.Tensor, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(len(idx), tokens.shape[1], self.dim, dtype=self.dtype)
        for row, i in enumerate(idx.tolist()):
            k = bisect.bisect_right(self.starts, i) - 1
            j = i - self.starts[k]
            a, b = self.offsets[k][j], self.offsets[k][j + 1]
            out[row, : b - a] = self.files[k].get_slice("hidden")[a:b]
        return out.to(tokens.device)


def shard_name(k: int) -> str:
    """The file of shard ``k``."""
    return f"features-{k:05d}.safetensors"


def tokenizer_digest(tokenizer) -> str:
    """sha256 of the tokenizer's vocabulary (token -> id, sorted): two tokenizers with one digest
    map text to the same ids."""
    vocab = sorted(tokenizer.get_vocab().items())
    return hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()


def check_folder(
    folder: Path, table: dict, layer_ids: list[int], hidden_size: int, tokenizer, regen: Regenerated
) -> None:
    """The feature folder against the drafter, the tokenizer and the regenerated set (one line each)."""
    where = f"--feature-cache {folder}"
    theirs = table.get("layer_ids")
    if theirs is not None and list(theirs) != list(layer_ids):
        raise DFlashError(
            f"{where}: its features tap target layers {list(theirs)}, the drafter taps "
            f"{list(layer_ids)} (--target-layer-ids)"
        )
    if table.get("dtype") not in FEATURE_DTYPES:
        raise DFlashError(f"{where}: dtype {table.get('dtype')!r} is not one of {', '.join(FEATURE_DTYPES)}")
    if int(table.get("dim", -1)) != len(layer_ids) * hidden_size:
        raise DFlashError(
            f"{where}: rows of {table.get('dim')} values, the drafter reads {len(layer_ids)} layers "
            f"x hidden size {hidden_size} = {len(layer_ids) * hidden_size}"
        )
    if "tokenizer_sha256" in table and table["tokenizer_sha256"] != tokenizer_digest(tokenizer):
        raise DFlashError(f"{where}: made with another tokenizer (vocabulary digest differs from the target's)")
    if int(table.get("sequences", -1)) != len(regen):
        raise DFlashError(
            f"{where}: holds {table.get('sequences')} sequences, the regenerated set "
            f"{len(regen)}: the features of another target or data set"
        )
    _check_alignment(folder, table, regen)


def _check_alignment(folder: Path, table: dict, regen: Regenerated) -> None:
    """Every sequence's length (and token ids, where stored) equal the regenerated set's."""
    for k, (a, b) in enumerate(table["shards"]):
        with safe_open(str(folder / shard_name(k)), "pt") as f:
            if (
                f.get_slice("hidden").get_dtype()
                != {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}[table["dtype"]]
            ):
                raise DFlashError(f"--feature-cache {folder}: shard {k} is not {table['dtype']} as cache.json says")
            offsets = f.get_tensor("offsets")
            lengths = regen.lengths[a:b]
            bad = (offsets.diff() != lengths).nonzero()
            if len(offsets) != b - a + 1 or len(bad):
                first = a + (int(bad[0]) if len(bad) else 0)
                raise DFlashError(
                    f"--feature-cache {folder}: sequence {first}'s length differs from the regenerated "
                    "set's: the features of another target or data set"
                )
            if "tokens" in f.keys():
                ids = regen.rows(torch.arange(a, b), int(lengths.max()))
                want = torch.cat([row[:n] for row, n in zip(ids, lengths.tolist(), strict=True)])
                if not torch.equal(f.get_tensor("tokens"), want):
                    raise DFlashError(
                        f"--feature-cache {folder}: shard {k}'s token ids differ from the regenerated "
                        "set's: the features of another target or data set"
                    )
