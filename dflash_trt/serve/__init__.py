"""Serve: the embedded OpenAI-compatible server and TensorRT-LLM launch files.

Modules: ``protocol`` (request models, OpenAI-style errors), ``batcher`` (the bounded queue and jobs),
``continuous`` (the worker over the runtime's scheduler), ``metrics`` (Prometheus), ``render`` (chat
templates in child processes), ``state`` (what one app serves), ``spec`` (``ServeSpec``: the
server's settings, checked once), ``routes`` (one handler per endpoint, request checks and error
answers in one place) and ``responses`` (OpenAI bodies, SSE chunks),
both importing fastapi and imported on use, ``app`` (``create_app`` wiring, ``serve``,
``ServerThread``), ``memory`` (will the weights fit in RAM), ``launch`` (``trtllm-serve``
through the bundle's script; Slurm and Kubernetes files), ``client`` (an OpenAI completions
client over token ids, for regeneration).
Other subpackages import from here, never from inside.
"""

from __future__ import annotations

from dflash_trt.serve.app import ServerThread, create_app, serve
from dflash_trt.serve.batcher import Batcher, Job
from dflash_trt.serve.client import Completion, CompletionClient, complete_all, served_model
from dflash_trt.serve.continuous import ContinuousBatcher
from dflash_trt.serve.memory import check_fits_cpu
from dflash_trt.serve.spec import ServeSpec

__all__ = [
    "launch",
    "Batcher",
    "Completion",
    "CompletionClient",
    "ContinuousBatcher",
    "Job",
    "ServeSpec",
    "ServerThread",
    "check_fits_cpu",
    "complete_all",
    "create_app",
    "serve",
    "served_model",
]
