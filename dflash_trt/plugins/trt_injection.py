"""The TensorRT plugin ``dflash::KVInjection`` (``tensorrt.plugin``, TensorRT >= 10.8).

Invariant: the plugin's inputs and attributes are ``onnx_ops``' ``KV_INJECTION_INPUTS`` and
``KV_INJECTION_INT_ATTRS`` + ``KV_INJECTION_FLOAT_ATTRS``, by name and in order (TensorRT's ONNX
parser maps a node onto the plugin by them); its two outputs are ``aliased()`` to the ``k_cache``
and ``v_cache`` inputs, so the update is in place. Three definitions, registered in this order: the
shape/dtype descriptor (``op_shapes``), the AOT Triton kernel (``trt_specs``), the torch JIT
fallback (``triton_kernels.kv_scatter``).

Loaded only by ``plugins.trt._define``, after tensorrt and triton imported, so triton and torch
are imported at the top. No ``from __future__ import annotations``: ``tensorrt.plugin`` reads the
decorated functions' annotations as objects.
"""

import torch

from dflash_trt.plugins import triton_kernels as tk
from dflash_trt.plugins.op_shapes import kv_injection_shapes
from dflash_trt.plugins.trt_specs import compile_kernel, desc_dims, desc_dtype, kv_injection_aot_spec

NAME = "dflash::KVInjection"


def define_kv_injection(trt, trtp) -> None:
    """Register the descriptor, the AOT kernel and the JIT fallback of ``dflash::KVInjection``."""
    _register_descriptor(trt, trtp)
    _register_aot(trt, trtp)
    _register_jit(trtp)


def _register_descriptor(trt, trtp) -> None:
    """``@trtp.register``: the outputs alias the caches, once ``op_shapes`` accepts the inputs."""

    @trtp.register(NAME)
    def _kv_desc(
        kv: trtp.TensorDesc,
        k_norm_weight: trtp.TensorDesc,
        inv_freq: trtp.TensorDesc,
        n_new: trtp.TensorDesc,
        lengths: trtp.TensorDesc,
        page_table: trtp.TensorDesc,
        k_cache: trtp.TensorDesc,
        v_cache: trtp.TensorDesc,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        page_size: int,
        rope_theta: float,
        rope_scale: float,
        eps: float,
    ) -> tuple[trtp.TensorDesc, trtp.TensorDesc]:
        kv_injection_shapes(
            desc_dims(kv),
            desc_dims(k_norm_weight),
            desc_dims(k_cache),
            desc_dims(v_cache),
            desc_dtype(trt, kv),
            desc_dtype(trt, k_cache),
            num_layers=num_layers,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            page_size=page_size,
        )
        return k_cache.aliased(), v_cache.aliased()


def _register_aot(trt, trtp) -> None:
    """``@trtp.aot_impl``: the kernel's PTX, a (batch * T, layers) grid, and the runtime scalars
    (T, max_pages, the per-layer stride of the caches) as expressions of the input shapes."""

    @trtp.aot_impl(NAME)
    def _kv_aot(
        kv: trtp.TensorDesc,
        k_norm_weight: trtp.TensorDesc,
        inv_freq: trtp.TensorDesc,
        n_new: trtp.TensorDesc,
        lengths: trtp.TensorDesc,
        page_table: trtp.TensorDesc,
        k_cache: trtp.TensorDesc,
        v_cache: trtp.TensorDesc,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        page_size: int,
        rope_theta: float,
        rope_scale: float,
        eps: float,
        outputs: tuple[trtp.TensorDesc],
        tactic: int,
    ) -> tuple[str | bytes, str | bytes, trtp.KernelLaunchParams, trtp.SymExprs]:
        sig, const = kv_injection_aot_spec(
            desc_dtype(trt, kv),
            desc_dtype(trt, k_cache),
            num_layers=num_layers,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            page_size=page_size,
            eps=eps,
            rope_scale=rope_scale,
        )
        compiled = compile_kernel(tk._kv_scatter_kernel, sig, const)
        launch = trtp.KernelLaunchParams()
        launch.grid_x = kv.shape_expr[0] * kv.shape_expr[1]
        launch.grid_y = num_layers
        launch.block_x = compiled.metadata.num_warps * 32
        launch.shared_mem = compiled.metadata.shared
        extra = trtp.SymIntExprs(3)
        extra[0] = trtp.SymInt32(kv.shape_expr[1])  # T
        extra[1] = trtp.SymInt32(page_table.shape_expr[1])  # max_pages
        extra[2] = trtp.SymInt32(k_cache.shape_expr[1] * (page_size * num_kv_heads * head_dim))
        return compiled.metadata.name, compiled.asm["ptx"], launch, extra


def _register_jit(trtp) -> None:
    """``@trtp.impl``: the same kernel launched from Python through torch, on TensorRT's stream."""

    @trtp.impl(NAME)
    def _kv_impl(
        kv: trtp.Tensor,
        k_norm_weight: trtp.Tensor,
        inv_freq: trtp.Tensor,
        n_new: trtp.Tensor,
        lengths: trtp.Tensor,
        page_table: trtp.Tensor,
        k_cache: trtp.Tensor,
        v_cache: trtp.Tensor,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        page_size: int,
        rope_theta: float,
        rope_scale: float,
        eps: float,
        outputs: tuple[trtp.Tensor, trtp.Tensor],
        stream: int,
    ) -> None:
        t = lambda x: torch.as_tensor(x, device="cuda")  # noqa: E731
        with torch.cuda.stream(torch.cuda.ExternalStream(stream)):
            tk.kv_scatter(
                t(kv),
                t(k_norm_weight),
                t(inv_freq),
                t(n_new),
                t(lengths),
                t(page_table),
                t(outputs[0]),
                t(outputs[1]),
                eps=eps,
                rope_scale=rope_scale,
                num_kv_heads=num_kv_heads,
                head_dim=head_dim,
            )
