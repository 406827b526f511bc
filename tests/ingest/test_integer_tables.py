"""An integer table a target's architecture declares (DeepSeek V4's hash-routing ``tid2eid``, saved
under the checkpoint's own names, ``layers.N.ffn.gate.tid2eid``) is
read as what it is; an integer tensor where the architecture has a float weight is still refused."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from dflash_trt.errors import CheckpointError
from dflash_trt.ingest import read_target
from tests.second_wave import second_wave_target


@pytest.fixture(scope="module")
def v4_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("v4")
    second_wave_target("deepseek_v4", dtype=torch.float32).save_pretrained(path)
    return path


def test_a_hash_routing_table_is_not_an_unquantized_weight(v4_dir):
    tensors = load_file(str(v4_dir / "model.safetensors"))
    table = next(n for n in tensors if n.endswith("gate.tid2eid"))
    assert not tensors[table].dtype.is_floating_point  # the checkpoint does carry an integer tensor
    spec = read_target(v4_dir)
    assert spec.model_type == "deepseek_v4" and spec.quantization is None


def test_an_integer_weight_is_still_refused(v4_dir, tmp_path):
    for f in v4_dir.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    tensors = load_file(str(tmp_path / "model.safetensors"))
    name = next(n for n in sorted(tensors) if n.endswith("attn.wq_a.weight"))
    tensors[name] = tensors[name].to(torch.int8)
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=f"{name} is I8 but the target has no quantization"):
        read_target(tmp_path)
