"""DFlash2's grouped dynamic depthwise causal convolution: the reference (the specification).

DFlash2 (z-lab's ``dflash`` package, ``dflash/model.py``, ``GroupedDynamicCausalConv``; vLLM PR
#52816) wraps every attention and MLP sublayer of the drafter in a short convolution along the
block, so a block position sees the ones before it without another backbone pass::

    out[t, c] = sum_{o < K} (base[o, c] + dynamic[t, o, c // group]) * x[t - o, c]

``x[t - o]`` is zero before the block's first position: taps never cross a block boundary
(the anchor, position 0, has no predecessor). ``base`` [K, H] is a learned static kernel;
``dynamic`` [.., L, K, G] is predicted per position from the sublayer's (normed) input and shared
by each group of ``group_size`` channels (G = H / group_size).

The formula is a handful of elementwise products over shifted copies of ``x``, so it needs no
custom op: the drafter's ONNX export lowers it to standard Pad/Slice/Mul/Add nodes, which
TensorRT fuses by itself (a plugin would only stop that fusion).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def grouped_dynamic_conv(
    x: torch.Tensor, dynamic: torch.Tensor, base: torch.Tensor, group_size: int, block_len: int | None = None
) -> torch.Tensor:
    """x [b, L, H]; dynamic [b, L, K, G]; base [K, H] -> [b, L, H] in x's dtype.

    ``block_len`` (default L): the length of each independent block the L positions hold back
    to back (training runs many blocks per row); L must be a multiple of it.
    """
    b, L, H = x.shape
    K, G = base.shape[0], H // group_size
    n = block_len or L
    if L % n:
        raise ValueError(f"{L} positions are not whole blocks of {n}")
    xs = x.reshape(b * (L // n), n, G, group_size)  # [blocks, n, G, gs]
    dyn = dynamic.reshape(b * (L // n), n, K, G, 1)
    out = torch.zeros_like(xs)
    for o in range(K):
        shifted = xs if o == 0 else F.pad(xs[:, : n - o], (0, 0, 0, 0, o, 0))  # x[t - o], zero before 0
        out = out + (base[o].view(1, 1, G, group_size).to(x.dtype) + dyn[:, :, o]) * shifted
    return out.reshape(b, L, H)


def grouped_dynamic_conv_dense(
    x: torch.Tensor, dynamic: torch.Tensor, base: torch.Tensor, group_size: int
) -> torch.Tensor:
    """The same convolution as one dense [L, L] mixing per channel (a test oracle, O(L^2 H)).

    weight[t, s, c] = base[t - s, c] + dynamic[t, t - s, c // group] when 0 <= t - s < K, else 0;
    out[t, c] = sum_s weight[t, s, c] x[s, c].
    """
    b, L, H = x.shape
    K = base.shape[0]
    per_channel = dynamic.repeat_interleave(group_size, dim=-1)  # [b, L, K, H]
    weight = x.new_zeros(b, L, L, H)
    for t in range(L):
        for s in range(max(0, t - K + 1), t + 1):
            weight[:, t, s] = base[t - s].to(x.dtype) + per_channel[:, t, t - s]
    return torch.einsum("btsc,bsc->btc", weight, x)
