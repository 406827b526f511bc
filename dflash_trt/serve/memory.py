"""Will a checkpoint fit in this machine's RAM? Estimated from file sizes and configs alone.

The reference runtime computes on the CPU, so ``dflash-trt serve --server embedded`` refuses,
in one line and before loading anything, a model whose weights would not fit.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from dflash_trt.errors import HardwareError

_STORED_BYTES = {"float32": 4, "float64": 8, "bfloat16": 2, "float16": 2}


def weight_bytes(model_dir, runtime_itemsize: int) -> int:
    """Bytes the weights of a checkpoint directory take once loaded at ``runtime_itemsize``
    bytes per parameter, estimated from its safetensors sizes and config (nothing loaded)."""
    model_dir = Path(model_dir)
    stored = sum(f.stat().st_size for f in model_dir.glob("*.safetensors"))
    per_param = 2.0
    cfg_path = model_dir / "config.json"
    if cfg_path.is_file():
        try:
            cfg = json.loads(cfg_path.read_text())
        except json.JSONDecodeError:
            cfg = {}
        per_param = _STORED_BYTES.get(str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"), 2.0)
        quant = json.dumps(cfg.get("quantization_config") or {}).upper()
        if "NVFP4" in quant or "FP4" in quant:
            per_param = 0.5625  # two e2m1 per byte + an fp8 scale per 16
        elif "FP8" in quant:
            per_param = 1.0
    return int(stored / per_param * runtime_itemsize)


def physical_memory() -> int | None:
    """Bytes of RAM this machine has, or None where POSIX ``sysconf`` cannot say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
        return None


def check_fits_cpu(name: str, model_dirs, runtime_itemsize: int, fraction: float = 0.8) -> None:
    """Refuse, in one line, a model whose weights would not fit in ``fraction`` of this machine's RAM."""
    need = sum(weight_bytes(d, runtime_itemsize) for d in model_dirs)
    total = physical_memory()
    if total is not None and need > fraction * total:
        raise HardwareError(
            f"{name}: its weights need ~{need / 2**30:.1f} GiB at {runtime_itemsize * 8}-bit on the CPU "
            f"but this machine has {total / 2**30:.1f} GiB; too large for the reference runtime: serve it "
            "with trtllm-serve on a GPU (dflash-trt serve OUT --server trtllm, where TensorRT-LLM is installed)"
        )
