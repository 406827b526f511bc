"""The TensorRT plugin ``dflash::BlockDiffusionAttention`` (``tensorrt.plugin``, TensorRT >= 10.8).

Invariant: the plugin's inputs and attributes are ``onnx_ops``' ``BLOCK_ATTENTION_INPUTS`` and
``BLOCK_ATTENTION_INT_ATTRS`` + ``BLOCK_ATTENTION_FLOAT_ATTRS``, by name and in order (TensorRT's
ONNX parser maps a node onto the plugin by them); the output is ``q``'s shape and dtype. Three
definitions, registered in this order: the shape/dtype descriptor (``op_shapes``), the AOT Triton
kernel (``trt_specs``), the torch JIT fallback (``triton_kernels.block_attention``).

Loaded only by ``plugins.trt._define``, after tensorrt and triton imported, so triton and torch
are imported at the top. No ``from __future__ import annotations``: ``tensorrt.plugin`` reads the
decorated functions' annotations as objects.
"""

import torch

from dflash_trt.plugins import triton_kernels as tk
from dflash_trt.plugins.op_shapes import block_attention_shapes
from dflash_trt.plugins.trt_specs import block_attention_aot_spec, compile_kernel, desc_dims, desc_dtype

NAME = "dflash::BlockDiffusionAttention"


def define_block_attention(trt, trtp) -> None:
    """Register the descriptor, the AOT kernel and the JIT fallback of ``dflash::BlockDiffusionAttention``."""
    _register_descriptor(trt, trtp)
    _register_aot(trt, trtp)
    _register_jit(trtp)


def _register_descriptor(trt, trtp) -> None:
    """``@trtp.register``: the output is ``q``'s shape and dtype, once ``op_shapes`` accepts the inputs."""

    @trtp.register(NAME)
    def _ba_desc(
        q: trtp.TensorDesc,
        k: trtp.TensorDesc,
        v: trtp.TensorDesc,
        k_cache: trtp.TensorDesc,
        v_cache: trtp.TensorDesc,
        page_table: trtp.TensorDesc,
        lengths: trtp.TensorDesc,
        layer: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        block_size: int,
        page_size: int,
        causal: int,
        window: int,
        scale: float,
    ) -> trtp.TensorDesc:
        block_attention_shapes(
            desc_dims(q),
            desc_dims(k),
            desc_dims(k_cache),
            desc_dtype(trt, q),
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            block_size=block_size,
        )
        return q.like()


def _register_aot(trt, trtp) -> None:
    """``@trtp.aot_impl``: the kernel's PTX, a (batch, kv heads, m tiles) grid, and the runtime scalars
    (max_pages, the per-layer stride of the caches) as expressions of the input shapes."""

    @trtp.aot_impl(NAME)
    def _ba_aot(
        q: trtp.TensorDesc,
        k: trtp.TensorDesc,
        v: trtp.TensorDesc,
        k_cache: trtp.TensorDesc,
        v_cache: trtp.TensorDesc,
        page_table: trtp.TensorDesc,
        lengths: trtp.TensorDesc,
        layer: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        block_size: int,
        page_size: int,
        causal: int,
        window: int,
        scale: float,
        outputs: tuple[trtp.TensorDesc],
        tactic: int,
    ) -> tuple[str | bytes, str | bytes, trtp.KernelLaunchParams, trtp.SymExprs]:
        sig, const, cfg = block_attention_aot_spec(
            desc_dtype(trt, q),
            desc_dtype(trt, k_cache),
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            block_size=block_size,
            page_size=page_size,
            causal=causal,
            window=window,
            scale=scale,
            layer=layer,
        )
        compiled = compile_kernel(tk._block_attention_kernel, sig, const)
        launch = trtp.KernelLaunchParams()
        launch.grid_x = q.shape_expr[0]
        launch.grid_y = num_kv_heads
        launch.grid_z = cfg["m_tiles"]
        launch.block_x = compiled.metadata.num_warps * 32
        launch.shared_mem = compiled.metadata.shared
        extra = trtp.SymIntExprs(2)
        extra[0] = trtp.SymInt32(page_table.shape_expr[1])  # max_pages
        extra[1] = trtp.SymInt32(k_cache.shape_expr[1] * (page_size * num_kv_heads * head_dim))  # layer stride
        return compiled.metadata.name, compiled.asm["ptx"], launch, extra


def _register_jit(trtp) -> None:
    """``@trtp.impl``: the same kernel launched from Python through torch, on TensorRT's stream."""

    @trtp.impl(NAME)
    def _ba_impl(
        q: trtp.Tensor,
        k: trtp.Tensor,
        v: trtp.Tensor,
        k_cache: trtp.Tensor,
        v_cache: trtp.Tensor,
        page_table: trtp.Tensor,
        lengths: trtp.Tensor,
        layer: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        block_size: int,
        page_size: int,
        causal: int,
        window: int,
        scale: float,
        outputs: tuple[trtp.Tensor],
        stream: int,
    ) -> None:
        t = lambda x: torch.as_tensor(x, device="cuda")  # noqa: E731
        with torch.cuda.stream(torch.cuda.ExternalStream(stream)):
            tk.block_attention(
                t(q),
                t(k),
                t(v),
                t(k_cache),
                t(v_cache),
                t(page_table),
                t(lengths),
                causal=bool(causal),
                window=window or None,
                scale=scale,
                layer=layer,
                out=t(outputs[0]),
            )
