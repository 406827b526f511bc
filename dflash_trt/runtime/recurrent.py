"""Linear-attention states (Gated DeltaNet, Mamba2, KDA) that take only committed tokens.

A linear-attention layer (transformers' ``Qwen3_5GatedDeltaNet`` / ``Qwen3NextGatedDeltaNet``,
``NemotronHMamba2Mixer``, ``KimiLinearDeltaAttention``) carries, per sequence, a causal-conv
state (the last ``K`` conv inputs, [b, C, K]) and a recurrent state ([b, H, d_k, d_v]). A
verify forward runs all B block tokens through them, and a state cannot mask a token it has
absorbed, so the tokens after a rejection would stay in it.

**Verify forwards keep the state after every position** (``linear_states.py``): while the
forward runs, each layer's chunked kernel is transformers' math over one chunk of exactly B
tokens that also returns the block's factors (S_0, k, G, u), from which the state after any
prefix n is one [d_k, n] x [n, d_v] product; the conv inputs the layer saw ([b, C, K + B]) hold
its conv state after any prefix (columns n .. n+K). At commit, each row that kept n < B
columns gets exactly those states, gathered, with no token run through a layer again. Rows
that accepted everything keep the forward's states as they are. The kernel is swapped in the
layer's own modeling module for the forward's duration only, and the mixer itself runs
unchanged (projections, conv, gates, norms: transformers' own).

**Prefills and one-token forwards snapshot and replay** (rare: once per request, and only
rows shorter than the longest prompt): clone every linear layer's two states before the
forward, keep each mixer's input, and at commit run the mixer again over a short row's valid
tokens from the snapshot.
"""

from __future__ import annotations

import inspect
import sys
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from dflash_trt.errors import DFlashError
from dflash_trt.runtime import linear_states


class RecurrentStates:
    """The linear-attention layers of one model: their mixers, per-token states, snapshots and replays."""

    def __init__(self, model, layer_ids: list[int]):
        found = {}
        for _, module in model.named_modules():
            if getattr(module, "layer_type", None) == "linear_attention" and hasattr(module, "layer_idx"):
                found[int(module.layer_idx)] = module
        model_type = model.config.get_text_config(decoder=True).model_type
        kernels = {i: _kernel_of(m) for i, m in found.items()}
        if (
            sorted(found) != sorted(layer_ids)
            or None in kernels.values()
            or not all("cache" in inspect.signature(m.forward).parameters for m in found.values())
        ):
            raise DFlashError(
                f"{model_type}: its linear-attention layers are not the Gated DeltaNet, Mamba2 "
                "or KDA mixers the reference runtime can roll back (transformers >= 5.24 ships them)"
            )
        self.mixers = dict(sorted(found.items()))
        self.kernels = {k for k in kernels.values()}  # (modeling module, kernel name)

    # -- one forward ---------------------------------------------------------------------
    def capture(self, cache, per_token: bool = False):
        """Context for one forward: per-token states (a verify) or a snapshot (a prefill, or a
        one-token forward); what ``settle`` needs waits in ``cache.recurrent_pending``."""
        return self._per_token(cache) if per_token else self._snapshot(cache)

    @contextmanager
    def _per_token(self, cache):
        factors: dict[int, linear_states.Factors] = {}
        convs: dict[int, torch.Tensor] = {}
        current: list[int] = [-1]  # the layer whose forward is running

        def record(f):
            factors[current[0]] = f

        update_conv = cache.update_conv_state

        def keep_conv(x, layer_idx, *args, **kwargs):
            full = update_conv(x, layer_idx, *args, **kwargs)  # [b, C, K + T]: old state, then the inputs
            convs[layer_idx] = full
            return full

        def enter(i):
            return lambda module, args: current.__setitem__(0, i)

        saved = {(mod, name): getattr(mod, name) for mod, name in self.kernels}
        hooks = [m.register_forward_pre_hook(enter(i)) for i, m in self.mixers.items()]
        cache.update_conv_state = keep_conv
        for mod, name in saved:
            setattr(mod, name, linear_states.KERNELS[name](record, getattr(mod, "l2norm", None)))
        try:
            yield
        finally:
            for (mod, name), fn in saved.items():
                setattr(mod, name, fn)
            del cache.update_conv_state
            for h in hooks:
                h.remove()
        cache.recurrent_pending = ("per_token", factors, convs)

    @contextmanager
    def _snapshot(self, cache):
        """Snapshot every linear layer's states, and keep each mixer's input [b, T, H] while
        the forward runs."""
        snap = {i: _states(cache.layers[i]) for i in self.mixers}
        snap = {
            i: (None if st[0] is None else st[0].clone(), None if st[1] is None else st[1].clone())
            for i, st in snap.items()
        }
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
        cache.recurrent_pending = ("snapshot", snap, inputs)

    def settle(self, cache, n_valid: torch.Tensor, T: int) -> None:
        """Rows that keep n_valid [b] < T of the forward's columns get the states of exactly
        those tokens: selected from the per-token states, or replayed from the snapshot."""
        kind, a, b = cache.recurrent_pending
        cache.recurrent_pending = None
        short = (n_valid < T).nonzero().squeeze(1)
        if not len(short):
            return
        if kind == "per_token":
            self._select(cache, a, b, n_valid)
            return
        for k in sorted(set(n_valid[short].tolist())):
            rows = short[n_valid[short] == k]
            for i, mixer in self.mixers.items():
                self._replay(cache.layers[i], mixer, a[i], b[i], rows, int(k))

    @torch.no_grad()
    def _select(self, cache, factors, convs, n: torch.Tensor) -> None:
        """Every row keeps its first n [b] tokens (n = T: what the forward left, recomputed; one
        dense pass beats gathering the short rows): recurrent state from the factors, conv
        state = the K conv inputs ending at token n."""
        for i in self.mixers:
            layer = cache.layers[i]
            rec, conv = layer.recurrent_states[0], layer.conv_states[0]
            rec.copy_(factors[i].state(n, consume=True))
            full = convs[i]  # [b, C, K + T]
            K = conv.shape[-1]
            idx = (n[:, None] + torch.arange(K, device=n.device))[:, None].expand(-1, full.shape[1], -1)
            conv.copy_(full.gather(-1, idx))

    def pending_bytes_per_row(self, cache) -> int:
        """What a verify keeps per row until its commit (factors and conv inputs, all layers)."""
        kind, factors, convs = cache.recurrent_pending
        return sum(f.nbytes_per_row() for f in factors.values()) + sum(
            c[0].numel() * c.element_size() for c in convs.values()
        )

    @torch.no_grad()
    def _replay(self, layer, mixer, snap, hidden, rows: torch.Tensor, k: int) -> None:
        conv, rec = snap
        state = _OneLayer(None if conv is None else conv[rows].clone(), None if rec is None else rec[rows].clone())
        mixer(hidden_states=hidden[rows, :k], cache=state, attention_mask=None)
        assert state.conv is not None and state.rec is not None, "a replayed layer has both states"
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
            dst.lazy_initialization(
                conv_states=layers[0].conv_states[0], conv_kernel_size=layers[0].conv_kernel_size[0]
            )
            dst.lazy_initialization(recurrent_states=layers[0].recurrent_states[0])
            dst.conv_states[0] = torch.cat([layer.conv_states[0] for layer in layers])
            dst.recurrent_states[0] = torch.cat([layer.recurrent_states[0] for layer in layers])
            dst.has_previous_state[0] = True


def _kernel_of(mixer):
    """(modeling module, name) of the chunked kernel a mixer calls, None if it is none we know."""
    mod = sys.modules[type(mixer).__module__]
    names = [n for n in linear_states.KERNELS if hasattr(mod, n)]
    return (mod, names[0]) if len(names) == 1 else None


def _states(layer) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(conv [b, C, K], recurrent [b, H, d_k, d_v]) of a transformers linear-attention cache
    layer, None before its first forward."""
    if not layer.has_previous_state[0]:
        return None, None
    return layer.conv_states[0], layer.recurrent_states[0]


class _OneLayer:
    """The cache calls a Gated DeltaNet mixer makes (transformers' ``Cache`` API:
    ``get_conv_state``, ``get_recurrent_state``, ``is_recording_past``, ``update_conv_state``,
    ``update_recurrent_state``; from 5.25 also ``get_recurrent_states_to_keep`` and
    ``increase_count``), answered for one layer and a few rows, so a replay runs the mixer itself
    on a copy of the snapshot."""

    def __init__(self, conv: torch.Tensor | None, rec: torch.Tensor | None):
        self.conv, self.rec = conv, rec

    def get_conv_state(self, layer_idx, state_idx=0):
        return self.conv

    def get_recurrent_state(self, layer_idx, state_idx=0):
        return self.rec

    def is_recording_past(self, layer_idx):
        return False

    def get_recurrent_states_to_keep(self, layer_idx=None):
        """No intermediate recurrent states (transformers >= 5.25 asks; not recording the past)."""
        return 0

    def increase_count(self, layer_idx, state_idx=0):
        """The token count a one-token conv update in place keeps (transformers >= 5.25): a replay
        counts nothing, its states are copied back into the real cache by hand."""

    def update_conv_state(self, x, layer_idx, conv_kernel_size=None, **kwargs):
        """x [n, C, k] new conv inputs; keeps the last K, returns what the conv must see."""
        if conv_kernel_size:
            K = conv_kernel_size
        elif self.conv is not None:
            K = self.conv.shape[-1]
        else:
            raise ValueError("the first conv update needs conv_kernel_size")
        full = x if self.conv is None else torch.cat([self.conv, x], dim=-1)
        if full.shape[-1] < K:  # a prompt shorter than the kernel: zeros before it, as transformers pads
            full = F.pad(full, (K - full.shape[-1], 0))
        self.conv = full[..., -K:].clone()
        return full

    def update_recurrent_state(self, state, layer_idx, state_idx=0, **kwargs):
        self.rec = state
        return state
