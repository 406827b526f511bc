"""The drafter's training forward: all K blocks of a batch in one dense masked attention, through
the drafter's own submodules (``Drafter.block_forward``, the one forward the runtime and the ONNX
export also run).

Invariant: :func:`train_forward` computes, for each block, exactly what ``Drafter.inject``
followed by ``Drafter.draft`` compute at inference for the same prefix (``tests/train/test_train.py``
holds it to that). :func:`training_visibility` is the mask that makes it so: block k sees the
target context strictly before its anchor and itself, never another block; context K/V come from
``k_proj`` / ``v_proj`` of ``hidden_norm(fc(target_hidden))`` with RoPE at the context tokens'
absolute positions.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dflash_trt import plugins
from dflash_trt.model import Drafter


def training_visibility(
    anchors: torch.Tensor, T: int, B: int, *, causal: bool = False, window: int | None = None
) -> torch.Tensor:
    """Boolean [b, K*B, T + K*B]: which keys each block query sees.

    Keys are the T context positions, then the K blocks' B positions each. Block k's
    query t (absolute position ``a_k + t``) sees context j iff ``j < a_k``, and block
    key (k', t') iff ``k' == k`` (and ``t' <= t`` when causal). A window hides keys at
    distance >= window, as at inference.
    """
    b, K = anchors.shape
    dev = anchors.device
    t = torch.arange(B, device=dev)
    q_pos = (anchors[:, :, None] + t).reshape(b, K * B)  # [b, KB]
    ctx = torch.arange(T, device=dev)
    sees_ctx = ctx[None, None, :] < anchors.repeat_interleave(B, dim=1)[:, :, None]  # [b, KB, T]
    blk = torch.arange(K, device=dev).repeat_interleave(B)  # block id per query/key
    tt = t.repeat(K)
    same = blk[:, None] == blk[None, :]
    if causal:
        same = same & (tt[None, :] <= tt[:, None])
    sees_blk = same[None].expand(b, -1, -1)
    vis = torch.cat([sees_ctx, sees_blk], dim=2)
    if window is not None:
        k_pos = torch.cat([ctx[None].expand(b, -1), q_pos], dim=1)
        vis = vis & ((q_pos[:, :, None] - k_pos[:, None, :]).abs() < window)
    return vis


def train_forward(
    drafter: Drafter, target_hidden: torch.Tensor, block_embeds: torch.Tensor, anchors: torch.Tensor
) -> torch.Tensor:
    """Normed drafter hidden states [b, K, B, H] for K blocks per sequence, in one forward.

    target_hidden: [b, T, n_tap*H] the target's tapped hidden states of the whole sequence;
    block_embeds: [b, K, B, H] target embeddings of ``[x[a_k], MASK ...]``;
    anchors: [b, K] anchor positions (each >= 1, so every block has context).
    """
    cfg = drafter.cfg
    b, T, _ = target_hidden.shape
    _, K, B, H = block_embeds.shape
    nh, kvh, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    dev, dtype = block_embeds.device, block_embeds.dtype
    q_pos = (anchors[:, :, None] + torch.arange(B, device=dev)).reshape(b, K * B)
    cos_c, sin_c = drafter.rope(torch.arange(T, device=dev).expand(b, T), dtype)
    ctx = drafter.hidden_norm(drafter.fc(target_hidden))  # [b, T, H]
    masks = {}

    def attend(i, q, k, v):
        """Dense attention of all K*B block queries over [context ++ all blocks], masked so
        each block sees only context before its anchor and itself (``block_visibility``)."""
        key = (cfg.layer_causal(i), cfg.layer_window(i))
        if key not in masks:
            masks[key] = training_visibility(anchors, T, B, causal=key[0], window=key[1])[:, None]
        attn = drafter.layers[i].self_attn
        kc = plugins.apply_rope(attn.k_norm(attn.k_proj(ctx).view(b, T, kvh, hd)), cos_c, sin_c)
        vc = attn.v_proj(ctx).view(b, T, kvh, hd)
        keys = torch.cat([kc, k], 1).transpose(1, 2)  # [b, kvh, T + KB, d]
        vals = torch.cat([vc, v], 1).transpose(1, 2)
        o = F.scaled_dot_product_attention(
            q.transpose(1, 2), keys, vals, attn_mask=masks[key], scale=hd**-0.5, enable_gqa=nh != kvh
        )
        return o.transpose(1, 2)

    x = drafter.block_forward(block_embeds.reshape(b, K * B, H), q_pos, attend, block_len=B)  # DFlash2: per block
    return x.view(b, K, B, H)
