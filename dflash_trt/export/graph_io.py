"""The contract of the three graphs a ``--graphs`` bundle holds, as plain data (no torch, no onnx).

Invariant: these names, axes and bounds are the one statement of the graphs' I/O that the export
(``onnx_graphs``, ``onnx_target``, ``onnx_native*``), the TensorRT engine builder (``engines``) and
the graph runtimes all read; a graph is exported with exactly these input/output names, and every
dynamic axis is named by the ``ingest.EngineProfile`` dimension that bounds it.
"""

from __future__ import annotations

DRAFTER_INPUTS = ["target_hidden", "n_new", "block_embeds", "k_cache", "v_cache", "page_table", "lengths"]
TARGET_INPUTS = ["input_ids", "attention_mask", "position_ids", "past_k", "past_v"]
TARGET_OUTPUTS = ["logits", "target_hidden", "new_k", "new_v"]
#: the graphs of a bundle's ``onnx/``, by role
GRAPHS = {"drafter": "drafter.onnx", "target": "target.onnx", "embed": "embed.onnx"}

#: Every dynamic axis of every graph, named by the ``ingest.EngineProfile`` dimension it is
#: bounded by: batch, tokens (per row in one call), seq (cached + new columns), past (cached
#: columns, 0 at prefill), pages (the drafter's pool), pages_per_seq (its page table's width).
DYNAMIC_AXES = {
    "drafter": {
        "target_hidden": {0: "batch", 1: "tokens"},
        "n_new": {0: "batch"},
        "block_embeds": {0: "batch"},
        "k_cache": {1: "pages"},
        "v_cache": {1: "pages"},
        "page_table": {0: "batch", 1: "pages_per_seq"},
        "lengths": {0: "batch"},
    },
    "target": {
        "input_ids": {0: "batch", 1: "tokens"},
        "attention_mask": {0: "batch", 1: "seq"},
        "position_ids": {0: "batch", 1: "tokens"},
        "past_k": {1: "batch", 3: "past"},
        "past_v": {1: "batch", 3: "past"},
    },
    "embed": {"input_ids": {0: "batch", 1: "tokens"}},
}

#: Drafter cache slots per page in the exported graphs (a custom-op attribute; 16 as ``PagedKVCache``).
PAGE_SIZE = 16

#: fp32 parity bounds the export is held to (ONNX Runtime vs ``Drafter.inject`` + ``draft``; vs
#: the transformers forward, whose logits are larger).
DRAFTER_ONNX_ATOL = 1e-4
TARGET_ONNX_ATOL = 1e-3
