"""TensorRT-LLM config: the schema of documented fields, config emission, serve.sh."""

from __future__ import annotations

import os
import subprocess

import pytest
import yaml

from dflash_trt.build import pipeline

from dflash_trt.build import recipe as R

from dflash_trt.build import trtllm
from dflash_trt.errors import DFlashError


def _cfg(name="qwen3-8b-h100-fp8", sets=None):
    r = R.load(name, sets)
    res = pipeline.resolve(r)
    return r, pipeline.make_plan(res), res.drafter


def test_emitted_config_for_a_hopper_recipe():
    r, p, d = _cfg()
    cfg = trtllm.config(r, p, d)
    data = yaml.safe_load(trtllm.to_yaml(cfg))
    spec = data["speculative_config"]
    assert spec["decoding_type"] == "DFlash" and spec["speculative_model"] == "./drafter"
    assert spec["attention_backend"] == "FA4" and spec["max_draft_len"] == p.max_draft_len <= 15
    assert spec["mask_token_id"] == 151669 and spec["target_layer_ids"] == [1, 9, 17, 25, 33]
    assert data["tensor_parallel_size"] == 1 and data["max_seq_len"] == 8192 and data["max_batch_size"] == 32
    assert data["kv_cache_config"] == {"dtype": "auto", "free_gpu_memory_fraction": 0.85, "enable_block_reuse": False}
    assert data["cuda_graph_config"] == {"enable_padding": True, "max_batch_size": 32}
    assert "moe_expert_parallel_size" not in data
    assert trtllm.validate(data) == cfg  # round-trips through the schema


def test_moe_recipe_sets_expert_parallel_and_blackwell_backend():
    r, p, d = _cfg("gpt-oss-120b-8xb300")
    cfg = trtllm.config(r, p, d)
    assert cfg.moe_expert_parallel_size == 8 and cfg.tensor_parallel_size == 8
    assert cfg.speculative_config.attention_backend == "TRTLLM"
    args = trtllm.serve_args(cfg, "0.0.0.0", 9000)
    assert args[:4] == ["trtllm-serve", "./target", "--config", "./trtllm/config.yaml"]
    flags = dict(zip(args[4::2], args[5::2]))
    assert flags == {"--host": "0.0.0.0", "--port": "9000", "--tp_size": "8", "--ep_size": "8",
                     "--max_batch_size": "64", "--max_num_tokens": "8192", "--max_seq_len": "16384",
                     "--kv_cache_free_gpu_memory_fraction": "0.85"}


def _base():
    return {"max_batch_size": 8, "max_num_tokens": 512, "max_seq_len": 1024, "kv_cache_config": {},
            "speculative_config": {"decoding_type": "DFlash", "max_draft_len": 7, "speculative_model": "./drafter"}}


@pytest.mark.parametrize("mutate, needle", [
    (lambda d: d.update(max_draft_tokens=4), "max_draft_tokens"),                       # unknown top-level key
    (lambda d: d["speculative_config"].update(num_speculative_tokens=7), "num_speculative_tokens"),  # vLLM's name
    (lambda d: d["speculative_config"].update(speculative_model_dir="x"), "speculative_model_dir"),
    (lambda d: d["speculative_config"].update(decoding_type="Eagle3"), "decoding_type"),
    (lambda d: d["speculative_config"].update(attention_backend="FLASHINFER"), "attention_backend"),
    (lambda d: d["speculative_config"].update(max_concurrency=8, draft_len_schedule={1: 7}), "not both"),
    (lambda d: d["speculative_config"].update(draft_len_schedule={2: 3}), "include {1: max_draft_len}"),
    (lambda d: d["speculative_config"].update(draft_len_schedule={1: 7, 4: 9}), "draft len <= max_draft_len"),
    (lambda d: d["kv_cache_config"].update(dtype="nvfp4"), "kv_cache_config.dtype"),
    (lambda d: d["kv_cache_config"].update(free_gpu_memory_fraction=1.5), "free_gpu_memory_fraction"),
    (lambda d: d.update(cuda_graph_config={"max_batch_size": 8, "batch_sizes": [1, 2]}), "not both"),
    (lambda d: d.update(trust_remote_code=True), "trust_remote_code"),
])
def test_schema_rejects_what_trtllm_would_not_accept(mutate, needle):
    data = _base()
    trtllm.validate(data)
    mutate(data)
    with pytest.raises(DFlashError) as e:
        trtllm.validate(data)
    assert needle in str(e.value)


def test_schedule_is_emitted_when_planned():
    r, p, d = _cfg("qwen3-8b-b200-nvfp4", ["serving.max_batch_size=1024", "serving.max_seq_len=512",
                                           "speculative.acceptance=1.6"])
    cfg = trtllm.config(r, p, d)
    s = cfg.speculative_config
    assert (s.max_concurrency is not None) != (s.draft_len_schedule is not None)
    if s.draft_len_schedule:
        assert s.draft_len_schedule[1] == s.max_draft_len


def test_serve_script_is_relocatable_and_passes_arguments(tmp_path):
    r, p, d = _cfg()
    cfg = trtllm.config(r, p, d)
    bundle = tmp_path / "somewhere" / "bundle"
    trtllm.write(bundle / "trtllm", cfg, "127.0.0.1", 8000)
    moved = tmp_path / "moved"
    bundle.rename(moved)
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "trtllm-serve").write_text('#!/usr/bin/env bash\necho "cwd=$PWD"\nprintf "%s\\n" "$@"\n')
    (fake / "trtllm-serve").chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"}
    res = subprocess.run([str(moved / "trtllm" / "serve.sh"), "--log_level", "info"], cwd=tmp_path,
                         capture_output=True, text=True, env=env, check=True)
    lines = res.stdout.splitlines()
    assert lines[0] == f"cwd={moved}"
    assert lines[1:5] == ["./target", "--config", "./trtllm/config.yaml", "--host"]
    assert lines[-2:] == ["--log_level", "info"] and "--tp_size" in lines
    assert (moved / "trtllm" / "config.yaml").exists()
