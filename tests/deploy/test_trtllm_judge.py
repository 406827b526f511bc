"""The installed TensorRT-LLM judges the bundle's config (``trtllm/judge.py``, run by serve.sh and
``serve --check``), against a stand-in package that follows the real LLM-API contract
(:mod:`tests.deploy.fake_trtllm`: pydantic ``extra="forbid"`` classes with the documented key
names, ``update_llm_args_with_extra_dict`` + ``TorchLlmArgs.from_kwargs``)."""

from __future__ import annotations

import sys

import pytest
import yaml

from dflash_trt.cli import run
from dflash_trt.deploy import serve_sh, trtllm_judge
from dflash_trt.deploy import trtllm_config as trtllm
from dflash_trt.errors import DFlashError

from . import fake_trtllm
from .test_serve_sh import H100_ROW, _one_line_error, _run

SPEC = {"decoding_type": "DFlash", "max_draft_len": 7, "speculative_model": "./drafter", "context_recompute_tail": 512}


@pytest.fixture
def bundle(tmp_path):
    """A bundle planned for 1.4.0rc1 whose config uses a 1.4.0rc1 key and a curated top-level key."""
    root = tmp_path / "bundle"
    cfg = trtllm.validate_trtllm_config(
        {
            "max_batch_size": 8,
            "max_num_tokens": 512,
            "max_seq_len": 1024,
            "disable_mm_encoder": True,
            "speculative_config": SPEC,
        },
        "1.4.0rc1",
    )
    trtllm.write(
        root / "trtllm",
        cfg,
        "127.0.0.1",
        8000,
        serve_sh.ServeCheck(release="1.4.0rc1", gpu="H100", sm=90, memory_gb=80, gpus=1),
    )
    return root


def test_the_planned_release_serves_with_what_it_checked_and_a_newer_one_with_one_more_line(tmp_path, bundle):
    res = _run(tmp_path, bundle, version="1.4.0rc1", gpus=[H100_ROW])
    assert res.returncode == 0 and res.stdout.startswith("served from"), res.stderr
    said = [line for line in res.stderr.splitlines() if line.startswith("serve.sh:")]
    assert len(said) == 1 and said[0].startswith(
        "serve.sh: checked against TensorRT-LLM 1.4.0rc1 (commit not recorded by the package): the config is accepted"
    ), said
    res = _run(tmp_path, bundle, version="1.4.0+cu130", gpus=[H100_ROW])
    assert res.returncode == 0 and res.stdout.startswith("served from"), res.stderr
    said = [line for line in res.stderr.splitlines() if line.startswith("serve.sh:")]
    assert len(said) == 2 and "TensorRT-LLM 1.4.0+cu130 is newer than 1.4.0rc1" in said[1]
    assert "plan was made for" in said[1] and "accepted by its LLM-API classes" in said[1]


def test_serve_sh_prints_and_records_the_version_and_commit_outside_the_bundle(tmp_path, bundle):
    before = {p: p.read_bytes() for p in bundle.rglob("*") if p.is_file()}
    res = _run(
        tmp_path,
        bundle,
        version="1.4.0rc3",
        gpus=[H100_ROW],
        commit="0372799abc",
        add={"DecodingBaseConfig.min_runtime_draft_len": "int = 1"},
    )
    assert res.returncode == 0, res.stderr
    said = [line for line in res.stderr.splitlines() if line.startswith("serve.sh:")]
    assert "checked against TensorRT-LLM 1.4.0rc3 (commit 0372799abc)" in said[0]
    assert "by field it has FA4 draft attention, context_recompute_tail, draft-length floor" in said[0]
    log = tmp_path / ".local" / "state" / "dflash-trt" / "serve-checks.jsonl"
    entry = yaml.safe_load(log.read_text().splitlines()[-1])
    assert entry["installed"] == "1.4.0rc3" and entry["commit"] == "0372799abc" and entry["planned"] == "1.4.0rc1"
    assert {p: p.read_bytes() for p in bundle.rglob("*") if p.is_file()} == before  # the bundle is as built


def test_a_draft_length_floor_the_plan_did_not_assume_is_reported(tmp_path, bundle):
    path = bundle / "trtllm" / "config.yaml"
    data = yaml.safe_load(path.read_text())
    data["speculative_config"]["draft_len_schedule"] = {4: 7, 8: 3}
    path.write_text(yaml.safe_dump(data))
    res = _run(
        tmp_path,
        bundle,
        version="1.4.0rc3",
        gpus=[H100_ROW],
        add={"DecodingBaseConfig.min_runtime_draft_len": "int = 1"},
    )
    assert res.returncode == 0 and "floors the draft length at min_runtime_draft_len=1" in res.stderr, res.stderr
    res = _run(tmp_path, bundle, version="1.4.0rc3", gpus=[H100_ROW])  # no such field: nothing said
    assert res.returncode == 0 and "floors the draft length" not in res.stderr


def test_flashinfer_under_dflash_is_refused_at_serve_time(tmp_path, bundle):
    path = bundle / "trtllm" / "config.yaml"
    path.write_text(yaml.safe_dump({**yaml.safe_load(path.read_text()), "attn_backend": "FLASHINFER"}))
    err = _one_line_error(_run(tmp_path, bundle, version="1.4.0rc1", gpus=[H100_ROW]))
    assert "attn_backend: FLASHINFER cannot verify K + 1 tokens per sequence" in err


@pytest.mark.parametrize(
    "drop, key",
    [
        ("DFlashDecodingConfig.context_recompute_tail", "speculative_config.context_recompute_tail"),
        ("TorchLlmArgs.disable_mm_encoder", "disable_mm_encoder"),
    ],
)
def test_a_key_the_installed_release_rejects_is_one_line_naming_it(tmp_path, bundle, drop, key):
    err = _one_line_error(_run(tmp_path, bundle, version="1.5.0", gpus=[H100_ROW], drop=(drop,)))
    assert err.startswith(f"serve.sh: trtllm/config.yaml: {key}: TensorRT-LLM 1.5.0 rejects it (no such key)"), err


def test_an_older_release_and_no_release_are_refused(tmp_path, bundle):
    err = _one_line_error(_run(tmp_path, bundle, version="1.4.0rc0", gpus=[H100_ROW]))
    assert "1.4.0rc0 is installed; this bundle was planned for TensorRT-LLM 1.4.0rc1" in err
    assert "tensorrt_llm is not installed" in _one_line_error(_run(tmp_path, bundle, gpus=[H100_ROW]))


def test_disaggregated_serving_is_refused_citing_the_pr(tmp_path, bundle):
    path = bundle / "trtllm" / "config.yaml"
    data = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**data, "cache_transceiver_config": {"backend": "UCX"}}))
    err = _one_line_error(_run(tmp_path, bundle, version="1.4.0rc1", gpus=[H100_ROW]))
    assert "cache_transceiver_config" in err and "PR #19352" in err and "acceptance collapses" in err
    with pytest.raises(DFlashError, match="PR #19352"):
        trtllm.validate_trtllm_config({**data, "cache_transceiver_config": {"backend": "UCX"}})


def test_the_acceptance_histogram_dir_is_opt_in_and_resolved_from_the_caller(tmp_path, bundle):
    work = tmp_path / "work"
    work.mkdir()
    res = _run(
        tmp_path, bundle, version="1.4.0rc1", gpus=[H100_ROW], cwd=work, env={"TLLM_DFLASH_ACCEPT_STATS_DIR": "stats"}
    )
    assert res.returncode == 0, res.stderr
    assert (work / "stats").is_dir() and f"stats: {work / 'stats'}" in res.stderr
    assert "stats: \n" in _run(tmp_path, bundle, version="1.4.0rc1", gpus=[H100_ROW]).stderr + "\n"


def test_versions_order_as_releases_do():
    k = trtllm_judge.version_key
    order = ["1.3.0rc26", "1.3.0rc27", "1.4.0rc1", "1.4.0rc2", "1.4.0", "1.4.0.post1", "1.5.0rc1"]
    assert sorted(order, key=k) == order and k("1.4.0rc1+cu130") == k("1.4.0rc1")
    with pytest.raises(ValueError):
        k("main")


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """Put a stand-in release on sys.path for in-process callers; forget it afterwards."""

    def install(version, **kw):
        for name in [m for m in sys.modules if m == "tensorrt_llm" or m.startswith("tensorrt_llm.")]:
            monkeypatch.delitem(sys.modules, name)
        root = tmp_path / f"site-{version}-{len(kw)}"
        monkeypatch.syspath_prepend(str(fake_trtllm.write(root, version, **kw)))

    yield install
    for name in [m for m in sys.modules if m == "tensorrt_llm" or m.startswith("tensorrt_llm.")]:
        del sys.modules[name]


def test_older_releases_keep_the_update_function_in_llm_args(installed):
    installed("1.4.0rc1", old_layout=True)
    assert trtllm_judge.judge({"max_batch_size": 4, "speculative_config": SPEC}, "1.4.0rc1") is None
    bad = trtllm_judge.judge({"speculative_config": {**SPEC, "max_draft_len": -1}}, "1.4.0rc1")
    assert bad.startswith("trtllm/config.yaml: speculative_config.max_draft_len: TensorRT-LLM 1.4.0rc1 rejects it")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A real bundle (the tiny recipe): the config dflash-trt writes, and its manifest."""
    from dflash_trt.deploy import build
    from dflash_trt.plan import recipe as R

    out = tmp_path_factory.mktemp("built") / "tiny"
    build(R.load_recipe("tiny"), out)
    return out


def test_serve_check_uses_the_installed_release(installed, built, capsys):
    assert run(["serve", str(built), "--check"]) == 0  # nothing installed here: our schema only
    assert "no installed release judged it" in capsys.readouterr().out
    installed("1.4.0rc1")  # the config dflash-trt writes passes the documented classes
    assert run(["serve", str(built), "--check"]) == 0
    assert "TensorRT-LLM 1.4.0rc1 accepts trtllm/config.yaml (planned for 1.4.0rc1)" in capsys.readouterr().out
    installed("1.5.0", drop=("DFlashDecodingConfig.use_rejection_sampling",))
    assert run(["serve", str(built), "--check"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "speculative_config.use_rejection_sampling" in err, err


def test_curated_keys_for_vlm_and_hybrid_targets_pass_the_documented_classes(installed):
    """Qwen3.5-4B is a VLM served text-only with Gated DeltaNet layers: the curated configs'
    disable_mm_encoder and kv_cache_config.mamba_ssm_cache_dtype; Qwen3-8B gets neither."""
    from dflash_trt.deploy import pipeline
    from dflash_trt.plan import recipe as R

    def config(name):
        r = R.load_recipe(name)
        res = pipeline.resolve_recipe(r)
        cfg = trtllm.config(r, pipeline.plan_resolved(res), res.drafter, res.target)
        return yaml.safe_load(trtllm.trtllm_yaml(cfg))

    hybrid, dense = config("qwen3.5-4b-h100-bf16"), config("qwen3-8b-h100-fp8")
    assert hybrid["disable_mm_encoder"] is True and hybrid["kv_cache_config"]["mamba_ssm_cache_dtype"] == "float32"
    assert "disable_mm_encoder" not in dense and "mamba_ssm_cache_dtype" not in dense["kv_cache_config"]
    installed("1.4.0rc1")
    assert trtllm_judge.judge(hybrid, "1.4.0rc1") is None and trtllm_judge.judge(dense, "1.4.0rc1") is None
