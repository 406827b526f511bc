"""Tiny random targets of every family the published DFlash drafters pair with.

Each is a few hundred kB, float64 (argmax ties cannot flake), built from the transformers 5
config class of its family with the traits that matter for speculative decoding kept:
Gated DeltaNet linear-attention layers (qwen3_5, qwen3_5_moe, qwen3_next), sliding windows
far shorter than a generation (gemma4, gpt_oss: window 6, so rounds cross it), global
layers with their own head size and K=V (gemma4), MLA (deepseek_v3, kimi_k25), MoE
routing (qwen3_5_moe, qwen3_next, deepseek_v3, minimax_m2, gpt_oss), final-logit
softcapping (gemma4) and VLM wrappers served text-only (qwen3_5, gemma4, kimi_k25).
"""

from __future__ import annotations

import torch

from tests.helpers import VOCAB

H = 64
WINDOW = 6  # sliding window of the tiny sliding-window targets: shorter than any test's output

FAMILIES = [
    "qwen3",
    "llama",
    "qwen3_moe",
    "qwen3_5",
    "qwen3_5_moe",
    "qwen3_next",
    "gemma4",
    "deepseek_v3",
    "kimi_k25",
    "minimax_m2",
    "gpt_oss",
]
HYBRID = ["qwen3_5", "qwen3_5_moe", "qwen3_next"]
HYBRID_2 = ["nemotron_h", "kimi_linear"]  # Mamba2 + attention + MoE; KDA + MLA + MoE
GLM5_NEXT = "glm5_next"  # KDA-like + position-free MLA with a pooled sparse indexer (a VLM wrapper)
GLM5_NEXT_SHARED = "glm5_next_shared"  # the same with a layer reusing the previous layer's top-k
SLIDING = ["gemma4", "gpt_oss"]
VLM = ["qwen3_5_vlm", "gemma4_vlm", "kimi_k25"]

_COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=H,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    tie_word_embeddings=False,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)
_LINEAR = dict(
    linear_conv_kernel_dim=4,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    head_dim=16,
    layer_types=["linear_attention", "full_attention", "linear_attention", "linear_attention"],
)
_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
_MLA = dict(
    q_lora_rank=32,
    kv_lora_rank=16,
    qk_nope_head_dim=8,
    qk_rope_head_dim=8,
    v_head_dim=16,
    n_routed_experts=4,
    n_shared_experts=1,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    first_k_dense_replace=1,
    n_group=1,
    topk_group=1,
    intermediate_size=2 * H,
    num_key_value_heads=4,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
)


def _text_config(family: str):
    """(model class, config) of the text model of ``family``."""
    import transformers as tf

    c = dict(_COMMON)
    if family in ("qwen3", "llama"):
        c.update(intermediate_size=2 * H, head_dim=16)
        cls = {"qwen3": (tf.Qwen3ForCausalLM, tf.Qwen3Config), "llama": (tf.LlamaForCausalLM, tf.LlamaConfig)}[family]
        return cls[0], cls[1](**c)
    if family == "qwen3_moe":  # Qwen3-Coder-30B-A3B, Qwen3-30B-A3B: every layer sparse (decoder_sparse_step 1)
        return tf.Qwen3MoeForCausalLM, tf.Qwen3MoeConfig(
            **c, **_MOE, head_dim=16, intermediate_size=2 * H, decoder_sparse_step=1, norm_topk_prob=True
        )
    if family == "qwen3_5":
        return tf.Qwen3_5ForCausalLM, tf.Qwen3_5TextConfig(**c, **_LINEAR, intermediate_size=2 * H)
    if family == "qwen3_5_moe":
        return tf.Qwen3_5MoeForCausalLM, tf.Qwen3_5MoeTextConfig(
            **c, **_LINEAR, **_MOE, shared_expert_intermediate_size=32
        )
    if family == "qwen3_next":
        return tf.Qwen3NextForCausalLM, tf.Qwen3NextConfig(
            **c, **_LINEAR, **_MOE, shared_expert_intermediate_size=32, intermediate_size=2 * H
        )
    if family == "gemma4":
        c.update(num_hidden_layers=6, pad_token_id=0)
        return tf.Gemma4ForCausalLM, tf.Gemma4TextConfig(
            **c,
            intermediate_size=2 * H,
            head_dim=16,
            global_head_dim=32,
            num_global_key_value_heads=1,
            attention_k_eq_v=True,
            sliding_window=WINDOW,
            final_logit_softcapping=30.0,
            hidden_size_per_layer_input=0,
            vocab_size_per_layer_input=VOCAB,
            layer_types=["sliding_attention"] * 2 + ["full_attention"] + ["sliding_attention"] * 2 + ["full_attention"],
        )
    if family in ("deepseek_v3", "kimi_k25"):
        c.update(_MLA)
        return tf.DeepseekV3ForCausalLM, tf.DeepseekV3Config(**c)
    if family == "minimax_m2":
        return tf.MiniMaxM2ForCausalLM, tf.MiniMaxM2Config(
            **c, intermediate_size=32, head_dim=16, num_local_experts=4, num_experts_per_tok=2, rotary_dim=8
        )
    if family == "gpt_oss":
        return tf.GptOssForCausalLM, tf.GptOssConfig(
            **c,
            intermediate_size=32,
            head_dim=16,
            num_local_experts=4,
            num_experts_per_tok=2,
            sliding_window=WINDOW,
            layer_types=["sliding_attention", "full_attention"] * 2,
            rope_parameters={
                "rope_type": "yarn",
                "rope_theta": 150000.0,
                "factor": 4.0,
                "original_max_position_embeddings": 128,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
            },
        )
    if family in HYBRID_2:
        return _hybrid_2(family, c)
    raise ValueError(family)


def _hybrid_2(family: str, c: dict):
    """nemotron_h (Mamba2 mixers, GQA attention, MoE and relu2 MLP layers; chunk 8 so a
    prompt spans chunks) and kimi_linear (KDA mixers with per-channel decay, MLA, MoE)."""
    import transformers as tf

    if family == "nemotron_h":
        c.update(num_hidden_layers=5, head_dim=16, intermediate_size=2 * H)
        return tf.NemotronHForCausalLM, tf.NemotronHConfig(
            **c,
            layers_block_type=["mamba", "attention", "mamba", "moe", "mamba"],
            ssm_state_size=8,
            mamba_num_heads=4,
            mamba_head_dim=16,
            n_groups=2,
            conv_kernel=4,
            chunk_size=8,
            n_routed_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            moe_shared_expert_intermediate_size=32,
        )
    c.update(_MLA, num_hidden_layers=4)
    for k in ("n_routed_experts", "first_k_dense_replace", "rope_parameters"):
        c.pop(k)
    return tf.KimiLinearForCausalLM, tf.KimiLinearConfig(
        **c,
        num_local_experts=4,
        linear_head_dim=16,
        linear_num_heads=4,
        linear_conv_kernel_dim=4,
        layer_types=["linear_attention", "full_attention", "linear_attention", "linear_attention"],
        mlp_layer_types=["dense", "sparse", "sparse", "sparse"],
    )


def _vlm(family: str):
    """(model class, config) of a tiny VLM (``...ForConditionalGeneration``) around the text model of ``family``."""
    import transformers as tf

    if family == "qwen3_5_vlm":
        _, text = _text_config("qwen3_5")
        vision = dict(
            depth=1,
            hidden_size=16,
            intermediate_size=32,
            num_heads=2,
            out_hidden_size=H,
            patch_size=2,
            temporal_patch_size=1,
            num_position_embeddings=16,
        )
        return tf.Qwen3_5ForConditionalGeneration, tf.Qwen3_5Config(
            text_config=text.to_dict(),
            vision_config=vision,
            image_token_id=VOCAB - 2,
            video_token_id=VOCAB - 3,
            vision_start_token_id=VOCAB - 4,
            vision_end_token_id=VOCAB - 5,
        )
    if family == "gemma4_vlm":
        _, text = _text_config("gemma4")
        vision = dict(
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=2,
            head_dim=8,
            patch_size=2,
        )
        return tf.Gemma4ForConditionalGeneration, tf.Gemma4Config(
            text_config=text.to_dict(),
            vision_config=vision,
            audio_config=None,
            tie_word_embeddings=False,
            image_token_id=VOCAB - 2,
            boi_token_id=VOCAB - 3,
            eoi_token_id=VOCAB - 4,
        )
    if family == "kimi_k25":
        _, text = _text_config("kimi_k25")
        vision = dict(
            num_hidden_layers=1,
            hidden_size=16,
            intermediate_size=32,
            num_attention_heads=2,
            patch_size=2,
            pos_emb_height=4,
            pos_emb_width=4,
            pos_emb_time=1,
        )
        return tf.Kimi_K25ForConditionalGeneration, tf.Kimi_K25Config(
            text_config=text.to_dict(),
            vision_config=vision,
            tie_word_embeddings=False,
            projection_hidden_size=16,
            image_token_id=VOCAB - 2,
            video_token_id=VOCAB - 3,
        )
    raise ValueError(family)


def _glm5_next(shared: bool = False):
    """glm5_next: linear layers, MLA without RoPE dims (``head_dim: 0``), a sparse indexer that
    keeps 4 pools of 2 tokens (so short contexts already drop positions; 8 indexer heads, so pool
    scores do not tie at the ReLU's zero, see test_second_wave.py), 2 hyper-connection
    streams; only ``Glm5NextForConditionalGeneration`` exists, so a tiny vision tower too.
    ``shared``: two indexed layers in a row, the second reusing the first's top-k (``indexer_types``
    "shared", GLM-5.3's cross-layer sharing)."""
    from transformers.models.glm5_next import configuration_glm5_next as cf
    from transformers.models.glm5_next import modeling_glm5_next as md

    text = cf.Glm5NextTextConfig(
        vocab_size=VOCAB,
        hidden_size=H,
        intermediate_size=2 * H,
        moe_intermediate_size=32,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        n_shared_experts=1,
        n_routed_experts=4,
        kv_lora_rank=16,
        q_lora_rank=32,
        qk_rope_head_dim=0,
        v_head_dim=16,
        qk_nope_head_dim=16,
        num_experts_per_tok=2,
        max_position_embeddings=512,
        index_topk=8,
        index_head_dim=16,
        index_n_heads=8,
        head_dim=0,
        layer_types=(
            ["linear_attention", "indexed_attention", "indexed_attention", "linear_attention"]
            if shared
            else ["linear_attention", "indexed_attention"] * 2
        ),
        mlp_layer_types=["dense"] + ["sparse"] * 3,
        indexer_types=["full", "full", "shared", "full"] if shared else ["full"] * 4,
        linear_head_dim=16,
        linear_num_heads=4,
        hc_mult=2,
        index_kpool=2,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    vision = dict(
        depth=1,
        hidden_size=16,
        num_heads=2,
        patch_size=2,
        temporal_patch_size=1,
        out_hidden_size=H,
        intermediate_size=32,
        projection_intermediate_size=32,
        image_size=8,
    )
    ids = {
        k: VOCAB - 2 - i
        for i, k in enumerate(
            (
                "image_token_id",
                "video_token_id",
                "image_start_token_id",
                "image_end_token_id",
                "video_start_token_id",
                "video_end_token_id",
            )
        )
    }
    return md.Glm5NextForConditionalGeneration, cf.Glm5NextConfig(
        text_config=text.to_dict(), vision_config=vision, **ids
    )


def random_model(cls, cfg):
    """``cls(cfg)`` with its matrices drawn wide enough that greedy text varies (the default init
    makes tiny models repeat one token); experts run eagerly (grouped_mm has no float64)."""
    for c in {id(cfg): cfg, id(cfg.get_text_config()): cfg.get_text_config()}.values():
        c._experts_implementation = "eager"
    model = cls(cfg)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.2)
    return model


def family_target(family: str, seed: int = 0, dtype=torch.float64):
    """A random tiny target of ``family`` (see FAMILIES and VLM): :func:`random_model`."""
    torch.manual_seed(seed)
    if family.startswith(GLM5_NEXT):
        cls, cfg = _glm5_next(family == GLM5_NEXT_SHARED)
    else:
        cls, cfg = _vlm(family) if family in VLM else _text_config(family)
    return random_model(cls, cfg).to(dtype).eval()


def family_drafter_config(model, block_size: int = 8, layers: int = 2, **kw):
    """A tiny drafter config for ``model`` of any family: its own heads (as the published
    drafters have: the gemma-4 drafter is 32x128 over a 16x256 / 16x512 target), taps on
    three target layers."""
    from dflash_trt.model import DrafterConfig, flatten_rope

    text = model.config.get_text_config(decoder=True)
    n = text.num_hidden_layers
    theta, scaling = flatten_rope(text.to_dict())  # the target's RoPE where it has one (not gemma4's)
    args = dict(
        hidden_size=text.hidden_size,
        intermediate_size=2 * text.hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=text.vocab_size,
        block_size=block_size,
        mask_token_id=text.vocab_size - 1,
        target_layer_ids=sorted({0, n // 2, n - 2}),
        num_target_layers=n,
        rope_theta=theta or 10000.0,
        rope_scaling=scaling,
        max_position_embeddings=512,
    )
    args.update(kw)
    return DrafterConfig(**args)


def family_drafter(model, seed: int = 1, **kw):
    """A random tiny drafter for ``model``: mostly rejected."""
    from dflash_trt.model import Drafter

    torch.manual_seed(seed)
    d = Drafter(family_drafter_config(model, **kw))
    for p in d.parameters():
        if p.dim() > 1:
            torch.nn.init.normal_(p, std=0.2)
    return d.to(next(model.parameters()).dtype).eval()
