"""The target families the reference runtime decodes losslessly: the one registry.

A row means: on a tiny random config of that ``model_type``, the reference runtime's output is
token-identical to the target's own greedy decoding, with drafts rejected and accepted, rows joining
and leaving the continuous scheduler (``tests/runtime/test_families.py`` and the family issues'
tests). ``cache`` says which state the runtime keeps exact across a rejected draft. Recipes read it
(a recipe whose target family is missing here is ``unsupported``, with that reason); whether
TensorRT-LLM can capture the family's hidden states is the release table's business, not this one's.

Data only: no torch, no transformers (planning and ``recipes list`` read it).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TargetFamily:
    """One target architecture family the runtime has proven lossless."""

    model_types: tuple[str, ...]  # config.json model_type values (text configs and their VLM wrappers)
    cache: str  # what the runtime keeps exact when a draft is rejected
    notes: str = ""


FAMILIES: dict[str, TargetFamily] = {
    "llama": TargetFamily(("llama",), "KV cache (truncated to the accepted prefix)"),
    "qwen3": TargetFamily(("qwen3",), "KV cache"),
    "qwen3_moe": TargetFamily(("qwen3_moe",), "KV cache (MoE routing is per token: nothing to roll back)"),
    "qwen3_5": TargetFamily(
        ("qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text"),
        "KV cache + Gated DeltaNet recurrent and conv states (rolled back)",
    ),
    "qwen3_next": TargetFamily(("qwen3_next",), "KV cache + Gated DeltaNet recurrent and conv states"),
    "nemotron_h": TargetFamily(("nemotron_h",), "KV cache + Mamba2 SSM and conv states (per-token)"),
    "kimi_linear": TargetFamily(("kimi_linear",), "MLA latent KV cache + KDA recurrent and conv states (per-token)"),
    "gemma4": TargetFamily(("gemma4", "gemma4_text"), "KV cache with sliding windows (window kept exact)"),
    "deepseek_v3": TargetFamily(("deepseek_v3", "kimi_k25"), "MLA latent KV cache"),
    "minimax_m2": TargetFamily(("minimax_m2",), "KV cache"),
    "gpt_oss": TargetFamily(("gpt_oss",), "KV cache with sliding windows"),
    # second wave (issue 26; tests/runtime/test_second_wave.py, test_sparse_cache.py)
    "deepseek_v32": TargetFamily(
        ("deepseek_v32",),
        "MLA latent KV + DSA indexer key cache, packed together "
        "before each verify (a rejected draft's key is gone before a query scores)",
    ),
    "glm_moe_dsa": TargetFamily(
        ("glm_moe_dsa",),
        "MLA latent KV + DSA indexer key cache (as deepseek_v32; "
        "shared-indexer layers reuse the previous layer's choice)",
    ),
    "deepseek_v4": TargetFamily(
        ("deepseek_v4",),
        "sliding window + CSA/HCA compressor and indexer state, one "
        "cache per row (copied before a verify, accepted prefix replayed)",
        "hash-routing tid2eid is an integer table; target_hidden is each tapped layer's "
        "MoE output (TensorRT-LLM's tap)",
    ),
    # issue 25: tests/runtime/test_hybrid_families.py, test_sparse_cache.py
    "glm5_next": TargetFamily(
        ("glm5_next", "glm5_next_text"),
        "KDA recurrent and conv states (per-token) + MLA "
        "latent KV + pooled indexer cache, packed to the back before each verify (pools "
        "stay aligned on a row's first token; a rejected draft's key is gone)",
        "target_hidden is each tapped layer's hyper-connection streams through the "
        "model's hc_head (an unweighted mean); no published drafter fixes the tap yet",
    ),
    "mimo_v2_flash": TargetFamily(("mimo_v2_flash",), "KV cache with sliding windows"),
    "laguna": TargetFamily(("laguna",), "KV cache with sliding windows"),
    "muse_glimmer": TargetFamily(("muse_glimmer", "muse_glimmer_text"), "KV cache with sliding windows"),
    "gemma4_unified": TargetFamily(
        ("gemma4_unified", "gemma4_unified_text"), "KV cache with sliding windows, KV shared across layers"
    ),
}

_BY_MODEL_TYPE = {mt: name for name, fam in FAMILIES.items() for mt in fam.model_types}


def target_family_of(model_type: str | None) -> str | None:
    """The registry's family name for a config's ``model_type``; None: not proven lossless here."""
    return _BY_MODEL_TYPE.get(model_type or "")
