"""Model shapes for planning, from ``config.json`` alone (no weights needed).

:class:`TargetShape` counts a target's parameters by kind, because precision treats them
differently: decoder-layer linear weights are what ModelOpt quantizes; the embedding,
the LM head, norms, biases and MoE routers stay BF16 (``exclude_modules`` in the export).
Where the checkpoint's real byte count is known (``sizes.json`` next to the config, or the
safetensors headers of a local checkpoint) it is used for the weights *as shipped*.

Architectures: dense Llama/Qwen3-style decoders (Llama, Qwen2/3, Mistral, ...), Qwen3-MoE
and GPT-OSS (fused experts, attention sinks, MXFP4 experts as shipped);
hybrid Gated DeltaNet, MLA, gemma-4 and MiniMax targets through ``family_shapes``, whose
cache layouts (:class:`KVGroup`, :class:`StateGroup`) replace "every layer caches K/V".
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from dflash_trt import ingest
from dflash_trt.errors import CheckpointError
from dflash_trt.model import recognise_family
from dflash_trt.plan import sparse_shapes
from dflash_trt.plan.family_shapes import (
    FAMILIES,
    KVGroup,
    StateGroup,
    layer_counts,
    required_target_fields,
    vision_params,
)
from dflash_trt.plan.sparse_shapes import FAMILIES as SECOND_WAVE


def read_config(path: Path, role: str = "target") -> dict:
    f = Path(path) / "config.json"
    try:
        cfg = json.loads(f.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{role} {path}: no config.json") from None
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{f}: invalid JSON ({exc.msg}, line {exc.lineno})") from None
    return text_config(cfg)


def text_config(cfg: dict) -> dict:
    """The config the shapes are read from: a VLM's ``text_config`` (its model_type defaulted to
    the outer one), else the config itself."""
    if "num_hidden_layers" in cfg or not isinstance(cfg.get("text_config"), dict):
        return cfg
    text = dict(cfg["text_config"])  # a VLM: the text model (its model_type may be only the outer one)
    text.setdefault("model_type", cfg.get("model_type"))
    return text


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
    intermediate: int  # per-token MLP width (MoE: moe_intermediate x experts per token)
    max_position_embeddings: int
    embed_params: int
    lm_head_params: int  # 0 when tied to the embedding
    linear_params: int  # decoder-layer Linear weights: what quantization shrinks
    other_params: int  # norms, biases, routers, sinks: stay BF16
    n_linear: int  # Linear modules (each gets scalar scales when quantized)
    active_linear_params: int  # linear weights one token touches (MoE: top-k experts)
    experts: int = 0
    experts_per_token: int = 0
    expert_params: int = 0  # all experts' weights (part of linear_params)
    shipped_bytes: int | None = None
    shipped_precision: str | None = None  # None: BF16/FP16 as shipped; else fp8/nvfp4/mxfp4
    kv_groups: tuple[KVGroup, ...] = ()  # () : every layer caches K/V for the whole context
    state_groups: tuple[StateGroup, ...] = ()  # linear-attention layers' per-sequence states
    vision_params: int = 0  # a VLM's vision tower (part of other_params)

    @property
    def params(self) -> int:
        return self.embed_params + self.lm_head_params + self.linear_params + self.other_params

    def cache_bytes(self, tp: int, kv_bytes: int, tokens: int, windowed: bool = False) -> int:
        """One sequence's cache per rank at ``tokens`` of context: K/V of the attention layers
        (windowed ones capped, MLA's latent replicated, a sparse indexer's keys, compressed
        entries) plus linear-attention states; ``windowed``: sliding layers at their own window."""
        groups = self.kv_groups or (KVGroup(self.layers, self.kv_heads, 2 * self.head_dim),)
        return sum(g.bytes(tp, kv_bytes, tokens, windowed) for g in groups) + sum(
            s.bytes(tp) for s in self.state_groups
        )

    def sequence_bytes(self, tp: int, kv_cache: str, tokens: int) -> int:
        """One sequence's target cache per GPU at ``tokens`` of context, KV cache dtype
        ``kv_cache`` (auto: BF16, fp8). Every layer caching K/V for the whole context is only
        the plain decoder's case; see :meth:`cache_bytes`."""
        return self.cache_bytes(tp, 1 if kv_cache == "fp8" else 2, tokens)

    def attention_flops(self, tokens: int, ctx: int) -> int:
        """Score + value FLOPs of ``tokens`` new tokens over ``ctx`` cached ones (all ranks)."""
        groups = self.kv_groups or (KVGroup(self.layers, self.kv_heads, 2 * self.head_dim),)
        return sum(2 * tokens * g.attended(ctx) * self.heads * (g.flop_dims or g.dims) * g.layers for g in groups)

    @classmethod
    def from_config(
        cls, cfg: dict, shipped_bytes: int | None = None, shipped_precision: str | None = None, vision: int = 0
    ) -> TargetShape:
        if shipped_precision is None and cfg.get("quantization_config"):
            shipped_precision = quant_precision(cfg["quantization_config"])
        if str(cfg.get("model_type", "")) in FAMILIES + SECOND_WAVE:
            return cls._from_counts(cfg, shipped_bytes, shipped_precision, vision)
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
        mlp_lin, mlp_other, active_mlp, intermediate, layer_experts = _mlp_params(cfg, mt, H, nh, E, k)
        layer_lin, layer_other = attn_lin + mlp_lin, attn_other + norms + mlp_other
        active, n_lin, expert_params = L * (attn_lin + active_mlp), L * (4 + 3 * (E or 1)), L * layer_experts
        tied = bool(cfg.get("tie_word_embeddings", False))
        return cls(
            model_type=mt,
            layers=L,
            hidden=H,
            heads=nh,
            kv_heads=nkv,
            head_dim=hd,
            vocab=V,
            intermediate=intermediate,
            max_position_embeddings=cfg.get("max_position_embeddings", 0),
            embed_params=V * H,
            lm_head_params=0 if tied else V * H,
            linear_params=L * layer_lin,
            other_params=L * layer_other + H + vision,
            n_linear=n_lin,
            active_linear_params=active,
            experts=E,
            experts_per_token=k,
            expert_params=expert_params,
            shipped_bytes=shipped_bytes,
            shipped_precision=shipped_precision,
            vision_params=vision,
        )

    @classmethod
    def _from_counts(cls, cfg: dict, shipped_bytes, shipped_precision, vision: int) -> TargetShape:
        """Hybrid, MLA, gemma-4 and MiniMax targets (``family_shapes``)."""
        mt = str(cfg.get("model_type", ""))
        wave2 = mt in SECOND_WAVE  # deepseek_v32/v4, glm_moe_dsa, mimo, laguna, muse_glimmer, gemma4_unified
        fields = ["hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size"]
        required = fields + list(sparse_shapes.sparse_required(mt)) if wave2 else required_target_fields(cfg)
        missing = [f for f in required if cfg.get(f) is None]
        if missing:
            raise CheckpointError(f"target config lacks {missing[0]!r}; cannot plan")
        c = sparse_shapes.sparse_counts(cfg) if wave2 else layer_counts(cfg)
        if c is None:
            raise CheckpointError(f"target model_type {mt!r}: no shape rules to plan it with")
        H, V, nh = cfg["hidden_size"], cfg["vocab_size"], cfg["num_attention_heads"]
        tied = bool(cfg.get("tie_word_embeddings", False))
        kv = c.kv[-1]  # the layers whose cache grows with the context
        return cls(
            model_type=str(cfg["model_type"]).removesuffix("_text"),
            layers=cfg["num_hidden_layers"],
            hidden=H,
            heads=nh,
            kv_heads=kv.kv_heads,
            head_dim=kv.dims // 2,
            vocab=V,
            intermediate=c.intermediate,
            max_position_embeddings=cfg.get("max_position_embeddings", 0),
            embed_params=V * H,
            lm_head_params=0 if tied else V * H,
            linear_params=c.linear,
            other_params=c.other + H + vision,
            n_linear=c.n_linear,
            active_linear_params=c.active,
            experts=c.experts,
            experts_per_token=c.experts_per_token,
            expert_params=c.expert_params,
            shipped_bytes=shipped_bytes,
            shipped_precision=shipped_precision,
            kv_groups=c.kv,
            state_groups=c.states,
            vision_params=vision,
        )

    @classmethod
    def from_spec(cls, spec: ingest.TargetSpec, shipped_precision: str | None = None) -> TargetShape:
        """Shape from a target ingest read (its config and headers, not read again); byte count
        from the headers, else ``sizes.json`` beside a config-only directory."""
        size = sum(t.nbytes for t in spec.weights.tensors.values()) if spec.weights.present else None
        if size is None:
            size = (read_sizes(spec.path) or {}).get("total_size")
        return cls.from_config(
            text_config(spec.raw_config),
            shipped_bytes=size,
            shipped_precision=shipped_precision,
            vision=vision_params(spec.raw_config),
        )

    @classmethod
    def from_dir(cls, path: Path, shipped_precision: str | None = None) -> TargetShape:
        """Shape from a config directory; byte count from safetensors headers or ``sizes.json``."""
        cfg = read_config(path)
        size = safetensors_bytes(path)
        if size is None:
            sizes = read_sizes(path) or {}
            size = sizes.get("total_size")
        full = json.loads((Path(path) / "config.json").read_text())
        return cls.from_config(cfg, shipped_bytes=size, shipped_precision=shipped_precision, vision=vision_params(full))


def _mlp_params(cfg: dict, mt: str, H: int, nh: int, E: int, k: int) -> tuple[int, int, int, int, int]:
    """One layer's MLP, or its ``E`` experts of which ``k`` are active: (linear params, other params,
    active linear params, intermediate size, expert params)."""
    if E:
        moe_i = cfg.get("moe_intermediate_size") or cfg["intermediate_size"]
        per_expert = 3 * H * moe_i
        expert_bias = E * (2 * moe_i + H) if mt == "gpt_oss" else 0
        router = H * E + (E if mt == "gpt_oss" else 0)
        sinks = nh if mt == "gpt_oss" else 0
        return E * per_expert, expert_bias + router + sinks, k * per_expert, k * moe_i, E * per_expert
    F = cfg["intermediate_size"]
    return 3 * H * F, 3 * F if cfg.get("mlp_bias") else 0, 3 * H * F, F, 0


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


QWEN3_HEAD_DIM = 128  # transformers' Qwen3Config default head_dim


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
    # What a drafter family adds (``DrafterFamily.shape_counts``; all ``*_params`` part of ``params``):
    # DFlash2's grouped dynamic convolutions and candidate selector; 0 for a DFlash drafter.
    conv_params: int = 0  # 2 DynamicConv per layer (around attention and the MLP)
    selector_params: int = 0  # two codebooks [V, r] + hidden_projection [r, H]
    selector_rank: int = 0
    selector_top_k: int = 0

    @property
    def bytes(self) -> int:
        """The drafter stays BF16: its checkpoint's bytes when known, else 2 B per parameter."""
        return self.shipped_bytes or 2 * self.params

    @classmethod
    def from_spec(cls, spec: ingest.DrafterSpec) -> DraftShape:
        """Shape from a drafter ingest read (any published format, in its z-lab form)."""
        size = sum(t.nbytes for t in spec.weights.tensors.values()) if spec.weights.present else None
        return cls.from_config(spec.config.to_zlab(), shipped_bytes=size or (read_sizes(spec.path) or {}).get("bytes"))

    @classmethod
    def from_dir(cls, path: Path, zlab: dict | None = None) -> DraftShape:
        """``zlab``: the drafter's config in z-lab form (``DrafterConfig.to_zlab``) where its
        ``config.json`` is another published format (speculators: nested, +1 layer ids)."""
        cfg = zlab if zlab is not None else read_config(path, role="drafter")
        size = safetensors_bytes(path) or (read_sizes(path) or {}).get("bytes")
        return cls.from_config(cfg, shipped_bytes=size)

    @classmethod
    def from_config(cls, cfg: dict, shipped_bytes: int | None = None) -> DraftShape:
        """From a z-lab drafter ``config.json`` (also the partial ones: head_dim may be missing)."""
        dcfg = cfg.get("dflash_config") or {}
        try:
            H, L, nh = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"]
            F = cfg["intermediate_size"]
            ids = list(dcfg.get("target_layer_ids") or cfg["target_layer_ids"])
        except KeyError as exc:
            raise CheckpointError(f"drafter config lacks {exc.args[0]!r}; is it a z-lab DFlash drafter?") from None
        nkv = cfg.get("num_key_value_heads") or nh
        # A z-lab drafter is model_type qwen3: without head_dim its loaders (the z-lab code,
        # TensorRT-LLM's DFlash model) read transformers' Qwen3Config default, 128.
        hd = cfg.get("head_dim") or (QWEN3_HEAD_DIM if cfg.get("model_type", "qwen3") == "qwen3" else H // nh)
        bias = bool(cfg.get("attention_bias", False))
        layer = H * nh * hd + 2 * H * nkv * hd + nh * hd * H + 3 * H * F
        layer += 2 * H + 2 * hd + ((nh + 2 * nkv) * hd + H) * bias
        params = L * layer + len(ids) * H * H + 2 * H  # + fc, hidden_norm, norm
        extra = recognise_family(cfg, []).shape_counts(cfg, H, L)  # what the drafter's family adds
        return cls(
            layers=L,
            hidden=H,
            heads=nh,
            kv_heads=nkv,
            head_dim=hd,
            intermediate=F,
            block_size=int(dcfg.get("block_size", cfg.get("block_size", 16))),
            n_taps=len(ids),
            mask_token_id=dcfg.get("mask_token_id", cfg.get("mask_token_id")),
            target_layer_ids=tuple(ids),
            params=params + sum(v for n, v in extra.items() if n.endswith("_params")),
            shipped_bytes=shipped_bytes,
            max_position_embeddings=cfg.get("max_position_embeddings"),
            **extra,
        )
