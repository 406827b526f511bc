"""The TensorRT plugin definitions against their documented contracts, with stand-ins for tensorrt.

No TensorRT can be installed here, so ``tensorrt`` and ``tensorrt.plugin`` are stand-ins that
record what the definitions register and hand them descriptors of known shapes. What is checked is
what TensorRT relies on: each op registers its descriptor, AOT kernel and JIT fallback; the
plugin's inputs and attributes are the ONNX op's (the parser maps a node onto the plugin by them);
the descriptors' outputs; the AOT signature follows the kernel's own parameters, and the launch's
runtime scalars equal what the Python launcher passes.
"""

from __future__ import annotations

import inspect
import os
from types import SimpleNamespace

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

pytest.importorskip("triton")

from dflash_trt.plugins import onnx_ops, trt_attention, trt_injection  # noqa: E402
from dflash_trt.plugins import triton_kernels as tk  # noqa: E402
from dflash_trt.plugins.trt import _define  # noqa: E402

FAKE_TRT = SimpleNamespace(float32="f32", float16="f16", bfloat16="bf16")


class Extent(int):
    """A TensorRT ShapeExpr standing in: a known extent (it multiplies as the int it is)."""

    is_fake = False
    is_constant = True

    def constant_value(self) -> int:
        return int(self)


class Desc:
    """A TensorRT TensorDesc standing in: a shape of known extents and a dtype."""

    def __init__(self, *shape, dtype="f32"):
        self.shape_expr, self.dtype = [Extent(n) for n in shape], dtype

    def like(self):
        return ("like", self)

    def aliased(self):
        return ("aliased", self)


class FakePlugin(SimpleNamespace):
    """``tensorrt.plugin`` standing in: records each (kind, op, function) the definitions register."""

    TensorDesc = Tensor = SymExprs = object
    KernelLaunchParams = SimpleNamespace

    def __init__(self):
        super().__init__(defined=[])

    def _recorder(self, kind):
        return lambda name: lambda fn: self.defined.append((kind, name, fn)) or fn

    def __getattr__(self, kind):  # register, aot_impl, impl
        if kind in ("register", "aot_impl", "impl"):
            return self._recorder(kind)
        raise AttributeError(kind)

    @staticmethod
    def SymIntExprs(n):
        return [None] * n

    @staticmethod
    def SymInt32(x):
        return x


@pytest.fixture(scope="module")
def defined():
    trtp = FakePlugin()
    _define(FAKE_TRT, trtp)
    return {(kind, name): fn for kind, name, fn in trtp.defined}, trtp


def test_each_op_registers_descriptor_then_aot_then_jit():
    trtp = FakePlugin()
    _define(FAKE_TRT, trtp)
    order = [(kind, name) for kind, name, _ in trtp.defined]
    assert order == [
        (kind, name)
        for name in ("dflash::BlockDiffusionAttention", "dflash::KVInjection")
        for kind in ("register", "aot_impl", "impl")
    ]


@pytest.mark.parametrize(
    "name,inputs,ints,floats",
    [
        (
            trt_attention.NAME,
            onnx_ops.BLOCK_ATTENTION_INPUTS,
            onnx_ops.BLOCK_ATTENTION_INT_ATTRS,
            onnx_ops.BLOCK_ATTENTION_FLOAT_ATTRS,
        ),
        (
            trt_injection.NAME,
            onnx_ops.KV_INJECTION_INPUTS,
            onnx_ops.KV_INJECTION_INT_ATTRS,
            onnx_ops.KV_INJECTION_FLOAT_ATTRS,
        ),
    ],
)
def test_plugin_parameters_are_the_onnx_ops(defined, name, inputs, ints, floats):
    fns, _ = defined
    attrs = {**{n: int for n in ints}, **{n: float for n in floats}}
    for kind, tail in (("register", []), ("aot_impl", ["outputs", "tactic"]), ("impl", ["outputs", "stream"])):
        params = inspect.signature(fns[kind, name]).parameters
        assert list(params) == [*inputs, *attrs, *tail], (kind, name)
        assert {n: params[n].annotation for n in attrs} == attrs, (kind, name)


def _attention_args(cache=(2, 10, 4, 2, 8), q=(3, 4, 4, 8)):
    descs = [Desc(*q), Desc(3, 4, 2, 8), Desc(3, 4, 2, 8), Desc(*cache), Desc(*cache), Desc(3, 5), Desc(3)]
    attrs = dict(layer=1, num_heads=4, num_kv_heads=2, head_dim=8, block_size=4, page_size=4, causal=0, window=0)
    return descs, {**attrs, "scale": 0.5}


def _injection_args(kv_width=2 * 2 * 2 * 8):
    cache = (2, 10, 4, 2, 8)
    descs = [Desc(3, 5, kv_width), Desc(2, 8), Desc(4), Desc(3), Desc(3), Desc(3, 5), Desc(*cache), Desc(*cache)]
    attrs = dict(num_layers=2, num_kv_heads=2, head_dim=8, page_size=4, rope_theta=1e6, rope_scale=1.0, eps=1e-6)
    return descs, attrs


def test_descriptors_keep_q_and_alias_the_caches(defined):
    fns, _ = defined
    descs, attrs = _attention_args()
    assert fns["register", trt_attention.NAME](*descs, **attrs) == ("like", descs[0])
    descs, attrs = _injection_args()
    out = fns["register", trt_injection.NAME](*descs, **attrs)
    assert out == (("aliased", descs[6]), ("aliased", descs[7]))


def test_descriptors_refuse_what_op_shapes_refuses(defined):
    fns, _ = defined
    descs, attrs = _attention_args(q=(3, 4, 4, 16))
    with pytest.raises(ValueError, match="head_dim"):
        fns["register", trt_attention.NAME](*descs, **attrs)
    descs, attrs = _injection_args(kv_width=7)
    with pytest.raises(ValueError, match="kv width"):
        fns["register", trt_injection.NAME](*descs, **attrs)


class Compiled(SimpleNamespace):
    """What ``compile_kernel`` returns, standing in: recorded signature, fixed metadata."""

    def __init__(self, kernel, signature, constexprs):
        meta = SimpleNamespace(num_warps=4, shared=128, name="kernel")
        super().__init__(kernel=kernel, signature=signature, constexprs=constexprs, metadata=meta, asm={"ptx": "."})


def _kernel_params(kernel) -> list[str]:
    return list(inspect.signature(getattr(kernel, "fn", kernel)).parameters)


def _check_signature(sig, kernel, n_in, n_extra, n_out):
    """The signature names the kernel's parameters in order: pointers in, i32 scalars, pointers out."""
    assert list(sig) == _kernel_params(kernel)
    runtime = [t for t in sig.values() if t != "constexpr"]
    assert len(runtime) == n_in + n_extra + n_out
    assert all(t.startswith("*") for t in runtime[:n_in] + runtime[n_in + n_extra :])
    assert runtime[n_in : n_in + n_extra] == ["i32"] * n_extra


def test_attention_aot_launch_matches_the_python_launcher(defined, monkeypatch):
    fns, _ = defined
    monkeypatch.setattr(trt_attention, "compile_kernel", Compiled)
    descs, attrs = _attention_args()
    name, ptx, launch, extra = fns["aot_impl", trt_attention.NAME](*descs, **attrs, outputs=(descs[0],), tactic=0)
    assert (name, ptx, launch.block_x, launch.shared_mem) == ("kernel", ".", 4 * 32, 128)
    cfg = tk.block_attention_launch_config(4, 4, 2, 8, block_n=64)
    assert (launch.grid_x, launch.grid_y, launch.grid_z) == (3, 2, cfg["m_tiles"])
    assert extra == [5, 10 * 4 * 2 * 8]  # max_pages, and k_cache[0].numel() as the launcher passes


def test_aot_signatures_follow_the_kernels(defined, monkeypatch):
    fns, _ = defined
    seen = []
    monkeypatch.setattr(trt_attention, "compile_kernel", lambda *a: seen.append(a) or Compiled(*a))
    monkeypatch.setattr(trt_injection, "compile_kernel", lambda *a: seen.append(a) or Compiled(*a))
    descs, attrs = _attention_args()
    fns["aot_impl", trt_attention.NAME](*descs, **attrs, outputs=(descs[0],), tactic=0)
    descs, attrs = _injection_args()
    _, _, launch, extra = fns["aot_impl", trt_injection.NAME](*descs, **attrs, outputs=tuple(descs[6:]), tactic=0)
    (ba_kernel, ba_sig, ba_const), (kv_kernel, kv_sig, kv_const) = seen
    _check_signature(ba_sig, ba_kernel, n_in=7, n_extra=2, n_out=1)
    _check_signature(kv_sig, kv_kernel, n_in=8, n_extra=3, n_out=2)
    assert set(ba_const) == {k for k, t in ba_sig.items() if t == "constexpr"}
    assert set(kv_const) == {k for k, t in kv_sig.items() if t == "constexpr"}
    assert (launch.grid_x, launch.grid_y) == (3 * 5, 2)
    assert extra == [5, 5, 10 * 4 * 2 * 8]  # T, max_pages, the per-layer stride
