"""Ingest: model references to local directories, checkpoints read and checked from disk.

Stage order: ``resolve`` (embedded / local / hub) -> ``files`` (the one safetensors header
reader, shard indexes, hashes) -> ``formats`` (every published drafter format normalised to
z-lab) -> ``drafter`` / ``target`` (specs read from configs and headers; weights loaded only
on request) -> ``compat`` (does a drafter belong to a target).

Other subpackages import from here, never from the modules inside.
"""
from __future__ import annotations

from dflash_trt.ingest.resolve import EMBEDDED_PREFIX, embedded_dir, open_dir, read_json, resolve
from dflash_trt.ingest.files import TensorInfo, WeightSet, read_header, scan, sha256_files
from dflash_trt.ingest.drafter import DrafterSpec, check_pair_runtime, is_drafter, load_drafter, read_drafter, write_zlab
from dflash_trt.ingest.target import TargetSpec, read_target, target_quantization
from dflash_trt.ingest.compat import PairReport, validate_pair

__all__ = [
    "DrafterSpec",
    "EMBEDDED_PREFIX",
    "PairReport",
    "TargetSpec",
    "TensorInfo",
    "WeightSet",
    "check_pair_runtime",
    "embedded_dir",
    "is_drafter",
    "load_drafter",
    "open_dir",
    "read_drafter",
    "read_header",
    "read_json",
    "read_target",
    "resolve",
    "scan",
    "sha256_files",
    "target_quantization",
    "validate_pair",
    "write_zlab",
]
