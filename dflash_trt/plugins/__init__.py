"""DFlash's two custom operations, each with interchangeable implementations.

* ``kv_injection``: tapped target hidden states of newly committed tokens -> fc ->
  hidden_norm -> every draft layer's k_norm(k_proj(.)) with RoPE, and v_proj(.) ->
  written into the drafter's paged context KV cache at each sequence's slots.
* ``block_attention``: block queries attend non-causally to [the sequence's context K/V
  from the paged cache ++ the block's own K/V], with GQA, per-sequence context lengths,
  and optional causal / sliding-window modes.

``primitives`` holds the shared math (imports nothing of ours), ``paged_cache`` the drafter's
paged context cache, ``dispatch`` the entry points (``kernels="reference" | "triton"``), and
``op_shapes`` the pure shape/dtype inference; the per-op modules hold the reference (the executable
specification), the Triton kernel, the torch custom op, the ONNX mapping and the TensorRT plugin definition.

DFlash2's two additions need no custom op (standard ONNX ops express them, see each module):
``dynamic_conv`` (the grouped dynamic depthwise causal convolution around every sublayer) and
``selector`` (the candidate selector's walk over each block position's top-k).
"""

from __future__ import annotations

from dflash_trt.plugins.attention import block_visibility
from dflash_trt.plugins.dispatch import KERNELS, block_attention, fused_kv_weights, kv_injection
from dflash_trt.plugins.dynamic_conv import grouped_dynamic_conv
from dflash_trt.plugins.injection import fused_kv
from dflash_trt.plugins.paged_cache import PagedKVCache
from dflash_trt.plugins.primitives import apply_rope, rms_norm, rotate_half
from dflash_trt.plugins.selector import selector_walk, selector_walk_graph, selector_walk_greedy

# Public modules (imported where used: they register ops or need optional packages):
# ``torch_ops`` (torch.library ops), ``onnx_ops`` (ONNX schemas and onnxruntime ops),
# ``trt`` (TensorRT plugin registration: the definitions are ``trt_attention`` and ``trt_injection``,
# the kernels' AOT specs ``trt_specs``), ``triton_kernels`` (needs triton).
__all__ = [
    "onnx_ops",
    "torch_ops",
    "trt",
    "triton_kernels",
    "KERNELS",
    "PagedKVCache",
    "apply_rope",
    "block_attention",
    "block_visibility",
    "fused_kv",
    "fused_kv_weights",
    "grouped_dynamic_conv",
    "kv_injection",
    "rms_norm",
    "rotate_half",
    "selector_walk",
    "selector_walk_graph",
    "selector_walk_greedy",
]
