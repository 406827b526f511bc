"""Parameter counts and per-sequence caches of the second-wave target families (no torch).

What one sequence holds per layer, at ``n`` tokens of context (elements; x the KV cache dtype):

* **DeepSeek sparse attention** (``deepseek_v32``, ``glm_moe_dsa``): the MLA latent,
  ``kv_lora_rank + qk_rope_head_dim`` per token, shared by every head (not split across
  tensor-parallel ranks), and the indexer's key, ``index_head_dim`` per token, on every layer
  that runs its own indexer (glm_moe_dsa's ``"shared"`` layers reuse the previous layer's
  choice and cache no indexer key). A query attends ``index_topk`` of the cached tokens.
* **DeepSeek V4** (``deepseek_v4``): every layer a sliding window of ``sliding_window`` tokens
  of one shared K = V head (``head_dim``); a CSA layer also one compressed entry per
  ``compress_rates["compressed_sparse_attention"]`` tokens (``head_dim``) and the Lightning
  indexer's compressed key (``index_head_dim``) per entry; an HCA layer one entry per
  ``compress_rates["heavily_compressed_attention"]`` tokens. (The compressor's partial window,
  under ``compress_rate`` tokens, is left out: a few KiB.)
* **Sliding-window families** (``mimo_v2_flash``, ``laguna``, ``muse_glimmer``,
  ``gemma4_unified``): K and V per token on every layer that owns a cache (gemma4_unified's
  last ``num_kv_shared_layers`` reuse earlier layers' and hold none), each layer type with its
  own heads and head sizes (MiMo's sliding layers: twice the KV heads); ``KVGroup.sliding``
  records a sliding layer's window. As for
  gemma-4 (``family_shapes._gemma4``) the bytes count those layers for the whole context:
  TensorRT-LLM allocates that unless ``kv_cache_config.max_attention_window`` lists per-layer
  windows; ``TargetShape.cache_bytes(..., windowed=True)`` gives the windowed figure the
  reference runtime keeps.
"""

from __future__ import annotations

from dflash_trt.plan.family_shapes import Counts, KVGroup, _mla, _moe

DSA = ("deepseek_v32", "glm_moe_dsa")
V4 = ("deepseek_v4",)
SLIDING = ("mimo_v2_flash", "laguna", "muse_glimmer", "muse_glimmer_text", "gemma4_unified", "gemma4_unified_text")
FAMILIES = DSA + V4 + SLIDING

REQUIRED = {
    "dsa": (
        "kv_lora_rank",
        "qk_nope_head_dim",
        "qk_rope_head_dim",
        "v_head_dim",
        "intermediate_size",
        "moe_intermediate_size",
        "n_routed_experts",
        "num_experts_per_tok",
        "index_head_dim",
        "index_n_heads",
        "index_topk",
    ),
    "v4": (
        "head_dim",
        "q_lora_rank",
        "moe_intermediate_size",
        "n_routed_experts",
        "num_experts_per_tok",
        "o_groups",
        "o_lora_rank",
        "index_head_dim",
        "index_n_heads",
    ),
    "sliding": ("num_key_value_heads", "head_dim", "intermediate_size"),
}


def sparse_required(mt: str) -> tuple[str, ...]:
    return REQUIRED["dsa" if mt in DSA else "v4" if mt in V4 else "sliding"]


def sparse_counts(cfg: dict) -> Counts:
    mt = str(cfg.get("model_type", ""))
    if mt in DSA:
        return _dsa(cfg)
    if mt in V4:
        return _v4(cfg)
    return _sliding(cfg)


def _dsa(cfg: dict) -> Counts:
    """DeepSeek-V3.2 / GLM-5: MLA + MoE as DeepSeek-V3, plus an indexer per full-indexer layer."""
    c = _mla(cfg)
    H, L, nh = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"]
    ni, di, qr = cfg["index_n_heads"], cfg["index_head_dim"], cfg.get("q_lora_rank") or H
    n_idx = sum(1 for t in (cfg.get("indexer_types") or ["full"] * L) if t == "full")
    c.add(n_idx * (qr * ni * di + H * di + H * ni), n_idx * 2 * di, 3 * n_idx)  # wq_b, wk, weights_proj; k_norm
    latent = c.kv[0]
    c.kv = (
        KVGroup(n_idx, 1, di, split=False, flop_dims=-(-ni * di // nh)),  # last: the latent (TargetShape)
        KVGroup(L, 1, latent.dims, split=False, flop_dims=latent.flop_dims, attend=cfg["index_topk"]),
    )
    return c


def _v4(cfg: dict) -> Counts:
    """DeepSeek V4: shared-KV MQA over a window plus CSA / HCA compressed entries, MoE with a
    shared expert (hash-routed first layers count the same), grouped output projection."""
    H, L, nh, hd = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["head_dim"]
    qr, g, olr = cfg["q_lora_rank"], cfg["o_groups"], cfg["o_lora_rank"]
    ni, di = cfg["index_n_heads"], cfg["index_head_dim"]
    types = list(cfg.get("layer_types") or [])
    n_csa, n_hca = types.count("compressed_sparse_attention"), types.count("heavily_compressed_attention")
    rates = {"compressed_sparse_attention": 4, "heavily_compressed_attention": 128, **(cfg.get("compress_rates") or {})}
    c = Counts()
    attn = H * qr + qr * nh * hd + H * hd + nh * hd * olr + g * olr * H
    c.add(L * attn, L * (qr + hd + nh), 5 * L)
    c.add(
        n_csa * (4 * H * hd + 4 * H * di + qr * ni * di + H * ni),
        n_csa * (2 * rates["compressed_sparse_attention"] * (hd + di)),
        5 * n_csa,
    )
    c.add(n_hca * 2 * H * hd, n_hca * rates["heavily_compressed_attention"] * hd, 2 * n_hca)
    moe_i = cfg["moe_intermediate_size"]
    _moe(
        c,
        cfg,
        H,
        cfg["n_routed_experts"],
        cfg["num_experts_per_tok"],
        moe_i,
        int(cfg.get("n_shared_experts") or 1) * moe_i,
        L,
    )
    c.other += L * 2 * H
    sw = int(cfg.get("sliding_window") or 128)
    r_csa, r_hca = rates["compressed_sparse_attention"], rates["heavily_compressed_attention"]
    c.kv = (
        KVGroup(L, 1, hd, window=sw, split=False, flop_dims=2 * hd),
        KVGroup(n_csa, 1, di, stride=r_csa, split=False, flop_dims=-(-ni * di // nh)),
        KVGroup(n_hca, 1, hd, stride=r_hca, split=False, flop_dims=2 * hd),
        KVGroup(n_csa, 1, hd, stride=r_csa, split=False, flop_dims=2 * hd, attend=int(cfg.get("index_topk") or 0)),
    )
    return c


def _sliding(cfg: dict) -> Counts:
    """GQA layers of two kinds (sliding, full), each with its own KV heads and head sizes."""
    H, L, nh = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"]
    mt = str(cfg.get("model_type", "")).removesuffix("_text")
    types = list(cfg.get("layer_types") or ["full_attention"] * L)
    hd, nkv = cfg["head_dim"], cfg["num_key_value_heads"]
    sl_kv = 2 * nkv if mt == "mimo_v2_flash" else nkv  # MiMo's sliding layers have twice the KV heads
    vd = cfg.get("v_head_dim") or hd
    over: dict = next(iter((cfg.get("per_layer_config") or {}).values()), {})  # a saved config's full-layer override
    full_hd = (cfg.get("global_head_dim") or over.get("head_dim") or hd) if mt == "gemma4_unified" else hd
    full_kv = (
        cfg.get("num_global_key_value_heads") or over.get("num_key_value_heads") or nkv
        if mt == "gemma4_unified"
        else nkv
    )
    k_eq_v = mt == "gemma4_unified" and bool(cfg.get("attention_k_eq_v"))
    owners = L - int(cfg.get("num_kv_shared_layers") or 0)  # the rest reuse an earlier layer's cache
    n_sl = types[:owners].count("sliding_attention")
    n_full = owners - n_sl
    c = Counts()
    heads = cfg.get("num_attention_heads_per_layer") or [nh] * L
    for t, h in zip(types, heads, strict=False):
        d = hd if t == "sliding_attention" else full_hd
        kv = sl_kv if t == "sliding_attention" else full_kv
        c.add(H * h * d + H * kv * (d + (0 if k_eq_v and t != "sliding_attention" else vd)) + h * vd * H, 2 * d, 4)
    E = cfg.get("n_routed_experts") or cfg.get("num_experts") or 0
    if E:
        dense = sum(1 for t in (cfg.get("mlp_layer_types") or ["sparse"] * L) if t == "dense")
        c.add(dense * 3 * H * cfg["intermediate_size"], 0, 3 * dense)
        shared = cfg.get("shared_expert_intermediate_size") or 0
        _moe(c, cfg, H, E, cfg["num_experts_per_tok"], cfg["moe_intermediate_size"], shared, L - dense)
    else:
        c.add(L * 3 * H * cfg["intermediate_size"], 0, 3 * L)
        c.intermediate = cfg["intermediate_size"]
    c.other += L * 2 * H
    window = int(cfg.get("sliding_window") or 0)
    full_v = full_hd if mt == "gemma4_unified" else vd  # K = V still caches both (as gemma-4)
    c.kv = (KVGroup(n_sl, sl_kv, hd + vd, sliding=window), KVGroup(n_full, full_kv, full_hd + full_v))
    return c
