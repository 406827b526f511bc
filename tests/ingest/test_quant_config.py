"""Both hf_quant_config.json shapes ModelOpt writes are read as TensorRT-LLM reads them
(``tensorrt_llm/quantization/modelopt_config.py::read_modelopt_quant_config``)."""

from __future__ import annotations

import json
import shutil

import pytest

from dflash_trt import ingest

NESTED = {
    "producer": {"name": "modelopt", "version": "0.47.0"},
    "quantization": {
        "quant_algo": "NVFP4",
        "kv_cache_quant_algo": "FP8",
        "group_size": 16,
        "exclude_modules": ["lm_head"],
    },
}
FLAT = {
    "producer": {"name": "modelopt", "version": "1.0.0"},
    "quant_method": "modelopt",
    "quant_algo": "NVFP4",
    "kv_cache_scheme": {"type": "float", "num_bits": 8},
    "ignore": ["lm_head"],
    "config_groups": {"group_0": {"weights": {"num_bits": 4, "group_size": 16}, "targets": ["Linear"]}},
}


@pytest.mark.parametrize("raw", [NESTED, FLAT])
def test_both_shapes_normalise_to_the_same_fields(raw):
    q = ingest.read_modelopt_quant_config(raw)
    assert (q["quant_algo"], q["kv_cache_quant_algo"], q["group_size"], q["exclude_modules"]) == (
        "NVFP4",
        "FP8",
        16,
        ["lm_head"],
    )


@pytest.mark.parametrize(
    "scheme, algo",
    [
        (None, None),
        ("NVFP4", "NVFP4"),
        ({"type": "int", "num_bits": 8}, "INT8"),
        ({"type": "float", "num_bits": 16}, None),
    ],
)
def test_flat_kv_cache_scheme(scheme, algo):
    assert ingest.read_modelopt_quant_config({**FLAT, "kv_cache_scheme": scheme})["kv_cache_quant_algo"] == algo


def test_not_modelopt_is_none():
    assert ingest.read_modelopt_quant_config({"quant_method": "gptq", "bits": 4}) is None
    assert ingest.read_modelopt_quant_config([1, 2]) is None


@pytest.mark.parametrize("raw", [NESTED, FLAT])
def test_target_quantization_reads_either_file(tiny_pair_dir, tmp_path, raw):
    t = tmp_path / "t"
    shutil.copytree(tiny_pair_dir[0], t)
    (t / "hf_quant_config.json").write_text(json.dumps(raw))
    q = ingest.target_quantization(t)
    assert q["method"] == "modelopt" and q["quant_algo"] == "NVFP4" and q["kv_cache_quant_algo"] == "FP8"
    assert q["group_size"] == 16 and q["exclude_modules"] == ["lm_head"] and q["source"] == "hf_quant_config.json"
    assert ingest.read_target(t, require_weights=False).quantization == q
