"""What TensorRT and Triton are told about each dflash kernel, computed without TensorRT.

Invariant: a spec's ``signature`` lists the kernel's parameters in the kernel's own order -
inputs, the runtime scalars (``i32``, which the TensorRT plugin passes as ``SymInt32``
expressions of the input shapes), outputs, then the ``constexpr`` meta-parameters - because
TensorRT launches an AOT kernel with ``(inputs..., extra scalars..., outputs...)``. Float
attributes and small ints become compile-time constants (``constexprs``).

The spec functions need only ``triton_kernels``' launch arithmetic; :func:`compile_kernel`
(and the two ``compile_*`` entry points) compile to PTX with triton alone - no TensorRT, and no
GPU with an explicit ``target``. :func:`desc_dtype` and :func:`desc_dims` read a TensorRT
``TensorDesc`` into the plain values the specs and ``op_shapes`` take.
"""

from __future__ import annotations

_TRITON_DTYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
# the meta-parameters of ``_block_attention_kernel`` after its outputs, in its order
_BLOCK_ATTENTION_META = (
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
)


def triton_dtype(dtype) -> str:
    """Triton's pointer element name (``fp32``/``fp16``/``bf16``) for a torch, TensorRT or plain dtype name."""
    name = str(dtype).removeprefix("torch.").removeprefix("DataType.").lower()
    name = {"float": "float32", "half": "float16"}.get(name, name)
    if name not in _TRITON_DTYPES:
        raise ValueError(f"unsupported dtype {dtype} for the dflash plugins")
    return _TRITON_DTYPES[name]


def _block_attention_signature(t: str, c: str) -> dict[str, str]:
    """``_block_attention_kernel``'s parameters and their types, activations ``t``, caches ``c``."""
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
    return signature | {name: "constexpr" for name in _BLOCK_ATTENTION_META}


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
    from dflash_trt.plugins.triton_kernels import LOG2E, block_attention_launch_config  # optional: triton

    cfg = block_attention_launch_config(block_size, num_heads, num_kv_heads, head_dim, block_n=block_n)
    t, c = triton_dtype(dtype), triton_dtype(cache_dtype)
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
    return _block_attention_signature(t, c), const, cfg


def kv_injection_aot_spec(dtype, cache_dtype, *, num_layers, num_kv_heads, head_dim, page_size, eps, rope_scale):
    """(signature, constexprs) for compiling ``_kv_scatter_kernel``."""
    from dflash_trt.plugins.triton_kernels import _pow2  # optional: triton

    t, c = triton_dtype(dtype), triton_dtype(cache_dtype)
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


def compile_kernel(kernel, signature, constexprs, target=None):
    """``triton.compile`` one ``@triton.jit`` kernel for this signature (``target``: None, the current GPU)."""
    import triton  # optional: triton
    from triton.compiler import ASTSource  # optional: triton

    src = ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
    return triton.compile(src, target=target) if target is not None else triton.compile(src)


def compile_block_attention(dtype="float32", cache_dtype=None, target=None, **attrs):
    """Compile ``_block_attention_kernel`` to PTX for these attributes (needs a non-interpreted
    triton; ``target`` e.g. ``triton.backends.compiler.GPUTarget("cuda", 90, 32)``)."""
    from dflash_trt.plugins import triton_kernels as tk  # optional: triton

    sig, const, _ = block_attention_aot_spec(dtype, cache_dtype or dtype, **attrs)
    return compile_kernel(tk._block_attention_kernel, sig, const, target)


def compile_kv_injection(dtype="float32", cache_dtype=None, target=None, **attrs):
    """Compile ``_kv_scatter_kernel`` to PTX for these attributes (as :func:`compile_block_attention`)."""
    from dflash_trt.plugins import triton_kernels as tk  # optional: triton

    sig, const = kv_injection_aot_spec(dtype, cache_dtype or dtype, **attrs)
    return compile_kernel(tk._kv_scatter_kernel, sig, const, target)


def desc_dtype(trt, desc) -> str:
    """A TensorRT TensorDesc's dtype as ``float32``/``float16``/``bfloat16``."""
    return {trt.float32: "float32", trt.float16: "float16", trt.bfloat16: "bfloat16"}[desc.dtype]


def desc_dims(desc) -> tuple:
    """A TensorDesc's shape: known extents as ints, symbolic ones as their expressions."""
    return tuple(e.constant_value() if (not e.is_fake and e.is_constant) else e for e in desc.shape_expr)
