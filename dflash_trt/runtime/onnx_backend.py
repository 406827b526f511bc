"""ONNX Runtime over a bundle's ``onnx/``: the speculative loop through the exported graphs, on a CPU.

Every graph runs natively: the target and embedding graphs are plain ONNX, and so is the
drafter's ONNX Runtime form ``drafter_ort.onnx`` (``export/onnx_native.py``: block attention as opset-23
``Attention`` nodes, KV injection in arithmetic ops, over a dense per-row context cache that the
graph reads and whose new columns it returns). A bundle built before that form existed has only
``drafter.onnx`` (the TensorRT form, two ``dflash::`` custom ops): its ops then run as
onnxruntime-extensions Python custom ops (``plugins.onnx_ops``), which copy the page pool every
round. Tensors cross into onnxruntime as numpy views of CPU tensors and come back the same way;
the caches are :class:`~dflash_trt.runtime.graph_backend.GraphBackend`'s.
"""

from __future__ import annotations

from pathlib import Path

import torch

from dflash_trt.errors import require
from dflash_trt.plugins import onnx_ops
from dflash_trt.runtime.graph_backend import GraphBackend

GRAPH_FILES = {"embed": "embed.onnx", "target": "target.onnx", "drafter": "drafter.onnx"}
#: the drafter's ONNX Runtime form (standard ops, dense context; ``export/onnx_native.py``'s NATIVE_FILE)
NATIVE_DRAFTER = "drafter_ort.onnx"
#: the target's ONNX Runtime form (opset-23 fused nodes, ``target.onnx``'s I/O; ``export/onnx_native_target.py``)
NATIVE_TARGET = "target_ort.onnx"


class OnnxBackend(GraphBackend):
    """The three graphs of ``onnx_dir`` in onnxruntime sessions (CPUExecutionProvider).

    ``threads``: onnxruntime's intra-op threads per session (None: torch's current count, the
    reference runtime's choice for the same models). ``native``: draft through ``drafter_ort.onnx``
    and run the target through ``target_ort.onnx`` when the bundle has them (False: the custom-op
    form through Python custom ops and transformers' traced ``target.onnx``, for comparison).
    """

    name = "onnx"
    # On a CPU a padded batch prefill pays for its padding: one forward per prompt instead.
    prefill_rows_alone = True
    # The Python custom ops copy the pool on every round: start small, grow by doubling.
    initial_pages = 8

    def __init__(
        self, onnx_dir: str | Path, profile, mask_token_id: int, threads: int | None = None, native: bool = True
    ):
        require("onnxruntime", "onnx", "--backend onnx")
        import onnxruntime as ort  # optional: onnxruntime (the onnx extra)

        onnx_dir = Path(onnx_dir)
        threads = threads or torch.get_num_threads()
        so = ort.SessionOptions()
        so.intra_op_num_threads = so.inter_op_num_threads = threads

        def session(name: str):
            return ort.InferenceSession(str(onnx_dir / name), so, providers=["CPUExecutionProvider"])

        #: graph -> the file its session runs
        own_target = native and (onnx_dir / NATIVE_TARGET).is_file()
        self.files = {"embed": GRAPH_FILES["embed"], "target": NATIVE_TARGET if own_target else GRAPH_FILES["target"]}
        self.sessions = {g: session(f) for g, f in self.files.items()}
        if native and (onnx_dir / NATIVE_DRAFTER).is_file():
            self.files["drafter"] = NATIVE_DRAFTER
            self.sessions["drafter"] = session(NATIVE_DRAFTER)
        else:  # an older bundle: the custom-op form through Python custom ops
            self.files["drafter"] = GRAPH_FILES["drafter"]
            require("onnxruntime_extensions", "onnx", "--backend onnx on a bundle without drafter_ort.onnx")
            self.sessions["drafter"] = onnx_ops.ort_session(onnx_dir / GRAPH_FILES["drafter"], threads=threads)
        self._inputs = {g: {i.name: i for i in s.get_inputs()} for g, s in self.sessions.items()}
        self._outputs = {g: {o.name: o for o in s.get_outputs()} for g, s in self.sessions.items()}
        super().__init__(profile, mask_token_id, torch.device("cpu"))

    def input_shape(self, graph, name):
        return [d if isinstance(d, int) else None for d in self._inputs[graph][name].shape]

    def output_shape(self, graph, name):
        return [d if isinstance(d, int) else None for d in self._outputs[graph][name].shape]

    def input_names(self, graph):
        return list(self._inputs[graph])

    def output_names(self, graph):
        return list(self._outputs[graph])

    def run(self, graph, feeds):
        arrays = {k: v.detach().contiguous().numpy() for k, v in feeds.items()}
        return [torch.from_numpy(o) for o in self.sessions[graph].run(self.graph_outputs[graph], arrays)]
