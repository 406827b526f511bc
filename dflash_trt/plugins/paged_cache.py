"""The drafter's paged context cache: the one layout every implementation of the ops reads.

Pages of ``page_size`` slots per layer, a page table per sequence and the context length per
sequence; sequence ``i``'s slot ``t`` is ``page_table[i, t // page_size]``, offset
``t % page_size``. The reference runtime, the Triton kernels, the torch ops and the ONNX /
TensorRT graphs all read this layout, so a cache filled by one is read by any other.
"""

from __future__ import annotations

import torch


class PagedKVCache:
    """The drafter's context KV cache: committed positions only, paged per sequence.

    ``k``/``v``: [layers, pages, page_size, kv_heads, head_dim]; ``page_table``: [b, max
    pages] (int32, page ids in allocation order, so sequences interleave and a table is
    generally not contiguous); ``lengths``: [b] committed context length.
    """

    def __init__(
        self,
        num_layers: int,
        batch: int,
        num_kv_heads: int,
        head_dim: int,
        page_size: int = 16,
        device=None,
        dtype=torch.float32,
        pages: int = 8,
    ):
        self.page_size = page_size
        self.k = torch.zeros(num_layers, pages, page_size, num_kv_heads, head_dim, device=device, dtype=dtype)
        self.v = torch.zeros_like(self.k)
        self.page_table = torch.zeros(batch, 0, dtype=torch.int32, device=device)
        self.lengths = torch.zeros(batch, dtype=torch.long, device=device)
        self.used_pages = 0

    @property
    def batch(self) -> int:
        return self.lengths.shape[0]

    def reserve(self, extra: torch.Tensor) -> None:
        """Make room for ``extra[i]`` more positions in sequence i (allocating pages)."""
        per_seq = ((self.lengths + extra + self.page_size - 1) // self.page_size).tolist()
        held = (self.page_table >= 0).sum(1).tolist()  # tables fill left to right
        # New pages go out round-robin across sequences (page index first), so tables interleave.
        todo = sorted((p, i) for i in range(self.batch) for p in range(held[i], per_seq[i]))
        if not todo:
            return
        need = max(per_seq)
        if need > self.page_table.shape[1]:
            pad = torch.full(
                (self.batch, need - self.page_table.shape[1]), -1, dtype=torch.int32, device=self.lengths.device
            )
            self.page_table = torch.cat([self.page_table, pad], dim=1)
        self._grow_pool(self.used_pages + len(todo))
        cols, rows = zip(*todo, strict=True)
        ids = torch.arange(self.used_pages, self.used_pages + len(todo), dtype=torch.int32)
        self.page_table[list(rows), list(cols)] = ids.to(self.page_table.device)
        self.used_pages += len(todo)

    def _grow_pool(self, pages: int) -> None:
        if pages <= self.k.shape[1]:
            return
        new = max(pages, 2 * self.k.shape[1])

        def grow(t: torch.Tensor) -> torch.Tensor:
            return torch.cat([t, t.new_zeros(t.shape[0], new - t.shape[1], *t.shape[2:])], dim=1)

        self.k, self.v = grow(self.k), grow(self.v)

    def slots(self, n_new: torch.Tensor, T: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(page, offset) of the T write positions of each sequence; -1 pages where t >= n_new."""
        t = torch.arange(T, device=self.lengths.device)
        pos = self.lengths[:, None] + t
        valid = t[None] < n_new[:, None]
        page_idx = torch.where(valid, pos // self.page_size, 0)
        page = torch.gather(self.page_table.long(), 1, page_idx) if self.page_table.shape[1] else page_idx
        page = torch.where(valid, page, -1)
        return page, pos % self.page_size

    def gather(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Contiguous [b, max_len, kv_heads, d] copies of one layer's context (reference use)."""
        max_len = int(self.lengths.max().item()) if self.batch else 0
        pos = torch.arange(max_len, device=self.lengths.device)
        page = (
            torch.gather(self.page_table.long().clamp_min(0), 1, (pos // self.page_size)[None].expand(self.batch, -1))
            if max_len
            else torch.zeros(self.batch, 0, dtype=torch.long, device=self.lengths.device)
        )
        off = (pos % self.page_size)[None].expand(self.batch, -1)
        return self.k[layer][page, off], self.v[layer][page, off]

    def select(self, rows: torch.Tensor) -> None:
        """Keep only these sequences (finished ones leave the batch); pages stay allocated."""
        self.page_table = self.page_table[rows]
        self.lengths = self.lengths[rows]
