"""The caches a graph backend feeds its graphs, and how rows of two batches become one.

Invariant: row i of every tensor here is row i of the batch (the loop's ``Batch.rows``); a
merge puts the second batch's rows after the first's and leaves every row's valid columns
where they were (the capacity, S, is the wider of the two, the narrower zero-padded on the
right: columns past a row's ``lengths`` are never read as valid), so a row's tokens do not
depend on what it is merged with.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class TargetCache:
    """The target's KV cache as the target graph takes it: k, v [layers, b, kvh, S, d] (None: empty)."""

    k: torch.Tensor | None = None
    v: torch.Tensor | None = None


class DenseKVCache:
    """The drafter's context as ONNX Runtime's drafter graph reads it (``export/onnx_native.py``).

    k, v [L, b, kvh, S, d]: row i's column j holds position j, valid where j < lengths[i]; the
    graph reads the whole buffer (S, the capacity, grows by ``chunk`` columns, so the graph is
    fed the tensors themselves, never a sliced copy) and returns the new columns, written here.
    """

    #: capacity step (columns): a growth copies the cache, so it happens every ``chunk`` tokens at most
    chunk = 64

    def __init__(
        self, layers: int, kv_heads: int, head_dim: int, batch: int, device=None, max_columns: int | None = None
    ):
        self.k = torch.zeros(layers, batch, kv_heads, 0, head_dim, device=device)
        self.v = torch.zeros_like(self.k)
        self.lengths = torch.zeros(batch, dtype=torch.long, device=device)
        #: the capacity never grows past this (an engine profile's bound), only to what a row needs
        self.max_columns = max_columns

    def reserve(self, extra: torch.Tensor) -> None:
        """Room for ``extra[i]`` more columns in row i (grown by whole chunks)."""
        need = int((self.lengths + extra).max()) if self.lengths.numel() else 0
        if need > self.k.shape[3]:
            cap = -(-need // self.chunk) * self.chunk
            cap = max(need, min(cap, self.max_columns or cap))
            pad = (*self.k.shape[:3], cap - self.k.shape[3], self.k.shape[4])
            self.k, self.v = (torch.cat([t, t.new_zeros(pad)], 3) for t in (self.k, self.v))

    def append(self, k_new: torch.Tensor, v_new: torch.Tensor, n_new: torch.Tensor) -> None:
        """Write the first n_new[i] of k_new, v_new [L, b, kvh, T, d] at columns lengths[i] + t
        (one slice copy per row: cheaper than an index scatter at the batch sizes a round has)."""
        for i, (at, n) in enumerate(zip(self.lengths.tolist(), n_new.tolist(), strict=True)):
            self.k[:, i, :, at : at + n] = k_new[:, i, :, :n]
            self.v[:, i, :, at : at + n] = v_new[:, i, :, :n]
        self.lengths = self.lengths + n_new

    def select(self, rows: torch.Tensor) -> None:
        """Keep only these rows (finished ones leave the batch). Only a row finishing could have
        grown the capacity past ``max_columns`` (a row that goes on holds <= prompt + max_new - 2
        columns, ``request_shapes``): the copy trims it back to what the rows kept need."""
        self.lengths = self.lengths[rows]
        cap = self.k.shape[3]
        if self.max_columns is not None and cap > self.max_columns:
            cap = max(self.max_columns, int(self.lengths.max()) if self.lengths.numel() else 0)
        self.k, self.v = self.k[:, rows, :, :cap].contiguous(), self.v[:, rows, :, :cap].contiguous()


class DenseTargetCache(DenseKVCache):
    """The target's cache under the new-K/V contract (module docstring): a :class:`DenseKVCache`
    plus ``pending``, the last verify's (new_k, new_v) [L, b, kvh, T, d] until ``commit_cache``
    says how many columns of each row to keep."""

    chunk = 32
    pending: tuple[torch.Tensor, torch.Tensor] | None = None

    def select(self, rows: torch.Tensor) -> None:
        super().select(rows)
        if self.pending is not None:
            self.pending = (self.pending[0][:, rows], self.pending[1][:, rows])


def _pad_columns(t: torch.Tensor, width: int) -> torch.Tensor:
    """k or v [L, b, kvh, S, d] zero-padded on the right of S to ``width``."""
    return t if t.shape[3] == width else F.pad(t, (0, 0, 0, width - t.shape[3]))


def merge_dense(a: DenseKVCache, b: DenseKVCache) -> DenseKVCache:
    """``a`` holding its rows, then ``b``'s (both between rounds: nothing pending)."""
    if getattr(a, "pending", None) is not None or getattr(b, "pending", None) is not None:
        raise RuntimeError("a target cache with an uncommitted verify cannot be merged")
    width = max(a.k.shape[3], b.k.shape[3])
    a.k = torch.cat([_pad_columns(a.k, width), _pad_columns(b.k, width)], 1)
    a.v = torch.cat([_pad_columns(a.v, width), _pad_columns(b.v, width)], 1)
    a.lengths = torch.cat([a.lengths, b.lengths])
    bounds = (a.max_columns, b.max_columns)
    a.max_columns = None if None in bounds else max(bounds)  # type: ignore[type-var]
    return a


def merge_present(a: TargetCache, b: TargetCache) -> TargetCache:
    """An older bundle's present cache: both compacted by row, so column j of a row is its j-th
    valid column; the narrower padded (the loop pads ``col_valid`` the same way)."""
    if a.k is None or b.k is None or a.v is None or b.v is None:
        raise RuntimeError("an empty target cache cannot be merged (merged batches are prefilled)")
    width = max(a.k.shape[3], b.k.shape[3])
    return TargetCache(
        torch.cat([_pad_columns(a.k, width), _pad_columns(b.k, width)], 1),
        torch.cat([_pad_columns(a.v, width), _pad_columns(b.v, width)], 1),
    )


def merge_caches(a: object, b: object) -> object:
    """The merge for a target or dense drafter cache of either kind."""
    if isinstance(a, DenseKVCache) and isinstance(b, DenseKVCache):
        return merge_dense(a, b)
    if isinstance(a, TargetCache) and isinstance(b, TargetCache):
        return merge_present(a, b)
    raise TypeError(f"cannot merge a {type(a).__name__} with a {type(b).__name__}")
