"""Runtime: the speculative loop (the executable specification) over a backend (the PyTorch
modules, ONNX Runtime over a bundle's onnx/, TensorRT over its engines/), sampling and
acceptance, statistics, the scheduler that batches continuously, the run spec (backend,
kernels: ``resolve_run``) and pair loading.

Other subpackages import from here, never from the modules inside.
"""

from __future__ import annotations

from dflash_trt.runtime.backend import Backend, TorchBackend
from dflash_trt.runtime.batch import Request
from dflash_trt.runtime.decoder import STATIC_ROPE, plain_decoder
from dflash_trt.runtime.dequantize import dequantize_state
from dflash_trt.runtime.loop import Generation, block_size_for, generate
from dflash_trt.runtime.pair import Pair, load_bundle, load_pair, load_tokenizer, parse_dtype, stop_ids
from dflash_trt.runtime.proposer import Proposer, SelectorProposer, proposer_for, register_proposer
from dflash_trt.runtime.sampling import SamplingParams, accept, probs, rejection_sample
from dflash_trt.runtime.scheduler import Refused, Scheduler, Step, draft_len_for_batch_size
from dflash_trt.runtime.spec import BACKENDS, RunSpec, resolve_run
from dflash_trt.runtime.stats import Stats

__all__ = [
    "BACKENDS",
    "STATIC_ROPE",
    "Backend",
    "Generation",
    "Pair",
    "Proposer",
    "Refused",
    "Request",
    "RunSpec",
    "SamplingParams",
    "Scheduler",
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
    "load_pair",
    "load_tokenizer",
    "parse_dtype",
    "plain_decoder",
    "probs",
    "proposer_for",
    "register_proposer",
    "rejection_sample",
    "resolve_run",
    "stop_ids",
]
