"""Bench: DFlash against autoregressive in one process, and any OpenAI-compatible endpoint.

Modules: ``inprocess`` (τ, acceptance, speedup, lossless), ``endpoint`` (load generator:
TTFT, inter-token latency, tokens/s per concurrency; plots).
"""

__all__ = ["inprocess", "endpoint", "tune"]
