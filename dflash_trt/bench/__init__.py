"""Bench: DFlash against autoregressive in one process, any OpenAI-compatible endpoint, and a
deployment against its plan.

Modules: ``latency`` (TTFT, TPOT, ITL per chunk and per token, end-to-end latency, tokens/s per
user: pure functions of (time, tokens) events), ``spread`` (repeats, their interval, and the rule
that nothing within noise is a conclusion), ``datasets`` (prompt sets: the project's JSONL,
ShareGPT, text, Hugging Face), ``load`` (closed loop at a concurrency, open loop at a request
rate; goodput), ``inprocess`` (τ, acceptance, speedup, lossless),
``endpoint`` (load generator: every ``latency`` figure and τ per concurrency, with spreads;
``stream`` sends each request and reads its stream, ``spec_metrics`` reads τ from /metrics,
``conclusions`` compares sides and arms beyond noise), ``plots``, ``tune`` (schedules measured
beyond noise; ``tune_bundle`` reads the bundle and writes it back in one swap),
``verify`` (a bundle checked offline, a running deployment measured against its plan; with
``verify_lossless`` and ``verify_server`` behind it).
"""

__all__ = ["latency", "spread", "datasets", "load", "inprocess", "endpoint", "plots", "tune", "verify"]
