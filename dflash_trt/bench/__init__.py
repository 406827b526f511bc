"""Bench: DFlash against autoregressive in one process, any OpenAI-compatible endpoint, and a
deployment against its plan.

Modules: ``inprocess`` (τ, acceptance, speedup, lossless), ``endpoint`` (load generator:
TTFT, inter-token latency, tokens/s per concurrency; plots), ``tune`` (measured-best schedules),
``verify`` (a bundle checked offline, a running deployment measured against its plan; with
``verify_lossless`` and ``verify_server`` behind it).
"""

__all__ = ["inprocess", "endpoint", "tune", "verify"]
