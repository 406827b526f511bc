"""The target's cache, per family: how it is made, what mask a forward gets, how a commit settles it.

The loop keeps one column-validity mask for the target cache (``Batch.col_valid``): rejected
draft positions and prompt padding stay behind as holes that attention masks. That is all a
full-attention layer needs. Two kinds of layer need more, and :class:`CachePolicy` gives it
to them behind :class:`~dflash_trt.runtime.backend.TorchBackend`:

* **Sliding-window layers** (gemma4, gpt_oss). A window counted in cache columns would count
  holes, so real tokens would fall out of it early. Here every mask is built from token
  *positions* (a valid column's position is the number of valid columns before it), so a
  sliding layer sees exactly the last ``W`` committed tokens, at any batch size; and after
  each commit those layers keep, per row, only the last ``W - 1`` committed columns (their
  own columns, right-aligned, tracked in ``TargetCache.win_valid`` / ``win_pos``), the
  bounded cache transformers' ``DynamicSlidingWindowLayer`` keeps for a single sequence.
* **Linear-attention layers** (Gated DeltaNet: qwen3_5, qwen3_5_moe, qwen3_next; Mamba2:
  nemotron_h; KDA: kimi_linear, glm5_next). A recurrent or conv state cannot mask a token it has
  absorbed: ``recurrent.py`` keeps a verify's state after every position and, at commit,
  selects the accepted prefix's (prefills: snapshot and replay).
* **Indexed-attention layers** (DeepSeek sparse attention: deepseek_v32, glm_moe_dsa,
  glm5_next). An indexer keeps a key per cache column and picks each query's top-k columns;
  its key cache follows the KV cache column for column (``sparse_cache.py``), and each verify first packs
  every row's committed columns to the front, so a rejected draft's key is gone from both
  caches before any later query could choose it. glm5_next's indexer scores pools of
  ``index_kpool`` consecutive columns counted from a row's first valid one: its committed
  columns go to the back instead (``self.pooled``), right against the block being verified.
* **Compressing layers** (deepseek_v4): a running compressor state no mask or column can
  undo, kept per batch by transformers; :func:`cache_policy` gives those targets
  ``row_cache.RowReplayPolicy`` instead of this class.

Masks follow transformers' conventions (``masking_utils``): a 2D padding mask where the model
builds its own (every family without sliding layers, as before), else a dict of additive 4D
masks per layer type, which the models take as already prepared.

A forward on a fresh cache (prefill) is settled at once: each row keeps its valid prefix.
Any other forward waits for ``commit`` (the verify's accepted prefix per row); a forward that
finds one still waiting settles it as fully committed first.
"""

from __future__ import annotations

import functools
from contextlib import nullcontext

import torch

from dflash_trt.errors import DFlashError
from dflash_trt.runtime.recurrent import RecurrentStates
from dflash_trt.runtime.row_cache import COMPRESSING, RowReplayPolicy
from dflash_trt.runtime.sparse_cache import merge_indexer, pack

SUPPORTED = {"full_attention", "sliding_attention", "linear_attention", "indexed_attention", "dummy"}


def cache_policy(model):
    """The cache policy ``model`` needs: :class:`CachePolicy`, or ``RowReplayPolicy`` for a
    target whose layers compress the tokens they see (``row_cache.COMPRESSING``)."""
    from transformers.cache_utils import get_layer_types_and_kwargs  # start-up: transformers (see _cache_class)

    types, _ = get_layer_types_and_kwargs(model.config.get_text_config(decoder=True))
    return RowReplayPolicy(model) if set(types) & COMPRESSING else CachePolicy(model)


class CachePolicy:
    """One target's cache handling; ``for_model`` reads which layers need what."""

    def __init__(self, model):
        from transformers.cache_utils import get_layer_types_and_kwargs  # start-up: transformers

        self.config = model.config
        text = model.config.get_text_config(decoder=True)
        types, kwargs = get_layer_types_and_kwargs(text)
        unknown = sorted(set(types) - SUPPORTED)
        if unknown:
            raise DFlashError(
                f"{text.model_type}: layer type {unknown[0]} is not supported by the "
                f"reference runtime (supported: {', '.join(sorted(SUPPORTED - {'dummy'}))})"
            )
        self.sliding = [i for i, t in enumerate(types) if t == "sliding_attention"]
        self.indexed = [i for i, t in enumerate(types) if t == "indexed_attention"]
        self.full = [i for i, t in enumerate(types) if t == "full_attention"] + self.indexed
        self.pooled = getattr(text, "index_kpool", None) is not None  # glm5_next: back-packed (sparse_cache.py)
        windows = {kwargs[i]["sliding_window"] for i in self.sliding}
        if len(windows) > 1:
            raise DFlashError(
                f"{text.model_type}: sliding layers with different windows {sorted(windows)} "
                "are not supported by the reference runtime"
            )
        self.window = windows.pop() if windows else None
        linear = [i for i, t in enumerate(types) if t == "linear_attention"]
        self.recurrent = RecurrentStates(model, linear) if linear else None
        self.has_linear = bool(linear)
        param = next(model.parameters())
        self.dtype, self.device = param.dtype, param.device

    # -- the calls TorchBackend forwards -----------------------------------------------
    def new_cache(self, batch: int):
        """An empty cache for ``batch`` rows (a ``TargetCache``, see ``_cache_class``)."""
        return _cache_class()(self.config, self.sliding, batch, self.device)

    def forward(self, run, ids, positions, attention_mask, cache):
        """One target forward (``Backend.target_forward``): attention_mask [b, S+T] bool;
        ``run(model_mask)`` calls the model with the mask this policy builds for it."""
        if cache.pending is not None:  # a forward nobody committed: all its valid columns stay
            self._settle(cache, cache.pending.sum(1))
        T = ids.shape[1]
        fresh = attention_mask.shape[1] == T
        mask = self._model_mask(cache, positions, attention_mask)
        with self.recurrent.capture(cache, per_token=not fresh and T > 1) if self.recurrent else nullcontext():
            logits, hidden = run(mask)
        cache.pending, cache.pending_pos = attention_mask[:, -T:], positions
        if fresh:
            self._settle(cache, cache.pending.sum(1))
        return logits, hidden

    def commit(self, cache, col_valid, n_new) -> None:
        """``Backend.commit_cache``: the last forward keeps its first n_new [b] columns per row."""
        if cache.pending is not None:
            self._settle(cache, n_new)

    def compact(self, cache, col_valid: torch.Tensor) -> torch.Tensor:
        """Drop columns that are holes in every row from the full-attention layers (the loop's
        columns; sliding layers keep their own, linear layers have none): attention and mask
        cost then follow committed tokens instead of growing by B per round."""
        if self.indexed:  # a rejected draft's indexer key must go, not wait behind a mask
            return pack(cache, self.full, col_valid, back=self.pooled)
        keep = col_valid.any(0)
        if bool(keep.all()):
            return col_valid
        n_keep = int(keep.sum())
        if bool(keep[:n_keep].all()):  # holes only at the tail (always so at batch 1): a view
            pick = lambda t: t[..., :n_keep, :]  # noqa: E731
        else:
            idx = keep.nonzero().squeeze(1)
            pick = lambda t: t.index_select(-2, idx)  # noqa: E731
        for i in self.full:
            layer = cache.layers[i]
            if getattr(layer, "is_initialized", False) and layer.keys is not None and layer.keys.numel():
                layer.keys, layer.values = pick(layer.keys), pick(layer.values)
        return col_valid[:, keep]

    def keep_rows(self, cache, rows: torch.Tensor) -> None:
        """Keep only ``rows`` [n] of every layer and of the policy's own bookkeeping."""
        if cache.pending is not None:
            self._settle(cache, cache.pending.sum(1))
        for i in self.full + self.sliding:
            cache.layers[i].batch_select_indices(rows)
        if self.recurrent:
            self.recurrent.keep_rows(cache, rows)
        cache.win_valid, cache.win_pos = cache.win_valid[rows], cache.win_pos[rows]

    def merge(self, a, b):
        """A cache of a's rows then b's (rows joining a running batch; both settled first).
        Full-attention columns are right-padded with holes to the wider cache (the loop pads
        its column mask the same way), sliding windows and recurrent states concatenated."""
        caches = [a, b]
        for c in caches:
            if c.pending is not None:
                self._settle(c, c.pending.sum(1))
        batches = [int(c.win_valid.shape[0]) for c in caches]
        out = self.new_cache(sum(batches))
        S = max((c.layers[i].keys.shape[-2] for c in caches for i in self.full if _has_kv(c.layers[i])), default=0)
        for i in self.full:
            _merge_kv(out.layers[i], [c.layers[i] for c in caches], batches, S)
        for i in self.indexed:
            merge_indexer(out.layers[i], [c.layers[i] for c in caches], batches, S)
        L = max(c.win_valid.shape[1] for c in caches)
        for i in self.sliding:
            _merge_kv(out.layers[i], [c.layers[i] for c in caches], batches, L)
        out.win_valid = torch.cat([_pad_cols(c.win_valid, L, False) for c in caches])
        out.win_pos = torch.cat([_pad_cols(c.win_pos, L, 0) for c in caches])
        if self.recurrent:
            self.recurrent.merge(out, caches)
        return out

    # -- masks -------------------------------------------------------------------------
    def _model_mask(self, cache, positions, attention_mask):
        """What the model's ``attention_mask`` argument gets (see the module docstring)."""
        if not self.sliding:
            return attention_mask.long()
        T = positions.shape[1]
        col_pos = attention_mask.long().cumsum(1) - 1  # [b, S+T]
        masks: dict[str, torch.Tensor | None] = {
            "full_attention": _additive(attention_mask, col_pos, positions, None, self.dtype)
        }
        win_valid = torch.cat([cache.win_valid, attention_mask[:, -T:]], dim=1)  # [b, L+T]
        win_pos = torch.cat([cache.win_pos, positions], dim=1)
        masks["sliding_attention"] = _additive(win_valid, win_pos, positions, self.window, self.dtype)
        if self.has_linear:
            masks["linear_attention"] = None
        return masks

    # -- settling a forward ------------------------------------------------------------
    def _settle(self, cache, n_valid: torch.Tensor) -> None:
        """The pending forward keeps its first n_valid [b] columns per row."""
        T = cache.pending.shape[1]
        new_valid = torch.arange(T, device=n_valid.device)[None] < n_valid[:, None]  # [b, T]
        if self.sliding:
            self._keep_window(cache, new_valid, cache.pending_pos)
        if self.recurrent:
            self.recurrent.settle(cache, n_valid, T)
        cache.pending = cache.pending_pos = None

    def _keep_window(self, cache, new_valid: torch.Tensor, new_pos: torch.Tensor) -> None:
        """Sliding layers keep, per row, the last W-1 committed columns (right-aligned; rows
        with fewer are left-padded with invalid columns)."""
        assert self.window is not None  # only sliding layers keep a window
        valid = torch.cat([cache.win_valid, new_valid], dim=1)  # [b, L+T]
        pos = torch.cat([cache.win_pos, new_pos], dim=1)
        after = valid.flip(1).long().cumsum(1).flip(1)  # valid columns at or after each column
        chosen = valid & (after <= self.window - 1)
        keep = int(chosen.sum(1).max())
        cols = torch.arange(valid.shape[1], device=valid.device).expand_as(valid)
        idx = torch.where(chosen, cols, -1).sort(dim=1).values[:, valid.shape[1] - keep :]  # [b, keep]
        cache.win_valid, idx = idx >= 0, idx.clamp(min=0)
        cache.win_pos = pos.gather(1, idx)
        for i in self.sliding:
            layer = cache.layers[i]
            if layer.keys is None or not layer.keys.numel():
                continue
            g = idx[:, None, :, None]
            layer.keys = layer.keys.gather(2, g.expand(-1, layer.keys.shape[1], -1, layer.keys.shape[-1]))
            layer.values = layer.values.gather(2, g.expand(-1, layer.values.shape[1], -1, layer.values.shape[-1]))


@functools.cache
def _cache_class():
    """TargetCache, defined on first use so importing the runtime does not import transformers."""
    from transformers import DynamicCache  # start-up: transformers (see the docstring)
    from transformers.cache_utils import DynamicLayer  # start-up: transformers

    class TargetCache(DynamicCache):
        """transformers' DynamicCache with the policy's bookkeeping: sliding layers are plain
        growing layers the policy trims (``win_valid`` / ``win_pos`` [b, L]: their columns'
        validity and positions); ``pending`` [b, T] / ``pending_pos``: the last forward's
        column validity and positions until it is settled; ``recurrent_pending``:
        ``recurrent.py``'s snapshot and captured inputs."""

        def __init__(self, config, sliding: list[int], batch: int, device):
            super().__init__(config=config)
            for i in sliding:
                self.layers[i] = DynamicLayer()
            self.win_valid = torch.zeros(batch, 0, dtype=torch.bool, device=device)
            self.win_pos = torch.zeros(batch, 0, dtype=torch.long, device=device)
            self.pending = self.pending_pos = self.recurrent_pending = None

    return TargetCache


def _additive(valid, kpos, qpos, window, dtype) -> torch.Tensor:
    """Additive mask [b, 1, T, K]: query t (at qpos [b, T]) sees valid [b, K] columns at
    kpos [b, K] <= its position, and within ``window`` positions when given (transformers'
    ``sliding_window_overlay``: kv > q - W). finfo.min, not -inf, so a row with nothing
    to see (a padding query) stays finite."""
    allowed = valid[:, None, :] & (kpos[:, None, :] <= qpos[:, :, None])
    if window is not None:
        allowed &= kpos[:, None, :] > qpos[:, :, None] - window
    zero = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return zero.masked_fill(~allowed, torch.finfo(dtype).min)[:, None]


def _pad_cols(t: torch.Tensor, width: int, value) -> torch.Tensor:
    """Right-pad t [b, S] with ``value`` to [b, width]."""
    pad = t.new_full((t.shape[0], width - t.shape[1]), value)
    return torch.cat([t, pad], dim=1)


def _has_kv(layer) -> bool:
    return getattr(layer, "keys", None) is not None and layer.keys.numel() > 0


def _merge_kv(out, layers, batches: list[int], width: int) -> None:
    """Concatenate attention layers along the batch, right-padding each to ``width`` columns
    (a layer holding no tensors yet contributes zeros for its ``batches[i]`` rows: holes)."""
    ref = next((x for x in layers if _has_kv(x)), None)
    if ref is None:
        return
    pad = lambda t: torch.nn.functional.pad(t, (0, 0, 0, width - t.shape[-2]))  # noqa: E731
    parts_k, parts_v = [], []
    for layer, b in zip(layers, batches, strict=True):
        k, v = layer.keys, layer.values
        if not _has_kv(layer):
            k = ref.keys.new_zeros((b, ref.keys.shape[1], 0, ref.keys.shape[-1]))
            v = ref.values.new_zeros((b, ref.values.shape[1], 0, ref.values.shape[-1]))
        parts_k.append(pad(k))
        parts_v.append(pad(v))
    out.lazy_initialization(parts_k[0], parts_v[0])
    out.keys, out.values = torch.cat(parts_k), torch.cat(parts_v)
