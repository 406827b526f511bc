"""The ONNX form of the DFlash ops: ``dflash::KVInjection`` and ``dflash::BlockDiffusionAttention``.

ONNX is functional, so the ops take and return tensors; TensorRT makes the cache update
in place (the plugin declares its outputs aliased to the cache inputs).

``dflash::KVInjection`` (domain ``dflash``, version 1) - the stage *after* the one GEMM.
The fc, hidden_norm and the fused ``ctx @ kv_weight.T`` stay ordinary ONNX MatMul/RMSNorm
nodes so TensorRT runs them with its own GEMMs::

    inputs : kv [b, T, L*2*kvh*d] (float), k_norm_weight [L, d] (float),
             inv_freq [d/2] float32, n_new [b] int64, lengths [b] int64 (before the append),
             page_table [b, max_pages] int32, k_cache, v_cache [L, pages, page_size, kvh, d]
    outputs: k_cache_out, v_cache_out (the caches with the first n_new[i] tokens of each
             sequence written at positions lengths[i] + t; every other slot unchanged)
    attrs  : num_layers, num_kv_heads, head_dim, page_size (ints), rope_theta, rope_scale,
             eps (floats). RoPE's cos/sin come from the ``inv_freq`` input (so every
             transformers RoPE variant works); ``rope_theta`` is informational.

``dflash::BlockDiffusionAttention`` (domain ``dflash``, version 1)::

    inputs : q [b, B, h, d], k, v [b, B, kvh, d], k_cache, v_cache [L, pages, page_size, kvh, d],
             page_table [b, max_pages] int32, lengths [b] int64 (context length, i.e. after
             this round's injection)
    output : out [b, B, h, d], q's dtype
    attrs  : layer, num_heads, num_kv_heads, head_dim, block_size, page_size, causal (0/1),
             window (0 = none) (ints), scale (float)

onnxruntime: onnxruntime-extensions 0.15's Python custom ops (``@onnx_op`` / PyOp) only
live in its own domain ``ai.onnx.contrib`` (``default_opset_domain()``; there is no
domain argument), so :func:`to_ort_model` rewrites the two nodes' domain to
``ai.onnx.contrib`` in a copy of the model and :func:`register_ort_ops` registers Python
implementations (the torch references) under the same op names. They take float32 only.
"""

from __future__ import annotations

import numpy as np
import torch

from dflash_trt.plugins import attention as ba
from dflash_trt.plugins import injection as kvi
from dflash_trt.plugins import torch_ops  # noqa: F401  (registers torch.ops.dflash, which the translation maps)

DOMAIN = "dflash"
VERSION = 1
ORT_DOMAIN = "ai.onnx.contrib"
KV_INJECTION = "KVInjection"
BLOCK_ATTENTION = "BlockDiffusionAttention"

KV_INJECTION_INPUTS = ["kv", "k_norm_weight", "inv_freq", "n_new", "lengths", "page_table", "k_cache", "v_cache"]
KV_INJECTION_OUTPUTS = ["k_cache_out", "v_cache_out"]
KV_INJECTION_INT_ATTRS = ["num_layers", "num_kv_heads", "head_dim", "page_size"]
KV_INJECTION_FLOAT_ATTRS = ["rope_theta", "rope_scale", "eps"]
BLOCK_ATTENTION_INPUTS = ["q", "k", "v", "k_cache", "v_cache", "page_table", "lengths"]
BLOCK_ATTENTION_OUTPUTS = ["out"]
BLOCK_ATTENTION_INT_ATTRS = [
    "layer",
    "num_heads",
    "num_kv_heads",
    "head_dim",
    "block_size",
    "page_size",
    "causal",
    "window",
]
BLOCK_ATTENTION_FLOAT_ATTRS = ["scale"]

_SCHEMAS_DONE = False
_ORT_DONE = False


def register_onnx_schemas() -> None:
    """Register the two op schemas with ``onnx.defs`` (type/shape checks, onnxscript use)."""
    global _SCHEMAS_DONE
    if _SCHEMAS_DONE:
        return
    import onnx  # optional: onnx
    from onnx.defs import OpSchema  # optional: onnx

    if onnx.defs.has(KV_INJECTION, DOMAIN):
        _SCHEMAS_DONE = True
        return
    F = OpSchema.FormalParameter
    floats = ["tensor(float)", "tensor(float16)", "tensor(bfloat16)"]
    i64, i32 = "tensor(int64)", "tensor(int32)"

    def attrs(ints, fls):
        return [OpSchema.Attribute(n, OpSchema.AttrType.INT, n) for n in ints] + [
            OpSchema.Attribute(n, OpSchema.AttrType.FLOAT, n) for n in fls
        ]

    kv_types = {
        "kv": "T",
        "k_norm_weight": "T",
        "inv_freq": "tensor(float)",
        "n_new": i64,
        "lengths": i64,
        "page_table": i32,
        "k_cache": "C",
        "v_cache": "C",
    }
    onnx.defs.register_schema(
        OpSchema(
            KV_INJECTION,
            DOMAIN,
            VERSION,
            "DFlash KV injection after the fused K/V GEMM (see dflash_trt.plugins.onnx_ops)",
            inputs=[F(n, kv_types[n], n) for n in KV_INJECTION_INPUTS],
            outputs=[F(n, "C", n) for n in KV_INJECTION_OUTPUTS],
            type_constraints=[("T", floats, "activations"), ("C", floats, "cache")],
            attributes=attrs(KV_INJECTION_INT_ATTRS, KV_INJECTION_FLOAT_ATTRS),
        )
    )
    ba_types = {"q": "T", "k": "T", "v": "T", "k_cache": "C", "v_cache": "C", "page_table": i32, "lengths": i64}
    onnx.defs.register_schema(
        OpSchema(
            BLOCK_ATTENTION,
            DOMAIN,
            VERSION,
            "DFlash block-diffusion attention over a paged context (see dflash_trt.plugins.onnx_ops)",
            inputs=[F(n, ba_types[n], n) for n in BLOCK_ATTENTION_INPUTS],
            outputs=[F("out", "T", "out")],
            type_constraints=[("T", floats, "activations"), ("C", floats, "cache")],
            attributes=attrs(BLOCK_ATTENTION_INT_ATTRS, BLOCK_ATTENTION_FLOAT_ATTRS),
        )
    )
    _SCHEMAS_DONE = True


def translation_table(
    *,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    page_size: int,
    rope_theta: float,
) -> dict:
    """``torch.onnx.export(custom_translation_table=...)`` entries mapping the torch custom
    ops ``dflash::kv_cache_update`` / ``dflash::block_attention`` onto the ONNX ops."""
    import onnxscript  # optional: onnx

    register_onnx_schemas()
    opset = onnxscript.values.Opset(DOMAIN, VERSION)
    return {
        torch.ops.dflash.kv_cache_update.default: _kv_injection_node(
            opset, num_layers=num_layers, page_size=page_size, rope_theta=rope_theta
        ),
        torch.ops.dflash.block_attention.default: _block_attention_node(
            opset,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            block_size=block_size,
            page_size=page_size,
        ),
    }


def _kv_injection_node(opset, *, num_layers: int, page_size: int, rope_theta: float):
    """The translation of ``dflash::kv_cache_update``: one ``KVInjection`` node, the caches its two outputs."""

    def kv_cache_update(
        kv,
        k_norm_weight,
        inv_freq,
        n_new,
        lengths,
        page_table,
        k_cache,
        v_cache,
        rope_scale,
        eps,
        num_kv_heads_,
        head_dim_,
        kernels="reference",
    ):
        return opset.KVInjection(
            kv,
            k_norm_weight,
            inv_freq,
            n_new,
            lengths,
            page_table,
            k_cache,
            v_cache,
            num_layers=num_layers,
            num_kv_heads=int(num_kv_heads_),
            head_dim=int(head_dim_),
            page_size=page_size,
            rope_theta=float(rope_theta),
            rope_scale=float(rope_scale),
            eps=float(eps),
            _outputs=2,
        )

    return kv_cache_update


def _block_attention_node(opset, *, num_heads: int, num_kv_heads: int, head_dim: int, block_size: int, page_size: int):
    """The translation of ``dflash::block_attention``: one ``BlockDiffusionAttention`` node, with the
    shape attributes the torch op does not carry (heads, head_dim, block and page size)."""

    def block_attention(
        q, k, v, k_cache, v_cache, page_table, lengths, causal, window, scale, layer=0, kernels="reference"
    ):
        return opset.BlockDiffusionAttention(
            q,
            k,
            v,
            k_cache,
            v_cache,
            page_table,
            lengths,
            layer=int(layer),
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            block_size=block_size,
            page_size=page_size,
            causal=int(bool(causal)),
            window=int(window or 0),
            scale=float(scale),
        )

    return block_attention


# ---------------------------------------------------------------------------------------
# onnxruntime through onnxruntime-extensions' Python custom ops
# ---------------------------------------------------------------------------------------


def register_ort_ops() -> None:
    """Register Python implementations (the torch references) of both ops with
    onnxruntime-extensions, in its ``ai.onnx.contrib`` domain. Idempotent."""
    global _ORT_DONE
    if _ORT_DONE:
        return
    from onnxruntime_extensions import PyCustomOpDef, onnx_op  # optional: onnx

    _register_ort_kv_injection(PyCustomOpDef, onnx_op)
    _register_ort_block_attention(PyCustomOpDef, onnx_op)
    _ORT_DONE = True


def _tensor(a) -> torch.Tensor:
    """A torch view of an onnxruntime input (a numpy array, made contiguous)."""
    return torch.from_numpy(np.ascontiguousarray(a))


def _register_ort_kv_injection(P, onnx_op) -> None:
    """``KVInjection`` on onnxruntime: ``kv_scatter_reference`` into float32 copies of the caches."""

    @onnx_op(
        op_type=KV_INJECTION,
        inputs=[P.dt_float, P.dt_float, P.dt_float, P.dt_int64, P.dt_int64, P.dt_int32, P.dt_float, P.dt_float],
        outputs=[P.dt_float, P.dt_float],
        attrs={**{n: P.dt_int64 for n in KV_INJECTION_INT_ATTRS}, **{n: P.dt_float for n in KV_INJECTION_FLOAT_ATTRS}},
    )
    def _kv_injection(kv, k_norm_weight, inv_freq, n_new, lengths, page_table, k_cache, v_cache, **attrs):
        k_out = torch.from_numpy(np.array(k_cache, dtype=np.float32))
        v_out = torch.from_numpy(np.array(v_cache, dtype=np.float32))
        kvi.kv_scatter_reference(
            _tensor(kv),
            _tensor(k_norm_weight),
            _tensor(inv_freq),
            _tensor(n_new),
            _tensor(lengths),
            _tensor(page_table),
            k_out,
            v_out,
            rope_scale=attrs["rope_scale"],
            eps=attrs["eps"],
            num_kv_heads=attrs["num_kv_heads"],
            head_dim=attrs["head_dim"],
        )
        return k_out.numpy(), v_out.numpy()


def _register_ort_block_attention(P, onnx_op) -> None:
    """``BlockDiffusionAttention`` on onnxruntime: ``block_attention_reference`` over the node's layer."""

    @onnx_op(
        op_type=BLOCK_ATTENTION,
        inputs=[P.dt_float] * 5 + [P.dt_int32, P.dt_int64],
        outputs=[P.dt_float],
        attrs={
            **{n: P.dt_int64 for n in BLOCK_ATTENTION_INT_ATTRS},
            **{n: P.dt_float for n in BLOCK_ATTENTION_FLOAT_ATTRS},
        },
    )
    def _block_attention(q, k, v, k_cache, v_cache, page_table, lengths, **attrs):
        layer = attrs["layer"]
        out = ba.block_attention_reference(
            _tensor(q),
            _tensor(k),
            _tensor(v),
            _tensor(k_cache)[layer],
            _tensor(v_cache)[layer],
            _tensor(page_table),
            _tensor(lengths),
            causal=bool(attrs["causal"]),
            window=attrs["window"] or None,
            scale=attrs["scale"],
        )
        return out.numpy()


def to_ort_model(model):
    """A copy of ``model`` whose dflash nodes live in ``ai.onnx.contrib`` (see module doc)."""
    import onnx  # optional: onnx

    m = onnx.ModelProto()
    m.CopyFrom(model)
    graphs = [m.graph] + [f for f in m.functions]
    for g in graphs:
        for node in g.node:
            if node.domain == DOMAIN:
                node.domain = ORT_DOMAIN
    imports = {o.domain: o for o in m.opset_import}
    imports.pop(DOMAIN, None)
    del m.opset_import[:]
    m.opset_import.extend(imports.values())
    if ORT_DOMAIN not in imports:
        m.opset_import.append(onnx.helper.make_opsetid(ORT_DOMAIN, 1))
    return m


def ort_session(model, threads: int | None = None):
    """An onnxruntime session for a dflash-domain model (ModelProto or path), CPU; ``threads``:
    onnxruntime's intra-op threads (None: its default, one per core)."""
    import onnx  # optional: onnx
    import onnxruntime as ort  # optional: onnx
    from onnxruntime_extensions import get_library_path  # optional: onnx

    if not isinstance(model, onnx.ModelProto):
        model = onnx.load(str(model))
    register_ort_ops()
    so = ort.SessionOptions()
    if threads is not None:
        so.intra_op_num_threads = so.inter_op_num_threads = threads
    so.register_custom_ops_library(get_library_path())
    return ort.InferenceSession(to_ort_model(model).SerializeToString(), so, providers=["CPUExecutionProvider"])
