"""serve.sh checks what the bundle was built for before it execs trtllm-serve: the installed
tensorrt_llm (a stand-in package on PYTHONPATH following the real LLM-API contract,
:mod:`tests.deploy.fake_trtllm`) judges the config, and the GPUs (a fake ``nvidia-smi``
printing what the real one prints for ``--query-gpu=...``) match the plan."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dflash_trt.deploy import serve_sh
from dflash_trt.deploy import trtllm_config as trtllm

from . import fake_trtllm

H100_ROW = "NVIDIA H100 80GB HBM3, 9.0, 81559"
H200_ROW = "NVIDIA H200, 9.0, 143771"
B200_ROW = "NVIDIA B200, 10.0, 183359"


def _config():
    return trtllm.validate_trtllm_config(
        {
            "max_batch_size": 8,
            "max_num_tokens": 512,
            "max_seq_len": 1024,
            "speculative_config": {"decoding_type": "DFlash", "max_draft_len": 7, "speculative_model": "./drafter"},
        }
    )


@pytest.fixture
def bundle(tmp_path) -> Path:
    root = tmp_path / "bundle"
    check = serve_sh.ServeCheck(release="1.4.0rc1", gpu="H100", sm=90, memory_gb=80, gpus=1)
    trtllm.write(root / "trtllm", _config(), "127.0.0.1", 8000, check)
    return root


def _run(tmp_path, bundle, *, version=None, gpus=None, env=None, check_dir=None, drop=(), cwd=None, **fake):
    """Run serve.sh with only fakes and the shell tools it needs on PATH."""
    bindir = tmp_path / "bin"
    shutil.rmtree(bindir, ignore_errors=True)
    bindir.mkdir()
    for tool in ("bash", "dirname", "awk", "mkdir"):
        (bindir / tool).symlink_to(shutil.which(tool))
    (bindir / "trtllm-serve").write_text(
        '#!/usr/bin/env bash\necho "served from $PWD: $*"\necho "stats: ${TLLM_DFLASH_ACCEPT_STATS_DIR:-}" >&2\n'
    )
    if gpus is not None:
        rows = "\n".join(gpus)
        (bindir / "nvidia-smi").write_text(f'#!/usr/bin/env bash\nprintf "%s\\n" "{rows}"\n')
    for f in bindir.iterdir():
        if not f.is_symlink():
            f.chmod(0o755)
    pkgs = tmp_path / "site"
    shutil.rmtree(pkgs, ignore_errors=True)
    if version is not None:  # the stand-in tensorrt_llm, as the release ships its version.py and llmapi
        fake_trtllm.write(pkgs, version, drop, **fake)
    run_env = {
        "PATH": str(bindir),
        "PYTHON": sys.executable,
        "PYTHONPATH": str(pkgs),
        "HOME": str(tmp_path),
        **(env or {}),
    }
    return subprocess.run(
        [str((check_dir or bundle) / "trtllm" / "serve.sh"), "--port", "9"],
        cwd=cwd or tmp_path,
        capture_output=True,
        text=True,
        env=run_env,
    )


def _one_line_error(res) -> str:
    assert res.returncode == 2 and res.stdout == "", (res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_the_right_release_on_the_planned_gpu_serves_from_the_bundle(tmp_path, bundle):
    res = _run(tmp_path, bundle, version="1.4.0rc1", gpus=[H100_ROW])
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith(f"served from {bundle}: ./target --config ./trtllm/config.yaml")
    assert res.stdout.rstrip().endswith("--port 9")
    res = _run(tmp_path, bundle, version="1.4.0rc1+cu130", gpus=[H100_ROW, H100_ROW])  # a local build suffix
    assert res.returncode == 0, res.stderr


def test_a_wrong_installed_version_is_refused_naming_the_one_needed(tmp_path, bundle):
    err = _one_line_error(_run(tmp_path, bundle, version="1.3.0rc27", gpus=[H100_ROW]))
    assert "TensorRT-LLM 1.3.0rc27 is installed" in err and "planned for TensorRT-LLM 1.4.0rc1" in err
    assert "tensorrt-llm==1.4.0rc1" in err


def test_no_tensorrt_llm_is_refused(tmp_path, bundle):
    err = _one_line_error(_run(tmp_path, bundle, version=None, gpus=[H100_ROW]))
    assert "tensorrt_llm is not installed" in err and "1.4.0rc1" in err


@pytest.mark.parametrize(
    "rows, needle",
    [([H200_ROW], "has 151 GB, not 80 GB"), ([B200_ROW], "is SM100, not SM90"), ([], "0 GPU(s) present, 1 needed")],
)
def test_another_gpu_is_refused_saying_what_differs(tmp_path, bundle, rows, needle):
    err = _one_line_error(_run(tmp_path, bundle, version="1.4.0rc1", gpus=rows))
    assert "planned for 1x H100 (SM90, 80 GB)" in err and needle in err


def test_no_nvidia_smi_is_refused_and_the_checks_can_be_skipped(tmp_path, bundle):
    err = _one_line_error(_run(tmp_path, bundle, version="1.4.0rc1", gpus=None))
    assert "nvidia-smi not found" in err
    res = _run(
        tmp_path,
        bundle,
        version="1.3.0rc27",
        gpus=None,
        env={"DFLASH_SKIP_GPU_CHECK": "1", "DFLASH_SKIP_VERSION_CHECK": "1"},
    )
    assert res.returncode == 0 and res.stdout.startswith("served from")


def test_a_bundle_planned_for_the_cpu_checks_only_the_version(tmp_path):
    root = tmp_path / "cpu-bundle"
    check = serve_sh.ServeCheck(release="1.3.0rc27", gpu="cpu", sm=0, memory_gb=64, gpus=1)
    trtllm.write(root / "trtllm", _config(), "127.0.0.1", 8000, check)
    assert _run(tmp_path, root, version="1.3.0rc27", gpus=None).returncode == 0
    assert "1.3.0rc27" in _one_line_error(_run(tmp_path, root, version="1.3.0rc26", gpus=None))


def test_serve_script_of_a_built_bundle_carries_the_plan(tmp_path):
    from dflash_trt.deploy import build
    from dflash_trt.plan import recipe as R

    out = tmp_path / "tiny"
    build(R.load_recipe("tiny", ["trtllm.release=1.4.0rc1"]), out)  # the one release serving its DFlash2 drafter
    text = (out / "trtllm" / "serve.sh").read_text()
    assert "NEED_TRTLLM=1.4.0rc1" in text and "TensorRT-LLM 1.4.0rc1" in text.splitlines()[1]
    assert os.access(out / "trtllm" / "serve.sh", os.X_OK)
    assert _run(tmp_path, out, version="1.4.0rc1").returncode == 0  # planned for the CPU: no GPU check
    assert "1.4.0rc1" in _one_line_error(_run(tmp_path, out, version="1.3.0rc27"))
