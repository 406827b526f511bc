"""Export: the standalone graph path, ONNX graphs and the TensorRT engines built from them.

Modules: ``onnx_graphs`` (the target, the embedding and a DFlash drafter round as ONNX, the
drafter with the ``dflash::`` custom ops, each checked against PyTorch), ``onnx_dflash2`` (a
DFlash2 drafter's round: the candidate selector's walk), ``bundle_graphs`` (which drafter graph a
bundle gets, and exporting the set), ``engines`` (TensorRT engines and the shapes they are built
for; TensorRT and a GPU where they run).

Other subpackages import the names below, never the modules inside.
"""
from __future__ import annotations

from dflash_trt.export.bundle_graphs import export_graphs
from dflash_trt.export.engines import build_engines, engine_support, profile_for

__all__ = ["build_engines", "engine_support", "export_graphs", "profile_for"]
