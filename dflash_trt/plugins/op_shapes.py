"""Shape and dtype inference for the two DFlash ops: pure functions, no torch/TensorRT needed.

Used by the torch fake (meta) kernels, the ONNX export, and the TensorRT plugin
descriptors. Dimensions may be ints or symbolic objects (torch SymInt, TensorRT
ShapeExpr): only plain ints are checked, symbols pass through unchanged.
"""

from __future__ import annotations

FLOAT_DTYPES = ("float32", "float16", "bfloat16")


def _int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _same(a, b, what: str) -> None:
    if _int(a) and _int(b) and a != b:
        raise ValueError(f"{what}: {a} != {b}")


def _dtype_name(dtype) -> str | None:
    if dtype is None:
        return None
    return str(dtype).removeprefix("torch.").removeprefix("DataType.").lower()


def block_attention_shapes(
    q_shape, k_shape, k_cache_shape, q_dtype=None, *, num_heads=None, num_kv_heads=None, head_dim=None, block_size=None
):
    """q [b, B, h, d], k/v [b, B, kvh, d], caches [(L,) pages, page_size, kvh, d]
    -> (output shape [b, B, h, d], output dtype = q's dtype)."""
    q_shape, k_shape, c_shape = tuple(q_shape), tuple(k_shape), tuple(k_cache_shape)
    if len(q_shape) != 4 or len(k_shape) != 4:
        raise ValueError(f"q and k must be rank 4 [b, B, heads, d]; got {q_shape}, {k_shape}")
    if len(c_shape) not in (4, 5):
        raise ValueError(f"k_cache must be [pages, page_size, kvh, d] or [L, ...]; got {c_shape}")
    b, B, h, d = q_shape
    _same(b, k_shape[0], "batch of q and k")
    _same(B, k_shape[1], "block of q and k")
    _same(d, k_shape[3], "head_dim of q and k")
    _same(d, c_shape[-1], "head_dim of q and the cache")
    _same(k_shape[2], c_shape[-2], "kv heads of k and the cache")
    for name, want, have in (
        ("num_heads", num_heads, h),
        ("num_kv_heads", num_kv_heads, k_shape[2]),
        ("head_dim", head_dim, d),
        ("block_size", block_size, B),
    ):
        if want is not None:
            _same(have, want, name)
    if _int(h) and _int(k_shape[2]) and h % k_shape[2]:
        raise ValueError(f"query heads {h} must be a multiple of kv heads {k_shape[2]}")
    name = _dtype_name(q_dtype)
    if name is not None and name not in FLOAT_DTYPES:
        raise ValueError(f"block attention runs on {FLOAT_DTYPES}, not {name}")
    return q_shape, q_dtype


def kv_injection_shapes(
    kv_shape,
    k_norm_shape,
    k_cache_shape,
    v_cache_shape,
    kv_dtype=None,
    cache_dtype=None,
    *,
    num_layers=None,
    num_kv_heads=None,
    head_dim=None,
    page_size=None,
):
    """kv [b, T, L*2*kvh*d], k_norm [L, d], caches [L, pages, page_size, kvh, d]
    -> ((k_cache', v_cache') shapes = the caches', (dtypes) = the caches')."""
    kv_shape, kn, kc, vc = tuple(kv_shape), tuple(k_norm_shape), tuple(k_cache_shape), tuple(v_cache_shape)
    if len(kv_shape) != 3 or len(kn) != 2 or len(kc) != 5 or len(vc) != 5:
        raise ValueError(f"bad ranks: kv {kv_shape}, k_norm {kn}, caches {kc}, {vc}")
    for a, b_ in zip(kc, vc, strict=True):
        _same(a, b_, "k_cache and v_cache shapes")
    L, _, ps, kvh, d = kc
    _same(kn[0], L, "layers of k_norm and the cache")
    _same(kn[1], d, "head_dim of k_norm and the cache")
    for name, want, have in (
        ("num_layers", num_layers, L),
        ("num_kv_heads", num_kv_heads, kvh),
        ("head_dim", head_dim, d),
        ("page_size", page_size, ps),
    ):
        if want is not None:
            _same(have, want, name)
    if all(_int(x) for x in (L, kvh, d)):
        _same(kv_shape[2], L * 2 * kvh * d, "kv width (layers*2*kv_heads*head_dim)")
        if d % 2:
            raise ValueError("RoPE needs an even head_dim")
    for name, dt in (("kv", kv_dtype), ("cache", cache_dtype)):
        n = _dtype_name(dt)
        if n is not None and n not in FLOAT_DTYPES:
            raise ValueError(f"{name} dtype must be one of {FLOAT_DTYPES}, not {n}")
    return (kc, vc), (cache_dtype, cache_dtype)
