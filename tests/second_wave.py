"""Tiny random targets of the second-wave families (transformers >= 5.24), beside tests/families.py.

Each keeps the trait that matters for speculative decoding: DeepSeek sparse attention (an
indexer with its own key cache choosing ``index_topk`` keys per query over an MLA latent cache:
deepseek_v32, glm_moe_dsa with a "shared" layer reusing the previous layer's choice), DeepSeek V4
(sliding windows plus compressors whose running state absorbs every token, a Lightning indexer
over the compressed entries, hash routing through an integer ``tid2eid`` table, hyper-connections),
sliding windows far shorter than a generation (mimo_v2_flash, laguna, muse_glimmer,
gemma4_unified: window 6), per-layer head counts (laguna), NoPE full layers and logit
softcapping (muse_glimmer, a VLM served text-only), KV shared across layers (gemma4_unified).
``index_topk`` is 4, below every context the tests reach, so the indexers really choose.
"""

from __future__ import annotations

import torch

from tests.families import _COMMON, WINDOW, H, random_model
from tests.helpers import VOCAB

SPARSE = ["deepseek_v32", "glm_moe_dsa", "deepseek_v4"]
SLIDING = ["mimo_v2_flash", "laguna", "muse_glimmer", "gemma4_unified"]
FAMILIES = SPARSE + SLIDING
TEXT_ONLY = ["gemma4_unified_text"]  # gemma4_unified's text model alone (the family case is its VLM)
TOPK = 4  # index_topk of the tiny sparse targets

_DSA = dict(
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
    index_topk=TOPK,
    index_head_dim=16,
    index_n_heads=8,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
)


def _config(family: str):
    """(model class, config) of ``family``'s tiny target."""
    import transformers as tf

    c = dict(_COMMON)
    if family == "deepseek_v32":
        return tf.DeepseekV32ForCausalLM, tf.DeepseekV32Config(**{**c, **_DSA})
    if family == "glm_moe_dsa":
        return tf.GlmMoeDsaForCausalLM, tf.GlmMoeDsaConfig(**{**c, **_DSA}, indexer_types=["full", "shared"] * 2)
    if family == "deepseek_v4":
        c.update(
            num_key_value_heads=1,
            head_dim=16,
            q_lora_rank=32,
            moe_intermediate_size=32,
            n_routed_experts=4,
            num_experts_per_tok=2,
            o_groups=2,
            o_lora_rank=16,
            hc_mult=2,
            hc_sinkhorn_iters=3,
            sliding_window=WINDOW,
            index_n_heads=8,
            index_head_dim=16,
            index_topk=TOPK,
            compress_rates={"compressed_sparse_attention": 2, "heavily_compressed_attention": 4},
            partial_rotary_factor=0.5,
            layer_types=[
                "sliding_attention",
                "compressed_sparse_attention",
                "heavily_compressed_attention",
                "compressed_sparse_attention",
            ],
            mlp_layer_types=["hash_moe", "moe", "moe", "moe"],
        )
        return tf.DeepseekV4ForCausalLM, tf.DeepseekV4Config(**c)
    if family == "mimo_v2_flash":
        c.update(
            head_dim=16,
            v_head_dim=8,
            sliding_window=WINDOW,
            n_routed_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            intermediate_size=2 * H,
            layer_types=["full_attention", "sliding_attention", "sliding_attention", "full_attention"],
        )
        return tf.MiMoV2FlashForCausalLM, tf.MiMoV2FlashConfig(**c)
    if family == "laguna":
        c.update(
            head_dim=16,
            sliding_window=WINDOW,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=32,
            intermediate_size=2 * H,
            num_attention_heads_per_layer=[4, 2, 4, 2],
            layer_types=["full_attention", "sliding_attention", "sliding_attention", "full_attention"],
        )
        return tf.LagunaForCausalLM, tf.LagunaConfig(**c)
    if family == "muse_glimmer":
        text = tf.MuseGlimmerTextConfig(
            **{
                **c,
                "head_dim": 16,
                "intermediate_size": 2 * H,
                "sliding_window": WINDOW,
                "final_logit_softcapping": 20.0,
            }
        )
        vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, patch_size=2)
        return tf.MuseGlimmerForConditionalGeneration, tf.MuseGlimmerConfig(
            text_config=text.to_dict(),
            vision_config=vision,
            out_hidden_size=16,
            projector_hidden_size=16,
            image_token_id=VOCAB - 2,
            video_token_id=VOCAB - 3,
        )
    if family == "gemma4_unified":  # the published target: the VLM, served text-only
        _, text = _config("gemma4_unified_text")
        ids = {
            k: VOCAB - i
            for i, k in enumerate(
                (
                    "image_token_id",
                    "boi_token_id",
                    "eoi_token_id",
                    "video_token_id",
                    "boa_token_id",
                    "eoa_token_index",
                    "audio_token_id",
                ),
                start=2,
            )
        }
        vision = dict(patch_size=2, mm_embed_dim=16, mm_posemb_size=16, output_proj_dims=16)
        return tf.Gemma4UnifiedForConditionalGeneration, tf.Gemma4UnifiedConfig(
            text_config=text.to_dict(), vision_config=vision, audio_config=None, tie_word_embeddings=False, **ids
        )
    if family == "gemma4_unified_text":
        c.update(
            num_hidden_layers=6,
            head_dim=16,
            intermediate_size=2 * H,
            sliding_window=WINDOW,
            global_head_dim=32,
            num_global_key_value_heads=1,
            attention_k_eq_v=True,
            num_kv_shared_layers=2,
            final_logit_softcapping=30.0,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 2,
        )
        return tf.Gemma4UnifiedForCausalLM, tf.Gemma4UnifiedTextConfig(**c)
    raise ValueError(family)


def second_wave_target(family: str, seed: int = 0, dtype=torch.float64):
    """A random tiny target of ``family`` (weights drawn wide, as tests/families.py does)."""
    torch.manual_seed(seed)
    cls, cfg = _config(family)
    model = random_model(cls, cfg)
    with torch.no_grad():
        for name, buf in model.named_buffers():
            if name.endswith("tid2eid"):  # hash routing: a fixed random token -> experts table
                g = torch.Generator().manual_seed(seed)
                n_exp = cfg.get_text_config().n_routed_experts
                buf.copy_(
                    torch.stack([torch.randperm(n_exp, generator=g)[: buf.shape[1]] for _ in range(buf.shape[0])])
                )
    return model.to(dtype).eval()
