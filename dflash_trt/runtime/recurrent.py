"""Linear-attention (Gated DeltaNet) states that take only committed tokens.

A Gated DeltaNet layer (Yang et al., "Gated Delta Networks", ICLR 2025; transformers'
``Qwen3NextGatedDeltaNet`` / ``Qwen3_5GatedDeltaNet``) carries, per sequence, a causal-conv
state (the last ``K`` conv inputs, [b, C, K]) and a recurrent state ([b, H, d_k, d_v]). A
verify forward runs all B block tokens through them, and a state cannot mask a token it has
absorbed, so the tokens after a rejection would stay in it.

The choice here is **snapshot and replay**: before a forward, clone every linear layer's two
states; during it, keep each such layer's input hidden states (a forward pre-hook, nothing
patched); at commit, for the rows that kept fewer columns than the forward ran, restore the
snapshot and run only that layer's mixer again over the kept tokens (grouped by how many).
Rows that accepted everything keep the forward's states as they are. The replay runs the
layer's own module, so the state math is transformers' own; its outputs are discarded (the
verify already produced the kept tokens' outputs, which depend only on earlier tokens).

Cost per round (README, "Hybrid targets"): one clone of the states (``b x layers x (C x K +
H x d_k x d_v)`` elements) and, for rows that rejected part of their block, one mixer forward
per linear layer over their accepted tokens; no second full-model forward. The alternative,
per-token states selected after verification (SGLang's ``extra_buffer``), needs the kernel
to emit B states per layer; that is the TensorRT-LLM-side design, not this reference.

Prompt padding is settled the same way: after a batched prefill, a row shorter than the
longest replays its prompt from an empty state.
"""

from __future__ import annotations

import inspect
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from dflash_trt.errors import DFlashError


class RecurrentStates:
    """The linear-attention layers of one model: their mixers, snapshots and replays."""

    def __init__(self, model, layer_ids: list[int]):
        found = {}
        for _, module in model.named_modules():
            if getattr(module, "layer_type", None) == "linear_attention" and hasattr(module, "layer_idx"):
                found[int(module.layer_idx)] = module
        model_type = model.config.get_text_config(decoder=True).model_type
        if sorted(found) != sorted(layer_ids) or not all(
                "cache" in inspect.signature(m.forward).parameters for m in found.values()):
            raise DFlashError(f"{model_type}: its linear-attention layers are not the Gated DeltaNet "
                              "mixers the reference runtime can roll back (transformers >= 5.24 ships them)")
        self.mixers = dict(sorted(found.items()))

    # -- one forward ---------------------------------------------------------------------
    @contextmanager
    def capture(self, cache):
        """Snapshot every linear layer's states, and keep each mixer's input [b, T, H] while
        the forward runs; both wait in ``cache.recurrent_pending`` for ``settle``."""
        snap = {i: _states(cache.layers[i]) for i in self.mixers}
        snap = {i: tuple(None if s is None else s.clone() for s in st) for i, st in snap.items()}
        inputs: dict[int, torch.Tensor] = {}

        def grab(i):
            def hook(module, args, kwargs):
                inputs[i] = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
            return hook

        hooks = [m.register_forward_pre_hook(grab(i), with_kwargs=True) for i, m in self.mixers.items()]
        try:
            yield
        finally:
            for h in hooks:
                h.remove()
        cache.recurrent_pending = (snap, inputs)

    def settle(self, cache, n_valid: torch.Tensor, T: int) -> None:
        """Rows that keep n_valid [b] < T of the forward's columns get the states of exactly
        those tokens: restored from the snapshot, then their mixers replayed over them."""
        snap, inputs = cache.recurrent_pending
        cache.recurrent_pending = None
        short = (n_valid < T).nonzero().squeeze(1)
        for k in sorted(set(n_valid[short].tolist())):
            rows = short[n_valid[short] == k]
            for i, mixer in self.mixers.items():
                self._replay(cache.layers[i], mixer, snap[i], inputs[i], rows, int(k))

    @torch.no_grad()
    def _replay(self, layer, mixer, snap, hidden, rows: torch.Tensor, k: int) -> None:
        conv, rec = snap
        state = _OneLayer(None if conv is None else conv[rows].clone(),
                          None if rec is None else rec[rows].clone())
        mixer(hidden_states=hidden[rows, :k], cache=state, attention_mask=None)
        layer.conv_states[0][rows] = state.conv.to(layer.conv_states[0].dtype)
        layer.recurrent_states[0][rows] = state.rec.to(layer.recurrent_states[0].dtype)

    # -- rows leaving and joining -------------------------------------------------------------
    def keep_rows(self, cache, rows: torch.Tensor) -> None:
        for i in self.mixers:
            layer = cache.layers[i]
            for states in (layer.conv_states, layer.recurrent_states):
                if states[0] is not None:
                    states[0] = states[0][rows]

    def merge(self, out, caches) -> None:
        """Concatenate every linear layer's states along the batch into ``out`` (a new cache)."""
        for i in self.mixers:
            layers = [c.layers[i] for c in caches]
            if any(layer.conv_states[0] is None for layer in layers):
                raise DFlashError("cannot merge a hybrid cache that has not been prefilled")
            dst = out.layers[i]
            dst.lazy_initialization(conv_states=layers[0].conv_states[0],
                                    conv_kernel_size=layers[0].conv_kernel_size[0])
            dst.lazy_initialization(recurrent_states=layers[0].recurrent_states[0])
            dst.conv_states[0] = torch.cat([layer.conv_states[0] for layer in layers])
            dst.recurrent_states[0] = torch.cat([layer.recurrent_states[0] for layer in layers])
            dst.has_previous_state[0] = True


def _states(layer) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(conv [b, C, K], recurrent [b, H, d_k, d_v]) of a transformers linear-attention cache
    layer, None before its first forward."""
    if not layer.has_previous_state[0]:
        return None, None
    return layer.conv_states[0], layer.recurrent_states[0]


class _OneLayer:
    """The five cache calls a Gated DeltaNet mixer makes (transformers' ``Cache`` API:
    ``get_conv_state``, ``get_recurrent_state``, ``is_recording_past``, ``update_conv_state``,
    ``update_recurrent_state``), answered for one layer and a few rows, so a replay runs the
    mixer itself on a copy of the snapshot."""

    def __init__(self, conv: torch.Tensor | None, rec: torch.Tensor | None):
        self.conv, self.rec = conv, rec

    def get_conv_state(self, layer_idx, state_idx=0):
        return self.conv

    def get_recurrent_state(self, layer_idx, state_idx=0):
        return self.rec

    def is_recording_past(self, layer_idx):
        return False

    def update_conv_state(self, x, layer_idx, conv_kernel_size=None, **kwargs):
        """x [n, C, k] new conv inputs; keeps the last K, returns what the conv must see."""
        K = conv_kernel_size or self.conv.shape[-1]
        full = x if self.conv is None else torch.cat([self.conv, x], dim=-1)
        if full.shape[-1] < K:  # a prompt shorter than the kernel: zeros before it, as transformers pads
            full = F.pad(full, (K - full.shape[-1], 0))
        self.conv = full[..., -K:].clone()
        return full

    def update_recurrent_state(self, state, layer_idx, state_idx=0, **kwargs):
        self.rec = state
        return state
