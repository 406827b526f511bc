"""Serve: the embedded OpenAI-compatible server and TensorRT-LLM launch files.

Modules: ``protocol`` (request models, OpenAI-style errors), ``batcher`` (queue and worker),
``metrics`` (Prometheus), ``app`` (the FastAPI routes; fastapi is imported on use), ``launch``
(``trtllm-serve`` through the bundle's script; Slurm and Kubernetes files).
Other subpackages import from here, never from inside.
"""
from __future__ import annotations

from dflash_trt.serve.batcher import Batcher, Job
from dflash_trt.serve.app import ServerThread, check_fits_cpu, create_app, serve

__all__ = [
    "launch",
    "Batcher",
    "Job",
    "ServerThread",
    "check_fits_cpu",
    "create_app",
    "serve",
]
