"""Runtime: the speculative loop (the executable specification) over a backend (the PyTorch
modules, ONNX Runtime over a bundle's onnx/, TensorRT over its engines/), sampling and
acceptance, statistics, the step-level engine that batches continuously, and pair loading.

Other subpackages import from here, never from the modules inside.
"""
from __future__ import annotations

from dflash_trt.runtime.backend import Backend, TorchBackend
from dflash_trt.runtime.dequantize import dequantize_state
from dflash_trt.runtime.engine import Engine, Step, draft_len_for_batch_size
from dflash_trt.runtime.graph_pair import load_graph_pair
from dflash_trt.runtime.loop import Generation, Request, block_size_for, generate
from dflash_trt.runtime.pair import (
                                    BACKENDS,
                                    Pair,
                                    load_bundle,
                                    load_pair,
                                    load_tokenizer,
                                    open_backend,
                                    parse_dtype,
                                    stop_ids,
)
from dflash_trt.runtime.proposer import Proposer, SelectorProposer, proposer_for
from dflash_trt.runtime.proposer import register as register_proposer
from dflash_trt.runtime.sampling import SamplingParams, accept, probs, rejection_sample
from dflash_trt.runtime.stats import Stats

__all__ = [
    "BACKENDS",
    "Backend",
    "Engine",
    "Generation",
    "Pair",
    "Proposer",
    "Request",
    "SamplingParams",
    "SelectorProposer",
    "Stats",
    "Step",
    "TorchBackend",
    "accept",
    "block_size_for",
    "dequantize_state",
    "draft_len_for_batch_size",
    "generate",
    "load_bundle",
    "load_graph_pair",
    "load_pair",
    "load_tokenizer",
    "open_backend",
    "parse_dtype",
    "probs",
    "proposer_for",
    "register_proposer",
    "rejection_sample",
    "stop_ids",
]
