"""GPU catalog and the precision / draft-attention rules that follow from it.

Figures are NVIDIA's datasheet values (the B300, B200, GB200 NVL72, RTX PRO 6000 Blackwell,
H200, H100, L40S and A100 datasheets): leads for planning, not measurements. Memory is
the datasheet capacity in GB (10^9 bytes), which is slightly *below* what the driver
reports (an "80 GB" H100 exposes ~85.5e9 bytes), so plans err on the safe side.

Rules:

* NVFP4 runs on Blackwell (SM100, SM103, SM120); FP8 on Hopper (SM90), Ada (SM89) and
  Blackwell; Ampere (SM80) has neither; an FP8 KV cache works from Ampere on (TensorRT-LLM
  ``docs/source/features/quantization.md``, "Hardware Support Matrix"). MXFP4 (gpt-oss as
  shipped) is served on Blackwell and, with BF16 activations through the Triton MoE
  backend, on Hopper (TensorRT-LLM ``docs/source/deployment-guide/deployment-guide-for-gpt-oss-on-trtllm.md``,
  "MoE Backend Support Matrix").
* DFlash draft attention backend (TensorRT-LLM ``tensorrt_llm/llmapi/llm_args.py``,
  ``DFlashDecodingConfig.attention_backend``): ``TRTLLM`` on SM100/SM103, ``FA4`` on SM90
  (TensorRT-LLM >= 1.3.0rc27), ``VANILLA`` (flash-attn) elsewhere.
* Peak dense throughput: FP8 is taken as 2x and NVFP4 as 4x the BF16 figure (the
  Hopper/Blackwell tensor-core ratios); used only by the planner's roofline.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace

from dflash_trt.errors import HardwareError

PRECISIONS = ("bf16", "fp8", "nvfp4", "mxfp4")
_FLOPS_FACTOR = {"bf16": 1.0, "fp8": 2.0, "nvfp4": 4.0, "mxfp4": 1.0}  # mxfp4: W4A16 on Hopper


@dataclass(frozen=True)
class GPU:
    name: str
    sm: int
    memory_gb: float
    bandwidth_tbs: float
    bf16_tflops: float
    precisions: frozenset[str]
    aliases: tuple[str, ...] = field(default=())
    kind: str = "gpu"

    @property
    def memory_bytes(self) -> int:
        return int(round(self.memory_gb * 1e9))

    @property
    def bandwidth(self) -> float:
        """Bytes per second."""
        return self.bandwidth_tbs * 1e12

    def peak_flops(self, precision: str = "bf16") -> float:
        """Dense FLOP/s for GEMMs at ``precision`` (falls back to BF16 when not native)."""
        factor = _FLOPS_FACTOR.get(precision, 1.0) if precision in self.precisions else 1.0
        return self.bf16_tflops * 1e12 * factor

    def supports(self, precision: str) -> bool:
        return precision in self.precisions

    @property
    def fp8_kv_cache(self) -> bool:
        return self.sm >= 80

    @property
    def draft_attention_backend(self) -> str:
        """TensorRT-LLM's DFlash ``attention_backend`` for this GPU."""
        if self.sm in (100, 103):
            return "TRTLLM"
        if self.sm == 90:
            return "FA4"
        return "VANILLA"

    @property
    def arch(self) -> str:
        return {0: "CPU", 80: "Ampere", 89: "Ada", 90: "Hopper"}.get(
            self.sm, "Blackwell" if self.sm >= 100 else f"SM{self.sm}"
        )


_BW = frozenset({"bf16", "fp8", "nvfp4", "mxfp4"})
_HOP = frozenset({"bf16", "fp8", "mxfp4"})

CATALOG: tuple[GPU, ...] = (
    GPU("B300", 103, 288, 8.0, 2500, _BW, ("b300", "b300-sxm", "gb300", "blackwell-ultra")),
    GPU("B200", 100, 180, 8.0, 2250, _BW, ("b200", "b200-sxm", "hgx-b200", "dgx-b200")),
    GPU("GB200", 100, 186, 8.0, 2500, _BW, ("gb200", "gb200-nvl72")),
    GPU(
        "RTX PRO 6000 Blackwell",
        120,
        96,
        1.8,
        500,
        _BW,
        ("rtx-pro-6000", "rtx-pro-6000-blackwell", "rtxpro6000", "rtx6000-pro", "rtx pro 6000"),
    ),
    GPU("H200", 90, 141, 4.8, 989, _HOP, ("h200", "h200-sxm", "h200-nvl")),
    GPU("H100", 90, 80, 3.35, 989, _HOP, ("h100", "h100-sxm", "h100-sxm5", "h100-80gb")),
    GPU("H100 PCIe", 90, 80, 2.0, 756, _HOP, ("h100-pcie",)),
    GPU("L40S", 89, 48, 0.864, 362, frozenset({"bf16", "fp8"}), ("l40s",)),
    GPU("A100 80GB", 80, 80, 2.0, 312, frozenset({"bf16"}), ("a100", "a100-80gb", "a100-sxm", "a100-80g")),
    GPU("A100 40GB", 80, 40, 1.555, 312, frozenset({"bf16"}), ("a100-40gb", "a100-40g")),
    # The embedded path: the reference runtime on the host. Memory: the machine's own (``get``);
    # bandwidth and FLOPs are nominal: the CPU calibration (stack "reference") is fitted on them.
    GPU("cpu", 0, 64, 0.05, 1.0, frozenset({"bf16"}), ("cpu", "host"), kind="cpu"),
)


def _norm(name: str) -> str:
    return " ".join(name.strip().lower().replace("_", "-").split())


def host_memory_bytes() -> int | None:
    """This machine's physical memory (``sysconf``), or None where the OS does not say."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def get_gpu(name: str) -> GPU:
    """Look a GPU up by name or alias (case-insensitive; 'NVIDIA ' prefix tolerated); ``cpu`` has
    the memory of the machine it runs on."""
    key = _norm(name).removeprefix("nvidia ").strip()
    for gpu in CATALOG:
        if key == _norm(gpu.name) or key in gpu.aliases or key.replace(" ", "-") in gpu.aliases:
            host = host_memory_bytes() if gpu.kind == "cpu" else None
            return replace(gpu, memory_gb=round(host / 1e9, 3)) if host else gpu
    known = ", ".join(g.name for g in CATALOG)
    raise HardwareError(f"unknown GPU {name!r}; known: {known}")


def supporting(precision: str) -> list[str]:
    return [g.name for g in CATALOG if g.kind == "gpu" and g.supports(precision)]


def check_precision(gpu: GPU, precision: str, kv_cache: str = "auto") -> None:
    """Refuse a weight or KV-cache precision the GPU cannot run, naming the GPUs that can."""
    if not gpu.supports(precision):
        where = "the CPU reference runtime" if gpu.kind == "cpu" else f"{gpu.name} ({gpu.arch}, SM{gpu.sm})"
        raise HardwareError(
            f"{precision} weights do not run on {where}; GPUs that can: {', '.join(supporting(precision))} "
            "(choose one with --gpu, or another --precision)"
        )
    if kv_cache == "fp8" and not gpu.fp8_kv_cache:
        can = ", ".join(g.name for g in CATALOG if g.kind == "gpu" and g.fp8_kv_cache)
        raise HardwareError(f"an FP8 KV cache does not run on {gpu.name}; GPUs that can: {can}")
