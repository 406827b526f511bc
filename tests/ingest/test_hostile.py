"""Hostile and malformed inputs (issue 16): each is one line on stderr and exit 2, never a traceback.

Every case mutates a copy of the tiny pair and runs the commands a user would: ``inspect`` of the
pair and ``build --dry-run`` (configs and headers only) and, for weight-level problems,
``generate``. The mutations are the classes the issue names; each class has several members.
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from dflash_trt.cli import run


def _header(f: Path) -> tuple[dict, bytes]:
    data = f.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + n]), data[8 + n :]


def _write_header(f: Path, header: dict, payload: bytes) -> None:
    raw = json.dumps(header).encode()
    f.write_bytes(struct.pack("<Q", len(raw)) + raw + payload)


def _edit_entry(role: str, fn):
    def mutate(t: Path, d: Path):
        f = (t if role == "target" else d) / "model.safetensors"
        header, payload = _header(f)
        name = sorted(k for k in header if k != "__metadata__")[0]
        fn(header, name)
        _write_header(f, header, payload)

    return mutate


def _set(role: str, path: list[str], value):
    def mutate(t: Path, d: Path):
        f = (t if role == "target" else d) / "config.json"
        cfg = json.loads(f.read_text())
        node = cfg
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = value
        f.write_text(json.dumps(cfg))

    return mutate


def _sharded(index_values):
    def mutate(t: Path, d: Path):
        tensors = load_file(str(t / "model.safetensors"))
        save_file(tensors, str(t / "model-00001-of-00001.safetensors"))
        (t / "model.safetensors").unlink()
        names = sorted(tensors)
        wm = {n: index_values(i, n) for i, n in enumerate(names)}
        (t / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))

    return mutate


def _deep(t: Path, d: Path):
    (t / "config.json").write_text("[" * 100_000 + "]" * 100_000)


def _overlap(header, name):
    others = sorted(
        k
        for k in header
        if k not in ("__metadata__", name)
        and header[k]["data_offsets"][1] - header[k]["data_offsets"][0]
        == header[name]["data_offsets"][1] - header[name]["data_offsets"][0]
    )
    if others:  # same size: point both at the same bytes
        header[others[0]]["data_offsets"] = list(header[name]["data_offsets"])
    else:
        raise AssertionError("no same-sized tensor to overlap with")


def _transposed(t: Path, d: Path):
    tensors = load_file(str(t / "model.safetensors"))
    name = next(n for n in sorted(tensors) if n.endswith("mlp.up_proj.weight"))
    tensors[name] = tensors[name].T.contiguous()
    save_file(tensors, str(t / "model.safetensors"), metadata={"format": "pt"})


def _int8_target(t: Path, d: Path):
    tensors = load_file(str(t / "model.safetensors"))
    for n in list(tensors):
        if n.endswith("proj.weight"):
            tensors[n] = tensors[n].to(torch.int8)
    save_file(tensors, str(t / "model.safetensors"), metadata={"format": "pt"})


def _write(name: str, text: str, role: str = "target"):
    def mutate(t: Path, d: Path):
        ((t if role == "target" else d) / name).write_text(text)

    return mutate


def _fifo(name: str):
    def mutate(t: Path, d: Path):
        import os

        (t / name).unlink(missing_ok=True)
        os.mkfifo(t / name)  # never opened: a read would block forever

    return mutate


def _raw_config(old: str, new: str):
    def mutate(t: Path, d: Path):
        f = t / "config.json"
        f.write_text(f.read_text().replace(old, new, 1))

    return mutate


CASES = {
    # malformed safetensors headers
    "dtype is a list": (
        _edit_entry("target", lambda h, n: h[n].update(dtype=[h[n]["dtype"]])),
        "corrupt safetensors header entry",
    ),
    "offsets are strings": (
        _edit_entry("target", lambda h, n: h[n].update(data_offsets=[str(x) for x in h[n]["data_offsets"]])),
        "corrupt safetensors header entry",
    ),
    "shape has a negative size": (
        _edit_entry("drafter", lambda h, n: h[n].update(shape=[-1])),
        "corrupt safetensors header entry",
    ),
    "offsets overlap": (_edit_entry("target", _overlap), "overlap"),
    "entry is not an object": (
        _edit_entry("drafter", lambda h, n: h.update({n: 7})),
        "corrupt safetensors header entry",
    ),
    # shard indexes
    "index value is a number": (_sharded(lambda i, n: 5), "is not a file name"),
    "index value is a list": (_sharded(lambda i, n: ["model-00001-of-00001.safetensors"]), "is not a file name"),
    "index points outside": (_sharded(lambda i, n: "../model-00001-of-00001.safetensors"), "outside the checkpoint"),
    "index points to an absolute path": (_sharded(lambda i, n: "/etc/passwd"), "outside the checkpoint"),
    # configs
    "num_hidden_layers is a word": (_set("target", ["num_hidden_layers"], "two"), "num_hidden_layers is 'two'"),
    "negative layer count": (_set("target", ["num_hidden_layers"], -3), "num_hidden_layers is -3"),
    "zero attention heads": (_set("target", ["num_attention_heads"], 0), "num_attention_heads is 0"),
    "kv heads is a string": (_set("target", ["num_key_value_heads"], "x"), "num_key_value_heads is 'x'"),
    "deeply nested config": (_deep, "nested too deeply"),
    "drafter layers is a word": (_set("drafter", ["num_hidden_layers"], "two"), "num_hidden_layers"),
    "drafter negative hidden size": (_set("drafter", ["hidden_size"], -64), "hidden_size"),
    # issue 27: tokenizers that do not load or round-trip, non-finite and impossible numbers, special files
    "tokenizer.json is garbage": (_write("tokenizer.json", "\x00garbage{"), "the tokenizer does not load"),
    "tokenizer.json is mis-structured": (
        _write("tokenizer.json", '{"model": 5, "added_tokens": "x"}'),
        "the tokenizer does not load",
    ),
    "rms_norm_eps is NaN": (_set("target", ["rms_norm_eps"], float("nan")), "NaN is not a number"),
    "rope_theta overflows": (_raw_config('"rope_theta": ', '"rope_theta": 1e999, "x": '), "overflows"),
    "rms_norm_eps is zero": (_set("target", ["rms_norm_eps"], 0), "rms_norm_eps is 0"),
    "rope_theta is negative": (
        _raw_config('"rope_theta": 10000.0', '"rope_theta": -10000.0'),
        "rope_theta is -10000.0",
    ),
    "max_position_embeddings is negative": (
        _set("target", ["max_position_embeddings"], -1),
        "max_position_embeddings is -1",
    ),
    "tokenizer.json is a FIFO": (_fifo("tokenizer.json"), "is a FIFO"),
    "model.safetensors is a FIFO": (_fifo("model.safetensors"), "is a FIFO"),
    # weights that do not match or are not floats
    "transposed target tensor": (_transposed, "up_proj"),
    "int8 target without a quantization config": (_int8_target, "no quantization config"),
}


@pytest.fixture
def hostile(tiny_pair_dir, tmp_path, request):
    tdir, ddir = tiny_pair_dir
    t, d = tmp_path / "target", tmp_path / "drafter"
    shutil.copytree(tdir, t)
    shutil.copytree(ddir, d)
    mutate, needle = CASES[request.param]
    mutate(t, d)
    return t, d, needle


def _one_line(capsys, code) -> str:
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("hostile", list(CASES), indirect=True)
def test_hostile_checkpoint_is_one_line(hostile, capsys, tmp_path):
    t, d, needle = hostile
    err = _one_line(capsys, run(["inspect", str(d), "--target", str(t)]))
    assert needle in err, err
    err = _one_line(capsys, run(["build", "-t", str(t), "-d", str(d), "--gpu", "cpu", "--dry-run"]))
    assert needle in err, err


@pytest.mark.parametrize("ref", ["~nosuchuser/x", "~nosuchuser-either"])
def test_unexpandable_home_is_one_line(ref, capsys):
    err = _one_line(capsys, run(["inspect", ref]))
    assert "no such directory" in err


def test_offline_hint_is_not_repeated_when_already_offline(monkeypatch, tmp_path, capsys):
    import huggingface_hub

    def boom(*a, **k):
        raise OSError("disk on fire")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", boom)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    err = _one_line(capsys, run(["inspect", "someorg/somemodel"]))
    assert "disk on fire" in err and "HF_HUB_OFFLINE=1" not in err
    monkeypatch.delenv("HF_HUB_OFFLINE")
    err = _one_line(capsys, run(["inspect", "someorg/somemodel"]))
    assert "set HF_HUB_OFFLINE=1" in err
