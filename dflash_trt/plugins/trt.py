"""TensorRT plugin definitions of the DFlash ops (TensorRT >= 10.8 Python plugins, ``tensorrt.plugin``).

``register_trt_plugins()`` registers, only when ``tensorrt`` imports:

* ``dflash::BlockDiffusionAttention`` and ``dflash::KVInjection`` shape/dtype descriptors
  (``@trtp.register``; the logic is the pure functions in ``plugins/op_shapes.py``; the
  KVInjection outputs are ``aliased()`` to the cache inputs, so the update is in place),
* ``@trtp.aot_impl``: the Triton kernels of ``plugins/triton_kernels.py`` compiled ahead of
  time to PTX (the float attributes and the small ints become compile-time constants; the
  runtime scalars are ``SymInt32`` expressions of the input shapes), launched by TensorRT
  with arguments ``(inputs..., extra scalars..., outputs...)`` - the kernels' own order,
* ``@trtp.impl``: the same kernels launched from Python through torch (JIT fallback).

The ONNX parser maps a ``dflash`` node onto these by op_type plus the ``plugin_namespace``
attribute, which ``engine.build_engines`` adds. Nothing here was run against a real
TensorRT (none can be installed on the development machine); the PTX compile path
(:func:`compile_block_attention`, :func:`compile_kv_injection`) runs with triton alone.

Known risk (unverified without TensorRT): Triton >= 3.3 appends two hidden pointer
parameters (global/profile scratch) to every compiled kernel; the kernels here use no
scratch, but if the installed TensorRT launches AOT kernels with exactly
(inputs, extra args, outputs), pin a TensorRT whose QDP AOT path supports the Triton in
use (check ``compiled.asm["ptx"]``'s ``.entry`` parameter list) or use the ``@trtp.impl``
JIT path.

No ``from __future__ import annotations`` here: ``tensorrt.plugin`` reads the decorated
functions' annotations as objects.
"""

from typing import NamedTuple

from dflash_trt.plugins.op_shapes import block_attention_shapes, kv_injection_shapes

_TRITON_DTYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
_REGISTERED = False


class Registration(NamedTuple):
    ok: bool
    reason: str

    def __bool__(self) -> bool:  # ``if register_trt_plugins():`` reads naturally
        return self.ok


def _tt(dtype) -> str:
    name = str(dtype).removeprefix("torch.").removeprefix("DataType.").lower()
    name = {"float": "float32", "half": "float16"}.get(name, name)
    if name not in _TRITON_DTYPES:
        raise ValueError(f"unsupported dtype {dtype} for the dflash plugins")
    return _TRITON_DTYPES[name]


def block_attention_aot_spec(
    dtype,
    cache_dtype,
    *,
    num_heads,
    num_kv_heads,
    head_dim,
    block_size,
    page_size,
    causal,
    window,
    scale,
    layer,
    block_n=64,
):
    """(signature, constexprs, launch config) for compiling ``_block_attention_kernel``."""
    from dflash_trt.plugins.triton_kernels import LOG2E, block_attention_launch_config

    cfg = block_attention_launch_config(block_size, num_heads, num_kv_heads, head_dim, block_n=block_n)
    t, c = _tt(dtype), _tt(cache_dtype)
    signature = {
        "q_ptr": f"*{t}",
        "k_ptr": f"*{t}",
        "v_ptr": f"*{t}",
        "kc_ptr": f"*{c}",
        "vc_ptr": f"*{c}",
        "pt_ptr": "*i32",
        "len_ptr": "*i64",
        "B": "constexpr",
        "max_pages": "i32",
        "layer_stride": "i32",
        "layer": "constexpr",
        "page_size": "constexpr",
        "window": "constexpr",
        "qk_scale": "constexpr",
        "o_ptr": f"*{t}",
    }
    const = dict(
        B=block_size,
        layer=layer,
        page_size=page_size,
        window=int(window or 0),
        qk_scale=float(scale) * LOG2E,
        KVH=num_kv_heads,
        REP=cfg["REP"],
        D=head_dim,
        BLOCK_D=cfg["BLOCK_D"],
        BLOCK_M=cfg["BLOCK_M"],
        BLOCK_N=cfg["BLOCK_N"],
        BLOCK_B=cfg["BLOCK_B"],
        CAUSAL=bool(causal),
        USE_WINDOW=bool(window),
        IEEE=t == "fp32",
        UPCAST=False,
    )
    for name in (
        "KVH",
        "REP",
        "D",
        "BLOCK_D",
        "BLOCK_M",
        "BLOCK_N",
        "BLOCK_B",
        "CAUSAL",
        "USE_WINDOW",
        "IEEE",
        "UPCAST",
    ):
        signature[name] = "constexpr"
    return signature, const, cfg


def kv_injection_aot_spec(dtype, cache_dtype, *, num_layers, num_kv_heads, head_dim, page_size, eps, rope_scale):
    from dflash_trt.plugins.triton_kernels import _pow2

    t, c = _tt(dtype), _tt(cache_dtype)
    signature = {
        "kv_ptr": f"*{t}",
        "knorm_ptr": f"*{t}",
        "inv_freq_ptr": "*fp32",
        "n_new_ptr": "*i64",
        "len_ptr": "*i64",
        "pt_ptr": "*i32",
        "kc_in_ptr": f"*{c}",
        "vc_in_ptr": f"*{c}",
        "T": "i32",
        "max_pages": "i32",
        "layer_stride": "i32",
        "page_size": "constexpr",
        "eps": "constexpr",
        "rope_scale": "constexpr",
        "kc_ptr": f"*{c}",
        "vc_ptr": f"*{c}",
        "L": "constexpr",
        "KVH": "constexpr",
        "D": "constexpr",
        "BLOCK_H": "constexpr",
        "BLOCK_HALF": "constexpr",
    }
    const = dict(
        page_size=page_size,
        eps=float(eps),
        rope_scale=float(rope_scale),
        L=num_layers,
        KVH=num_kv_heads,
        D=head_dim,
        BLOCK_H=_pow2(num_kv_heads),
        BLOCK_HALF=_pow2(head_dim // 2),
    )
    return signature, const


def _compile(kernel, signature, constexprs, target=None):
    import triton
    from triton.compiler import ASTSource

    src = ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
    return triton.compile(src, target=target) if target is not None else triton.compile(src)


def compile_block_attention(dtype="float32", cache_dtype=None, target=None, **attrs):
    """Compile ``_block_attention_kernel`` to PTX for these attributes (needs a non-interpreted
    triton; ``target`` e.g. ``triton.backends.compiler.GPUTarget("cuda", 90, 32)``)."""
    from dflash_trt.plugins import triton_kernels as tk

    sig, const, _ = block_attention_aot_spec(dtype, cache_dtype or dtype, **attrs)
    return _compile(tk._block_attention_kernel, sig, const, target)


def compile_kv_injection(dtype="float32", cache_dtype=None, target=None, **attrs):
    from dflash_trt.plugins import triton_kernels as tk

    sig, const = kv_injection_aot_spec(dtype, cache_dtype or dtype, **attrs)
    return _compile(tk._kv_scatter_kernel, sig, const, target)


def register_trt_plugins() -> Registration:
    """Register both plugins with TensorRT's plugin registry. Falsy ``Registration`` with the
    reason when TensorRT (with ``tensorrt.plugin``) or a compiling triton is unavailable."""
    global _REGISTERED
    try:
        import tensorrt as trt
        import tensorrt.plugin as trtp
    except ImportError as exc:
        return Registration(False, f"tensorrt with tensorrt.plugin (TensorRT >= 10.8) is not importable: {exc}")
    try:
        import triton  # noqa: F401
    except ImportError as exc:
        return Registration(False, f"triton is needed to compile the plugin kernels: {exc}")
    from dflash_trt.plugins.triton_kernels import interpreted

    if interpreted():
        return Registration(False, "TRITON_INTERPRET is set: the AOT plugins need compiled (not interpreted) kernels")
    if _REGISTERED:
        return Registration(True, "already registered")
    try:
        _define(trt, trtp)
    except Exception as exc:  # noqa: BLE001 - report, don't crash the CLI
        return Registration(False, f"tensorrt.plugin rejected the dflash plugin definitions: {exc}")
    _REGISTERED = True
    return Registration(True, "registered dflash::BlockDiffusionAttention and dflash::KVInjection")


def _define(trt, trtp) -> None:  # pragma: no cover - needs TensorRT
    _define_block_attention(trt, trtp)
    _define_kv_injection(trt, trtp)


def _dtype_name(trt, desc) -> str:  # pragma: no cover - needs TensorRT
    return {trt.float32: "float32", trt.float16: "float16", trt.bfloat16: "bfloat16"}[desc.dtype]


def _dims(desc) -> tuple:  # pragma: no cover - needs TensorRT
    """A TensorDesc's shape: known extents as ints, symbolic ones as their expressions."""
    return tuple(e.constant_value() if (not e.is_fake and e.is_constant) else e for e in desc.shape_expr)


def _define_block_attention(trt, trtp) -> None:  # pragma: no cover - needs TensorRT
    """``dflash::BlockDiffusionAttention``: shape descriptor, AOT kernel, torch JIT fallback."""

    def dt(desc):
        return _dtype_name(trt, desc)

    @trtp.register("dflash::BlockDiffusionAttention")
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
            _dims(q),
            _dims(k),
            _dims(k_cache),
            dt(q),
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            block_size=block_size,
        )
        return q.like()

    @trtp.aot_impl("dflash::BlockDiffusionAttention")
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
            dt(q),
            dt(k_cache),
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
        from dflash_trt.plugins import triton_kernels as tk

        compiled = _compile(tk._block_attention_kernel, sig, const)
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

    @trtp.impl("dflash::BlockDiffusionAttention")
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
        import torch

        from dflash_trt.plugins import triton_kernels as tk

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


def _define_kv_injection(trt, trtp) -> None:  # pragma: no cover - needs TensorRT
    """``dflash::KVInjection``: shape descriptor (outputs alias the caches), AOT kernel, torch JIT fallback."""

    def dt(desc):
        return _dtype_name(trt, desc)

    @trtp.register("dflash::KVInjection")
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
            _dims(kv),
            _dims(k_norm_weight),
            _dims(k_cache),
            _dims(v_cache),
            dt(kv),
            dt(k_cache),
            num_layers=num_layers,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            page_size=page_size,
        )
        return k_cache.aliased(), v_cache.aliased()

    @trtp.aot_impl("dflash::KVInjection")
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
        from dflash_trt.plugins import triton_kernels as tk

        sig, const = kv_injection_aot_spec(
            dt(kv),
            dt(k_cache),
            num_layers=num_layers,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            page_size=page_size,
            eps=eps,
            rope_scale=rope_scale,
        )
        compiled = _compile(tk._kv_scatter_kernel, sig, const)
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

    @trtp.impl("dflash::KVInjection")
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
        import torch

        from dflash_trt.plugins import triton_kernels as tk

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
