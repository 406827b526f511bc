"""The one safetensors header reader, the one dtype table and the one tokenizer-file list cover
what the copies before them did: shapes and dtypes (the quantized-export check), byte counts
(planning), malformed files (ingest's checks), every tokenizer file a bundle got."""

from __future__ import annotations

import json
import struct

import pytest
import torch
from safetensors.torch import save_file

from dflash_trt import ingest
from dflash_trt.errors import CheckpointError, DFlashError
from dflash_trt.plan.model_shapes import TargetShape, safetensors_bytes
from dflash_trt.runtime import parse_dtype

TENSORS = {
    "a.f32": torch.zeros(3, 5, dtype=torch.float32),
    "b.bf16": torch.zeros(7, dtype=torch.bfloat16),
    "c.f16": torch.zeros(2, 2, 2, dtype=torch.float16),
    "d.fp8": torch.zeros(4, 16, dtype=torch.float8_e4m3fn),
    "e.u8": torch.zeros(4, 8, dtype=torch.uint8),
    "f.i64": torch.zeros(3, dtype=torch.int64),
    "g.bool": torch.zeros(5, dtype=torch.bool),
    "h.scalar": torch.tensor(1.5, dtype=torch.float32),
}


def _raw(path, header: dict, data: int) -> None:
    """A safetensors file by hand: u64 header length | JSON header | ``data`` zero bytes."""
    head = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(head)) + head + b"\0" * data)


def test_shapes_dtypes_and_bytes_of_every_tensor(tmp_path):
    save_file(TENSORS, tmp_path / "model.safetensors", metadata={"format": "pt"})
    h = ingest.read_header(tmp_path / "model.safetensors")
    assert set(h) == set(TENSORS)  # __metadata__ is not a tensor
    for name, t in TENSORS.items():
        info = h[name]
        assert info.shape == tuple(t.shape) and info.numel == t.numel(), name
        assert ingest.TORCH_NAMES[info.dtype] == str(t.dtype).removeprefix("torch."), name
        assert info.nbytes == t.numel() * t.element_size(), name
        assert info.file == "model.safetensors"
    want = sum(t.numel() * t.element_size() for t in TENSORS.values())
    assert safetensors_bytes(tmp_path) == want
    assert safetensors_bytes(tmp_path / "nothing-here") is None


def test_sub_byte_and_scale_dtypes_are_counted_by_bits(tmp_path):
    # F4 packs two values per byte; F8_E8M0 (MXFP4's scales) one per byte.
    _raw(
        tmp_path / "a.safetensors",
        {
            "__metadata__": {"x": "y"},
            "w": {"dtype": "F4", "shape": [4, 8], "data_offsets": [0, 16]},
            "s": {"dtype": "F8_E8M0", "shape": [3], "data_offsets": [16, 19]},
        },
        19,
    )
    _raw(tmp_path / "b.safetensors", {"v": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 12]}}, 12)
    h = ingest.read_headers(tmp_path)  # every file of the directory
    assert {k: (t.dtype, t.shape, t.nbytes, t.file) for k, t in h.items()} == {
        "w": ("F4", (4, 8), 16, "a.safetensors"),
        "s": ("F8_E8M0", (3,), 3, "a.safetensors"),
        "v": ("BF16", (2, 3), 12, "b.safetensors"),
    }
    assert safetensors_bytes(tmp_path) == 31


def _save(path):
    save_file({"w": torch.zeros(16, 16)}, path)
    return path.read_bytes()


BROKEN = {
    "data cut short": (lambda p: p.write_bytes(_save(p)[:-100]), "truncated safetensors file"),
    "header cut short": (lambda p: p.write_bytes(_save(p)[:20]), "corrupt or truncated safetensors header"),
    "no header": (lambda p: p.write_bytes(b"\x01\x02"), "no header"),
    "header not JSON": (lambda p: p.write_bytes(struct.pack("<Q", 4) + b"{no}"), "corrupt safetensors header"),
    "wrong byte count": (
        lambda p: _raw(p, {"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}}, 8),
        "should take 16 bytes",
    ),
    "unknown dtype": (
        lambda p: _raw(p, {"w": {"dtype": "F12", "shape": [1], "data_offsets": [0, 2]}}, 2),
        "unknown dtype 'F12'",
    ),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_a_broken_file_is_one_line_from_every_reader(case, tmp_path):
    breakage, needle = BROKEN[case]
    f = tmp_path / "model.safetensors"
    breakage(f)
    for read in (
        lambda: ingest.read_header(f),
        lambda: ingest.read_headers(tmp_path),
        lambda: safetensors_bytes(tmp_path),
    ):
        with pytest.raises(CheckpointError, match=needle) as exc:
            read()
        assert "\n" not in str(exc.value) and str(f) in str(exc.value)


def test_planning_reads_the_real_byte_count(tiny_pair_dir):
    tdir, _ = tiny_pair_dir
    shape = TargetShape.from_dir(tdir)
    assert shape.shipped_bytes == sum(t.nbytes for t in ingest.scan(tdir).tensors.values())
    assert (
        shape.shipped_bytes
        == (tdir / "model.safetensors").stat().st_size
        - 8
        - struct.unpack("<Q", (tdir / "model.safetensors").read_bytes()[:8])[0]
    )


def test_the_dtype_table_agrees_with_torch():
    for name, (bits, torch_name) in ingest.DTYPES.items():
        assert ingest.DTYPE_BITS[name] == bits
        if torch_name is not None:
            assert getattr(torch, torch_name).itemsize * 8 == bits, name
    assert ingest.FLOAT_DTYPES == {"F16", "BF16", "F32", "F64"}
    assert [ingest.torch_dtype(n) for n in ingest.RUNTIME_DTYPES] == [
        torch.float32,
        torch.bfloat16,
        torch.float16,
        torch.float64,
    ]
    assert ingest.torch_dtype("float8_e4m3fn") is None and ingest.torch_dtype(None) is None
    assert parse_dtype("bfloat16") is torch.bfloat16 and parse_dtype("auto") is torch.float32
    with pytest.raises(DFlashError, match="choose auto, float32, bfloat16, float16, float64"):
        parse_dtype("int8")


# The three lists this one replaced: every file any of them named is still a tokenizer file.
BEFORE = {
    "ingest target": ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json", "spiece.model"),
    "quantize copy": (
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "tokenizer.model",
        "vocab.json",
        "merges.txt",
        "chat_template.jinja",
        "added_tokens.json",
    ),
    "runtime load": ("tokenizer.json", "tokenizer.model", "tokenizer_config.json"),
}


def test_one_tokenizer_file_list_covers_the_three_before_it(tmp_path):
    for where, names in BEFORE.items():
        assert set(names) <= set(ingest.TOKENIZER_FILES), where
    for name in (*ingest.TOKENIZER_FILES, "cl100k.tiktoken", "config.json", "model.safetensors"):
        (tmp_path / name).write_text("{}")
    (tmp_path / "merges.txt.d").mkdir()
    assert ingest.tokenizer_files(tmp_path) == sorted([*ingest.TOKENIZER_FILES, "cl100k.tiktoken"])
    assert ingest.tokenizer_files(tmp_path / "absent") == []
