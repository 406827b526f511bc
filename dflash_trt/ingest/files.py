"""What is on disk, checked before anything is loaded: safetensors headers, shard indexes, hashes.

A safetensors file is ``u64 header length | JSON header | raw tensor bytes``. Reading the
header costs a few kB whatever the model size, so every check here (truncated or corrupt
files, missing shards, tensor shapes and dtypes) works on 120B checkpoints as well as on
tiny ones, and never loads a tensor.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass, field
from pathlib import Path

from dflash_trt.errors import CheckpointError

INDEX_NAME = "model.safetensors.index.json"
PICKLED_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
MAX_HEADER_BYTES = 100 * 1024 * 1024  # the format's own limit

# safetensors dtype name -> bits per element
DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E4M3": 8, "F8_E5M2": 8, "F8_E8M0": 8, "F4": 4,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32, "I64": 64, "U64": 64, "F64": 64,
}
TORCH_NAMES = {"F16": "float16", "BF16": "bfloat16", "F32": "float32", "F64": "float64",
               "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "U8": "uint8", "I8": "int8",
               "I32": "int32", "I64": "int64", "BOOL": "bool"}
FLOAT_DTYPES = {"F16", "BF16", "F32", "F64"}


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as its file's header describes it."""

    dtype: str
    shape: tuple[int, ...]
    file: str
    nbytes: int

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


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


def read_header(path: Path) -> dict[str, TensorInfo]:
    """Parse and check one safetensors header against the file's real size."""
    name = path.name
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise CheckpointError(f"{path}: truncated safetensors file ({size} bytes, no header); "
                                      "download it again")
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER_BYTES or 8 + n > size:
                raise CheckpointError(f"{path}: corrupt or truncated safetensors header (claims {n} bytes, "
                                      f"file has {size}); download it again")
            raw = f.read(n)
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    try:
        header = json.loads(raw.decode("utf-8"))
        if not isinstance(header, dict):
            raise ValueError("header is not a JSON object")
    except (UnicodeDecodeError, ValueError) as exc:
        raise CheckpointError(f"{path}: corrupt safetensors header ({exc}); download it again") from exc
    header.pop("__metadata__", None)
    data = size - 8 - n
    tensors: dict[str, TensorInfo] = {}
    end_max = 0
    for tname, info in header.items():
        try:
            dtype, shape, (begin, end) = info["dtype"], tuple(int(d) for d in info["shape"]), info["data_offsets"]
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"{path}: corrupt safetensors header entry for {tname!r}") from exc
        if dtype not in DTYPE_BITS:
            raise CheckpointError(f"{path}: tensor {tname} has unknown dtype {dtype!r}")
        numel = 1
        for d in shape:
            numel *= d
        want = (numel * DTYPE_BITS[dtype] + 7) // 8
        if not 0 <= begin <= end or end - begin != want:
            raise CheckpointError(f"{path}: tensor {tname} {dtype}{list(shape)} should take {want} bytes, "
                                  f"the header gives {end - begin}; the file is corrupt")
        end_max = max(end_max, end)
        tensors[tname] = TensorInfo(dtype, shape, name, end - begin)
    if end_max > data:
        raise CheckpointError(f"{path}: truncated safetensors file ({data} data bytes, tensors need "
                              f"{end_max}); download it again")
    return tensors


def scan(root: Path, require: bool = True, what: str = "checkpoint") -> WeightSet:
    """Check every safetensors file (and the shard index, if any) of ``root``.

    ``require=False`` accepts a directory with configs only (planning, dry runs): the
    result then has ``present == False``. Pickled weights alone are always refused.
    """
    ws = WeightSet(root)
    ws.pickled = sorted(p for p in root.iterdir() if p.suffix in PICKLED_SUFFIXES and p.is_file())
    index_path = root / INDEX_NAME
    index = None
    if index_path.exists():
        try:
            index = json.loads(index_path.read_text())
            weight_map = index["weight_map"]
            if not isinstance(weight_map, dict):
                raise TypeError
        except (ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{index_path}: corrupt shard index (no weight_map); download it again") from exc
        shards = sorted(set(weight_map.values()))
        missing = [s for s in shards if not (root / s).is_file()]
        if missing and (require or len(missing) < len(shards)):
            raise CheckpointError(f"{root}: shard {missing[0]} listed in {INDEX_NAME} is missing "
                                  f"({len(missing)} of {len(shards)} missing); download the checkpoint again")
        if missing:  # config-only directory that kept its index
            ws.warnings.append(f"{what}: weights absent ({len(shards)} shards listed in {INDEX_NAME})")
            return ws
        files = [root / s for s in shards]
    else:
        files = sorted(root.glob("*.safetensors"))
    if not files:
        if ws.pickled:
            raise CheckpointError(f"{root}: only pickled weights ({ws.pickled[0].name}); dflash-trt loads "
                                  "safetensors only (never pickle): use the safetensors revision of this model")
        if require:
            raise CheckpointError(f"{root}: no .safetensors weights in this {what} directory")
        ws.warnings.append(f"{what}: weights absent (config only)")
        return ws
    for f in files:
        for tname, info in read_header(f).items():
            if tname in ws.tensors:
                raise CheckpointError(f"{root}: tensor {tname} appears in both {ws.tensors[tname].file} and "
                                      f"{info.file}; the checkpoint is inconsistent")
            ws.tensors[tname] = info
    ws.files = files
    if index is not None:
        for tname, shard in weight_map.items():
            got = ws.tensors.get(tname)
            if got is None or got.file != Path(shard).name:
                raise CheckpointError(f"{root}: {INDEX_NAME} puts {tname} in {shard}, which does not hold it; "
                                      "the shards are from different revisions: download again")
        total = (index.get("metadata") or {}).get("total_size")
        have = sum(t.nbytes for t in ws.tensors.values())
        if isinstance(total, int) and total != have:
            ws.warnings.append(f"{what}: {INDEX_NAME} total_size {total} != {have} bytes of tensors found")
    if ws.pickled:
        ws.warnings.append(f"{what}: ignoring pickled files {[p.name for p in ws.pickled][:3]} (safetensors used)")
    return ws


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
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
