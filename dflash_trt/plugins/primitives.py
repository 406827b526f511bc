"""The shared math of the DFlash ops: RMSNorm and rotary embeddings. Imports nothing of ours.

Every implementation (the reference, the Triton kernels' host code, the drafter module, the
ONNX export) computes these the same way: RMSNorm in float32, then cast back; RoPE in the
``rotate_half`` convention (the first and second halves of the head are the pairs).
"""

from __future__ import annotations

import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm in float32, cast back, then scaled (Hugging Face Llama/Qwen3 numerics)."""
    dtype = x.dtype
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [b, T, heads, d]; cos/sin: [b, T, d]."""
    return x * cos[:, :, None] + rotate_half(x) * sin[:, :, None]
