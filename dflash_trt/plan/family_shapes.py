"""Parameter counts and cache layouts of the target families beyond plain decoders.

:func:`layer_counts` returns, per family, what :class:`~dflash_trt.plan.model_shapes.TargetShape`
needs: decoder Linear weights (all, and those one token touches), the rest (norms, routers,
conv kernels, gates), the Linear module count, the MoE sizes, and the cache layout:

* :class:`KVGroup` -- attention layers that cache K/V per token (gemma-4: sliding and global
  layers with their own heads and sizes); MLA layers cache one compressed latent of
  ``kv_lora_rank + qk_rope_head_dim`` per token, shared by every head (DeepSeek-V3 report,
  arXiv 2412.19437, section 2.1.1) and so not split across tensor-parallel ranks. A
  ``window`` caps what a sliding layer holds; none is set today (see ``_gemma4``).
* :class:`StateGroup` -- Gated DeltaNet layers (Qwen3.5/3.6, Qwen3-Coder-Next) cache no K/V:
  per sequence a conv state (``K - 1`` past inputs of the ``2 x key_dim + value_dim`` conv
  channels) and a recurrent state (``value heads x d_k x d_v``, in ``mamba_ssm_dtype``,
  float32 as shipped), split across ranks by heads.

Families: ``qwen3_5`` / ``qwen3_5_moe`` (hybrid, gated full attention, shared expert),
``qwen3_next`` (the same layout), ``deepseek_v3`` / ``kimi_k2`` (MLA, ``first_k_dense_replace``
dense layers then routed + shared experts), ``gemma4`` (sliding and global layers with their
own head size and KV heads, K = V on global layers, a dense MLP beside the MoE block),
``minimax_m2`` (GQA + MoE, per-layer full-width QK norm); ``nemotron_h`` (Mamba2), ``kimi_linear``
(KDA + MLA) and ``glm5_next`` (KDA-like + MLA with a pooled sparse indexer) in ``hybrid_shapes``. A
VLM's vision tower is counted apart (:func:`vision_params`): it is loaded with the checkpoint and
stays BF16 when the text model is quantized.
"""

from __future__ import annotations

from dataclasses import dataclass

from dflash_trt.plan import hybrid_shapes

HYBRID = ("qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text", "qwen3_next")
MLA = ("deepseek_v3", "kimi_k2", "kimi_k25")
GEMMA = ("gemma4", "gemma4_text")
SECOND_WAVE = ("nemotron_h", "kimi_linear", "glm5_next", "glm5_next_text")  # hybrid_shapes.py
FAMILIES = HYBRID + MLA + GEMMA + ("minimax_m2",) + SECOND_WAVE


@dataclass(frozen=True)
class KVGroup:
    layers: int
    kv_heads: int  # per layer (MLA: 1, the shared latent)
    dims: int  # K + V elements per head per token
    window: int = 0  # 0: the whole context; else at most this many tokens
    split: bool = True  # KV heads split across tensor-parallel ranks
    flop_dims: int = 0  # q.k + p.v elements per query head per cached token (0: dims)
    stride: int = 1  # tokens per cached entry (a compressor emits one per stride: DeepSeek V4)
    attend: int = 0  # 0: a query reads every entry; else at most this many (a sparse indexer's top-k)
    sliding: int = 0  # the layer's own sliding window, not applied to ``bytes`` unless ``windowed``

    def bytes(self, tp: int, kv_bytes: int, tokens: int, windowed: bool = False) -> int:
        """One sequence's K/V bytes per rank at ``tokens`` of context (``windowed``: sliding
        layers capped at their own window, as the reference runtime keeps them)."""
        heads = -(-self.kv_heads // tp) if self.split else self.kv_heads
        cap = self.window or (self.sliding if windowed else 0)
        held = (min(tokens, cap) if cap else tokens) // self.stride
        return self.layers * heads * self.dims * kv_bytes * held

    def attended(self, ctx: int) -> int:
        """Entries one query reads at ``ctx`` tokens of context."""
        held = (min(ctx, self.window) if self.window else ctx) // self.stride
        return min(held, self.attend) if self.attend else held


@dataclass(frozen=True)
class StateGroup:
    layers: int
    heads: int  # value heads: what tensor parallelism splits
    conv: int  # conv-state elements per layer (all heads)
    recurrent: int  # recurrent-state elements per layer (all heads)
    conv_bytes: int = 2
    recurrent_bytes: int = 4

    def bytes(self, tp: int) -> int:
        """One sequence's state bytes per rank, whatever its length."""
        share = -(-self.heads // tp) / self.heads
        return int(self.layers * (self.conv * self.conv_bytes + self.recurrent * self.recurrent_bytes) * share)


@dataclass
class Counts:
    linear: int = 0  # decoder Linear weights
    active: int = 0  # the Linear weights one token touches
    other: int = 0  # norms, routers, conv kernels, gates: kept BF16
    n_linear: int = 0
    experts: int = 0
    experts_per_token: int = 0
    expert_params: int = 0
    intermediate: int = 0  # per-token MLP width
    kv: tuple[KVGroup, ...] = ()
    states: tuple[StateGroup, ...] = ()

    def add(self, lin: int, other: int, n_lin: int, active: int | None = None) -> None:
        self.linear += lin
        self.other += other
        self.n_linear += n_lin
        self.active += lin if active is None else active


def _layer_types(cfg: dict) -> list[str]:
    L = cfg["num_hidden_layers"]
    if cfg.get("layer_types"):
        return list(cfg["layer_types"])
    every = int(cfg.get("full_attention_interval") or 4)
    return ["full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(L)]


def _moe(c: Counts, cfg: dict, H: int, experts: int, k: int, moe_i: int, shared_i: int, layers: int) -> None:
    """Routed experts (SwiGLU, 3 x H x moe_i each), a router, and an always-active shared expert."""
    per = 3 * H * moe_i
    shared = 3 * H * shared_i
    c.add(
        layers * (experts * per + shared),
        layers * (H * experts + (H if shared_i else 0)),
        layers * (3 * experts + (3 if shared_i else 0)),
        active=layers * (k * per + shared),
    )
    c.experts, c.experts_per_token = experts, k
    c.expert_params += layers * experts * per
    c.intermediate = k * moe_i + shared_i


def _hybrid(cfg: dict) -> Counts:
    """Qwen3.5 / Qwen3.6 / Qwen3-Coder-Next: Gated DeltaNet 3 : 1 gated full attention."""
    H, nh, nkv, hd = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    types = _layer_types(cfg)
    n_lin, n_full = types.count("linear_attention"), types.count("full_attention")
    kd = cfg["linear_num_key_heads"] * cfg["linear_key_head_dim"]
    vd = cfg["linear_num_value_heads"] * cfg["linear_value_head_dim"]
    nv, K = cfg["linear_num_value_heads"], cfg.get("linear_conv_kernel_dim", 4)
    c = Counts()
    gate = 2 if cfg.get("attn_output_gate", True) else 1  # q_proj also emits the output gate
    c.add(n_full * (H * nh * hd * gate + 2 * H * nkv * hd + nh * hd * H), n_full * 2 * hd, 4 * n_full)
    conv_dim = 2 * kd + vd
    c.add(
        n_lin * (H * (conv_dim + vd + 2 * nv) + vd * H),
        n_lin * (conv_dim * K + 2 * nv + cfg["linear_value_head_dim"]),
        5 * n_lin,
    )
    L = len(types)
    if cfg.get("num_experts"):
        _moe(
            c,
            cfg,
            H,
            cfg["num_experts"],
            cfg["num_experts_per_tok"],
            cfg["moe_intermediate_size"],
            cfg.get("shared_expert_intermediate_size") or 0,
            L,
        )
    else:
        F = cfg["intermediate_size"]
        c.add(L * 3 * H * F, 0, 3 * L)
        c.intermediate = F
    c.other += L * 2 * H
    ssm = 4 if str(cfg.get("mamba_ssm_dtype", "float32")) == "float32" else 2
    c.kv = (KVGroup(n_full, nkv, 2 * hd),)
    c.states = (
        StateGroup(
            n_lin,
            nv,
            conv_dim * (K - 1),
            nv * cfg["linear_key_head_dim"] * cfg["linear_value_head_dim"],
            recurrent_bytes=ssm,
        ),
    )
    return c


def _mla(cfg: dict) -> Counts:
    """DeepSeek-V3 / Kimi K2.x: MLA attention, dense first layers, routed + shared experts."""
    H, nh, L = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_hidden_layers"]
    qr, kvr = cfg.get("q_lora_rank"), cfg["kv_lora_rank"]
    nope, rope, v = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    q = H * qr + qr * nh * (nope + rope) if qr else H * nh * (nope + rope)
    attn = q + H * (kvr + rope) + kvr * nh * (nope + v) + nh * v * H
    c = Counts()
    c.add(L * attn, L * (kvr + (qr or 0)), L * (5 if qr else 4))
    dense = int(cfg.get("first_k_dense_replace") or 0)
    c.add(dense * 3 * H * cfg["intermediate_size"], 0, 3 * dense)
    moe_i = cfg["moe_intermediate_size"]
    _moe(
        c,
        cfg,
        H,
        cfg["n_routed_experts"],
        cfg["num_experts_per_tok"],
        moe_i,
        int(cfg.get("n_shared_experts") or 0) * moe_i,
        L - dense,
    )
    c.other += L * 2 * H + (L - dense) * cfg["n_routed_experts"]  # + the router's correction bias
    c.kv = (KVGroup(L, 1, kvr + rope, split=False, flop_dims=nope + rope + v),)
    return c


def _gemma4(cfg: dict) -> Counts:
    """Gemma 4: sliding layers (head_dim, kv heads) and global ones (global_head_dim, global kv
    heads, K = V), a dense MLP in every layer and, with ``enable_moe_block``, experts beside it."""
    H, nh, L = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_hidden_layers"]
    types = _layer_types(cfg) if cfg.get("layer_types") else ["sliding_attention"] * L
    n_glob = types.count("full_attention")
    n_sl = L - n_glob
    hd, nkv = cfg["head_dim"], cfg["num_key_value_heads"]
    ghd = cfg.get("global_head_dim") or hd
    gkv = cfg.get("num_global_key_value_heads") or nkv
    k_eq_v = bool(cfg.get("attention_k_eq_v"))
    c = Counts()
    c.add(n_sl * (2 * H * nh * hd + 2 * H * nkv * hd), n_sl * 3 * hd, 4 * n_sl)
    c.add(
        n_glob * (2 * H * nh * ghd + (1 if k_eq_v else 2) * H * gkv * ghd),
        n_glob * 3 * ghd,
        (3 if k_eq_v else 4) * n_glob,
    )
    F = cfg["intermediate_size"]
    c.add(L * 3 * H * F, 0, 3 * L)
    c.intermediate = F
    if cfg.get("enable_moe_block") and cfg.get("num_experts"):
        _moe(c, cfg, H, cfg["num_experts"], cfg["top_k_experts"], cfg["moe_intermediate_size"], 0, L)
        c.intermediate += F
    c.other += L * 4 * H
    # Sliding layers as if full: TensorRT-LLM sizes every layer's cache for the whole context
    # unless kv_cache_config.max_attention_window lists per-layer windows (VSWA), which the
    # bundle does not set; a window here would under-count what it allocates.
    c.kv = (KVGroup(n_sl, nkv, 2 * hd), KVGroup(n_glob, gkv, 2 * ghd))
    return c


def _minimax(cfg: dict) -> Counts:
    """MiniMax M2: GQA attention with full-width QK norm, every layer MoE (no shared expert)."""
    H, nh, nkv, L = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["num_hidden_layers"]
    hd = cfg.get("head_dim") or H // nh
    c = Counts()
    c.add(L * (2 * H * nh * hd + 2 * H * nkv * hd), L * (nh * hd + nkv * hd), 4 * L)
    _moe(c, cfg, H, cfg["num_local_experts"], cfg["num_experts_per_tok"], cfg["intermediate_size"], 0, L)
    c.other += L * (2 * H + cfg["num_local_experts"])  # + e_score_correction_bias
    c.kv = (KVGroup(L, nkv, 2 * hd),)
    return c


# What the planner reads, per family (besides hidden_size, num_hidden_layers,
# num_attention_heads and vocab_size, which every target needs).
_REQUIRED = {
    "hybrid": (
        "num_key_value_heads",
        "head_dim",
        "linear_num_key_heads",
        "linear_key_head_dim",
        "linear_num_value_heads",
        "linear_value_head_dim",
    ),
    "hybrid_moe": ("num_experts", "num_experts_per_tok", "moe_intermediate_size"),
    "dense": ("intermediate_size",),
    "mla": (
        "kv_lora_rank",
        "qk_nope_head_dim",
        "qk_rope_head_dim",
        "v_head_dim",
        "intermediate_size",
        "moe_intermediate_size",
        "n_routed_experts",
        "num_experts_per_tok",
    ),
    "gemma4": ("num_key_value_heads", "head_dim", "intermediate_size", "layer_types"),
    "minimax_m2": ("num_key_value_heads", "head_dim", "intermediate_size", "num_local_experts", "num_experts_per_tok"),
    "plain": ("intermediate_size",),
}
COMMON = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")


def required_target_fields(cfg: dict) -> list[str]:
    """The text-config fields planning this target needs (the family read from model_type)."""
    mt = str(cfg.get("model_type", ""))
    if mt in HYBRID:
        extra = _REQUIRED["hybrid"] + (
            _REQUIRED["hybrid_moe"] if "moe" in mt or mt == "qwen3_next" else _REQUIRED["dense"]
        )
    elif mt in MLA:
        extra = _REQUIRED["mla"]
    elif mt in GEMMA:
        extra = _REQUIRED["gemma4"]
    elif mt == "minimax_m2":
        extra = _REQUIRED["minimax_m2"]
    elif mt in SECOND_WAVE:
        extra = hybrid_shapes.hybrid_required(mt)
    else:
        moe = cfg.get("num_experts") or cfg.get("num_local_experts")
        extra = ("moe_intermediate_size",) if moe and mt != "gpt_oss" else _REQUIRED["plain"]
    return list(COMMON + extra)


def layer_counts(cfg: dict) -> Counts | None:
    """The counts of a family this module knows (by the text config's model_type), else None."""
    mt = str(cfg.get("model_type", ""))
    if mt in HYBRID:
        return _hybrid(cfg)
    if mt in MLA:
        return _mla(cfg)
    if mt in GEMMA:
        return _gemma4(cfg)
    if mt == "minimax_m2":
        return _minimax(cfg)
    if mt in SECOND_WAVE:
        return hybrid_shapes.hybrid_counts(cfg, Counts, KVGroup, StateGroup)
    return None


def vision_params(full: dict) -> int:
    """A VLM checkpoint's vision tower (ViT blocks + patch embedding + merger), from its
    ``vision_config``; 0 for a text-only config. Approximate (+- a few %): 4 H^2 + 2 H F per
    block (attention, MLP), the patch embedding and a 2-layer merger into the text width."""
    v = full.get("vision_config")
    if not isinstance(v, dict):
        return 0
    H = v.get("hidden_size") or v.get("vt_hidden_size") or 1152
    F = v.get("intermediate_size") or v.get("vt_intermediate_size") or 4 * H
    depth = v.get("depth") or v.get("num_hidden_layers") or v.get("vt_num_hidden_layers") or 27
    patch = v.get("patch_size") or 14
    text = (full.get("text_config") or {}).get("hidden_size") or v.get("out_hidden_size") or H
    merge = (v.get("spatial_merge_size") or 2) ** 2
    return depth * (4 * H * H + 2 * H * F) + 3 * patch * patch * 2 * H + merge * H * (merge * H + text)
