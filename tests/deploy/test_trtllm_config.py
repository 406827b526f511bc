"""TensorRT-LLM config: the schema of documented fields, config emission, serve.sh."""

from __future__ import annotations

import os
import subprocess

import pytest
import yaml

from dflash_trt.deploy import pipeline
from dflash_trt.deploy import trtllm_config as trtllm
from dflash_trt.errors import DFlashError
from dflash_trt.plan import recipe as R


def _cfg(name="qwen3-8b-h100-fp8", sets=None):
    r = R.load_recipe(name, sets)
    res = pipeline.resolve_recipe(r)
    return r, pipeline.plan_resolved(res), res.drafter


def test_emitted_config_for_a_hopper_recipe():
    r, p, d = _cfg()
    cfg = trtllm.config(r, p, d)
    data = yaml.safe_load(trtllm.trtllm_yaml(cfg))
    spec = data["speculative_config"]
    assert spec["decoding_type"] == "DFlash" and spec["speculative_model"] == "./drafter"
    assert spec["attention_backend"] == "FA4" and spec["max_draft_len"] == p.max_draft_len <= 15
    assert spec["mask_token_id"] == 151669 and spec["target_layer_ids"] == [1, 9, 17, 25, 33]
    assert data["tensor_parallel_size"] == 1 and data["max_seq_len"] == 8192 and data["max_batch_size"] == 32
    # the fraction the plan chose (plan.startup): the KV pool leaves the dense arena, activations, graphs and
    # 4 GiB headroom their room; the recipe does not set it
    m = p.memory
    assert data["kv_cache_config"] == {
        "dtype": "auto",
        "free_gpu_memory_fraction": m.fraction,
        "enable_block_reuse": False,
    }
    assert (1 - m.fraction) * m.free_after_load >= m.after_pool and m.fraction * m.free_after_load >= m.in_pool
    assert data["attn_backend"] == "TRTLLM"  # explicit: never FlashInfer for DFlash
    assert data["enable_chunked_prefill"] is False and "context_recompute_tail" not in spec
    assert data["cuda_graph_config"] == {"enable_padding": True, "max_batch_size": 32}
    assert "moe_expert_parallel_size" not in data
    assert data["enable_iter_perf_stats"] is True  # trtllm-serve's /metrics reports acceptance for verify
    assert trtllm.validate_trtllm_config(data) == cfg  # round-trips through the schema


def test_iteration_stats_can_be_turned_off_and_verify_then_says_why_acceptance_is_unmeasured():
    from dflash_trt.bench import verify
    from dflash_trt.bench.verify_server import Window

    r, p, d = _cfg(sets=["serving.iter_perf_stats=false"])
    data = yaml.safe_load(trtllm.trtllm_yaml(trtllm.config(r, p, d)))
    assert data["enable_iter_perf_stats"] is False
    check = verify.check_acceptance(Window(), None, data, "trtllm server metrics")
    assert check["status"] == "not measured" and "leaves enable_iter_perf_stats off" in check["summary"]
    data["enable_iter_perf_stats"] = True
    assert "leaves" not in verify.check_acceptance(Window(), None, data, "trtllm server metrics")["summary"]


def test_moe_recipe_sets_expert_parallel_and_blackwell_backend():
    r, p, d = _cfg("gpt-oss-120b-8xb300")
    cfg = trtllm.config(r, p, d)
    assert cfg.moe_expert_parallel_size == 8 and cfg.tensor_parallel_size == 8
    assert cfg.speculative_config.attention_backend == "TRTLLM"
    args = trtllm.serve_args(cfg, "0.0.0.0", 9000)
    assert args[:4] == ["trtllm-serve", "./target", "--config", "./trtllm/config.yaml"]
    flags = dict(zip(args[4::2], args[5::2], strict=True))
    assert flags == {
        "--host": "0.0.0.0",
        "--port": "9000",
        "--tp_size": "8",
        "--ep_size": "8",
        "--max_batch_size": "64",
        "--max_num_tokens": "8192",
        "--max_seq_len": "16384",
        "--kv_cache_free_gpu_memory_fraction": "0.9",
    }  # room to spare: TensorRT-LLM's default cap


def _base():
    return {
        "max_batch_size": 8,
        "max_num_tokens": 512,
        "max_seq_len": 1024,
        "kv_cache_config": {},
        "speculative_config": {"decoding_type": "DFlash", "max_draft_len": 7, "speculative_model": "./drafter"},
    }


@pytest.mark.parametrize(
    "mutate, needle",
    [
        (lambda d: d.update(max_draft_tokens=4), "max_draft_tokens"),  # unknown top-level key
        (lambda d: d["speculative_config"].update(num_speculative_tokens=7), "num_speculative_tokens"),  # vLLM's name
        (lambda d: d["speculative_config"].update(decoding_type="Eagle3"), "decoding_type"),
        (lambda d: d["speculative_config"].update(attention_backend="FLASHINFER"), "attention_backend"),
        (lambda d: d["speculative_config"].update(max_concurrency=8, draft_len_schedule={1: 7}), "mutually exclusive"),
        (lambda d: d["speculative_config"].update(draft_len_schedule={2: 3}), "smallest batch-size key must map"),
        (lambda d: d["speculative_config"].update(draft_len_schedule={1: 7, 4: 9}), "between 0 and max_draft_len"),
        (lambda d: d["speculative_config"].update(draft_len_schedule={0: 7}), "must be >= 1"),
        (lambda d: d["speculative_config"].update(max_concurrency=0), "max_concurrency"),
        (lambda d: d["kv_cache_config"].update(dtype="int4"), "kv_cache_config.dtype"),
        (lambda d: d["kv_cache_config"].update(free_gpu_memory_fraction=1.5), "free_gpu_memory_fraction"),
        (lambda d: d.update(cuda_graph_config={"max_batch_size": 8, "batch_sizes": [1, 2]}), "max(batch_sizes)"),
        (lambda d: d.update(moe_config={"backend": "MXFP4"}), "moe_config.backend"),
        (lambda d: d.update(trust_remote_code=True), "trust_remote_code"),
    ],
)
def test_schema_rejects_what_trtllm_would_not_accept(mutate, needle):
    data = _base()
    trtllm.validate_trtllm_config(data)
    mutate(data)
    with pytest.raises(DFlashError) as e:
        trtllm.validate_trtllm_config(data)
    assert needle in str(e.value)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d["speculative_config"].update(
            speculative_model_dir=d["speculative_config"].pop("speculative_model")
        ),
        lambda d: d["speculative_config"].update(draft_len_schedule={4: 7, 8: 2, 32: 1}),  # no key 1
        lambda d: d["speculative_config"].update(draft_len_schedule={4: 7, 8: 1}),
        lambda d: d["speculative_config"].update(context_recompute_tail=-1),
        lambda d: d["speculative_config"].update(
            context_recompute_tail=256, moe_backend="TRTLLM", skip_ctx_buffer_budget_check=True, spec_dec_variant=1
        ),
        lambda d: d["kv_cache_config"].update(dtype="nvfp4"),
        lambda d: d["kv_cache_config"].update(dtype="BFloat16"),
        lambda d: d["kv_cache_config"].update(dtype="fp8_ds_mla"),
        lambda d: d["kv_cache_config"].update(free_gpu_memory_fraction=0.0),
        lambda d: d.update(cuda_graph_config={"max_batch_size": 2, "batch_sizes": [1, 2]}),
        lambda d: d.update(cuda_graph_config=None, enable_chunked_prefill=True, moe_config={"backend": "TRITON"}),
    ],
)
def test_schema_accepts_what_trtllm_accepts(mutate):
    data = _base()
    mutate(data)
    cfg = trtllm.validate_trtllm_config(data, "1.4.0rc1")
    assert trtllm.validate_trtllm_config(yaml.safe_load(trtllm.trtllm_yaml(cfg)), "1.4.0rc1") == cfg  # and round-trips


@pytest.mark.parametrize(
    "spec, needle",
    [
        ({"draft_len_schedule": {4: 7, 8: 0}}, "drafts 0 tokens from batch size 5 up to max_batch_size 8"),
        ({"draft_len_schedule": {4: 7}}, "drafts 0 tokens from batch size 5"),
        ({"max_concurrency": 4}, "max_concurrency 4 turns drafting off above it"),
    ],
)
def test_a_written_config_that_drafts_0_is_refused_on_a_release_without_the_floor(spec, needle):
    """TensorRT-LLM's schema takes these; on a release without the floor (every release in the table)
    they walk into the zero-draft trap, so no config is written or passed with one."""
    data = _base()
    data["speculative_config"].update(spec)
    trtllm.validate_trtllm_config(data)  # the schema alone accepts it
    with pytest.raises(DFlashError) as e:
        trtllm.validate_trtllm_config(data, "1.4.0rc1")
    msg = str(e.value)
    assert needle in msg and "zero-draft trap" in msg and "PR #16888" in msg and "\n" not in msg
    data["speculative_config"].pop("max_concurrency", None)
    data["speculative_config"]["draft_len_schedule"] = {4: 7, 8: 1}  # the same back-off with the floor kept
    trtllm.validate_trtllm_config(data, "1.4.0rc1")


def test_the_speculation_gate_is_documented_and_refused_for_measurement():
    field = trtllm.DFlashDecodingConfig.model_fields["acceptance_rate_threshold"]
    assert "Not a rate" in field.description and "accepted draft tokens per iteration" in field.description
    assert "for good" in field.description
    data = _base()
    assert trtllm.speculation_gate(data) is None
    data["speculative_config"]["acceptance_rate_threshold"] = 0.5
    trtllm.validate_trtllm_config(data, "1.4.0rc1")  # a valid config: TensorRT-LLM runs it
    line = trtllm.speculation_gate(data)
    assert "acceptance_rate_threshold is 0.5" in line and "permanently" in line and "\n" not in line


def test_speculative_model_dir_is_read_as_speculative_model():
    data = _base()
    data["speculative_config"]["speculative_model_dir"] = data["speculative_config"].pop("speculative_model")
    assert trtllm.validate_trtllm_config(data).speculative_config.speculative_model == "./drafter"


@pytest.mark.parametrize(
    "release, key, value",
    [
        ("1.3.0rc27", "context_recompute_tail", 64),
        ("1.3.0rc27", "skip_ctx_buffer_budget_check", True),
        ("1.3.0rc26", "attention_backend", "FA4"),
    ],
)
def test_release_refuses_keys_it_does_not_have(release, key, value):
    data = _base()
    data["speculative_config"][key] = value
    trtllm.validate_trtllm_config(data, "1.4.0rc1")
    with pytest.raises(DFlashError) as e:
        trtllm.validate_trtllm_config(data, release)
    assert key in str(e.value) and release in str(e.value)


def test_cuda_graphs_off_is_written_as_null():
    r, p, d = _cfg("tiny")
    assert r.serving.cuda_graphs is False
    text = trtllm.trtllm_yaml(trtllm.config(r, p, d))
    assert "cuda_graph_config: null" in text.splitlines()
    assert yaml.safe_load(text)["cuda_graph_config"] is None
    r, p, d = _cfg("qwen3-8b-h100-fp8")
    assert yaml.safe_load(trtllm.trtllm_yaml(trtllm.config(r, p, d)))["cuda_graph_config"]["enable_padding"] is True


def test_long_sequences_get_chunked_prefill_and_gpt_oss_its_moe_backend():
    for name, backend in (("gpt-oss-120b-8xb300", "TRTLLM"), ("gpt-oss-120b-8xh200", "TRITON")):
        r, p, d = _cfg(name)
        data = yaml.safe_load(trtllm.trtllm_yaml(trtllm.config(r, p, d)))
        assert data["max_seq_len"] == 16384 > data["max_num_tokens"] == 8192
        assert data["enable_chunked_prefill"] is True
        assert data["moe_config"] == {"backend": backend}
    r, p, d = _cfg("qwen3-8b-h100-fp8")
    data = yaml.safe_load(trtllm.trtllm_yaml(trtllm.config(r, p, d)))
    assert data["enable_chunked_prefill"] is False and "moe_config" not in data


def test_only_set_keys_are_written():
    """A default filled in could be a key the targeted release does not have."""
    r, p, d = _cfg("qwen3-8b-h100-fp8", ["trtllm.release=1.3.0rc27"])
    data = yaml.safe_load(trtllm.trtllm_yaml(trtllm.config(r, p, d)))
    assert set(data["speculative_config"]) <= {
        "decoding_type",
        "max_draft_len",
        "speculative_model",
        "mask_token_id",
        "target_layer_ids",
        "attention_backend",
        "use_rejection_sampling",
        "draft_len_schedule",
        "max_concurrency",
    }
    trtllm.validate_trtllm_config(data, "1.3.0rc27")


def test_schedule_is_emitted_when_planned():
    r, p, d = _cfg(
        "qwen3-8b-b200-nvfp4", ["serving.max_batch_size=1024", "serving.max_seq_len=512", "speculative.acceptance=1.6"]
    )
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
    res = subprocess.run(
        [str(moved / "trtllm" / "serve.sh"), "--log_level", "info"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    lines = res.stdout.splitlines()
    assert lines[0] == f"cwd={moved}"
    assert lines[1:5] == ["./target", "--config", "./trtllm/config.yaml", "--host"]
    assert lines[-2:] == ["--log_level", "info"] and "--tp_size" in lines
    assert (moved / "trtllm" / "config.yaml").exists()


def test_the_release_table_is_the_one_place_the_releases_live():
    """pyproject's trtllm extra, the recipe default and the release page follow trtllm_releases."""
    from pathlib import Path

    import tomllib

    from dflash_trt.plan import trtllm_releases as T

    root = Path(__file__).resolve().parents[2]
    known = list(T.KNOWN)
    extra = tomllib.loads((root / "pyproject.toml").read_text())["project"]["optional-dependencies"]["trtllm"]
    assert extra == [f"tensorrt-llm>={known[0]}"]  # newer releases: judged by their own classes (serve.sh)
    assert "trtllm" not in " ".join(
        tomllib.loads((root / "pyproject.toml").read_text())["project"]["optional-dependencies"]["all"]
    )
    assert T.DEFAULT_RELEASE == known[-1] == R.TrtllmSpec().release
    from tests.test_docs import gen_docs  # the release table page is generated from the same rows

    page = gen_docs().releases_page()
    assert (root / "docs" / "reference" / "releases.md").read_text() == page
    for r in T.RELEASES:
        assert f"| `{r.version}` | " in page and f"`{r.image}`" in page, r.version
    assert all(r.image == f"nvcr.io/nvidia/tensorrt-llm/release:{r.version}" for r in T.RELEASES)
