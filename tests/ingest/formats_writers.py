"""Write tiny drafters in each published format, by hand (never through dflash_trt.ingest).

Configs are hand-written dicts shaped like the published files (z-lab's Qwen3-8B-DFlash-b16,
speculators' DFlashSpeculatorConfig, ModelOpt's DFlashExporter); tensors are saved with
``safetensors.torch.save_file`` under each format's own names.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file


def _layer_cfg(cfg) -> dict:
    return {
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "vocab_size": cfg.vocab_size,
        "rms_norm_eps": cfg.rms_norm_eps,
        "max_position_embeddings": cfg.max_position_embeddings,
    }


def _write(root: Path, config: dict, tensors: dict[str, torch.Tensor], name: str = "model.safetensors") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(config, indent=2))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(root / name), metadata={"format": "pt"})
    return root


def body(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The drafter body tensors (no head / vocabulary map)."""
    return {k: v for k, v in state.items() if k not in ("lm_head.weight", "d2t")}


def write_zlab_v1(root: Path, cfg, state: dict[str, torch.Tensor]) -> Path:
    """z-lab v1: top-level block_size, dflash_config{mask_token_id, target_layer_ids} (as Qwen3-8B-DFlash-b16)."""
    dflash = {"mask_token_id": cfg.mask_token_id, "target_layer_ids": list(cfg.target_layer_ids)}
    tensors = body(state)
    if cfg.draft_vocab_size:  # reduced draft vocabulary kept in z-lab form: own head + absolute d2t
        dflash["draft_vocab_size"] = cfg.draft_vocab_size
        tensors["lm_head.weight"] = state["lm_head.weight"]
        tensors["d2t"] = state["d2t"]
    config = {
        "architectures": ["DFlashDraftModel"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
        "block_size": cfg.block_size,
        "dflash_config": dflash,
        "dtype": "float32",
        "hidden_act": "silu",
        **_layer_cfg(cfg),
        "layer_types": ["full_attention"] * cfg.num_hidden_layers,
        "max_window_layers": cfg.num_hidden_layers,
        "model_type": "qwen3",
        "num_target_layers": cfg.num_target_layers,
        "rope_scaling": None,
        "rope_theta": cfg.rope_theta,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "use_cache": True,
        "use_sliding_window": False,
    }
    return _write(root, config, tensors)


def write_zlab_newer(root: Path, cfg, state: dict[str, torch.Tensor]) -> Path:
    """z-lab newer: block_size inside dflash_config, explicit layer_types/causal, transformers-5 rope_parameters."""
    config = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "dflash_config": {
            "block_size": cfg.block_size,
            "mask_token_id": cfg.mask_token_id,
            "target_layer_ids": list(cfg.target_layer_ids),
            "causal": False,
        },
        **_layer_cfg(cfg),
        "layer_types": ["full_attention"] * cfg.num_hidden_layers,
        "rope_parameters": {"rope_theta": cfg.rope_theta, "rope_type": "default"},
        "num_target_layers": cfg.num_target_layers,
        "torch_dtype": "float32",
    }
    return _write(root, config, body(state))


def write_modelopt(root: Path, cfg, state: dict[str, torch.Tensor], prefix: str = "") -> Path:
    """ModelOpt DFlashExporter output (torch_dtype, explicit causal, rope_scaling None), optional name prefix."""
    config = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "block_size": cfg.block_size,
        "dflash_config": {
            "mask_token_id": cfg.mask_token_id,
            "target_layer_ids": list(cfg.target_layer_ids),
            "causal": False,
        },
        **_layer_cfg(cfg),
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": None,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "num_target_layers": cfg.num_target_layers,
        "layer_types": ["full_attention"] * cfg.num_hidden_layers,
    }
    _write(root, config, {prefix + k: v for k, v in body(state).items()})
    (root / "hf_quant_config.json").write_text(
        json.dumps({"producer": {"name": "modelopt", "version": "0.47.0"}, "quantization": {"quant_algo": None}})
    )
    return root


def write_speculators(
    root: Path,
    cfg,
    state: dict[str, torch.Tensor],
    verifier_head: torch.Tensor | None = None,
    extra: dict[str, torch.Tensor] | None = None,
) -> Path:
    """vllm-project/speculators DFlash: nested transformer_layer_config, aux ids = z-lab ids + 1,
    a reduced vocabulary as own lm_head + d2t *offsets* + t2d mask (train/vocab_mapping.py)."""
    vocab = cfg.vocab_size
    draft_vocab = cfg.draft_vocab_size or vocab
    tensors = body(state)
    if cfg.draft_vocab_size:
        ids = state["d2t"].long()
        tensors["lm_head.weight"] = state["lm_head.weight"]
        tensors["d2t"] = ids - torch.arange(len(ids))  # offsets: target = i + d2t[i]
        t2d = torch.zeros(vocab, dtype=torch.bool)
        t2d[ids] = True
        tensors["t2d"] = t2d
    elif verifier_head is not None:  # full vocabulary: speculators may save the frozen verifier head
        tensors["lm_head.weight"] = verifier_head
    tensors.update(extra or {})
    layer = {
        "model_type": "qwen3",
        **_layer_cfg(cfg),
        "rope_parameters": {"rope_theta": cfg.rope_theta, "rope_type": "default"},
        "architectures": ["Qwen3ForCausalLM"],
    }
    config = {
        "speculators_model_type": "dflash",
        "architectures": ["DFlashSpeculator"],
        "transformer_layer_config": layer,
        "draft_vocab_size": draft_vocab,
        "block_size": cfg.block_size,
        "target_hidden_size": None,
        "aux_hidden_state_layer_ids": [i + 1 for i in cfg.target_layer_ids],
        "mask_token_id": cfg.mask_token_id,
        "sliding_window_non_causal": False,
        "projector_type": "dflash",
        "sample_from_anchor": False,
        "shift_label": False,
        "speculators_config": {
            "algorithm": "dflash",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": cfg.block_size - 1}],
            "verifier": {"name_or_path": "tests/tiny-target", "architectures": ["Qwen3ForCausalLM"]},
        },
        "speculators_version": "0.4.0",
        "torch_dtype": "float32",
    }
    return _write(root, config, tensors)
