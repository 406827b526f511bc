"""Ranks: one training process, or many started by torch's launcher (``torchrun``).

A run with ``WORLD_SIZE`` > 1 in its environment (torchrun, ``srun torchrun``, or
:func:`launch` for ``train-drafter --nproc N``) joins a process group: NCCL on GPUs, gloo on
CPUs. Every rank holds the whole drafter and the frozen target (data parallel); what the
ranks share goes through :class:`Ranks`:

* the global batch of a step is drawn from one generator seeded by (seed, step) on every
  rank; rank r trains rows ``r, r + world, ...`` of it (:meth:`Ranks.mine`), so a run at
  a given global batch computes the same thing whatever its number of ranks;
* the loss is normalised by the weight of the whole global batch and gradients are summed
  (:meth:`Ranks.sum_grads`): the sum of the ranks' gradients is the one-process gradient,
  up to float noise (what DDP's all-reduce computes, with SUM instead of AVG because the
  normalisation is already global);
* rank 0 writes checkpoints; work that can fail on one rank (regeneration, the feature
  cache) runs in :meth:`Ranks.together`, so every rank stops with the error, none waits
  for ever in a collective.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TypeVar

import torch

from dflash_trt.errors import DFlashError

T = TypeVar("T")
# Regeneration and feature-cache writes happen between two collectives and can take hours
# at scale; the default 30-minute collective timeout would kill a healthy run.
COLLECTIVE_TIMEOUT = timedelta(hours=24)


@dataclass(frozen=True)
class Ranks:
    """This process's place in the run: its rank, the number of ranks, its device."""

    rank: int = 0
    world: int = 1
    device: torch.device = torch.device("cpu")
    owns_group: bool = False           # this process created the process group (and ends it)

    @property
    def main(self) -> bool:
        return self.rank == 0

    def mine(self, items: Sequence[T]) -> list[T]:
        """This rank's share: items ``rank, rank + world, ...``."""
        return list(items[self.rank::self.world])

    def barrier(self) -> None:
        if self.world > 1:
            torch.distributed.barrier()

    def sum(self, values: Sequence[float]) -> list[float]:
        """Element-wise sum over the ranks (float64, so counts stay exact)."""
        if self.world == 1:
            return [float(v) for v in values]
        t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=self._comm_device)
        torch.distributed.all_reduce(t)
        return t.tolist()

    def sum_grads(self, params: list[torch.nn.Parameter]) -> None:
        """Replace every gradient by its sum over the ranks (one flat all-reduce).

        Every rank runs the same graph, so the parameters without a gradient are the same on
        all of them; they stay without one, as in one process (AdamW skips them)."""
        params = [p for p in params if p.grad is not None]
        if self.world == 1 or not params:
            return
        grads = [p.grad for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        torch.distributed.all_reduce(flat)
        offset = 0
        for p, g in zip(params, grads, strict=True):
            n = g.numel()
            p.grad = flat[offset: offset + n].view_as(g).clone()
            offset += n

    def together(self, work: Callable[[], T]) -> T:
        """``work()`` on every rank; if it raises a DFlashError anywhere, it raises everywhere."""
        error: DFlashError | None = None
        try:
            out = work()
        except DFlashError as exc:
            error = exc
        failed = self.sum([error is not None])[0]
        if error is not None:
            raise error
        if failed:
            raise DFlashError("another training process failed (its error is above)")
        return out

    def close(self) -> None:
        if self.owns_group and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()

    @property
    def _comm_device(self) -> torch.device:
        return self.device if self.device.type == "cuda" else torch.device("cpu")


def init_ranks(device: str = "auto") -> Ranks:
    """Join the process group that torchrun's environment describes (or run alone).

    ``device``: ``auto`` takes the GPU ``LOCAL_RANK`` when CUDA is available, else the CPU.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available() if device == "auto" else device.startswith("cuda")
    if device == "auto":
        dev = torch.device("cuda", local) if cuda else torch.device("cpu")
    else:
        dev = torch.device(device)
        if dev.type == "cuda" and dev.index is None:
            dev = torch.device("cuda", local)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if world == 1:
        return Ranks(device=dev)
    owns = not torch.distributed.is_initialized()
    if owns:
        for var in ("RANK", "MASTER_ADDR", "MASTER_PORT"):
            if var not in os.environ:
                raise DFlashError(f"WORLD_SIZE is {world} but {var} is not set: start the ranks with torchrun")
        torch.distributed.init_process_group("nccl" if dev.type == "cuda" else "gloo", timeout=COLLECTIVE_TIMEOUT)
    return Ranks(torch.distributed.get_rank(), torch.distributed.get_world_size(), dev, owns)
