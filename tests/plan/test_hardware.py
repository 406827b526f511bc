"""GPU catalog: aliases, SM, precision rules and the DFlash draft attention backend per SM."""

from __future__ import annotations

import pytest

from dflash_trt.errors import HardwareError
from dflash_trt.plan import hardware as hw


@pytest.mark.parametrize(
    "alias, name, sm",
    [
        ("b200", "B200", 100),
        ("B200", "B200", 100),
        ("NVIDIA B200", "B200", 100),
        ("gb300", "B300", 103),
        ("B300", "B300", 103),
        ("GB200", "GB200", 100),
        ("rtx-pro-6000", "RTX PRO 6000 Blackwell", 120),
        ("h200", "H200", 90),
        ("h100-sxm", "H100", 90),
        ("H100", "H100", 90),
        ("h100-pcie", "H100 PCIe", 90),
        ("L40S", "L40S", 89),
        ("a100", "A100 80GB", 80),
        ("A100-40GB", "A100 40GB", 80),
        ("cpu", "cpu", 0),
    ],
)
def test_aliases_are_case_insensitive(alias, name, sm):
    g = hw.get_gpu(alias)
    assert (g.name, g.sm) == (name, sm)


def test_datasheet_figures():
    assert hw.get_gpu("h100").memory_bytes == 80 * 10**9 and hw.get_gpu("h100").bandwidth == 3.35e12
    assert hw.get_gpu("b200").memory_gb == 180 and hw.get_gpu("b300").memory_gb == 288
    assert hw.get_gpu("h200").memory_gb == 141
    assert hw.get_gpu("b200").peak_flops("nvfp4") == 4 * hw.get_gpu("b200").peak_flops("bf16")
    assert hw.get_gpu("h100").peak_flops("nvfp4") == hw.get_gpu("h100").peak_flops("bf16")  # not native: no gain


@pytest.mark.parametrize(
    "gpu, backend",
    [
        ("b200", "TRTLLM"),
        ("b300", "TRTLLM"),
        ("gb200", "TRTLLM"),
        ("h100", "FA4"),
        ("h200", "FA4"),
        ("rtx-pro-6000", "VANILLA"),
        ("l40s", "VANILLA"),
        ("a100", "VANILLA"),
    ],
)
def test_draft_attention_backend_per_sm(gpu, backend):
    assert hw.get_gpu(gpu).draft_attention_backend == backend


def test_precision_support_matrix():
    assert {g for g in hw.supporting("nvfp4")} == {"B300", "B200", "GB200", "RTX PRO 6000 Blackwell"}
    assert set(hw.supporting("fp8")) == {
        "B300",
        "B200",
        "GB200",
        "RTX PRO 6000 Blackwell",
        "H200",
        "H100",
        "H100 PCIe",
        "L40S",
    }
    assert "A100 80GB" in hw.supporting("bf16")


def test_nvfp4_on_hopper_names_the_gpus_that_can():
    with pytest.raises(HardwareError) as e:
        hw.check_precision(hw.get_gpu("h100"), "nvfp4")
    msg = str(e.value)
    assert "H100" in msg and "B200" in msg and "B300" in msg and "RTX PRO 6000" in msg
    assert "H200," not in msg.split("can:")[1]


def test_fp8_on_ampere_refused_but_fp8_kv_allowed():
    with pytest.raises(HardwareError, match="fp8 weights do not run on A100.*H100"):
        hw.check_precision(hw.get_gpu("a100"), "fp8")
    hw.check_precision(hw.get_gpu("a100"), "bf16", kv_cache="fp8")
    with pytest.raises(HardwareError, match="FP8 KV cache"):
        hw.check_precision(hw.get_gpu("cpu"), "bf16", kv_cache="fp8")


def test_unknown_gpu_lists_the_catalog():
    with pytest.raises(HardwareError, match="unknown GPU 'tpu-v5'.*B200.*H100"):
        hw.get_gpu("tpu-v5")
