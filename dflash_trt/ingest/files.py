"""What is on disk, checked before anything is loaded: safetensors headers, shard indexes, hashes.

A safetensors file is ``u64 header length | JSON header | raw tensor bytes``. Reading the
header costs a few kB whatever the model size, so every check here (truncated or corrupt
files, missing shards, tensor shapes and dtypes) works on 120B checkpoints as well as on
tiny ones, and never loads a tensor.

Also the tables every stage shares: the one dtype table (safetensors name -> bits, torch
name) and the one list of tokenizer files.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import stat
import struct
from dataclasses import dataclass, field
from pathlib import Path

from dflash_trt.errors import CheckpointError

INDEX_NAME = "model.safetensors.index.json"
PICKLED_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
MAX_HEADER_BYTES = 100 * 1024 * 1024  # the format's own limit

# The one dtype table: safetensors dtype -> (bits per element, torch dtype name or None).
# The names are the safetensors format's own (huggingface/safetensors, ``Dtype`` in
# safetensors/src/tensor.rs); F4 packs two elements per byte.
DTYPES: dict[str, tuple[int, str | None]] = {
    "F32": (32, "float32"),
    "BF16": (16, "bfloat16"),
    "F16": (16, "float16"),
    "F64": (64, "float64"),
    "F8_E4M3": (8, "float8_e4m3fn"),
    "F8_E5M2": (8, "float8_e5m2"),
    "F8_E8M0": (8, None),
    "F4": (4, None),
    "BOOL": (8, "bool"),
    "U8": (8, "uint8"),
    "I8": (8, "int8"),
    "I16": (16, "int16"),
    "U16": (16, None),
    "I32": (32, "int32"),
    "U32": (32, None),
    "I64": (64, "int64"),
    "U64": (64, None),
}
# The torch dtypes the reference runtime computes in (``--dtype``), in the order the CLI lists them.
RUNTIME_DTYPES = ("float32", "bfloat16", "float16", "float64")
DTYPE_BITS = {name: bits for name, (bits, _) in DTYPES.items()}
TORCH_NAMES = {name: torch for name, (_, torch) in DTYPES.items() if torch}
FLOAT_DTYPES = frozenset(name for name, torch in TORCH_NAMES.items() if torch in RUNTIME_DTYPES)

# What a tokenizer is made of (Hugging Face tokenizers, sentencepiece, BPE vocab/merges, chat
# template), plus any ``*.tiktoken``: the files listed for a target and copied into a bundle.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "spiece.model",
    "chat_template.jinja",
)
TOKENIZER_SUFFIXES = (".tiktoken",)


def torch_dtype(name: str | None):
    """``torch.<name>`` for one of :data:`RUNTIME_DTYPES`; None for any other name (torch imported on use)."""
    if name not in RUNTIME_DTYPES:
        return None
    import torch  # start-up: torch

    return getattr(torch, name)


def tokenizer_files(directory: Path) -> list[str]:
    """The tokenizer files in ``directory`` (names, sorted); empty when it has no tokenizer."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return sorted(
        p.name
        for p in directory.iterdir()
        if p.is_file() and (p.name in TOKENIZER_FILES or p.suffix in TOKENIZER_SUFFIXES)
    )


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as its file's header describes it."""

    dtype: str
    shape: tuple[int, ...]
    file: str
    nbytes: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass
class WeightSet:
    """Every safetensors file of a checkpoint directory, validated header by header."""

    root: Path
    files: list[Path] = field(default_factory=list)
    tensors: dict[str, TensorInfo] = field(default_factory=dict)
    pickled: list[Path] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def present(self) -> bool:
        return bool(self.files)

    @property
    def bytes_on_disk(self) -> int:
        return sum(f.stat().st_size for f in self.files)

    def dtypes(self) -> dict[str, int]:
        """Element count per dtype (what the weights are stored as)."""
        out: dict[str, int] = {}
        for t in self.tensors.values():
            out[t.dtype] = out.get(t.dtype, 0) + t.numel
        return out


def check_regular(path: Path) -> None:
    """Refuse a path that exists and is not a regular file: a FIFO, socket or device is never
    opened (a read from one can block forever). A missing path passes: its reader says so."""
    try:
        mode = Path(path).stat().st_mode
    except OSError:
        return
    if not stat.S_ISREG(mode):
        kinds = [(stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket")]
        kinds += [(stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device")]
        kind = next((k for is_kind, k in kinds if is_kind(mode)), "not a plain file")
        raise CheckpointError(f"{path}: is {kind}, not a regular file; dflash-trt reads only regular files")


def refuse_special(root: Path, what: str = "checkpoint") -> None:
    """Refuse a directory holding a FIFO, socket or device (tokenizer and weight readers would open
    it and hang); hidden entries (caches) are skipped. Symlinks are judged by their target."""
    root = Path(root)
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = [n for n in dirnames if not n.startswith(".")]
        for n in filenames:
            if not n.startswith("."):
                p = Path(dirpath) / n
                try:
                    mode = p.stat().st_mode
                except OSError:
                    continue  # a dangling symlink: whoever needs the file says it is missing
                if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                    check_regular(p)


def read_header(path: Path) -> dict[str, TensorInfo]:
    """Parse and check one safetensors header against the file's real size."""
    name = path.name
    check_regular(path)
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise CheckpointError(
                    f"{path}: truncated safetensors file ({size} bytes, no header); download it again"
                )
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER_BYTES or 8 + n > size:
                raise CheckpointError(
                    f"{path}: corrupt or truncated safetensors header (claims {n} bytes, "
                    f"file has {size}); download it again"
                )
            raw = f.read(n)
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    try:
        header = json.loads(raw.decode("utf-8"))
        if not isinstance(header, dict):
            raise ValueError("header is not a JSON object")
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise CheckpointError(f"{path}: corrupt safetensors header ({exc}); download it again") from exc
    header.pop("__metadata__", None)
    data = size - 8 - n
    tensors: dict[str, TensorInfo] = {}
    end_max = 0
    spans = []
    for tname, info in header.items():
        dtype, shape, begin, end = _entry(path, tname, info)
        want = (math.prod(shape) * DTYPE_BITS[dtype] + 7) // 8
        if not 0 <= begin <= end or end - begin != want:
            raise CheckpointError(
                f"{path}: tensor {tname} {dtype}{list(shape)} should take {want} bytes, "
                f"the header gives {end - begin}; the file is corrupt"
            )
        end_max = max(end_max, end)
        spans.append((begin, end, tname))
        tensors[tname] = TensorInfo(dtype, shape, name, end - begin)
    _check_disjoint(path, spans)
    if end_max > data:
        raise CheckpointError(
            f"{path}: truncated safetensors file ({data} data bytes, tensors need {end_max}); download it again"
        )
    return tensors


def _entry(path: Path, tname: str, info) -> tuple[str, tuple[int, ...], int, int]:
    """One header entry's (dtype, shape, begin, end), each of the type the format defines."""
    ok = (
        isinstance(info, dict)
        and isinstance(info.get("dtype"), str)
        and isinstance(info.get("shape"), list)
        and isinstance(info.get("data_offsets"), list)
        and len(info["data_offsets"]) == 2
    )
    ints = lambda xs: all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in xs)  # noqa: E731
    if not ok or not ints(info["shape"]) or not ints(info["data_offsets"]):
        raise CheckpointError(
            f"{path}: corrupt safetensors header entry for {tname!r} (dtype, shape and "
            "data_offsets must be a string, a list of sizes and two byte offsets)"
        )
    if info["dtype"] not in DTYPE_BITS:
        raise CheckpointError(f"{path}: tensor {tname} has unknown dtype {info['dtype']!r}")
    begin, end = info["data_offsets"]
    return info["dtype"], tuple(info["shape"]), begin, end


def _check_disjoint(path: Path, spans: list[tuple[int, int, str]]) -> None:
    """No two tensors share bytes (the format requires disjoint data_offsets)."""
    spans.sort()
    for (_b0, e0, n0), (b1, e1, n1) in zip(spans, spans[1:], strict=False):
        if b1 < e0 and e1 > b1:
            raise CheckpointError(
                f"{path}: tensors {n0} and {n1} overlap in the file (bytes {b1}..{min(e0, e1)}); the file is corrupt"
            )


def read_headers(directory: Path) -> dict[str, TensorInfo]:
    """Every tensor of the ``*.safetensors`` files directly in ``directory`` (file by file,
    sorted; each checked by :func:`read_header`). Empty when there are none."""
    tensors: dict[str, TensorInfo] = {}
    for f in sorted(Path(directory).glob("*.safetensors")):
        tensors.update(read_header(f))
    return tensors


def _shard_names(index_path: Path, weight_map: dict) -> list[str]:
    """The index's shard file names: plain names of files beside the index, nothing else."""
    names = list(weight_map.values())
    bad = [s for s in names if not isinstance(s, str)]
    if bad:
        raise CheckpointError(f"{index_path}: corrupt shard index (weight_map value {bad[0]!r} is not a file name)")
    outside = next((s for s in names if Path(s).name != s or s in ("", ".", "..")), None)
    if outside is not None:
        raise CheckpointError(f"{index_path}: shard {outside!r} points outside the checkpoint directory; refused")
    return names


def scan(root: Path, require: bool = True, what: str = "checkpoint") -> WeightSet:
    """Check every safetensors file (and the shard index, if any) of ``root``.

    ``require=False`` accepts a directory with configs only (planning, dry runs): the
    result then has ``present == False``. Pickled weights alone are always refused.
    """
    ws = WeightSet(root)
    ws.pickled = sorted(p for p in root.iterdir() if p.suffix in PICKLED_SUFFIXES and p.is_file())
    index = _read_index(root / INDEX_NAME)
    if index is not None:
        shards = sorted(set(_shard_names(root / INDEX_NAME, index["weight_map"])))
        missing = [s for s in shards if not (root / s).is_file()]
        if missing and (require or len(missing) < len(shards)):
            raise CheckpointError(
                f"{root}: shard {missing[0]} listed in {INDEX_NAME} is missing "
                f"({len(missing)} of {len(shards)} missing); download the checkpoint again"
            )
        if missing:  # config-only directory that kept its index
            ws.warnings.append(f"{what}: weights absent ({len(shards)} shards listed in {INDEX_NAME})")
            return ws
        files = [root / s for s in shards]
    else:
        files = sorted(root.glob("*.safetensors"))
    if not files:
        if ws.pickled:
            raise CheckpointError(
                f"{root}: only pickled weights ({ws.pickled[0].name}); dflash-trt loads "
                "safetensors only (never pickle): use the safetensors revision of this model"
            )
        if require:
            raise CheckpointError(f"{root}: no .safetensors weights in this {what} directory")
        ws.warnings.append(f"{what}: weights absent (config only)")
        return ws
    _read_tensors(ws, files)
    if index is not None:
        _check_index(ws, index, what)
    if ws.pickled:
        ws.warnings.append(f"{what}: ignoring pickled files {[p.name for p in ws.pickled][:3]} (safetensors used)")
    return ws


def _read_index(index_path: Path) -> dict | None:
    """The shard index's JSON, None when there is none; one line when it has no ``weight_map`` object."""
    if not index_path.exists():
        return None
    try:
        index = json.loads(index_path.read_text())
        if not isinstance(index["weight_map"], dict):
            raise TypeError
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        raise CheckpointError(f"{index_path}: corrupt shard index (no weight_map); download it again") from exc
    return index


def _read_tensors(ws: WeightSet, files: list[Path]) -> None:
    """Every header of ``files`` into ``ws``; a tensor two files both hold is refused."""
    for f in files:
        for tname, info in read_header(f).items():
            if tname in ws.tensors:
                raise CheckpointError(
                    f"{ws.root}: tensor {tname} appears in both {ws.tensors[tname].file} and "
                    f"{info.file}; the checkpoint is inconsistent"
                )
            ws.tensors[tname] = info
    ws.files = files


def _check_index(ws: WeightSet, index: dict, what: str) -> None:
    """The index agrees with the headers: each tensor sits in the shard it names (a ``total_size`` off is a warning)."""
    for tname, shard in index["weight_map"].items():
        got = ws.tensors.get(tname)
        if got is None or got.file != Path(shard).name:
            raise CheckpointError(
                f"{ws.root}: {INDEX_NAME} puts {tname} in {shard}, which does not hold it; "
                "the shards are from different revisions: download again"
            )
    meta = index.get("metadata")
    total = meta.get("total_size") if isinstance(meta, dict) else None
    have = sum(t.nbytes for t in ws.tensors.values())
    if isinstance(total, int) and total != have:
        ws.warnings.append(f"{what}: {INDEX_NAME} total_size {total} != {have} bytes of tensors found")


def checkpoint_file(root: Path, path: Path) -> Path:
    """The real file behind ``path`` of checkpoint ``root``: ``path`` itself, or where its symlinks
    lead when that stays inside the checkpoint or its own store (for a Hugging Face cache snapshot,
    ``models--ORG--NAME/snapshots/REV``, that repository's ``blobs/``); one line otherwise, so a
    link planted in a checkpoint never brings another file into a bundle."""
    real, base = Path(path).resolve(), Path(root).resolve()
    stores = [base] + ([base.parent.parent / "blobs"] if base.parent.name == "snapshots" else [])
    if not any(s in real.parents for s in stores):
        raise CheckpointError(
            f"{path}: a symlink to {real}, outside the checkpoint {root} and its store; "
            "dflash-trt copies only the checkpoint's own files: replace the link by the file"
        )
    return real


def check_links(root: Path) -> None:
    """Every symlink in checkpoint ``root`` leads inside it or its own store (:func:`checkpoint_file`);
    one line naming the first that does not. Hidden entries (caches) are skipped."""
    root = Path(root)
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = [n for n in dirnames if not n.startswith(".")]
        for n in dirnames + filenames:
            p = Path(dirpath) / n
            if not n.startswith(".") and p.is_symlink():
                checkpoint_file(root, p)


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    check_regular(path)
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def sha256_files(root: str | Path) -> dict[str, str]:
    """sha256 of every file under ``root`` (relative POSIX path -> hex), hidden entries skipped.

    Symlinks (the Hugging Face cache's snapshot layout) are followed: the hash is the content's.
    """
    root = Path(root)
    out: dict[str, str] = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if any(part.startswith(".") for part in rel.parts) or not p.is_file():
            continue
        out[rel.as_posix()] = sha256_file(p)
    return out
