"""Export: the standalone graph path, ONNX graphs and the TensorRT engines built from them.

Modules: ``graph_io`` (the graphs' I/O names, dynamic axes and parity bounds, as plain data),
``onnx_graphs`` (a DFlash drafter round as ONNX with the ``dflash::`` custom ops, checked against
PyTorch; it re-exports the rest), ``onnx_target`` (the target and the embedding as ONNX, the target
checked against transformers), ``onnx_dflash2`` (a
DFlash2 drafter's round: the candidate selector's walk), ``rounds`` (each drafter family's export
round: which drafter graph, its I/O, its check; ``register_round`` adds a family's),
``bundle_graphs`` (exporting a bundle's set), ``engines`` (TensorRT engines and the shapes they are built
for; TensorRT and a GPU where they run).

Other subpackages import the names below, never the modules inside.
"""

from __future__ import annotations

from dflash_trt.export.bundle_graphs import export_graphs
from dflash_trt.export.engines import build_engines, engine_support, profile_for
from dflash_trt.export.rounds import ExportRound, register_round, round_for

__all__ = [
    "ExportRound",
    "build_engines",
    "engine_support",
    "export_graphs",
    "profile_for",
    "register_round",
    "round_for",
]
