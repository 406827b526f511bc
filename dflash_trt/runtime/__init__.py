"""Runtime: the speculative loop (the executable specification), sampling, and pair loading.

Other subpackages import from here, never from the modules inside.
"""
from __future__ import annotations

from dflash_trt.runtime.sampling import SamplingParams, probs, rejection_sample
from dflash_trt.runtime.loop import Generation, Stats, generate
from dflash_trt.runtime.dequantize import dequantize_state
from dflash_trt.runtime.pair import Pair, load_bundle, load_pair, load_tokenizer, parse_dtype, stop_ids

__all__ = [
    "Generation",
    "Pair",
    "SamplingParams",
    "Stats",
    "dequantize_state",
    "generate",
    "load_bundle",
    "load_pair",
    "load_tokenizer",
    "parse_dtype",
    "probs",
    "rejection_sample",
    "stop_ids",
]
