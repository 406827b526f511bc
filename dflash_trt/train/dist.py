"""Ranks and torch's engines: one training process, or many started by ``torchrun``.

A run with ``WORLD_SIZE`` > 1 in its environment (torchrun, ``srun torchrun``, or
:func:`dflash_trt.train.launch` for ``train-drafter --nproc N``) joins a process group: NCCL
on GPUs, gloo on CPUs. ``--parallel`` picks the engine that keeps the ranks' drafters equal:

* ``fsdp`` (the default under torchrun): FSDP2, ``torch.distributed.fsdp.fully_shard``. The
  drafter's weights, gradients and AdamW moments are sharded over the ranks (one FSDP unit:
  its training forward, :class:`DraftStep`, reaches into the layers' projections directly,
  so per-layer units would never see their forward); the frozen target's decoder layers are
  sharded too, one unit each (:func:`shard_target`), with no gradients and outside the
  optimiser; its embedding, final norm and head stay whole on every rank (frozen, a few % of
  the weights; the drafter reads them directly);
* ``ddp``: ``DistributedDataParallel`` over a whole drafter and a whole target per rank (no
  gather per step: faster where the drafter and target fit one device);
* ``none``: one process, no engine (the default without torchrun). ``fsdp``/``ddp`` in one
  process start a one-rank group (what the cheap equivalence tests run).

The arithmetic, the same under every engine: the global batch of a step is drawn from one
generator seeded by (seed, step) on every rank; rank r trains rows ``r, r + world, ...``
(:meth:`Ranks.mine`). Its loss is divided by the weight of the whole global batch, so the
ranks' losses add up to the one-process loss; the engines average gradients over the ranks,
so the loss they differentiate is multiplied by ``world`` (:func:`engine_loss`) and their
average is the one-process gradient, up to float noise.

Rank 0 writes the z-lab drafter; checkpoints are written by every rank
(:mod:`dflash_trt.train.checkpoint`). Work that can fail on one rank (regeneration, the
feature cache) runs in :meth:`Ranks.together`, so every rank stops with the error, none waits
for ever in a collective.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TypeVar

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from dflash_trt.errors import DFlashError

T = TypeVar("T")
# Regeneration and feature-cache writes happen between two collectives and can take hours
# at scale; the default 30-minute collective timeout would kill a healthy run.
COLLECTIVE_TIMEOUT = timedelta(hours=24)
#: ``--parallel``: auto = fsdp under torchrun (WORLD_SIZE > 1), none in one process.
PARALLEL = ("auto", "fsdp", "ddp", "none")


@dataclass(frozen=True)
class Ranks:
    """This process's place in the run: its rank, the number of ranks, its device, its engine."""

    rank: int = 0
    world: int = 1
    device: torch.device = torch.device("cpu")
    owns_group: bool = False  # this process created the process group (and ends it)
    parallel: str = "none"  # fsdp | ddp | none

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def sharded(self) -> bool:
        """The target is sharded: its forwards are collectives, every rank must run the same ones."""
        return self.parallel == "fsdp"

    def mine(self, items: Sequence[T]) -> list[T]:
        """This rank's share: items ``rank, rank + world, ...``."""
        return list(items[self.rank :: self.world])

    def barrier(self) -> None:
        if torch.distributed.is_initialized():
            torch.distributed.barrier()

    def sum(self, values: Sequence[float]) -> list[float]:
        """Element-wise sum over the ranks (float64, so counts stay exact)."""
        if self.world == 1:
            return [float(v) for v in values]
        t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=self._comm_device)
        torch.distributed.all_reduce(t)
        return t.tolist()

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


def _device(device: str, local: int) -> torch.device:
    cuda = torch.cuda.is_available() if device == "auto" else device.startswith("cuda")
    if device == "auto":
        dev = torch.device("cuda", local) if cuda else torch.device("cpu")
    else:
        try:
            dev = torch.device(device)
        except RuntimeError:
            raise DFlashError(f"--device {device[:80]!r}: not a device torch knows (auto, cpu, cuda, cuda:N)") from None
        if dev.type == "cuda" and dev.index is None:
            dev = torch.device("cuda", local)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    return dev


def init_ranks(device: str = "auto", parallel: str = "auto") -> Ranks:
    """Join the process group that torchrun's environment describes (or run alone).

    ``device``: ``auto`` takes the GPU ``LOCAL_RANK`` when CUDA is available, else the CPU.
    """
    if parallel not in PARALLEL:
        raise DFlashError(f"--parallel {parallel!r}: choose one of {', '.join(PARALLEL)}")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    dev = _device(device, int(os.environ.get("LOCAL_RANK", "0")))
    engine = ("fsdp" if world > 1 else "none") if parallel == "auto" else parallel
    if world == 1 and engine == "none":
        return Ranks(device=dev)
    if world > 1 and engine == "none":
        raise DFlashError(f"--parallel none runs one process, and WORLD_SIZE is {world}: use fsdp or ddp")
    owns = not torch.distributed.is_initialized()
    if owns:
        backend = "nccl" if dev.type == "cuda" else "gloo"
        if world == 1 and "MASTER_ADDR" not in os.environ:  # fsdp/ddp in one plain process
            torch.distributed.init_process_group(
                backend, init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1, timeout=COLLECTIVE_TIMEOUT
            )
        else:
            for var in ("RANK", "MASTER_ADDR", "MASTER_PORT"):
                if var not in os.environ:
                    raise DFlashError(f"WORLD_SIZE is {world} but {var} is not set: start the ranks with torchrun")
            torch.distributed.init_process_group(backend, timeout=COLLECTIVE_TIMEOUT)
    return Ranks(torch.distributed.get_rank(), torch.distributed.get_world_size(), dev, owns, engine)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------------------
# The engines
# ---------------------------------------------------------------------------------------


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The target's decoder layers: the ModuleList as long as the config's ``num_hidden_layers``."""
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    n = int(cfg.num_hidden_layers)
    for _, m in model.named_modules():
        if isinstance(m, nn.ModuleList) and len(m) == n:
            return m
    raise DFlashError(f"cannot find the target's {n} decoder layers to shard: train it with --parallel ddp")


def shard_target(model: nn.Module, ranks: Ranks) -> None:
    """Freeze the target (no gradients, never in the optimiser); under fsdp shard each decoder
    layer over the ranks (its forward all-gathers the layer, then frees it again)."""
    model.requires_grad_(False)
    if ranks.parallel != "fsdp":
        return
    # The reference runtime (regeneration) keeps its lean forward on the model, with references to
    # (and for small models fused copies of) the whole weights: dropped, or sharding frees nothing.
    vars(model).pop("_dflash_lean", None)
    from torch.distributed.fsdp import fully_shard  # start-up: torch
    from torch.distributed.tensor import DTensor  # start-up: torch

    for layer in decoder_layers(model):
        # Explicitly True: each layer is an FSDP root (the model is not wrapped: its embedding and
        # head are called directly), and a root keeps its gathered weights after forward by default.
        fully_shard(layer, reshard_after_forward=True)
    for p in model.parameters():
        if not isinstance(p, DTensor):
            # Own memory for what stays whole: the loader memory-maps the checkpoint, and one
            # tensor still backed by the mapping keeps every page sharding read resident.
            p.data = p.data.clone()


def wrap_drafter(step: nn.Module, ranks: Ranks) -> nn.Module:
    """The training module under the engine ``ranks.parallel`` (parameters replaced in place by
    fsdp's shards, so an optimiser built afterwards holds this rank's shards only)."""
    if ranks.parallel == "fsdp":
        from torch.distributed.fsdp import fully_shard  # start-up: torch

        return fully_shard(step)
    if ranks.parallel == "ddp":
        ids = [ranks.device.index] if ranks.device.type == "cuda" else None
        return DistributedDataParallel(step, device_ids=ids, find_unused_parameters=True)
    return step


def engine_loss(loss: torch.Tensor, ranks: Ranks) -> torch.Tensor:
    """What to differentiate: this rank's share of the global loss, times ``world`` because the
    engines average gradients over the ranks (FSDP's reduce-scatter, DDP's all-reduce)."""
    return loss * ranks.world if ranks.parallel in ("fsdp", "ddp") else loss


def inner(module: nn.Module) -> nn.Module:
    """The module DDP wraps (fsdp and none wrap nothing)."""
    return getattr(module, "module", module)


def local_bytes(module: nn.Module) -> int:
    """Bytes of the parameters this rank holds (its shards under fsdp)."""
    total = 0
    for p in module.parameters():
        t = p.to_local() if hasattr(p, "to_local") else p
        total += t.numel() * t.element_size()
    return total
