"""ModelOpt FP8 / NVFP4 exports as dense weights, so the reference runtime runs a quantized bundle.

Weight-only: the scales are applied and dropped, activations stay in the runtime dtype, so
acceptance measured on the CPU reflects the quantized target's weights. The layouts are
ModelOpt's export format (``modelopt.torch.export.export_hf_checkpoint``): FP8 ``weight``
float8_e4m3fn with an fp32 per-tensor ``weight_scale``; NVFP4 ``weight`` uint8 (two e2m1
values per byte, low nibble first), float8_e4m3fn ``weight_scale`` per 16 inputs and an
fp32 ``weight_scale_2``.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def unpack_nvfp4(packed: torch.Tensor, scale: torch.Tensor, scale_2: torch.Tensor) -> torch.Tensor:
    """(out, in/2) uint8 -> (out, in) float32; low nibble first; FP8 block scales per 16."""
    lo, hi = packed & 0x0F, packed >> 4
    nib = torch.stack([lo, hi], dim=-1).reshape(packed.shape[0], -1).long()
    vals = E2M1[nib & 7] * torch.where(nib & 8 > 0, -1.0, 1.0)
    blocks = scale.to(torch.float32).repeat_interleave(16, dim=1) * scale_2.to(torch.float32)
    return vals * blocks


def dequantize_state(directory: Path, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """A ModelOpt FP8/NVFP4 export as dense weights (scales applied, scale tensors dropped)."""
    state: dict[str, torch.Tensor] = {}
    for f in sorted(Path(directory).glob("*.safetensors")):
        state.update(load_file(str(f)))
    out = {}
    for k, v in state.items():
        if k.endswith((".weight_scale", ".weight_scale_2", ".input_scale", ".k_scale", ".v_scale")):
            continue
        m = k[: -len(".weight")] if k.endswith(".weight") else None
        if m is not None and f"{m}.weight_scale" in state:
            s = state[f"{m}.weight_scale"]
            if v.dtype == torch.uint8:
                v = unpack_nvfp4(v, s, state[f"{m}.weight_scale_2"])
            else:
                v = v.to(torch.float32) * s.to(torch.float32)
        out[k] = v.to(dtype)
    return out
