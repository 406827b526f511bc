"""Model shapes for planning, from ``config.json`` alone (no weights needed).

:class:`TargetShape` counts a target's parameters by kind, because precision treats them
differently: decoder-layer linear weights are what ModelOpt quantizes; the embedding,
the LM head, norms, biases and MoE routers stay BF16 (``exclude_modules`` in the export).
Where the checkpoint's real byte count is known (``sizes.json`` next to the config, or the
safetensors headers of a local checkpoint) it is used for the weights *as shipped*.

Architectures: dense Llama/Qwen3-style decoders (Llama, Qwen2/3, Mistral, ...), Qwen3-MoE
and GPT-OSS (fused experts, attention sinks, MXFP4 experts as shipped).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from dflash_trt import ingest
from dflash_trt.errors import CheckpointError


def read_config(path: Path, role: str = "target") -> dict:
    f = Path(path) / "config.json"
    try:
        cfg = json.loads(f.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{role} {path}: no config.json") from None
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{f}: invalid JSON ({exc.msg}, line {exc.lineno})") from None
    return cfg.get("text_config", cfg) if "num_hidden_layers" not in cfg else cfg


def safetensors_bytes(path: Path) -> int | None:
    """Tensor payload bytes of the ``*.safetensors`` files in ``path`` (headers only); None
    when there are none."""
    if not any(Path(path).glob("*.safetensors")):
        return None
    return sum(t.nbytes for t in ingest.read_headers(path).values())


def read_sizes(path: Path) -> dict | None:
    f = Path(path) / "sizes.json"
    return json.loads(f.read_text()) if f.exists() else None


@dataclass(frozen=True)
class TargetShape:
    model_type: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    intermediate: int            # per-token MLP width (MoE: moe_intermediate x experts per token)
    max_position_embeddings: int
    embed_params: int
    lm_head_params: int          # 0 when tied to the embedding
    linear_params: int           # decoder-layer Linear weights: what quantization shrinks
    other_params: int            # norms, biases, routers, sinks: stay BF16
    n_linear: int                # Linear modules (each gets scalar scales when quantized)
    active_linear_params: int    # linear weights one token touches (MoE: top-k experts)
    experts: int = 0
    experts_per_token: int = 0
    expert_params: int = 0       # all experts' weights (part of linear_params)
    shipped_bytes: int | None = None
    shipped_precision: str | None = None  # None: BF16/FP16 as shipped; else fp8/nvfp4/mxfp4

    @property
    def params(self) -> int:
        return self.embed_params + self.lm_head_params + self.linear_params + self.other_params

    @classmethod
    def from_config(cls, cfg: dict, shipped_bytes: int | None = None,
                    shipped_precision: str | None = None) -> "TargetShape":
        try:
            H, L = cfg["hidden_size"], cfg["num_hidden_layers"]
            nh = cfg["num_attention_heads"]
            nkv = cfg.get("num_key_value_heads") or nh
            hd = cfg.get("head_dim") or H // nh
            V = cfg["vocab_size"]
        except KeyError as exc:
            raise CheckpointError(f"target config lacks {exc.args[0]!r}; cannot plan") from None
        mt = cfg.get("model_type", "llama")
        bias = bool(cfg.get("attention_bias", False) or cfg.get("qkv_bias", False))
        q, kv, o = H * nh * hd, 2 * H * nkv * hd, nh * hd * H
        attn_lin = q + kv + o
        attn_other = (nh * hd + 2 * nkv * hd) * bias + (H if bias and mt == "gpt_oss" else 0)
        qk_norm = mt in ("qwen3", "qwen3_moe") or cfg.get("use_qk_norm", False)
        norms = 2 * H + (2 * hd if qk_norm else 0)
        E = cfg.get("num_local_experts") or cfg.get("num_experts") or 0
        k = cfg.get("num_experts_per_tok") or cfg.get("experts_per_token") or 0
        if E:
            moe_i = cfg.get("moe_intermediate_size") or cfg["intermediate_size"]
            per_expert = 3 * H * moe_i
            expert_bias = E * (2 * moe_i + H) if mt == "gpt_oss" else 0
            router = H * E + (E if mt == "gpt_oss" else 0)
            sinks = nh if mt == "gpt_oss" else 0
            layer_lin = attn_lin + E * per_expert
            layer_other = attn_other + norms + expert_bias + router + sinks
            active = L * (attn_lin + k * per_expert)
            n_lin = L * (4 + 3 * E)
            intermediate, expert_params = k * moe_i, L * E * per_expert
        else:
            I = cfg["intermediate_size"]
            mlp_bias = 3 * I if cfg.get("mlp_bias") else 0
            layer_lin = attn_lin + 3 * H * I
            layer_other = attn_other + norms + mlp_bias
            active, n_lin, intermediate, expert_params = L * layer_lin, 7 * L, I, 0
        tied = bool(cfg.get("tie_word_embeddings", False))
        if shipped_precision is None and cfg.get("quantization_config"):
            shipped_precision = quant_precision(cfg["quantization_config"])
        return cls(
            model_type=mt, layers=L, hidden=H, heads=nh, kv_heads=nkv, head_dim=hd, vocab=V,
            intermediate=intermediate, max_position_embeddings=cfg.get("max_position_embeddings", 0),
            embed_params=V * H, lm_head_params=0 if tied else V * H,
            linear_params=L * layer_lin, other_params=L * layer_other + H, n_linear=n_lin,
            active_linear_params=active, experts=E, experts_per_token=k, expert_params=expert_params,
            shipped_bytes=shipped_bytes, shipped_precision=shipped_precision,
        )

    @classmethod
    def from_dir(cls, path: Path, shipped_precision: str | None = None) -> "TargetShape":
        """Shape from a config directory; byte count from safetensors headers or ``sizes.json``."""
        cfg = read_config(path)
        size = safetensors_bytes(path)
        if size is None:
            sizes = read_sizes(path) or {}
            size = sizes.get("total_size")
        return cls.from_config(cfg, shipped_bytes=size, shipped_precision=shipped_precision)


def quant_precision(qcfg: dict) -> str | None:
    """Our precision name for a ``quantization_config`` / ``hf_quant_config`` block, or None."""
    algo = str(qcfg.get("quant_algo") or qcfg.get("quant_method") or "").upper()
    if "NVFP4" in algo:
        return "nvfp4"
    if "MXFP4" in algo:
        return "mxfp4"
    if "FP8" in algo:
        return "fp8"
    return None


@dataclass(frozen=True)
class DraftShape:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    block_size: int
    n_taps: int
    mask_token_id: int | None
    target_layer_ids: tuple[int, ...]
    params: int
    shipped_bytes: int | None = None
    max_position_embeddings: int | None = None  # caps TensorRT-LLM's drafter context buffer

    @property
    def bytes(self) -> int:
        """The drafter stays BF16: its checkpoint's bytes when known, else 2 B per parameter."""
        return self.shipped_bytes or 2 * self.params

    @classmethod
    def from_dir(cls, path: Path) -> "DraftShape":
        cfg = read_config(path, role="drafter")
        size = safetensors_bytes(path) or (read_sizes(path) or {}).get("bytes")
        return cls.from_config(cfg, shipped_bytes=size)

    @classmethod
    def from_config(cls, cfg: dict, shipped_bytes: int | None = None) -> "DraftShape":
        """From a z-lab drafter ``config.json`` (also the partial ones: head_dim may be missing)."""
        dcfg = cfg.get("dflash_config") or {}
        try:
            H, L, nh = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"]
            I = cfg["intermediate_size"]
            ids = list(dcfg.get("target_layer_ids") or cfg["target_layer_ids"])
        except KeyError as exc:
            raise CheckpointError(f"drafter config lacks {exc.args[0]!r}; is it a z-lab DFlash drafter?") from None
        nkv = cfg.get("num_key_value_heads") or nh
        hd = cfg.get("head_dim") or H // nh
        bias = bool(cfg.get("attention_bias", False))
        layer = H * nh * hd + 2 * H * nkv * hd + nh * hd * H + 3 * H * I
        layer += 2 * H + 2 * hd + ((nh + 2 * nkv) * hd + H) * bias
        params = L * layer + len(ids) * H * H + 2 * H  # + fc, hidden_norm, norm
        return cls(layers=L, hidden=H, heads=nh, kv_heads=nkv, head_dim=hd, intermediate=I,
                   block_size=int(dcfg.get("block_size", cfg.get("block_size", 16))), n_taps=len(ids),
                   mask_token_id=dcfg.get("mask_token_id", cfg.get("mask_token_id")),
                   target_layer_ids=tuple(ids), params=params, shipped_bytes=shipped_bytes,
                   max_position_embeddings=cfg.get("max_position_embeddings"))
