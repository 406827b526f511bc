"""The DFlash2 drafter: the DFlash drafter plus dynamic convolutions and a candidate selector.

DFlash2 (z-lab's ``dflash`` package, ``dflash/model.py``: ``DFlash2DraftModel``,
``GroupedDynamicCausalConv``, ``CandidateSelector``; vLLM PR #52816) keeps the DFlash backbone
(``drafter.py``: context fusion, KV injection, one block forward) and adds, under the published
tensor names:

* ``layers.{i}.attention_conv`` / ``layers.{i}.mlp_conv`` (:class:`DynamicConv`):
  ``base_kernel`` [2, K, H] and ``kernel_projection.weight`` [2*K*G, H]. One projection of the
  sublayer's normed input predicts both dynamic kernels; the first convolves that input before
  the sublayer, the second the sublayer's output (``plugins.grouped_dynamic_conv``)::

      x = x + conv_out(attention(conv_in(norm(x))))      and the same around the MLP

* ``candidate_selector`` (:class:`CandidateSelector`): ``predecessor_codebook`` and
  ``successor_codebook`` [V, r] (stored without a ``.weight`` suffix, as published) and
  ``hidden_projection.weight`` [r, H]. :meth:`DFlash2Drafter.propose` walks the block over each
  position's top-k draft logits (``plugins.selector_walk``) instead of an argmax per position.

The family's traits and checkpoint hooks are ``family_dflash2.DFlash2Family``; ``family.drafter_for``
picks the class a config describes, so loaders never branch on the family.
"""

from __future__ import annotations

import torch
from torch import nn

from dflash_trt import plugins
from dflash_trt.model.config import DrafterConfig
from dflash_trt.model.drafter import Drafter
from dflash_trt.model.family import family_of
from dflash_trt.model.family_dflash2 import DFlash2Family


class DynamicConv(nn.Module):
    """The pair of grouped dynamic causal convolutions around one sublayer."""

    def __init__(self, hidden_size: int, kernel_size: int, group_size: int):
        super().__init__()
        self.kernel_size, self.group_size = kernel_size, group_size
        groups = hidden_size // group_size
        # Identity at init (tap 0 = 1): a fresh DFlash2 drafter computes what its DFlash backbone does.
        base = torch.zeros(2, kernel_size, hidden_size)
        base[:, 0] = 1.0
        self.base_kernel = nn.Parameter(base)
        self.kernel_projection = nn.Linear(hidden_size, 2 * kernel_size * groups, bias=False)
        nn.init.zeros_(self.kernel_projection.weight)

    def prepare(self, h: torch.Tensor, block_len: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """h [b, L, H] (the sublayer's normed input) -> (conv_in(h) [b, L, H], the output side's
        dynamic kernel [b, L, K, G])."""
        dyn = self.kernel_projection(h).view(*h.shape[:-1], 2, self.kernel_size, -1)  # [b, L, 2, K, G]
        out = plugins.grouped_dynamic_conv(h, dyn[:, :, 0], self.base_kernel[0], self.group_size, block_len)
        return out, dyn[:, :, 1]

    def finish(self, y: torch.Tensor, dyn: torch.Tensor, block_len: int | None = None) -> torch.Tensor:
        """conv_out of the sublayer's output y [b, L, H] with the kernel ``prepare`` predicted."""
        return plugins.grouped_dynamic_conv(y, dyn, self.base_kernel[1], self.group_size, block_len)


class CandidateSelector(nn.Module):
    """Low-rank scores of transitions between adjacent block positions' candidates."""

    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.top_k = cfg.selector_top_k
        self.predecessor_codebook = nn.Parameter(torch.zeros(cfg.vocab_size, cfg.selector_rank))
        self.successor_codebook = nn.Parameter(torch.zeros(cfg.vocab_size, cfg.selector_rank))
        self.hidden_projection = nn.Linear(cfg.hidden_size, cfg.selector_rank, bias=False)

    def candidates(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(unary [b, K, k] float32, candidates [b, K, k]): the top-k of draft logits [b, K, V]."""
        return torch.topk(logits.float(), self.top_k, dim=-1)

    def walk(
        self,
        hidden: torch.Tensor,
        unary: torch.Tensor,
        candidates: torch.Tensor,
        anchor: torch.Tensor,
        temperature: float = 0.0,
        uniforms: torch.Tensor | None = None,
    ):
        """``plugins.selector_walk`` with this selector's weights; hidden [b, K, H] normed."""
        return plugins.selector_walk(
            unary,
            candidates,
            self.hidden_projection(hidden),
            self.predecessor_codebook,
            self.successor_codebook,
            anchor,
            temperature,
            uniforms,
        )


class DFlash2Drafter(Drafter):
    """A DFlash drafter whose sublayers are wrapped in dynamic convolutions, with a selector."""

    def __init__(self, cfg: DrafterConfig):
        if not isinstance(family_of(cfg), DFlash2Family):
            raise ValueError("DFlash2Drafter needs a DFlash2 config (conv_kernel_size, selector_rank, ...)")
        super().__init__(cfg)
        for layer in self.layers:
            layer.attention_conv = DynamicConv(cfg.hidden_size, cfg.conv_kernel_size, cfg.conv_group_size)
            layer.mlp_conv = DynamicConv(cfg.hidden_size, cfg.conv_kernel_size, cfg.conv_group_size)
        self.candidate_selector = CandidateSelector(cfg)

    def block_forward(
        self, block_embeds: torch.Tensor, positions: torch.Tensor, attend, block_len: int | None = None
    ) -> torch.Tensor:
        """``Drafter.block_forward`` with every sublayer wrapped: conv_in before, conv_out after.
        The convolutions run along the block positions, never across ``block_len`` boundaries."""
        cos, sin = self.rope(positions, block_embeds.dtype)
        x = block_embeds
        for i, layer in enumerate(self.layers):
            h, dyn = layer.attention_conv.prepare(layer.input_layernorm(x), block_len)
            x = x + layer.attention_conv.finish(self.attention(i, h, cos, sin, attend), dyn, block_len)
            h, dyn = layer.mlp_conv.prepare(layer.post_attention_layernorm(x), block_len)
            x = x + layer.mlp_conv.finish(layer.mlp(h), dyn, block_len)
        return self.norm(x)

    @torch.no_grad()
    def propose(
        self,
        hidden: torch.Tensor,
        logits: torch.Tensor,
        anchor: torch.Tensor,
        temperature: float = 0.0,
        gen: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The selector's proposal for one block.

        hidden [b, K, H] the normed hidden states of block positions 1..K; logits [b, K, V] their
        draft logits (``Drafter.logits``); anchor [b] block position 0. Returns tokens [b, K] and,
        at temperature > 0, q [b, K, V] float32: the walk's distribution at each position, zero
        outside its candidates (what the verifier's rejection sampling must use).
        """
        sel = self.candidate_selector
        unary, cand = sel.candidates(logits)
        uniforms = None
        if temperature > 0:
            uniforms = torch.rand(cand.shape[:2], generator=gen, device=cand.device)
        tokens, q_k = sel.walk(hidden, unary, cand, anchor, temperature, uniforms)
        if q_k is None:
            return tokens, None
        return tokens, torch.zeros(logits.shape, dtype=torch.float32, device=logits.device).scatter(-1, cand, q_k)
