"""Parameter counts and per-sequence state of the second-wave hybrid targets.

* ``nemotron_h`` (Nemotron-H / Nemotron-3.5): Mamba2 mixers, GQA attention, relu2 MLP and MoE
  layers, one kind per layer (``layers_block_type`` or ``hybrid_override_pattern``: M, *, -, E).
  A Mamba2 layer holds a conv state (``K - 1`` past inputs of ``I + 2 G N`` channels, I =
  heads x head_dim) and an SSM state (``heads x head_dim x N``, in ``mamba_ssm_cache_dtype``).
* ``kimi_linear`` (Kimi-Linear, Kimi-K3): KDA layers (conv state of ``3 x heads x d`` channels,
  recurrent state ``heads x d x d``, float32) and MLA layers (one latent of ``kv_lora_rank +
  qk_rope_head_dim`` per token, replicated across ranks).
* ``glm5_next`` (GLM-5.3-Flash): KDA-like linear layers and MLA layers without RoPE dims, each
  with a sparse indexer that caches, per token, its key, its pool gate score and a valid flag
  (``2 x index_head_dim + 1``); ``hc_mult`` hyper-connection streams hold no cache.

States do not grow with the context; ``StateGroup`` splits them across ranks by heads.
Counts are approximate (+- a few %) for the weights, exact for the caches. ``family_shapes``
calls :func:`counts` with its own ``Counts`` / ``KVGroup`` / ``StateGroup`` classes (passed in,
so the two modules do not import each other).
"""

from __future__ import annotations

from dflash_trt.errors import CheckpointError

FAMILIES = ("nemotron_h", "kimi_linear", "glm5_next", "glm5_next_text")
REQUIRED = {
    "nemotron_h": (
        "num_key_value_heads",
        "head_dim",
        "mamba_num_heads",
        "mamba_head_dim",
        "ssm_state_size",
        "n_groups",
        "intermediate_size",
    ),
    "kimi_linear": (
        "kv_lora_rank",
        "qk_nope_head_dim",
        "qk_rope_head_dim",
        "v_head_dim",
        "linear_num_heads",
        "linear_head_dim",
        "moe_intermediate_size",
        "layer_types",
    ),
    "glm5_next": (
        "kv_lora_rank",
        "qk_nope_head_dim",
        "v_head_dim",
        "linear_num_heads",
        "linear_head_dim",
        "index_head_dim",
        "moe_intermediate_size",
        "layer_types",
    ),
}
_KIND = {
    "M": "mamba",
    "mamba": "mamba",
    "linear_attention": "mamba",
    "*": "attention",
    "attention": "attention",
    "full_attention": "attention",
    "-": "mlp",
    "mlp": "mlp",
    "E": "moe",
    "moe": "moe",
}


def hybrid_required(mt: str) -> tuple[str, ...]:
    return REQUIRED["glm5_next" if mt.startswith("glm5_next") else mt]


def hybrid_counts(cfg: dict, Counts, KVGroup, StateGroup):
    """``family_shapes.Counts`` of a second-wave hybrid (the three classes are family_shapes')."""
    mt = str(cfg.get("model_type", ""))
    if mt == "nemotron_h":
        return _nemotron_h(cfg, Counts(), KVGroup, StateGroup)
    return _kda_mla(cfg, mt.startswith("glm5_next"), Counts(), KVGroup, StateGroup)


def _ssm_bytes(cfg: dict, key: str) -> int:
    return 4 if str(cfg.get(key) or "float32") == "float32" else 2


def _nemotron_h(cfg: dict, c, KVGroup, StateGroup):
    H = cfg["hidden_size"]
    pattern = cfg.get("layers_block_type") or list(cfg.get("hybrid_override_pattern") or "")
    kinds = [_KIND[k] for k in pattern]
    n = {k: kinds.count(k) for k in ("mamba", "attention", "mlp", "moe")}
    nh, hd, N, G = cfg["mamba_num_heads"], cfg["mamba_head_dim"], cfg["ssm_state_size"], cfg["n_groups"]
    K, inner = cfg.get("conv_kernel", 4), nh * hd
    conv_dim = inner + 2 * G * N
    c.add(
        n["mamba"] * (H * (inner + conv_dim + nh) + inner * H),
        n["mamba"] * (conv_dim * (K + 1) + 3 * nh + inner),
        2 * n["mamba"],
    )
    na, nkv, ahd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    c.add(n["attention"] * (2 * H * na * ahd + 2 * H * nkv * ahd), 0, 4 * n["attention"])
    mlp_i = cfg["intermediate_size"]
    c.add(n["mlp"] * 2 * H * mlp_i, 0, 2 * n["mlp"])  # relu2: up and down, no gate
    if n["moe"]:
        E, k, mi = cfg["n_routed_experts"], cfg["num_experts_per_tok"], cfg["moe_intermediate_size"]
        si = cfg.get("moe_shared_expert_intermediate_size") or 0
        per, shared = 2 * H * mi, 2 * H * si
        c.add(
            n["moe"] * (E * per + shared),
            n["moe"] * (H * E + E),
            n["moe"] * (2 * E + 2),
            active=n["moe"] * (k * per + shared),
        )
        c.experts, c.experts_per_token, c.expert_params = E, k, n["moe"] * E * per
        c.intermediate = k * mi + si
    else:
        c.intermediate = mlp_i
    c.other += len(kinds) * H
    c.kv = (KVGroup(n["attention"], nkv, 2 * ahd),)
    c.states = (
        StateGroup(
            n["mamba"], nh, conv_dim * (K - 1), nh * hd * N, recurrent_bytes=_ssm_bytes(cfg, "mamba_ssm_cache_dtype")
        ),
    )
    return c


def _kda_mla(cfg: dict, glm: bool, c, KVGroup, StateGroup):
    H, nh, L = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_hidden_layers"]
    types = list(cfg["layer_types"])
    n_lin = types.count("linear_attention")
    n_att = L - n_lin
    lh, ld = cfg["linear_num_heads"], cfg["linear_head_dim"]
    K, qkv = cfg.get("linear_conv_kernel_dim", 4), cfg["linear_num_heads"] * cfg["linear_head_dim"]
    # q, k, v, o; forget gate and output gate (low rank H -> d -> qkv); beta
    c.add(n_lin * (4 * H * qkv + 2 * (H * ld + ld * qkv) + H * lh), n_lin * (3 * qkv * K + 2 * lh + ld), 9 * n_lin)
    qr, kvr = cfg.get("q_lora_rank"), cfg["kv_lora_rank"]
    nope, rope, v = cfg["qk_nope_head_dim"], cfg.get("qk_rope_head_dim") or 0, cfg["v_head_dim"]
    q = H * qr + qr * nh * (nope + rope) if qr else H * nh * (nope + rope)
    c.add(
        n_att * (q + H * (kvr + rope) + kvr * nh * (nope + v) + nh * v * H),
        n_att * (kvr + (qr or 0)),
        n_att * (5 if qr else 4),
    )
    kv = [KVGroup(n_att, 1, kvr + rope, split=False, flop_dims=nope + rope + v)]
    if glm:  # the sparse indexer of every attention layer: wq_b, wk, weights, pool gate
        ihd, ih = cfg["index_head_dim"], cfg.get("index_n_heads") or 32
        c.add(n_att * ((qr or H) * ih * ihd + H * ihd + H * ih), n_att * (2 * ihd + H * ihd), 3 * n_att)
        kv.append(KVGroup(n_att, 1, 2 * ihd + 1, split=False))
    mlp = list(cfg.get("mlp_layer_types") or ["sparse"] * L)
    n_dense, n_moe = mlp.count("dense"), mlp.count("sparse")
    c.add(n_dense * 3 * H * cfg["intermediate_size"], 0, 3 * n_dense)
    E = cfg.get("n_routed_experts") or cfg.get("num_experts") or cfg.get("num_local_experts")
    k = cfg.get("num_experts_per_tok") or cfg.get("num_experts_per_token")
    if not E or not k:
        raise CheckpointError(
            f"target config ({cfg.get('model_type')}) lacks its routed experts or experts per "
            "token (n_routed_experts, num_experts_per_tok); cannot plan"
        )
    mi = cfg["moe_intermediate_size"]
    shared = int(cfg.get("n_shared_experts") or cfg.get("num_shared_experts") or 0) * mi
    per = 3 * H * mi
    c.add(
        n_moe * (E * per + 3 * H * shared),
        n_moe * H * E,
        n_moe * (3 * E + 3),
        active=n_moe * (k * per + 3 * H * shared),
    )
    c.experts, c.experts_per_token, c.expert_params = E, k, n_moe * E * per
    c.intermediate = k * mi + shared
    c.other += L * 2 * H
    c.kv = tuple(reversed(kv))  # the last group is the one planning reads as "the" KV layout: the MLA latent
    c.states = (StateGroup(n_lin, lh, 3 * qkv * (K - 1), lh * ld * ld, recurrent_bytes=4),)
    return c
