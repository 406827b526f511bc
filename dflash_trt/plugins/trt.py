"""TensorRT plugin definitions of the DFlash ops (TensorRT >= 10.8 Python plugins, ``tensorrt.plugin``).

``register_trt_plugins()`` registers, only when ``tensorrt`` imports:

* ``dflash::BlockDiffusionAttention`` (``plugins/trt_attention.py``) and ``dflash::KVInjection``
  (``plugins/trt_injection.py``) shape/dtype descriptors (``@trtp.register``; the logic is the
  pure functions in ``plugins/op_shapes.py``; the KVInjection outputs are ``aliased()`` to the
  cache inputs, so the update is in place),
* ``@trtp.aot_impl``: the Triton kernels of ``plugins/triton_kernels.py`` compiled ahead of
  time to PTX (``plugins/trt_specs.py``: the float attributes and the small ints become
  compile-time constants; the runtime scalars are ``SymInt32`` expressions of the input
  shapes), launched by TensorRT with arguments ``(inputs..., extra scalars..., outputs...)`` - the kernels' own order,
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

Invariant of this module: importing it needs neither tensorrt nor triton (the plugin modules,
which import both, load only once both import), so :func:`register_trt_plugins` can always say why not.
"""

from typing import NamedTuple

from dflash_trt.plugins.trt_specs import (
    block_attention_aot_spec,
    compile_block_attention,
    compile_kv_injection,
    kv_injection_aot_spec,
)

__all__ = [
    "Registration",
    "block_attention_aot_spec",
    "compile_block_attention",
    "compile_kv_injection",
    "kv_injection_aot_spec",
    "register_trt_plugins",
]

_REGISTERED = False


class Registration(NamedTuple):
    ok: bool
    reason: str

    def __bool__(self) -> bool:  # ``if register_trt_plugins():`` reads naturally
        return self.ok


def register_trt_plugins() -> Registration:
    """Register both plugins with TensorRT's plugin registry. Falsy ``Registration`` with the
    reason when TensorRT (with ``tensorrt.plugin``) or a compiling triton is unavailable."""
    global _REGISTERED
    try:
        import tensorrt as trt  # optional: tensorrt
        import tensorrt.plugin as trtp  # optional: tensorrt
    except ImportError as exc:
        return Registration(False, f"tensorrt with tensorrt.plugin (TensorRT >= 10.8) is not importable: {exc}")
    try:
        import triton  # noqa: F401  # optional: triton
    except ImportError as exc:
        return Registration(False, f"triton is needed to compile the plugin kernels: {exc}")
    from dflash_trt.plugins.triton_kernels import interpreted  # optional: triton

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


def _define(trt, trtp) -> None:
    """Both plugins' definitions, attention first (the modules import triton: see the module doc)."""
    from dflash_trt.plugins.trt_attention import define_block_attention  # optional: triton, tensorrt
    from dflash_trt.plugins.trt_injection import define_kv_injection  # optional: triton, tensorrt

    define_block_attention(trt, trtp)
    define_kv_injection(trt, trtp)
